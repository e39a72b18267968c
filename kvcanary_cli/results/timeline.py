"""Results of `kvcanary timeline` (and `diff`, `provenance --slot` over several dumps): what
changed between dumps of one rank, and a slot's owners over time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvcanary_cli.catalog import CauseCode, EventKind, FindingCode, Severity
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.results.cells import CellColumns, Space

__all__ = [
    "FindingHistory",
    "SlotHistory",
    "SlotMoment",
    "SlotOwner",
    "TimelineDump",
    "TimelineEvent",
    "TimelineInterval",
    "TimelineReport",
]


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

    SCHEMA: ClassVar[str] = "kvcanary.timeline/1"

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
