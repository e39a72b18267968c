"""Faults to plant in the real stack, each a known SGLang bug redone in a few lines of our own:
a real API call in a wrong place, or one allocator method replaced by its pre-fix behaviour.
`kvcanary soak --fault NAME` plants one, so a soak can be shown to find it.

- `unmapped-representative` (PR #38519): a tree node's SWA pairs are freed through the
  allocator while the node keeps its SWA value; when the tree later evicts that SWA, it frees
  the (now 0) mapping of the node's page representatives, so the reserved page 0 lands on the
  SWA free list and is handed out again. A release whose tree frees an evicted SWA value
  through `free_swa` (no segment frees, `free_swa_segment`: 0.5.17 - 0.5.19) skips unmapped
  slots there, so the bug has nothing to act on: the fault is refused in one line, as in the
  Mamba layout, which has no SWA side.
- `shared-boundary-page` (before PR #36457): a finished request's tail free starts at its
  first unkept token instead of the next page boundary; at page size > 1 the set-shaped free
  of the boundary page's rest frees that whole page, which the head free releases as well.
  A release whose `release_kv_cache` frees the tail inline (no
  `_release_overallocated_kv_indices`: 0.5.13 - 0.5.15) has nothing to replace: refused in
  one line.
- `double-free-group-end`: a free group is flushed twice, every full slot freed in it goes on
  the free list a second time (the group the full side keeps, or where the SWA allocator
  keeps it, 0.5.17 - 0.5.19, the composite's; the Mamba layout's one token allocator).
- `tree-page-freed`: once the tree holds an unlocked page, that page is pushed onto the full
  side's free list while the node keeps it (unified memory: onto `free_virtual_ids`, still
  bound; SGLang's own checks stayed silent for 250 steps there).
- `lock-leak`: a request released without caching (a retraction, an abort in chunked prefill)
  never unlocks its prefix (`tree_cache.unlock(req.lock)` skipped, `req.lock` dropped; in
  0.5.21 `unpin(req)`, in 0.5.17 - 0.5.20 `_dec_req_lock(req)`, in 0.5.13 - 0.5.16
  `dec_lock_ref(req.last_node)`): the nodes stay locked for good.
  kvcanary's lock counts see it at that step; a check of the locked slots alone only once
  no running row holds them, or at idle.
- `tree-mamba-slot-freed` (Mamba layout): once the tree holds a Mamba state, its slot is pushed
  onto the Mamba free list while the node keeps it (SGLang's busy check has no Mamba check; its
  idle check sees only counts).

With the host tier (`--hicache`; each acts on the Python tree core's nodes only, where the
host values can be read, and never acts on the Rust core: `--core rust` with one is refused in
one line, and a soak over both cores plants it in the Python core's histories alone):

- `host-evict-leak`: a host eviction that forgets to free the Full KV's host slots (the
  tree's `_drain_host_frees` drops them): the evicted nodes are gone, their slots on no free
  list, lost to the host pool.
- `load-back-frees-host`: a load-back that frees its node's host copy through the host pool's
  own `free` while the node keeps it as its host value (SGLang's double-free bits pass: the
  slots were allocated).
- `backup-twice`: a write-through ack that commits its node's backup a second time
  (`commit_backup` with fresh host slots from the pool's own `alloc`): the node's first host
  slots are dropped, held by nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvcanary_cli.capture.tree import walk_component_nodes
from kvcanary_cli.soak.calls import (
    held_lock,
    release_keyword,
    root_of,
    row_of,
    tree_unlock_name,
)
from kvcanary_cli.soak.stack import MAMBA_LAYOUTS, SGLangUnavailableError

__all__ = ["FAULTS", "PYTHON_CORE_FAULTS", "Fault", "plant"]

#: A fault: called once with the stack after it is built (it may patch the allocator or a
#: module, and return its undo), and then after every step with (stack, step) (it may make
#: a call).
Fault = tuple[Callable[[Any], Any], Callable[[Any, int], None]]


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _needs_segment_frees(stack: Any) -> None:
    """Refuse `unmapped-representative` on an SWA allocator without segment frees (see the
    module doc): there the fault would run and prove nothing; and where nothing is SWA."""
    allocator = type(stack.allocator)
    if stack.spec.layout in MAMBA_LAYOUTS:
        raise SGLangUnavailableError(
            "the unmapped-representative fault frees a tree node's SWA pairs: the Mamba "
            "layout has no SWA side",
            source=stack.modules.tree.label,
        )
    if callable(getattr(allocator, "free_swa", None)) and not callable(
        getattr(allocator, "free_swa_segment", None)
    ):
        tree = stack.modules.tree
        raise SGLangUnavailableError(
            f"the unmapped-representative fault needs SWA segment frees, which "
            f"{tree.release} does not have ({allocator.__name__}.free_swa_segment): its tree "
            "frees an evicted SWA value through free_swa, which skips unmapped slots",
            source=tree.label,
        )


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
    stack.fault_acted += 1
    # then the tree evicts SWA (what the next allocation under pressure does)
    from importlib import import_module

    params = import_module("sglang.srt.mem_cache.base_prefix_cache").EvictParams
    stack.tree.evict(params(num_tokens=0, swa_num_tokens=stack.spec.swa_tokens))


def _shared_boundary_page(stack: Any) -> Callable[[], None]:
    """The tail free of a finished request before PR #36457: it starts at the first token the
    request does not keep, not at the next page boundary, so a set-shaped free of the rest of
    the boundary page frees (and clears) that whole page, which the head free releases too."""
    import torch

    common = stack.modules.common
    original = getattr(common, "_release_overallocated_kv_indices", None)
    if original is None:
        tree = stack.modules.tree
        raise SGLangUnavailableError(
            "the shared-boundary-page fault replaces the tail free of a finished request "
            f"(common._release_overallocated_kv_indices), which {tree.release} does not "
            "have: its release_kv_cache frees the tail inline",
            source=tree.label,
        )
    ps = stack.spec.page_size
    allocator = stack.allocator
    table = stack.req_to_token_pool.req_to_token

    def release_tail(req: Any, start_p: int, end_p: int, tree_cache: Any) -> None:
        row = row_of(req)
        if ps > 1 and start_p % ps and row is not None:
            last = int(table[row, start_p - 1])
            page_end = (last // ps + 1) * ps
            allocator.free(torch.arange(last + 1, page_end, dtype=torch.int64))
            stack.fault_acted += 1
        original(req, start_p, end_p, tree_cache)

    common._release_overallocated_kv_indices = release_tail

    def undo() -> None:
        common._release_overallocated_kv_indices = original

    return undo


#: What an SWA allocator that keeps the free group itself, not its full side, has:
#: `full_free_group` (0.5.19), `is_not_in_free_group` (0.5.17 - 0.5.18).
_COMPOSITE_GROUP = ("full_free_group", "is_not_in_free_group")


def _double_free_group_end(stack: Any) -> None:
    import torch

    allocator = stack.allocator
    original = allocator.free_group_end

    def free_group_end() -> None:
        full = getattr(allocator, "full_attn_allocator", allocator)  # the Mamba layout: itself
        pending = list(full.free_group or [])
        if any(hasattr(allocator, n) for n in _COMPOSITE_GROUP):  # the composite's group
            pending += list(allocator.free_group or [])
            pending += list(getattr(allocator, "full_free_group", None) or [])
        pages = list(getattr(full, "free_page_ids_group", None) or [])
        original()
        if pending:
            full.free(torch.cat(pending))
        if pages:
            full.free_page_ids(torch.cat(pages))
        stack.fault_acted += bool(pending or pages)

    allocator.free_group_end = free_group_end


def _tree_page_freed(stack: Any, step: int) -> None:
    """Once: the first page of the tree's unlocked slots goes back on the full side's free list
    (the virtual free list in the unified layout), the tree node keeping it."""
    import torch

    full = getattr(stack.allocator, "full_attn_allocator", stack.allocator)  # Mamba: itself
    if stack.fault_acted:
        return
    slots = _unlocked_slots(stack.tree)
    ps = stack.spec.page_size
    slots = slots[slots >= ps]
    if slots.numel() == 0:
        return
    page = (slots[:1] // ps).to(torch.int64)
    if getattr(full, "free_virtual_ids", None) is not None:
        full.free_virtual_ids = torch.cat([full.free_virtual_ids, page])
    else:
        full.free_pages = torch.cat([full.free_pages, page if ps > 1 else slots[:1]])
    stack.fault_acted += 1


def _unlocked_slots(tree: Any) -> Any:
    """The full slots of the tree's unlocked nodes (a tensor): its core's walk, or where the
    tree has none (0.5.13 - 0.5.16) the same read from its nodes."""
    import torch

    core = getattr(tree, "tree_core", tree)
    walk = getattr(core, "walk_for_kv_canary", None)
    if callable(walk):
        return walk(unlocked_only=True, swa_resident_only=False).slot_indices
    walked = walk_component_nodes(tree)
    if walked is None:
        raise TypeError(f"{type(tree).__name__} has no walk of its unlocked nodes soak knows")
    return torch.from_numpy(walked[1])


def _tree_mamba_slot_freed(stack: Any, step: int) -> None:
    """Once: the first Mamba slot the tree holds goes back on the Mamba free list, the tree
    node keeping it."""
    allocator = stack.req_to_token_pool.mamba_allocator
    if stack.fault_acted:
        return
    held = stack.tree.all_mamba_values_flatten()
    if held is None or held.numel() == 0:
        return
    allocator.free(held[:1].clone())
    stack.fault_acted += 1


def _lock_leak(stack: Any) -> Callable[[], None]:
    """`release_kv_cache` without caching (`checkpoint=False`; `is_insert=False` in 0.5.21) with
    its unlock skipped where the lock is below the root."""
    tree = stack.tree
    modules = (stack.modules.common, stack.modules.schedule_batch)  # each holds the function
    original = stack.modules.common.release_kv_cache
    keyword = release_keyword(original, tree)
    unlock = tree_unlock_name(tree)  # `unlock(req.lock)`; `unpin(req)` in 0.5.21

    def release_kv_cache(req: Any, tree_cache: Any, **given: bool) -> None:
        lock = held_lock(req)
        if given.get(keyword, True) or lock is None or lock.node == root_of(tree):
            original(req, tree_cache, **given)  # (the root holds no lock)
            return
        setattr(tree_cache, unlock, _nothing)  # the instance's: shadows the method here
        try:
            original(req, tree_cache, **given)
        finally:
            delattr(tree_cache, unlock)
        stack.fault_acted += 1

    for module in modules:
        module.release_kv_cache = release_kv_cache

    def undo() -> None:
        for module in modules:
            module.release_kv_cache = original

    return undo


def _python_node(tree: Any, node_id: Any) -> Any:
    """The Python tree core's node of `node_id` (None on the Rust core: no node to read).

    The Rust core's adapter has `root_node` and `node_by_id` as methods that raise
    `NotImplementedError` (not `AttributeError`), so both are asked inside the `try`: a
    `hasattr` probe outside it let that error out of the fault's wrapper, inside SGLang's
    call, and a Rust-core history stopped as SGLang's crash."""
    core = getattr(tree, "tree_core", None)
    node_by_id = getattr(core, "node_by_id", None)
    if not callable(node_by_id):
        return None
    try:
        if getattr(core, "root_node", None) is None:
            return None
        return node_by_id(node_id)
    except Exception:  # the Rust core's adapter raises for what it has not ported
        return None


