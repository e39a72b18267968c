"""How the Triton kernels run here: compiled or interpreted, loaded after triton's environment
is prepared, on the memory of that mode (numpy on the host, torch on a CUDA device).

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

The memory (`kernel_arrays(mode)`): compiled kernels need device memory, which kvcanary gets
from torch (imported only then). The interpreter needs nothing of torch: it reads a kernel
argument through a handful of tensor methods (`data_ptr`, `dtype`, `untyped_storage`,
`new_empty`, `set_`, ...), copies each argument "to the host" through them, and dereferences
the raw addresses in numpy. `HostBuffer` answers those methods for a numpy array, so on a CPU
the kernels run straight on the dump's memory-mapped tables and on numpy outputs, and a `check`
never pays torch's import (about 1.5 s of a few-second run).
`tests/planners/test_kernel_arrays.py` pins the methods the interpreter calls, so a Triton
release that reads another one fails there, not in a check.
"""

from __future__ import annotations

import importlib
import mmap
import os
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from kvcanary_cli.errors import PlannerUnavailableError

if TYPE_CHECKING:
    import torch

__all__ = [
    "HostBuffer",
    "KernelArrays",
    "Mode",
    "cuda_available",
    "kernel_arrays",
    "load_kernels",
    "load_triton",
    "mode",
    "prepare_environment",
    "releasable",
    "release",
    "shared_host_arrays",
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


# The memory the kernels read and write, by mode.


class _HostStorage:
    """The "storage" of a `HostBuffer`: already on the host, so `cpu()` is itself."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def data_ptr(self) -> int:
        return int(self._array.ctypes.data)

    def cpu(self) -> _HostStorage:
        return self

    def copy_(self, other: object) -> None:
        """The interpreter copies results back to the "device": the same memory here."""


class HostBuffer:
    """A contiguous numpy array as the interpreter sees a CPU tensor (see the module doc)."""

    def __init__(self, array: np.ndarray, region: mmap.mmap | None = None) -> None:
        if not array.flags.c_contiguous:
            raise ValueError("a kernel buffer must be C-contiguous")
        self.array = array
        #: the shared memory the array lies on (`shared_host_arrays`), else None.
        self.region = region

    @property
    def dtype(self) -> np.dtype[Any]:
        """The element type, which names the kernel's pointer type (`*i32`, `*i64`, `*u8`)."""
        return self.array.dtype

    def data_ptr(self) -> int:
        """The address the interpreter dereferences."""
        return int(self.array.ctypes.data)

    def untyped_storage(self) -> _HostStorage:
        """The memory behind the array (the interpreter copies arguments storage-wise)."""
        return _HostStorage(self.array)

    def storage_offset(self) -> int:
        """Elements from the storage's start: always 0 (the buffer is its own storage)."""
        return 0

    def size(self) -> tuple[int, ...]:
        """The shape, as `torch.Tensor.size()` gives it."""
        return tuple(self.array.shape)

    def stride(self) -> tuple[int, ...]:
        """Strides in elements, as `torch.Tensor.stride()` gives them."""
        return tuple(s // self.array.itemsize for s in self.array.strides)

    def new_empty(self, *_: object, **__: object) -> HostBuffer:
        """The interpreter's host copy of the argument: this same memory."""
        return self

    def set_(self, *_: object) -> HostBuffer:
        """The interpreter re-views the argument over its host storage: this memory."""
        return self


class KernelArrays(Protocol):
    """Allocation and transfers for one kind of kernel memory."""

    def empty(self, n: int, dtype: type[np.generic]) -> Any:
        """An uninitialized 1-D buffer of `n` elements."""
        ...

    def upload(self, array: np.ndarray) -> Any:
        """`array` where the kernels read it (no copy on the host when contiguous)."""
        ...

    def download(self, buffer: Any) -> np.ndarray:
        """A buffer's contents as a host numpy array."""
        ...


class _HostArrays:
    def __init__(self, *, shared: bool = False) -> None:
        self._shared = shared

    def empty(self, n: int, dtype: type[np.generic]) -> HostBuffer:
        if not self._shared:
            return HostBuffer(np.empty(n, dtype=dtype))
        # Anonymous shared memory: what a forked child writes, its parent reads.
        region = mmap.mmap(-1, max(n * np.dtype(dtype).itemsize, 1))
        return HostBuffer(np.frombuffer(region, dtype=dtype, count=n), region)

    def upload(self, array: np.ndarray) -> HostBuffer:
        return HostBuffer(np.ascontiguousarray(array))

    def download(self, buffer: HostBuffer) -> np.ndarray:
        return buffer.array


class _TorchArrays:
    """Torch tensors on `device` ("cuda" for compiled kernels; tests also use "cpu")."""

    def __init__(self, device: str = "cuda") -> None:
        import torch

        self._torch = torch
        self._device = torch.device(device)

    def empty(self, n: int, dtype: type[np.generic]) -> torch.Tensor:
        torch_dtype = self._torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
        return self._torch.empty(n, dtype=torch_dtype, device=self._device)

    def upload(self, array: np.ndarray) -> torch.Tensor:
        host = self._torch.from_numpy(np.ascontiguousarray(array))
        return host.to(device=self._device)

    def download(self, buffer: torch.Tensor) -> np.ndarray:
        return np.asarray(buffer.cpu().numpy())


def kernel_arrays(mode: str) -> KernelArrays:
    """The memory for kernels running in `mode` ('compiled' or 'interpreter')."""
    return _TorchArrays("cuda") if mode == "compiled" else _HostArrays()


def releasable(buffer: Any) -> bool:
    """Whether `release` frees `buffer`'s memory a part at a time (a shared host buffer)."""
    return isinstance(buffer, HostBuffer) and buffer.region is not None and _HAS_REMOVE


def release(buffer: Any, start: int, stop: int) -> None:
    """Free the memory behind elements `[start, stop)` of a `releasable` buffer, read
    already (they read as 0 after): the forked children wrote its pages, so this process
    faults them in only as it reads them, and a column read back a piece at a time never
    holds all of them. `start` is a multiple of a page's elements."""
    if releasable(buffer) and stop > start:
        size = buffer.array.itemsize
        buffer.region.madvise(mmap.MADV_REMOVE, start * size, (stop - start) * size)


_HAS_REMOVE = hasattr(mmap, "MADV_REMOVE")  # Linux


def shared_host_arrays() -> KernelArrays:
    """Host memory that forked children write and their parent reads (`host_parallel`)."""
    return _HostArrays(shared=True)
