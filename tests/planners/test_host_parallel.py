"""`host_parallel`: an interpreted entries launch cut across forked processes writes the bytes
one process writes, and a part that fails in its child fails the plan here."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.errors import Terminated
from kvcanary_cli.planners import host_parallel
from kvcanary_cli.planners.triton_planner import TritonPlanner
from kvcanary_cli.synth.scenarios import SCENARIOS, make_scenario

pytest.importorskip("triton")
if not hasattr(os, "fork"):
    pytest.skip("no fork on this platform", allow_module_level=True)

IN_TURN = TritonPlanner(block_size=16, host_processes=1)
FORKED = TritonPlanner(block_size=16, host_processes=3)


@pytest.mark.parametrize("scenario", ["clean-swa", "truncated-lut", "stale-tail"])
def test_forked_parts_plan_what_one_process_plans(scenario: str, tmp_path: Path) -> None:
    dump = load_dump(make_scenario(scenario, seed=2).save(tmp_path / "d.safetensors"))
    assert FORKED.host_processes(10**6) == 3
    for group in dump.groups:
        forked, in_turn = FORKED.plan(dump, group), IN_TURN.plan(dump, group)
        assert forked.entries > 16  # two blocks or more: at least two parts have work
        for field in dataclasses.fields(forked):
            got, want = getattr(forked, field.name), getattr(in_turn, field.name)
            if isinstance(got, np.ndarray):
                assert got.dtype == want.dtype and np.array_equal(got, want), field.name
        assert forked.problems.same_as(in_turn.problems)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stop=st.integers(0, 5000), parts=st.integers(1, 5), align=st.sampled_from([1, 16, 1024]))
@pytest.mark.slow
def test_split_covers_the_range_in_order(stop: int, parts: int, align: int) -> None:
    ranges = host_parallel.split(stop, parts, align)
    assert len(ranges) <= parts
    assert [a for a, _ in ranges] == ([0, *(b for _, b in ranges[:-1])] if stop else [])
    assert (ranges[-1][1] if ranges else 0) == stop
    assert all(b > a for a, b in ranges)
    assert all(a % align == 0 for a, _ in ranges)  # parts start on a block


def test_a_part_that_fails_in_its_child_raises_here() -> None:
    ran: list[int] = []

    def fine() -> None:
        ran.append(1)  # in a child: invisible here

    def broken() -> None:
        raise RuntimeError("part broke")

    with pytest.raises(RuntimeError, match="part broke"):
        host_parallel.run_parts([fine, broken])
    assert ran == []  # the good part ran in its child only, the broken one again here


def test_small_plans_and_workers_do_not_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert host_parallel.host_processes(host_parallel.MIN_FORKED_ENTRIES - 1) == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(16)))
    assert host_parallel.host_processes(host_parallel.MIN_FORKED_ENTRIES) == 2  # never more
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0})
    assert host_parallel.host_processes(host_parallel.MIN_FORKED_ENTRIES) == 1  # one core
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    assert host_parallel.host_processes(1 << 30) == 1


def test_a_process_with_torch_never_forks(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's thread pools do not survive a fork: SGLang's planners may have loaded it."""
    monkeypatch.setitem(sys.modules, "torch", object())
    assert host_parallel.host_processes(1 << 30) == 1


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="glibc's mallopt",
)
def test_children_keep_their_freed_memory() -> None:
    """glibc's `mallopt` is found and takes both settings a child makes before its part
    (`mallopt` answers 1 for each). In a child of this test, so the test process keeps its
    own malloc settings."""
    mallopt = host_parallel._glibc_mallopt()
    assert mallopt is not None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, b"1" if host_parallel._reuse_freed_memory(mallopt) else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    assert host_parallel._reuse_freed_memory(None) is False


def test_every_scenario_is_listed() -> None:
    assert {"clean-swa", "truncated-lut", "stale-tail"} <= set(SCENARIOS)


def test_ctrl_c_in_a_child_stops_the_run_instead_of_redoing_the_part() -> None:
    ran_here: list[str] = []

    def interrupted() -> None:
        if os.getpid() != parent:
            raise KeyboardInterrupt
        ran_here.append("redone")  # only if the parent ran it again

    parent = os.getpid()
    with pytest.raises(KeyboardInterrupt):
        host_parallel.run_parts([interrupted, lambda: None])
    assert ran_here == []


