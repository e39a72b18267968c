"""Phrases the terminal and Markdown views of a timeline (`results.timeline.TimelineReport`,
the `kvcanary.timeline/1` record) share: the headline, the verdict, an interval's steps and
changes, an event's cells, a slot's owners. Pure functions of the result; an event's or an
interval's cells are read only where shown."""

from __future__ import annotations

from pathlib import PurePath
from typing import TYPE_CHECKING

from kvcanary_cli.catalog import EventKind
from kvcanary_cli.render.console import plural

if TYPE_CHECKING:
    import numpy as np

    from kvcanary_cli.results.cells import CellColumns
    from kvcanary_cli.results.columns import Entries
    from kvcanary_cli.results.timeline import (
        FindingHistory,
        SlotMoment,
        TimelineDump,
        TimelineEvent,
        TimelineInterval,
        TimelineReport,
    )

__all__ = [
    "EVENT_ROWS",
    "dump_cells",
    "event_columns",
    "event_headline",
    "event_lines",
    "event_rows",
    "finding_cells",
    "folder",
    "headline",
    "interval_cells",
    "interval_header",
    "moment_cells",
    "owner_change_rows",
    "rows_text",
    "steps_text",
    "verdict_text",
]

#: cells listed per event in the table and Markdown views (JSON lists them all).
EVENT_ROWS = 8


def steps_text(after: int | None, at: int | None) -> str:
    """`steps (12, 16]`: the interval a change happened in."""
    if at is None:
        return "between the dumps"
    return f"steps ({'?' if after is None else after}, {at}]"


def _step(step: int | None, index: int) -> str:
    return f"#{index}" if step is None else str(step)


def folder(report: TimelineReport) -> str | None:
    """The folder every dump is in, if they share one (the views then show file names)."""
    parents = {str(PurePath(d.path).parent) for d in report.dumps}
    return parents.pop() if len(parents) == 1 else None


def headline(report: TimelineReport) -> str:
    """What was read: how many dumps, of which rank, over which steps, from where."""
    dumps = report.dumps
    rank = "rank ?" if report.rank is None else f"rank {report.rank}"
    span = f"steps {_step(dumps[0].step, 0)} to {_step(dumps[-1].step, len(dumps) - 1)}"
    where = "" if folder(report) is None else f" in {folder(report)}"
    checked = "; each checked as check --kernel none" if report.checked else ""
    return f"{len(dumps)} dumps of {rank}, {span}{where}{checked}"


def verdict_text(report: TimelineReport) -> str:
    """One line: the events by kind and interval, or that there is none."""
    events = report.events
    if events:
        parts = [f"{e.kind} ({steps_text(e.after_step, e.at_step)}, {_count(e)})" for e in events]
        return f"{len(events)} event(s): " + "; ".join(parts)
    if report.verdict == "findings":
        bad = [str(d.index) for d in report.dumps if d.worst == "error"]
        return f"no event; error findings in dump(s) {', '.join(bad)} (check them)"
    if report.checked:
        return "no event, no error finding"
    return "no event"


def _count(e: TimelineEvent) -> str:
    what = "page" if e.kind == EventKind.SWA_LEAK else f"{e.space} slot"
    return plural(e.count, what)


def rows_text(rows: tuple[int, ...], limit: int = 6) -> str:
    """A list of pool rows, shortened: `3: 5, 7, 9`."""
    if not rows:
        return "-"
    shown = ", ".join(map(str, rows[:limit]))
    more = ", …" if len(rows) > limit else ""
    return f"{len(rows)}: {shown}{more}"


def dump_cells(d: TimelineDump, *, name_only: bool = False) -> list[str]:
    """A dump's row: index, step, requests, live cells, free slots, leaked pages, findings,
    and its path (`name_only`: its file name)."""
    leaked = "-" if d.leaked_swa_pages is None else str(d.leaked_swa_pages)
    findings = "-" if d.finding_cells is None else str(d.finding_cells)
    if d.worst is not None:
        findings += f" ({d.worst})"
    free = "-" if d.free_full_slots is None else str(d.free_full_slots)
    shrunk = " (shrunk)" if d.shrunk else ""
    return [
        str(d.index),
        _step(d.step, d.index),
        str(d.requests),
        str(d.live_cells),
        free,
        leaked,
        findings,
        (PurePath(d.path).name if name_only else d.path) + shrunk,
    ]


def interval_header() -> list[str]:
    """Column names of the intervals' table."""
    return ["steps", "born", "grew", "finished", "reused", "+cells", "allocated", "leak"]


def interval_cells(i: TimelineInterval) -> list[str]:
    """An interval's row: requests born, grown, finished, reused; cells added; slots newly
    held (from the free list / unseen / taken over); the leak's change."""
    leak = "-"
    if i.leak_delta is not None:
        rate = "" if i.leak_per_step is None else f" ({i.leak_per_step:+.3g}/step)"
        leak = f"{i.leak_delta:+d}{rate}"
    changes = len(i.owner_changes)
    allocated = f"{i.allocated_from_free} from free list"
    if i.allocated_unseen:
        allocated += f", {i.allocated_unseen} unseen"
    if changes:
        allocated += f", {changes} taken over"
    finished = rows_text(i.finished)
    if i.resumed:
        finished += f" (back: {rows_text(i.resumed)})"
    return [
        steps_text(i.after_step, i.at_step),
        rows_text(i.born),
        str(len(i.grew)),
        finished,
        rows_text(i.reused),
        str(i.tokens_added),
        allocated,
        leak,
    ]