def _full_kind(stack: Any) -> Any:
    return stack.modules.component_type.ComponentType.FULL


def _anchor_host_pool(tree: Any) -> Any:
    return tree.cache_controller.mem_pool_host.anchor_entry.host_pool


def _needs_hicache(stack: Any) -> None:
    if getattr(stack.tree, "cache_controller", None) is None:
        raise SGLangUnavailableError(
            "this fault acts on SGLang's host tier: add --hicache", source=stack.modules.tree.label
        )


def _host_evict_leak(stack: Any) -> None:
    """The tree's host frees with the Full KV's dropped (see module doc)."""
    _needs_hicache(stack)
    tree, full = stack.tree, _full_kind(stack)
    original = tree._drain_host_frees
    python_core = _python_node(tree, tree.root_node_handle()) is not None

    def drain(host_frees: dict[Any, list[Any]]) -> None:
        if python_core and host_frees.get(full):
            host_frees.pop(full)
            stack.fault_acted += 1
        original(host_frees)

    tree._drain_host_frees = drain  # the instance's: gone with its history's tree


def _load_back_frees_host(stack: Any) -> None:
    """A load-back whose node's host copy goes back to the pool (see module doc)."""
    _needs_hicache(stack)
    tree, full = stack.tree, _full_kind(stack)
    original = tree.load_back

    def load_back(node_id: Any, *args: Any, **kwargs: Any) -> bool:
        loaded = original(node_id, *args, **kwargs)
        node = _python_node(tree, node_id) if loaded else None
        host = None if node is None else node.component_data[full].host_value
        if host is not None and host.numel():
            _anchor_host_pool(tree).free(host)
            stack.fault_acted += 1
        return bool(loaded)

    tree.load_back = load_back


