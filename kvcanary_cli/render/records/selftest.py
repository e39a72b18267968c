"""The `kvcanary.selftest/1` record (the drift report): its declaration, and `selftest_record`,
the one place it is built from `results.selftest.SelftestReport`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypedDict, cast

from kvcanary_cli.render.records.common import GroupName, group_name

if TYPE_CHECKING:  # the selftest plans synthetic dumps: `kvcanary --help` does not import it
    from kvcanary_cli.results.selftest import (
        GroupResult,
        PlannerComparison,
        ScenarioResult,
        SelftestReport,
    )

__all__ = [
    "SELFTEST_SCHEMA",
    "FieldStatus",
    "PlanField",
    "SelftestRecord",
    "selftest_record",
]

#: Whose behaviour on bad input: SGLang's torch reference, or the production GPU path.
SemanticsName = Literal["reference", "gpu"]

SELFTEST_SCHEMA: Literal["kvcanary.selftest/1"] = "kvcanary.selftest/1"

#: A compared plan field (SGLang's names), or where and with what the plan step raises.
PlanField = Literal[
    "verify_slot_indices",
    "verify_expected_tokens",
    "verify_expected_positions",
    "verify_prev_slot_indices",
    "verify_num_valid",
    "enable",
    "write_offsets",
    "write_seed_slot_indices",
    "write_num_valid_reqs",
    "raise",
]
#: n/a: a side raised, so upstream defines no values.
FieldStatus = Literal["agree", "differ", "n/a"]


class PlannerRecord(TypedDict):
    """A compared planner."""

    #: vectorized, triton, sglang (with --sglang)
    name: str
    #: whose behaviour it reproduces on bad input
    semantics: SemanticsName
    #: as check's kernel_mode
    mode: str | None
    #: reference (REF semantics) or vectorized-gpu (GPU)
    baseline: str


class SGLangRecord(TypedDict):
    """The SGLang installed here, and whether it was run."""

    #: as check's sglang_installed
    installed: str | None
    #: --sglang: SGLang's launcher is one of the planners
    run: bool
    #: how SGLang's launcher ran: its torch reference, or its CUDA kernels
    mode: Literal["reference", "cuda"] | None
    #: SGLang versions kvcanary's model was verified on
    verified: list[str]


class TallyRecord(TypedDict):
    """One planner's comparisons, and how many differ."""

    comparisons: int
    disagreements: int


class SelftestSummaryRecord(TypedDict):
    """Totals over every scenario."""

    scenarios: int
    groups: int
    comparisons: int
    disagreements: int
    #: by planner name
    by_planner: dict[str, TallyRecord]


class RefRaiseRecord(TypedDict):
    """Where SGLang's torch reference raises (kvcanary's prediction, REF order)."""

    error: str
    #: the problem kind (a finding code)
    kind: str
    #: the read role
    role: str
    batch_row: int
    pool_row: int
    position: int
    #: the raw slot, or the bad row or index
    value: int


#: Per compared field: agree, differ, or n/a ("raise" is a keyword: the functional form).
FieldStatusRecord = TypedDict(
    "FieldStatusRecord",
    {
        "verify_slot_indices": FieldStatus,
        "verify_expected_tokens": FieldStatus,
        "verify_expected_positions": FieldStatus,
        "verify_prev_slot_indices": FieldStatus,
        "verify_num_valid": FieldStatus,
        "enable": FieldStatus,
        "write_offsets": FieldStatus,
        "write_seed_slot_indices": FieldStatus,
        "write_num_valid_reqs": FieldStatus,
        "raise": FieldStatus,
    },
)


class DifferenceRecord(TypedDict):
    """The first place where one field differs."""

    field: PlanField
    #: first differing element
    index: int | None
    #: values, "undefined", "N values" on a length mismatch, or raise texts for field "raise"
    baseline: int | str | None
    planner: int | str | None


class ComparisonRecord(TypedDict):
    """One planner's plan of a group against its baseline's."""

    planner: str
    baseline: str
    semantics: SemanticsName
    agree: bool
    #: n/a: a side raised, so upstream defines no values
    fields: FieldStatusRecord
    differences: list[DifferenceRecord]
    #: the baseline's raise ("ValueError: ...")
    expected_raise: str | None
    #: the planner's raise
    raised: str | None
    #: why kvcanary did not launch SGLang's CUDA kernels (reads outside req_to_token)
    not_launched: str | None


