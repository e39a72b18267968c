"""A kernel's raise, held against where the reference says upstream raises.

A kernel that is an upstream planner (`--kernel sglang`) can raise: SGLang's torch reference at
its first bad read, its GPU path before launching. kvcanary's reference plan predicts that
raise exactly (`planners.upstream_raise.expected_raise`), so a raise is *explained* when it is
the predicted one, and a `KERNEL_DIVERGENCE` (field `launch`) when it is not, or when the kernel
runs through where a raise was due. An explained raise is tied to its finding: the finding at
that slot (or row) gets `upstream_raise`, the raise's text (shown in its details too).
"""

from __future__ import annotations

from dataclasses import replace

from kvcanary_cli.analysis.upstream_raise import raise_site
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.errors import UpstreamPlanError
from kvcanary_cli.planners.base import Plan, Semantics
from kvcanary_cli.planners.upstream_raise import (
    NOT_LAUNCHED,
    expected_raise,
    raised,
    reference_raise,
)
from kvcanary_cli.results.check import UPSTREAM_RAISE, Finding

__all__ = ["UPSTREAM_RAISE", "launch_divergences", "mark_upstream_raise"]


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
