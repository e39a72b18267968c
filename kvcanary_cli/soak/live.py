"""The in-process audit: SGLang's live objects read each step and held to the exact accounting
a correct state keeps; the whole `check` runs only where that accounting breaks.

Why this is sound (a state passed here is one `check` passes too): `check`'s error findings
are each the breach of a bookkeeping fact about the recorded state, and every fact below is
that fact or a stricter one, read from the same objects the dump would record:

- slot spaces (full, SWA) and the request pool's rows are each *exactly* partitioned: free,
  or held (full: the tree, or a running request's or streaming session's row up to its
  allocated length; SWA: the LUT's image; rows: a running request or a session), nothing
  twice, nothing outside the domain the pools had when built, page 0 never (leaks, double
  frees, free-and-held, reserved slots, slots out of range, duplicate free entries: all
  breaches of the partition);
- a full slot in two rows is the tree's and at the same position in both (shared without a
  prefix, shared across positions, duplicates in a row); a locked tree slot lies in a held
  row (a running request's, or a streaming session's, which keeps its row, its KV up to its
  allocated length and its prefix lock between turns), at idle a session's only (lock leaks);
- stricter than `check` (a dump records no lock counts): each tree node's lock counts are the
  running requests' and the streaming sessions' locks through it (`lock_reader`); a count
  above them is reported as `check`'s lock leak, at the step it happens;
- the LUT keeps its built length and tail, maps a free or tombstoned slot and page 0 to 0,
  every other held full slot to an SWA slot of its own, a page to a page in lockstep (stale
  mappings, collisions, shared owners, lockstep, free-and-mapped, sentinel, length);
- unified memory (virtual ids): each side's two page tables name each other (every bound
  virtual page one physical page, no physical page behind two), keep their built sizes, sink
  and sentinel and one id space; a virtual page is bound on the full side exactly when it is
  not on the virtual free list, and bound on the SWA side only where the full side binds it
  (free-and-bound, unbound, shared physical pages, wrong-sized tables); each side's
  lazy-compaction free list (`physical_holes`) holds pages of that side, each once, none bound
  (a -1 there is a tombstone freed again); the LUT the SWA table stands for maps each SWA slot
  once;
- the batch: rows running and distinct, lengths inside the row's allocation, `out_cache_loc`
  exactly the row's cells it extends, none of them the tree's, every cell of the window the
  step reads mapped (writes to live slots, unmapped window cells, corrupt metadata); the plan
  and its kernel limits are functions of these lengths and the window, and `check` has passed
  them once per history for a batch at least as long (`_planned`), else it runs.

Each fact is checked on the whole state every audit, not only where the step changed it: on
pools of soak's size the whole is a few dozen numpy calls, and a narrower read could miss a
write a faulty SGLang makes where it should not (the faults soak looks for). For the same
reason nothing is cached between audits: no hook on the tree's insert, split or evict (a
faulty SGLang changes a node elsewhere, or frees a slot the tree keeps) and no fingerprint of
a pool (SGLang keeps no change counter; one that could miss a change would pass a state
unseen). One thing is kept: the full slots of a held lock's path on the Rust core (read once
per lock object; a locked path keeps its slots, and where a fault changes them anyway the
locked slots stop matching). Where a fact does not hold the audit falls back to the whole
`check` on a recorded dump, so its findings are `check`'s own; a fact stricter than `check`
costs only that fallback (counted), but for a lock count above its locks, a lock leak.

What is read is what the dump would record, by cheaper routes (`Readers`): the Python tree
core walked once over the fields SGLang's own walks read, the Rust core by its own calls, the
free lists by the allocators' own census unsorted, the requests' rows and the batch by
attribute (the batch's tensors as views: read at once, never kept); the rest by
`capture.tree`'s readers. A reader that fails marks the state unreadable, which breaks it
(the whole `check` runs).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from kvcanary_cli.analysis.mamba import track_map_mismatches
from kvcanary_cli.capture.tree import (
    allocated_len,
    host_state,
    inflight_locked_slots,
    kv_record,
    session_holders,
    session_slots,
    tree_state,
)
from kvcanary_cli.dump.schema import HOST_POOL_PREFIXES
from kvcanary_cli.dump.tensor import difference, distinct
from kvcanary_cli.soak.calls import held_lock, skipped_components, swa_boundary
from kvcanary_cli.soak.hicache import inflight_locks

__all__ = [
    "FreeReader",
    "LiveAudit",
    "LiveState",
    "Readers",
    "TreeReader",
    "free_reader",
    "read_state",
    "tree_reader",
]


@dataclass
class LiveState:
    """What one audit reads from the objects (host int64 arrays)."""

    table: np.ndarray
    lut: np.ndarray | None
    free_full: np.ndarray
    free_swa: np.ndarray | None
    tree: np.ndarray
    resident: np.ndarray | None
    locked: np.ndarray | None
    #: the tree's unlocked slots, where a reader gives them instead of `locked` (the
    #: locked part is then the held slots not among them)
    unlocked: np.ndarray | None
    alloc_lens: np.ndarray
    running_rows: np.ndarray
    free_rows: np.ndarray
    batch: dict[str, Any] | None
    #: the Mamba layout's records by their dump names (None: another layout)
    mamba: dict[str, np.ndarray] | None = None
    #: unified memory's page tables by their dump names (None: another layout)
    tables: dict[str, np.ndarray] | None = None
    #: per component the tree has, each locked node's lock count (node id -> count; the
    #: Python core), and what the running requests' locks make them (`lock_expected`); the
    #: Rust core keeps its counts: `lock_expected` is then the full slots their locks cover
    #: (None: not read)
    lock_counts: list[dict[int, int]] | None = None
    lock_expected: list[Counter[int]] | np.ndarray | None = None
    #: the host tier's records by their dump names (None: no host tier)
    host: dict[str, np.ndarray] | None = None
    #: the full slots on the paths the tree's own in-flight transfer locks pin (a
    #: write-through's, a load-back's: `soak.hicache`), which lie in no running row
    pinned: np.ndarray | None = None
    #: a fact that could not be read (None: all were)
    unread: str | None = None


def read_state(
    scheduler: Any, batch: Any, requests: list[Any], readers: Readers | None = None
) -> LiveState:
    """The live state: the free lists and the tree by `readers` where it has them (and then
    the rows by `_rows_of`), the batch by `_batch_of`, the rest (and what `readers` has not)
    by the capture code's own readers."""
    stack = scheduler.stack
    pool = stack.req_to_token_pool
    table = pool.req_to_token.numpy()
    own = readers or Readers()
    rows = table.shape[0]
    unread = None
    mamba = getattr(pool, "mamba_allocator", None) is not None
    captured = own.free is None or own.tree is None or mamba
    if captured:
        facts = tree_state(
            allocator=stack.allocator,
            # the Mamba layout's records come with the tree's (its Mamba values)
            tree=stack.tree if own.tree is None or mamba else None,
            requests=requests,
            rows=rows,
            req_pool=pool,
            waiting=scheduler.waiting,
        )
        if own.tree is not None and not mamba:
            # the tree not read here (its reader reads it): the rows, with the tree's
            # streaming sessions' (which `tree_state` reads from the tree it is given)
            try:
                facts[_LENS], facts[_RUNNING] = _rows_of(requests, rows, stack.tree)
            except Exception as exc:  # a request this reader cannot read: `broken` says so
                unread = f"the requests' rows: {type(exc).__name__}"
    else:
        facts = {}
        try:
            facts[_LENS], facts[_RUNNING] = _rows_of(requests, rows, stack.tree)
        except Exception as exc:  # a request this reader cannot read: `broken` says so
            unread = f"the requests' rows: {type(exc).__name__}"
    empty = _NONE
    free_full, free_swa = facts.get("free_full_slots", empty), facts.get("free_swa_slots")
    if own.free is not None:
        try:
            free_full, free_swa = own.free()
        except Exception as exc:  # a free list this reader cannot read: `broken` says so
            unread, free_full, free_swa = f"free lists: {type(exc).__name__}", empty, None
    held = facts.get("tree_full_slots")
    resident, locked = facts.get("tree_swa_resident_slots"), facts.get("tree_locked_full_slots")
    unlocked = counts = expected = None
    if own.tree is not None:
        try:
            held, resident, locked, unlocked, counts = own.tree()
        except Exception as exc:  # a tree this reader cannot read: `broken` says so
            unread, held, resident, locked = f"tree: {type(exc).__name__}", None, None, None
    pinned = None
    inflight = inflight_locks(stack.tree) if own.hicache else []
    if inflight:
        # the tree's own transfer locks pin their paths: those slots need no running row
        pinned = inflight_locked_slots(stack.tree)
        if pinned is None:
            unread = "an in-flight transfer lock's path"
    if own.locks is not None:
        try:
            # a streaming session's slot holds its prefix lock between turns
            sessions = session_slots(stack.tree).values()
            expected = own.locks([*requests, *inflight, *sessions])
        except Exception as exc:  # a lock this reader cannot follow: `broken` says so
            unread = f"the requests' locks: {type(exc).__name__}"
    host = None
    if own.hicache:
        try:
            host = {k: np.asarray(v) for k, v in host_state(stack.tree).items()}
        except Exception as exc:  # a host pool this reader cannot read: `broken` says so
            unread = f"the host pools: {type(exc).__name__}"
    lut = getattr(stack.allocator, "full_to_swa_index_mapping", None)
    tables = (
        ({k: facts[k] for k in (*_TABLES, *_HOLES) if k in facts} or None) if captured else None
    )
    lens = facts.get(_LENS)
    if batch is not None:
        try:
            batch = _batch_of(batch)
        except Exception as exc:  # a batch this reader cannot read: `broken` says so
            unread, batch = f"the batch: {type(exc).__name__}", None
    return LiveState(
        table=table,
        # unified memory has no LUT: the one its SWA table stands for, as a dump records it
        lut=facts.get("full_to_swa_index_mapping") if lut is None else lut.numpy(),
        free_full=free_full,
        free_swa=free_swa,
        tree=empty if held is None else held,
        resident=resident,
        locked=locked,
        unlocked=unlocked,
        alloc_lens=np.zeros(rows, np.int64) if lens is None else lens,
        running_rows=facts.get(_RUNNING, empty),
        free_rows=np.asarray(pool.free_slots, dtype=np.int64),
        batch=batch,
        unread=unread,
        lock_counts=counts,
        lock_expected=expected,
        mamba=None
        if "free_mamba_slots" not in facts
        else {k: facts[k] for k in _MAMBA if k in facts},
        tables=tables,
        host=host,
        pinned=pinned,
    )


