"""Results of `kvcanary violations`: violation rows from rings, logs and replays, each
explained against a dump (docs/canary.md §4 and §7). `ViolationsReport` is the
`kvcanary.violations/1` record.

Rows and explanations stay columnar (numpy, `ExplainedRows`) so that a ring of any size is
handled without a loop per row: a row becomes a `ViolationRow` (its JSON object) when JSON
writes it or a view shows it, and the summary counts come from the columns.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, ClassVar, Literal, cast, get_args

import numpy as np

import kvcanary_cli
from kvcanary_cli.canary.constants import (
    FailReason,
    buffer_of_tag,
    canary_kind,
    group_of_tag,
    is_write,
    reason_labels,
    tag_label,
)
from kvcanary_cli.canary.ring_rows import ViolationRows
from kvcanary_cli.canary.sources import SourceKind
from kvcanary_cli.catalog import ViolationRowCause
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.results.cells import SlotProvenance, Space
from kvcanary_cli.results.record import recorded, to_record

__all__ = [
    "BufferName",
    "ExplainedRows",
    "Explanation",
    "Explanations",
    "LogSummary",
    "OriginName",
    "OwnerKind",
    "ReplayComparison",
    "ReplaySummary",
    "RingSummary",
    "SourceSummary",
    "SwaSummary",
    "ViolationRow",
    "ViolationsReport",
    "explanation_text",
]

#: Where a row was read: a dump's ring, a log line, a log message rebuilt from a message whose
#: first line was missing, or the replay (`canary.ring_rows.RowOrigin`, by label).
OriginName = Literal["ring", "log", "log-message", "replay"]
ORIGIN_NAMES: tuple[OriginName, ...] = get_args(OriginName)
#: A canary buffer of a group.
BufferName = Literal["head.k", "head.v", "tail.k", "tail.v"]
#: A slot's allocator state: on the free list, in use, or no slot of the pool (below it:
#: negative; or beyond it).
AllocatorName = Literal["free", "in use", "below the pool (negative)", "beyond the pool"]
_ALLOCATOR: dict[int, AllocatorName] = {
    1: "free",
    0: "in use",
    3: "below the pool (negative)",
    2: "beyond the pool",
}
#: Rows whose columns are read into Python at a time.
_PIECE = 1 << 14


#: the causes in the order checked: `Explanations.cause` holds indices into it.
CAUSES = list(ViolationRowCause)


class OwnerKind(StrEnum):
    """Where the cell holding the slot at the stored position lies."""

    NONE = "none"
    LIVE = "live"
    STALE_TAIL = "stale-tail"
    IDLE_ROW = "idle-row"


OWNER_KINDS = list(OwnerKind)


@dataclass(frozen=True, kw_only=True)
class Reference:
    """The verify cell that read the slot."""

    pool_row: int | None
    position: int | None
    batch_row: int | None


@dataclass(frozen=True, kw_only=True)
class Owner:
    """A cell holding the slot at the stored position."""

    pool_row: int | None
    position: int | None
    where: OwnerKind


@dataclass(frozen=True, kw_only=True)
class Explanation:
    """The facts behind a row's diagnosis."""

    #: canary.md §7
    cause: ViolationRowCause
    #: the slot's pool
    space: Space
    #: the verify cell that read it
    referenced_by: Reference | None
    #: a cell holding the slot at the stored position
    owner: Owner | None
    #: the slot before the verify cell
    prev_slot: int | None
    #: null: no free list for this space in the dump
    allocator: AllocatorName | None


