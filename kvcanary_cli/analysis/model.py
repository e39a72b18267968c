"""Result types of a check: findings, slot provenance, per-dump and overall reports.

Frozen and logic-free (beyond small properties), so renderers can rely on them and tests can
build them by hand. Codes and severities are the catalog's (`kvcanary_cli.catalog`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from kvcanary_cli.catalog import CauseCode, Confidence, EventKind, FindingCode, Severity
from kvcanary_cli.dump.schema import Group

if TYPE_CHECKING:  # numpy is imported where cells are handled: `--help` never loads it
    import numpy as np
from kvcanary_cli.dump.shrink_record import ShrinkRecord

__all__ = [
    "Assumption",
    "CanaryRecord",
    "Cause",
    "FirstRaise",
    "UPSTREAM_RAISE",
    "Group",
    "Role",
    "Space",
    "RequestSummary",
    "ScalarValue",
    "code_order",
    "Cell",
    "CellColumns",
    "CheckReport",
    "DumpReport",
    "FindingHistory",
    "Finding",
    "GroupSummary",
    "ProvenanceReport",
    "RowCell",
    "RowGap",
    "RowMap",
    "RowOccupancy",
    "SlotHistory",
    "SlotMoment",
    "SlotOwner",
    "SlotProvenance",
    "TimelineDump",
    "TimelineEvent",
    "TimelineInterval",
    "TimelineReport",
    "ViolationRow",
    "ShrinkRecord",
]


class Space(StrEnum):
    """Which KV pool a slot indexes: the full pool, or the SWA pool (a LUT entry's value)."""

    FULL = "full"
    SWA = "swa"


class Role(StrEnum):
    """What a `req_to_token` cell (or a plan read) is to the batch (docs/findings.md).

    A cell is a verify cell, a live prefix cell before the window, the window's chain
    predecessor, a pending write, a stale cell past a live row's end, or a cell of an idle
    row; a finding may also name the plan read that met it: a write seed or an expected-token
    gather.
    """

    VERIFY = "verify"
    PREFIX = "prefix"
    CHAIN_PREV = "chain-prev"
    PENDING_WRITE = "pending-write"
    STALE_TAIL = "stale-tail"
    IDLE_ROW = "idle-row"
    SEED = "seed"
    EXPECTED_TOKEN = "expected-token"

    @property
    def live(self) -> bool:
        """A cell the batch reads or writes at this step."""
        return self in _LIVE_ROLES


_LIVE_ROLES = frozenset({Role.VERIFY, Role.PREFIX, Role.CHAIN_PREV, Role.PENDING_WRITE})


#: The `details` key of a finding record where the kernel's launch raised as the reference
#: predicts (records add it from `Finding.upstream_raise`).
UPSTREAM_RAISE = "upstream_raise"


def code_order(code: FindingCode, group: str = "") -> tuple[int, int, str]:
    """Sort key of a (code, group) count: most severe first, then the codes table, then group."""
    return (-code.severity.rank, code.order, group)


def _none_last(value: int | None) -> tuple[bool, int]:
    return (value is None, 0 if value is None else value)


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One `req_to_token` cell holding a slot, labelled by its role in the batch."""

    pool_row: int
    position: int
    #: batch rows using this pool row (empty for idle rows).
    batch_rows: tuple[int, ...]
    #: verify, prefix, chain-prev, pending-write, stale-tail or idle-row.
    role: Role
    #: the cell is a row's write seed (`P-1` of a row that writes).
    seed: bool = False
    #: another live row holds the same slot at the same position (radix prefix sharing).
    shared: bool = False
    #: in SWA-space provenance: the full slot this cell holds (which reaches the SWA slot).
    full_slot: int | None = None


@dataclass(frozen=True, kw_only=True)
class CanaryRecord:
    """A slot's record in one canary buffer (`canary.<group>.<head|tail>.<k|v>`)."""

    buffer: str
    token: int
    position: int
    prev_hash: int
    real_kv_hash: int


@dataclass(frozen=True, kw_only=True)
class ViolationRow:
    """A violation-ring row whose slot field is this slot."""

    index: int
    fields: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class SlotProvenance:
    """Where a slot lives: every cell holding it, its translation, allocator and canary state."""

    slot: int
    space: Space
    #: the first cells (live ones first); `cells_total` counts all of them.
    cells: tuple[Cell, ...]
    cells_total: int
    #: LUT[slot] for a full slot, when the dump has a LUT and the slot is in range.
    swa_slot: int | None = None
    #: why there is no usable translation ("no LUT", "slot >= lut_len ...", "unmapped").
    translation_note: str | None = None
    #: for an SWA slot: the full slots whose LUT entry is this slot.
    mapped_from: tuple[int, ...] = ()
    #: for the SWA slot a truncated LUT ends in: the live full slots >= lut_len the GPU path
    #: clamps onto it.
    clamped_from: tuple[int, ...] = ()
    #: "free", "in use" or "beyond the pool" (no slot of it) when the dump has the allocator's
    #: free list for this space.
    allocator: str | None = None
    canary: tuple[CanaryRecord, ...] = ()
    #: the first ring rows of the slot; `violations_total` counts them all.
    violations: tuple[ViolationRow, ...] = ()
    violations_total: int = 0


@dataclass(frozen=True, kw_only=True, eq=False)
class CellColumns:
    """The `req_to_token` cells a finding group stands for, as parallel int64 arrays.

    One entry per cell, ordered by batch row, then position (then slot): a group of a million
    cells is five arrays, not a million objects; views turn into Python objects only what they
    show. `extra` holds the code's own per-cell columns (an SWA finding's `full_slot`, the
    position an aliased slot's owner holds it at, a write's `out_cache_loc` index).
    """

    batch_row: np.ndarray
    pool_row: np.ndarray
    position: np.ndarray
    #: the slot the finding is about (an SWA slot for an SWA-space finding); None for a
    #: finding about a cell's other reads (an expected-token gather).
    slot: np.ndarray | None
    extra: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.position.shape[0])

    def __eq__(self, other: object) -> bool:
        """Equal cells, in the same order (reports compare by value)."""
        import numpy as np

        if not isinstance(other, CellColumns):
            return NotImplemented
        return (
            all(
                np.array_equal(a, b)
                for a, b in (
                    (self.batch_row, other.batch_row),
                    (self.pool_row, other.pool_row),
                    (self.position, other.position),
                )
            )
            and _same(self.slot, other.slot)
            and self.extra.keys() == other.extra.keys()
            and all(np.array_equal(v, other.extra[k]) for k, v in self.extra.items())
        )

    def __hash__(self) -> int:
        return hash((len(self), self.position[:4].tobytes(), self.batch_row[:4].tobytes()))

    def distinct_count(self, column: str) -> int:
        """How many distinct values a column (`batch_row`, `slot`, ...) holds (one sort)."""
        import numpy as np

        values = getattr(self, column)
        if values is None or len(values) == 0:
            return 0
        ordered = np.sort(values)
        return int(np.count_nonzero(ordered[1:] != ordered[:-1])) + 1

    def take(self, index: np.ndarray) -> CellColumns:
        """The cells at `index` (a boolean mask or integer indices), in that order."""
        return CellColumns(
            batch_row=self.batch_row[index],
            pool_row=self.pool_row[index],
            position=self.position[index],
            slot=None if self.slot is None else self.slot[index],
            extra={name: values[index] for name, values in self.extra.items()},
        )


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    import numpy as np

    if a is None or b is None:
        return a is b
    return bool(np.array_equal(a, b))


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One problem: a finding *group* of cells sharing a code, cause, group and role, or one
    row or tensor.

    A cell-level finding holds every cell it stands for in `cells` (columns, complete); its
    scalar fields (`slot`, `batch_row`, `pool_row`, `position`) describe its example cell: the
    cell where SGLang's reference raises when the group holds it, else the first in report
    order. Output then grows with the problems, not with the cells.
    """

    code: FindingCode
    group: Group
    message: str
    slot: int | None = None
    space: Space = Space.FULL
    batch_row: int | None = None
    pool_row: int | None = None
    position: int | None = None
    #: the role every cell of the group has (a LUT read: the first role it was read as).
    role: Role | None = None
    #: code-specific facts (other cells, kernel values, counts), JSON-safe: shown, never read
    #: by the analysis (what it reads is a typed field below).
    details: dict[str, object] = field(default_factory=dict)
    #: every cell of a cell-level finding (None: a row- or tensor-level finding).
    cells: CellColumns | None = None
    #: for an SWA-space finding: the full slots whose LUT entries reach its example's SWA
    #: slot (each cell's own is its `full_slot` column).
    full_slots: tuple[int, ...] = ()
    #: the kernel's launch raised here, as the reference predicts (the raise's text).
    upstream_raise: str | None = None
    #: for a canary finding: the cause the record's explanation names (docs/canary.md §7),
    #: and the slot the failing entry chains from.
    canary_cause: str | None = None
    prev_slot: int | None = None
    #: for an expected-token finding: the index of the bad gather (a pool row outside the
    #: pool, or a position past it); every group makes the same gather.
    gather_index: int | None = None
    #: the provenance of the group's first distinct slots (the example's first);
    #: `provenance_total` counts the distinct slots of the group.
    provenance: tuple[SlotProvenance, ...] = ()
    provenance_total: int = 0
    #: scalars the finding holds under only because kvcanary derived them (not recorded):
    #: such a finding is `info` until the dump records them.
    assumes: tuple[str, ...] = ()
    #: the cause the diagnosis groups this symptom under.
    cause: CauseCode | None = None
    #: SGLang's torch reference raises at this finding's example cell (the first raising
    #: read, REF order).
    first_raise: bool = False

    @property
    def severity(self) -> Severity:
        """The code's severity; `info` while the finding rests on an assumption."""
        return Severity.INFO if self.assumes else self.code.severity

    @property
    def count(self) -> int:
        """Cells this finding stands for (1 for a row- or tensor-level finding)."""
        return 1 if self.cells is None else len(self.cells)

    def order_key(self) -> tuple[Any, ...]:
        """The order of findings in every report.

        Most severe first, then the codes table, group, batch row, position and slot (None
        last); the remaining fields only break ties, so the order never depends on the order
        the detectors ran in.
        """
        return (
            *code_order(self.code, self.group),
            _none_last(self.batch_row),
            _none_last(self.position),
            _none_last(self.slot),
            self.space,
            _none_last(self.pool_row),
            self.role or "",
            self.message,
            json.dumps(self.details, sort_keys=True, default=str),
        )