def test_sigterm_in_a_child_stops_the_run_as_sigterm() -> None:
    """A child that the group's SIGTERM unwound (`Terminated`) stops the run as SIGTERM, not as
    Ctrl-C: the exit code says which (143, not 130)."""

    def terminated() -> None:
        if os.getpid() != parent:
            raise Terminated
        raise AssertionError("redone here")

    parent = os.getpid()
    with pytest.raises(KeyboardInterrupt) as stopped:  # a plain one would end the session
        host_parallel.run_parts([terminated, lambda: None])
    assert stopped.type is Terminated


#: Set: every fork of this process lingers in its after-fork hooks (registered once; a hook
#: cannot be taken back), where a stop that reaches the process lands in the next test.
_LINGER_AFTER_FORK = threading.Event()


def _linger() -> None:
    if _LINGER_AFTER_FORK.is_set():
        time.sleep(0.5)


os.register_at_fork(after_in_parent=_linger)


@pytest.mark.parametrize("bystander", [False, True], ids=["alone", "with-another-thread"])
def test_a_run_stopped_while_its_children_work_kills_them(bystander: bool) -> None:
    """Stopped while waiting (Ctrl-C, SIGTERM), the parent kills its children rather than
    leave them re-parented to finish (or never finish) their parts. The first child stops the
    parent (SIGINT) as soon as it runs; the parent's handler notes its children, then raises.

    One child signals, not both: a second SIGINT could reach this process after the test put
    pytest's handler back, and raise in whatever the next test runs (between taking a lock and
    the `try` that gives it back, logging's module lock once, which left the next fork in
    another thread, and then every executor of that worker, waiting forever).

    With another thread in the process (a test's, a library's), Ctrl-C goes to that thread
    while the forking one holds it back, and Python runs the handler in the main thread at its
    next instruction: inside `os.fork`'s after-fork hooks (logging's own among them), where
    the KeyboardInterrupt is swallowed ("Exception ignored") and, in logging's, left its lock
    held, so the next fork waited forever. The stop is kept for after the fork instead; the
    forks linger in their hooks here so that the stop lands there."""
    parent = os.getpid()
    before = {child.pid for child in psutil.Process(parent).children()}  # not this run's
    children: list[psutil.Process] = []

    def stop(signum: int, frame: object) -> None:
        if not children:
            children.extend(c for c in psutil.Process(parent).children() if c.pid not in before)
            raise KeyboardInterrupt

    def signalling() -> None:
        os.kill(parent, signal.SIGINT)
        time.sleep(60)

    def forever() -> None:
        time.sleep(60)

    waiting = threading.Event()
    other = threading.Thread(target=waiting.wait)
    previous = signal.signal(signal.SIGINT, stop)
    if bystander:
        other.start()
        _LINGER_AFTER_FORK.set()
    try:
        with pytest.raises(KeyboardInterrupt):
            host_parallel.run_parts([signalling, forever])
    finally:
        _LINGER_AFTER_FORK.clear()
        signal.signal(signal.SIGINT, previous)
        waiting.set()
        if bystander:
            other.join()
        _, alive = psutil.wait_procs(children, timeout=0)
        for child in alive:
            child.kill()
    assert children and alive == []


def test_a_stop_another_thread_takes_stops_the_run_before_its_children_finish(
    tmp_path: Path,
) -> None:
    """A process-wide SIGINT (`kill -INT PID`, which the children do not get) that another
    thread of the process takes runs its handler in the main thread at its next instruction:
    the waiting main thread still gets it while the children work, and kills them. A
    blocking `waitpid` noticed it only once a child had finished its part: the files below
    were written, after the children's 20 s."""
    parent = os.getpid()
    before = {child.pid for child in psutil.Process(parent).children()}  # not this run's
    started, finished = tmp_path / "started", tmp_path / "finished"
    started.mkdir()
    finished.mkdir()

    def working() -> None:
        (started / str(os.getpid())).touch()
        time.sleep(20)
        (finished / str(os.getpid())).touch()

    waiting = threading.Event()
    bystander = threading.Thread(target=waiting.wait)
    bystander.start()

    def stop_once_both_work() -> None:
        while len(list(started.iterdir())) < 2 and not waiting.is_set():
            time.sleep(0.01)
        # the signal as the kernel hands it to a thread that is not the main one
        signal.pthread_kill(bystander.ident or 0, signal.SIGINT)

    stopper = threading.Thread(target=stop_once_both_work)
    previous = signal.signal(signal.SIGINT, lambda signum, frame: _raise_interrupt(parent))
    try:
        stopper.start()
        with pytest.raises(KeyboardInterrupt):
            host_parallel.run_parts([working, working])
    finally:
        signal.signal(signal.SIGINT, previous)
        waiting.set()
        stopper.join()
        bystander.join()
    assert len(list(started.iterdir())) == 2
    assert list(finished.iterdir()) == []  # killed at their work, not after it
    # killed and reaped: none is left, not even as a zombie
    assert [c.pid for c in psutil.Process(parent).children() if c.pid not in before] == []


