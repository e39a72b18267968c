"""`soak.tp.RankGlobals`: each tensor-parallel rank keeps its own copy of SGLang's process-wide
tree counters, as each rank's process does (a stand-in module holds them; no torch needed)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest

from kvcanary_cli.soak.tp import RankGlobals

NAME = "sglang.srt.mem_cache.kvcanary_test_counters"


@pytest.fixture
def counters() -> Iterator[types.ModuleType]:
    module = types.ModuleType(NAME)
    module._LAST_ACCESS_TIME_COUNTER_FLOAT = 1.0  # type: ignore[attr-defined]
    module._COMPONENT_UUID_COUNTERS = {"full": 5}  # type: ignore[attr-defined]
    sys.modules[NAME] = module
    yield module
    del sys.modules[NAME]


def _stamp(module: types.ModuleType, times: int) -> None:
    """What SGLang's `get_and_increase_time_counter` and id counters do, `times` times."""
    for _ in range(times):
        module._LAST_ACCESS_TIME_COUNTER_FLOAT += 1.0  # type: ignore[attr-defined]
        module._COMPONENT_UUID_COUNTERS["full"] += 1


def test_each_rank_counts_from_one_start_on_its_own(counters: types.ModuleType) -> None:
    ranks = RankGlobals(2)
    with ranks.as_rank(0):
        _stamp(counters, 3)
    with ranks.as_rank(1):
        assert counters._LAST_ACCESS_TIME_COUNTER_FLOAT == 1.0
        _stamp(counters, 1)
    with ranks.as_rank(0):
        assert counters._LAST_ACCESS_TIME_COUNTER_FLOAT == 4.0
        assert counters._COMPONENT_UUID_COUNTERS == {"full": 8}
    with ranks.as_rank(1):
        assert counters._COMPONENT_UUID_COUNTERS == {"full": 6}


def test_one_rank_shares_nothing_it_should_not(counters: types.ModuleType) -> None:
    """A rank's dict of counters is its own copy: one rank's stamps never reach another's."""
    ranks = RankGlobals(2)
    with ranks.as_rank(0):
        held = counters._COMPONENT_UUID_COUNTERS
    with ranks.as_rank(1):
        _stamp(counters, 2)
    assert held == {"full": 5}


def test_each_rank_numbers_its_own_tree_nodes(counters: types.ModuleType) -> None:
    """The node class's id counter (SGLang's `UnifiedTreeNode.counter`, class-wide in a
    process): shared, rank 1's nodes took ids after rank 0's, and the ranks' write-back reclaim
    digests, made of node ids, differed (SGLang's own TP check crashed a clean history)."""

    class UnifiedTreeNode:
        counter = 0

    counters.UnifiedTreeNode = UnifiedTreeNode  # type: ignore[attr-defined]
    ranks = RankGlobals(2)
    with ranks.as_rank(0):
        UnifiedTreeNode.counter += 3
    with ranks.as_rank(1):
        assert UnifiedTreeNode.counter == 0
        UnifiedTreeNode.counter += 1
    with ranks.as_rank(0):
        assert UnifiedTreeNode.counter == 3
