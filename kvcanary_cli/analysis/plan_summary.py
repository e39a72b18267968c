"""`summarize_plan`: one planner's plan of one group, per request (`kvcanary plan`).

A `PlanRun` is what `api.plan` returns: the dump, the plan, its `PlanSummary` (None when the
planner refused the group) and why the command would exit 1. Render turns the summary into
the `kvcanary.plan/1` record.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.planners.base import Plan, PlanProblem, Semantics

__all__ = ["PlanRequest", "PlanRun", "PlanSummary", "summarize_plan"]


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """One batch row of the plan: its lengths, verify range, entries and write seed."""

    batch_row: int
    pool_row: int
    prefix_len: int
    extend_len: int
    #: the verify range [start, end) of positions; None when the row has no verify entries.
    verify_start: int | None
    verify_end: int | None
    entries: int
    #: index of the row's first verify entry.
    entry_offset: int
    #: None beyond the write plan.
    write_offset: int | None
    #: None when undefined or beyond the write plan.
    seed: int | None
    seed_undefined: bool


@dataclass(frozen=True, kw_only=True)
class PlanSummary:
    """A plan's scalars, one `PlanRequest` per batch row, and its first problems."""

    dump: str
    group: str
    backend: str
    semantics: Semantics
    window: int
    translated: bool
    bs: int
    verify_capacity: int
    total_verify: int
    verify_num_valid: int
    enable: int
    write_req_capacity: int
    write_num_valid_reqs: int
    #: entries with a field the planner could not define.
    undefined_entries: int
    launch_error: str | None
    requests: tuple[PlanRequest, ...]
    #: all problems met; `problems` holds the first ones.
    problem_count: int
    problems: tuple[PlanProblem, ...]


@dataclass(frozen=True)
class PlanRun:
    """One planner's plan of one group, and why `kvcanary plan` would exit 1 after it."""

    dump: KvDump
    plan: Plan
    #: What the plan holds, per request; None when the planner refused the group.
    summary: PlanSummary | None
    #: A refused group, a GPU launch the batch would fail, or where SGLang's reference would
    #: raise (the plan goes on past it); None when the plan is clean.
    problem: str | None


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
