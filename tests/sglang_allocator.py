"""SGLang 0.5.23's real KV allocators, from the release wheel, running on CPU tensors.

`extract_allocators(wheel, root)` unpacks `srt/mem_cache/allocator/{base,token,paged,swa}.py`
as they are, and writes our own stubs for what they import that would pull in the server or
CUDA: the platform registry (no platform allocator, no Triton), the Triton allocator kernels
(never reached off CUDA), the `utils` helpers, the invariant checks (strict here: a broken
SGLang invariant raises, so a history that breaks one is a driver bug, not a clean state) and
the SWA KV pool base class (only the LUT bookkeeping the allocator calls). `load_allocators`
imports the real classes from such a tree. Nothing of SGLang is copied into the repository.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.sglang_standin import forget_sglang
from tests.sglang_wheel import unpack

__all__ = ["ALLOCATOR_MODULES", "SGLangAllocators", "extract_allocators", "load_allocators"]

_ALLOCATOR = "sglang/srt/mem_cache/allocator/"
#: The wheel's allocator modules, unpacked unchanged.
ALLOCATOR_MODULES = tuple(
    _ALLOCATOR + name for name in ("base.py", "token.py", "paged.py", "swa.py")
)

_PLATFORMS_STUB = '''"""Stub platform registry: CPU, no allocator of its own, no Triton."""

from types import SimpleNamespace


class _CpuPlatform:
    """What the allocators ask the platform: its paged allocator class and Triton support."""

    capabilities = SimpleNamespace(supports_triton=False)

    def get_paged_allocator_cls(self):
        """None: SGLang's own PagedTokenToKVPoolAllocator."""
        return None


current_platform = _CpuPlatform()
'''

_KERNELS_STUB = '''"""Stub of the Triton allocator kernels: off CUDA the allocators use torch."""


def _cuda_only(*args, **kwargs):
    raise RuntimeError("stub: the Triton allocator kernels run on CUDA only")


alloc_extend_kernel = _cuda_only
alloc_decode_kernel = _cuda_only
get_and_clear_swa_pages = _cuda_only
'''

#: `sglang.srt.utils` and `.common`: the helpers the allocators call, written for this stub.
_UTILS_STUB = '''"""Stub of SGLang's utils: only the helpers the allocator modules import."""

import os

import torch


def is_npu():
    """No Ascend NPU here."""
    return False


def is_hip():
    """No ROCm here."""
    return False


def get_bool_env_var(name, default="false"):
    """An environment flag, true for "1" or "true"."""
    return os.getenv(name, default).lower() in ("1", "true")


def next_power_of_2(n):
    """The smallest power of two at least n (1 for n <= 0)."""
    return 1 if n <= 0 else 1 << (n - 1).bit_length()


def get_num_new_pages(seq_lens, page_size, prefix_lens=None, decode=False):
    """Pages a batch needs beyond the ones its prefixes hold; a decode step needs one for
    every request whose new token opens a page."""
    if decode:
        return int((seq_lens % page_size == 1).sum())
    after = (seq_lens + page_size - 1) // page_size
    before = (prefix_lens + page_size - 1) // page_size
    return int((after - before).sum())


def async_h2d(args, *, dtype, device):
    """A host list as a tensor on `device` (no pinned staging on CPU)."""
    return torch.tensor(args, dtype=dtype).to(device)
'''

_INVARIANTS_STUB = '''"""Stub of SGLang's invariant checks, strict: a violation raises."""

import enum

import torch


class Bucket(enum.Enum):
    """Blast radius of a violation (only named here)."""

    SOFTEN = "soften"
    GUARD = "guard"
    FATAL_CONTAINABLE = "fatal_containable"
    FATAL_UNCONTAINABLE = "fatal_uncontainable"


class IsTrue:
    """The value is the condition itself."""

    name = "is_true"


class Invariant:
    """A named invariant."""

    def __init__(self, name, bucket, prop, *, recover=None):
        self.name = name
        self.bucket = bucket
        self.prop = prop


def expect(invariant, value, msg=""):
    """Raise unless every element of `value` holds."""
    if not bool(torch.all(torch.as_tensor(value))):
        raise AssertionError(f"SGLang invariant {invariant.name} broken: {msg}")
'''

_SWA_POOL_STUB = '''"""Stub of the SWA KV pool base: the LUT bookkeeping the allocator calls
(registration and translation), no KV buffers."""


class BaseSWAKVPool:
    """A paged SWA pool (no per-request ring, no request windows)."""

    swa_req_ring_size = None
    request_window = None
    swa_uses_full_indices = False
    full_kv_pool = None
    swa_kv_pool = None
    full_to_swa_index_mapping = None

    def register_mapping(self, full_to_swa_index_mapping):
        """Keep the allocator's LUT, as SGLang's SWAKVPool does."""
        self.full_to_swa_index_mapping = full_to_swa_index_mapping

    def translate_loc_from_full_to_swa(self, kv_indices):
        """Full slots to SWA slots through the LUT (-1 reads the trailing -1)."""
        return self.full_to_swa_index_mapping[kv_indices]
'''

_EMPTY = '"""Stub: the real package level imports the server (or a kernel registry)."""\n'
#: Our files in the unpacked tree, by path.
STUBS = {
    "sglang/__init__.py": _EMPTY,
    "sglang/srt/__init__.py": _EMPTY,
    "sglang/srt/mem_cache/__init__.py": _EMPTY,
    _ALLOCATOR + "__init__.py": _EMPTY,
    "sglang/srt/mem_cache/base_swa_memory_pool.py": _SWA_POOL_STUB,
    "sglang/srt/platforms/__init__.py": _PLATFORMS_STUB,
    "sglang/srt/utils/__init__.py": _UTILS_STUB,
    "sglang/srt/utils/common.py": _UTILS_STUB,
    "sglang/srt/utils/invariants.py": _INVARIANTS_STUB,
    "sglang/kernels/__init__.py": _EMPTY,
    "sglang/kernels/ops/__init__.py": _EMPTY,
    "sglang/kernels/ops/memory/__init__.py": _EMPTY,
    "sglang/kernels/ops/memory/allocator.py": _KERNELS_STUB,
}


@dataclass(frozen=True)
class SGLangAllocators:
    """The real allocator classes, and the stub SWA pool they are built over."""

    token: Any
    paged: Any
    swa: Any
    swa_pool: Any


def extract_allocators(wheel: Path, root: Path) -> Path:
    """Unpack the allocator modules and write the stubs into `root` (the sys.path entry)."""
    return unpack(wheel, root, tuple(ALLOCATOR_MODULES), STUBS)


def load_allocators(root: Path) -> SGLangAllocators:
    """Import the real classes from an extracted tree (first on sys.path while importing).

    Every `sglang` module imported before is forgotten first, and the tree leaves sys.path
    again: the classes keep their modules alive.
    """
    forget_sglang()
    sys.path.insert(0, str(root))
    try:
        token = importlib.import_module("sglang.srt.mem_cache.allocator.token")
        paged = importlib.import_module("sglang.srt.mem_cache.allocator.paged")
        swa = importlib.import_module("sglang.srt.mem_cache.allocator.swa")
        pool = importlib.import_module("sglang.srt.mem_cache.base_swa_memory_pool")
    finally:
        sys.path.remove(str(root))
        forget_sglang()
    return SGLangAllocators(
        token=token.TokenToKVPoolAllocator,
        paged=paged.PagedTokenToKVPoolAllocator,
        swa=swa.SWATokenToKVPoolAllocator,
        swa_pool=pool.BaseSWAKVPool,
    )