@dataclass(frozen=True, kw_only=True)
class Explanations:
    """Per violation row (int64 columns, -1 when unknown): the cause and the cells behind it.

    `ref_*` is the verify cell that read the slot (for a replayed row, exactly the failing
    entry); `owner_*` a cell holding the slot at the row's stored position.
    """

    cause: np.ndarray
    space: np.ndarray
    ref_row: np.ndarray
    ref_position: np.ndarray
    ref_batch_row: np.ndarray
    owner_row: np.ndarray
    owner_position: np.ndarray
    #: index into `OwnerKind`.
    owner_kind: np.ndarray
    prev_slot: np.ndarray
    prev_known: np.ndarray
    #: 1 on the free list of the slot's space, 0 in use, 2 beyond the pool, -1 no free list.
    free: np.ndarray

    def __len__(self) -> int:
        return int(self.cause.shape[0])

    def cause_at(self, i: int) -> ViolationRowCause:
        """The cause of row `i`."""
        return CAUSES[int(self.cause[i])]

    def explanation(self, i: int) -> Explanation:
        """Row `i`'s explanation (the facts its diagnosis says)."""

        def known(column: np.ndarray) -> int | None:
            value = int(column[i])
            return None if value < 0 else value

        return Explanation(
            cause=self.cause_at(i),
            space=Space.SWA if int(self.space[i]) == 1 else Space.FULL,
            referenced_by=None
            if known(self.ref_row) is None
            else Reference(
                pool_row=known(self.ref_row),
                position=known(self.ref_position),
                batch_row=known(self.ref_batch_row),
            ),
            owner=None
            if known(self.owner_row) is None
            else Owner(
                pool_row=known(self.owner_row),
                position=known(self.owner_position),
                where=OWNER_KINDS[int(self.owner_kind[i])],
            ),
            prev_slot=int(self.prev_slot[i]) if self.prev_known[i] else None,
            allocator=_ALLOCATOR.get(int(self.free[i])),
        )

    def facts(self, i: int) -> dict[str, object]:
        """Row `i`'s explanation as JSON values (a canary finding's `details.explanation`)."""
        return to_record(self.explanation(i))


def _at(row: int, position: int) -> str:
    return f"pool row {row}, position {position}"


def explanation_text(explanations: Explanations, i: int, fields: Sequence[int]) -> str:
    """The one-line diagnosis of row `i` (its 8 fields given)."""
    e = explanations
    slot, stored_pos, token, expected = (int(fields[k]) for k in (1, 2, 3, 4))
    ref_row, ref_pos = int(e.ref_row[i]), int(e.ref_position[i])
    owner_row = int(e.owner_row[i])
    referenced = (
        f"pool row {ref_row} references the slot at position {ref_pos}"
        if ref_row >= 0
        else "no live pool row references it at another position"
    )
    where = f" ({_at(ref_row, ref_pos)})" if ref_row >= 0 else ""
    match e.cause_at(i):
        case ViolationRowCause.WRITE_CHECK:
            return (
                f"write of slot {slot}: token {token} at position {stored_pos}, expected token "
                f"{expected} at position {int(fields[6])}"
            )
        case ViolationRowCause.ALIASING:
            return (
                f"stored position {stored_pos} belongs to pool row {owner_row}; "
                f"{referenced}: aliasing"
            )
        case ViolationRowCause.DUPLICATE_IN_ROW:
            return (
                f"stored position {stored_pos} belongs to pool row {owner_row}, which also "
                f"references the slot at position {ref_pos}: one slot at two positions of a pool "
                "row"
            )
        case ViolationRowCause.USE_AFTER_FREE:
            return (
                f"slot {slot} is on the free list and no live cell holds it at stored position "
                f"{stored_pos}; {referenced}: use after free (the record is a later owner's)"
            )
        case ViolationRowCause.STALE_SLOT:
            kind = OWNER_KINDS[int(e.owner_kind[i])]
            place = (
                "an idle pool row" if kind is OwnerKind.IDLE_ROW else "the pool row's stale tail"
            )
            return (
                f"stored position {stored_pos} belongs to pool row {owner_row} ({place}); "
                f"{referenced}: a stale slot, freed and handed out again"
            )
        case ViolationRowCause.FOREIGN_RECORD:
            return (
                f"no cell holds slot {slot} at stored position {stored_pos}; {referenced}: the "
                "record was overwritten by a writer this dump does not show"
            )
        case ViolationRowCause.FOLLOWS_BAD_RECORD:
            return (
                f"the chain breaks after the bad record of slot {int(e.prev_slot[i])}"
                f"{f' ({_at(ref_row, ref_pos - 1)})' if ref_row >= 0 else ''}"
            )
        case ViolationRowCause.STALE_ROW:
            return (
                f"pool row {ref_row} reads slot {slot} at position {ref_pos}, but the slot is on "
                "the free list: a stale pool row (the prefix length covers cells a previous owner "
                "left); its record continues another sequence's chain"
            )
        case ViolationRowCause.CHAIN_BREAK:
            return (
                f"the record of slot {slot}{where} does not continue the chain of the position "
                "before it: written by another sequence (stale pool row, or a misplaced page)"
            )
        case ViolationRowCause.WRONG_TOKEN:
            return (
                f"stored token {token}, expected {expected}{where}: a wrong token was written, "
                "or the record is stale"
            )
        case ViolationRowCause.KV_OVERWRITTEN:
            return (
                f"the KV bytes of slot {slot}{where} no longer match the fingerprint written with "
                "them: KV overwritten after the write"
            )
        case ViolationRowCause.NO_LIVE_CELL:
            space = "SWA" if int(e.space[i]) == 1 else "full"
            return f"no live cell of the dump holds {space} slot {slot}"