def test_children_are_awaited_in_a_process_with_many_files_open() -> None:
    """A process holding a thousand files (memory-mapped tensors keep theirs) numbers a
    child's pidfd past 1023, which `select.select` refuses (ValueError): the run still
    waits for its children and returns."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        pytest.skip(f"this process may open {soft} files")
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        host_parallel.run_parts([lambda: time.sleep(0.2), lambda: time.sleep(0.2)])  # waited for
    finally:
        for fd in held:
            os.close(fd)


def _raise_interrupt(parent: int) -> None:
    if os.getpid() == parent:
        raise KeyboardInterrupt


@pytest.mark.parametrize("at", ["_noting", "_restore"])
def test_a_stop_between_two_instructions_of_a_fork_leaves_the_stops_unblocked(
    at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python runs a handler at an instruction: a Ctrl-C that came just before the stops
    are blocked raises as the handlers are being replaced (`_noting`), and one that another
    thread takes raises as they come back (`_restore`). Either way the run stops, and the
    main thread's stops are not left blocked, nor a handler left noting (they were left
    blocked 4 runs in 300 of a random race: the next run then slept through Ctrl-C in
    `waitpid`, taken by a thread that could not wake it)."""
    parent = os.getpid()
    waiting = threading.Event()
    other = threading.Thread(target=waiting.wait)
    other.start()
    real = getattr(host_parallel, at)
    sent: list[int] = []

    def stopped() -> None:
        if os.getpid() == parent and not sent:
            sent.append(signal.SIGINT)
            assert other.ident is not None
            signal.pthread_kill(other.ident, signal.SIGINT)  # that thread takes it
            time.sleep(0.2)  # the main thread runs the handler at an instruction in here

    def then_stopped(*args: object) -> object:
        if at == "_noting":  # before the handlers are replaced: the run's own handler runs
            stopped()
            return real(*args)
        done = real(*args)  # once they are back
        stopped()
        return done

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(host_parallel, at, then_stopped)
    previous = signal.signal(signal.SIGINT, stop)
    try:
        with pytest.raises(KeyboardInterrupt):
            host_parallel.run_parts([lambda: time.sleep(60), lambda: time.sleep(60)])
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        handler = signal.getsignal(signal.SIGINT)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT, signal.SIGTERM])
        signal.signal(signal.SIGINT, previous)
        waiting.set()
        other.join()
    assert sent and not blocked & {signal.SIGINT, signal.SIGTERM} and handler is stop


def test_stop_children_ends_a_run_waiting_in_another_thread() -> None:
    """`check` plans the kernel in a second thread; the main one, stopped, stops its children
    (`stop_children`): the waiting thread raises KeyboardInterrupt rather than redo parts."""
    me = psutil.Process()
    before = {child.pid for child in me.children()}
    outcome: list[BaseException] = []

    def waiting() -> None:
        try:
            host_parallel.run_parts([lambda: time.sleep(60), lambda: time.sleep(60)])
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=waiting)
    thread.start()
    deadline = time.monotonic() + 60
    while len(forked := [c for c in me.children() if c.pid not in before]) < 2:
        assert time.monotonic() < deadline, "the children never started"
        time.sleep(0.01)
    host_parallel.stop_children()
    thread.join(60)
    _, alive = psutil.wait_procs(forked, timeout=0)
    for child in alive:
        child.kill()
    assert [type(exc) for exc in outcome] == [KeyboardInterrupt] and alive == []
