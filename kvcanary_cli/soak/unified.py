"""SGLang's unified-memory stack (`--enable-unified-memory`) on a CPU: the pools and allocator
`init_unified_swa_pools` builds (`UnifiedKVPool`, `UnifiedSWAKVPool`,
`UnifiedSWATokenToKVPoolAllocator` over two `MultiEndedAllocator`s sharing one virtual id
space), for `soak.stack.build_stack`.

`MultiEndedAllocator.alloc_extend` / `alloc_decode` always launch SGLang's Triton kernels
`alloc_extend_kernel` / `alloc_decode_kernel` (page size > 1); on a CPU they only run under
Triton's interpreter, 2-17 ms a step. `torch_kernels` points the unified allocator's module at
SGLang's own torch versions of the same two kernels (`alloc_extend_naive`,
`alloc_decode_naive` in `allocator/paged.py`, what the paged allocator runs on CPU), which
hand out the same virtual ids. A release without both (0.5.21 has no `alloc_decode_naive`)
keeps its Triton kernels: they run interpreted, or soak refuses the page size
(`soak.stack`). The sub-allocator's module is the one the tree has: `allocator/unified_sub_pool`
(0.5.20 on) or `mem_cache/multi_ended_allocator` (0.5.17 - 0.5.19). Nothing here is SGLang's
code.
"""

from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec
from typing import Any

__all__ = ["build_unified_pools", "on_torch", "torch_kernels"]

#: Where `MultiEndedAllocator` and its kernel launches live, newest first.
_SUB_POOLS = (
    "sglang.srt.mem_cache.allocator.unified_sub_pool",
    "sglang.srt.mem_cache.multi_ended_allocator",
)
_PAGED = "sglang.srt.mem_cache.allocator.paged"
_POOLS = "sglang.srt.mem_cache.unified_memory_pool"
#: Per-rank K and V rows must be multiples of 16 bytes in the unified pool (bf16: 8 dims).
HEAD_DIM = 8


def _sub_pool() -> Any:
    """The tree's module of the unified sub-allocator (the first of `_SUB_POOLS` it has)."""
    for name in _SUB_POOLS[:-1]:
        if find_spec(name) is not None:
            return import_module(name)
    return import_module(_SUB_POOLS[-1])


class _Launch:
    """`kernel[grid](*args)` for a torch function: the grid is dropped."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def __getitem__(self, grid: object) -> Any:
        return self.run


def torch_kernels() -> None:
    """Point the unified sub-allocator's two kernel launches at SGLang's torch versions
    (process-wide, like the modules; only that module's names change, so the paged
    allocator is untouched)."""
    sub = _sub_pool()
    paged: Any = import_module(_PAGED)
    if on_torch() or not all(
        callable(getattr(paged, name, None))
        for name in ("alloc_extend_naive", "alloc_decode_naive")
    ):
        return

    def extend(
        prefix: Any, seq: Any, last: Any, free: Any, out: Any, bs_upper: int, page_size: int
    ) -> None:
        paged.alloc_extend_naive(prefix, seq, last, free, out, page_size, out.device)

    def decode(seq: Any, last: Any, free: Any, out: Any, bs_upper: int, page_size: int) -> None:
        pages = int(((seq - 1) % page_size == 0).sum())
        paged.alloc_decode_naive(seq, last, free, out, page_size, pages)

    sub.alloc_extend_kernel = _Launch(extend)
    sub.alloc_decode_kernel = _Launch(decode)


def on_torch() -> bool:
    """Whether the unified sub-allocator's kernel launches run SGLang's torch versions."""
    return isinstance(getattr(_sub_pool(), "alloc_extend_kernel", None), _Launch)


def build_unified_pools(
    spec: Any, *, lazy: bool = False, need_sort: bool = False
) -> tuple[Any, Any]:
    """(`UnifiedSWAKVPool`, `UnifiedSWATokenToKVPoolAllocator`) sized like the SWA stack
    (`full_tokens`, `swa_tokens`: the legacy capacities; the bytes they take are shared)."""
    import torch

    torch_kernels()
    bundle = import_module(_POOLS).init_unified_swa_pools(
        device="cpu",
        kv_cache_dtype=torch.bfloat16,
        head_num=1,
        head_dim=HEAD_DIM,
        v_head_dim=HEAD_DIM,
        swa_head_num=1,
        swa_head_dim=HEAD_DIM,
        swa_v_head_dim=HEAD_DIM,
        page_size=spec.page_size,
        start_layer=0,
        end_layer=1,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        full_max_total_num_tokens=spec.full_tokens,
        swa_max_total_num_tokens=spec.swa_tokens,
        enable_memory_saver=False,
        need_sort=need_sort,
        lazy_compaction=lazy,
    )
    return bundle.token_to_kv_pool, bundle.token_to_kv_pool_allocator
