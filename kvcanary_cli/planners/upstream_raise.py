"""What SGLang's plan step raises, derived from a kvcanary plan of the same inputs.

SGLang's torch reference (REF) raises at the first bad read (docs/semantics.md §1.6); the GPU
path raises only before launching (§1.5). A kvcanary plan records every problem in REF's order,
so where REF raises and the error it raises can be computed from it, message included, once
(`reference_raise`): the strict reference raises it, `check` marks it and matches it against
what an upstream planner or the capture hook recorded, a plan file records it, and `selftest`
compares the two.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcanary_cli.dump.schema import Group
from kvcanary_cli.errors import UpstreamPlanError
from kvcanary_cli.planners.base import Plan, PlanProblem, ProblemKind, Semantics, lut_error_message
from kvcanary_cli.planners.frame import GroupFrame

__all__ = [
    "NOT_LAUNCHED",
    "ReferenceRaise",
    "expected_raise",
    "raised",
    "reference_raise",
    "upstream_error",
]

#: `Plan.launch_error_type` of a launch kvcanary declined to run (an upstream GPU kernel that
#: would read outside its tensors); never an upstream raise.
NOT_LAUNCHED = "NotLaunched"


def upstream_error(problem: PlanProblem, frame: GroupFrame) -> UpstreamPlanError:
    """The exception REF raises at `problem` (one of its raising problems), message verbatim."""
    if problem.kind is ProblemKind.LUT_OUT_OF_RANGE:
        return UpstreamPlanError(lut_error_message(problem.value, frame.lut_len))
    if problem.kind is ProblemKind.EXPECTED_TOKEN_OUT_OF_RANGE:
        shape = frame.pool_shape or (0, 0)
        dim = 0 if problem.value == problem.pool_row else 1
    else:
        shape = frame.table_shape
        dim = 0 if problem.kind is ProblemKind.ROW_OUT_OF_RANGE else 1
    return UpstreamPlanError(
        f"index {problem.value} is out of bounds for dimension {dim} with size {shape[dim]}",
        exception_type="IndexError",
    )


@dataclass(frozen=True, kw_only=True)
class ReferenceRaise:
    """Where REF raises on one group's inputs (its first raising read, in its own order), and
    the exception it raises there."""

    group: Group
    problem: PlanProblem
    error: UpstreamPlanError


def reference_raise(plan: Plan) -> ReferenceRaise | None:
    """Where and what REF raises at the first raising problem `plan` recorded (None: nothing
    there raises)."""
    first = plan.problems.first_raise()
    if first is None:
        return None
    return ReferenceRaise(group=plan.group, problem=first, error=upstream_error(first, plan.frame))


def raised(plan: Plan) -> UpstreamPlanError | None:
    """What the planner that made `plan` raised: its launch error, or, for a reference planner
    in collect mode, the error it would have raised first (None: it ran through)."""
    if plan.launch_error is not None:
        return UpstreamPlanError(plan.launch_error, exception_type=plan.launch_error_type)
    first = reference_raise(plan)
    return None if first is None else first.error


def expected_raise(reference: Plan, semantics: Semantics) -> UpstreamPlanError | None:
    """What upstream raises, with `semantics`, on the inputs `reference` (a REF plan) planned.

    REF raises at the reference plan's first raising problem; the GPU path only refuses a
    batch before launching (`frame.launch`).
    """
    if semantics is Semantics.REFERENCE:
        return raised(reference)
    launch = reference.frame.launch
    return None if launch is None else UpstreamPlanError(launch.message)
