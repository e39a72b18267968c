"""Results of `kvcanary plan`: one planner's plan of one group, per request.

A `PlanRun` is what `api.plan` returns: the dump, the plan, its `PlanSummary` (None when the
planner refused the group) and why the command would exit 1. Render turns the summary into
the `kvcanary.plan/1` record.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.planners.base import Plan, PlanProblem, Semantics

__all__ = ["PlanRequest", "PlanRun", "PlanSummary"]


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
