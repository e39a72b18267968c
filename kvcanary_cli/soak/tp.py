"""Tensor-parallel ranks in one process: what each rank holds of its own, and their states
compared at each audited step (`soak --tp N`).

A real TP rank is a process of its own running SGLang's whole scheduler: the requests come
broadcast from rank 0, every rank makes the same batch choices on the same inputs, and the
forward's next tokens are the same on every rank. What a rank's memory cache reads of its own
is its process's state: its objects (their addresses, so the iteration order of sets keyed by
them; the Rust tree core's hash maps, each seeded at random), and the module-level counters
SGLang's unified tree stamps its nodes with (`get_and_increase_time_counter`: the LRU's access
times, and the components' ids), and the node class's id counter (`UnifiedTreeNode.counter`,
which the write-back reclaim digest the ranks compare is made of). Soak builds one stack and
one scheduler per rank, so the objects are each rank's already; `RankGlobals` gives each rank
its own counters, swapped in while that rank runs, each starting where a fresh process starts.

The comparison is `kvcanary ranks`' own (`analysis.ranks.compare_ranks`), on the dumps the
capture records of each rank's state.

With SGLang's host tier, the ranks do meet: the tree MIN-reduces its ready ack counts over its
`tp_group` each step. `host_tier_group` gives each rank's tree a place in one in-process group
(`tp_group.RankGroup`) and each rank's controller copies that finish late by lags of its own
(`hicache.lagging_acks`), so the ranks' counts differ and the MIN decides, as on GPUs. With
a storage tier too, each rank's controller meets the others' in its storage threads' own
groups (`storage.join_storage_groups`), its backups finishing late by lags of its own
and its store refusing writes of its own (`storage.imperfect_store`).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvcanary_cli.results.ranks import RankDump
from kvcanary_cli.soak.tp_group import RankGroup

__all__ = ["RankGlobals", "first_divergence", "host_tier_group"]

#: The module-level names of SGLang's tree components that hold process-wide counters (the
#: access-time counter, the component id counter of 0.5.13 - 0.5.20, the per-type ones of
#: later releases).
_COUNTER_NAMES = (
    "_LAST_ACCESS_TIME_COUNTER_FLOAT",
    "_COMPONENT_UUID_COUNTER",
    "_COMPONENT_UUID_COUNTERS",
)


def _counter_modules() -> list[Any]:
    """The loaded SGLang modules holding the tree's counters (where the release keeps them:
    `unified_cache_components.tree_component`, `unified_cache.components.tree_component` or
    `.base`)."""
    return [
        module
        for name, module in list(sys.modules.items())
        if name.startswith(_MEM_CACHE) and module is not None and hasattr(module, _COUNTER_NAMES[0])
    ]


#: where SGLang's memory cache modules live
_MEM_CACHE = "sglang.srt.mem_cache."
#: SGLang's unified tree node class, whose class-wide `counter` numbers every node made in a
#: process (0.5.23 on; older releases number nodes the same way where they have it)
_NODE_CLASS = "UnifiedTreeNode"


def _node_classes() -> list[Any]:
    """The loaded node classes that number their nodes from one class-wide counter, once
    each (a module that imports the class holds the same one)."""
    found: dict[int, Any] = {}
    for name, module in list(sys.modules.items()):
        node = getattr(module, _NODE_CLASS, None) if name.startswith(_MEM_CACHE) else None
        if isinstance(node, type) and type(vars(node).get("counter")) is int:
            found.setdefault(id(node), node)
    return list(found.values())


class RankGlobals:
    """Each rank's own copy of SGLang's process-wide tree counters; `as_rank(r)` runs a
    block with rank r's in place, and keeps what the block left for r's next turn."""

    def __init__(self, ranks: int) -> None:
        self._modules = _counter_modules()
        self._nodes = _node_classes()
        start = self._read()
        #: each rank's values, from one start: every rank's process imports the same tree
        self._saved = [copy.deepcopy(start) for _ in range(ranks)]

    def _read(self) -> dict[tuple[int, str], Any]:
        values = {
            (i, name): copy.deepcopy(getattr(module, name))
            for i, module in enumerate(self._modules)
            for name in _COUNTER_NAMES
            if hasattr(module, name)
        }
        values.update({(-1 - i, "counter"): node.counter for i, node in enumerate(self._nodes)})
        return values

    def _write(self, values: Mapping[tuple[int, str], Any]) -> None:
        for (i, name), value in values.items():
            holder = self._modules[i] if i >= 0 else self._nodes[-1 - i]
            setattr(holder, name, copy.deepcopy(value))

    def enter(self, rank: int) -> None:
        """Rank `rank`'s counters in place."""
        self._write(self._saved[rank])

    def leave(self, rank: int) -> None:
        """What rank `rank` left in the counters, kept for its next turn."""
        self._saved[rank] = self._read()

    @contextmanager
    def as_rank(self, rank: int) -> Iterator[None]:
        """Rank `rank`'s counters in place for the block, saved again after it."""
        self.enter(rank)
        try:
            yield
        finally:
            self.leave(rank)


def host_tier_group(schedulers: Sequence[Any], counters: RankGlobals) -> RankGroup | None:
    """With SGLang's host tier on several ranks: the group whose all-reduce each rank's tree
    meets the others' in (`tp_group`), each rank's copies finishing when they do
    (`hicache.lagging_acks`: lags drawn from the workload's seed and the rank), so the acks
    each rank takes are the group's MIN, as in a server. None: one rank, or no host tier."""
    import numpy as np

    from kvcanary_cli.soak.hicache import ACK_LAG, join_rank_group, lagging_acks
    from kvcanary_cli.soak.storage import imperfect_store, join_storage_groups

    trees = [scheduler.stack.tree for scheduler in schedulers]
    if len(trees) < 2 or getattr(trees[0], "cache_controller", None) is None:
        return None
    group = RankGroup(len(trees), counters.enter, counters.leave)
    for rank, (scheduler, tree) in enumerate(zip(schedulers, trees, strict=True)):
        join_rank_group(tree, group.handle(rank), len(trees))
        draw = np.random.default_rng([scheduler.workload.seed, 0x7A9, rank])

        def lag(draw: Any = draw) -> int:
            return int(draw.integers(0, ACK_LAG + 1))

        def clock(scheduler: Any = scheduler) -> int:
            return int(scheduler.step_no)

        lagging_acks(tree, clock, lag)
        if getattr(tree, "enable_storage", False):
            with counters.as_rank(rank):
                join_storage_groups(tree.cache_controller, group.handle(rank))
            imperfect_store(tree.cache_controller, clock, scheduler.workload.seed, rank)
    return group


def first_divergence(dumps: Sequence[Path]) -> RankDump | None:
    """The first rank (by rank) whose dump diverges from rank 0's, with its divergence, as
    `kvcanary ranks` names it; None: the ranks hold the same."""
    from kvcanary_cli.analysis.ranks import compare_ranks

    return compare_ranks(dumps).first_divergence