@dataclass(frozen=True, kw_only=True)
class GroupSummary:
    """How one group was planned and how the kernel compared."""

    group: Group
    window: int
    total_verify: int
    verify_capacity: int
    enable: int
    kernel: str
    #: plan values that differ between reference and kernel, by the finding code that
    #: explains them (a cell read as a verify slot and as a chain predecessor counts twice).
    explained_differences: dict[str, int] = field(default_factory=dict)
    #: the same, per plan field: code -> {"verify slot" | "prev slot" | "expected token" |
    #: "write seed": values}.
    explained_by_field: dict[str, dict[str, int]] = field(default_factory=dict)
    unexplained_differences: int = 0
    kernel_launch_error: str | None = None


@dataclass(frozen=True, kw_only=True)
class Cause:
    """A diagnosis: what went wrong upstream of a group of findings, and what to fix."""

    code: CauseCode
    confidence: Confidence
    summary: str
    #: the facts that point to this cause, one short phrase each.
    evidence: tuple[str, ...]
    #: finding code -> how many findings this cause explains.
    explains: dict[str, int]
    fix: str
    #: the cause that explains this one's symptoms too (a chain: one fault, one story); None
    #: for a top-level cause. Reports show an explained cause as an "also shows" line of its
    #: parent, and print only the parent's fix.
    explained_by: CauseCode | None = None
    #: for a parent: one line per cause it explains (codes, counts, where).
    also_shows: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ScalarValue:
    """A scalar as the check used it, and whether it is a fact or an assumption."""

    name: str
    value: int | None
    #: recorded, overridden, derived, default or unknown.
    origin: str
    source: str


