"""capture.tree's reads on stand-in objects (the real ones: tests/integration/
test_sglang_stack.py): free lists with and without `get_all_free_pages()` (releases before
0.5.20 keep `free_pages` and the staged `release_pages`), pages expanded to slots, the tree
found by its pool, and a broken object costing only its facts."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from kvcanary_cli.capture.tree import free_slots, register_tree_cache, tree_for, tree_state


class _WithPages:
    def __init__(self, pages: list[int]) -> None:
        self.pages = pages

    def get_all_free_pages(self) -> np.ndarray:
        return np.array(self.pages)


def test_free_slots_from_get_all_free_pages_expands_pages() -> None:
    assert free_slots(_WithPages([2, 1]), 2).tolist() == [2, 3, 4, 5]


def test_free_slots_without_get_all_free_pages_reads_free_and_staged() -> None:
    old = SimpleNamespace(free_pages=np.array([3]), release_pages=np.array([1]))
    assert free_slots(old, 1).tolist() == [1, 3]
    assert free_slots(SimpleNamespace(), 1) is None


def test_free_slots_copies_what_it_reads() -> None:
    pages = np.array([5, 6])
    allocator = SimpleNamespace(free_pages=pages, release_pages=None)
    got = free_slots(allocator, 1)
    pages[0] = 99
    assert got.tolist() == [5, 6]


class _Tree:
    def __init__(self, table: object) -> None:
        self.req_to_token_pool = SimpleNamespace(req_to_token=table)


def test_tree_for_finds_the_tree_of_a_pool() -> None:
    table_a, table_b = object(), object()
    tree_a, tree_b = _Tree(table_a), _Tree(table_b)
    register_tree_cache(tree_a)
    register_tree_cache(tree_b)
    assert tree_for(table_b) is tree_b and tree_for(table_a) is tree_a
    assert tree_for(object()) is None  # two trees, neither reads it


def test_tree_state_records_rows_and_survives_a_broken_tree() -> None:
    allocator = SimpleNamespace(page_size=1, size=8, free_pages=np.array([4]), release_pages=None)
    running = [SimpleNamespace(kv=SimpleNamespace(req_pool_idx=2, kv_allocated_len=5))]

    class Broken:
        def all_values_flatten(self) -> None:
            raise RuntimeError("renamed")

    facts = tree_state(allocator=allocator, tree=Broken(), requests=running, rows=3)
    assert facts["num_full_slots"] == 9 and facts["free_full_slots"].tolist() == [4]
    assert "tree_full_slots" not in facts
    assert facts["req_pool_allocated_lens"].tolist() == [0, 0, 5]  # the rows still recorded
