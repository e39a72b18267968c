"""Results of `kvcanary plan`: one planner's plan of one group, per request.

A `PlanRun` is what `api.plan` returns: the dump, the plan, its `PlanSummary` (None when the
planner refused the group) and why the command would exit 1. The summary is the
`kvcanary.plan/1` record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.planners.base import Plan, Semantics

__all__ = [
    "BackendName",
    "PlanProblemRow",
    "PlanRequest",
    "PlanRun",
    "PlanSummary",
    "ProblemKindName",
    "ProblemRoleName",
]


#: A planner: vectorized-gpu is numpy with GPU semantics; sglang the installed SGLang's launcher.
BackendName = Literal["reference", "vectorized", "triton", "vectorized-gpu", "sglang"]
#: A problem met while planning (a finding code: `planners.base.ProblemKind.code`).
ProblemKindName = Literal[
    FindingCode.LUT_OUT_OF_RANGE,
    FindingCode.ROW_OUT_OF_RANGE,
    FindingCode.PREFIX_BEYOND_ROW,
    FindingCode.EXPECTED_TOKEN_OUT_OF_RANGE,
]
#: The plan read that met a problem.
ProblemRoleName = Literal["verify", "chain-prev", "seed", "expected-token"]


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """One batch row of the plan."""

    batch_row: int
    pool_row: int
    prefix_len: int
    extend_len: int
    #: null when the row has no verify entries
    verify_start: int | None
    #: exclusive
    verify_end: int | None
    entries: int
    #: index of the row's first verify entry
    entry_offset: int
    #: null beyond the write plan
    write_offset: int | None
    #: null when undefined or beyond the write plan
    seed: int | None
    seed_undefined: bool


@dataclass(frozen=True, kw_only=True)
class PlanProblemRow:
    """One problem met while planning."""

    kind: ProblemKindName
    role: ProblemRoleName
    batch_row: int
    pool_row: int
    position: int
    #: the raw slot (LUT problems), else the bad row or index
    value: int
    #: flat verify-entry index; -1 for a seed
    entry: int
    #: SGLang's torch reference raises here
    upstream_raises: bool


@dataclass(frozen=True, kw_only=True)
class PlanSummary:
    """`kvcanary plan --format json`: a plan's scalars, one request per batch row, and its
    first problems."""

    SCHEMA: ClassVar[str] = "kvcanary.plan/1"

    #: the dump's path
    dump: str
    group: Group
    backend: BackendName
    #: whose behaviour on bad input
    semantics: Semantics
    window: int
    #: slots went through the LUT
    translated: bool
    bs: int
    verify_capacity: int
    total_verify: int
    verify_num_valid: int
    enable: Literal[0, 1]
    write_req_capacity: int
    write_num_valid_reqs: int
    #: entries with a field the planner could not define
    undefined_entries: int
    launch_error: str | None
    #: one per batch row, in order
    requests: tuple[PlanRequest, ...]
    #: all problems met
    problem_count: int
    #: the first 50: verify entries in order, then seeds
    problems: tuple[PlanProblemRow, ...]


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
