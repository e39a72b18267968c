"""Results of `kvcanary violations`: violation rows from rings, logs and replays, each
explained against a dump (docs/canary.md §7).

Rows and explanations stay columnar (numpy) so that a ring of any size is handled without a
loop per row; `explanation_text` turns one row's explanation into the one-line diagnosis when
it is shown. Frozen and logic-light, for renderers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

import numpy as np

from kvcanary_cli.canary.ring_rows import ViolationRows
from kvcanary_cli.catalog import ViolationRowCause
from kvcanary_cli.results.cells import SlotProvenance

__all__ = [
    "Explanations",
    "LogSummary",
    "OwnerKind",
    "ReplayComparison",
    "ReplaySummary",
    "RingSummary",
    "SourceSummary",
    "SwaSummary",
    "ViolationsReport",
    "explanation_text",
]


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

    def facts(self, i: int) -> dict[str, object]:
        """Row `i`'s explanation as JSON values (what a diagnosis cause needs)."""

        def known(column: np.ndarray) -> int | None:
            value = int(column[i])
            return None if value < 0 else value

        return {
            "cause": self.cause_at(i).value,
            "space": "swa" if int(self.space[i]) == 1 else "full",
            "referenced_by": None
            if known(self.ref_row) is None
            else {
                "pool_row": known(self.ref_row),
                "position": known(self.ref_position),
                "batch_row": known(self.ref_batch_row),
            },
            "owner": None
            if known(self.owner_row) is None
            else {
                "pool_row": known(self.owner_row),
                "position": known(self.owner_position),
                "where": OWNER_KINDS[int(self.owner_kind[i])].value,
            },
            "prev_slot": int(self.prev_slot[i]) if self.prev_known[i] else None,
            "allocator": {1: "free", 0: "in use", 2: "beyond the pool"}.get(int(self.free[i])),
        }


def _at(row: int, position: int) -> str:
    return f"row {row}, position {position}"


def explanation_text(explanations: Explanations, i: int, fields: np.ndarray) -> str:
    """The one-line diagnosis of row `i` (its 8 fields given)."""
    e = explanations
    slot, stored_pos, token, expected = (int(fields[k]) for k in (1, 2, 3, 4))
    ref_row, ref_pos = int(e.ref_row[i]), int(e.ref_position[i])
    owner_row = int(e.owner_row[i])
    referenced = (
        f"row {ref_row} references the slot at position {ref_pos}"
        if ref_row >= 0
        else "no live row references it at another position"
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
                f"stored position {stored_pos} belongs to row {owner_row}; {referenced}: aliasing"
            )
        case ViolationRowCause.DUPLICATE_IN_ROW:
            return (
                f"stored position {stored_pos} belongs to row {owner_row}, which also references "
                f"the slot at position {ref_pos}: one slot at two positions of a row"
            )
        case ViolationRowCause.USE_AFTER_FREE:
            return (
                f"slot {slot} is on the free list and no live cell holds it at stored position "
                f"{stored_pos}; {referenced}: use after free (the record is a later owner's)"
            )
        case ViolationRowCause.STALE_SLOT:
            kind = OWNER_KINDS[int(e.owner_kind[i])]
            place = "an idle row" if kind is OwnerKind.IDLE_ROW else "the row's stale tail"
            return (
                f"stored position {stored_pos} belongs to row {owner_row} ({place}); "
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
                f"row {ref_row} reads slot {slot} at position {ref_pos}, but the slot is on the "
                "free list: a stale row (the prefix length covers cells a previous owner left); "
                "its record continues another sequence's chain"
            )
        case ViolationRowCause.CHAIN_BREAK:
            return (
                f"the record of slot {slot}{where} does not continue the chain of the position "
                "before it: written by another sequence (stale row, or a misplaced page)"
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
class RingSummary:
    """A dump's violation ring as decoded (docs/canary.md §4)."""

    capacity: int
    write_index: int
    valid: int
    overflow: bool
    wrapped: bool
    stray_rows: int


@dataclass(frozen=True, kw_only=True)
class SwaSummary:
    """The `kv_canary_swa_divergence=` samples of a log."""

    samples: int
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
    swa_divergence: SwaSummary | None = None
    #: violations begun and not readable (cut short, garbled): never a clean log.
    unread: int = 0


@dataclass(frozen=True, kw_only=True)
class SourceSummary:
    """One SOURCE of the command: a dump (its ring) or a log."""

    path: str
    kind: str
    #: rows it contributed, after the --group / --buffer filters.
    rows: int
    ring: RingSummary | None = None
    log: LogSummary | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ReplaySummary:
    """One replayed verify launch."""

    group: str
    buffer: str
    tag: int
    entries: int
    checked: int
    slot_zero: int
    chain_skipped: int
    outside_buffer: int
    undefined: int
    real_kv: str
    rows: int


@dataclass(frozen=True, kw_only=True)
class ReplayComparison:
    """Replayed rows against observed rows (ring and logs), as multisets of the 8 fields."""

    matched: int
    observed_only: int
    replayed_only: int


@dataclass(frozen=True, kw_only=True)
class ViolationsReport:
    """Everything `kvcanary violations` found."""

    SCHEMA: ClassVar[str] = "kvcanary.violations/1"

    sources: tuple[SourceSummary, ...]
    rows: ViolationRows
    #: the dump rows were joined with (a source, or --dump); None without one.
    dump: str | None = None
    identity: dict[str, str] = field(default_factory=dict)
    explanations: Explanations | None = None
    #: provenance of the rows' distinct slots (the first ones; `slots_total` counts all).
    slots: tuple[SlotProvenance, ...] = ()
    slots_total: int = 0
    replay: tuple[ReplaySummary, ...] = ()
    comparison: ReplayComparison | None = None
    group: str | None = None
    buffer: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def unread(self) -> int:
        """Violations the logs began and no row could be read from (cut short, garbled)."""
        return sum(s.log.unread for s in self.sources if s.log is not None)

    @property
    def found(self) -> bool:
        """Whether the command exits 1: rows, or violations logged that could not be read."""
        return bool(len(self.rows) or self.unread)
