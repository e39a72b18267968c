"""The `kvcanary.timeline/1` record (what changed between dumps of one rank: `timeline`, `diff`,
and `provenance --slot` over several dumps): its declaration, and `timeline_record`, the one
place it is built from `results.timeline.TimelineReport`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypedDict, cast

import kvcanary_cli
from kvcanary_cli.catalog import CauseCode, EventKind, FindingCode, Severity
from kvcanary_cli.render.records.common import (
    GroupName,
    SpaceName,
    group_name,
    identity_record,
)
from kvcanary_cli.results.cells import CellColumns
from kvcanary_cli.results.timeline import (
    FindingHistory,
    SlotHistory,
    TimelineDump,
    TimelineEvent,
    TimelineInterval,
    TimelineReport,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "TIMELINE_SCHEMA",
    "EventRecord",
    "IntervalRecord",
    "TimelineRecord",
    "TimelineVerdict",
    "timeline_record",
]

TIMELINE_SCHEMA: Literal["kvcanary.timeline/1"] = "kvcanary.timeline/1"

#: events: at least one event; findings: no event, a dump with an error finding; clean.
TimelineVerdict = Literal["events", "findings", "clean"]


class TimelineDumpRecord(TypedDict):
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


class ColumnsRecord(TypedDict):
    """Cells as parallel columns: entry i of each list is cell i."""

    slot: list[int]
    #: the cell in the later dump (-1 for a leaked page: not a table cell)
    batch_row: list[int]
    pool_row: list[int]
    position: list[int]
    #: the kind's own columns: page (every event: the slot's page), other_pool_row,
    #: other_position (double-allocation, use-after-free of a slot handed out again),
    #: swa_before, swa_after (lut-rewritten); old_slot, old_slot_fate (prefix-rewritten: 0
    #: orphaned, 1 free, 2 held by a live cell, -1 unknown); old_pool_row, old_position
    #: (owner changes)
    extra: dict[str, list[int]]


class IntervalRecord(TypedDict):
    """What changed between two consecutive dumps."""

    from_dump: int
    to_dump: int
    #: the steps of the two dumps: what happened here happened in (after_step, at_step]
    after_step: int | None
    at_step: int | None
    #: pool rows of requests new since the dump before
    born: list[int]
    #: pool rows of requests that grew
    grew: list[int]
    #: pool rows that left the batch (finished, or out of this step's batch: see resumed)
    finished: list[int]
    #: pool rows another request took
    reused: list[int]
    #: pool rows back in the batch with the cells they had when last seen
    resumed: list[int]
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
    owner_changes: ColumnsRecord
    #: SWA pages leaked that no earlier dump had leaked
    leak_new: list[int]
    #: change of the leaked page count, and per step; null unless both dumps account leaks
    leak_delta: int | None
    leak_per_step: float | None


class EventRecord(TypedDict):
    """A change between dumps that breaks the allocator's contract."""

    kind: EventKind
    #: the cause of the first finding of to_dump that touches its slots, else the kind's own
    cause: CauseCode
    space: SpaceName
    #: the dumps it happened between: in steps (after_step, at_step]; to_dump is the first
    #: dump that shows it
    from_dump: int
    to_dump: int
    after_step: int | None
    at_step: int | None
    #: distinct slots (for swa-leak: SWA pages, each at its first slot)
    count: int
    cells: ColumnsRecord
    #: the pages of its slots (full pages; SWA pages for swa-leak)
    pages: list[int]
    #: codes of to_dump's check findings that touch its slots
    findings: list[FindingCode]
    message: str


class FindingHistoryRecord(TypedDict):
    """A check finding (code, group, cause) across the dumps."""

    code: FindingCode
    severity: Severity
    group: GroupName
    cause: CauseCode | None
    space: SpaceName
    #: the first dump it appears in
    first_dump: int
    first_step: int | None
    #: its cells in each dump, in dump order (0: absent)
    cells: list[int]
    #: its example slot in the first dump
    example_slot: int | None


class LeakRecord(TypedDict):
    """The SWA leak over the sequence."""

    #: leaked pages per dump, in dump order (null: not accounted)
    pages: list[int | None]
    #: (last - first) / steps between the first and last dumps that account leaks; null
    #: without two such dumps with steps
    pages_per_step: float | None


class SlotOwnerRecord(TypedDict):
    """A live cell holding the slot."""

    pool_row: int
    position: int
    batch_row: int
    #: the full slot in the cell (for an SWA slot: the one mapping to it)
    full_slot: int


class SlotMomentRecord(TypedDict):
    """The slot in one dump."""

    dump: int
    step: int | None
    #: held, allocated, allocated from the free list, new owner (no dump shows it free in
    #: between), held twice, held and free, free, not in the batch
    state: str
    #: the first 32 owners
    owners: list[SlotOwnerRecord]
    owners_total: int
    #: on its pool's free list; null when the dump does not record it
    free: bool | None
    #: LUT[slot] of a full slot; null without the entry
    swa_slot: int | None


class SlotHistoryRecord(TypedDict):
    """provenance --slot over several dumps."""

    slot: int
    space: SpaceName
    moments: list[SlotMomentRecord]