#: The row facts' dump names (`capture.tree`'s).
_LENS, _RUNNING = "req_pool_allocated_lens", "running_req_rows"


def _rows_of(requests: list[Any], rows: int, tree: Any) -> tuple[np.ndarray, np.ndarray]:
    """(each row's longest allocation, the rows held), as `capture.tree.tree_state` records
    them: the rows of the requests and of the tree's streaming sessions
    (`capture.tree.session_holders`), each kv once (by identity); read by attribute (one
    missing raises: unreadable, where the capture code would record the fact as absent)."""
    lens = [0] * rows
    held: dict[int, Any] = {}
    for kv in [*(kv_record(req) for req in requests), *session_holders(tree, requests)]:
        row = kv.req_pool_idx
        held[id(kv)] = row
        if row is not None:
            row = int(row)
            if 0 <= row < rows:
                allocated = allocated_len(kv)
                if allocated > lens[row]:
                    lens[row] = allocated
    running = [int(r) for r in held.values() if r is not None]
    return np.array(lens, dtype=np.int64), np.array(running, dtype=np.int64)


def _batch_of(batch: Any) -> dict[str, Any]:
    """`capture.tree.batch_state`'s facts of a `ScheduleBatch` on the host, as int64 arrays,
    views where SGLang holds a CPU tensor (read at once, never kept: the audit needs no copy
    of what the step left)."""
    facts: dict[str, Any] = {"req_pool_indices": _ints(batch.req_pool_indices)}
    if batch.forward_mode.is_extend():
        facts["prefix_lens"] = _ints(batch.prefix_lens)
        facts["extend_seq_lens"] = _ints(batch.extend_lens)
        facts["forward_mode"] = "extend"
    else:
        facts["prefix_lens"] = _ints(batch.seq_lens) - 1
        facts["extend_seq_lens"] = np.ones(facts["prefix_lens"].size, dtype=np.int64)
        facts["forward_mode"] = "decode"
    out = batch.out_cache_loc
    if out is not None:
        facts["out_cache_loc"] = _ints(out)
    return facts


def _ints(values: Any) -> np.ndarray:
    """A CPU tensor (a view) or a list as a flat int64 host array."""
    if isinstance(values, list):
        return np.array(values, dtype=np.int64).reshape(-1)
    return _int64(values.numpy())


#: numpy's int64 (a builtin dtype: one object)
_I64 = np.dtype(np.int64)


def _int64(flat: np.ndarray) -> np.ndarray:
    """`flat` as a flat int64 array: itself where it is one (an attribute test costs less
    than numpy's no-op conversions)."""
    if flat.dtype is not _I64 or flat.ndim != 1:
        flat = flat.astype(np.int64).reshape(-1)
    return flat


#: The Mamba layout's records the audit reads.
_MAMBA = (
    "free_mamba_slots",
    "tree_mamba_slots",
    "req_mamba_slots",
    "req_mamba_rows",
    "req_index_to_mamba_index_mapping",
    "req_index_to_mamba_ping_pong_track_buffer_mapping",
)


