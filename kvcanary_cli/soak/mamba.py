"""SGLang's hybrid Mamba / linear-attention stack on a CPU: the request pool that also hands out
Mamba state slots (`HybridReqToTokenPool`, its `MambaPool` and `MambaSlotAllocator`), the full
attention side (`HybridLinearKVPool` over a `TokenToKVPoolAllocator`), for
`soak.stack.build_stack`; the tree is `UnifiedRadixCache(FULL, MAMBA)`.

Sized like a tiny Mamba2 model (one linear layer, one full layer, a few heads): the state's
bytes do not matter, only its slots. No model config exists, so the Mamba cache chunk (the
prefix grid a tree checkpoint lands on) is preset on the server args, as SGLang's own test
fixture does; without the extra buffer the tree's Mamba component needs page size 1. The pool
has three slots per request row, the ratio SGLang's configurator sizes a Mamba cache by with the
radix cache on (`MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO`; a server caps its running
requests to a third of the slots): a running request holds its working slot, the checkpoint it
matched stays locked in the tree, and publishing its prefill takes a third. With two per row,
early aborts and long outputs filled the pool with running rows and locked checkpoints, and
the checkpoint failed (`Can not alloc mamba cache`) where a server's sizing never lets it.
Nothing here is SGLang's code.
"""

from __future__ import annotations

import inspect
from importlib import import_module
from typing import Any

__all__ = ["CHUNK", "build_mamba_pools", "mamba_size"]

#: Mamba slots per request row (SGLang's `MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO`).
SLOTS_PER_ROW = 3
#: The Mamba cache chunk (`server_args._mamba_cache_chunk_size`): tree checkpoints land on
#: multiples of it.
CHUNK = 16
_UTILS = "sglang.srt.configs.mamba_utils"
_ENVS = "sglang.srt.environ"


def mamba_size(spec: Any) -> int:
    """Mamba slots for a stack of `spec.max_reqs` rows (slot 0 is reserved on top)."""
    return SLOTS_PER_ROW * int(spec.max_reqs)


def _cache_params() -> Any:
    """A tiny Mamba2 state (bfloat16 SSM state) for one linear layer, id 0."""
    utils: Any = import_module(_UTILS)
    envs: Any = import_module(_ENVS).envs
    with envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
        shape = utils.Mamba2StateShape.create(
            tp_world_size=1,
            intermediate_size=16,
            n_groups=1,
            num_heads=2,
            head_dim=8,
            state_size=4,
            conv_kernel=4,
        )
        return utils.Mamba2CacheParams(shape=shape, layers=[0])


def build_mamba_pools(
    modules: Any, spec: Any, server_args: Any, *, need_sort: bool = False
) -> tuple[Any, Any, Any]:
    """(`HybridReqToTokenPool`, `HybridLinearKVPool`, `TokenToKVPoolAllocator`)."""
    import torch

    server_args._mamba_cache_chunk_size = CHUNK
    params = _cache_params()
    memory_pool = modules.memory_pool
    req_to_token_pool = memory_pool.HybridReqToTokenPool(
        size=spec.max_reqs,
        mamba_size=mamba_size(spec),
        mamba_spec_state_size=spec.max_reqs,
        max_context_len=spec.max_context_len,
        device="cpu",
        enable_memory_saver=False,
        cache_params=params,
        mamba_layer_ids=[0],
        enable_mamba_extra_buffer=False,
        enable_overlap_schedule=False,
    )
    pool = memory_pool.HybridLinearKVPool
    # a switch older pools take without a default (0.5.13 - 0.5.14): off, as SGLang's is
    extra = (
        {"enable_kvcache_transpose": False}
        if "enable_kvcache_transpose" in inspect.signature(pool).parameters
        else {}
    )
    kv_pool = pool(
        size=spec.full_tokens,
        dtype=torch.bfloat16,
        page_size=1,
        head_num=1,
        head_dim=4,
        full_attention_layer_ids=[1],
        device="cpu",
        enable_memory_saver=False,
        mamba_pool=req_to_token_pool.mamba_pool,
        **extra,
    )
    token = import_module("sglang.srt.mem_cache.allocator.token")
    allocator = token.TokenToKVPoolAllocator(
        size=spec.full_tokens,
        dtype=torch.bfloat16,
        device="cpu",
        kvcache=kv_pool,
        need_sort=need_sort,
    )
    return req_to_token_pool, kv_pool, allocator
