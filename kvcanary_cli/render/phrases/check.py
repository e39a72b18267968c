"""A check report in words, as its table and Markdown views say it: the verdicts, the
glossary, the groups' reference/kernel differences, and the findings in blocks per cause and
code."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvcanary_cli.catalog import FindingCode, Severity, cell_unit
from kvcanary_cli.render.phrases.findings import role_terms
from kvcanary_cli.render.shared import plural
from kvcanary_cli.results.check import (
    Cause,
    CheckSummary,
    CodeCount,
    DumpReport,
    Finding,
    GroupSummary,
)

__all__ = [
    "DIFFERENCES_NOTE",
    "GLOSSARY",
    "UNITS_NOTE",
    "CauseSection",
    "CodeSection",
    "cause_sections",
    "code_cells",
    "difference_phrase",
    "differences_lines",
    "failing_phrase",
    "findings_per_count",
    "glossary",
    "severity_cells",
    "severity_count",
    "top_causes",
]

_DIFFERENCE_VERBS: dict[str, str] = {
    FindingCode.LUT_OUT_OF_RANGE: "kernel clamped",
    FindingCode.SLOT_BEYOND_POOL: "kernel read past the pool for",
    FindingCode.ROW_OUT_OF_RANGE: "kernel read out of bounds for",
    FindingCode.PREFIX_BEYOND_ROW: "kernel read neighbouring rows for",
}

#: How to read a groups table: what "verify entries" and differences count.
DIFFERENCES_NOTE = (
    "verify entries: what the reference plan requests; differences: plan values where the "
    "kernel and the reference disagree (a cell read as a verify slot and as a chain "
    "predecessor counts twice)"
)

#: The two units of a report's counts: what a cell and a finding are.
UNITS_NOTE = (
    "cells: the req_to_token cells with a problem (a problem of a request, a tensor or a "
    "scalar counts as 1 cell; a LUT or free-list entry as 1 entry, a leaked page as 1 page); "
    "a finding groups the cells of one code, cause, group and role"
)

#: The planner terms a report may use, in the order a glossary lists them.
GLOSSARY = {
    "batch row": "a request's index in this batch; its pool row is its row of req_to_token",
    "P": "prefix length, the cells a request has written",
    "E": "extend length, the tokens this step writes (positions P..P+E-1)",
    "verify": "a prefix cell inside the window, which the canary verifies",
    "prefix": "a live prefix cell before the window",
    "chain-prev": "the cell just before the window, whose record the first verify read chains from",
    "seed": "a writing row's last prefix cell P-1, which this step's writes chain from",
    "pending-write": "a cell this step writes",
    "stale-tail": "a cell past a live row's end, left by an earlier owner",
    "idle-row": "a cell of a pool row no request of the batch uses",
    "expected-token": "a read of the expected-token pool",
    "REF": "SGLang's torch reference planner, which reads cells in its own order and raises "
    "at the first bad one",
}


def glossary(dumps: Sequence[DumpReport]) -> str | None:
    """`terms: P: prefix length ...; chain-prev: ...`: the planner terms the reports of
    `dumps` use (roles of their findings, P and E of a requests table, REF where the
    reference raises), each explained once; None when they use none."""
    used: set[str] = set()
    for dump in dumps:
        if dump.findings or dump.requests:
            used.add("batch row")
        if len(dump.requests) >= 2:
            used.update(("P", "E"))
        if dump.first_raise is not None:
            used.add("REF")
        used |= role_terms(dump.findings)
    terms = [f"{term}: {meaning}" for term, meaning in GLOSSARY.items() if term in used]
    return "terms: " + "; ".join(terms) if terms else None


def code_cells(counts: dict[FindingCode, int], name: Callable[[str], str] = str) -> str:
    """`15 lut-out-of-range cells, 1 lut-sentinel-missing cell`: counts of cells per code,
    each named as cells (`name` formats a code, e.g. as Markdown code)."""
    return ", ".join(
        f"{n} {name(code)} {cell_unit(FindingCode(code), n)}" for code, n in counts.items()
    )


def severity_count(counts: Sequence[CodeCount], severity: Severity) -> int:
    """Cells of one severity over a dump's counts."""
    return sum(c.count for c in counts if c.severity == severity)


def severity_cells(counts: Sequence[CodeCount], findings: int) -> str:
    """`16 error cells, 1 warning cell in 5 findings`: a dump's verdict in named units."""
    errors = severity_count(counts, Severity.ERROR)
    warnings = severity_count(counts, Severity.WARNING)
    return (
        f"{plural(errors, 'error cell')}, {plural(warnings, 'warning cell')} in "
        f"{plural(findings, 'finding')}"
    )


