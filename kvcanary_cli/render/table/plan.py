"""The terminal view of a `kvcanary.plan/1` record (one planner's plan).

The record (the dump's path, the launch's error text) is made printable first; table cells
are `Text`, never markup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvcanary_cli.render.phrases.plan import (
    REQUEST_COLUMNS,
    plan_headline,
    plan_problem_line,
    plan_request_cells,
)
from kvcanary_cli.safe_text import printable_record

if TYPE_CHECKING:  # the plan's module plans with numpy: `kvcanary --help` does not import it
    from kvcanary_cli.results.plan import PlanSummary

__all__ = ["plan_table"]


def plan_table(plan: PlanSummary, *, max_rows: int = 20) -> RenderableType:
    """Header line, one row per batch row (bounded), and the problems met."""
    plan = printable_record(plan)
    parts: list[RenderableType] = [Text(plan_headline(plan), style="bold")]
    if plan.launch_error:
        parts.append(Text(f"the GPU launch raises: {plan.launch_error}", style="red"))
    requests = Table()
    for name in REQUEST_COLUMNS:
        requests.add_column(name, justify="right")
    rows = plan.requests
    for req in rows[:max_rows]:
        requests.add_row(*(Text(cell) for cell in plan_request_cells(req)))
    parts.append(requests)
    if len(rows) > max_rows:
        parts.append(Text(f"... and {len(rows) - max_rows} more batch rows (--max-rows)"))
    if plan.undefined_entries:
        parts.append(
            Text(
                f"{plan.undefined_entries} entries have undefined fields "
                "(reads the upstream planner cannot make)",
                style="yellow",
            )
        )
    if plan.problem_count:
        parts.append(
            Text(
                f"{plan.problem_count} problems met while planning "
                "(run `kvcanary check` for findings and provenance):",
                style="yellow",
            )
        )
        for p in plan.problems:
            parts.append(Text("  " + plan_problem_line(p)))
        if plan.problem_count > len(plan.problems):
            parts.append(Text(f"  ... and {plan.problem_count - len(plan.problems)} more"))
    return Group(*parts)
