"""`soak --tp N` on SGLang 0.5.23: N rank stacks in lockstep under soak's scheduler loop, each
audited as one rank is, every audited state compared with rank 0's by `kvcanary ranks`' own
comparison (`soak.tp`).

Clean twin: ranks of the real release hold the same state at every audited point (both tree
cores), and each rank keeps its own access-time counter, starting where a fresh process does.
Caught: a rank whose allocator hands out its free slots in another order parts from rank 0 at
the first allocation, and the failure names the rank and the divergence as `ranks` does; its
recorded dumps give the same divergence to `kvcanary ranks`, and the reproducer carries the
ranks. Under SGLang's overlapped loop (`--overlap --tp 2`) the same, the plan-time states
with the last result queued compared too. `--fault` with `--tp` is one error line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")


def _run(
    modules: Any, *, core: str = "python", tp: int = 2, overlap: bool = False, **options: Any
) -> Any:
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec

    spec = StackSpec.pressured(1, core, "swa")
    workload = history_workload(0, 0, 1, 1, "swa", overlap=overlap)
    return run_history(modules, spec, workload, max_steps=60, tp=tp, **options)


@pytest.mark.parametrize("core", ["python", pytest.param("rust", marks=pytest.mark.slow)])
def test_the_releases_ranks_hold_the_same_state(modules: Any, core: str) -> None:
    if core not in modules.cores:
        pytest.skip(f"no {core} tree core here")
    result = _run(modules, core=core)
    assert result.failure is None, result.failure
    assert result.sglang_step is None, result.sglang_first
    assert result.audited > 0


def test_each_rank_keeps_its_own_counters(modules: Any) -> None:
    """Each rank's access-time counter runs as its own process's would: both ranks end where
    one rank alone does, not at the sum of their stamps."""
    from kvcanary_cli.soak import tp

    [module] = tp._counter_modules()
    start = module._LAST_ACCESS_TIME_COUNTER_FLOAT
    _run(modules, tp=1)
    alone = module._LAST_ACCESS_TIME_COUNTER_FLOAT - start
    start = module._LAST_ACCESS_TIME_COUNTER_FLOAT
    _run(modules, tp=2)
    assert alone > 0
    assert module._LAST_ACCESS_TIME_COUNTER_FLOAT - start == alone


def _parting_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1's full allocator hands out its free slots in reverse order (a rank whose state
    parted before the history began): every allocation after that differs."""
    from kvcanary_cli.soak import run

    built: list[Any] = []
    real = run.history_stack

    def history_stack(*args: Any, **kwargs: Any) -> Any:
        stack = real(*args, **kwargs)
        built.append(stack)
        if len(built) % 2 == 0:
            full = getattr(stack.allocator, "full_attn_allocator", stack.allocator)
            full.free_pages = full.free_pages.flip(0)
        return stack

    monkeypatch.setattr(run, "history_stack", history_stack)


def test_a_rank_that_parts_is_named(modules: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    alone = _run(modules, tp=1)
    assert alone.failure is None  # one rank alone holds nothing wrong
    _parting_rank(monkeypatch)
    result = _run(modules)
    failure = result.failure
    assert failure is not None and failure.divergence is not None, failure
    assert failure.rank == "1"
    assert failure.key == f"ranks {failure.divergence.kind}"
    assert failure.mode == "plan" and failure.divergence.kind == "table"
    assert result.sglang_step is None  # each rank alone is sound: SGLang's checks say nothing


def test_overlapped_ranks_hold_the_same_state_and_a_parting_one_is_named(
    modules: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under SGLang's overlapped loop (`--overlap --tp 2`) the ranks' states are the same
    where the next batch is allocated with the last one's result still queued, as at every
    other audited point; a rank that parts is named there as under soak's other loop."""
    result = _run(modules, overlap=True)
    assert result.failure is None, result.failure
    assert result.sglang_step is None, result.sglang_first
    counters = result.counters.as_dict()
    assert counters["overlapped"] > 0 and counters["finishing_inflight"] > 0, counters
    _parting_rank(monkeypatch)
    failure = _run(modules, overlap=True).failure
    assert failure is not None and failure.divergence is not None, failure
    assert (failure.rank, failure.mode) == ("1", "plan")


@pytest.mark.parametrize("overlap", [False, True], ids=["normal-loop", "overlapped-loop"])
def test_a_rank_without_the_batch_rank_0_plans_is_compared_at_that_step(
    modules: Any, monkeypatch: pytest.MonkeyPatch, overlap: bool
) -> None:
    """Rank 1 chooses no batch at step 10, where rank 0 plans one: rank 1's state, recorded
    as it stands once its step is over, is compared as that step's, and the parting is the
    failure (it was an error: `ranks` refused the dumps of two steps)."""
    from kvcanary_cli.soak import driver

    made: list[Any] = []
    start, choose = driver.Scheduler.__init__, driver.Scheduler._next_batch

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        start(self, *args, **kwargs)
        made.append(self)

    def next_batch(self: Any, info: Any) -> Any:
        skipped = self is made[1] and self.step_no == 10
        return None if skipped else choose(self, info)

    monkeypatch.setattr(driver.Scheduler, "__init__", init)
    monkeypatch.setattr(driver.Scheduler, "_next_batch", next_batch)
    failure = _run(modules, overlap=overlap).failure
    assert failure is not None and failure.divergence is not None, failure
    assert (failure.rank, failure.step, failure.mode) == ("1", 10, "plan")


def test_the_parted_ranks_dumps_give_ranks_the_same_divergence(
    modules: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from kvcanary_cli.analysis.ranks import compare_ranks

    _parting_rank(monkeypatch)
    result = _run(modules, folder=tmp_path)
    failure = result.failure
    assert failure is not None and failure.dump is not None and failure.reference_dump
    report = compare_ranks([failure.reference_dump, failure.dump])
    first = report.first_divergence
    assert first is not None and first.rank == "1"
    assert first.divergence == failure.divergence


@pytest.mark.slow
def test_the_soak_writes_the_reference_dump_and_the_ranks_in_its_reproducer(
    modules: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from kvcanary_cli.soak.command import read_reproducer, soak

    _parting_rank(monkeypatch)
    tree = str(modules.tree.root)
    report = soak(
        sglang_tree=tree, steps=40, seed=0, page_size=1, core="python", out=tmp_path, tp=2
    )
    assert report.failure is not None and report.failure.divergence is not None
    assert report.tp == 2 and set(report.files) >= {"dump", "reference_dump", "reproducer"}
    shipped = read_reproducer(Path(report.files["reproducer"]))
    recorded, tp = shipped.recorded, shipped.tp
    assert (recorded, tp) == (f"ranks {report.failure.divergence.kind}", 2)
    older = json.loads(Path(report.files["reproducer"]).read_text())
    del older["tp"]
    (tmp_path / "older.json").write_text(json.dumps(older))
    assert read_reproducer(tmp_path / "older.json").tp == 1  # an earlier soak's: one rank


def test_a_fault_with_ranks_is_one_error_line(modules: Any, tmp_path: Path) -> None:
    from kvcanary_cli.errors import OptionError
    from kvcanary_cli.soak.command import soak

    tree = str(modules.tree.root)
    with pytest.raises(OptionError, match="--tp 1"):
        soak(sglang_tree=tree, steps=10, seed=0, fault="lock-leak", out=tmp_path, tp=2)
