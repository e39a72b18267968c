"""The Markdown view of a timeline (the `kvcanary.timeline/1` record): what changed between
dumps of one rank, to paste into a bug report."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcanary_cli.render.markdown.blocks import code, table, text
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

__all__ = ["timeline_markdown"]


def _table(header: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    return table([text(h) for h in header], [[text(c) for c in row] for row in rows], right=right)


def timeline_markdown(report: TimelineReport, *, max_rows: int = 10) -> str:
    """Headline, verdict, events, dumps, intervals, findings first seen, slot history, notes."""
    report = printable_record(report)
    parts = [
        "## kvcanary timeline",
        f"{text(headline(report))} · `{report.SCHEMA}`",
        f"**{text(verdict_text(report))}**",
    ]
    for event in report.events:
        parts.append(f"### {text(event_headline(event))}")
        parts.append("\n".join(f"- {text(line)}" for line in event_lines(event)))
        rows, more = event_rows(event)
        columns = event_columns(event)
        parts.append(_table(columns, rows, right=set(range(len(columns)))))
        if more:
            parts.append(f"… and {more} more (`--format json` lists them all)")
    parts.append("### Dumps")
    header = ["#", "step", "requests", "cells", "free", "leaked", "findings"]
    short = folder(report) is not None
    rows = [dump_cells(d, name_only=short) for d in report.dumps]
    cells = [[*(text(c) for c in row[:-1]), code(row[-1])] for row in rows]
    names = [text(h) for h in [*header, "file" if short else "path"]]
    parts.append(table(names, cells, right={0, 1, 2, 3, 4, 5}))
    if report.intervals:
        parts.append("### Between dumps (pool rows)")
        parts.append(_table(interval_header(), [interval_cells(i) for i in report.intervals]))
    if len(report.intervals) == 1:
        changes, more = owner_change_rows(report.intervals[0], max_rows)
        if changes:
            parts.append("Slots taken over from an owner the older dump had (free not seen):")
            parts.append(_table(["slot", "old pool row:pos", "new pool row:pos"], changes, {0}))
            if more:
                parts.append(f"… and {more} more")
    if report.findings:
        parts.append("### Check findings, by the dump they first appear in")
        rows = [finding_cells(f) for f in report.findings]
        parts.append(_table(["code", "cause", "group", "first seen", "cells per dump"], rows))
    slot = report.slot
    if slot is not None:
        parts.append(f"### {text(slot.space)} slot {slot.slot} over the dumps")
        swa = slot.space == "swa"
        rows = [moment_cells(m, swa=swa) for m in slot.moments]
        header = ["#", "step", "state", "owners (pool row:pos)", "allocator", "SWA slot"]
        parts.append(_table(header, rows, {0, 1}))
    if report.notes:
        parts.append("\n".join(f"- note: {text(n)}" for n in report.notes))
    return "\n\n".join(parts) + "\n"
