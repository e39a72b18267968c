"""Several dumps at once: each dump's outcome is its own. A dump whose check runs out of
memory, or whose process dies (SIGBUS on a file truncated while mapped, the OOM killer's
SIGKILL), gets one error saying so; every other dump still gets its report."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from kvcanary_cli.analysis import check
from kvcanary_cli.analysis.check import check_dumps
from kvcanary_cli.analysis.dump_pool import DumpWork, check_alone
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.planners.base import Plan
from kvcanary_cli.planners.vectorized import VectorizedPlanner
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.synth.scenarios import make_scenario


class FailingPlanner(VectorizedPlanner):
    """Plans like the vectorized planner, except for the dump named `victim`: there it raises
    MemoryError, or (only ever inside a worker process) kills its process with `signal`."""

    def __init__(self, victim: str, signal_number: int | None = None) -> None:
        super().__init__()
        self.victim = victim
        self.signal_number = signal_number

    def plan(self, dump: KvDump, group: str, *, keep_entries: bool = True) -> Plan:
        if dump.path.name != self.victim:
            return super().plan(dump, group, keep_entries=keep_entries)
        if self.signal_number is None:
            raise MemoryError
        assert multiprocessing.parent_process() is not None, "never kill the test runner"
        os.kill(os.getpid(), self.signal_number)
        raise AssertionError("still alive")


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("outcomes")
    names = ("clean-swa", "truncated-lut", "use-after-free")
    return [make_scenario(n, seed=0).save(folder / f"{n}.safetensors") for n in names]


def _outcomes(report: CheckReport) -> list[str]:
    return ["error" if d.error else "report" for d in report.dumps]


def test_a_dump_out_of_memory_costs_only_its_own_report(three: list[Path]) -> None:
    planner = FailingPlanner("truncated-lut.safetensors")
    report = check_dumps(three, planner=planner, kernel=None, jobs=1)
    assert _outcomes(report) == ["report", "error", "report"]
    assert report.dumps[1].error == (
        f"{three[1]}: ran out of memory while kvcanary checked it (check it alone, or with "
        "fewer --jobs)"
    )
    assert report.bad_input and report.dumps[2].findings


@pytest.mark.slow
def test_a_worker_killed_by_a_signal_costs_only_its_dumps_report(
    three: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(check, "worker_count", lambda *_args: 2)  # a pool, whatever the cores
    planner = FailingPlanner("truncated-lut.safetensors", signal.SIGBUS)
    seen: list[tuple[int, int]] = []
    report = check_dumps(
        three, planner=planner, kernel=None, progress=lambda *done: seen.append(done)
    )
    assert _outcomes(report) == ["report", "error", "report"]
    assert [Path(d.path) for d in report.dumps] == three
    assert report.dumps[1].error == (
        f"{three[1]}: the process checking it was killed by SIGBUS (the file shrank while it "
        "was mapped: another process truncated or rewrote it; check a stable copy)"
    )
    assert report.dumps[2].findings
    assert seen == [(1, 3), (2, 3), (3, 3)]


def test_a_dump_checked_alone_says_how_its_process_died(three: list[Path]) -> None:
    planner = FailingPlanner("use-after-free.safetensors", signal.SIGKILL)
    work = DumpWork(path=str(three[2]), overrides={}, planner=planner, kernel=None, groups=None)
    report = check_alone(check._check_path, work, multiprocessing.get_context("spawn"))
    assert report.error == (
        f"{three[2]}: the process checking it was killed by SIGKILL (often the out-of-memory "
        "killer; check it alone, or with fewer --jobs)"
    )


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_stop_finds_the_spawned_workers_no_record_holds() -> None:
    """A stop that lands while the pool spawns a worker leaves it in no record of the pool's:
    the sweep finds this process's spawned children by their command line (a worker, here a
    spawned process nobody recorded), and not its other children."""
    import subprocess
    import sys
    import time

    from kvcanary_cli.analysis.dump_pool import _spawned_children

    worker = multiprocessing.get_context("spawn").Process(target=signal.pause)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    worker.start()  # returns once forked: its command line is the spawn's once it runs
    try:
        deadline = time.monotonic() + 30
        while worker.pid not in (found := _spawned_children()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.pid in found and other.pid not in found
    finally:
        worker.kill()
        worker.join()
        other.kill()
        other.wait()
    assert worker.pid not in _spawned_children()
