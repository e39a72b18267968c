"""Faults to plant in the real stack, each a known SGLang bug redone in a few lines of our own:
a real API call in a wrong place, or one allocator method replaced by its pre-fix behaviour.
`kvcanary soak --fault NAME` plants one, so a soak can be shown to find it.

- `unmapped-representative` (PR #38519): a tree node's SWA pairs are freed through the
  allocator while the node keeps its SWA value; when the tree later evicts that SWA, it frees
  the (now 0) mapping of the node's page representatives, so the reserved page 0 lands on the
  SWA free list and is handed out again.
- `token-exact-free-swa` (before PR #27779): `free_swa` clears the mapping of exactly the
  tokens it was given and frees their SWA pages, so the rest of each freed page keeps mapping
  into a page that is now free. In 0.5.23 every free the scheduler makes is whole pages
  (segments), so this one is reached only by a caller freeing part of a page.
- `double-free-group-end`: a free group is flushed twice, every full slot freed in it goes on
  the free list a second time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["FAULTS", "Fault", "plant"]

#: A fault: called once with the stack after it is built (it may patch the allocator), and
#: then after every step with (stack, step) (it may make a call).
Fault = tuple[Callable[[Any], None], Callable[[Any, int], None]]


def _nothing(*args: Any) -> None:
    return None


def _free_tree_swa_pairs(stack: Any, step: int) -> None:
    """Every 5th step: the first page of unlocked SWA-resident tree slots loses its SWA pairs
    (`allocator.free_swa`), the tree node keeping its SWA value; then the tree evicts SWA."""
    import torch

    if step % 5 != 4:
        return
    core = getattr(stack.tree, "tree_core", stack.tree)
    walk = core.walk_for_kv_canary(unlocked_only=True, swa_resident_only=True)
    slots = walk.slot_indices
    lut = stack.allocator.full_to_swa_index_mapping
    ps = stack.spec.page_size
    mapped = slots[lut[slots] > 0]
    if mapped.numel() < ps:
        return
    first = mapped[:1]
    page = (first // ps) * ps + torch.arange(ps, dtype=first.dtype)
    stack.allocator.free_swa(page)
    # then the tree evicts SWA (what the next allocation under pressure does)
    from importlib import import_module

    params = import_module("sglang.srt.mem_cache.base_prefix_cache").EvictParams
    stack.tree.evict(params(num_tokens=0, swa_num_tokens=stack.spec.swa_tokens))


def _token_exact_free_swa(stack: Any) -> None:
    import torch

    allocator = stack.allocator

    def free_swa(free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        swa = allocator.full_to_swa_index_mapping[free_index]
        allocator.full_to_swa_index_mapping[free_index] = 0
        swa = swa[swa > 0]
        if allocator.free_group is not None:
            allocator.swa_free_group.append(swa)
        else:
            allocator.swa_attn_allocator.free(swa)

    allocator.free_swa = free_swa


def _double_free_group_end(stack: Any) -> None:
    import torch

    allocator = stack.allocator
    original = allocator.free_group_end

    def free_group_end() -> None:
        full = allocator.full_attn_allocator
        pending = list(full.free_group or [])
        pages = list(getattr(full, "free_page_ids_group", None) or [])
        original()
        if pending:
            full.free(torch.cat(pending))
        if pages:
            full.free_page_ids(torch.cat(pages))

    allocator.free_group_end = free_group_end


FAULTS: dict[str, Fault] = {
    "unmapped-representative": (_nothing, _free_tree_swa_pairs),
    "token-exact-free-swa": (_token_exact_free_swa, _nothing),
    "double-free-group-end": (_double_free_group_end, _nothing),
}


def plant(name: str | None, stack: Any) -> Callable[[Any, int], None]:
    """Plant fault `name` (None: none) in `stack`; the per-step call to make."""
    if name is None:
        return _nothing
    patch, each_step = FAULTS[name]
    patch(stack)
    return each_step
