"""`run_selftest`: every synthetic scenario through several planners, compared field by field.

The `SelftestReport` it returns (`results.selftest`) is the drift report, the
`kvcanary.selftest/1` record: for each `synth` scenario and group, each planner's plan against
the baseline of its semantics (kvcanary's scalar reference for REF semantics, its vectorized
GPU model for GPU semantics), per plan field (`Plan.upstream_tensors()`) and per raise: where
the plan step raises, and with what. With the installed SGLang among the planners, it says
whether kvcanary's model still matches that SGLang, and where SGLang raises on each bug
scenario.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, cast

import numpy as np

from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.errors import OptionError, UpstreamPlanError
from kvcanary_cli.option_values import checked_choice
from kvcanary_cli.planners.base import (
    NOT_LAUNCHED,
    Plan,
    Planner,
    Semantics,
    Undefined,
    raised,
    reference_raise,
)
from kvcanary_cli.planners.sglang_runtime import (
    VERIFIED_VERSIONS,
    VERIFY_PLAN_FIELDS,
    WRITE_PLAN_FIELDS,
)
from kvcanary_cli.results.selftest import (
    Difference,
    FieldStatus,
    GroupResult,
    PlanField,
    PlannerComparison,
    PlannerInfo,
    RefRaise,
    ScenarioResult,
    SelftestReport,
    SGLangInfo,
)
from kvcanary_cli.synth.scenarios import SCENARIOS, make_scenario

__all__ = ["FIELDS", "SELFTEST_SIZES", "run_selftest"]

#: Sizes the selftest runs at: the scalar reference is the baseline, so no benchmark sizes.
SELFTEST_SIZES = ("tiny", "small")
#: What is compared: SGLang's plan fields, then where (and with what) the plan step raises.
FIELDS = cast(tuple[PlanField, ...], (*VERIFY_PLAN_FIELDS, *WRITE_PLAN_FIELDS, "raise"))
#: Entry fields whose values a planner may leave undefined, and the bit saying so.
_UNDEFINED_BIT = {
    "verify_slot_indices": Undefined.SLOT,
    "verify_prev_slot_indices": Undefined.PREV,
    "verify_expected_tokens": Undefined.TOKEN,
}


def _defined(plan: Plan, name: str, values: np.ndarray) -> np.ndarray:
    """Which of `values` (the field, as upstream defines it) the planner could define."""
    n = int(values.shape[0]) if values.ndim else 1
    if name in _UNDEFINED_BIT:
        return np.asarray((plan.verify_undefined[:n] & int(_UNDEFINED_BIT[name])) == 0)
    if name == "write_seed_slot_indices":
        return ~plan.seed_undefined[:n]
    return np.ones(n, dtype=bool)


def _difference(baseline: Plan, other: Plan, name: PlanField) -> Difference | None:
    """The first place where field `name` of the two plans differs (None: they agree)."""
    a = baseline.upstream_tensors()[name].reshape(-1)
    b = other.upstream_tensors()[name].reshape(-1)
    if a.shape != b.shape:
        return Difference(
            field=name, index=None, baseline=f"{a.size} values", planner=f"{b.size} values"
        )
    da, db = _defined(baseline, name, a), _defined(other, name, b)
    differs = (da != db) | (da & db & (a != b))
    hits = np.flatnonzero(differs)
    if hits.size == 0:
        return None
    i = int(hits[0])
    return Difference(
        field=name,
        index=i,
        baseline=int(a[i]) if da[i] else "undefined",
        planner=int(b[i]) if db[i] else "undefined",
    )


def _text(error: UpstreamPlanError | None) -> str | None:
    return None if error is None else str(error)


def _compare(baseline: Plan, other: Plan, baseline_name: str) -> PlannerComparison:
    """One planner's plan against its baseline's, field by field."""
    want, got = _text(raised(baseline)), _text(raised(other))
    fields: dict[PlanField, FieldStatus] = {}
    differences: list[Difference] = []
    # A side that raised, or that kvcanary did not plan (corrupt lengths), has no values.
    without_values = any(p.launch_error is not None or p.skipped for p in (baseline, other))
    for name in FIELDS[:-1]:
        found = None if without_values else _difference(baseline, other, name)
        fields[name] = "n/a" if without_values else "agree" if found is None else "differ"
        if found is not None:
            differences.append(found)
    if other.launch_error_type == NOT_LAUNCHED:
        fields["raise"] = "n/a"
    elif want == got:
        fields["raise"] = "agree"
    else:
        fields["raise"] = "differ"
        differences.append(Difference(field="raise", index=None, baseline=want, planner=got))
    not_launched = other.launch_error_type == NOT_LAUNCHED
    return PlannerComparison(
        planner=other.backend,
        baseline=baseline_name,
        semantics=other.semantics,
        fields=fields,
        differences=tuple(differences),
        expected_raise=want,
        raised=None if not_launched else got,
        not_launched=other.launch_error if not_launched else None,
    )


def _ref_raise(plan: Plan | None) -> RefRaise | None:
    """Where, in REF's order, SGLang's torch reference raises on this group (None: it does not)."""
    first = None if plan is None else reference_raise(plan)
    if first is None:
        return None
    problem = first.problem
    return RefRaise(
        error=str(first.error),
        kind=problem.kind.code,
        role=problem.role.label,
        batch_row=problem.batch_row,
        pool_row=problem.pool_row,
        position=problem.position,
        value=problem.value,
    )


def _baseline_for(planner: Planner, baselines: Sequence[Planner]) -> Planner:
    for baseline in baselines:
        if baseline.semantics is planner.semantics:
            return baseline
    raise OptionError(
        f"no baseline with {planner.semantics} semantics for planner {planner.name}",
        option="selftest",
    )


def _group(
    dump: KvDump, group: str, baselines: Sequence[Planner], planners: Sequence[Planner]
) -> GroupResult:
    plans = {b.name: b.plan(dump, group) for b in baselines}
    comparisons = []
    for planner in planners:
        baseline = _baseline_for(planner, baselines)
        comparisons.append(_compare(plans[baseline.name], planner.plan(dump, group), baseline.name))
    ref = next((plans[b.name] for b in baselines if b.semantics is Semantics.REFERENCE), None)
    return GroupResult(
        group=Group(group), ref_raise=_ref_raise(ref), comparisons=tuple(comparisons)
    )


def run_selftest(
    baselines: Sequence[Planner],
    planners: Sequence[Planner],
    *,
    kvcanary_version: str,
    sglang_installed: str | None,
    size: str = "tiny",
    seed: int = 0,
    scenarios: Sequence[str] | None = None,
) -> SelftestReport:
    """Plan every scenario (default: all of `synth --list`) with the baselines and planners.

    Each planner is compared with the baseline of its semantics (one baseline per semantics
    in use). `sglang_installed` is what the report says about the installed SGLang; a planner
    named `sglang` is the installed SGLang itself. Dumps are written to a temporary folder,
    removed afterwards.
    """
    checked_choice(size, list(SELFTEST_SIZES), "size")
    names = list(scenarios or SCENARIOS)
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        raise OptionError(
            f"unknown scenario {unknown[0]!r}",
            option="scenarios",
            hint="kvcanary synth --list shows them",
        )
    for planner in planners:
        _baseline_for(planner, baselines)
    results: list[ScenarioResult] = []
    with tempfile.TemporaryDirectory(prefix="kvcanary-selftest-") as folder:
        for name in names:
            scenario = SCENARIOS[name]
            made = make_scenario(name, seed=seed, size=size)
            dump = load_dump(made.save(Path(folder) / f"{name}.safetensors"))
            results.append(
                ScenarioResult(
                    scenario=name,
                    summary=scenario.summary,
                    expected_findings=tuple(scenario.expected),
                    groups=tuple(_group(dump, g, baselines, planners) for g in dump.groups),
                )
            )
            del dump
    sglang = next((p for p in planners if p.name == "sglang"), None)
    return SelftestReport(
        kvcanary_version=kvcanary_version,
        size=cast(Literal["tiny", "small"], size),
        seed=seed,
        fields=FIELDS,
        planners=tuple(
            PlannerInfo(
                name=p.name,
                semantics=p.semantics,
                mode=p.mode,
                baseline=_baseline_for(p, baselines).name,
            )
            for p in planners
        ),
        sglang=SGLangInfo(
            installed=sglang_installed,
            run=sglang is not None,
            mode=None if sglang is None else cast(Literal["reference", "cuda"], sglang.mode),
            verified=tuple(VERIFIED_VERSIONS),
        ),
        scenarios=tuple(results),
    )