def findings_per_count(dump: DumpReport) -> list[int]:
    """Per entry of a dump's `counts` (code, group, severity), how many findings hold its
    cells."""
    keys = [(f.code, f.group, f.severity) for f in dump.findings]
    return [keys.count((c.code, c.group, c.severity)) for c in dump.counts]


def failing_phrase(summary: CheckSummary, fail_on: str) -> str:
    """`the dump fails --fail-on error` / `2 of 3 dumps fail ...`, with the unreadable count."""
    failed, dumps, bad = summary.failed, summary.dumps, summary.bad_input
    if dumps == 1:
        verdict = "is unreadable" if bad else ("fails" if failed else "passes")
        return f"the dump {verdict}" + ("" if bad else f" at --fail-on {fail_on}")
    unreadable = f"; {bad} unreadable" if bad else ""
    verb = "fails" if failed == 1 else "fail"
    return f"{failed} of {dumps} dumps {verb} at --fail-on {fail_on}{unreadable}"


# --- the groups: where the kernel and the reference differ ---------------------------------


def differences_lines(group: GroupSummary) -> list[str]:
    """A group's reference/kernel comparison in words, one line per kind of difference."""
    if group.kernel == "none":
        return ["not compared (--kernel none)"]
    by_field = group.explained_by_field
    lines = [
        difference_phrase(
            code, list(by_field[code].items()) if by_field.get(code) else [("plan value", n)]
        )
        for code, n in group.explained_differences.items()
    ]
    if group.unexplained_differences:
        unexplained = group.unexplained_differences
        lines.append(f"{unexplained} unexplained ({FindingCode.KERNEL_DIVERGENCE})")
    if group.kernel_launch_error:
        lines.append(f"launch raises: {group.kernel_launch_error}")
    return lines or ["none"]


def difference_phrase(code: str, by_field: list[tuple[str, int]]) -> str:
    """How a group's explained reference/kernel differences read in tables and Markdown:
    what the kernel did, to how many plan values of each field (field, count), and why."""
    values = ", ".join(plural(n, what) for what, n in by_field)
    verb = _DIFFERENCE_VERBS.get(code)
    if verb is None:
        return f"{values} differ ({code})"
    return f"{verb} {values} ({code})"


# --- the findings, per cause and code ------------------------------------------------------


@dataclass(frozen=True)
class CodeSection:
    """One code's block in a dump's view: its cells, its findings and those shown."""

    code: FindingCode
    severity: Severity
    #: cells (and rows) its findings stand for.
    cells: int
    #: its findings (groups).
    total: int
    shown: list[Finding]
    #: `15 cells in 3 findings`, `1 finding` (a finding of one row or tensor counts 1).
    size: str


@dataclass(frozen=True)
class CauseSection:
    """One cause's block: the diagnosis entry and its symptoms, code by code."""

    #: the `diagnosis` entry; None for findings no cause explains.
    cause: Cause | None
    sections: list[CodeSection]


def _section_size(cells: int, total: int) -> str:
    findings = plural(total, "finding")
    if cells == total:
        return findings
    return f"{plural(cells, 'cell')} in {findings}"


def _code_sections(findings: list[Finding], max_rows: int) -> list[CodeSection]:
    by_code: dict[tuple[FindingCode, Severity], list[Finding]] = {}
    for f in findings:  # already in report order
        by_code.setdefault((f.code, f.severity), []).append(f)
    out = []
    for (code, severity), members in by_code.items():
        cells = sum(f.count for f in members)
        out.append(
            CodeSection(
                code=code,
                severity=severity,
                cells=cells,
                total=len(members),
                shown=members[: max(max_rows, 0)],
                size=_section_size(cells, len(members)),
            )
        )
    return out


def top_causes(dump: DumpReport) -> list[Cause]:
    """The causes a report lists: those no other cause explains (docs/findings.md, "Chains");
    the others are their parents' "also shows" lines."""
    return [c for c in dump.diagnosis if c.explained_by is None]


def cause_sections(dump: DumpReport, max_rows: int) -> list[CauseSection]:
    """Per cause (diagnosis order), its findings per code: the totals and the first
    `max_rows` findings (groups).

    The table and Markdown views both draw their finding blocks from this, so symptoms are
    always shown under their cause.
    """
    parent: dict[str, str] = {c.code: c.explained_by for c in dump.diagnosis if c.explained_by}
    members: dict[str | None, list[Finding]] = {}
    for f in dump.findings:  # an explained cause's symptoms go under its parent
        own: str | None = f.cause
        members.setdefault(parent.get(own or "", own), []).append(f)
    out = []
    for cause in top_causes(dump):
        if cause.code in members:
            found = members.pop(cause.code)
            out.append(CauseSection(cause=cause, sections=_code_sections(found, max_rows)))
    for rest in members.values():
        out.append(CauseSection(cause=None, sections=_code_sections(rest, max_rows)))
    return out
