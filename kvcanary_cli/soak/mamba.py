"""SGLang's hybrid Mamba / linear-attention stack on a CPU: the request pool that also hands out
Mamba state slots (`HybridReqToTokenPool`, its `MambaPool` and `MambaSlotAllocator`), the full
attention side (`HybridLinearKVPool` over a `TokenToKVPoolAllocator`), for
`soak.stack.build_stack`; the tree is `UnifiedRadixCache(FULL, MAMBA)`.

Sized like a tiny Mamba2 model (one linear layer, one full layer, a few heads): the state's
bytes do not matter, only its slots. No model config exists, so the Mamba cache chunk (the
prefix grid a tree checkpoint lands on) is preset on the server args, as SGLang's own test
fixture does; without the extra buffer the tree's Mamba component needs page size 1.

With SGLang's extra buffer (`--mamba-radix-cache-strategy extra_buffer`; 0.5.13 spells it
`--mamba-scheduler-strategy`) each running request also holds a ping-pong track buffer of Mamba
slots (`HybridReqToTokenPool._alloc_ping_pong_buffer`, at the request's row allocation): the
forward writes the state at each track boundary into one of them, a chunk's checkpoint donates
that slot to the tree and takes a fresh one (`donate_mamba_ping_pong_slot`), a finish hands the
tree the slot that holds the last tracked state and frees the rest (`free_mamba_cache(req,
keep)`). Any page size then: checkpoints land on the least common multiple of the Mamba chunk
and the page. The buffer holds two slots where the scheduler overlaps (SGLang's default), one
where it does not; a history here picks (`TRACK_SLOTS`). The pool
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
import math
from importlib import import_module
from typing import Any

__all__ = [
    "CHUNK",
    "TRACK_SLOTS",
    "build_mamba_pools",
    "extra_buffer_args",
    "mamba_size",
    "track_interval",
]

#: Mamba slots per request row (SGLang's `MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO`).
SLOTS_PER_ROW = 3
#: The Mamba cache chunk (`server_args._mamba_cache_chunk_size`): tree checkpoints land on
#: multiples of it.
CHUNK = 16
#: Ping-pong track slots per request with the extra buffer: two as SGLang sizes them for its
#: overlapped scheduler (its default; `get_mamba_tracking_slots(overlap=True)`), one without.
TRACK_SLOTS = (2, 1)
_UTILS = "sglang.srt.configs.mamba_utils"
_ENVS = "sglang.srt.environ"


def mamba_size(spec: Any, track_slots: int = TRACK_SLOTS[0], lazy: bool = False) -> int:
    """Mamba slots for a stack of `spec.max_reqs` rows (slot 0 is reserved on top); with the
    extra buffer, its `track_slots` per row on top, as SGLang's configurator adds them
    (`_calculate_mamba_ratio`), one for the `lazy` strategy (`get_mamba_tracking_slots`: the
    second is taken at a boundary only)."""
    extra = (1 if lazy else track_slots) if spec.layout == "mamba-extra" else 0
    return (SLOTS_PER_ROW + extra) * int(spec.max_reqs)


def track_interval(spec: Any) -> int:
    """The decode track interval (`--mamba-track-interval`, SGLang's default 256, a multiple
    of the page): the Mamba chunk's least common multiple with the page, so decodes of a few
    dozen tokens cross track boundaries."""
    return math.lcm(CHUNK, int(spec.page_size))


def extra_buffer_args(modules: Any, spec: Any, lazy: bool = False) -> dict[str, Any]:
    """The server args that turn the extra buffer on: the strategy under this release's name
    (`mamba_radix_cache_strategy`, 0.5.14 on; `mamba_scheduler_strategy` before), `lazy`
    `extra_buffer_lazy` (SGLang's overlapped scheduler only), and the track interval."""
    names = inspect.signature(modules.server_args.ServerArgs).parameters
    strategy = next(
        (n for n in ("mamba_radix_cache_strategy", "mamba_scheduler_strategy") if n in names),
        "mamba_radix_cache_strategy",  # a release without either: ServerArgs says so
    )
    chosen = "extra_buffer_lazy" if lazy else "extra_buffer"
    return {strategy: chosen, "mamba_track_interval": track_interval(spec)}


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
    modules: Any,
    spec: Any,
    server_args: Any,
    *,
    need_sort: bool = False,
    track_slots: int = TRACK_SLOTS[0],
    lazy: bool = False,
) -> tuple[Any, Any, Any]:
    """(`HybridReqToTokenPool`, `HybridLinearKVPool`, `TokenToKVPoolAllocator`, or
    `PagedTokenToKVPoolAllocator` above page size 1); with `spec.layout` `mamba-extra` the
    extra buffer, `track_slots` (`TRACK_SLOTS`) ping-pong slots per request, held from the
    start but with `lazy` (SGLang's `extra_buffer_lazy`: one held, two places)."""
    import torch

    extra_buffer = spec.layout == "mamba-extra"
    server_args._mamba_cache_chunk_size = CHUNK
    params = _cache_params()
    memory_pool = modules.memory_pool
    req_to_token_pool = memory_pool.HybridReqToTokenPool(
        size=spec.max_reqs,
        mamba_size=mamba_size(spec, track_slots, lazy and extra_buffer),
        mamba_spec_state_size=spec.max_reqs,
        max_context_len=spec.max_context_len,
        device="cpu",
        enable_memory_saver=False,
        cache_params=params,
        mamba_layer_ids=[0],
        enable_mamba_extra_buffer=extra_buffer,
        # a keyword only where it is on: the releases before the lazy strategy take none
        **({"enable_mamba_extra_buffer_lazy": True} if lazy and extra_buffer else {}),
        # the pool sizes the track buffer by it (two slots overlapped, one not); nothing else
        enable_overlap_schedule=extra_buffer and track_slots == 2,
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
        page_size=spec.page_size,
        head_num=1,
        head_dim=4,
        full_attention_layer_ids=[1],
        device="cpu",
        enable_memory_saver=False,
        mamba_pool=req_to_token_pool.mamba_pool,
        **extra,
    )
    if spec.page_size == 1:
        token = import_module("sglang.srt.mem_cache.allocator.token")
        allocator = token.TokenToKVPoolAllocator(
            size=spec.full_tokens,
            dtype=torch.bfloat16,
            device="cpu",
            kvcache=kv_pool,
            need_sort=need_sort,
        )
    else:
        paged = import_module("sglang.srt.mem_cache.allocator.paged")
        allocator = paged.PagedTokenToKVPoolAllocator(
            size=spec.full_tokens,
            page_size=spec.page_size,
            dtype=torch.bfloat16,
            device="cpu",
            kvcache=kv_pool,
            need_sort=need_sort,
        )
    return req_to_token_pool, kv_pool, allocator
