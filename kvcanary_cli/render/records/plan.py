"""The `kvcanary.plan/1` record (one planner's plan, per request): its declaration, and
`plan_record`, the one place it is built from `results.plan.PlanSummary`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypedDict, cast

from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.render.records.common import GroupName, group_name

if TYPE_CHECKING:  # the summary's module plans with numpy: `kvcanary --help` does not import it
    from kvcanary_cli.results.plan import PlanSummary

__all__ = [
    "PLAN_SCHEMA",
    "BackendName",
    "PlanProblemRecord",
    "PlanRecord",
    "PlanRequestRecord",
    "ProblemKindName",
    "ProblemRoleName",
    "SemanticsName",
    "plan_record",
]

PLAN_SCHEMA: Literal["kvcanary.plan/1"] = "kvcanary.plan/1"

#: A planner: vectorized-gpu is numpy with GPU semantics; sglang the installed SGLang's launcher.
BackendName = Literal["reference", "vectorized", "triton", "vectorized-gpu", "sglang"]
#: Whose behaviour on bad input: SGLang's torch reference, or the production GPU path.
SemanticsName = Literal["reference", "gpu"]
#: A problem met while planning (a finding code: `planners.base.ProblemKind.code`).
ProblemKindName = Literal[
    FindingCode.LUT_OUT_OF_RANGE,
    FindingCode.ROW_OUT_OF_RANGE,
    FindingCode.PREFIX_BEYOND_ROW,
    FindingCode.EXPECTED_TOKEN_OUT_OF_RANGE,
]
#: The plan read that met a problem.
ProblemRoleName = Literal["verify", "chain-prev", "seed", "expected-token"]


class PlanRequestRecord(TypedDict):
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


class PlanProblemRecord(TypedDict):
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


class PlanRecord(TypedDict):
    """`kvcanary plan --format json`."""

    schema: Literal["kvcanary.plan/1"]
    #: the dump's path
    dump: str
    group: GroupName
    backend: BackendName
    #: whose behaviour on bad input
    semantics: SemanticsName
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
    requests: list[PlanRequestRecord]
    #: all problems met
    problem_count: int
    #: the first 50: verify entries in order, then seeds
    problems: list[PlanProblemRecord]


def plan_record(summary: PlanSummary) -> PlanRecord:
    """The `kvcanary.plan/1` record of a plan's summary."""
    return {
        "schema": PLAN_SCHEMA,
        "dump": summary.dump,
        "group": group_name(summary.group),
        "backend": cast(BackendName, summary.backend),
        "semantics": summary.semantics.value,
        "window": summary.window,
        "translated": summary.translated,
        "bs": summary.bs,
        "verify_capacity": summary.verify_capacity,
        "total_verify": summary.total_verify,
        "verify_num_valid": summary.verify_num_valid,
        "enable": cast(Literal[0, 1], summary.enable),
        "write_req_capacity": summary.write_req_capacity,
        "write_num_valid_reqs": summary.write_num_valid_reqs,
        "undefined_entries": summary.undefined_entries,
        "launch_error": summary.launch_error,
        "requests": [
            {
                "batch_row": r.batch_row,
                "pool_row": r.pool_row,
                "prefix_len": r.prefix_len,
                "extend_len": r.extend_len,
                "verify_start": r.verify_start,
                "verify_end": r.verify_end,
                "entries": r.entries,
                "entry_offset": r.entry_offset,
                "write_offset": r.write_offset,
                "seed": r.seed,
                "seed_undefined": r.seed_undefined,
            }
            for r in summary.requests
        ],
        "problem_count": summary.problem_count,
        "problems": [
            {
                "kind": cast(ProblemKindName, p.kind.code),
                "role": cast(ProblemRoleName, p.role.label),
                "batch_row": p.batch_row,
                "pool_row": p.pool_row,
                "position": p.position,
                "value": p.value,
                "entry": p.entry,
                "upstream_raises": p.raises,
            }
            for p in summary.problems
        ],
    }