@dataclass(frozen=True, kw_only=True)
class Assumption:
    """A derived scalar some findings rest on, and how to turn them into facts."""

    scalar: str
    value: int | None
    source: str
    #: finding code -> findings that hold only under the derived value.
    decides: dict[str, int]
    advice: str


@dataclass(frozen=True, kw_only=True)
class RequestSummary:
    """One batch row with findings: the request as the batch describes it, and its counts."""

    batch_row: int
    pool_row: int
    prefix_len: int
    extend_len: int
    #: finding code -> findings at this batch row.
    counts: dict[str, int]
    #: the smallest position of a finding in this row (None: only row-level findings).
    first_bad_position: int | None


@dataclass(frozen=True, kw_only=True)
class FirstRaise:
    """Where SGLang's torch reference stops (its first raising read, in its own order)."""

    group: Group
    exception_type: str
    message: str
    code: FindingCode
    batch_row: int
    position: int


@dataclass(frozen=True, kw_only=True)
class DumpReport:
    """Everything `check` found in one dump."""

    path: str
    identity: dict[str, str]
    bs: int
    groups: tuple[GroupSummary, ...]
    findings: tuple[Finding, ...]
    notes: tuple[str, ...] = ()
    kernel_mode: str | None = None
    #: set when the dump could not be read (multi-dump runs report it instead of stopping).
    error: str | None = None
    #: ranked causes, most likely first; empty when there is no finding.
    diagnosis: tuple[Cause, ...] = ()
    #: the batch rows that have findings.
    requests: tuple[RequestSummary, ...] = ()
    first_raise: FirstRaise | None = None
    #: the upstream exception the dump's `note` records (the capture hook stores it), and
    #: whether it is the one kvcanary's reference raises first.
    recorded_exception: str | None = None
    recorded_exception_matches: bool | None = None
    scalars: tuple[ScalarValue, ...] = ()
    assumptions: tuple[Assumption, ...] = ()
    #: set for a shrunk dump: where it came from and what it dropped (its provenance covers
    #: the kept cells only).
    shrink: ShrinkRecord | None = None

    def worst(self) -> Severity | None:
        """The most severe finding's severity, or None when there is none."""
        if not self.findings:
            return None
        return max((f.severity for f in self.findings), key=lambda s: s.rank)

    def fails(self, fail_on: Severity) -> bool:
        """True when a finding is at or above `fail_on`."""
        return any(f.severity.rank >= fail_on.rank for f in self.findings)


