"""The Markdown view of a `kvcanary.plan/1` record: the table view's blocks, for GitHub."""

from __future__ import annotations

from kvcanary_cli.render.markdown.blocks import table, text
from kvcanary_cli.render.phrases.plan import (
    REQUEST_COLUMNS,
    plan_headline,
    plan_problem_line,
    plan_request_cells,
)
from kvcanary_cli.render.records.plan import PlanRecord
from kvcanary_cli.safe_text import printable_record

__all__ = ["plan_markdown"]


def plan_markdown(record: PlanRecord, *, max_rows: int = 50) -> str:
    """Header line, the first `max_rows` requests, and the problems met, as GitHub Markdown."""
    record = printable_record(record)
    rows = record["requests"]
    parts = [f"## kvcanary plan: {text(record['dump'])}", f"**{text(plan_headline(record))}**"]
    if record["launch_error"]:
        parts.append(f"The GPU launch raises: {text(record['launch_error'])}")
    parts.append(
        table(
            list(REQUEST_COLUMNS),
            [plan_request_cells(r) for r in rows[:max_rows]],
            right=set(range(len(REQUEST_COLUMNS))),
        )
    )
    if len(rows) > max_rows:
        parts.append(f"… and {len(rows) - max_rows} more batch rows (--max-rows)")
    if record["problem_count"]:
        lines = [f"- {text(plan_problem_line(p))}" for p in record["problems"]]
        more = record["problem_count"] - len(record["problems"])
        if more > 0:
            lines.append(f"- … and {more} more")
        parts.append(f"{record['problem_count']} problems met while planning:\n" + "\n".join(lines))
    return "\n\n".join(parts) + "\n"
