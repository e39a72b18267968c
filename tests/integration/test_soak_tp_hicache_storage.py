"""`soak --tp 2 --hicache --hicache-storage` on SGLang 0.5.23: two rank stacks, each with its
own host tier and storage tier (SGLang's file backend, both ranks in one folder, each rank's
pages named for it), each rank's storage threads pumped inside its own step, so the
controller's prefetch hit and completion all-reduces (its own gloo groups, made again of the
ranks' group: `soak.storage.join_storage_groups`) meet the other rank's in soak's in-process
group (`soak.tp_group`).

Clean twin: the ranks hold the same state at every audited point and SGLang's checks stay
silent, with the tree's ack all-reduce met every step (the MIN decided at some), the storage
groups' all-reduces met, the hit query's MIN deciding at some (each rank's store refuses
writes of its own: `storage.refusing_writes`), and both ranks' pages in the one folder.
Caught: the planted `storage-ack-frees-host` fault, planted on every rank, is named on two
ranks as on one; a rank whose controller skips the hit query's all-reduce parts the ranks
(no hang)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow


def test_two_ranks_with_storage_meet_at_every_storage_collective(
    modules: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from kvcanary_cli.soak import command, run
    from kvcanary_cli.soak import tp as ranks
    from kvcanary_cli.soak.stack import Stack
    from kvcanary_cli.soak.storage import SYNC_GROUPS
    from kvcanary_cli.soak.tp_group import TP

    groups: list[Any] = []
    names: list[str] = []
    real, close = ranks.host_tier_group, Stack.close

    def kept(*args: Any) -> Any:
        groups.append(real(*args))
        return groups[-1]

    def listed(stack: Any) -> None:
        folder = Path(stack.storage.folder.name)
        names.extend(page.name for page in folder.glob("*.bin"))
        close(stack)

    monkeypatch.setattr(run, "host_tier_group", kept)
    monkeypatch.setattr(Stack, "close", listed)
    report = command.soak(
        sglang_tree=str(modules.tree.root),
        steps=80,
        seed=0,
        page_size=1,
        core="python",
        out=tmp_path / "out",
        hicache=True,
        hicache_storage=True,
        tp=2,
    )
    assert report.failure is None, report.failure
    assert report.sglang_checks == (), report.sglang_checks
    assert report.tp == 2 and report.steps == 80
    (group,) = groups
    assert group.met[TP] >= report.steps and group.decided_in[TP] > 0
    assert group.met.get(SYNC_GROUPS[0], 0) > 0  # every hit query met the other rank's
    assert group.decided_in[SYNC_GROUPS[0]] > 0  # the ranks' stores differed where read
    assert set(group.met) <= {TP, *SYNC_GROUPS}
    suffixes = {name.rsplit(".", 1)[0].rsplit("_", 2)[-2:][0] for name in names}
    assert suffixes == {"0", "1"}  # one folder, each rank's own pages
    assert not (tmp_path / "out").exists()


def test_the_storage_fault_is_named_on_two_ranks(modules: Any) -> None:
    """Its clean twin is the test above (the same history, no fault)."""
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec

    workload = history_workload(0, 0, 1, 1, hicache=True, storage=True)
    result = run_history(
        modules,
        StackSpec.pressured(1, "python"),
        workload,
        fault="storage-ack-frees-host",
        tp=2,
    )
    failure = result.failure
    assert failure is not None and failure.divergence is None, failure
    assert "host-slot-free-and-held" in failure.codes
    assert failure.rank == "0" and result.fault_acted > 0
    assert result.sglang_step is None


def test_a_rank_skipping_its_hit_query_all_reduce_parts_the_ranks(
    modules: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1's controller takes its own hit count without the all-reduce: rank 0 waits at
    the hit query's group while rank 1 reaches the tree's, which a server would hang at;
    soak fails the history at once as `RanksParted`, naming both groups."""
    from kvcanary_cli.soak import run
    from kvcanary_cli.soak import tp as ranks
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.stack import StackSpec

    real = ranks.host_tier_group

    def skipping(schedulers: Any, counters: Any) -> Any:
        group = real(schedulers, counters)
        controller = schedulers[1].stack.tree.cache_controller
        controller._sync_prefetch_hit_query = lambda operation, hits: hits
        return group

    monkeypatch.setattr(run, "host_tier_group", skipping)
    workload = history_workload(0, 0, 1, 1, hicache=True, storage=True)
    result = run.run_history(modules, StackSpec.pressured(1, "python"), workload, tp=2)
    crash = None if result.failure is None else result.failure.crash
    assert crash is not None and crash.exception == "RanksParted", result.failure
    assert "different groups (prefetch_hits_sync_groups, tp)" in crash.message


def test_a_ranks_backups_finish_late_and_in_order() -> None:
    """`LaggingBackups`: each write finishes its lag after it was queued, never before the one
    queued before it; the pump's stop event reads set while the head is not due."""
    from kvcanary_cli.soak.storage import LaggingBackups, _SetWhenEmpty

    clock = [0]
    lags = iter([2, 0])
    queue = LaggingBackups(lambda: clock[0], lambda: next(lags))
    queue.put("first")
    queue.put("second")  # no lag of its own, but behind the first
    stop = _SetWhenEmpty(queue)
    due = []
    for clock[0] in range(3):
        due.append((queue.due(), stop.is_set()))
    assert due == [(False, True), (False, True), (True, False)]
    assert [queue.get_nowait(), queue.get_nowait()] == ["first", "second"]
    assert queue.due() and stop.is_set()  # empty: nothing to wait for


def test_a_ranks_store_refuses_only_new_pages() -> None:
    """`refusing_writes`: a refused page is not written (the backend says so, as its evictor's
    refusal does); a page already stored is answered stored, never refused."""
    from types import SimpleNamespace

    from kvcanary_cli.soak.storage import refusing_writes

    stored: set[str] = set()

    def write(key: str, value: object = None) -> bool:
        stored.add(key)
        return True

    backend = SimpleNamespace(set=write, exists=lambda key: key in stored)
    refusals = iter([False, True, True])
    refusing_writes(SimpleNamespace(storage_backend=backend), lambda: next(refusals))
    assert backend.set("a", b"") and not backend.set("b", b"")
    assert backend.set("a", b"")  # stored already: not asked whether to refuse
    assert stored == {"a"} and next(refusals)  # one refusal left undrawn


def test_write_back_reclaims_of_returns_match_on_two_ranks(
    modules: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 0's third history on two ranks (`write_back`, page size 4): its returns make the
    write-back reclaim host duplicates, and SGLang's TP check compares the ranks' digests of
    the reclaimed node ids. Each rank numbering its own nodes (`RankGlobals`), it runs clean;
    with one counter shared, SGLang's check crashed it at step 74 (its twin:
    tests/test_soak_tp_counters.py)."""
    from importlib import import_module

    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec

    core = import_module("sglang.srt.mem_cache.unified_cache.unified_tree_core").UnifiedTreeCore
    reclaims: list[int] = []
    real = core._release_full_host_duplicate

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        reclaims.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(core, "_release_full_host_duplicate", counted)
    workload = history_workload(0, 2, 4, 4, hicache=True, storage=True)
    assert workload.hicache_write_policy == "write_back"
    result = run_history(modules, StackSpec.pressured(4, "python"), workload, tp=2, max_steps=80)
    assert result.failure is None, result.failure
    assert result.sglang_step is None, result.sglang_first
    assert reclaims  # the digests the ranks compared were not both empty