#: Unified memory's page tables the audit reads (each side's virtual->physical and back).
_TABLES = (
    "full_virtual_to_physical",
    "full_physical_to_virtual",
    "swa_virtual_to_physical",
    "swa_physical_to_virtual",
)


#: Each side's lazy-compaction free list (its physical holes; absent where compaction is eager).
_HOLES = ("full_physical_holes", "swa_physical_holes")


#: reads (the full side's free slots, the SWA side's), each a host int64 array
FreeReader = Callable[[], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Readers:
    """The live audit's own readers of the facts the capture code is slowest to read, built
    once per stack (None: the capture code's reader)."""

    tree: TreeReader | None = None
    free: FreeReader | None = None
    locks: LockReader | None = None
    #: the tree has SGLang's host tier: its host pools read (`capture.tree.host_state`), its
    #: in-flight transfer locks counted beside the requests' (`soak.hicache`)
    hicache: bool = False


def free_reader(allocator: Any, sizes: tuple[int, int] | None = None) -> FreeReader | None:
    """Both sides' free slots, by the route `capture.tree.free_slots` takes for the hybrid
    SWA allocator (each side's `get_all_free_pages`: its free and its staged pages, pages
    expanded to slots), unsorted and uncopied (counted at once, never kept); None for another
    allocator (unified memory's virtual ids: the capture code's reader).

    With `sizes` (each side's slots as its pool was built) a page is expanded by one look-up
    in a table of each page's slots (`_page_table`), clipped: a page past the end reads as
    the row past the last page (slots out of range, as the arithmetic gives them), and a
    negative page as page 0, which no domain holds, so the partition breaks (where the
    arithmetic's negative slots made the state unreadable: either way, broken)."""
    full = getattr(allocator, "full_attn_allocator", None)
    swa = getattr(allocator, "swa_attn_allocator", None)
    sides = (full, swa)
    if any(not callable(getattr(side, "get_all_free_pages", None)) for side in sides):
        return None
    if hasattr(full, "virtual_to_physical"):
        return None
    page = int(getattr(allocator, "page_size", 1) or 1)
    if sizes is not None and page > 1:
        return partial(_read_free_paged, full, swa, *(_page_table(n, page) for n in sizes))
    return partial(_read_free, full, swa, page, np.arange(page, dtype=np.int64))


def _read_free(
    full: Any, swa: Any, page: int, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(full side's free slots, SWA side's): see `free_reader`."""
    return _free_of(full, page, offsets), _free_of(swa, page, offsets)


def _free_of(side: Any, page: int, offsets: np.ndarray) -> np.ndarray:
    pages: np.ndarray = side.get_all_free_pages().numpy()  # None: no free list, unreadable
    return (pages[:, None] * page + offsets).reshape(-1) if page > 1 else pages


def _page_table(slots: int, page: int) -> np.ndarray:
    """Row p: page p's slots, for every page of `slots` and one past the end."""
    pages = -(-slots // page) + 1
    return np.arange(pages * page, dtype=np.int64).reshape(pages, page)


def _read_free_paged(
    full: Any, swa: Any, full_pages: np.ndarray, swa_pages: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(full side's free slots, SWA side's), pages expanded by their tables (`free_reader`)."""
    mine: np.ndarray = full.get_all_free_pages().numpy()
    theirs: np.ndarray = swa.get_all_free_pages().numpy()
    return (
        full_pages.take(mine, axis=0, mode="clip").reshape(-1),
        swa_pages.take(theirs, axis=0, mode="clip").reshape(-1),
    )


#: reads (full slots the tree holds, their SWA-resident part, their locked part, their
#: unlocked part), each a host int64 array (None: not read), as `capture.tree` reads them;
#: and each locked node's lock counts (None: not read; see `LiveState.lock_counts`)
TreeReader = Callable[
    [],
    tuple[
        np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, list[dict[int, int]] | None
    ],
]


def tree_reader(tree: Any, kinds: Any) -> TreeReader | None:
    """One read of the tree's three slot sets per audit, for the tree cores soak builds
    (`kinds`: SGLang's `ComponentType`); None for another tree (the capture code's reader).

    The Python core is walked once, by hand: the facts `capture.tree` takes from its two
    walks and its flatten (`walk_for_kv_canary`, `all_values_flatten`) are, node for node
    below the root, the FULL component's value tensor (held), that value where the node's
    SWA value is not None (resident), and that value where the FULL lock count is not 0
    (locked: held less the unlocked walk's), read here from the same fields; each node's
    lock counts with them. The Rust core's own calls are fast: its unlocked walk is kept as
    read (`capture.tree` records the held slots less these as the locked part; `_locks`
    counts them); it has no call that gives a node's lock count. A tree without a core
    (0.5.13 - 0.5.16) holds the same nodes itself: walked the same way (`_node_holder`)."""
    core = getattr(tree, "tree_core", None)
    holder = _node_holder(tree)
    if holder is not None:
        _, root, components = holder
        import torch  # SGLang's tree holds torch tensors: imported already

        # plain ints: a node's component list is indexed by them at a plain int's cost
        full, swa = int(kinds.FULL), int(kinds.SWA)
        types = tuple(sorted(int(t) for t in components))
        if types == (full, swa):  # the SWA layout's: the same walk, unrolled
            return partial(_walk_full_swa, root, full, swa, torch)
        return partial(_walk_python_core, root, full, swa, swa in types, types, torch)
    walk = getattr(core, "walk_for_kv_canary", None)
    if callable(walk) and callable(getattr(tree, "all_values_flatten", None)):
        return partial(_read_rust_core, tree, walk)
    return None


def _node_holder(tree: Any) -> tuple[Any, Any, dict[Any, Any]] | None:
    """(what holds the tree's Python nodes, its root, its components by type): the Python
    tree core (`root_node`, `components_by_type`; 0.5.17 on) or, where the tree has no core,
    the tree itself (`root_node`, `components`; 0.5.13 - 0.5.16, whose nodes and component
    records are the same make); None for the Rust core or another tree."""
    core = getattr(tree, "tree_core", None)
    try:
        if core is None:
            holder, root, components = tree, tree.root_node, tree.components
        else:
            holder, root, components = core, core.root_node, core.components_by_type
    except Exception:  # the Rust core's adapter raises for what it has not ported
        return None
    if root is None or not isinstance(components, dict):
        return None
    return holder, root, components


def _walk_python_core(
    root: Any, full: int, swa: int, has_swa: bool, types: tuple[int, ...], torch: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, None, list[dict[int, int]]]:
    """The Python core's three slot sets and its locked nodes' counts in one walk (see
    `tree_reader`)."""
    held: list[Any] = []
    resident: list[Any] = []
    locked: list[Any] = []
    counts: list[dict[int, int]] = [{} for _ in types]
    full_counts = counts[types.index(full)]
    others = tuple((counts[i], t) for i, t in enumerate(types) if t != full)
    todo = list(root.children.values())
    while todo:
        node = todo.pop()
        data = node.component_data
        ref = data[full].lock_ref
        if ref:
            full_counts[node.id] = ref
        for count, kind in others:
            other = data[kind].lock_ref
            if other:
                count[node.id] = other
        value = data[full].value
        if value is not None:
            # SGLang's walks read a tensor value only; anything else: unreadable
            if not isinstance(value, torch.Tensor):
                raise TypeError("a tree value that is not a tensor")
            held.append(value)
            if not has_swa or data[swa].value is not None:
                resident.append(value)
            if ref != 0:
                locked.append(value)
        todo.extend(node.children.values())
    return _flat(held, torch), _flat(resident, torch), _flat(locked, torch), None, counts


def _walk_full_swa(
    root: Any, full: int, swa: int, torch: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, None, list[dict[int, int]]]:
    """`_walk_python_core` for a tree of the FULL and SWA components alone (FULL < SWA),
    each node's two component records read once."""
    held: list[Any] = []
    resident: list[Any] = []
    locked: list[Any] = []
    full_counts: dict[int, int] = {}
    swa_counts: dict[int, int] = {}
    tensor = torch.Tensor
    todo = list(root.children.values())
    pop, push = todo.pop, todo.extend
    while todo:
        node = pop()
        data = node.component_data
        mine, window = data[full], data[swa]
        ref = mine.lock_ref
        if ref:
            full_counts[node.id] = ref
        other = window.lock_ref
        if other:
            swa_counts[node.id] = other
        value = mine.value
        if value is not None:
            # SGLang's walks read a tensor value only; anything else: unreadable
            if not isinstance(value, tensor):
                raise TypeError("a tree value that is not a tensor")
            held.append(value)
            if window.value is not None:
                resident.append(value)
            if ref != 0:
                locked.append(value)
        push(node.children.values())
    counts = [full_counts, swa_counts]
    return _flat(held, torch), _flat(resident, torch), _flat(locked, torch), None, counts


def _flat(values: list[Any], torch: Any) -> np.ndarray:
    """Tensors as one flat int64 host array (a copy: `torch.cat` makes one)."""
    if not values:
        return np.zeros(0, dtype=np.int64)
    return _int64(torch.cat(values).numpy())


def _read_rust_core(
    tree: Any, walk: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, None]:
    """The Rust core's held, SWA-resident and unlocked slots by its own calls (see
    `tree_reader`)."""
    held = tree.all_values_flatten().numpy().reshape(-1)
    resident = walk(unlocked_only=False, swa_resident_only=True).slot_indices.numpy()
    unlocked = walk(unlocked_only=True, swa_resident_only=False).slot_indices.numpy()
    return held, resident, None, unlocked, None


#: reads what the running requests' tree locks (`req.lock`) make the tree's lock counts:
#: per node and component (the Python core), or the full slots they cover (the Rust core)
LockReader = Callable[[list[Any]], "list[Counter[int]] | np.ndarray"]


def lock_reader(tree: Any, kinds: Any) -> LockReader | None:
    """The running requests' locks replayed as SGLang 0.5.23's releases walk them, from each
    lock's receipt (`TreeLock`: its anchor node, the components it skipped, the SWA window's
    boundary uuid, whether its SWA part was released early): FULL counts every node from the
    anchor up to the root; SWA from the anchor up to the node stamped with the receipt's
    uuid (the window's older edge, which a split moves to the new parent), or the root when
    the window reached it; MAMBA the anchor alone. An SWA part released early
    (`release_swa`) has also released the components below SWA's eviction priority.
    A lock that leaves tombstones unlocked (0.5.13 - 0.5.19: `HeldLock.unlocked`; 0.5.13 -
    0.5.16's names none, its request with its anchor standing for it) counts
    none of the nodes it names, none that was a tombstone when the audit first saw it (the
    scheduler's admission drops what the lock named), and no tombstone (a locked node is
    never evicted).

    The Python core's nodes are followed by parent; the Rust core gives no node, only the
    full slots of an anchor's path (`path_device_indices`), so there the FULL locks are
    replayed as the slots they cover. None for another tree."""
    core = getattr(tree, "tree_core", None)
    holder = _node_holder(tree)
    if holder is not None:
        core, root, components = holder
        types = tuple(sorted(components))
        swa = components.get(kinds.SWA)
        early: frozenset[int] = frozenset()
        if swa is not None:
            below = swa.eviction_priority(is_leaf=False)
            early = frozenset(
                t for t, c in components.items() if c.eviction_priority(is_leaf=False) < below
            ) | {kinds.SWA}
        walks = {kinds.FULL: _ROOT, kinds.SWA: _BOUNDARY, kinds.MAMBA: _ANCHOR}
        if any(t not in walks for t in types):
            return None
        plan = tuple((i, t, walks[t]) for i, t in enumerate(types))
        # a lock names its anchor by id (0.5.17 on) or is the node itself (0.5.13 - 0.5.16)
        node_of = getattr(core, "node_by_id", None) or _itself
        return partial(_expected_python, node_of, root, len(types), plan, early, kinds.SWA, {}, {})
    paths = getattr(tree, "path_device_indices", None)
    if callable(paths) and getattr(core, "walk_for_kv_canary", None) is not None:
        return partial(_expected_rust, paths, kinds.FULL, {})
    return None


#: a lock's tombstones when the audit first saw it: (its identity, its anchor node, the
#: tombstones by component); a lock is known by both (one that keeps no object of its own,
#: 0.5.13 - 0.5.16's, is known by its request: a new anchor is a new lock)
_Seen = tuple[Any, Any, dict[int, set[int]]]


def _itself(node: Any) -> Any:
    return node


def _expected_python(
    node_of: Callable[[Any], Any],
    root: Any,
    width: int,
    plan: tuple[tuple[int, int, int], ...],
    early: frozenset[int],
    swa: int,
    seen: dict[int, _Seen],
    released: dict[int, Any],
    requests: list[Any],
) -> list[Counter[int]]:
    """Per component, each node's lock count the requests' locks make (see `lock_reader`):
    each lock's path from its anchor to the root read once, each component counting its
    part of it. `seen`: the tombstones on each lock's path when first seen (by identity),
    for the locks that leave them unlocked. `released`: the locks (by identity) last seen
    with their SWA part released early, for a holder that does not say so itself (0.5.17 -
    0.5.19's streaming session slot takes over its first turn's lock, not that flag)."""
    ids: list[list[int]] = [[] for _ in range(width)]
    first: dict[int, _Seen] = {}
    early_now: dict[int, Any] = {}
    for req in requests:
        lock = held_lock(req)
        if lock is None:
            continue
        swa_released = lock.swa_released
        if not swa_released and not hasattr(req, "swa_prefix_lock_released"):
            swa_released = released.get(id(lock.identity)) is lock.identity
        if swa_released:
            early_now[id(lock.identity)] = lock.identity
        node = node_of(lock.node)  # a node the tree no longer has: unreadable
        path = []
        while node is not root:
            path.append(node)
            node = node.parent
        if not path:
            continue
        on_path = [node.id for node in path]
        receipt = lock.receipt
        skipped = skipped_components(lock)
        tombs = None if lock.unlocked is None else _tombstones(lock, path, plan, seen, first)
        for i, kind, reach in plan:
            if kind in skipped or (swa_released and kind in early):
                continue
            if reach == _ROOT:
                nodes = on_path
            elif reach == _ANCHOR:
                nodes = on_path[:1]
            else:
                nodes = on_path[: _boundary(path, kind, swa_boundary(receipt, swa))]
            if tombs is not None:
                out = tombs[kind]
                nodes = [n for n in nodes if n not in out]
            ids[i].extend(nodes)
    seen.clear()
    seen.update(first)
    released.clear()
    released.update(early_now)
    return [Counter(nodes) for nodes in ids]


def _tombstones(
    lock: Any,
    path: list[Any],
    plan: tuple[tuple[int, int, int], ...],
    seen: dict[int, _Seen],
    first: dict[int, _Seen],
) -> dict[int, set[int]]:
    """By component, the nodes of `path` a lock that skips tombstones did not lock: those it
    names, those that were tombstones when first seen, and those that are now."""
    key, anchor = lock.identity, path[0]
    known = seen.get(id(key))
    if known is None or known[0] is not key or known[1] is not anchor:
        known = (key, anchor, {kind: _dead(path, kind) for _, kind, _ in plan})
    first[id(key)] = known
    return {
        kind: set(lock.unlocked.get(kind, ())) | known[2][kind] | _dead(path, kind)
        for _, kind, _ in plan
    }


def _dead(path: list[Any], kind: int) -> set[int]:
    """The nodes of `path` whose `kind` component holds no value (tombstones)."""
    return {node.id for node in path if node.component_data[kind].value is None}


def _boundary(path: list[Any], kind: int, uuid: Any) -> int:
    """How many nodes of `path` an SWA lock with boundary `uuid` covers: up to the first
    stamped with it, else all (the window reached the root)."""
    if uuid:
        for at, node in enumerate(path):
            if node.component_data[kind].metadata.get("uuid") == uuid:
                return at + 1
    return len(path)


#: how far up its path a component's lock reaches: the root, the SWA boundary, the anchor
_ROOT, _BOUNDARY, _ANCHOR = 0, 1, 2


def _expected_rust(
    paths: Any, full: int, kept: dict[int, tuple[Any, np.ndarray]], requests: list[Any]
) -> np.ndarray:
    """The full slots the requests' FULL locks cover (see `lock_reader`). A lock's path is
    read once while the lock is held (`kept`, by the lock object): a locked node keeps its
    full slots, and a split keeps the slots on the path. Where a faulty SGLang changes them
    anyway, the locked slots no longer match what was read, and the audit breaks."""
    held: dict[int, tuple[Any, np.ndarray]] = {}
    for req in requests:
        lock = held_lock(req)
        if lock is None or full in skipped_components(lock):
            continue
        key = lock.identity
        known = kept.get(id(key))
        if known is None or known[0] is not key:
            known = (key, paths(lock.node).numpy().astype(np.int64, copy=False))
        held[id(key)] = known
    kept.clear()
    kept.update(held)
    return np.concatenate([path for _, path in held.values()]) if held else _NONE


_NONE = np.zeros(0, dtype=np.int64)


class LiveAudit:
    """The accounting of one history's stack (see the module docstring); `broken` names the
    first fact a state breaks (None: every fact holds, `check` would find nothing)."""

    def __init__(self, scheduler: Any) -> None:
        stack = scheduler.stack
        kinds = stack.modules.component_type.ComponentType
        #: the readers of the tree and the free lists (see `Readers`)
        self.readers = Readers(
            tree_reader(stack.tree, kinds),
            free_reader(stack.allocator),
            lock_reader(stack.tree, kinds),
            getattr(stack.tree, "cache_controller", None) is not None,
        )
        self.page = int(stack.spec.page_size)
        self.window = int(stack.spec.window)
        first = read_state(scheduler, None, [], self.readers)
        # the domains the pools had when built (everything free), as masks
        # page 0 (Mamba: slot 0) is never in a domain, even where a faulty pool lists it free
        self.full_n = int(first.free_full.max(initial=0)) + 1
        self.full_domain = _mask(first.free_full, self.full_n, self.page)
        self.swa_n = 0 if first.free_swa is None else int(first.free_swa.max(initial=0)) + 1
        self.swa_n += -self.swa_n % self.page  # whole pages
        self.swa_domain = (
            None if first.free_swa is None else _mask(first.free_swa, self.swa_n, self.page)
        )
        if self.readers.free is not None and first.free_swa is not None:
            # the pools' sizes known: pages expanded by look-up (`free_reader`)
            sizes = (self.full_n, self.swa_n)
            self.readers = replace(self.readers, free=free_reader(stack.allocator, sizes))
        self.rows_n = int(first.table.shape[0])
        self.row_domain = _mask(first.free_rows, self.rows_n, 0)
        mamba_free = None if first.mamba is None else first.mamba["free_mamba_slots"]
        self.mamba_n = 0 if mamba_free is None else int(mamba_free.max(initial=0)) + 1
        self.mamba_domain = None if mamba_free is None else _mask(mamba_free, self.mamba_n, 1)
        #: unified memory: the tables as built, and the virtual pages free then (the rest
        #: are reserved: as built forever)
        self.tables = first.tables
        self.virtual_domain = self.full_domain[:: self.page] > 0
        #: the LUT as built: its length and what lies past the full slots never change
        self.lut_n = None if first.lut is None else int(first.lut.shape[0])
        self.lut_tail = None if first.lut is None else first.lut[self.full_n :].tobytes()
        self.fallbacks = 0
        #: where the last audit's lock counts broke: whether a count exceeds its locks
        #: (a lock never released); None: they held
        self.lock_excess: bool | None = None
        self._buffers(int(first.table.shape[1]))
        #: per audit: the running rows' cells and how often each full slot is one
        self._cells: np.ndarray = first.free_full[:0]
        self._cell_count: np.ndarray = first.free_full[:0]
        self._tree: np.ndarray = first.free_full[:0]

    def _buffers(self, width: int) -> None:
        """What the rules keep per history, built from its constants (a row's width, the
        domains, the page, the window): the domains' bytes (a partition is one byte compare
        against them), the masks of a row's first cells, each row's positions, each page's
        slots, a decode's window columns, and scratch (a slot's position in its row,
        `_swa`'s page map). Soak's rows are 256 wide: `_below` is 64 KiB."""
        ps = self.page
        self._full_bytes = self.full_domain.tobytes()
        self._row_bytes = self.row_domain.tobytes()
        self._swa_bytes = None if self.swa_domain is None else self.swa_domain.tobytes()
        #: row L: the positions below L (`_below[L, j]` is `j < L`), L up to the row's width
        self._below = np.tri(width + 1, width, -1, dtype=bool)
        #: each row's positions
        self._grid = np.tile(np.arange(width, dtype=np.int64), (self.rows_n, 1))
        #: row p: page p's slots
        self._page_slots = _page_table(self.full_n, ps)
        #: row P: the columns a decode at P reads back (`[P - W, P]`, clipped to 0)
        back = np.arange(self.window + 1, dtype=np.int64)
        self._cols = np.maximum(np.arange(width, dtype=np.int64)[:, None] - back, 0)
        self._where = np.zeros(self.full_n, dtype=np.int64)
        self._page_of = np.zeros(self.full_n // ps + 1, dtype=np.int64)  # `_swa`'s

    def broken(self, state: LiveState, *, idle: bool) -> str | None:
        """The first fact `state` breaks, or None (in this order: each rule may rely on the
        facts before it; a state the rules cannot even read breaks them all)."""
        self.lock_excess = None
        if state.unread is not None:
            return f"unreadable ({state.unread})"
        # `_tables` and `_mamba` pass a state without their records in a history without
        # them: left out then
        tables = state.tables is not None or self.tables is not None
        mamba = state.mamba is not None or self.mamba_domain is not None
        rules: tuple[Callable[[LiveState, bool], str | None], ...] = (
            self._rows,
            self._full,
            *((self._tables,) if tables else ()),
            self._swa,
            *((self._mamba,) if mamba else ()),
            *((self._host,) if self.readers.hicache else ()),
            self._locks,
            self._batch,
        )
        try:
            for rule in rules:
                why = rule(state, idle)
                if why is not None:
                    return why
        except (IndexError, ValueError, TypeError) as exc:  # lengths or ids out of range
            return f"unreadable ({type(exc).__name__})"
        return None

    # -- the facts ------------------------------------------------------------------
    # Each rule is few numpy calls over per-slot counts: a partition is one sum of counts
    # against the domain's 0/1 mask, which also catches every slot counted twice (a
    # duplicate free entry, a slot in two rows the tree does not hold); the finer reason is
    # worked out only for a state that breaks (`_why_full`).

    def _rows(self, s: LiveState, idle: bool) -> str | None:
        # a negative row raises in bincount (unreadable: broken), one past the end lengthens it
        both = np.bincount(np.concatenate((s.free_rows, s.running_rows)), minlength=self.rows_n)
        if both.tobytes() != self._row_bytes:  # same dtype: a size or a count differs
            return "pool rows not partitioned"
        return None

    def _full(self, s: LiveState, idle: bool) -> str | None:
        n, ps = self.full_n, self.page
        rows = s.running_rows
        lens = s.alloc_lens[rows]
        each = lens.tolist()  # a few rows: Python's max and min cost less than numpy's
        top = max(each, default=0)  # no row's cells lie past its longest
        if top > s.table.shape[1] or (each and min(each) < 0):
            return "an allocation beyond its row"
        table = s.table.take(rows, axis=0)[:, :top]
        inside = self._below.take(lens, axis=0)[:, :top]
        cells = table[inside]
        free = np.bincount(s.free_full, minlength=n)
        tree = np.bincount(s.tree, minlength=n)
        cell_count = np.bincount(cells, minlength=n)
        if free.size != n or tree.size != n or cell_count.size != n:
            return "a full slot out of range"
        # owners: free, the tree's, a row's own (a cell the tree does not hold), and the
        # rest of a row's last page past its allocated length (held, unwritten)
        own = cell_count.copy()
        own[tree.astype(bool)] = 0
        owners = free + tree + own
        if ps > 1:
            tails = []
            for i, length in enumerate(each):
                rest = length % ps
                if rest:
                    # its last cell (in range: `cell_count`) and that page's slots past it
                    tails.append(self._page_slots[int(table[i, length - 1]) // ps, rest:])
            if tails:
                tail = np.bincount(
                    tails[0] if len(tails) == 1 else np.concatenate(tails), minlength=n
                )
                if tail.size != n:
                    return "a full slot out of range"
                owners += tail
        if owners.tobytes() != self._full_bytes:  # same dtype and size: a count differs
            return _why_full(free, tree, cell_count)
        # a slot in two rows (or twice in one) is at one position
        spots = self._grid[: rows.size, :top][inside]
        where = self._where
        where[cells] = spots
        if where.take(cells).tobytes() != spots.tobytes():  # both int64
            return "a shared slot at two positions"
        self._cells, self._cell_count, self._tree = cells, cell_count, tree
        return None

    def _tables(self, s: LiveState, idle: bool) -> str | None:
        """Unified memory's page tables (see the module docstring); `_full` has checked the
        virtual free list (whole pages, each once, inside the domain)."""
        t, built = s.tables, self.tables
        if t is None or built is None:
            return None if t is None and built is None else "no page tables"
        for name in _TABLES:
            table, first = t.get(name), built[name]
            if table is None or table.shape != first.shape or table[0] != first[0]:
                return "a page table resized, or its sink moved"
            if table[-1] != -1:
                return "a page table's sentinel overwritten"
        full, swa = t["full_virtual_to_physical"][:-1], t["swa_virtual_to_physical"][:-1]
        if swa.shape != full.shape or full.size * self.page != self.full_n:
            return "a page table sized by another id space"
        for side in ("full", "swa"):
            p2v = t[f"{side}_physical_to_virtual"][:-1]
            if not _name_each_other(t[f"{side}_virtual_to_physical"][:-1], p2v):
                return f"the {side} side's page tables disagree"
            holes = t.get(f"{side}_physical_holes")
            if holes is not None and holes.size and not _free_pages(holes, p2v):
                return f"the {side} side's physical free list holds no free page"
        domain = self.virtual_domain
        free = np.zeros(full.size, dtype=bool)
        free[s.free_full // self.page] = True
        bound = full >= 0
        if (bound == free)[domain].any():
            return "a virtual page free and bound, or held and unbound"
        reserved = ~domain
        reserved[0] = False  # the sink: its entries were compared above
        first = built["full_virtual_to_physical"][:-1]
        if free[reserved].any() or (full[reserved] != first[reserved]).any():
            return "a reserved virtual page freed or rebound"
        if ((swa >= 0) & ~bound)[1:].any():
            return "an SWA binding of a page the full side does not bind"
        return None

    def _swa(self, s: LiveState, idle: bool) -> str | None:
        lut = s.lut
        # unified memory has no SWA free list: its SWA slots are held to one owner each
        unified = self.tables is not None
        if lut is None or self.lut_tail is None or (self.swa_domain is None and not unified):
            return None if lut is None else "no SWA accounting"
        n, ps = self.full_n, self.page
        if lut.shape[0] != self.lut_n or lut[n:].tobytes() != self.lut_tail:
            return "the LUT's length or tail changed"
        body = lut[:n]
        if _any(body[:ps]):
            return "page 0 mapped"
        free = None
        if not unified:
            if s.free_swa is None:
                return "an SWA slot listed twice or out of range"
            free = np.bincount(s.free_swa, minlength=self.swa_n)
            if free.size != self.swa_n:
                return "an SWA slot listed twice or out of range"
        if _any(body[s.free_full]):
            return "a free full slot mapped"
        mapped = body.nonzero()[0]
        image = body[mapped]
        if ps > 1:
            # a full page maps into one SWA page, slot for slot (its unwritten rest
            # unmapped), and that SWA page is held whole, by that full page alone
            if _any((image - mapped) % ps):
                return "a page mapped out of lockstep"
            full_pages, swa_pages = mapped // ps, image // ps
            page_of = self._page_of
            page_of.fill(-1)
            page_of[full_pages] = swa_pages
            if not _equal(page_of[full_pages], swa_pages):
                return "a page mapped out of lockstep"
            # how many full pages map into each SWA page, per slot
            pages = np.bincount(page_of[page_of >= 0], minlength=self.swa_n // ps)
            held = pages.repeat(ps)
        else:
            held = np.bincount(image, minlength=self.swa_n)
        # an SWA slot mapped twice, or from two full pages, counts 2: not the domain's 0/1
        if free is None:
            if held.max(initial=0) > 1:
                return "an SWA slot mapped twice"
        elif held.shape != free.shape or (held + free).tobytes() != self._swa_bytes:
            return "SWA slots not partitioned"
        if s.resident is not None:
            # resident: exactly once each tree slot (held once: `_full`) that is mapped
            resident = np.bincount(s.resident, minlength=n)
            if resident.shape != body.shape or not _equal(resident, self._tree * body.astype(bool)):
                if resident.size != n or (resident > self._tree).any():
                    return "an SWA-resident slot outside the tree"
                return "a tree slot's SWA residence and its mapping disagree"
        return None

    def _mamba(self, s: LiveState, idle: bool) -> str | None:
        """Mamba slots exactly partitioned (free, a tree node's, a live request's; slot 0
        never), and each live request's row mapped to its own slot."""
        m, domain = s.mamba, self.mamba_domain
        if m is None or domain is None:
            return None if m is None and domain is None else "no Mamba accounting"
        slots, rows = m.get("req_mamba_slots"), m.get("req_mamba_rows")
        if slots is None or rows is None or "tree_mamba_slots" not in m:
            return "no Mamba accounting"
        n = self.mamba_n
        counts = [_counts(m["free_mamba_slots"], n), _counts(m["tree_mamba_slots"], n)]
        counts.append(_counts(slots, n))
        if any(c is None for c in counts):
            return "a Mamba slot out of range"
        owners = sum(c for c in counts if c is not None)
        if not np.array_equal(owners, domain):
            return "Mamba slots not partitioned"
        live = rows > 0
        if np.any(m["req_index_to_mamba_index_mapping"][rows[live]] != slots[live]):
            return "a row mapped to another Mamba slot"
        track_map = m.get("req_index_to_mamba_ping_pong_track_buffer_mapping")
        if track_map is not None and track_map_mismatches(track_map, slots, rows):
            return "a row's ping-pong map names other Mamba slots"
        return None

    def _host(self, s: LiveState, idle: bool) -> str | None:
        """Each host pool of the tier (the anchor's, the SWA and Mamba pools beside it):
        every slot inside the pool, on its free list or held by one node's host value of
        that pool, never both nor twice; where the tree vouches nothing else holds one
        (`host_slots_accounted`), every slot in one of the two places. Where the nodes' host
        values are unread (the Rust core), the free list alone: each slot once, inside."""
        h = s.host
        if h is None:
            return "no host records"
        accounted = int(h.get("host_slots_accounted", 0)) == 1
        for prefix in HOST_POOL_PREFIXES.values():
            free = h.get(f"{prefix}host_free_slots")
            if free is None:
                continue
            held = h.get(f"tree_{prefix}host_slots")
            size = h.get(f"num_{prefix}host_slots")
            if size is None:
                return "a host pool's size unread"
            n = int(size)
            # the Rust core keeps its nodes' host values out of reach: its free list alone
            # (what `check` runs there: the tree's host checks say they did not run)
            parts = (free,) if held is None else (free, held)
            both = np.concatenate([p.reshape(-1) for p in parts]).astype(np.int64)
            if both.size and (both.min() < 0 or both.max() >= n):
                return "a host slot out of its pool"
            counts = np.bincount(both, minlength=n)
            if counts.max(initial=0) > 1:
                return "a host slot free and held, or held or listed twice"
            if accounted and held is not None and counts.size and counts.min() < 1:
                return "a host slot in neither place"
        return None

    def _locks(self, s: LiveState, idle: bool) -> str | None:
        """A locked slot lies in a held row: a running request's or a streaming session's,
        which keeps its prefix lock between turns, so at idle a session's only (what `check`
        holds a dump to);
        then each lock count is the running requests' locks through that node (`_lock_counts`)."""
        locked = s.locked
        if locked is None and s.unlocked is not None:
            # the held slots not among the unlocked ones: a slot the tree holds more often
            # than it is unlocked (the tree holds each slot once: `_full`)
            unlocked = np.bincount(s.unlocked, minlength=self.full_n)
            if unlocked.size != self.full_n:
                return "an unlocked slot out of range"
            over = self._tree > unlocked
            stray = over
            if s.pinned is not None and s.pinned.size:
                stray = over.copy()
                stray[s.pinned] = False
            if _any(stray):
                if idle and not s.running_rows.size:
                    return "a lock at idle"
                if _any(stray & (self._cell_count == 0)):
                    return "a locked slot in no running row"
        elif locked is None:
            return "no lock record"
        elif locked.size:
            if locked.min() < 0 or locked.max() >= self.full_n:
                return "a locked slot out of range"
            mine = locked
            if s.pinned is not None and s.pinned.size:
                mine = difference(locked, s.pinned)
            if mine.size and idle and not s.running_rows.size:
                return "a lock at idle"
            if not _all(self._cell_count[mine]):
                return "a locked slot in no running row"
        return self._lock_counts(s, locked, over if locked is None else None)

    def _lock_counts(
        self, s: LiveState, locked: np.ndarray | None, over: np.ndarray | None
    ) -> str | None:
        """Each node's lock counts are the running requests' locks that pass through it
        (`lock_reader`); the Rust core keeps its counts, so there the locked slots are
        exactly those the requests' FULL locks cover. A count above its locks is a lock
        never released (`lock_excess`)."""
        expected = s.lock_expected
        if expected is None:
            return None
        if isinstance(expected, list):
            counts = s.lock_counts
            if counts is None or counts == expected:
                return None
            self.lock_excess = any(
                count > want[node]
                for have, want in zip(counts, expected, strict=True)
                for node, count in have.items()
            )
            return "a node's lock count is not its requests' locks"
        covered = np.bincount(expected, minlength=self.full_n) > 0
        if covered.size != self.full_n:
            return "a locked slot out of range"
        if over is None:
            over = np.zeros(self.full_n, dtype=bool)
            if locked is not None:
                over[locked] = True
        if _equal(over, covered):
            return None
        self.lock_excess = bool((over & ~covered).any())
        return "the locked slots are not those the requests' locks cover"

    def _batch(self, s: LiveState, idle: bool) -> str | None:
        b = s.batch
        if b is None:
            return None
        rpi, prefix, extend = b["req_pool_indices"], b["prefix_lens"], b["extend_seq_lens"]
        # each row once, and running (`_rows` read the running rows: distinct, in range)
        rows = np.bincount(rpi, minlength=self.rows_n)
        # counts summing to the batch's size, as many nonzero as its rows: each at most 1
        if rows.size != self.rows_n or np.count_nonzero(rows) != rpi.size:
            return "a batch row twice or out of range"
        running = np.bincount(s.running_rows, minlength=self.rows_n)
        if np.count_nonzero(running[rpi]) != rpi.size:
            return "a batch row not running"
        firsts, counts = prefix.tolist(), extend.tolist()  # a few rows: Python's min
        if (firsts and min(firsts) < 0) or (counts and min(counts) < 1):
            return "a negative length"
        end = prefix + extend
        if _any(end > s.alloc_lens[rpi]):
            return "a batch row beyond its allocation"
        if b.get("forward_mode") == "decode":  # one cell a row (`batch_state`): no masks
            return self._decode(s, rpi, prefix)
        ends = end.tolist()
        top = max(ends, default=0)  # inside the rows' allocations (`_full`)
        below = self._below
        below_end = below.take(end, axis=0)[:, :top]
        writes = below_end > below.take(prefix, axis=0)[:, :top]  # [prefix, end)
        table = s.table.take(rpi, axis=0)[:, :top]
        expected = table[writes]
        out = b.get("out_cache_loc")
        if out is None or not _equal(out, expected):
            return "out_cache_loc not the extended cells"
        if _any(self._tree[expected]):
            return "a write into the tree"
        lut = s.lut
        if lut is not None and self.window > 0:
            # the cells the plan verifies ([P - W, P), `window_start`) and the writes: mapped
            start = np.maximum(prefix - self.window, 0)
            window = below_end > below.take(start, axis=0)[:, :top]
            if not _all(lut.take(table[window])):
                return "a window cell unmapped"
        return None

    def _decode(self, s: LiveState, rpi: np.ndarray, prefix: np.ndarray) -> str | None:
        """`_batch` for a decode: each row writes its cell `prefix`, and reads its window
        back from there (`[P - W, P]`, from 0 where P < W: the columns clipped to 0 are
        inside it)."""
        expected = s.table[rpi, prefix]
        out = s.batch.get("out_cache_loc") if s.batch is not None else None
        if out is None or not _equal(out, expected):
            return "out_cache_loc not the extended cells"
        if _any(self._tree[expected]):
            return "a write into the tree"
        if s.lut is not None and self.window > 0:
            cols = self._cols.take(prefix, axis=0)  # `[P - W, P]`, clipped to 0
            if not _all(s.lut.take(s.table[rpi[:, None], cols])):
                return "a window cell unmapped"
        return None


def _why_full(free: np.ndarray, tree: np.ndarray, cells: np.ndarray) -> str:
    """Why the full slots' counts are not the domain's partition (a state that breaks)."""
    if free.max(initial=0) > 1 or tree.max(initial=0) > 1:
        return "a full slot listed twice"
    if np.any(cells[tree == 0] > 1):
        return "a slot in two rows the tree does not hold"
    return "full slots not partitioned"


def _counts(values: np.ndarray, n: int) -> np.ndarray | None:
    """How often each of `0..n-1` is in `values` (None: one is outside)."""
    if values.size and (values.min() < 0 or values.max() >= n):
        return None
    return np.bincount(values.astype(np.int64, copy=False), minlength=n)


def _mask(values: np.ndarray, n: int, reserved: int) -> np.ndarray:
    """`values` (distinct, inside `0..n-1`) as 0/1 counts, the first `reserved` (page 0)
    never in."""
    counts = _counts(values, n)
    assert counts is not None
    counts[:reserved] = 0
    return counts


def _name_each_other(v2p: np.ndarray, p2v: np.ndarray) -> bool:
    """Past the sink (entry 0 of each): every bound virtual page's physical page names it
    back, and every named physical page's virtual page is bound to it (so no physical page
    is behind two virtual pages, no virtual page bound to two)."""
    v = np.flatnonzero(v2p[1:] >= 0) + 1
    p = v2p[v]
    if p.size and (p.min() < 1 or p.max() >= p2v.size or (p2v[p] != v).any()):
        return False
    q = np.flatnonzero(p2v[1:] >= 0) + 1
    w = p2v[q]
    return not (w.size and (w.min() < 1 or w.max() >= v2p.size or (v2p[w] != q).any()))


def _free_pages(holes: np.ndarray, p2v: np.ndarray) -> bool:
    """Every hole a physical page past the sink (`1 .. len(p2v) - 1`), listed once, unbound."""
    if holes.min() < 1 or holes.max() >= p2v.size:
        return False
    return bool(distinct(holes).size == holes.size) and not _any(p2v[holes] >= 0)


def _any(values: np.ndarray) -> bool:
    """`values.any()`, at a fraction of its call cost on the audit's small arrays."""
    return bool(np.count_nonzero(values))


def _all(values: np.ndarray) -> bool:
    """`values.all()`, likewise."""
    return bool(np.count_nonzero(values) == values.size)


def _equal(a: np.ndarray, b: np.ndarray | None) -> bool:
    """Same shape and values (bytes compared where the dtypes match: one C call); None
    equals nothing."""
    if b is None or a.shape != b.shape:
        return False
    if a.dtype == b.dtype:
        return a.tobytes() == b.tobytes()
    return bool((a == b).all())
