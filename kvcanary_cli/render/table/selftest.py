"""The terminal view of a selftest (the `kvcanary.selftest/1` record, the drift report), and
the report in words, as its Markdown view says it too.

One row per scenario and group, one column per planner compared ("agree", or the fields that
differ), and where SGLang's torch reference raises; then every difference found.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvcanary_cli.render.console import shown
from kvcanary_cli.safe_text import printable_record

if TYPE_CHECKING:  # the selftest plans synthetic dumps: `kvcanary --help` does not import it
    from kvcanary_cli.results.selftest import (
        Difference,
        GroupResult,
        PlannerComparison,
        SelftestReport,
    )

__all__ = [
    "agreement_rows",
    "difference_value",
    "differences_found",
    "selftest_table",
    "selftest_verdict",
    "sglang_line",
]


def selftest_table(report: SelftestReport) -> RenderableType:
    """Header, the agreement table, the verdict, and a table of differences when any."""
    report = printable_record(report)
    header = (
        f"kvcanary {report.kvcanary_version} selftest: {report.summary.scenarios} "
        f"scenarios (size {report.size}, seed {report.seed})"
    )
    pairs = "; ".join(f"{p.name} vs {p.baseline}" for p in report.planners)
    parts: list[RenderableType] = [
        Text(header, style="bold"),
        Text("  " + sglang_line(report)),
        Text(f"  compared: {pairs}"),
    ]
    grid = Table(title="agreement per scenario and group", title_justify="left")
    grid.add_column("scenario")
    grid.add_column("group")
    for p in report.planners:
        grid.add_column(p.name)
    grid.add_column("SGLang's reference raises at")
    for scenario, group, cells, raises in agreement_rows(report):
        styled = [
            Text(c, style="" if c.startswith(("agree", "not")) else "bold red") for c in cells
        ]
        grid.add_row(Text(scenario), Text(group), *styled, Text(raises))
    parts.append(grid)
    agree = report.verdict == "agree"
    parts.append(Text(selftest_verdict(report), style="bold green" if agree else "bold red"))
    found = differences_found(report)
    if found:
        diffs = Table(title="differences (first per field)", title_justify="left")
        diffs.add_column("scenario", overflow="fold")
        for name in ("group", "planner", "field", "index"):
            diffs.add_column(name, justify="right" if name == "index" else "left", no_wrap=True)
        diffs.add_column("baseline", min_width=12)
        diffs.add_column("planner", min_width=8)
        for scenario, group, c, d in found:
            row = (
                scenario,
                group,
                c.planner,
                d.field,
                shown(d.index),
                difference_value(d, "baseline"),
                difference_value(d, "planner"),
            )
            diffs.add_row(*(Text(cell) for cell in row))
        parts.append(diffs)
    return Group(*parts)


def sglang_line(report: SelftestReport) -> str:
    """What SGLang is here, whether it ran, and the versions kvcanary models."""
    sglang = report.sglang
    first, last = (sglang.verified[0], sglang.verified[-1]) if sglang.verified else ("?", "?")
    verified = f"{first} to {last} ({len(sglang.verified)} releases, each checked)"
    if sglang.run:
        how = "its CUDA kernels" if sglang.mode == "cuda" else "its torch reference (no CUDA)"
        state = f"installed {sglang.installed or 'unknown'}, run: {how}"
    elif sglang.installed:
        state = f"installed {sglang.installed}, not run (add --sglang)"
    else:
        state = "not installed"
    return f"SGLang: {state}; kvcanary models SGLang {verified}"


def _comparison_cell(comparison: PlannerComparison) -> str:
    """A comparison in the agreement table: agree, or the fields that differ."""
    if comparison.agree:
        if comparison.not_launched:
            return "not launched"
        return "agree, raises" if comparison.raised else "agree"
    return "differs: " + ", ".join(d.field for d in comparison.differences)


def _ref_raise_text(group: GroupResult) -> str:
    """Where SGLang's reference raises on a group, or `-`."""
    where = group.ref_raise
    if where is None:
        return "-"
    return f"batch row {where.batch_row}, pos {where.position} ({where.role}): {where.error}"


def selftest_verdict(report: SelftestReport) -> str:
    """Full agreement over what, or how many comparisons differ."""
    s = report.summary
    names = ", ".join(p.name for p in report.planners)
    if report.verdict == "agree":
        return (
            f"full agreement: {s.comparisons} comparisons ({names} against their baselines) "
            f"over {s.groups} groups of {s.scenarios} scenarios"
        )
    return f"DISAGREEMENT: {s.disagreements} of {s.comparisons} comparisons differ"


def agreement_rows(report: SelftestReport) -> list[tuple[str, str, list[str], str]]:
    """Per scenario and group: its name, group, a cell per planner, and where REF raises."""
    rows: list[tuple[str, str, list[str], str]] = []
    for scenario in report.scenarios:
        for group in scenario.groups:
            cells = [_comparison_cell(c) for c in group.comparisons]
            rows.append((scenario.scenario, group.group.value, cells, _ref_raise_text(group)))
    return rows


def differences_found(
    report: SelftestReport,
) -> list[tuple[str, str, PlannerComparison, Difference]]:
    """Every difference, with its scenario, group and comparison."""
    return [
        (scenario.scenario, group.group.value, c, d)
        for scenario in report.scenarios
        for group in scenario.groups
        for c in group.comparisons
        for d in c.differences
    ]


def difference_value(difference: Difference, side: Literal["baseline", "planner"]) -> str:
    """One side of a difference; for the raise, None is "no raise"."""
    value = difference.baseline if side == "baseline" else difference.planner
    if value is None and difference.field == "raise":
        return "no raise"
    return shown(value)