@dataclass(frozen=True, kw_only=True)
class CheckReport:
    """One report per dump plus the `--fail-on` threshold that sets the verdicts."""

    dumps: tuple[DumpReport, ...]
    fail_on: Severity = Severity.ERROR
    #: the SGLang version installed where the check ran (None: not installed); each dump's
    #: `identity` holds the version it was recorded with.
    sglang_installed: str | None = None

    @property
    def failed(self) -> bool:
        """At least one dump has a finding at or above the threshold."""
        return any(d.fails(self.fail_on) for d in self.dumps)

    @property
    def bad_input(self) -> bool:
        """At least one dump could not be read."""
        return any(d.error is not None for d in self.dumps)


@dataclass(frozen=True, kw_only=True)
class RowCell:
    """One position of a pool row, for `provenance --row`."""

    position: int
    slot: int
    #: verify, prefix, chain-prev, pending-write, stale-tail or idle-row.
    role: Role
    seed: bool = False
    #: LUT[slot] when the dump has a LUT and the slot is in range.
    swa_slot: int | None = None
    #: codes of the findings that point at this cell.
    marks: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class RowMap:
    """A pool row as the batch sees it: live prefix, window, pending writes, stale tail."""

    pool_row: int
    batch_rows: tuple[int, ...]
    prefix_len: int | None
    extend_len: int | None
    window_start: int | None
    group: Group
    #: positions shown, in order (the live range's edges, a few stale cells, marked cells).
    cells: tuple[RowCell, ...]
    #: positions of the row holding a non-zero slot (shown or not).
    filled: int
    max_seq_len: int
    #: the runs of positions between shown cells that are not shown.
    gaps: tuple[RowGap, ...] = ()
    #: the position range asked for (`--positions`), else None (the whole row).
    window: tuple[int, int] | None = None
    #: marked positions (cells with findings) in the range that did not fit `max_cells`.
    marks_not_shown: int = 0
    #: how full the row is along the range shown, for a picture of it (a row strip).
    occupancy: RowOccupancy | None = None


@dataclass(frozen=True, kw_only=True)
class RowOccupancy:
    """Positions `[start, end)` of a row in steps of `step` positions, and how many of each
    step hold a slot: the range mapped, up to its last filled position or live end."""

    start: int
    end: int
    step: int
    #: per step, its positions holding a non-zero slot.
    filled: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class RowGap:
    """Positions `[start, end)` of a row map that are not shown, and how many hold a slot."""

    start: int
    end: int
    filled: int


@dataclass(frozen=True, kw_only=True)
class ProvenanceReport:
    """Answer of `kvcanary provenance`: one slot's cells, or one pool row's map."""

    path: str
    identity: dict[str, str]
    slot: SlotProvenance | None = None
    row: RowMap | None = None
    #: findings that touch the slot (or the row).
    findings: tuple[Finding, ...] = ()
    #: set for a shrunk dump (its provenance covers the kept cells only).
    shrink: ShrinkRecord | None = None


# --- timeline: what changed between dumps of one rank (`kvcanary timeline`, `diff`) ---------


@dataclass(frozen=True, kw_only=True)
class TimelineDump:
    """One dump of a timeline, in step order."""

    index: int
    path: str
    #: the `step` metadata (None when no dump of the sequence records one).
    step: int | None
    identity: dict[str, str]
    bs: int
    #: pool rows the batch uses, and the cells they hold (prefix and pending writes).
    requests: int
    live_cells: int
    #: slots on `free_full_slots` (None: not recorded).
    free_full_slots: int | None
    #: SWA pages leaked (None: not accounted; `leak_note` says why, when it matters).
    leaked_swa_pages: int | None
    leak_note: str | None
    #: cells of the dump's check findings, and the worst severity (None: not checked).
    finding_cells: int | None
    worst: Severity | None
    shrunk: bool


