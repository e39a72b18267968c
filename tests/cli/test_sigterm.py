"""SIGTERM unwinds a run like Ctrl-C: exit 143, and nothing is left behind: no worker process,
no staged file, no hidden cursor (each stopped mid-run in a real process: `tests/stopping.py`).
"""

from __future__ import annotations

import signal
from pathlib import Path

import psutil
import pytest

from kvcanary_cli.planners.host_parallel import usable_cores
from kvcanary_cli.synth.scenarios import make_scenario
from tests.stopping import HIDE_CURSOR, Stopped, is_worker, pause, stop_when

#: The shell's 128 + SIGTERM.
TERMINATED = 143

needs_two_cores = pytest.mark.skipif(
    usable_cores() < 2, reason="check -j 2 runs in-process on a single core: no worker to stop"
)


@pytest.fixture(scope="module")
def four_dumps(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Four dumps for `check -j 2`: workers are still busy when they are signalled."""
    path = make_scenario("clean-swa", size="small").save(
        tmp_path_factory.mktemp("dumps") / "small.safetensors"
    )
    return [str(path)] * 4


def _two_workers(alive: list[psutil.Process], _written: bytes) -> bool:
    return sum(map(is_worker, alive)) >= 2


def _two_paused_workers(alive: list[psutil.Process], written: bytes) -> bool:
    """Two workers, paused: `check` can only end by ending them, not by waiting for them."""
    if not _two_workers(alive, written):
        return False
    pause([process for process in alive if is_worker(process)])
    return True


def _checked(stopped: Stopped) -> Stopped:
    assert stopped.signalled, "the run ended before it could be stopped"
    return stopped


@needs_two_cores
@pytest.mark.slow
def test_sigterm_ends_the_workers_of_check_jobs(four_dumps: list[str]) -> None:
    """The workers and multiprocessing's resource tracker end with `check`, at once (the
    workers are paused: waiting for their dumps would never end). They once stayed,
    re-parented, blocked on a queue nobody fed (166 MB each)."""
    args = ["check", *four_dumps, "-j", "2"]
    stopped = _checked(stop_when(args, _two_paused_workers))
    try:
        assert stopped.exit_code == TERMINATED, stopped.output
        assert stopped.survivors == []
        assert stopped.output.decode().strip().splitlines()[-1] == "terminated"
    finally:
        stopped.kill_survivors()


@needs_two_cores
@pytest.mark.slow
def test_the_workers_die_with_a_killed_check(four_dumps: list[str]) -> None:
    """SIGKILL (the out-of-memory killer) runs no clean-up: the kernel ends the workers."""
    args = ["check", *four_dumps, "-j", "2"]
    stopped = _checked(stop_when(args, _two_workers, signal_number=signal.SIGKILL))
    try:
        assert stopped.exit_code == -signal.SIGKILL
        assert stopped.survivors == []
    finally:
        stopped.kill_survivors()


@pytest.mark.slow
def test_sigterm_mid_write_leaves_no_staged_file(tmp_path: Path) -> None:
    """A writer stopped while its staged `.NAME.XXXX.tmp` is being written removes it (a
    medium dump: 285 MB, long enough to be caught mid-write)."""
    out = tmp_path / "out"
    out.mkdir()

    def staging(_alive: list[psutil.Process], _written: bytes) -> bool:
        return any(out.glob(".*.tmp"))

    args = ["synth", "clean-swa", "--size", "medium", "--out", str(out / "big.safetensors")]
    for _ in range(3):  # on a loaded machine the write may end before the signal lands
        stopped = _checked(stop_when(args, staging))
        left = sorted(p.name for p in out.iterdir())
        if left != ["big.safetensors"]:  # stopped mid-write: what this test is about
            break
        (out / "big.safetensors").unlink()  # written whole before the stop: not a case
    assert stopped.exit_code == TERMINATED, stopped.output
    assert left == []


@pytest.mark.slow  # a four-dump check killed mid-run (3 s): the fast lane keeps the others
@needs_two_cores
def test_sigterm_shows_the_cursor_the_progress_bar_hid(four_dumps: list[str]) -> None:
    """On a terminal, the progress bar's hidden cursor is shown again."""

    def bar_and_workers(alive: list[psutil.Process], written: bytes) -> bool:
        return HIDE_CURSOR in written and _two_workers(alive, written)

    args = ["check", *four_dumps, "-j", "2"]
    stopped = _checked(stop_when(args, bar_and_workers, terminal=True))
    try:
        assert stopped.exit_code == TERMINATED, stopped.output
        assert stopped.cursor_restored(), stopped.output[-300:]
    finally:
        stopped.kill_survivors()
