"""soak.live's own readers of a Python tree's nodes: the tree core's (0.5.17 on) and, where
the tree has no core (0.5.13 - 0.5.16), the tree's own, read the same way."""

from __future__ import annotations

import enum
from collections import Counter
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from kvcanary_cli.soak.live import lock_reader, tree_reader

torch = pytest.importorskip("torch")

Kind = enum.IntEnum("Kind", {"FULL": 0, "SWA": 1, "MAMBA": 2})


class _Component:
    def eviction_priority(self, is_leaf: bool) -> int:
        return 1


def _tree() -> tuple[Any, Any]:
    """A tree holding its nodes itself (root, a tombstoned node, a leaf under it): the leaf
    locked by one request whose lock reaches the root on both components."""

    def node(node_id: int, full: list[int], swa: bool, locks: tuple[int, int]) -> Any:
        value = torch.tensor(full)
        data = [
            SimpleNamespace(value=value, lock_ref=locks[0], metadata={}),
            SimpleNamespace(value=value if swa else None, lock_ref=locks[1], metadata={}),
        ]
        return SimpleNamespace(id=node_id, component_data=data, children={})

    root = SimpleNamespace(id=0, children={}, parent=None)
    tomb, leaf = node(1, [1, 2], False, (1, 0)), node(2, [3, 4], True, (1, 1))
    tomb.parent, leaf.parent = root, tomb
    root.children, tomb.children = {1: tomb}, {2: leaf}
    components = {Kind.FULL: _Component(), Kind.SWA: _Component()}
    tree = SimpleNamespace(root_node=root, components=components)
    req = SimpleNamespace(last_node=leaf, swa_uuid_for_lock=None, swa_prefix_lock_released=False)
    return tree, req


def test_a_tree_without_a_core_is_read_by_its_own_nodes() -> None:
    """Held, SWA-resident and locked slots and each node's lock counts, from the tree's own
    root and components (no `tree_core`); the request's lock (its anchor node itself, its
    skips not kept) counts every node of its reach but the tombstone on the SWA side."""
    tree, req = _tree()
    read = tree_reader(tree, Kind)
    assert read is not None
    held, resident, locked, _, counts = read()
    assert sorted(held.tolist()) == [1, 2, 3, 4] and resident.tolist() == [3, 4]
    assert locked is not None and sorted(locked.tolist()) == [1, 2, 3, 4]
    assert counts == [{1: 1, 2: 1}, {2: 1}]
    expected = lock_reader(tree, Kind)
    assert expected is not None
    assert expected([req]) == [Counter({1: 1, 2: 1}), Counter({2: 1})]
    assert tree_reader(SimpleNamespace(), Kind) is None and lock_reader(object(), Kind) is None


def test_a_streaming_sessions_row_is_held_where_the_free_lists_are_the_capture_codes() -> None:
    """Releases before 0.5.20 have no `get_all_free_pages()`, so the live audit reads the
    free lists with the capture code and the tree with its own reader: the rows are then
    read apart from the tree, and a streaming session's row (and its allocated length) must
    come with them (before, it was left out: on 0.5.15 - 0.5.19 the request pool's rows
    broke their partition at each step a session held a row, and the whole `check` ran)."""
    from kvcanary_cli.soak.live import Readers, read_state

    session = SimpleNamespace(kv=SimpleNamespace(req_pool_idx=3, kv_allocated_len=5))
    tree = SimpleNamespace(session=SimpleNamespace(slots={"s": session}))
    pool = SimpleNamespace(req_to_token=torch.zeros((5, 8), dtype=torch.int32), free_slots=[1, 2])
    allocator = SimpleNamespace(page_size=1, size=8, free_pages=torch.tensor([1, 2]))
    allocator.release_pages = None
    stack = SimpleNamespace(req_to_token_pool=pool, allocator=allocator, tree=tree)
    scheduler = SimpleNamespace(stack=stack, waiting=[])
    running = SimpleNamespace(kv=SimpleNamespace(req_pool_idx=4, kv_allocated_len=2))
    empty = np.zeros(0, dtype=np.int64)
    readers = Readers(tree=lambda: (empty, empty, None, None, None))
    state = read_state(scheduler, None, [running], readers)
    assert sorted(state.running_rows.tolist()) == [3, 4]
    assert state.alloc_lens.tolist() == [0, 0, 0, 5, 2]


def test_a_session_slot_keeps_its_first_turns_early_swa_release() -> None:
    """0.5.17 - 0.5.19's streaming session slot takes over its first turn's lock (the same
    skip set, which stands for the lock) but not whether that turn released the lock's SWA
    part early: the slot's lock is replayed as released where the turn's was last seen so
    (else, on a correct state, each audit with such a slot saw an SWA count it lacks). The
    twin: a slot whose lock was never seen released counts its SWA part."""
    tree, first = _tree()
    first.skip_lock_node_ids, first.swa_prefix_lock_released = {}, True
    expected = lock_reader(tree, Kind)
    assert expected is not None
    full_only = [Counter({1: 1, 2: 1}), Counter()]
    assert expected([first]) == full_only
    slot = SimpleNamespace(
        last_node=first.last_node,
        swa_uuid_for_lock=None,
        skip_lock_node_ids=first.skip_lock_node_ids,
    )
    assert expected([slot]) == full_only
    assert expected([slot]) == full_only  # kept while the slot holds it
    fresh = SimpleNamespace(
        last_node=first.last_node, swa_uuid_for_lock=None, skip_lock_node_ids={}
    )
    assert expected([fresh]) == [Counter({1: 1, 2: 1}), Counter({2: 1})]
