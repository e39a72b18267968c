"""Planners: three implementations of SGLang's kv-canary plan step behind one interface.

`get_planner(name)` is an explicit registry with lazy imports, so that importing kvcanary
never imports triton (only `triton_runtime` does, and only when the triton backend is used).
"""

from __future__ import annotations

from kvcanary_cli.errors import UsageError
from kvcanary_cli.planners.base import Plan, Planner, Semantics

__all__ = ["KERNEL_NAMES", "PLANNER_NAMES", "Plan", "Planner", "Semantics", "get_planner"]

#: `--backend` choices of `kvcanary plan`.
PLANNER_NAMES = ("reference", "torch", "triton")
#: `--kernel` choices of `kvcanary check`: what stands in for the production GPU path.
KERNEL_NAMES = ("triton", "torch", "none")


def get_planner(name: str, *, strict: bool = False) -> Planner:
    """The planner called `name`; `strict` only applies to the scalar reference.

    Names: `reference` (scalar REF), `torch` (vectorized REF), `torch-gpu` (vectorized GPU
    semantics) and `triton` (the GPU kernels; compiled on CUDA, interpreted elsewhere).
    """
    if strict and name != "reference":
        raise UsageError("--strict applies to the scalar reference only",
                         tensor="--strict", hint="add --backend reference")
    if name == "reference":
        from kvcanary_cli.planners.reference import ReferencePlanner

        return ReferencePlanner(strict=strict)
    if name in ("torch", "torch-gpu"):
        from kvcanary_cli.planners.vectorized import TorchPlanner

        semantics = Semantics.REFERENCE if name == "torch" else Semantics.GPU
        return TorchPlanner(semantics=semantics)
    if name == "triton":
        from kvcanary_cli.planners.triton_planner import TritonPlanner

        return TritonPlanner()
    choices = ", ".join((*PLANNER_NAMES, "torch-gpu"))
    raise UsageError(f"unknown planner {name!r} (choose one of: {choices})", tensor="--backend")
