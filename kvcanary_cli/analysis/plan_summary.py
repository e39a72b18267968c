"""`kvcanary plan`: one planner's plan of one group (`plan_run`), per request
(`summarize_plan`), written to a plan file when asked.

The `PlanSummary` and `PlanRun` it returns are `results.plan`'s.
"""

from __future__ import annotations

import os
from typing import Literal, cast

from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.planners.base import Plan, Planner
from kvcanary_cli.planners.plan_file import save_plan, upstream_raise
from kvcanary_cli.results.plan import (
    BackendName,
    PlanProblemRow,
    PlanRequest,
    PlanRun,
    PlanSummary,
    ProblemKindName,
    ProblemRoleName,
)

__all__ = ["plan_run", "summarize_plan"]


def plan_run(
    dump: KvDump,
    group: str,
    planner: Planner,
    *,
    out: str | os.PathLike[str] | None = None,
    force: bool = False,
) -> PlanRun:
    """`planner`'s plan of `group`, saved at `out` when it was made and would launch, and the
    problem `kvcanary plan` exits 1 on: a refused launch, or where SGLang's reference raises."""
    result = planner.plan(dump, group)
    if result.skipped is not None:  # nothing to write or show entry by entry
        return PlanRun(dump, result, None, f"not planned: {result.skipped}")
    if out is not None and result.launch_error is None:
        save_plan(out, result, dump=dump, overwrite=force)
    problem = None
    if result.launch_error is not None:
        problem = f"{result.launch_error_type}: {result.launch_error}"
    elif (raised := upstream_raise(result)) is not None:
        marked = f"; {out} marks them in kvcanary.verify_undefined" if out else ""
        problem = f"SGLang's reference raises here: {raised} (planned on past it{marked})"
    return PlanRun(dump, result, summarize_plan(dump, result), problem)


def summarize_plan(dump: KvDump, plan: Plan, *, max_problems: int = 50) -> PlanSummary:
    """Plan scalars, one request per batch row, and the first `max_problems` problems."""
    start = plan.frame.window_start
    lens = plan.verify_offsets[1:] - plan.verify_offsets[:-1]
    offsets = plan.verify_offsets.tolist()
    seeds = plan.write_seed_slot_indices.tolist()
    seed_undefined = plan.seed_undefined.tolist()
    write_offsets = plan.write_offsets.tolist()
    requests = []
    for r, (rp, p, e, ws, n) in enumerate(
        zip(
            dump.req_pool_indices.tolist(),
            dump.prefix_lens.tolist(),
            dump.extend_seq_lens.tolist(),
            start.tolist(),
            lens.tolist(),
            strict=True,
        )
    ):
        has_seed = r < len(seeds)
        requests.append(
            PlanRequest(
                batch_row=r,
                pool_row=rp,
                prefix_len=p,
                extend_len=e,
                verify_start=ws if n else None,
                verify_end=ws + n if n else None,
                entries=n,
                entry_offset=int(offsets[r]),
                write_offset=write_offsets[r] if r < len(write_offsets) else None,
                seed=None if not has_seed or seed_undefined[r] else seeds[r],
                seed_undefined=bool(has_seed and seed_undefined[r]),
            )
        )
    problems = plan.problems
    shown = [problems.rows_at(i) for i in range(min(len(problems), max_problems))]
    return PlanSummary(
        dump=str(dump.path),
        group=Group(plan.group),
        backend=cast(BackendName, plan.backend),
        semantics=plan.semantics,
        window=plan.window,
        translated=plan.translated,
        bs=plan.bs,
        verify_capacity=plan.verify_capacity,
        total_verify=plan.total_verify,
        verify_num_valid=plan.verify_num_valid,
        enable=cast(Literal[0, 1], plan.enable),
        write_req_capacity=plan.write_req_capacity,
        write_num_valid_reqs=plan.write_num_valid_reqs,
        undefined_entries=int((plan.verify_undefined != 0).sum()),
        launch_error=plan.launch_error,
        requests=tuple(requests),
        problem_count=len(problems),
        problems=tuple(
            PlanProblemRow(
                kind=cast(ProblemKindName, p.kind.code),
                role=cast(ProblemRoleName, p.role.label),
                batch_row=p.batch_row,
                pool_row=p.pool_row,
                position=p.position,
                value=p.value,
                entry=p.entry,
                upstream_raises=p.raises,
            )
            for p in shown
        ),
    )