def event_headline(e: TimelineEvent) -> str:
    """`use-after-free in steps (3, 4] (dumps 2 → 3): 1 full slot · cause use-after-free`."""
    return (
        f"{e.kind} in {steps_text(e.after_step, e.at_step)} (dumps {e.from_dump} → "
        f"{e.to_dump}): {_count(e)} · cause {e.cause}"
    )


def event_lines(e: TimelineEvent) -> list[str]:
    """What the event is, and the findings of its dump on its slots."""
    lines = [e.message]
    if e.findings:
        lines.append(f"findings of dump {e.to_dump} on them: {', '.join(e.findings)}")
    return lines


def _held(cells: CellColumns, name: str) -> np.ndarray | Entries:
    """A column as held (its entries read one at a time, where shown)."""
    column = cells.entries(name)
    assert column is not None, name
    return column


def _paged(e: TimelineEvent) -> bool:
    """Pages differ from slots (a page size above 1): the page column says something."""
    if e.cells.entries("page") is None:
        return len(e.cells) > 0
    return not e.cells.same_column("page", "slot")


#: `old_slot_fate` of a prefix-rewritten event, in words (analysis.timeline.PREFIX_FATES).
OLD_SLOT_FATES = {0: "orphaned", 1: "free", 2: "held", -1: "not held"}


def event_columns(e: TimelineEvent) -> list[str]:
    """Column names of an event's cells."""
    if e.kind == EventKind.SWA_LEAK:
        return ["SWA page", "first slot"]
    base = ["slot", *(["page"] if _paged(e) else []), "pool row", "position"]
    if e.kind == EventKind.LUT_REWRITTEN:
        return [*base, "SWA slot before", "after"]
    if e.kind == EventKind.PREFIX_REWRITTEN:
        return [*base, "old slot", "old slot now"]
    if "other_pool_row" in e.cells.extra:
        return [*base, "other pool row", "other position"]
    return base


def event_rows(e: TimelineEvent, limit: int = EVENT_ROWS) -> tuple[list[list[str]], int]:
    """An event's first `limit` cells as rows, and how many are left out."""
    cells = e.cells
    shown = min(limit, len(cells))
    held = {name: _held(cells, name) for name in ("slot", "pool_row", "position")}
    extra = {name: _held(cells, name) for name in cells.extra}
    paged = _paged(e)
    rows = []
    for i in range(shown):
        if e.kind == EventKind.SWA_LEAK:
            rows.append([str(int(extra["page"][i])), str(int(held["slot"][i]))])
            continue
        row = [
            str(int(held["slot"][i])),
            *([str(int(extra["page"][i]))] if paged else []),
            str(int(held["pool_row"][i])),
            str(int(held["position"][i])),
        ]
        for name in ("swa_before", "swa_after", "other_pool_row", "other_position", "old_slot"):
            if name in extra:
                row.append(str(int(extra[name][i])))
        if "old_slot_fate" in extra:
            row.append(OLD_SLOT_FATES.get(int(extra["old_slot_fate"][i]), "?"))
        rows.append(row)
    return rows, len(cells) - shown


def owner_change_rows(i: TimelineInterval, limit: int) -> tuple[list[list[str]], int]:
    """The first `limit` owner changes of an interval: slot, old owner, new owner."""
    changes = i.owner_changes
    shown = min(limit, len(changes))
    slot, pool_row, position = (_held(changes, n) for n in ("slot", "pool_row", "position"))
    old_row, old_position = _held(changes, "old_pool_row"), _held(changes, "old_position")
    rows = [
        [
            str(int(slot[k])),
            f"{int(old_row[k])}:{int(old_position[k])}",
            f"{int(pool_row[k])}:{int(position[k])}",
        ]
        for k in range(shown)
    ]
    return rows, len(changes) - shown


def finding_cells(f: FindingHistory) -> list[str]:
    """A finding history's row: code, cause, group, first seen, cells per dump."""
    first = f"dump {f.first_dump} (step {_step(f.first_step, f.first_dump)})"
    return [
        str(f.code),
        str(f.cause or "-"),
        str(f.group),
        first,
        " ".join(str(c) for c in f.cells),
    ]


def moment_cells(m: SlotMoment, *, swa: bool) -> list[str]:
    """A slot moment's row: dump, step, state, owners (pool row:position, and for an SWA slot
    the full slot mapping to it), free, SWA slot."""
    owners = ", ".join(
        f"{o.pool_row}:{o.position}" + (f" (full {o.full_slot})" if swa else "")
        for o in m.owners[:4]
    )
    if m.owners_total > 4:
        owners += f", … ({m.owners_total} in all)"
    free = "-" if m.free is None else ("free" if m.free else "in use")
    return [
        str(m.dump),
        _step(m.step, m.dump),
        m.state,
        owners or "-",
        free,
        "-" if m.swa_slot is None else str(m.swa_slot),
    ]
