"""Findings in words, one by one and as a check report, as the table and Markdown views say
them (provenance shows the findings touching a slot or row the same way).

A finding: where its cells lie, its role, the marks of where SGLang's reference and the
kernel's launch raise, a few of its cells. `finding_words` works them out together (the
cells' span once), so that a view lays out a finding with one call here rather than one per
phrase. A report: the verdicts, the glossary, the groups' reference/kernel differences, and
the findings in blocks per cause and code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvcanary_cli.catalog import FindingCode, Severity, cell_unit
from kvcanary_cli.render.console import plural
from kvcanary_cli.results.check import (
    UPSTREAM_RAISE,
    Cause,
    CheckSummary,
    CodeCount,
    DumpReport,
    Finding,
    GroupSummary,
)

if TYPE_CHECKING:
    import numpy as np

    from kvcanary_cli.results.cells import FindingOwner, Span
    from kvcanary_cli.results.columns import Entries

__all__ = [
    "legend",
    "coverage_lines",
    "no_findings_phrase",
    "DIFFERENCES_NOTE",
    "EXAMPLE_CELLS",
    "FIRST_RAISE_MARK",
    "GLOSSARY",
    "UNITS_NOTE",
    "CauseSection",
    "CodeSection",
    "FindingWords",
    "cause_sections",
    "code_cells",
    "difference_phrase",
    "differences_lines",
    "failing_phrase",
    "finding_words",
    "findings_per_count",
    "owner_text",
    "owners_phrase",
    "glossary",
    "role_terms",
    "severity_cells",
    "severity_count",
    "top_causes",
]

#: How a finding is marked where SGLang's reference raises first; the line naming the first
#: raise quotes it.
FIRST_RAISE_MARK = "← first raise"

#: cells of a group listed as examples.
EXAMPLE_CELLS = 3

#: The plan reads of a LUT finding, in the order REF makes them.
_READ_ORDER = {"verify": 0, "chain-prev": 1, "seed": 2}


@dataclass(frozen=True)
class FindingWords:
    """Every phrase of one finding (None: the finding has nothing to say there)."""

    #: where its cells lie (`Finding.span`, computed once here).
    span: Span | None
    #: `3 cells`.
    cells: str
    #: the batch rows (`3`, `0..255 (256 distinct)`), positions (`10..37`), slots (`107`,
    #: `swa 12`, `107..143 (15 distinct)`, `-` for none) and role it covers.
    rows: str | None
    positions: str | None
    slots: str
    role: str | None
    #: where its cells lie, one fact per line: batch rows, positions, slots.
    where: list[str]
    #: where SGLang's reference raises first, where the kernel's launch raised (when at
    #: this finding), and a few of a group's cells.
    raise_mark: str | None
    launch_mark: str | None
    examples: str | None
    #: who holds (or last held) its first slots (`owners_phrase`).
    owners: str | None


def finding_words(f: Finding) -> FindingWords:
    """All of a finding's phrases at once."""
    span = f.span
    rows, positions, slots = _rows(f, span), _positions(f, span), _slots(f, span)
    return FindingWords(
        span=span,
        cells=plural(f.count, "cell"),
        rows=rows,
        positions=positions,
        slots=slots,
        role=_role(f),
        where=_where(span, rows, positions, slots),
        raise_mark=_raise_mark(f),
        launch_mark=_launch_mark(f),
        examples=_examples(f),
        owners=owners_phrase(f),
    )


def owner_text(owner: FindingOwner, positions: str | None = None) -> str:
    """`pool row 9, position 12 (running, batch row 3)`, `idle pool row 5, position 68`: a
    slot's owner and what its request is (`positions`: several slots' in one pool row);
    `no pool row holds it` for none."""
    if owner.pool_row is None:
        return "no pool row holds it"
    through = "" if owner.full_slot is None else f" through full slot {owner.full_slot}"
    where = f"position {owner.position}" if positions is None else f"positions {positions}"
    at = f"pool row {owner.pool_row}, {where}{through}"
    match owner.state:
        case "running":
            return f"{at} (running, batch row {owner.batch_row})"
        case "stale-tail":
            return (
                f"{at} (a stale tail past batch row {owner.batch_row}'s live end: an earlier, "
                "finished request's)"
            )
        case "finished":
            return f"{at} (finished: the pool row is on the free list)"
        case "held":
            return f"{at} (running, not in this batch)"
    return f"idle {at}"