@dataclass(frozen=True, kw_only=True)
class Pump:
    """A log message's last line."""

    total_violations: int
    ring_overflow: bool
    step_when_pumped: int


@dataclass(frozen=True, kw_only=True)
class VerifyEntry:
    """A replayed row's failing verify entry."""

    batch_row: int
    expected_position: int
    prev_slot: int


@dataclass(frozen=True, kw_only=True)
class ViolationRow:
    """One violation row: the 8 ring fields (as signed int64) and what they mean."""

    #: the 8 ring fields, kernel_kind .. fail_reason_bits, as signed int64
    kernel_kind: int
    slot_idx: int
    position: int
    stored_token: int
    expected_token: int
    stored_chain_hash: int
    expected_aux: int
    fail_reason_bits: int
    #: log-message: rebuilt from a message whose first line was missing
    origin: OriginName
    #: the source's path, or "replay"
    source: str
    #: ring row, 1-based log line, or verify entry
    index: int
    #: HEAD_K_FULL, ..., or unknown(N)
    tag: str
    #: per_forward_head_k_full, sweep_k_swa, ...
    canary_kind: str
    #: null for an unknown tag
    group: Group | None
    buffer: BufferName | None
    #: labels of the known bits, ascending
    reasons: tuple[str, ...]
    is_write: bool
    #: from the message's last line (logs only)
    pump: Pump | None
    #: replayed rows: the failing verify entry
    entry: VerifyEntry | None
    #: the one-line explanation (with a dump)
    diagnosis: str | None
    #: the facts behind it; null without a dump
    explanation: Explanation | None


