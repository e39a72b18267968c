"""The terminal view of a `kvcanary.violations/1` record: sources, replay, the first rows
with their diagnosis, the slots, and notes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvcanary_cli.canary.constants import hex64
from kvcanary_cli.render.phrases.violations import (
    REPLAY_NOTE,
    replay_comparison_line,
    slot_cells_text,
    source_detail,
    violation_reasons,
)
from kvcanary_cli.render.shared import plural
from kvcanary_cli.render.table.common import cells
from kvcanary_cli.results.cells import SlotProvenance
from kvcanary_cli.safe_text import printable_record

if TYPE_CHECKING:  # the record's module builds it with numpy
    from kvcanary_cli.render.records.violations import (
        ReplayRecord,
        ViolationRowRecord,
        ViolationsRecord,
    )

__all__ = ["violations_table"]


def _slots_table(slots: list[SlotProvenance]) -> Table:
    table = Table(title="slots", title_justify="left")
    for name in ("space", "slot", "allocator", "cells in req_to_token"):
        table.add_column(name, justify="right" if name == "slot" else "left")
    for prov in slots:
        table.add_row(
            *cells(
                prov.space,
                prov.slot,
                prov.allocator or "unknown",
                slot_cells_text(prov),
            )
        )
    return table


def _row_table(rows: list[ViolationRowRecord]) -> Table:
    table = Table(title="violation rows", title_justify="left")
    table.add_column("from")
    table.add_column("tag")
    table.add_column("slot", justify="right")
    table.add_column("pos", justify="right")
    table.add_column("token", justify="right")
    table.add_column("reasons")
    table.add_column("diagnosis")
    for r in rows:
        origin = "replay" if r["origin"] == "replay" else f"{r['origin']} {r['index']}"
        token = f"{r['stored_token']}"
        if r["expected_token"] != -1:
            token += f" / {r['expected_token']}"
        table.add_row(
            *cells(
                origin,
                r["tag"],
                r["slot_idx"],
                r["position"],
                token,
                violation_reasons(r),
                r["diagnosis"] or f"prev hash {hex64(r['stored_chain_hash'])}",
            )
        )
    return table


def _replay_table(replay: list[ReplayRecord]) -> Table:
    table = Table(title="replay", title_justify="left")
    for name in ("group", "buffer", "entries", "checked", "slot 0", "no chain check", "real KV"):
        table.add_column(
            name, justify="left" if name in ("group", "buffer", "real KV") else "right"
        )
    table.add_column("rows", justify="right")
    for r in replay:
        table.add_row(
            *cells(
                r["group"],
                r["buffer"],
                r["entries"],
                r["checked"],
                r["slot_zero"],
                r["chain_skipped"],
                r["real_kv"],
                r["rows"],
            )
        )
    return table


def violations_table(record: ViolationsRecord, *, max_rows: int = 20) -> RenderableType:
    """Sources, replay, the first `max_rows` rows with their diagnosis, and notes."""
    record = printable_record(record)
    total, unread = record["rows_total"], record["unread_violations"]
    if total:
        words = f"VIOLATIONS: {plural(total, 'row')}"
        words += f" ({unread} more logged, unreadable)" if unread else ""
    elif unread:
        words = f"UNREADABLE: {plural(unread, 'violation')} logged, cut short or garbled"
    else:
        words = "CLEAN: no violation rows"
    head = Text(words, style="bold red" if total or unread else "bold green")
    by_origin = record["summary"]["by_origin"]
    if by_origin:
        head.append("  (" + ", ".join(f"{k} {v}" for k, v in by_origin.items()) + ")")
    parts: list[RenderableType] = [head]
    if record["dump"] is not None:
        parts.append(Text(f"  explained against {record['dump']}", style="dim"))
    sources = Table(title="sources", title_justify="left")
    for name in ("source", "kind", "rows", "read"):
        sources.add_column(name, justify="right" if name == "rows" else "left")
    for s in record["sources"]:
        sources.add_row(*cells(s["path"], s["kind"], s["rows"], source_detail(s)))
    if record["sources"]:
        parts.append(sources)
    if record["replay"]:
        parts.append(_replay_table(record["replay"]))
        parts.append(Text(REPLAY_NOTE, style="dim"))
    if record["comparison"] is not None:
        parts.append(Text(replay_comparison_line(record["comparison"])))
    shown = record["rows"][: max(max_rows, 0)]
    if shown:
        parts.append(_row_table(shown))
    if total > len(shown):
        parts.append(Text(f"… and {total - len(shown)} more (--max-rows)"))
    if record["slots"]:
        parts.append(_slots_table(record["slots"][: max(max_rows, 0)]))
    notes = [n for s in record["sources"] for n in (f"{s['path']}: {x}" for x in s["notes"])]
    parts.extend(Text(f"  note: {note}", style="dim") for note in notes + record["notes"])
    return Group(*parts)