def owners_phrase(f: Finding) -> str | None:
    """`owner of slot 109: pool row 9, position 12 (running, batch row 3)`, `last owner of
    slot 68: idle pool row 5, position 68`, or for several slots their owners (slots of one
    pool row said together), those no pool row holds, and the count of slots not traced;
    None without slots."""
    if not f.owners:
        return None
    more = f.provenance_total - len(f.owners)
    tail = f" (+{plural(more, 'more slot')} not traced here)" if more > 0 else ""
    by_row: dict[tuple[object, ...], list[FindingOwner]] = {}
    for o in f.owners:
        if o.pool_row is not None:
            key = (o.pool_row, o.state, o.batch_row, o.full_slot is None)
            by_row.setdefault(key, []).append(o)
    unheld = [o for o in f.owners if o.pool_row is None]
    if len(f.owners) == 1 and not unheld and more <= 0:
        owner = f.owners[0]
        label = "owner" if owner.state in ("running", "held") else "last owner"
        return f"{label} of {_slot_name(owner)}: {owner_text(owner)}{_holders(owner)}"
    bits = []
    for group in by_row.values():
        if len(group) == 1:
            bits.append(f"{_slot_name(group[0])}: {owner_text(group[0])}{_holders(group[0])}")
        else:
            slots = ", ".join(str(o.slot) for o in group)
            positions = ", ".join(str(o.position) for o in group)
            bits.append(f"{_slot_name(group[0], slots)}: {owner_text(group[0], positions)}")
    if unheld:
        slots = ", ".join(str(o.slot) for o in unheld)
        bits.append(f"no pool row holds {_slot_name(unheld[0], slots, len(unheld))}")
    head = "owners (current or last): " if by_row else ""
    return head + "; ".join(bits) + tail


def _slot_name(owner: FindingOwner, slots: str | None = None, count: int = 2) -> str:
    space = "swa " if owner.space == "swa" else ""
    if slots is None:
        return f"{space}slot {owner.slot}"
    return f"{space}slot{'s' if count > 1 else ''} {slots}"


def _holders(owner: FindingOwner) -> str:
    others = owner.holders - 1
    if others <= 0:
        return ""
    return f" (+{plural(others, 'more cell')} hold{'s' if others == 1 else ''} it)"


def _range_text(bounds: tuple[int, int]) -> str:
    first, last = bounds
    return str(first) if first == last else f"{first}..{last}"


def _rows(f: Finding, span: Span | None) -> str | None:
    if span is None:
        return None if f.batch_row is None else str(f.batch_row)
    if span.batch_rows is None:
        return None
    text = _range_text(span.batch_rows)
    return text if span.rows == 1 else f"{text} ({span.rows} distinct)"


def _positions(f: Finding, span: Span | None) -> str | None:
    if span is None:
        return None if f.position is None else str(f.position)
    return None if span.positions is None else _range_text(span.positions)


def _slots(f: Finding, span: Span | None) -> str:
    prefix = "swa " if f.space == "swa" else ""
    if span is None or span.slots is None:
        return "-" if f.slot is None else f"{prefix}{f.slot}"
    text = prefix + _range_text(span.slots)
    return text if span.distinct_slots == 1 else f"{text} ({span.distinct_slots} distinct)"


def _role(f: Finding) -> str | None:
    """A finding's role; for a LUT read, every read that met its cells (`verify+chain-prev`)."""
    read_as = f.details.get("read_as")
    if isinstance(read_as, list | tuple) and read_as:
        reads = sorted((str(r) for r in read_as), key=lambda r: (_READ_ORDER.get(r, 3), r))
        return "+".join(reads)
    return None if f.role is None else str(f.role)


def role_terms(findings: tuple[Finding, ...]) -> set[str]:
    """The planner terms the roles of `findings` use (`verify`, `chain-prev`, ...), and `REF`
    where a message names SGLang's reference: what a glossary explains."""
    used: set[str] = set()
    for f in findings:
        role = _role(f)
        if role:
            used.update(role.split("+"))
        if "REF" in f.message:
            used.add("REF")
    return used


def _where(span: Span | None, rows: str | None, positions: str | None, slots: str) -> list[str]:
    lines = []
    if rows is not None:
        lines.append(f"batch row{'s' if span and span.rows > 1 else ''} {rows}")
    if positions is not None:
        lines.append(f"pos {positions}")
    if slots != "-":
        label = "slot"
        if slots.startswith("swa "):  # `swa slot 12`, not `slot swa 12`
            label, slots = "swa slot", slots[len("swa ") :]
        lines.append(f"{label}{'s' if span and span.distinct_slots > 1 else ''} {slots}")
    return lines