@dataclass(frozen=True, kw_only=True)
class TimelineInterval:
    """What changed between two consecutive dumps `from_dump` and `to_dump`."""

    from_dump: int
    to_dump: int
    after_step: int | None
    at_step: int | None
    #: pool rows: a new request, a request grown, one that left the batch, a row another
    #: request took, a request back in the batch after dumps without it.
    born: tuple[int, ...]
    grew: tuple[int, ...]
    finished: tuple[int, ...]
    reused: tuple[int, ...]
    resumed: tuple[int, ...]
    unchanged: int
    tokens_added: int
    #: distinct slots newly held: listed free in `from_dump`, or neither free nor held there.
    allocated_from_free: int
    allocated_unseen: int
    #: slots whose owner in `from_dump` is gone and that another cell holds now (pool row and
    #: position: the new owner; `extra` old_pool_row, old_position); the free in between falls
    #: between the dumps. Slots whose old owner still holds them are events instead.
    owner_changes: CellColumns
    #: SWA pages leaked since the last dump that accounts leaks, and the change per step.
    leak_new: tuple[int, ...] = ()
    leak_delta: int | None = None
    leak_per_step: float | None = None


@dataclass(frozen=True, kw_only=True)
class TimelineEvent:
    """A change between two dumps that breaks the allocator's contract, dated to the
    interval it happened in and tied to the cause (and the findings) of the dump showing it."""

    kind: EventKind
    cause: CauseCode
    space: Space
    from_dump: int
    to_dump: int
    after_step: int | None
    at_step: int | None
    #: one entry per slot: the cell that holds it in `to_dump` (pool row, position; -1 for a
    #: leaked page) and the kind's columns in `extra`: `other_pool_row`, `other_position` (the
    #: second holder), `swa_before`, `swa_after` (a rewritten LUT entry), `page` (a leak).
    cells: CellColumns
    #: the pages the slots are on (full pages, SWA pages for a leak).
    pages: tuple[int, ...]
    #: codes of `to_dump`'s check findings that touch the slots (empty: none, or not checked).
    findings: tuple[FindingCode, ...]
    message: str


@dataclass(frozen=True, kw_only=True)
class FindingHistory:
    """A check finding (code, group and cause) across the dumps: where it first appears."""

    code: FindingCode
    group: Group
    cause: CauseCode | None
    severity: Severity
    space: Space
    first_dump: int
    first_step: int | None
    #: cells per dump, in dump order (0: absent).
    cells: tuple[int, ...]
    example_slot: int | None


@dataclass(frozen=True, kw_only=True)
class SlotOwner:
    """A live cell holding the slot of a slot history."""

    pool_row: int
    position: int
    batch_row: int
    #: the full slot the cell holds (for an SWA slot's history: the one mapping to it).
    full_slot: int


@dataclass(frozen=True, kw_only=True)
class SlotMoment:
    """One dump's view of a slot: who holds it, whether it is free, where it maps."""

    dump: int
    step: int | None
    #: the first owners (`owners_total` counts them all).
    owners: tuple[SlotOwner, ...]
    owners_total: int
    #: on its pool's free list (None: the dump does not record it).
    free: bool | None
    #: LUT[slot] for a full slot, when the dump has the entry.
    swa_slot: int | None
    #: held, allocated, new owner, held twice, held and free, free, not in the batch.
    state: str


@dataclass(frozen=True, kw_only=True)
class SlotHistory:
    """`provenance --slot N` over several dumps: the slot's owners over time."""

    slot: int
    space: Space
    moments: tuple[SlotMoment, ...]


@dataclass(frozen=True, kw_only=True)
class TimelineReport:
    """Answer of `kvcanary timeline` (and `diff`, `provenance --slot` over several dumps)."""

    rank: str | None
    dumps: tuple[TimelineDump, ...]
    intervals: tuple[TimelineInterval, ...]
    events: tuple[TimelineEvent, ...]
    findings: tuple[FindingHistory, ...]
    #: whether each dump was checked (`findings`); provenance does not check.
    checked: bool
    slot: SlotHistory | None = None
    notes: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        """An event, or an error finding in some dump: exit 1."""
        return bool(self.events) or any(d.worst is Severity.ERROR for d in self.dumps)
