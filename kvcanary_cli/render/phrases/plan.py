"""A plan in words, as `plan`'s table and Markdown views say it: its scalars, one row per
request, and the problems met while planning."""

from __future__ import annotations

from kvcanary_cli.render.records.plan import PlanProblemRecord, PlanRecord, PlanRequestRecord
from kvcanary_cli.render.shared import shown

__all__ = ["REQUEST_COLUMNS", "plan_headline", "plan_problem_line", "plan_request_cells"]

#: The columns of a plan's request table.
REQUEST_COLUMNS = ("batch row", "pool row", "P", "E", "verify range", "entries", "seed")


def plan_headline(record: PlanRecord) -> str:
    """The plan's scalars in one line."""
    return (
        f"group {record['group']} (window {record['window']}"
        f"{', LUT-translated' if record['translated'] else ''}) "
        f"backend {record['backend']} [{record['semantics']} semantics]: "
        f"{record['total_verify']} entries requested, capacity {record['verify_capacity']}, "
        f"num_valid {record['verify_num_valid']}, enable {record['enable']}, "
        f"write_num_valid_reqs {record['write_num_valid_reqs']}"
    )


def plan_request_cells(req: PlanRequestRecord) -> list[str]:
    """One request's row of `REQUEST_COLUMNS`."""
    start = req["verify_start"]
    span = f"[{start}, {req['verify_end']})" if start is not None else "-"
    seed = "undefined" if req["seed_undefined"] else shown(req["seed"])
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


def plan_problem_line(p: PlanProblemRecord) -> str:
    """One problem met while planning, in words."""
    raises = " (REF raises)" if p["upstream_raises"] else ""
    return (
        f"{p['kind']}: {p['role']} of batch row {p['batch_row']} (pool row "
        f"{p['pool_row']}) at position {p['position']}: value {p['value']}{raises}"
    )
