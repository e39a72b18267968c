"""The terminal view of a violations report: sources, replay, the first rows with their
diagnosis, the slots, and notes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvcanary_cli.canary.constants import hex64
from kvcanary_cli.render.console import plural
from kvcanary_cli.render.phrases.violations import (
    REPLAY_NOTE,
    reasons_text,
    replay_comparison_line,
    slot_cells_text,
    source_detail,
)
from kvcanary_cli.render.table.common import cells
from kvcanary_cli.safe_text import printable_record

if TYPE_CHECKING:  # the rows are numpy columns: `--help` does not import them
    from kvcanary_cli.results.cells import SlotProvenance
    from kvcanary_cli.results.violations import ReplaySummary, ViolationRow, ViolationsReport

__all__ = ["violations_table"]


def _slots_table(slots: tuple[SlotProvenance, ...]) -> Table:
    table = Table(title="slots", title_justify="left")
    for name in ("space", "slot", "allocator", "cells in req_to_token"):
        table.add_column(name, justify="right" if name == "slot" else "left")
    for prov in slots:
        table.add_row(
            *cells(prov.space, prov.slot, prov.allocator or "unknown", slot_cells_text(prov))
        )
    return table


def _row_table(rows: tuple[ViolationRow, ...]) -> Table:
    table = Table(title="violation rows", title_justify="left")
    table.add_column("from")
    table.add_column("tag")
    table.add_column("slot", justify="right")
    table.add_column("pos", justify="right")
    table.add_column("token", justify="right")
    table.add_column("reasons")
    table.add_column("diagnosis")
    for r in rows:
        token = f"{r.stored_token}"
        if r.expected_token != -1:
            token += f" / {r.expected_token}"
        table.add_row(
            *cells(
                "replay" if r.origin == "replay" else f"{r.origin} {r.index}",
                r.tag,
                r.slot_idx,
                r.position,
                token,
                # shortened for a table: `verify_` dropped, `write_` kept
                reasons_text(r.reasons),
                r.diagnosis or f"prev hash {hex64(r.stored_chain_hash)}",
            )
        )
    return table


def _replay_table(replay: tuple[ReplaySummary, ...]) -> Table:
    table = Table(title="replay", title_justify="left")
    for name in ("group", "buffer", "entries", "checked", "slot 0", "no chain check", "real KV"):
        table.add_column(
            name, justify="left" if name in ("group", "buffer", "real KV") else "right"
        )
    table.add_column("rows", justify="right")
    for r in replay:
        table.add_row(
            *cells(
                r.group,
                r.buffer,
                r.entries,
                r.checked,
                r.slot_zero,
                r.chain_skipped,
                r.real_kv,
                r.rows,
            )
        )
    return table


def violations_table(report: ViolationsReport, *, max_rows: int = 20) -> RenderableType:
    """Sources, replay, the first `max_rows` rows with their diagnosis, and notes."""
    report = printable_record(report)
    total, unread = len(report.rows), report.unread_violations
    if total:
        words = f"VIOLATIONS: {plural(total, 'row')}"
        words += f" ({unread} more logged, unreadable)" if unread else ""
    elif unread:
        words = f"UNREADABLE: {plural(unread, 'violation')} logged, cut short or garbled"
    else:
        words = "CLEAN: no violation rows"
    head = Text(words, style="bold red" if total or unread else "bold green")
    by_origin = report.summary.by_origin
    if by_origin:
        head.append("  (" + ", ".join(f"{k} {v}" for k, v in by_origin.items()) + ")")
    parts: list[RenderableType] = [head]
    if report.dump is not None:
        parts.append(Text(f"  explained against {report.dump}", style="dim"))
    sources = Table(title="sources", title_justify="left")
    for name in ("source", "kind", "rows", "read"):
        sources.add_column(name, justify="right" if name == "rows" else "left")
    for s in report.sources:
        sources.add_row(*cells(s.path, s.kind, s.rows, source_detail(s)))
    if report.sources:
        parts.append(sources)
    if report.replay:
        parts.append(_replay_table(report.replay))
        parts.append(Text(REPLAY_NOTE, style="dim"))
    if report.comparison is not None:
        parts.append(Text(replay_comparison_line(report.comparison)))
    shown = tuple(printable_record(row) for row in report.rows.head(max_rows))
    if shown:
        parts.append(_row_table(shown))
    if total > len(shown):
        parts.append(Text(f"… and {total - len(shown)} more (--max-rows)"))
    if report.slots:
        parts.append(_slots_table(report.slots[: max(max_rows, 0)]))
    notes = [f"{s.path}: {note}" for s in report.sources for note in s.notes]
    parts.extend(Text(f"  note: {note}", style="dim") for note in [*notes, *report.notes])
    return Group(*parts)
