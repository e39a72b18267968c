"""The terminal view of a timeline (the `kvcanary.timeline/1` record): the dumps, what
changed between each and the next, the events with their cells, when each finding first
appears, a slot's owners over time (provenance), the notes, and the verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvcanary_cli.render.table.common import SEVERITY_STYLE, cells, indented
from kvcanary_cli.render.table.common import cell as _t
from kvcanary_cli.render.timeline_text import (
    dump_cells,
    event_columns,
    event_headline,
    event_lines,
    event_rows,
    finding_cells,
    folder,
    headline,
    interval_cells,
    interval_header,
    moment_cells,
    owner_change_rows,
    verdict_text,
)
from kvcanary_cli.safe_text import printable_record

if TYPE_CHECKING:
    from kvcanary_cli.results.timeline import TimelineReport

__all__ = ["timeline_table"]

_RIGHT = {"#", "step", "requests", "cells", "free", "leaked", "+cells"}


def _table(title: str, header: list[str], rows: list[list[str]]) -> Table:
    grid = Table(title=title, title_justify="left")
    for name in header:
        if name in ("path", "file"):
            grid.add_column(name, overflow="fold")
        else:
            grid.add_column(name, justify="right" if name in _RIGHT else "left")
    for row in rows:
        grid.add_row(*cells(*row))
    return grid


def timeline_table(report: TimelineReport, *, max_rows: int = 10) -> RenderableType:
    """Headline, dumps, intervals, events, findings first seen, slot history, notes, verdict.

    An interval's owner changes are listed (up to `max_rows`) when there is one interval
    (`diff`); with more, their count is in the intervals' table."""
    report = printable_record(report)
    parts: list[RenderableType] = [Text("kvcanary timeline: " + headline(report), style="bold")]
    short = folder(report) is not None
    dumps = [dump_cells(d, name_only=short) for d in report.dumps]
    header = ["#", "step", "requests", "cells", "free", "leaked", "findings"]
    parts.append(_table("dumps", [*header, "file" if short else "path"], dumps))
    if report.intervals:
        rows = [interval_cells(i) for i in report.intervals]
        parts.append(_table("between dumps (pool rows)", interval_header(), rows))
    if len(report.intervals) == 1:
        changes, more = owner_change_rows(report.intervals[0], max_rows)
        if changes:
            title = "slots taken over from an owner the older dump had (free not seen)"
            parts.append(_table(title, ["slot", "old pool row:pos", "new pool row:pos"], changes))
            if more:
                parts.append(Text(f"… and {more} more"))
    for event in report.events:
        parts.append(Text("✗ " + event_headline(event), style="bold red"))
        parts.append(indented([("", Text(line)) for line in event_lines(event)], indent=4))
        rows, more = event_rows(event)
        parts.append(_table("", event_columns(event), rows))
        if more:
            parts.append(Text(f"    … and {more} more (--format json lists them all)"))
    if report.findings:
        rows = [finding_cells(f) for f in report.findings]
        header = ["code", "cause", "group", "first seen", "cells per dump"]
        grid = Table(title="check findings, by the dump they first appear in", title_justify="left")
        for name in header:
            grid.add_column(name)
        for f, row in zip(report.findings, rows, strict=True):
            style = SEVERITY_STYLE.get(f.severity, "")
            grid.add_row(_t(row[0], style), *cells(*row[1:]))
        parts.append(grid)
    slot = report.slot
    if slot is not None:
        swa = slot.space == "swa"
        rows = [moment_cells(m, swa=swa) for m in slot.moments]
        header = ["#", "step", "state", "owners (pool row:pos)", "allocator", "SWA slot"]
        parts.append(_table(f"{slot.space} slot {slot.slot} over the dumps", header, rows))
    if report.notes:
        parts.append(indented([("note:", Text(n, style="yellow")) for n in report.notes]))
    style = "bold green" if report.verdict == "clean" else "bold red"
    parts.append(Text(verdict_text(report), style=style))
    return Group(*parts)
