"""The Markdown view of a `kvcanary.plan/1` record: the table view's blocks, for GitHub."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcanary_cli.render.markdown.blocks import table, text
from kvcanary_cli.render.phrases.plan import (
    REQUEST_COLUMNS,
    plan_headline,
    plan_problem_line,
    plan_request_cells,
)
from kvcanary_cli.safe_text import printable_record

if TYPE_CHECKING:  # the plan's module plans with numpy: `kvcanary --help` does not import it
    from kvcanary_cli.results.plan import PlanSummary

__all__ = ["plan_markdown"]


def plan_markdown(plan: PlanSummary, *, max_rows: int = 20) -> str:
    """Header line, the first `max_rows` requests, and the problems met, as GitHub Markdown."""
    plan = printable_record(plan)
    rows = plan.requests
    parts = [f"## kvcanary plan: {text(plan.dump)}", f"**{text(plan_headline(plan))}**"]
    if plan.launch_error:
        parts.append(f"The GPU launch raises: {text(plan.launch_error)}")
    parts.append(
        table(
            list(REQUEST_COLUMNS),
            [plan_request_cells(r) for r in rows[:max_rows]],
            right=set(range(len(REQUEST_COLUMNS))),
        )
    )
    if len(rows) > max_rows:
        parts.append(f"… and {len(rows) - max_rows} more batch rows (--max-rows)")
    if plan.problem_count:
        lines = [f"- {text(plan_problem_line(p))}" for p in plan.problems]
        more = plan.problem_count - len(plan.problems)
        if more > 0:
            lines.append(f"- … and {more} more")
        parts.append(f"{plan.problem_count} problems met while planning:\n" + "\n".join(lines))
    return "\n\n".join(parts) + "\n"
