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

__all__ = ["Backend", "Kernel", "make_kernel", "make_planner", "make_selftest_planners"]


class Backend(StrEnum):
    """`kvcanary plan --backend`: which implementation plans."""

    #: the literal scalar reading of the semantics, REF behaviour on bad input.
    REFERENCE = "reference"
    #: the same results vectorized (numpy).
    VECTORIZED = "vectorized"
    #: the GPU path as Triton kernels (compiled on CUDA, interpreted elsewhere).
    TRITON = "triton"
    #: the installed SGLang's own launcher (its kernels on CUDA, its torch reference elsewhere).
    SGLANG = "sglang"


class Kernel(StrEnum):
    """`kvcanary check --kernel`: what stands in for the production GPU path."""

    TRITON = "triton"
    #: the GPU semantics, vectorized (`VectorizedPlanner(semantics=GPU)`).
    VECTORIZED = "vectorized"
    #: the installed SGLang's own launcher (`SGLangPlanner`).
    SGLANG = "sglang"
    #: no kernel: skip the comparison.
    NONE = "none"


def make_planner(backend: Backend, *, strict: bool = False) -> Planner:
    """The planner for `backend`; `strict` (raise where REF raises) is the reference's only."""
    if strict and backend is not Backend.REFERENCE:
        from kvcanary_cli.errors import OptionError

        raise OptionError(
            "applies to the scalar reference only",
            option="--strict",
            hint="add --backend reference",
        )
    match backend:
        case Backend.REFERENCE:
            from kvcanary_cli.planners.reference import ReferencePlanner

            return ReferencePlanner(strict=strict)
        case Backend.VECTORIZED:
            from kvcanary_cli.planners.vectorized import VectorizedPlanner

            return VectorizedPlanner()
        case Backend.TRITON:
            from kvcanary_cli.planners.triton_planner import TritonPlanner

            return TritonPlanner()
        case Backend.SGLANG:
            return _sglang("--backend sglang")


def make_kernel(kernel: Kernel) -> Planner | None:
    """The GPU-semantics planner for `kernel` (None for `none`)."""
    match kernel:
        case Kernel.TRITON:
            from kvcanary_cli.planners.triton_planner import TritonPlanner

            return TritonPlanner()
        case Kernel.VECTORIZED:
            from kvcanary_cli.planners.base import Semantics
            from kvcanary_cli.planners.vectorized import VectorizedPlanner

            return VectorizedPlanner(semantics=Semantics.GPU)
        case Kernel.SGLANG:
            return _sglang("--kernel sglang")
        case Kernel.NONE:
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
