"""Table and Markdown views of the `kvcanary.plan/1` record (one planner's plan).

The record (the dump's path, the launch's error text) is made printable first; table cells
are `Text`, never markup.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvcanary_cli.render.markdown import table, text
from kvcanary_cli.safe_text import printable_record

__all__ = ["plan_markdown", "plan_table"]


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def _headline(record: dict[str, Any]) -> str:
    return (
        f"group {record['group']} (window {record['window']}"
        f"{', LUT-translated' if record['translated'] else ''}) "
        f"backend {record['backend']} [{record['semantics']} semantics]: "
        f"{record['total_verify']} entries requested, capacity {record['verify_capacity']}, "
        f"num_valid {record['verify_num_valid']}, enable {record['enable']}, "
        f"write_num_valid_reqs {record['write_num_valid_reqs']}"
    )


def _request_cells(req: dict[str, Any]) -> list[str]:
    span = (
        f"[{req['verify_start']}, {req['verify_end']})" if req["verify_start"] is not None else "-"
    )
    seed = "undefined" if req["seed_undefined"] else _cell(req["seed"])
    pool_row = "pad" if req["pool_row"] == 0 else str(req["pool_row"])
    return [
        str(req["batch_row"]),
        pool_row,
        str(req["prefix_len"]),
        str(req["extend_len"]),
        span,
        str(req["entries"]),
        seed,
    ]


def _problem_line(p: dict[str, Any]) -> str:
    raises = " (REF raises)" if p["upstream_raises"] else ""
    return (
        f"{p['kind']}: {p['role']} of batch row {p['batch_row']} (pool row "
        f"{p['pool_row']}) at position {p['position']}: value {p['value']}{raises}"
    )


_COLUMNS = ("batch row", "pool row", "P", "E", "verify range", "entries", "seed")


def plan_table(record: dict[str, Any], *, max_rows: int = 50) -> RenderableType:
    """Header line, one row per batch row (bounded), and the problems met."""
    record = printable_record(record)
    parts: list[RenderableType] = [Text(_headline(record), style="bold")]
    if record["launch_error"]:
        parts.append(Text(f"the GPU launch raises: {record['launch_error']}", style="red"))
    requests = Table()
    for name in _COLUMNS:
        requests.add_column(name, justify="right")
    rows = record["requests"]
    for req in rows[:max_rows]:
        requests.add_row(*(Text(cell) for cell in _request_cells(req)))
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
            parts.append(Text("  " + _problem_line(p)))
        if record["problem_count"] > len(record["problems"]):
            parts.append(
                Text(f"  ... and {record['problem_count'] - len(record['problems'])} more")
            )
    return Group(*parts)


def plan_markdown(record: dict[str, Any], *, max_rows: int = 50) -> str:
    """The same blocks as the table view, as GitHub Markdown."""
    record = printable_record(record)
    rows = record["requests"]
    parts = [f"## kvcanary plan: {text(record['dump'])}", f"**{text(_headline(record))}**"]
    if record["launch_error"]:
        parts.append(f"The GPU launch raises: {text(record['launch_error'])}")
    parts.append(
        table(
            list(_COLUMNS),
            [_request_cells(r) for r in rows[:max_rows]],
            right=set(range(len(_COLUMNS))),
        )
    )
    if len(rows) > max_rows:
        parts.append(f"… and {len(rows) - max_rows} more batch rows (--max-rows)")
    if record["problem_count"]:
        lines = [f"- {text(_problem_line(p))}" for p in record["problems"]]
        more = record["problem_count"] - len(record["problems"])
        if more > 0:
            lines.append(f"- … and {more} more")
        parts.append(f"{record['problem_count']} problems met while planning:\n" + "\n".join(lines))
    return "\n\n".join(parts) + "\n"
