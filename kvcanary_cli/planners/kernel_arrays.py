"""The memory the Triton kernels read and write: numpy on the host, torch on a CUDA device.

Compiled kernels need device memory, which kvcanary gets from torch (imported only then).
The interpreter needs nothing of torch: it reads a kernel argument through a handful of
tensor methods (`data_ptr`, `dtype`, `untyped_storage`, `new_empty`, `set_`, ...), copies
each argument "to the host" through them, and dereferences the raw addresses in numpy.
`HostBuffer` answers those methods for a numpy array, so on a CPU the kernels run straight on
the dump's memory-mapped tables and on numpy outputs, and a `check` never pays torch's import
(about 1.5 s of a few-second run). `tests/planners/test_kernel_arrays.py` pins the methods the
interpreter calls, so a Triton release that reads another one fails there, not in a check.
"""

from __future__ import annotations

import mmap
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["HostBuffer", "KernelArrays", "kernel_arrays", "shared_host_arrays"]


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

    def __init__(self, array: np.ndarray) -> None:
        if not array.flags.c_contiguous:
            raise ValueError("a kernel buffer must be C-contiguous")
        self.array = array

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
        return HostBuffer(np.frombuffer(region, dtype=dtype, count=n))

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


def shared_host_arrays() -> KernelArrays:
    """Host memory that forked children write and their parent reads (`host_parallel`)."""
    return _HostArrays(shared=True)
