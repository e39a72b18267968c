"""Where triton is prepared: picks compiled or interpreted kernels, then loads them.

Triton runs a kernel either compiled for a CUDA device or in its interpreter (numpy on the
host), chosen by `TRITON_INTERPRET`. It reads the variable twice: when `@triton.jit`
decorates a function (our kernels, in `triton_kernels`), and when `triton` itself is first
imported (its standard library: `tl.cumsum`, `tl.sum`, ...). So `load_triton()` sets
`TRITON_INTERPRET=1` when no CUDA device exists and the user has not chosen a value, *then*
imports triton; and `triton_kernels` is only ever imported through `load_kernels()`. Nothing
happens at import time: the environment changes only when a triton planner first runs, and
only on machines without CUDA, where compiled triton cannot run anyway.

If something imported triton earlier in the process without the variable (a plugin, an
earlier `import triton`), its standard library stays compiled-only. The kernels then keep
working: `std_library_interpreted()` reports it and the planner passes `STD_SCAN=False`, which
computes the prefix sums with the kernel's own combine function (slower under the
interpreter, identical results). To avoid that detour, set `TRITON_INTERPRET=1` before
starting Python, or run kvcanary's planners before anything imports triton.
"""

from __future__ import annotations

import importlib
import os
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Literal

from kvcanary_cli.errors import PlannerUnavailableError

__all__ = [
    "Mode",
    "cuda_available",
    "load_kernels",
    "load_triton",
    "mode",
    "prepare_environment",
    "std_library_interpreted",
]

Mode = Literal["compiled", "interpreter"]

_ENV = "TRITON_INTERPRET"
_TRUE = ("1", "true", "yes", "on")
#: Device nodes of a GPU driver (NVIDIA, AMD): without one, no device exists to ask torch about.
_GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd")


@cache
def cuda_available() -> bool:
    """Whether torch sees a CUDA (or ROCm) device. Torch is imported only where a GPU
    driver's device node exists: on a machine without one the answer is no, for free."""
    if not any(Path(node).exists() for node in _GPU_NODES):
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _gpu_without_torch() -> bool:
    """A GPU driver is there but torch is not: compiled kernels would have no device memory."""
    if not any(Path(node).exists() for node in _GPU_NODES):
        return False
    try:
        import torch  # noqa: F401 (cuda_available imported it already, where it can be)
    except ImportError:
        return True
    return False


def prepare_environment() -> None:
    """Ask for the interpreter when no CUDA device exists, unless the user chose already.

    Call it before anything imports triton (SGLang's kernels do), so that triton's standard
    library runs under the interpreter too.
    """
    if _ENV not in os.environ and not cuda_available():
        os.environ[_ENV] = "1"


def _interpret_requested() -> bool:
    return os.environ.get(_ENV, "0").strip().lower() in _TRUE


def load_triton() -> tuple[ModuleType, ModuleType]:
    """`(triton, triton.language)`, imported after the environment is prepared.

    Raises `PlannerUnavailableError` when triton is not installed, or when it would have to
    compile kernels on a machine without a CUDA device.
    """
    prepare_environment()
    try:
        triton = importlib.import_module("triton")
        tl = importlib.import_module("triton.language")
    except ImportError as exc:
        raise PlannerUnavailableError(
            f"the triton backend needs the triton package, which cannot be imported ({exc})",
            option="--kernel triton",
            hint="pip install triton (Linux), or use --backend vectorized",
        ) from None
    if not cuda_available() and not _interpret_requested():
        if _gpu_without_torch():
            raise PlannerUnavailableError(
                f"{_ENV}={os.environ.get(_ENV)!r} asks triton to compile kernels, which get "
                "their device memory from torch, and torch cannot be imported here",
                option="--kernel triton",
                hint=f"pip install 'kvcanary[torch]' (your CUDA build), or unset {_ENV}",
            )
        raise PlannerUnavailableError(
            f"{_ENV}={os.environ.get(_ENV)!r} asks triton to compile kernels, but no CUDA "
            "device is available",
            option="--kernel triton",
            hint=f"unset {_ENV} (or set it to 1) to run the kernels in the triton interpreter",
        )
    return triton, tl


def mode() -> Mode:
    """'compiled' when kernels compile for a CUDA device, 'interpreter' when numpy runs them."""
    prepare_environment()
    return "interpreter" if _interpret_requested() else "compiled"


def _interpreted(fn: object) -> bool:
    return type(fn).__name__ == "InterpretedFunction"


def std_library_interpreted() -> bool:
    """Whether triton's own `@jit` functions (`tl.cumsum`, ...) can run in `mode()`.

    False only in interpreter mode when triton was imported before `TRITON_INTERPRET` was set.
    """
    _, tl = load_triton()
    cumsum = getattr(getattr(tl, "standard", None), "cumsum", None)
    return mode() == "compiled" or cumsum is None or _interpreted(cumsum)


def load_kernels() -> ModuleType:
    """The `triton_kernels` module, decorated in the mode `mode()` reports."""
    load_triton()
    # only after the environment is ready
    import kvcanary_cli.planners.triton_kernels as triton_kernels

    if _interpreted(triton_kernels.plan_offsets_kernel) != (mode() == "interpreter"):
        raise PlannerUnavailableError(
            f"triton kernels were loaded for another mode than {_ENV} now asks for ({mode()})",
            option="--kernel triton",
            hint=f"set {_ENV} before the first triton planner runs in this process",
        )
    return triton_kernels
