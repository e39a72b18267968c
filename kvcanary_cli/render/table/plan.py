"""The terminal view of a `kvcanary.plan/1` record (one planner's plan).

The record (the dump's path, the launch's error text) is made printable first; table cells
are `Text`, never markup.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvcanary_cli.render.phrases.plan import (
    REQUEST_COLUMNS,
    plan_headline,
    plan_problem_line,
    plan_request_cells,
)
from kvcanary_cli.render.records.plan import PlanRecord
from kvcanary_cli.safe_text import printable_record

__all__ = ["plan_table"]


def plan_table(record: PlanRecord, *, max_rows: int = 50) -> RenderableType:
    """Header line, one row per batch row (bounded), and the problems met."""
    record = printable_record(record)
    parts: list[RenderableType] = [Text(plan_headline(record), style="bold")]
    if record["launch_error"]:
        parts.append(Text(f"the GPU launch raises: {record['launch_error']}", style="red"))
    requests = Table()
    for name in REQUEST_COLUMNS:
        requests.add_column(name, justify="right")
    rows = record["requests"]
    for req in rows[:max_rows]:
        requests.add_row(*(Text(cell) for cell in plan_request_cells(req)))
    parts.append(requests)
    if len(rows) > max_rows:
        parts.append(Text(f"... and {len(rows) - max_rows} more batch rows (--max-rows)"))
    if record["undefined_entries"]:
        parts.append(
            Text(
                f"{record['undefined_entries']} entries have undefined fields "
                "(reads the upstream planner cannot make)",
                style="yellow",
            )
        )
    if record["problem_count"]:
        parts.append(
            Text(
                f"{record['problem_count']} problems met while planning "
                "(run `kvcanary check` for findings and provenance):",
                style="yellow",
            )
        )
        for p in record["problems"]:
            parts.append(Text("  " + plan_problem_line(p)))
        if record["problem_count"] > len(record["problems"]):
            parts.append(
                Text(f"  ... and {record['problem_count'] - len(record['problems'])} more")
            )
    return Group(*parts)