class ScenarioGroupRecord(TypedDict):
    """One group of a scenario."""

    group: GroupName
    #: where SGLang's torch reference raises (kvcanary's prediction, REF order), or null when
    #: it does not
    ref_raise: RefRaiseRecord | None
    #: one per planner, in "planners" order
    comparisons: list[ComparisonRecord]


class ScenarioRecord(TypedDict):
    """One `synth` scenario."""

    scenario: str
    summary: str
    #: a clean state (no expected finding)
    clean: bool
    expected_findings: list[str]
    groups: list[ScenarioGroupRecord]


class SelftestRecord(TypedDict):
    """`kvcanary selftest --format json`."""

    schema: Literal["kvcanary.selftest/1"]
    kvcanary_version: str
    size: Literal["tiny", "small"]
    seed: int
    #: the compared fields, in order
    fields: list[PlanField]
    planners: list[PlannerRecord]
    sglang: SGLangRecord
    verdict: Literal["agree", "disagree"]
    summary: SelftestSummaryRecord
    #: in synth --list order
    scenarios: list[ScenarioRecord]


def _comparison(c: PlannerComparison) -> ComparisonRecord:
    return {
        "planner": c.planner,
        "baseline": c.baseline,
        "semantics": c.semantics.value,
        "agree": c.agree,
        "fields": cast(FieldStatusRecord, dict(c.fields)),
        "differences": [
            {
                "field": cast(PlanField, d.field),
                "index": d.index,
                "baseline": d.baseline,
                "planner": d.planner,
            }
            for d in c.differences
        ],
        "expected_raise": c.expected_raise,
        "raised": c.raised,
        "not_launched": c.not_launched,
    }


def _group(group: GroupResult) -> ScenarioGroupRecord:
    where = group.ref_raise
    return {
        "group": group_name(group.group),
        "ref_raise": None
        if where is None
        else {
            "error": where.error,
            "kind": where.problem.kind.code,
            "role": where.problem.role.label,
            "batch_row": where.problem.batch_row,
            "pool_row": where.problem.pool_row,
            "position": where.problem.position,
            "value": where.problem.value,
        },
        "comparisons": [_comparison(c) for c in group.comparisons],
    }


def _scenario(scenario: ScenarioResult) -> ScenarioRecord:
    return {
        "scenario": scenario.scenario,
        "summary": scenario.summary,
        "clean": scenario.clean,
        "expected_findings": list(scenario.expected_findings),
        "groups": [_group(g) for g in scenario.groups],
    }


def _summary(report: SelftestReport) -> SelftestSummaryRecord:
    by_planner: dict[str, TallyRecord] = {
        p.name: {"comparisons": 0, "disagreements": 0} for p in report.planners
    }
    for c in report.comparisons():
        by_planner[c.planner]["comparisons"] += 1
        by_planner[c.planner]["disagreements"] += 0 if c.agree else 1
    return {
        "scenarios": len(report.scenarios),
        "groups": sum(len(s.groups) for s in report.scenarios),
        "comparisons": sum(v["comparisons"] for v in by_planner.values()),
        "disagreements": sum(v["disagreements"] for v in by_planner.values()),
        "by_planner": by_planner,
    }


def selftest_record(report: SelftestReport) -> SelftestRecord:
    """The `kvcanary.selftest/1` record of a selftest."""
    return {
        "schema": SELFTEST_SCHEMA,
        "kvcanary_version": report.kvcanary_version,
        "size": cast(Literal["tiny", "small"], report.size),
        "seed": report.seed,
        "fields": [cast(PlanField, name) for name in report.fields],
        "planners": [
            {
                "name": p.name,
                "semantics": p.semantics.value,
                "mode": p.mode,
                "baseline": p.baseline,
            }
            for p in report.planners
        ],
        "sglang": {
            "installed": report.sglang_installed,
            "run": report.sglang_run,
            "mode": cast(Literal["reference", "cuda"] | None, report.sglang_mode),
            "verified": list(report.verified),
        },
        "verdict": "agree" if report.agree else "disagree",
        "summary": _summary(report),
        "scenarios": [_scenario(s) for s in report.scenarios],
    }
