"""`summarize_plan`: one planner's plan of one group, per request (`kvcanary plan`).

The `PlanSummary` it returns, and the `PlanRun` of `api.plan`, are `results.plan`'s.
"""

from __future__ import annotations

from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.planners.base import Plan
from kvcanary_cli.results.plan import PlanRequest, PlanSummary

__all__ = ["summarize_plan"]


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
    return PlanSummary(
        dump=str(dump.path),
        group=plan.group,
        backend=plan.backend,
        semantics=plan.semantics,
        window=plan.window,
        translated=plan.translated,
        bs=plan.bs,
        verify_capacity=plan.verify_capacity,
        total_verify=plan.total_verify,
        verify_num_valid=plan.verify_num_valid,
        enable=plan.enable,
        write_req_capacity=plan.write_req_capacity,
        write_num_valid_reqs=plan.write_num_valid_reqs,
        undefined_entries=int((plan.verify_undefined != 0).sum()),
        launch_error=plan.launch_error,
        requests=tuple(requests),
        problem_count=len(problems),
        problems=tuple(problems.rows_at(i) for i in range(min(len(problems), max_problems))),
    )
