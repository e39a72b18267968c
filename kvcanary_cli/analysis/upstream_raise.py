"""Where SGLang's torch reference raises on a dump, and the exception the dump records.

The raise itself is derived once, from kvcanary's reference plans
(`planners.upstream_raise.reference_raise`); here it becomes the dump's `FirstRaise` (SGLang
plans its groups in order, full then swa, and stops at the first that raises), the finding
at that cell is marked (`first_raise`, and `kernel_raise` marks where a kernel's launch
raised the same way: both find the finding by `raise_site`), and the exception the capture
hook recorded (`KvDump.recorded_exception`) is held against it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from kvcanary_cli.analysis.cells import at_cell
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.planners.base import Plan, ProblemKind
from kvcanary_cli.planners.upstream_raise import ReferenceRaise, reference_raise
from kvcanary_cli.results.check import Finding, FirstRaise

__all__ = ["first_raise", "raise_site", "recorded_exception", "reference_raises"]


def raise_site(finding: Finding, raised: ReferenceRaise) -> Finding | None:
    """`finding` with the cell where REF raises as its example, or None when the raise is not
    at this finding (another code, another group's LUT read, or none of its cells)."""
    problem = raised.problem
    if finding.code.value != problem.kind.code:
        return None
    if problem.kind is ProblemKind.LUT_OUT_OF_RANGE and finding.group != raised.group:
        return None
    return at_cell(finding, problem.batch_row, problem.position)


def reference_raises(plans: Iterable[Plan]) -> list[ReferenceRaise | None]:
    """What REF raises in each of `plans` (its groups, in order): all `first_raise` needs of
    them, so the plans' entries can go before the findings are marked."""
    return [reference_raise(plan) for plan in plans]


def first_raise(
    raises: Iterable[ReferenceRaise | None], findings: list[Finding]
) -> tuple[FirstRaise | None, list[Finding]]:
    """Where SGLang's torch reference stops, and the findings with that one marked.

    Upstream plans the groups in order (full, then swa) and raises at the first bad read of
    the first group that has one, in its own entry order (`ProblemTable.first_raise`):
    `raises` are `reference_raises` of the reference plans.
    """
    for raised in raises:
        if raised is None:
            continue
        marked = list(findings)
        for i, finding in enumerate(marked):
            site = raise_site(finding, raised)
            if site is not None:
                marked[i] = replace(site, first_raise=True)
                break
        problem = raised.problem
        return FirstRaise(
            group=raised.group,
            exception_type=raised.error.exception_type,
            message=raised.error.message,
            code=FindingCode(problem.kind.code),
            batch_row=problem.batch_row,
            position=problem.position,
        ), marked
    return None, findings


def recorded_exception(dump: KvDump, raised: FirstRaise | None) -> tuple[str | None, bool | None]:
    """The exception the dump records the launcher raising ("Type: message"), and whether it
    is the one kvcanary's reference raises first (None, None when the dump records none)."""
    recorded = dump.recorded_exception
    if recorded is None:
        return None, None
    if raised is None:
        return str(recorded), False
    same = (recorded.exception_type, recorded.message) == (raised.exception_type, raised.message)
    return str(recorded), same
