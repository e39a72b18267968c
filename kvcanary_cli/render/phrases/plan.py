"""A plan in words, as `plan`'s table and Markdown views say it: its scalars, one row per
request, and the problems met while planning."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcanary_cli.render.console import shown

if TYPE_CHECKING:  # the plan's module plans with numpy: `kvcanary --help` does not import it
    from kvcanary_cli.results.plan import PlanProblemRow, PlanRequest, PlanSummary

__all__ = ["REQUEST_COLUMNS", "plan_headline", "plan_problem_line", "plan_request_cells"]

#: The columns of a plan's request table.
REQUEST_COLUMNS = ("batch row", "pool row", "P", "E", "verify range", "entries", "seed")


def plan_headline(plan: PlanSummary) -> str:
    """The plan's scalars in one line."""
    return (
        f"group {plan.group} (window {plan.window}"
        f"{', LUT-translated' if plan.translated else ''}) "
        f"backend {plan.backend} [{plan.semantics} semantics]: "
        f"{plan.total_verify} entries requested, capacity {plan.verify_capacity}, "
        f"num_valid {plan.verify_num_valid}, enable {plan.enable}, "
        f"write_num_valid_reqs {plan.write_num_valid_reqs}"
    )


def plan_request_cells(req: PlanRequest) -> list[str]:
    """One request's row of `REQUEST_COLUMNS`."""
    start = req.verify_start
    span = f"[{start}, {req.verify_end})" if start is not None else "-"
    seed = "undefined" if req.seed_undefined else shown(req.seed)
    pool_row = "pad" if req.pool_row == 0 else str(req.pool_row)
    return [
        str(req.batch_row),
        pool_row,
        str(req.prefix_len),
        str(req.extend_len),
        span,
        str(req.entries),
        seed,
    ]


def plan_problem_line(p: PlanProblemRow) -> str:
    """One problem met while planning, in words."""
    raises = " (REF raises)" if p.upstream_raises else ""
    return (
        f"{p.kind}: {p.role} of batch row {p.batch_row} (pool row "
        f"{p.pool_row}) at position {p.position}: value {p.value}{raises}"
    )