class TimelineRecord(TypedDict):
    """`kvcanary timeline --format json` (and diff, provenance --slot over several dumps)."""

    schema: Literal["kvcanary.timeline/1"]
    kvcanary_version: str
    #: the rank every dump records; null when not recorded
    rank: str | None
    verdict: TimelineVerdict
    #: whether each dump was checked (provenance does not check)
    checked: bool
    dumps: list[TimelineDumpRecord]
    intervals: list[IntervalRecord]
    #: by to_dump, then kind
    events: list[EventRecord]
    #: by first dump, then severity and the codes table
    findings: list[FindingHistoryRecord]
    leak: LeakRecord
    #: provenance --slot; null otherwise
    slot: SlotHistoryRecord | None
    notes: list[str]


def _ints(values: np.ndarray) -> list[int]:
    return cast(list[int], values.tolist())


def _columns(cells: CellColumns) -> ColumnsRecord:
    return {
        "slot": [] if cells.slot is None else _ints(cells.slot),
        "batch_row": _ints(cells.batch_row),
        "pool_row": _ints(cells.pool_row),
        "position": _ints(cells.position),
        "extra": {name: _ints(cells.extra[name]) for name in sorted(cells.extra)},
    }


def _space(space: str) -> SpaceName:
    return cast(SpaceName, str(space))


def _dump(d: TimelineDump) -> TimelineDumpRecord:
    return {
        "index": d.index,
        "path": d.path,
        "step": d.step,
        "identity": identity_record(d.identity),
        "bs": d.bs,
        "requests": d.requests,
        "live_cells": d.live_cells,
        "free_full_slots": d.free_full_slots,
        "leaked_swa_pages": d.leaked_swa_pages,
        "leak_note": d.leak_note,
        "finding_cells": d.finding_cells,
        "worst": None if d.worst is None else d.worst,
        "shrunk": d.shrunk,
    }


def _interval(i: TimelineInterval) -> IntervalRecord:
    return {
        "from_dump": i.from_dump,
        "to_dump": i.to_dump,
        "after_step": i.after_step,
        "at_step": i.at_step,
        "born": list(i.born),
        "grew": list(i.grew),
        "finished": list(i.finished),
        "reused": list(i.reused),
        "resumed": list(i.resumed),
        "unchanged": i.unchanged,
        "tokens_added": i.tokens_added,
        "allocated_from_free": i.allocated_from_free,
        "allocated_unseen": i.allocated_unseen,
        "owner_changes": _columns(i.owner_changes),
        "leak_new": list(i.leak_new),
        "leak_delta": i.leak_delta,
        "leak_per_step": i.leak_per_step,
    }


def _event(e: TimelineEvent) -> EventRecord:
    return {
        "kind": e.kind,
        "cause": e.cause,
        "space": _space(e.space),
        "from_dump": e.from_dump,
        "to_dump": e.to_dump,
        "after_step": e.after_step,
        "at_step": e.at_step,
        "count": len(e.cells),
        "cells": _columns(e.cells),
        "pages": list(e.pages),
        "findings": [c for c in e.findings],
        "message": e.message,
    }


def _finding(f: FindingHistory) -> FindingHistoryRecord:
    return {
        "code": f.code,
        "severity": f.severity,
        "group": group_name(f.group),
        "cause": None if f.cause is None else f.cause,
        "space": _space(f.space),
        "first_dump": f.first_dump,
        "first_step": f.first_step,
        "cells": list(f.cells),
        "example_slot": f.example_slot,
    }


def _leak(dumps: tuple[TimelineDump, ...]) -> LeakRecord:
    counted = [d for d in dumps if d.leaked_swa_pages is not None and d.step is not None]
    rate = None
    if len(counted) >= 2 and counted[-1].step != counted[0].step:
        first, last = counted[0], counted[-1]
        assert first.step is not None and last.step is not None
        assert first.leaked_swa_pages is not None and last.leaked_swa_pages is not None
        rate = (last.leaked_swa_pages - first.leaked_swa_pages) / (last.step - first.step)
    return {"pages": [d.leaked_swa_pages for d in dumps], "pages_per_step": rate}


def _slot(history: SlotHistory | None) -> SlotHistoryRecord | None:
    if history is None:
        return None
    return {
        "slot": history.slot,
        "space": _space(history.space),
        "moments": [
            {
                "dump": m.dump,
                "step": m.step,
                "state": m.state,
                "owners": [
                    {
                        "pool_row": o.pool_row,
                        "position": o.position,
                        "batch_row": o.batch_row,
                        "full_slot": o.full_slot,
                    }
                    for o in m.owners
                ],
                "owners_total": m.owners_total,
                "free": m.free,
                "swa_slot": m.swa_slot,
            }
            for m in history.moments
        ],
    }


def timeline_record(report: TimelineReport) -> TimelineRecord:
    """The `kvcanary.timeline/1` record of a timeline."""
    verdict: TimelineVerdict = "clean"
    if report.events:
        verdict = "events"
    elif report.failed:
        verdict = "findings"
    return {
        "schema": TIMELINE_SCHEMA,
        "kvcanary_version": kvcanary_cli.__version__,
        "rank": report.rank,
        "verdict": verdict,
        "checked": report.checked,
        "dumps": [_dump(d) for d in report.dumps],
        "intervals": [_interval(i) for i in report.intervals],
        "events": [_event(e) for e in report.events],
        "findings": [_finding(f) for f in report.findings],
        "leak": _leak(report.dumps),
        "slot": _slot(report.slot),
        "notes": list(report.notes),
    }
