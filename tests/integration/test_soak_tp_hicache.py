"""`soak --tp 2 --hicache` on SGLang 0.5.23: two rank stacks, each with its own host pools and
cache controller, whose copies finish when they do (late by drawn lags), the write-through and
load-back acks MIN-reduced over the ranks by the tree's own `check_hicache_events`, through
soak's in-process stand-in for the TP group's all-reduce (`soak.tp_group`).

Clean twin: the release's ranks hold the same state at every audited point, SGLang's checks
silent, with the all-reduce met every step and the ranks' own ready counts differing at some
(the MIN decided). Caught: a tree that takes each rank's own write-through count instead of the
group's (bench/mutants.py `write-ack-not-reduced`) parts the ranks, while one rank alone under
the same edit is clean and SGLang's checks stay silent.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow


def _run(modules: Any, monkeypatch: pytest.MonkeyPatch, *, tp: int = 2, steps: int = 120) -> Any:
    """History 0 of seed 0 (write-through, page size 1, the Python core) on `tp` ranks; the
    result, and the ranks' group (None on one rank)."""
    from kvcanary_cli.soak import run
    from kvcanary_cli.soak import tp as ranks
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.stack import StackSpec

    groups: list[Any] = []
    real = ranks.host_tier_group

    def kept(*args: Any) -> Any:
        groups.append(real(*args))
        return groups[-1]

    monkeypatch.setattr(run, "host_tier_group", kept)
    spec = StackSpec.pressured(1, "python", "swa")
    workload = history_workload(0, 0, 1, 1, "swa", hicache=True)
    result = run.run_history(modules, spec, workload, max_steps=steps, tp=tp)
    return result, (groups[-1] if groups else None)


def _own_write_acks(modules: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: the write-through count each rank takes is its own ready count, not the
    group's MIN (the load-backs' still the MIN)."""
    tree = modules.unified_radix_cache.UnifiedRadixCache
    if not hasattr(tree, "_sync_hicache_ready_counts"):
        pytest.skip("this SGLang reduces its acks in writing_check itself")
    real = tree._sync_hicache_ready_counts

    def own_write_acks(self: Any) -> Any:
        own = self._count_ready_acks(self.cache_controller.ack_write_queue)
        return (own, *real(self)[1:])

    monkeypatch.setattr(tree, "_sync_hicache_ready_counts", own_write_acks)


def test_the_releases_ranks_agree_on_their_acks(
    modules: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, group = _run(modules, monkeypatch)
    assert result.failure is None, result.failure
    assert result.sglang_step is None, result.sglang_first
    assert group is not None and group.collectives >= result.steps
    assert group.decided > 0  # the ranks' own counts differed: the MIN decided
    assert result.counters.host_loads > 0


def test_a_rank_taking_its_own_write_acks_parts_the_ranks(
    modules: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _own_write_acks(modules, monkeypatch)
    alone, _ = _run(modules, monkeypatch, tp=1)
    assert alone.failure is None and alone.sglang_step is None  # one rank: its count is the MIN
    result, _ = _run(modules, monkeypatch)
    failure = result.failure
    assert failure is not None and failure.divergence is not None, failure
    assert failure.rank == "1" and failure.key == f"ranks {failure.divergence.kind}"
    assert result.sglang_step is None  # each rank alone is sound: SGLang's checks say nothing
