"""Where SGLang raises on a dump: its torch reference's first raise, the exception the dump
records, and a kernel's raise held against both.

The raise itself is derived once, from kvcanary's reference plans
(`planners.base.reference_raise`). Here it becomes the dump's `FirstRaise` (SGLang
plans its groups in order, full then swa, and stops at the first that raises), the finding at
that cell is marked (`first_raise`), and the exception the capture hook recorded
(`KvDump.recorded_exception`) is held against it.

A kernel that is an upstream planner (`--kernel sglang`) can raise too: SGLang's torch
reference at its first bad read, its GPU path before launching. The reference plan predicts
that raise exactly (`planners.base.expected_raise`), so a raise is *explained* when
it is the predicted one, and a `KERNEL_DIVERGENCE` (field `launch`) when it is not, or when the
kernel runs through where a raise was due. An explained raise is tied to its finding (found by
`raise_site`, as the first raise is): that finding gets `upstream_raise`, the raise's text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from kvcanary_cli.analysis.cells import at_cell
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.errors import UpstreamPlanError
from kvcanary_cli.planners.base import (
    NOT_LAUNCHED,
    Plan,
    ProblemKind,
    ReferenceRaise,
    Semantics,
    expected_raise,
    raised,
    reference_raise,
)
from kvcanary_cli.results.check import UPSTREAM_RAISE, Finding, FirstRaise

__all__ = [
    "first_raise",
    "launch_divergences",
    "mark_upstream_raise",
    "raise_site",
    "recorded_exception",
    "reference_raises",
]


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
    for first in raises:
        if first is None:
            continue
        marked = list(findings)
        for i, finding in enumerate(marked):
            site = raise_site(finding, first)
            if site is not None:
                marked[i] = replace(site, first_raise=True)
                break
        problem = first.problem
        return FirstRaise(
            group=first.group,
            exception_type=first.error.exception_type,
            message=first.error.message,
            code=FindingCode(problem.kind.code),
            batch_row=problem.batch_row,
            position=problem.position,
        ), marked
    return None, findings


def recorded_exception(dump: KvDump, first: FirstRaise | None) -> tuple[str | None, bool | None]:
    """The exception the dump records the launcher raising ("Type: message"), and whether it
    is the one kvcanary's reference raises first (None, None when the dump records none)."""
    recorded = dump.recorded_exception
    if recorded is None:
        return None, None
    if first is None:
        return str(recorded), False
    same = (recorded.exception_type, recorded.message) == (first.exception_type, first.message)
    return str(recorded), same


def _text(error: UpstreamPlanError | None) -> str:
    return "no raise" if error is None else str(error)


def _matched(reference: Plan, kernel: Plan) -> tuple[bool, UpstreamPlanError | None]:
    """Whether the kernel raised exactly as predicted, and that raise."""
    got = raised(kernel)
    if kernel.launch_error_type == NOT_LAUNCHED:  # kvcanary's refusal, explained by findings
        return True, None
    want = expected_raise(reference, kernel.semantics)
    return _text(want) == _text(got), got


def launch_divergences(reference: Plan, kernel: Plan) -> list[Finding]:
    """A `KERNEL_DIVERGENCE` when the kernel's raise is not the one the reference predicts."""
    matched, _ = _matched(reference, kernel)
    if matched:
        return []
    want = _text(expected_raise(reference, kernel.semantics))
    got = _text(raised(kernel))
    return [
        Finding(
            code=FindingCode.KERNEL_DIVERGENCE,
            group=reference.group,
            message=f"launch: reference predicts {want}; kernel {got}",
            details={"field": "launch", "reference": want, "kernel": got},
        )
    ]


def _site(finding: Finding, reference: Plan, kernel: Plan) -> Finding | None:
    """The finding with the cell where the (predicted) raise happens as its example, or None
    when the raise is not at this finding."""
    if kernel.semantics is Semantics.GPU:
        return finding if finding.code is FindingCode.KERNEL_LIMIT_EXCEEDED else None
    first = reference_raise(reference)
    return None if first is None else raise_site(finding, first)


def mark_upstream_raise(findings: list[Finding], reference: Plan, kernel: Plan) -> list[Finding]:
    """`findings` with `upstream_raise` (the raise's text; shown in its details too) on the
    first finding where the kernel raised, when that raise is the one the reference predicts
    (else unchanged)."""
    matched, error = _matched(reference, kernel)
    if not matched or error is None or kernel.launch_error is None:
        return findings
    out = list(findings)
    for i, finding in enumerate(out):
        site = None if finding.upstream_raise is not None else _site(finding, reference, kernel)
        if site is not None:
            text = str(error)
            out[i] = replace(
                site, upstream_raise=text, details={**site.details, UPSTREAM_RAISE: text}
            )
            break
    return out
