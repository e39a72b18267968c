"""Results of `kvcanary timeline` (and `diff`, `provenance --slot` over several dumps): what
changed between dumps of one rank, and a slot's owners over time. `TimelineReport` is the
`kvcanary.timeline/1` record."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal, TypedDict

import kvcanary_cli
from kvcanary_cli.catalog import CauseCode, EventKind, FindingCode, Severity
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.results.cells import CellColumns, Space
from kvcanary_cli.results.record import recorded

__all__ = [
    "Columns",
    "FindingHistory",
    "SlotHistory",
    "SlotMoment",
    "SlotOwner",
    "TimelineDump",
    "TimelineEvent",
    "TimelineInterval",
    "TimelineLeak",
    "TimelineReport",
    "TimelineVerdict",
]

#: events: at least one event; findings: no event, a dump with an error finding; clean.
TimelineVerdict = Literal["events", "findings", "clean"]


class Columns(TypedDict):
    """Cells as parallel columns: entry i of each list is cell i (the JSON form of the
    `CellColumns` an event or an interval holds)."""

    slot: Sequence[int]
    #: the cell in the later dump (-1 for a leaked page: not a table cell)
    batch_row: Sequence[int]
    pool_row: Sequence[int]
    position: Sequence[int]
    #: the kind's own columns: page (every event: the slot's page), other_pool_row,
    #: other_position (double-allocation, use-after-free of a slot handed out again),
    #: swa_before, swa_after (lut-rewritten); old_slot, old_slot_fate (prefix-rewritten: 0
    #: orphaned, 1 free, 2 held by a live cell, -1 unknown); old_pool_row, old_position
    #: (owner changes)
    extra: dict[str, Sequence[int]]


#: Cells as the analysis holds them; in JSON, `Columns`.
Cells = Annotated[CellColumns, Columns]


@dataclass(frozen=True, kw_only=True)
class TimelineDump:
    """One dump of the sequence, in step order."""

    #: its place in `dumps`, which intervals and events refer to
    index: int
    path: str
    #: the `step` metadata; null when no dump records one (read in the order given)
    step: int | None
    identity: dict[str, str]
    bs: int
    #: pool rows the batch uses, and their live cells (prefix and pending writes)
    requests: int
    live_cells: int
    #: length of free_full_slots; null when not recorded
    free_full_slots: int | None
    #: SWA pages neither free nor mapped from a held full slot; null when not accounted
    leaked_swa_pages: int | None
    #: why leaks are not accounted (null: they are, or the dump has no LUT)
    leak_note: str | None
    #: cells of its check findings (as check --kernel none); null when not checked
    finding_cells: int | None
    #: the worst severity among them; null without a finding or a check
    worst: Severity | None
    shrunk: bool


@dataclass(frozen=True, kw_only=True)
class TimelineInterval:
    """What changed between two consecutive dumps."""

    from_dump: int
    to_dump: int
    #: the steps of the two dumps: what happened here happened in (after_step, at_step]
    after_step: int | None
    at_step: int | None
    #: pool rows of requests new since the dump before
    born: tuple[int, ...]
    #: pool rows of requests that grew
    grew: tuple[int, ...]
    #: pool rows that left the batch (finished, or out of this step's batch: see resumed)
    finished: tuple[int, ...]
    #: pool rows another request took
    reused: tuple[int, ...]
    #: pool rows back in the batch with the cells they had when last seen
    resumed: tuple[int, ...]
    #: requests with the same cells as in the dump before
    unchanged: int
    #: cells the grown requests added
    tokens_added: int
    #: distinct slots newly held that the dump before listed free
    allocated_from_free: int
    #: distinct slots newly held that the dump before neither listed free nor held
    allocated_unseen: int
    #: slots whose owner in the dump before is gone, held by another cell now (the new
    #: owner's cell; extra: old_pool_row, old_position); the free fell between the dumps
    owner_changes: Cells
    #: SWA pages leaked that no earlier dump had leaked
    leak_new: tuple[int, ...] = ()
    #: change of the leaked page count, and per step; null unless both dumps account leaks
    leak_delta: int | None = None
    leak_per_step: float | None = None


@dataclass(frozen=True, kw_only=True)
class TimelineEvent:
    """A change between dumps that breaks the allocator's contract, dated to the interval it
    happened in and tied to the cause (and the findings) of the dump showing it."""

    kind: EventKind
    #: the cause of the first finding of to_dump that touches its slots, else the kind's own
    cause: CauseCode
    space: Space
    #: the dumps it happened between: in steps (after_step, at_step]; to_dump is the first
    #: dump that shows it
    from_dump: int
    to_dump: int
    after_step: int | None
    at_step: int | None
    cells: Cells
    #: the pages of its slots (full pages; SWA pages for swa-leak)
    pages: tuple[int, ...]
    #: codes of to_dump's check findings that touch its slots
    findings: tuple[FindingCode, ...]
    message: str

    #: distinct slots (for swa-leak: SWA pages, each at its first slot)
    @recorded
    def count(self) -> int:
        """How many cells the event holds."""
        return len(self.cells)


@dataclass(frozen=True, kw_only=True)
class FindingHistory:
    """A check finding (code, group, cause) across the dumps."""

    code: FindingCode
    severity: Severity
    group: Group
    cause: CauseCode | None
    space: Space
    #: the first dump it appears in
    first_dump: int
    first_step: int | None
    #: its cells in each dump, in dump order (0: absent)
    cells: tuple[int, ...]
    #: its example slot in the first dump
    example_slot: int | None


@dataclass(frozen=True, kw_only=True)
class TimelineLeak:
    """The SWA leak over the sequence."""

    #: leaked pages per dump, in dump order (null: not accounted)
    pages: tuple[int | None, ...]
    #: (last - first) / steps between the first and last dumps that account leaks; null
    #: without two such dumps with steps
    pages_per_step: float | None


@dataclass(frozen=True, kw_only=True)
class SlotOwner:
    """A live cell holding the slot."""

    pool_row: int
    position: int
    batch_row: int
    #: the full slot in the cell (for an SWA slot: the one mapping to it)
    full_slot: int


@dataclass(frozen=True, kw_only=True)
class SlotMoment:
    """The slot in one dump."""

    dump: int
    step: int | None
    #: held, allocated, allocated from the free list, new owner (no dump shows it free in
    #: between), held twice, held and free, free, not in the batch
    state: str
    #: the first 32 owners
    owners: tuple[SlotOwner, ...]
    owners_total: int
    #: on its pool's free list; null when the dump does not record it
    free: bool | None
    #: LUT[slot] of a full slot; null without the entry
    swa_slot: int | None


@dataclass(frozen=True, kw_only=True)
class SlotHistory:
    """provenance --slot over several dumps."""

    slot: int
    space: Space
    moments: tuple[SlotMoment, ...]


@dataclass(frozen=True, kw_only=True)
class TimelineReport:
    """`kvcanary timeline --format json` (and diff, provenance --slot over several dumps)."""

    SCHEMA: ClassVar[str] = "kvcanary.timeline/1"

    #: the rank every dump records; null when not recorded
    rank: str | None
    #: whether each dump was checked (provenance does not check)
    checked: bool
    dumps: tuple[TimelineDump, ...]
    intervals: tuple[TimelineInterval, ...]
    #: by to_dump, then kind
    events: tuple[TimelineEvent, ...]
    #: by first dump, then severity and the codes table
    findings: tuple[FindingHistory, ...]
    #: provenance --slot; null otherwise
    slot: SlotHistory | None = None
    notes: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        """An event, or an error finding in some dump: exit 1."""
        return bool(self.events) or any(d.worst is Severity.ERROR for d in self.dumps)

    @recorded
    def kvcanary_version(self) -> str:
        """The kvcanary that made the record."""
        return kvcanary_cli.__version__

    @recorded
    def verdict(self) -> TimelineVerdict:
        """What the exit code says: events, error findings (no event), or neither."""
        if self.events:
            return "events"
        return "findings" if self.failed else "clean"

    @recorded
    def leak(self) -> TimelineLeak:
        """The leaked pages per dump, and their rate over the dumps that account them."""
        counted = [d for d in self.dumps if d.leaked_swa_pages is not None and d.step is not None]
        rate = None
        if len(counted) >= 2 and counted[-1].step != counted[0].step:
            first, last = counted[0], counted[-1]
            assert first.step is not None and last.step is not None
            assert first.leaked_swa_pages is not None and last.leaked_swa_pages is not None
            rate = (last.leaked_swa_pages - first.leaked_swa_pages) / (last.step - first.step)
        return TimelineLeak(
            pages=tuple(d.leaked_swa_pages for d in self.dumps), pages_per_step=rate
        )