class ExplainedRows:
    """Every violation row, columnar (`ViolationRows`), with its explanation when a dump was
    given: JSON writes every row as a `ViolationRow` (`__record__`); a view makes only the
    rows it shows (`head`), whatever the number of rows."""

    __slots__ = ("columns", "explanations", "paths")

    def __init__(
        self,
        columns: ViolationRows,
        *,
        paths: tuple[str, ...],
        explanations: Explanations | None = None,
    ) -> None:
        self.columns = columns
        #: the path of each source, by the rows' `source` index (-1: the replay).
        self.paths = paths
        self.explanations = explanations

    def __len__(self) -> int:
        return len(self.columns)

    def __repr__(self) -> str:
        """Short, whatever the number of rows (`printable_record` reads a result's repr)."""
        return f"ExplainedRows(<{len(self)} rows>)"

    def head(self, n: int) -> tuple[ViolationRow, ...]:
        """The first `n` rows (fewer when there are fewer)."""
        return tuple(self._rows(min(max(n, 0), len(self))))

    def __record__(self) -> list[dict[str, object]]:
        """Every row's JSON object, in order (sources in command-line order, then replay)."""
        return [to_record(row) for row in self._rows(len(self))]

    def _rows(self, stop: int) -> Iterator[ViolationRow]:
        """The first `stop` rows, their columns read a piece at a time (`tolist`, not an
        `int()` per value)."""
        for start in range(0, stop, _PIECE):
            yield from self._piece(start, min(start + _PIECE, stop))

    def _piece(self, start: int, stop: int) -> Iterator[ViolationRow]:
        rows, why = self.columns, self.explanations
        part = slice(start, stop)
        columns = zip(
            rows.fields[part].tolist(),
            rows.origin[part].tolist(),
            rows.source[part].tolist(),
            rows.index[part].tolist(),
            rows.total_violations[part].tolist(),
            rows.ring_overflow[part].tolist(),
            rows.step_when_pumped[part].tolist(),
            rows.batch_row[part].tolist(),
            rows.expected_position[part].tolist(),
            rows.prev_slot[part].tolist(),
            strict=True,
        )
        for i, (fields, origin, source, index, pumped, overflow, step, row, at, prev) in enumerate(
            columns, start
        ):
            tag, bits = fields[0], fields[7]
            group = group_of_tag(tag)
            yield ViolationRow(
                kernel_kind=fields[0],
                slot_idx=fields[1],
                position=fields[2],
                stored_token=fields[3],
                expected_token=fields[4],
                stored_chain_hash=fields[5],
                expected_aux=fields[6],
                fail_reason_bits=fields[7],
                origin=ORIGIN_NAMES[origin],
                source=self.paths[source] if source >= 0 else "replay",
                index=index,
                tag=tag_label(tag),
                canary_kind=canary_kind(tag),
                group=None if group is None else Group(group),
                buffer=cast("BufferName | None", buffer_of_tag(tag)),
                reasons=tuple(reason_labels(bits)),
                is_write=is_write(bits),
                pump=Pump(
                    total_violations=pumped, ring_overflow=overflow == 1, step_when_pumped=step
                )
                if pumped >= 0
                else None,
                entry=VerifyEntry(batch_row=row, expected_position=at, prev_slot=prev)
                if row >= 0
                else None,
                diagnosis=None if why is None else explanation_text(why, i, fields),
                # the same facts are a canary finding's `details.explanation`
                explanation=None if why is None else why.explanation(i),
            )


@dataclass(frozen=True, kw_only=True)
class RingSummary:
    """A dump's violation ring as decoded."""

    capacity: int
    write_index: int
    valid: int
    overflow: bool
    wrapped: bool
    stray_rows: int


@dataclass(frozen=True, kw_only=True)
class SwaSummary:
    """The kv_canary_swa_divergence= samples of a log."""

    samples: int
    #: the last sample's values, by key
    last: dict[str, int]
    peak_swa_full_idx_divergence: int
    peak_swa_out_of_window_tokens: int


@dataclass(frozen=True, kw_only=True)
class LogSummary:
    """What the parser met in a log (docs/canary.md §6)."""

    lines: int
    structured: int
    messages: int
    rebuilt: int
    unparsed: int
    incomplete: int
    inconsistent: int
    overlong: int
    #: violations begun but not readable (cut short, garbled): exit 1
    unread_violations: int = 0
    swa_divergence: SwaSummary | None = None


@dataclass(frozen=True, kw_only=True)
class SourceSummary:
    """One SOURCE of the command: a dump (its ring) or a log."""

    #: as given; "-" for stdin
    path: str
    kind: SourceKind
    #: rows it gave, after the filters
    rows: int
    #: a dump's ring
    ring: RingSummary | None = None
    log: LogSummary | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ReplaySummary:
    """One replayed verify launch."""

    group: Group
    buffer: str
    tag: str
    #: verify entries of the plan (0: not launched)
    entries: int
    #: checked, and skipped as slot 0
    checked: int
    slot_zero: int
    #: checked without a chain check (prev slot 0)
    chain_skipped: int
    #: left out (canary.md §5)
    outside_buffer: int
    undefined: int
    real_kv: Literal["checked", "zero", "skipped"]
    rows: int