def _raise_mark(f: Finding) -> str | None:
    if not f.first_raise:
        return None
    if f.count == 1:
        return f"{FIRST_RAISE_MARK}: SGLang's reference raises here"
    return (
        f"{FIRST_RAISE_MARK}: SGLang's reference raises at (batch row {f.batch_row}, "
        f"pos {f.position})"
    )


def _launch_mark(f: Finding) -> str | None:
    if UPSTREAM_RAISE not in f.details:
        return None
    if f.count == 1:
        return "← the kernel's launch raised here"
    return f"← the kernel's launch raised at (batch row {f.batch_row}, pos {f.position})"


def _examples(f: Finding, shown: int = EXAMPLE_CELLS) -> str | None:
    """A few cells of a group, its example first: `e.g. batch row 0 pos 14: slot 107; ...; +12 more`
    (batch rows), reading only those cells. None for a finding of one cell or none (its own
    fields say it all)."""
    cells = f.cells
    if cells is None or f.count < 2:
        return None
    rows, positions, slots = (
        cells.entries("batch_row"),
        cells.entries("position"),
        cells.entries("slot"),
    )
    assert rows is not None and positions is not None

    def at(column: np.ndarray | Entries | None, i: int) -> int | None:
        return None if column is None else int(column[i])

    def is_example(i: int) -> bool:
        if f.batch_row is None:  # a finding about slots: its example is a slot
            return slots is not None and at(slots, i) == f.slot
        return at(rows, i) == f.batch_row and at(positions, i) == f.position

    picked = [i for i in range(min(len(cells), shown + 1)) if not is_example(i)]
    bits = []
    for i in [None, *picked][:shown]:
        row = f.batch_row if i is None else at(rows, i)
        position = f.position if i is None else at(positions, i)
        slot = f.slot if i is None else at(slots, i)
        if row is None or row < 0:  # a finding about slots, not table cells
            bits.append(f"slot {slot}")
            continue
        held = "" if slot is None else f": slot {slot}"
        bits.append(f"batch row {row} pos {position}{held}")
    more = f.count - len(bits)
    return "e.g. " + "; ".join(bits) + (f"; +{more} more" if more > 0 else "")


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
    "batch row": "a request's index in this batch; its pool row: its index in req_to_token",
    "P": "prefix length, the cells a request has written",
    "E": "extend length, the tokens this step writes (positions P..P+E-1)",
    "verify": "a prefix cell inside the window, which the canary verifies",
    "prefix": "a live prefix cell before the window",
    "chain-prev": "the cell just before the window, whose record the first verify read chains from",
    "seed": "a writing batch row's last prefix cell P-1, which this step's writes chain from",
    "pending-write": "a cell this step writes",
    "stale-tail": "a cell past a live pool row's end, left by an earlier owner",
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


def coverage_lines(dump: DumpReport) -> list[str]:
    """`checks run: full free list, SWA LUT` and `not run: tree locks (needs
    tree_locked_full_slots, running_req_rows)`: what a verdict rests on, and what it could
    not check for lack of a record; a family that does not apply (an SWA check of a dump
    without SWA) is left out ([] for an unreadable dump)."""
    ran = [c.check for c in dump.coverage if c.status == "ran"]
    why: dict[str, list[str]] = {}  # families stopped by the same reason are said together
    for c in dump.coverage:
        if c.status == "not-run":
            reason = "needs " + ", ".join(c.missing) if c.missing else str(c.reason)
            why.setdefault(reason, []).append(c.check)
    not_run = [f"{', '.join(checks)} ({reason})" for reason, checks in why.items()]
    lines = []
    if ran:
        lines.append("checks run: " + ", ".join(ran))
    if not_run:
        lines.append("not run: " + "; ".join(not_run))
    return lines


def no_findings_phrase(dump: DumpReport) -> str:
    """`no findings`, or `no findings in the checks that ran` when some could not run."""
    if any(c.status == "not-run" for c in dump.coverage):
        return "no findings in the checks that ran"
    return "no findings"


def legend(dumps: Sequence[DumpReport]) -> list[str]:
    """The paragraphs that explain what a run's views showed, each once: the groups table's
    columns, the units of the counts, the planner terms (said once per run, at its end)."""
    paragraphs = []
    if any(dump.groups for dump in dumps):
        paragraphs.append(DIFFERENCES_NOTE)
    if any(dump.counts for dump in dumps):
        paragraphs.append(UNITS_NOTE)
        terms = glossary(dumps)
        if terms:
            paragraphs.append(terms)
    return paragraphs


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
