"""soak.live's own readers of a Python tree's nodes: the tree core's (0.5.17 on) and, where
the tree has no core (0.5.13 - 0.5.16), the tree's own, read the same way."""

from __future__ import annotations

import enum
from collections import Counter
from types import SimpleNamespace
from typing import Any

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
