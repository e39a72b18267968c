"""Planners: implementations of SGLang's kv-canary plan step behind one `Planner` interface.

This module is the registry that turns the CLI's names into planner objects. It imports
nothing heavy: backends are imported when one is made, so `kvcanary --help` imports neither
numpy nor torch, only `triton_runtime` ever imports triton, and only `sglang_runtime` imports
SGLang. Torch itself is imported only for SGLang's planners and for kernels on a CUDA device.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvcanary_cli.planners.base import Planner

__all__ = [
    "BACKENDS",
    "KERNELS",
    "PlannerChoice",
    "make_kernel",
    "make_planner",
    "make_selftest_planners",
]


class PlannerChoice(StrEnum):
    """The planners a user can name: `plan --backend` takes `BACKENDS`, `check --kernel`
    (what stands in for the production GPU path) takes `KERNELS`."""

    #: the literal scalar reading of the semantics, REF behaviour on bad input.
    REFERENCE = "reference"
    #: the same plan vectorized (numpy): REF semantics as a backend, GPU semantics as a kernel.
    VECTORIZED = "vectorized"
    #: the GPU path as Triton kernels (compiled on CUDA, interpreted elsewhere).
    TRITON = "triton"
    #: the installed SGLang's own launcher (its kernels on CUDA, its torch reference elsewhere).
    SGLANG = "sglang"
    #: no kernel: `check` skips the comparison.
    NONE = "none"


#: `plan --backend` choices.
BACKENDS = (
    PlannerChoice.REFERENCE,
    PlannerChoice.VECTORIZED,
    PlannerChoice.TRITON,
    PlannerChoice.SGLANG,
)
#: `check --kernel` choices, the default first.
KERNELS = (
    PlannerChoice.TRITON,
    PlannerChoice.VECTORIZED,
    PlannerChoice.SGLANG,
    PlannerChoice.NONE,
)


def _chosen(
    value: PlannerChoice | str, allowed: tuple[PlannerChoice, ...], option: str
) -> PlannerChoice:
    """`value` as one of `allowed`; an `OptionError` naming `option` otherwise (the Python
    API passes names unchecked by the command line)."""
    choice = next((c for c in PlannerChoice if c.value == value), None)
    if choice not in allowed:
        from kvcanary_cli.errors import OptionError

        names = ", ".join(allowed)
        raise OptionError(f"{str(value)[:40]!r} is not one of {names}", option=option)
    assert choice is not None
    return choice


def make_planner(choice: PlannerChoice | str, *, strict: bool = False) -> Planner:
    """The planner `plan --backend` names; `strict` (raise where REF raises) is the scalar
    reference's only."""
    choice = _chosen(choice, BACKENDS, "backend")
    if strict and choice is not PlannerChoice.REFERENCE:
        from kvcanary_cli.errors import OptionError

        raise OptionError(
            "applies to the scalar reference only",
            option="strict",
            hint="add --backend reference",
        )
    match choice:
        case PlannerChoice.REFERENCE:
            from kvcanary_cli.planners.reference import ReferencePlanner

            return ReferencePlanner(strict=strict)
        case PlannerChoice.VECTORIZED:
            from kvcanary_cli.planners.vectorized import VectorizedPlanner

            return VectorizedPlanner()
        case PlannerChoice.TRITON:
            from kvcanary_cli.planners.triton_planner import TritonPlanner

            return TritonPlanner()
        case _:
            return _sglang("--backend sglang")


def make_kernel(choice: PlannerChoice | str) -> Planner | None:
    """The GPU-semantics planner `check --kernel` names (None for `none`)."""
    choice = _chosen(choice, KERNELS, "kernel")
    match choice:
        case PlannerChoice.TRITON:
            from kvcanary_cli.planners.triton_planner import TritonPlanner

            return TritonPlanner()
        case PlannerChoice.VECTORIZED:
            from kvcanary_cli.planners.base import Semantics
            from kvcanary_cli.planners.vectorized import VectorizedPlanner

            return VectorizedPlanner(semantics=Semantics.GPU)
        case PlannerChoice.SGLANG:
            return _sglang("--kernel sglang")
        case _:
            return None


def _sglang(option: str) -> Planner:
    """An `SGLangPlanner`, after checking that the installed SGLang can be loaded (exit 2 if
    not, before any dump is read)."""
    from kvcanary_cli.planners.sglang_planner import SGLangPlanner

    planner = SGLangPlanner(option=option)
    planner.load()
    return planner


def make_selftest_planners(*, sglang: bool) -> tuple[list[Planner], list[Planner]]:
    """`selftest`'s (baselines, planners): the scalar reference and the vectorized GPU model
    as baselines; the vectorized reference, the Triton kernels and, with `sglang`, the
    installed SGLang compared with the baseline of their semantics."""
    from kvcanary_cli.planners.base import Semantics
    from kvcanary_cli.planners.reference import ReferencePlanner
    from kvcanary_cli.planners.triton_planner import TritonPlanner
    from kvcanary_cli.planners.vectorized import VectorizedPlanner

    planners: list[Planner] = [VectorizedPlanner(), TritonPlanner()]
    if sglang:
        planners.append(_sglang("--sglang"))
    return [ReferencePlanner(), VectorizedPlanner(semantics=Semantics.GPU)], planners
