"""The terminal view of a `kvcanary.provenance/2` report: a slot's cells, translation,
allocator, canary and violation rows, or a pool row's map; then the findings touching it."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvcanary_cli.render.console import plural
from kvcanary_cli.render.phrases.provenance import CELL_COLUMNS, row_lines, row_notices
from kvcanary_cli.render.table.common import (
    cells,
    findings_view,
    identity_line,
    indented,
    shrunk_block,
)
from kvcanary_cli.render.table.pictures import RowStrip
from kvcanary_cli.results.cells import SlotProvenance
from kvcanary_cli.results.check import Finding
from kvcanary_cli.results.provenance import ProvenanceReport, RowGap, RowMap
from kvcanary_cli.safe_text import printable_record

__all__ = ["provenance_table"]


def _slot_blocks(prov: SlotProvenance, max_rows: int) -> list[RenderableType]:
    head = Text(f"{prov.space} slot {prov.slot}", style="bold")
    if prov.swa_slot is not None:
        head.append(f"  → swa slot {prov.swa_slot} (LUT[{prov.slot}])")
    elif prov.translation_note:
        head.append(f"  → no SWA translation: {prov.translation_note}", style="yellow")
    parts: list[RenderableType] = [head]
    if prov.space == "swa":
        mapped = ", ".join(map(str, prov.mapped_from)) or "none"
        parts.append(
            indented([("", Text(f"mapped from full slots (LUT[f] = {prov.slot}): {mapped}"))])
        )
    if prov.clamped_from:
        clamped = ", ".join(map(str, prov.clamped_from))
        redirected = "redirected here by the GPU clamp (full slots >= lut_len the SWA plan reads)"
        parts.append(indented([("", Text(f"{redirected}: {clamped}", style="yellow"))]))
    parts.append(
        Text(
            f"  allocator: {prov.allocator or 'unknown (no free list in the dump)'}",
            style="red" if prov.allocator == "free" else "",
        )
    )
    if prov.cells_total:
        parts.append(_cell_table(prov))
    else:  # an empty table's header says nothing a line cannot
        parts.append(Text("  cells: no req_to_token cell holds it"))
    if prov.cells_total > len(prov.cells):
        parts.append(Text(f"… and {prov.cells_total - len(prov.cells)} more cells"))
    if prov.canary:
        canary = Table(title="canary records", title_justify="left")
        for name in ("buffer", "token", "position", "prev hash", "real kv hash"):
            canary.add_column(name, justify="left" if name == "buffer" else "right")
        for r in prov.canary[:max_rows]:
            canary.add_row(*cells(r.buffer, r.token, r.position, r.prev_hash, r.real_kv_hash))
        parts.append(canary)
        if len(prov.canary) > max_rows:
            parts.append(Text(f"… and {len(prov.canary) - max_rows} more records (--max-rows)"))
    if prov.violations:
        shown, total = min(len(prov.violations), max_rows), prov.violations_total
        title = "violation ring rows" + (f" (first {shown} of {total})" if total > shown else "")
        violations = Table(title=title, title_justify="left")
        violations.add_column("index", justify="right")
        violations.add_column("fields")
        for v in prov.violations[:shown]:
            violations.add_row(*cells(v.index, ", ".join(map(str, v.fields))))
        parts.append(violations)
    return parts


def _cell_table(prov: SlotProvenance) -> Table:
    """The req_to_token cells holding the slot, live first."""
    swa = prov.space == "swa"
    table = Table(
        title=f"cells ({prov.cells_total} in req_to_token, live first)", title_justify="left"
    )
    for name in CELL_COLUMNS[swa]:
        table.add_column(
            name, justify="right" if name in ("pool row", "position", "full slot") else "left"
        )
    for c in prov.cells:
        table.add_row(
            *cells(
                c.pool_row,
                c.position,
                *((c.full_slot,) if swa else ()),
                ", ".join(map(str, c.batch_rows)) or "-",
                c.role,
                "seed" if c.seed else "",
                "shared" if c.shared else "",
            )
        )
    return table


def _row_blocks(row: RowMap, findings: tuple[Finding, ...]) -> list[RenderableType]:
    batch_rows = ", ".join(map(str, row.batch_rows)) or "none (idle pool row)"
    parts: list[RenderableType] = [
        Text(f"pool row {row.pool_row} (batch rows {batch_rows}), group {row.group}", style="bold"),
        Text(
            f"  P {row.prefix_len if row.prefix_len is not None else '-'}"
            f" · E {row.extend_len if row.extend_len is not None else '-'}"
            f" · window start {row.window_start if row.window_start is not None else '-'}"
            f" · {row.filled} filled of max_seq_len {row.max_seq_len}"
        ),
    ]
    if row.occupancy is not None:
        parts.append(RowStrip(row, findings))
    table = Table()
    for name in ("position", "slot", "role", "swa slot", "marks"):
        table.add_column(
            name, justify="right" if name in ("position", "slot", "swa slot") else "left"
        )
    table.columns[-1].no_wrap = True  # a code is never cut: one per line, the roles wrap
    for line in row_lines(row):
        if isinstance(line, RowGap):
            dim = f"positions {line.start}..{line.end - 1} not shown ({line.filled} filled)"
            table.add_row(*(Text(t, style="dim") for t in ("⋯", "⋯", dim)), Text(""), Text(""))
            continue
        style = "bold red" if line.marks else ""
        role = line.role + (" (seed)" if line.seed else "")
        marks = "\n".join(f"! {code}" for code in line.marks)
        table.add_row(*cells(line.position, line.slot, role, line.swa_slot, marks, style=style))
    parts.append(table)
    notices = [("", Text(notice, style="yellow")) for notice in row_notices(row)]
    if notices:
        parts.append(indented(notices))
    return parts


def _touching_blocks(findings: tuple[Finding, ...], max_rows: int) -> list[RenderableType]:
    parts: list[RenderableType] = [Text("findings touching it", style="bold")]
    parts.append(findings_view(findings[:max_rows], with_code=True))
    if len(findings) > max_rows:
        parts.append(Text(f"… and {plural(len(findings) - max_rows, 'more finding')} (--max-rows)"))
    return parts


def provenance_table(report: ProvenanceReport, *, max_rows: int = 256) -> RenderableType:
    """A slot's cells, translation, allocator, canary and violation rows, or a pool row's map.

    Findings touching the slot (or row) follow, the first `max_rows` of them; in a row map,
    the cells they mark are flagged with `!` and the finding codes (and highlighted when
    colour is on).
    """
    report = printable_record(report)
    parts: list[RenderableType] = [Text(report.path, style="bold"), identity_line(report.identity)]
    if report.shrunk is not None:
        parts.append(shrunk_block(report.shrunk))
    if report.slot is not None:
        parts.extend(_slot_blocks(report.slot, max_rows))
    if report.row is not None:
        parts.extend(_row_blocks(report.row, report.findings))
    if report.findings:
        parts.extend(_touching_blocks(report.findings, max_rows))
    else:
        parts.append(Text("no findings touch it", style="green"))
    return Group(*parts)
