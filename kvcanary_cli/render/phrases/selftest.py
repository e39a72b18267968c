"""A selftest report in words, as its table and Markdown views say it: what SGLang is here,
the verdict, the agreement per scenario and group, and each difference."""

from __future__ import annotations

from typing import Literal

from kvcanary_cli.render.records.selftest import (
    ComparisonRecord,
    DifferenceRecord,
    ScenarioGroupRecord,
    SelftestRecord,
)
from kvcanary_cli.render.shared import shown

__all__ = [
    "agreement_rows",
    "comparison_cell",
    "difference_value",
    "differences_found",
    "ref_raise_text",
    "selftest_verdict",
    "sglang_line",
]


def sglang_line(record: SelftestRecord) -> str:
    """What SGLang is here, whether it ran, and the versions kvcanary models."""
    sglang = record["sglang"]
    verified = ", ".join(sglang["verified"])
    if sglang["run"]:
        how = "its CUDA kernels" if sglang["mode"] == "cuda" else "its torch reference (no CUDA)"
        state = f"installed {sglang['installed'] or 'unknown'}, run: {how}"
    elif sglang["installed"]:
        state = f"installed {sglang['installed']}, not run (add --sglang)"
    else:
        state = "not installed"
    return f"SGLang: {state}; kvcanary models SGLang {verified}"


def comparison_cell(comparison: ComparisonRecord) -> str:
    """A comparison in the agreement table: agree, or the fields that differ."""
    if comparison["agree"]:
        if comparison["not_launched"]:
            return "not launched"
        return "agree, raises" if comparison["raised"] else "agree"
    return "differs: " + ", ".join(d["field"] for d in comparison["differences"])


def ref_raise_text(group: ScenarioGroupRecord) -> str:
    """Where SGLang's reference raises on a group, or `-`."""
    where = group["ref_raise"]
    if where is None:
        return "-"
    return (
        f"batch row {where['batch_row']}, pos {where['position']} ({where['role']}): "
        f"{where['error']}"
    )


def selftest_verdict(record: SelftestRecord) -> str:
    """Full agreement over what, or how many comparisons differ."""
    s = record["summary"]
    names = ", ".join(p["name"] for p in record["planners"])
    if record["verdict"] == "agree":
        return (
            f"full agreement: {s['comparisons']} comparisons ({names} against their baselines) "
            f"over {s['groups']} groups of {s['scenarios']} scenarios"
        )
    return f"DISAGREEMENT: {s['disagreements']} of {s['comparisons']} comparisons differ"


def agreement_rows(record: SelftestRecord) -> list[tuple[str, str, list[str], str]]:
    """Per scenario and group: its name, group, a cell per planner, and where REF raises."""
    rows: list[tuple[str, str, list[str], str]] = []
    for scenario in record["scenarios"]:
        for group in scenario["groups"]:
            cells = [comparison_cell(c) for c in group["comparisons"]]
            rows.append((scenario["scenario"], group["group"], cells, ref_raise_text(group)))
    return rows


def differences_found(
    record: SelftestRecord,
) -> list[tuple[str, str, ComparisonRecord, DifferenceRecord]]:
    """Every difference, with its scenario, group and comparison."""
    return [
        (scenario["scenario"], group["group"], c, d)
        for scenario in record["scenarios"]
        for group in scenario["groups"]
        for c in group["comparisons"]
        for d in c["differences"]
    ]


def difference_value(difference: DifferenceRecord, side: Literal["baseline", "planner"]) -> str:
    """One side of a difference; for the raise, None is "no raise"."""
    value = difference[side]
    if value is None and difference["field"] == "raise":
        return "no raise"
    return shown(value)
