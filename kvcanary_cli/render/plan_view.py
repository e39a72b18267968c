"""Table view of the `kvcanary.plan/1` record."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

__all__ = ["plan_table"]


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def plan_table(record: dict[str, Any], *, max_rows: int = 50) -> RenderableType:
    """Header line, one row per batch row (bounded), and the problems met."""
    head = (
        f"group {record['group']} (window {record['window']}"
        f"{', LUT-translated' if record['translated'] else ''}) "
        f"backend {record['backend']} [{record['semantics']} semantics]: "
        f"{record['total_verify']} entries requested, capacity {record['verify_capacity']}, "
        f"num_valid {record['verify_num_valid']}, enable {record['enable']}, "
        f"write_num_valid_reqs {record['write_num_valid_reqs']}"
    )
    parts: list[RenderableType] = [Text(head, style="bold")]
    if record["launch_error"]:
        parts.append(Text(f"the GPU launch raises: {record['launch_error']}", style="red"))
    table = Table()
    for name in ("batch row", "pool row", "P", "E", "verify range", "entries", "seed"):
        table.add_column(name, justify="right")
    rows = record["requests"]
    for req in rows[:max_rows]:
        span = (
            f"[{req['verify_start']}, {req['verify_end']})"
            if req["verify_start"] is not None else "-"
        )
        seed = "undefined" if req["seed_undefined"] else _cell(req["seed"])
        pool_row = "pad" if req["pool_row"] == 0 else str(req["pool_row"])
        table.add_row(str(req["batch_row"]), pool_row, str(req["prefix_len"]),
                      str(req["extend_len"]), span, str(req["entries"]), seed)
    parts.append(table)
    if len(rows) > max_rows:
        parts.append(Text(f"... and {len(rows) - max_rows} more batch rows (--max-rows)"))
    if record["undefined_entries"]:
        parts.append(Text(f"{record['undefined_entries']} entries have undefined fields "
                          "(reads the upstream planner cannot make)", style="yellow"))
    if record["problem_count"]:
        parts.append(Text(f"{record['problem_count']} problems met while planning "
                          "(run `kvcanary check` for findings and provenance):", style="yellow"))
        for p in record["problems"]:
            raises = " (REF raises)" if p["upstream_raises"] else ""
            parts.append(Text(
                f"  {p['kind']}: {p['role']} of batch row {p['batch_row']} (pool row "
                f"{p['pool_row']}) at position {p['position']}: value {p['value']}{raises}"))
        if record["problem_count"] > len(record["problems"]):
            parts.append(Text(f"  ... and {record['problem_count'] - len(record['problems'])} "
                              "more"))
    return Group(*parts)