def _backup_twice(stack: Any) -> None:
    """A write-through ack that commits its node's backup again (see module doc)."""
    _needs_hicache(stack)
    tree, full = stack.tree, _full_kind(stack)
    original = tree._finish_write_through_ack

    def finish(ack_id: Any) -> None:
        original(ack_id)
        node = _python_node(tree, ack_id)
        host = None if node is None else node.component_data[full].host_value
        pool = _anchor_host_pool(tree)
        if host is None or not host.numel() or pool.available_size() < host.numel():
            return
        tree.tree_core.commit_backup(ack_id, pool.alloc(host.numel()), {})
        stack.fault_acted += 1

    tree._finish_write_through_ack = finish


def _storage_ack_frees_host(stack: Any) -> None:
    """A storage backup's ack that frees its node's host copy (see module doc): the nodes
    `write_backup_storage` backed up are remembered; when the backup drain then drops such a
    node's host lock (`dec_host_lock_ref`), its Full host value goes back to the pool."""
    _needs_hicache(stack)
    if getattr(stack, "storage", None) is None:
        raise SGLangUnavailableError(
            "this fault acts on SGLang's storage tier: add --hicache-storage",
            source=stack.modules.tree.label,
        )
    tree, full = stack.tree, _full_kind(stack)
    backup, unlock = tree.write_backup_storage, tree.dec_host_lock_ref
    pending: dict[Any, int] = {}

    def write_backup_storage(node_id: Any) -> None:
        before = len(tree.ongoing_backup)
        backup(node_id)
        if len(tree.ongoing_backup) > before:
            pending[node_id] = pending.get(node_id, 0) + 1

    def dec_host_lock_ref(node_id: Any, *args: Any, **kwargs: Any) -> Any:
        result = unlock(node_id, *args, **kwargs)
        if pending.get(node_id) and not any(n == node_id for n, _ in tree.ongoing_backup.values()):
            pending[node_id] -= 1
            node = _python_node(tree, node_id)
            host = None if node is None else node.component_data[full].host_value
            if host is not None and host.numel():
                _anchor_host_pool(tree).free(host)
                stack.fault_acted += 1
        return result

    tree.write_backup_storage = write_backup_storage
    tree.dec_host_lock_ref = dec_host_lock_ref