@dataclass(frozen=True, kw_only=True)
class ReplayComparison:
    """Replayed rows against the rows read, as multisets of the 8 fields."""

    matched: int
    observed_only: int
    replayed_only: int


@dataclass(frozen=True, kw_only=True)
class Filters:
    """The --group and --buffer filters."""

    group: Group | None = None
    buffer: str | None = None


@dataclass(frozen=True, kw_only=True)
class ViolationsSummary:
    """Counts over every row."""

    #: every row read or replayed
    rows: int
    #: ring, log, log-message, replay
    by_origin: dict[OriginName, int]
    #: by tag label (HEAD_K_FULL, ...)
    by_tag: dict[str, int]
    #: verify_position, ... (rows with that bit)
    by_reason: dict[str, int]
    #: {} without a dump
    by_cause: dict[str, int]


#: Every row in JSON, columnar in the result.
Rows = Annotated[ExplainedRows, list[ViolationRow]]


@dataclass(frozen=True, kw_only=True)
class ViolationsReport:
    """`kvcanary violations --format json`."""

    SCHEMA: ClassVar[str] = "kvcanary.violations/1"

    #: the dump rows are explained against
    dump: str | None
    #: that dump's identity keys; {} without one
    identity: dict[str, str]
    filters: Filters
    #: in command-line order
    sources: tuple[SourceSummary, ...]
    #: --replay: one per buffer, in launch order
    replay: tuple[ReplaySummary, ...]
    #: --replay with rows read: multisets of the 8 fields
    comparison: ReplayComparison | None
    notes: tuple[str, ...]
    #: sources in order, then the replay
    rows: Rows
    #: the rows' first 64 distinct slots; [] without a dump
    slots: tuple[SlotProvenance, ...]
    #: distinct slots in the rows
    slots_total: int

    @recorded
    def kvcanary_version(self) -> str:
        """The kvcanary that made the record."""
        return kvcanary_cli.__version__

    #: the exit code in words: 1 (rows; or no row, but violations logged unreadable) or 0
    @recorded
    def verdict(self) -> Literal["violations", "unreadable", "clean"]:
        """Rows, or no row but violations logged unreadable, or neither."""
        if len(self.rows):
            return "violations"
        return "unreadable" if self.unread_violations else "clean"

    #: violations the logs began that gave no row (cut short, garbled; docs/canary.md §6)
    @recorded
    def unread_violations(self) -> int:
        """Violations the logs began and no row could be read from (cut short, garbled)."""
        return sum(s.log.unread_violations for s in self.sources if s.log is not None)

    @recorded
    def summary(self) -> ViolationsSummary:
        """Counts over every row, from the columns (no work per row)."""
        rows = self.rows.columns
        tags, tag_counts = np.unique(rows.tag, return_counts=True)
        origins = np.bincount(rows.origin, minlength=len(ORIGIN_NAMES))
        by_reason = {
            label: int(np.count_nonzero(rows.bits & int(bit)))
            for bit, label in ((b, reason_labels(int(b))[0]) for b in FailReason)
            if np.any(rows.bits & int(bit))
        }
        by_cause: dict[str, int] = {}
        why = self.rows.explanations
        if why is not None:
            counts = np.bincount(why.cause, minlength=len(CAUSES))
            by_cause = {CAUSES[i].value: int(n) for i, n in enumerate(counts) if n}
        return ViolationsSummary(
            rows=len(rows),
            by_origin={name: int(n) for name, n in zip(ORIGIN_NAMES, origins, strict=False) if n},
            by_tag=dict(
                sorted((tag_label(int(t)), int(n)) for t, n in zip(tags, tag_counts, strict=True))
            ),
            by_reason=dict(sorted(by_reason.items())),
            by_cause=dict(sorted(by_cause.items())),
        )

    @recorded
    def rows_total(self) -> int:
        """Every row (`rows` lists them all; a view shows the first few)."""
        return len(self.rows)

    @property
    def found(self) -> bool:
        """Whether the command exits 1: rows, or violations logged that could not be read."""
        return self.verdict != "clean"
