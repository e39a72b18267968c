"""What SGLang's radix tree and scheduler hold, recorded from the real objects.

The free lists say what is free; SGLang's memory check counts the rest as held by a running
request or by the tree, and a leak is a page in neither. Without the tree's own record a dump
can only *derive* that set from the free lists, which hides exactly the leaks it should show.
`tree_state` reads it from the tree (`UnifiedRadixCache.all_values_flatten`, and the tree
core's SWA-resident walk: a tombstoned node keeps its full KV but no SWA; its walk of the
unlocked nodes, whose complement is the locked part; 0.5.13 - 0.5.16's tree has no core and
no walk: the same two read from its nodes' component records), from the running
requests (`kv.req_pool_idx`, `kv.kv_allocated_len`; a session's record holds its row too;
0.5.17 - 0.5.18 keep the row on the request and only the lengths in `req.kv`: `kv_record`),
from both allocators' free lists (in every release: `get_all_free_pages()` where it exists,
else `free_pages` plus the staged `release_pages`) and from the request pool's (`free_slots`).
With HiCache on, the tree's host KV pool (`HostKVCache`: its free list and size) and each
node's host value and host lock count are recorded too, and so are the SWA and Mamba host
pools of its `HostPoolGroup` with their components' host values.
`batch_state` adds the step's batch (a `ScheduleBatch` after its allocation), so
`capture_state` is a whole format-v1 dump's tensors and metadata.

The capture hook finds the tree by itself: `server.watch_tree_classes` wraps the `__init__`
of SGLang's radix cache classes as their modules load, so every tree built after registers
itself (weakly held) with `register_tree_cache`, and the hook reads it back with
`tree_for(req_to_token)` (through SGLang's `StreamingSession` where 0.5.13 - 0.5.21 wrap the
tree in one: the sessions are the wrapper's). A tree built before the hook was installed is
registered by calling `register_tree_cache` yourself. Every read is best effort: a renamed attribute
costs that fact, never the dump, and nothing here raises into SGLang. Importing costs only
the standard library; numpy and torch are imported when a state is read.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from kvcanary_cli.dump.schema import LAYOUT_KEY, RESERVED_PAGES_KEY, Layout

__all__ = [
    "METADATA_FACTS",
    "SCALAR_FACTS",
    "batch_state",
    "capture_state",
    "allocated_len",
    "free_slots",
    "kv_record",
    "radix_session_leaves",
    "register_tree_cache",
    "session_holders",
    "session_records",
    "session_slots",
    "tree_for",
    "tree_state",
    "virtual_slots",
    "walk_component_nodes",
]

logger = logging.getLogger("kvcanary.capture")

_TREES: list[weakref.ref[Any]] = []


def kv_record(req: Any) -> Any:
    """The object a request holds its KV by, one per holding (a request listed twice, or a
    session's record sharing it, is the same object): `req.kv` where it names the row
    (`req_pool_idx`, the Mamba slot), else the request itself (0.5.17 - 0.5.18: the row and
    Mamba slot are the request's, `req.kv` holds the lengths and is None once released)."""
    kv = getattr(req, "kv", req)
    return kv if kv is not None and hasattr(kv, "req_pool_idx") else req


def allocated_len(record: Any) -> int:
    """How many tokens of its row the holding `kv_record` gave has allocated (0: none)."""
    allocated: Any = getattr(record, "kv_allocated_len", None)
    if allocated is None:  # the request itself: its lengths in `req.kv` (None: released)
        allocated = getattr(getattr(record, "kv", None), "kv_allocated_len", 0)
    return int(allocated)


def session_slots(tree: Any) -> dict[Any, Any]:
    """The streaming sessions' slots a tree keeps, by session id (empty: none, or a tree
    without streaming sessions). Each slot keeps its session's KV record (the request pool
    row, the KV past the tree's part of it) and its prefix lock between turns. The slots are
    `StreamingSession.slots`: the tree's own `session` (`UnifiedRadixCache`, every release),
    or the tree itself where it is SGLang's wrapper around another cache (0.5.13 - 0.5.21's
    `StreamingSession(cache)`, whose own `inner` is that cache: `_wrapped`, the test
    `tree_for` makes too)."""
    holder = tree if _wrapped(tree) is not None else getattr(tree, "session", None)
    slots = getattr(holder, "slots", None)
    return slots if isinstance(slots, dict) else {}


def session_records(tree: Any) -> dict[Any, Any]:
    """Each streaming session's KV record (`kv_record`'s kind: it names the row), by session
    id: the tree's `session_records()` where it has one (0.5.22 on), else each slot's
    (0.5.19 - 0.5.21: its `kv`; 0.5.13 - 0.5.18: the slot itself, which names the row and
    its lengths, or holds them in `kv` from 0.5.16)."""
    records = getattr(tree, "session_records", None)
    if callable(records):
        return dict(records())
    return {sid: kv_record(slot) for sid, slot in session_slots(tree).items()}


def session_holders(tree: Any, requests: Iterable[Any]) -> list[Any]:
    """The records of `session_records` a running request does not stand for: on 0.5.13 -
    0.5.18 a turn copies its session's row onto itself and the slot keeps it too, so a
    record whose row a request of the same session holds is that request's (whose lengths
    are the current ones). Later releases lend the record itself (one object: the caller's
    identity test drops it)."""
    records = session_records(tree)
    if not records:
        return []
    borrowed = set()
    for req in requests:
        session = getattr(req, "session", None)
        row = getattr(kv_record(req), "req_pool_idx", None)
        if session is not None and row is not None:
            borrowed.add((getattr(session, "session_id", None), int(row)))
    return [
        kv
        for sid, kv in records.items()
        if kv.req_pool_idx is None or (sid, int(kv.req_pool_idx)) not in borrowed
    ]


def radix_session_leaves(tree: Any) -> dict[str, int]:
    """How many tree nodes each open radix session (`--enable-session-radix-cache`, 0.5.17
    on) has tagged, by session id, over the tree's components (empty: none, or a tree without
    radix sessions). A tag is no holder: the tagged node and its KV are the tree's, evictable
    (last) like any other, so the capture reads them as the tree's and counts nothing of its
    own for them. Read from the tree's `session_refs` (each component's `_session_leaves`),
    through SGLang's `StreamingSession` wrapper where one wraps the tree."""
    inner = _wrapped(tree)
    refs = getattr(tree if inner is None else inner, "session_refs", None)
    tagged: dict[str, int] = {}
    for component in getattr(refs, "components", ()):
        leaves = getattr(component, "_session_leaves", None)
        if not isinstance(leaves, dict):
            continue
        for session_id, nodes in leaves.items():
            if nodes:
                tagged[session_id] = tagged.get(session_id, 0) + len(nodes)
    return tagged


def register_tree_cache(tree: object) -> None:
    """Remember (weakly) a radix tree, so dumps of its pools record what it holds."""
    _TREES[:] = [ref for ref in _TREES if ref() is not None and ref() is not tree]
    try:
        _TREES.append(weakref.ref(tree))
    except TypeError:
        logger.debug("kvcanary: cannot hold a weak reference to %r", type(tree).__name__)


def tree_for(req_to_token: object) -> Any:
    """The registered tree whose ReqToTokenPool holds `req_to_token` (SGLang's tree and model
    runner share the pool), else None: another pool's tree is never recorded, since its
    slots would read as this pool's leaks.

    Where SGLang wrapped that tree in its `StreamingSession` (0.5.13 - 0.5.21, a cache
    without streaming sessions of its own: the scheduler's `tree_cache` is the wrapper), the
    wrapper: it keeps the sessions' slots (their rows, KV and prefix locks) and answers every
    other read from the cache inside, so the tree's record is the same and its sessions are
    not lost. A `UnifiedRadixCache`'s embedded one (its `session`) is never the tree."""
    found = None
    for tree in (ref() for ref in _TREES):
        pool = getattr(tree, "req_to_token_pool", None)
        if tree is None or getattr(pool, "req_to_token", None) is not req_to_token:
            continue
        inner = _wrapped(tree)
        if inner is None:
            found = tree if found is None else found
        elif getattr(inner, "session", None) is not tree:  # not a tree's own embedded one
            return tree
    return found


def _wrapped(tree: object) -> Any:
    """The cache a `StreamingSession` wraps (its own `inner`, never one it forwards to),
    else None."""
    own = getattr(tree, "__dict__", None)
    return own.get("inner") if isinstance(own, dict) else None


def _host(values: Any) -> Any:
    """A tensor, list or array as a flat int64 numpy array on the host: always a copy (a
    CPU tensor's numpy view would follow the server's later writes)."""
    import numpy as np

    detach = getattr(values, "detach", None)
    if callable(detach):
        values = detach().cpu().numpy()
    return np.array(values, dtype=np.int64, copy=True).reshape(-1)


def _pages_to_slots(pages: Any, page_size: int) -> Any:
    import numpy as np

    pages = _host(pages)
    if page_size > 1:
        offsets = np.arange(page_size, dtype=np.int64)
        pages = (pages[:, None] * page_size + offsets[None, :]).reshape(-1)
    return np.sort(pages)


def free_slots(allocator: object, page_size: int) -> Any:
    """One allocator's free slots (pages expanded), free and staged for release; None when
    it has no free list we know."""
    get_pages = getattr(allocator, "get_all_free_pages", None)
    if callable(get_pages):
        pages = get_pages()
        return None if pages is None else _pages_to_slots(pages, page_size)
    free = getattr(allocator, "free_pages", None)
    if free is None:
        return None
    staged = getattr(allocator, "release_pages", None)
    import numpy as np

    both = [_host(free)] + ([] if staged is None else [_host(staged)])
    return _pages_to_slots(np.concatenate(both), page_size)


def _tree_slots(tree: object) -> tuple[Any, Any, Any]:
    """(full slots the tree holds, the SWA-resident part, the locked part): None where
    unreadable. The locked part is what the core's walk of unlocked nodes (full lock count
    zero) leaves out of all it holds: both cores have that walk, neither a locked one (a
    tree without a core is walked by hand: `walk_component_nodes`)."""

    from kvcanary_cli.dump.tensor import difference

    held = resident = locked = None
    flatten = getattr(tree, "all_values_flatten", None)
    if callable(flatten):
        values = flatten()
        held = _host(values if values is not None else [])
    core = getattr(tree, "tree_core", tree)
    walk = getattr(core, "walk_for_kv_canary", None)
    if not callable(walk):  # a tree holding its component nodes itself (0.5.13 - 0.5.16)
        try:
            walked = walk_component_nodes(tree)
        except Exception as exc:
            logger.debug("kvcanary: the node walk failed (%s: %s)", type(exc).__name__, exc)
            walked = None
        if walked is not None:
            resident, unlocked = walked
            locked = None if held is None else difference(held, unlocked)
        return held, resident, locked
    try:
        result = walk(unlocked_only=False, swa_resident_only=True)
        resident = _host(result.slot_indices)
    except Exception as exc:  # a core without an SWA component
        logger.debug("kvcanary: the SWA walk failed (%s: %s)", type(exc).__name__, exc)
    if held is not None:
        try:
            unlocked = _host(walk(unlocked_only=True, swa_resident_only=False).slot_indices)
            locked = difference(held, unlocked)
        except Exception as exc:
            logger.debug("kvcanary: the lock walk failed (%s: %s)", type(exc).__name__, exc)
    return held, resident, locked


def _nodes_below(root: Any) -> Iterator[Any]:
    """Every node under `root` (not the root itself), depth first."""
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        yield node


def walk_component_nodes(tree: Any) -> tuple[Any, Any] | None:
    """(SWA-resident slots, unlocked slots) of a tree without `walk_for_kv_canary` whose nodes
    keep per-component records (`component_data`, indexed by the tree's `components`), as
    the later tree core's walk gives them: each node's FULL value below the root, where its
    SWA value is not None (every one without an SWA component), and where its FULL lock
    count is 0. None for a tree of another make."""
    import numpy as np

    kinds = {getattr(k, "name", None): k for k in getattr(tree, "components", None) or ()}
    root = getattr(tree, "root_node", None)
    full, swa = kinds.get("FULL"), kinds.get("SWA")
    if full is None or root is None or not hasattr(root, "component_data"):
        return None
    resident: list[Any] = []
    unlocked: list[Any] = []
    for node in _nodes_below(root):
        data = node.component_data
        value = data[full].value
        if value is None:
            continue
        values = _host(value)
        if swa is None or data[swa].value is not None:
            resident.append(values)
        if data[full].lock_ref == 0:
            unlocked.append(values)
    empty = np.zeros(0, dtype=np.int64)
    return (
        np.concatenate(resident) if resident else empty,
        np.concatenate(unlocked) if unlocked else empty,
    )


def host_state(tree: Any) -> dict[str, Any]:
    """A HiCache tree's host pools alone (`tree_state`'s host records, by the dump format's
    names): each pool's free list and size, its nodes' host values, `host_slots_accounted`
    where the tree vouches nothing else holds a host slot. Empty without a host tier."""
    facts: dict[str, Any] = {}
    _read(facts, _host_facts, tree)
    return facts


def tree_state(
    *,
    allocator: object,
    tree: object = None,
    requests: Iterable[object] | None = None,
    rows: int = 0,
    req_pool: object = None,
    waiting: Iterable[object] | None = None,
) -> dict[str, Any]:
    """The allocator's and the tree's bookkeeping, by the dump format's names.

    `requests` are the running requests (each holds its pool row up to `kv_allocated_len`;
    None: not known, so no row is recorded as held); `rows` the pool's row count, for
    `req_pool_allocated_lens` and `running_req_rows`. `req_pool` is the request pool: a
    `HybridReqToTokenPool` adds the Mamba layout's records (`waiting`: the requests waiting
    to run, which may hold a copy-on-write Mamba slot; None: not known, so no request's Mamba
    slot is recorded)."""
    facts: dict[str, Any] = {}
    _read(facts, _pool_facts, allocator)
    if tree is not None:
        _read(facts, _tree_facts, tree)
        _read(facts, _host_facts, tree)
    if rows > 0 and requests is not None:
        requests = list(requests)
        _read(facts, _row_facts, requests, rows, tree)
    if req_pool is not None:
        _read(facts, _mamba_facts, req_pool, tree, requests, waiting)
    return facts


def _mamba_facts(
    facts: dict[str, Any],
    pool: Any,
    tree: Any,
    requests: Iterable[object] | None,
    waiting: Iterable[object] | None,
) -> None:
    """The Mamba layout (`HybridReqToTokenPool`): the layout, the pool size, the row map (and
    ping-pong map), the Mamba free list, the tree's Mamba values and, where every live request
    is known (running and waiting), each one's Mamba slots. Nothing for another pool."""
    import numpy as np

    allocator = getattr(pool, "mamba_allocator", None)
    row_map = getattr(pool, "req_index_to_mamba_index_mapping", None)
    if allocator is None or row_map is None:
        return
    facts[LAYOUT_KEY] = Layout.MAMBA.value
    facts.pop("tree_swa_resident_slots", None)  # the core's SWA walk: no SWA side here
    facts["num_mamba_slots"] = int(allocator.size) + 1
    facts["req_index_to_mamba_index_mapping"] = _host(row_map)
    ping_pong = getattr(pool, "req_index_to_mamba_ping_pong_track_buffer_mapping", None)
    if ping_pong is not None:
        facts["req_index_to_mamba_ping_pong_track_buffer_mapping"] = (
            ping_pong.detach().cpu().numpy().astype(np.int64)
        )
    facts["free_mamba_slots"] = _host(allocator.free_slots)
    flatten = getattr(tree, "all_mamba_values_flatten", None)
    if callable(flatten):
        values = flatten()
        facts["tree_mamba_slots"] = _host(values if values is not None else [])
    if requests is None or waiting is None:
        return
    slots: list[int] = []
    rows: list[int] = []
    seen: set[int] = set()  # by identity: a request listed twice holds its slot once
    for req in [*requests, *waiting]:
        kv = kv_record(req)
        if id(kv) in seen:
            continue
        seen.add(id(kv))
        row = getattr(kv, "req_pool_idx", None)
        index = getattr(kv, "mamba_pool_idx", None)
        if index is not None:
            slots.append(int(index))
            rows.append(-1 if row is None else int(row))
        buffer = getattr(kv, "mamba_ping_pong_track_buffer", None)
        if buffer is not None:
            extra = [int(x) for x in _host(buffer) if int(x) >= 0]
            slots += extra
            rows += [-2] * len(extra)
    facts["req_mamba_slots"] = np.array(slots, dtype=np.int64)
    facts["req_mamba_rows"] = np.array(rows, dtype=np.int64)


def _host_pool(tree: Any) -> Any:
    """The tree's HiCache host KV pool: the anchor of 0.5.23's `HostPoolGroup` (the KV pool
    the Full component's host values index), or an older tree's single `HostKVCache`; None
    without HiCache, or for a pool whose free list is not `free_slots`."""
    controller = getattr(tree, "cache_controller", None)
    pool = getattr(controller, "mem_pool_host", None)
    if pool is None:
        pool = getattr(tree, "token_to_kv_pool_host", None)
    anchor = getattr(pool, "anchor_entry", None)
    if anchor is not None:
        pool = getattr(anchor, "host_pool", None)
    # its own free list only: a facade (`PageInterleaveHostPool`) allocates from a classed
    # allocator and answers `free_slots` from the native pool it wraps, a list no `alloc`
    # takes from; a shared-backing pool (unified memory's) keeps none
    own = getattr(pool, "__dict__", {})
    return pool if own.get("free_slots") is not None else None


#: The side pools of a `HostPoolGroup` recorded beside the anchor: each by its name in the
#: dump's records, the tree component whose nodes' host values index it, and the attribute
#: that component keeps the host pool it allocates from under (SGLang 0.5.23).
SIDE_HOST_POOLS: dict[str, tuple[str, str]] = {
    "swa": ("SWA", "_swa_kv_pool_host"),
    "mamba": ("MAMBA", "_mamba_pool_host"),
}


def _free_list(pool: Any) -> Any:
    """A host pool's free list: `free_slots`, then the chunks `free` staged in
    `release_slots`, read under the pool's own lock (a merge in between would list a slot
    twice); None while another thread holds the pool for over a second."""
    import numpy as np

    lock = getattr(pool, "lock", None)
    if lock is not None and not lock.acquire(timeout=1.0):
        return None  # another thread holds the pool: no consistent free list now
    try:
        chunks = [_host(pool.free_slots)]
        chunks += [_host(chunk) for chunk in list(getattr(pool, "release_slots", None) or [])]
    finally:
        if lock is not None:
            lock.release()
    return np.concatenate(chunks)


def _pool_size(pool: Any) -> int:
    size = getattr(pool, "logical_size", None)
    return int(size if size is not None else pool.size)


def _host_facts(facts: dict[str, Any], tree: Any) -> None:
    """HiCache's host pool (`HostKVCache`): its size (`logical_size`), its free list and each
    tree node's host value with its node id and host lock count (the Python tree core's
    nodes; the Rust core keeps them out of reach); then the same of each side pool of the
    group (`SIDE_HOST_POOLS`). Nothing without HiCache."""
    pool = _host_pool(tree)
    if pool is None or not _host_pool_facts(facts, tree, pool, "FULL", ""):
        return
    for name, (kind, attribute) in SIDE_HOST_POOLS.items():
        _read(facts, _side_host_facts, tree, pool, name, kind, attribute)
    if "tree_host_slots" in facts:
        _read(facts, _accounted_facts, tree)


def _host_pool_facts(facts: dict[str, Any], tree: Any, pool: Any, kind: str, prefix: str) -> bool:
    """A host pool's free list and size, and the `kind` host values of the tree's nodes,
    under `<prefix>host_free_slots`, `num_<prefix>host_slots` and `tree_<prefix>host_*`;
    False (nothing recorded) where the pool keeps no readable free list."""
    free = _free_list(pool)
    if free is None:
        return False
    facts[f"{prefix}host_free_slots"] = free
    facts[f"num_{prefix}host_slots"] = _pool_size(pool)
    held = _tree_host_values(tree, kind)
    if held is not None:
        for what, values in zip(("slots", "nodes", "lock_refs"), held, strict=True):
            facts[f"tree_{prefix}host_{what}"] = values
    return True


def _accounted_facts(facts: dict[str, Any], tree: Any) -> None:
    """`host_slots_accounted` = 1 where nothing but the free lists and the tree's nodes can
    hold a host slot now (SGLang 0.5.19 - 0.5.23's `UnifiedRadixCache`): a backup's slots
    are its node's from `commit_backup` on and a load-back reads its node's, so only a
    storage tier holding slots in flight (`_storage_holds_no_host_slot`), pages queued for
    release, buffer-only host memory (its staging), disaggregated decode (retraction
    backups and host receives held by requests in its queues), a KV-sharded group
    (`_host_pool_whole`) or an external linker could hold one elsewhere. Each must be seen
    absent or idle, and the read made in the main thread (SGLang's scheduler's: another
    thread could catch a backup between its `alloc` and its `commit_backup`); anything
    unread leaves the fact out, and with it the leak check.

    0.5.22 has the same holders, read through the same objects (its host pools, the
    controller's backup, load and storage paths and their queues, the tree's in-flight
    records are 0.5.23's), but for the sharded group, which it does not have at all: only
    its flag differs (`_host_pool_whole`).

    0.5.19, 0.5.20 and 0.5.21 have them too, in the same objects. Their controller's `write`
    allocates a backup's host slots and the tree commits them to the node in the same call;
    a load-back reads its node's host slots, under the node's host lock; a host eviction
    frees a node's slots to its pool or queues them for release. They differ from 0.5.22
    only in who allocates a storage hit's host slots, not in where they wait: their tree
    takes them from the pool itself (in the step that drains the controller's hit queue;
    0.5.22 asks the controller's `allocate_storage_hit`), and in that same call hands them
    to the operation queued for the read (`prefetch_buffer`) and to the request's in-flight
    prefetch record (`host_indices`), or queues them for release where a component's staging
    fails. A component's staging (SWA window, Mamba state) sits in that record's transfers,
    allocated when the prefetch is issued (0.5.19) or when its hit is (0.5.20 on). 0.5.19 and
    0.5.20 have no pipeline-parallel prefetch (no such thread or state on the controller).
    Retraction backups are disaggregated decode's in each, and none has a host pool sharded
    across ranks (0.5.21's page interleaving is the device pool's, and no server flag turns
    it on).

    Older trees (0.5.18 and before) keep no buffer pipeline, linker or release queues, so
    where a host slot of theirs waits is not read here: `_holders_known` refuses them."""
    import sys
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    controller = tree.cache_controller
    if not _holders_known(tree, controller):
        return
    side = [name for name in SIDE_HOST_POOLS if f"{name}_host_free_slots" in facts]
    if any(f"tree_{name}_host_slots" not in facts for name in side):
        return  # a side pool's holders unread
    if getattr(tree, "host_pool_group", None) is not controller.mem_pool_host:
        return  # not the tree this reading knows
    if controller.enable_storage is not False or tree.enable_storage is not False:
        if not _storage_holds_no_host_slot(tree, controller):
            return
    elif tree.ongoing_prefetch or tree.ongoing_backup:
        return
    if tree.buffer_pipeline is not None or tree.host_memory_mode == "buffer_only":
        return
    if tree.linker is not None or not _host_pool_whole(controller):
        return
    queues = [controller.host_mem_release_queue, *controller.extra_host_mem_release_queues.values()]
    if any(queue is not None and not queue.empty() for queue in queues):
        return
    context = sys.modules.get("sglang.srt.runtime_context")
    if context is None or context.get_disagg().disaggregation_mode != "null":
        return
    facts["host_slots_accounted"] = 1


#: What `_accounted_facts` reads on the tree and on its cache controller, beside the host
#: pools and the storage tier: a tree or controller missing any (0.5.18 and older keep no
#: buffer pipeline, linker, host memory mode or release queues) is not one it knows.
_TREE_HOLDERS = (
    "host_pool_group",
    "enable_storage",
    "ongoing_prefetch",
    "ongoing_backup",
    "buffer_pipeline",
    "host_memory_mode",
    "linker",
)
_CONTROLLER_HOLDERS = (
    "mem_pool_host",
    "enable_storage",
    "host_mem_release_queue",
    "extra_host_mem_release_queues",
)


def _holders_known(tree: Any, controller: Any) -> bool:
    """Whether the tree and its controller have every object `_accounted_facts` reads (a
    release whose holders it has read: 0.5.19 on), each by its name."""
    return all(hasattr(tree, name) for name in _TREE_HOLDERS) and all(
        hasattr(controller, name) for name in _CONTROLLER_HOLDERS
    )


def _host_pool_whole(controller: Any) -> bool:
    """Whether every host KV slot of this rank is one slot of its own pool, not a share of a
    page interleaved across the ranks (whose rows another rank's owner holds). 0.5.23's
    controller says so (`is_kv_sharded` False: its anchor is no `PageInterleaveHostPool`).
    A controller without the flag is of a release without a sharded host pool to flag
    (0.5.19 - 0.5.22: no page-interleaved host pool class at all, and 0.5.22's server
    refuses `--enable-kv-cache-sharding` with the host tier: HiCache backs up and loads
    whole pages), so its pool is whole. (A sharded anchor keeps no free list of its own
    either, so `_host_pool` records none of its slots.)"""
    if hasattr(controller, "is_kv_sharded"):
        return controller.is_kv_sharded is False
    return True


#: The storage tier's threads on SGLang 0.5.23's cache controller (and the ticket thread of a
#: pipeline-parallel one): while any runs, a read cannot see what it holds in its hands.
_STORAGE_THREADS = (
    "prefetch_thread",
    "prefetch_io_aux_thread",
    "prefetch_sync_thread",
    "backup_thread",
    "pp_prefetch_command_thread",
)
#: the one storage thread a controller builds only under pipeline parallelism (0.5.21 on;
#: 0.5.19's and 0.5.20's have no pipeline-parallel prefetch, nor this thread or its state)
_PP_THREAD = "pp_prefetch_command_thread"
#: The controller's queues whose items carry a prefetch's host slots: its reads queued, their
#: acks on the way (an ack of a revoked prefetch releases the slots it did not fill).
_PREFETCH_SLOT_QUEUES = ("prefetch_buffer", "prefetch_sync_queue", "ack_prefetch_queue")


def _storage_holds_no_host_slot(tree: Any, controller: Any) -> bool:
    """Whether a storage tier (SGLang 0.5.23's, and 0.5.19 - 0.5.22's: the same threads,
    queues and in-flight prefetch records, but for the pipeline-parallel prefetch 0.5.19 and
    0.5.20 do not have) holds no host slot outside the free lists and the nodes now:
    none of its threads running (stopped, or stepped by the caller in this thread, as soak
    does), no prefetch in flight with host slots (its Full KV staging or a component's), no
    read or ack queued, no pipeline-parallel prefetch state. A backup to storage reads its
    node's own host slots, under its node's host lock: it may be in flight. Anything unread
    (a thread or queue of the tier missing) answers False."""
    for name in _STORAGE_THREADS:
        thread = getattr(controller, name, None)
        if thread is None and name != _PP_THREAD:
            return False  # a tier without its threads: not one this reading knows
        if thread is not None and thread.is_alive():
            return False
    for name in _PREFETCH_SLOT_QUEUES:
        queue = getattr(controller, name, None)
        if queue is None or not queue.empty():
            return False
    if getattr(controller, "pp_prefetch_states", None):
        return False
    for info in tree.ongoing_prefetch.values():
        if info.host_indices is not None:
            return False
        for transfers in info.comp_xfers.values():
            if any(transfer.host_indices is not None for transfer in transfers):
                return False
    return True


def _side_host_facts(
    facts: dict[str, Any], tree: Any, anchor: Any, name: str, kind: str, attribute: str
) -> None:
    """One side pool of the group (the host pool the `kind` component allocates its host
    values from), as `_host_facts` records the anchor, its keys prefixed `<name>_`. Nothing
    where the tree has no such component or host pool, where that pool is the anchor itself,
    or keeps no free list of its own (a shared backing's)."""
    component = next(
        (c for k, c in (getattr(tree, "components", None) or {}).items() if k.name == kind),
        None,
    )
    pool = getattr(component, attribute, None)
    if pool is None or pool is anchor or getattr(pool, "__dict__", {}).get("free_slots") is None:
        return
    _host_pool_facts(facts, tree, pool, kind, f"{name}_")


def _tree_host_values(tree: Any, kind: str) -> tuple[Any, Any, Any] | None:
    """(host slots, their node ids, their nodes' host lock counts), node after node, from the
    `kind` component's data of each node (`component_data[kind].host_value`,
    `host_lock_ref`), or an older tree's `host_value` and `host_ref_counter` (Full only);
    None where no node is reachable or the tree has no such component."""
    import numpy as np

    core = getattr(tree, "tree_core", tree)
    try:
        root = getattr(core, "root_node", None)
    except NotImplementedError:  # the Rust core's adapter: no Python nodes to walk
        return None
    if root is None:
        return None
    component = next((k for k in getattr(tree, "components", None) or () if k.name == kind), None)
    if component is None and kind != "FULL":
        return None  # an older tree's node holds its Full host value only
    slots: list[Any] = []
    nodes: list[int] = []
    locks: list[int] = []
    for node in _nodes_below(root):
        data = node.component_data[component] if component is not None else node
        value = getattr(data, "host_value", None)
        if value is None:
            continue
        values = _host(value)
        lock = getattr(data, "host_lock_ref", getattr(data, "host_ref_counter", 0))
        slots.append(values)
        nodes += [int(node.id)] * values.size
        locks += [int(lock)] * values.size
    empty = np.zeros(0, dtype=np.int64)
    return (
        np.concatenate(slots) if slots else empty,
        np.array(nodes, dtype=np.int64),
        np.array(locks, dtype=np.int64),
    )


def _read(facts: dict[str, Any], read: Any, *args: Any) -> Any:
    """One group of facts, best effort: a changed object costs these facts only."""
    try:
        return read(facts, *args)
    except Exception as exc:  # a changed allocator or tree must not cost the dump
        logger.debug("kvcanary: %s failed (%s: %s)", read.__name__, type(exc).__name__, exc)
        return None


#: Metadata keys of decode context parallel: its size, and the per-rank page it widens
#: (`page_size` is the allocator's page, `pool page × dcp_size`, what the ids are paged in).
DCP_SIZE_KEY = "dcp_size"
DCP_POOL_PAGE_KEY = "dcp_pool_page_size"
#: What `tree_state` records as scalars (`capture_state` writes them as metadata integers).
SCALAR_FACTS = (
    "page_size",
    "num_full_slots",
    "num_swa_slots",
    "num_mamba_slots",
    "num_host_slots",
    *(f"num_{name}_host_slots" for name in SIDE_HOST_POOLS),
    "host_slots_accounted",
)
#: What `tree_state` records as metadata strings, not tensors.
METADATA_FACTS = (LAYOUT_KEY, RESERVED_PAGES_KEY, DCP_SIZE_KEY, DCP_POOL_PAGE_KEY)


def _dcp_size() -> int:
    """The serving process's decode-context-parallel size (SGLang's `get_parallel()`,
    0.5.23), 1 when it is off or unknown; never imports SGLang."""
    import sys

    context = sys.modules.get("sglang.srt.runtime_context")
    try:
        size = int(getattr(context.get_parallel(), "attn_dcp_size", 1) or 1)  # type: ignore[union-attr]
    except Exception:  # no context published (a tool, a test), or another release
        return 1
    return max(1, size)


def _pool_facts(facts: dict[str, Any], allocator: Any) -> int:
    page = int(getattr(allocator, "page_size", 1) or 1)
    facts["page_size"] = page
    dcp = _dcp_size()
    if dcp > 1 and page % dcp == 0:  # DCP widens the allocator's pages: both recorded
        facts[DCP_SIZE_KEY] = dcp
        facts[DCP_POOL_PAGE_KEY] = page // dcp
    if _unified_facts(facts, allocator, page):
        return page
    full = getattr(allocator, "_size_full", None) or getattr(allocator, "size", None)
    reserved = _reserved_pages(getattr(allocator, "full_attn_allocator", allocator))
    if reserved > 1:
        facts[RESERVED_PAGES_KEY] = reserved
    if full is not None:
        facts["num_full_slots"] = int(full) + reserved * page
    swa = getattr(allocator, "_size_swa", None)
    if swa is not None:
        facts["num_swa_slots"] = int(swa) + page
    for name, sub in (
        ("free_full_slots", getattr(allocator, "full_attn_allocator", allocator)),
        ("free_swa_slots", getattr(allocator, "swa_attn_allocator", None)),
    ):
        if sub is not None:
            free = free_slots(sub, page)
            if free is not None:
                facts[name] = free
    return page


def _reserved_pages(allocator: object) -> int:
    """Pages no request may hold: page 0, or a page-interleave allocator's `shard_size`
    (`PageInterleavePoolAllocator`: logical pages `0 .. shard_size - 1` are every rank's
    physical page 0, and its ids reach `size + shard_size * page_size`)."""
    shard = getattr(allocator, "shard_size", None)
    if shard is None or not hasattr(allocator, "class_free_pages"):
        return 1
    return max(1, int(shard))


def virtual_slots(allocator: object, page: int) -> int | None:
    """The virtual id space in slots of a unified allocator (host attributes only: the
    guard reads it every launch), None for any other: what its ids are bounded by, not the
    physical pool's `_size_full`."""
    full = getattr(allocator, "full_attn_allocator", None)
    pages = getattr(full, "num_virtual_ids", None)
    if pages is None or not hasattr(full, "free_virtual_ids"):
        return None
    return int(pages) * page


def _unified_facts(facts: dict[str, Any], allocator: Any, page: int) -> bool:
    """Unified memory (`UnifiedSWATokenToKVPoolAllocator`): `req_to_token`, the tree and the
    free list hold virtual ids, minted by the full side's `MultiEndedAllocator` over its
    `num_virtual_ids` pages; each side binds them through its own page tables. Recorded: the
    layout, the virtual id space as `num_full_slots`, the virtual free list as
    `free_full_slots`, both sides' tables and compaction holes, and the SWA side's
    virtual->physical table read as the LUT it replaces (slots of a page unbound on the SWA
    side map to 0). False (nothing recorded) for any other allocator."""
    import numpy as np

    full: Any = getattr(allocator, "full_attn_allocator", None)
    swa: Any = getattr(allocator, "swa_attn_allocator", None)
    if getattr(full, "virtual_to_physical", None) is None or not hasattr(full, "free_virtual_ids"):
        return False
    facts[LAYOUT_KEY] = Layout.UNIFIED_SWA.value
    facts["num_full_slots"] = virtual_slots(allocator, page)
    facts["free_full_slots"] = _pages_to_slots(full.free_virtual_ids, page)
    for side, sub in (("full", full), ("swa", swa)):
        if sub is None:
            continue
        facts[f"{side}_virtual_to_physical"] = _host(sub.virtual_to_physical)
        facts[f"{side}_physical_to_virtual"] = _host(sub.physical_to_virtual)
        holes = getattr(sub, "_free_phys_pages", None)
        if holes is not None:
            facts[f"{side}_physical_holes"] = np.sort(_host(holes))
    if swa is not None:
        facts["full_to_swa_index_mapping"] = _lut_of(_host(swa.virtual_to_physical), page)
    return True


def _lut_of(v2p: Any, page: int) -> Any:
    """The full->SWA LUT a page table stands for: slot `v*page + o` maps to `p*page + o` where
    virtual page `v` is bound to physical page `p > 0`, else 0; the trailing -1 kept."""
    import numpy as np

    pages = v2p[:-1]
    offsets = np.arange(page, dtype=np.int64)
    bound = np.where(pages > 0, pages, 0)
    lut = (bound[:, None] * page + offsets[None, :]) * (pages > 0)[:, None]
    return np.concatenate([lut.reshape(-1), np.array([-1], dtype=np.int64)])


def inflight_tree_locks(tree: Any) -> list[tuple[Any, Any]]:
    """The locks a HiCache tree (SGLang's `UnifiedRadixCache` with its controller) holds for
    its own transfers in flight, as (anchor node id, receipt): a write-through backup's
    (`ongoing_write_through`: node, receipt, nodes to publish; no receipt where the backup
    took no lock, write-back's), held until its ack, and a load-back's device lock
    (`ongoing_load_back`: node, receipt, host receipt), held until its ack. No request holds
    them: their nodes may be locked with no running request (at idle too, until the next
    step's poll). Empty for another tree."""
    held: list[tuple[Any, Any]] = []
    for attribute in ("ongoing_write_through", "ongoing_load_back"):
        pending = getattr(tree, attribute, None)
        if not isinstance(pending, dict):
            continue
        for entry in list(pending.values()):
            if isinstance(entry, tuple) and len(entry) >= 2 and entry[1] is not None:
                held.append((entry[0], entry[1]))
    return held


def inflight_locked_slots(tree: Any) -> Any:
    """The full slots on the paths the tree's in-flight transfer locks pin
    (`inflight_tree_locks`: a FULL lock reaches from its node to the root), read by the
    tree's own call (`path_device_indices`, or the core's `collect_full_device_indices` up to
    the root where the tree has no such call); None where there
    is none, or a path cannot be read (then every locked slot may be theirs)."""
    import numpy as np

    locks = inflight_tree_locks(tree)
    if not locks:
        return None
    paths = getattr(tree, "path_device_indices", None)
    core = getattr(tree, "tree_core", None)
    collect = getattr(core, "collect_full_device_indices", None)
    root = getattr(tree, "root_node_handle", None)
    if not callable(paths) and callable(collect) and callable(root):
        # before `path_device_indices` (0.5.21 and older): the core's own walk it wraps
        def paths(node: Any) -> Any:
            return collect(node, root())

    elif not callable(paths) and hasattr(locks[0][0], "parent"):
        # a tree without a core (0.5.13 - 0.5.16) names the node itself: up its parents
        def paths(node: Any) -> Any:
            return _full_path(tree, node)

    if not callable(paths):
        return None
    try:
        return np.concatenate([_host(paths(node)) for node, _ in locks])
    except Exception as exc:
        logger.debug("kvcanary: an in-flight lock's path (%s: %s)", type(exc).__name__, exc)
        return None


def _full_path(tree: Any, node: Any) -> Any:
    """The FULL values from `node` up to the root of a tree whose nodes keep per-component
    records (`component_data`, indexed by the tree's `components`)."""
    import numpy as np

    full = next(k for k in tree.components if getattr(k, "name", None) == "FULL")
    values = []
    while node is not None and node is not tree.root_node:
        value = node.component_data[full].value
        if value is not None:
            values.append(_host(value))
        node = node.parent
    return np.concatenate(values) if values else np.zeros(0, dtype=np.int64)


def _tree_facts(facts: dict[str, Any], tree: Any) -> None:
    import numpy as np

    from kvcanary_cli.dump.tensor import difference

    held, resident, locked = _tree_slots(tree)
    if locked is not None and inflight_tree_locks(tree):
        # a node the tree locks for a transfer in flight is no request's: its slots left out
        # of the locked part (a request's lock on the same path gets the benefit of the
        # doubt); paths it cannot read leave the locks unrecorded (their check says it did
        # not run), never recorded as none
        pinned = inflight_locked_slots(tree)
        locked = None if pinned is None else difference(locked, pinned)
    if held is not None:
        facts["tree_full_slots"] = np.sort(held)
    if resident is not None:
        facts["tree_swa_resident_slots"] = np.sort(resident)
    if locked is not None:
        facts["tree_locked_full_slots"] = locked


def _row_facts(facts: dict[str, Any], requests: Iterable[object], rows: int, tree: Any) -> None:
    """The rows held and each one's longest allocation: the requests' and the streaming
    sessions' (a session keeps its row, and its KV up to its allocated length, between its
    turns: `session_holders`)."""
    import numpy as np

    requests = list(requests)
    lens = np.zeros(rows, dtype=np.int64)
    holders: dict[int, Any] = {}  # by identity: a request on a session's record shares its kv
    for req in requests:
        kv = kv_record(req)
        holders[id(kv)] = kv
    for kv in session_holders(tree, requests):
        holders[id(kv)] = kv
    longest: dict[int, int] = {}  # a row's longest allocation (never below 0)
    for kv in holders.values():
        row = getattr(kv, "req_pool_idx", None)
        if row is not None and 0 <= int(row) < rows:
            allocated = allocated_len(kv)
            if allocated > longest.get(int(row), 0):
                longest[int(row)] = allocated
    if longest:  # at once (a handful of rows: no ufunc.at)
        lens[list(longest)] = list(longest.values())
    facts["req_pool_allocated_lens"] = lens
    held = [getattr(kv, "req_pool_idx", None) for kv in holders.values()]
    facts["running_req_rows"] = np.array([int(r) for r in held if r is not None], dtype=np.int64)


def batch_state(batch: Any) -> dict[str, Any]:
    """The planner inputs of a `ScheduleBatch` after its allocation (extend: prefix and
    extend lengths; decode: the new token's position and 1), and its writes."""
    import numpy as np

    facts: dict[str, Any] = {}
    indices = _host(batch.req_pool_indices)
    facts["req_pool_indices"] = indices
    mode = getattr(batch, "forward_mode", None)
    extend = bool(getattr(mode, "is_extend", lambda: False)())
    if extend:
        facts["prefix_lens"] = _host(batch.prefix_lens)
        facts["extend_seq_lens"] = _host(batch.extend_lens)
    else:
        facts["prefix_lens"] = _host(batch.seq_lens) - 1
        facts["extend_seq_lens"] = np.ones(indices.size, dtype=np.int64)
    out = getattr(batch, "out_cache_loc", None)
    if out is not None:
        facts["out_cache_loc"] = _host(out)
    facts["forward_mode"] = "extend" if extend else "decode"
    return facts


def capture_state(
    *,
    req_to_token_pool: Any,
    allocator: object,
    tree: object = None,
    batch: object = None,
    requests: Iterable[object] | None = None,
    window: int | None = None,
    waiting: Iterable[object] | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """A whole dump of the stack (tensors, metadata): the batch's planner inputs (an idle
    dump has an empty batch), the LUT, both free lists and the request pool's, the tree's
    slots, the running requests' rows and allocated lengths (`requests` None: not known, not
    recorded), and the Mamba layout's records (`waiting`: see `tree_state`). Best effort,
    like every capture read."""
    import numpy as np

    table = _host(req_to_token_pool.req_to_token)
    shape = tuple(req_to_token_pool.req_to_token.shape)
    tensors: dict[str, Any] = {"req_to_token": table.reshape(shape).astype(np.int32)}
    metadata: dict[str, str] = {}
    if batch is not None:
        facts = batch_state(batch)
        metadata["forward_mode"] = str(facts.pop("forward_mode"))
        tensors.update(facts)
    else:
        empty = np.zeros(0, dtype=np.int64)
        tensors.update(req_pool_indices=empty, prefix_lens=empty, extend_seq_lens=empty)
        metadata["forward_mode"] = "idle"
    lut = getattr(allocator, "full_to_swa_index_mapping", None)
    if lut is not None:
        tensors["full_to_swa_index_mapping"] = _host(lut)
    if window is not None:
        metadata["swa_window_size"] = str(int(window))
    free_rows = getattr(req_to_token_pool, "free_slots", None)
    if free_rows is not None:
        tensors["free_req_rows"] = _host(free_rows)
    state = tree_state(
        allocator=allocator,
        tree=tree,
        requests=requests,
        rows=shape[0],
        req_pool=req_to_token_pool,
        waiting=waiting,
    )
    for name in SCALAR_FACTS:
        if name in state:
            metadata[name] = str(int(state.pop(name)))
    for key in METADATA_FACTS:  # metadata strings, not tensors
        if key in state:
            metadata[key] = str(state.pop(key))
    tensors.update(state)
    return tensors, metadata