#: The faults that act on the Python tree core's nodes alone (their host values): on the
#: Rust core they never act, so `--core rust` with one is refused in one line, and a soak over
#: both cores plants it in the Python core's histories only (`soak` says so in a note).
PYTHON_CORE_FAULTS = (
    "host-evict-leak",
    "load-back-frees-host",
    "backup-twice",
    "storage-ack-frees-host",
)

FAULTS: dict[str, Fault] = {
    "unmapped-representative": (_needs_segment_frees, _free_tree_swa_pairs),
    "shared-boundary-page": (_shared_boundary_page, _nothing),
    "double-free-group-end": (_double_free_group_end, _nothing),
    "tree-page-freed": (_nothing, _tree_page_freed),
    "tree-mamba-slot-freed": (_nothing, _tree_mamba_slot_freed),
    "lock-leak": (_lock_leak, _nothing),
    "host-evict-leak": (_host_evict_leak, _nothing),
    "load-back-frees-host": (_load_back_frees_host, _nothing),
    "backup-twice": (_backup_twice, _nothing),
    "storage-ack-frees-host": (_storage_ack_frees_host, _nothing),
}


def plant(name: str | None, stack: Any) -> tuple[Callable[[Any, int], None], Callable[[], None]]:
    """Plant fault `name` (None: none) in `stack`: the per-step call, and the undo (a fault
    that patches a module must not outlive its history)."""
    if name is None:
        return _nothing, _nothing
    patch, each_step = FAULTS[name]
    undo = patch(stack)
    return each_step, undo if callable(undo) else _nothing
