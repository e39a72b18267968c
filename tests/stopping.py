"""Stopping a `kvcanary` process with SIGTERM mid-run, and what it leaves behind: for the tests
of the unwinding (`tests/cli/test_sigterm.py`) and `bench/hostile.py`'s figures.

The run is signalled once it is where it should be stopped (a predicate over its descendant
processes and what it has written so far, polled: never a fixed sleep). Every descendant seen
before the signal is remembered, so that one re-parented after its parent ended is still found.
On a terminal (`terminal=True`) the process gets a pseudo-terminal as its standard streams.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

__all__ = ["SHOW_CURSOR", "HIDE_CURSOR", "Stopped", "is_worker", "pause", "stop_when"]

#: The escapes a terminal program shows and hides the cursor with (DECTCEM).
SHOW_CURSOR = b"\x1b[?25h"
HIDE_CURSOR = b"\x1b[?25l"

#: Sees (the descendants alive now, the bytes written so far): True once the run may be stopped.
Ready = Callable[[list[psutil.Process], bytes], bool]


@dataclass
class Stopped:
    """What a signalled run left."""

    #: False when the run ended before it was ready (nothing was signalled).
    signalled: bool
    #: its exit status as `subprocess` gives it (-15: killed by SIGTERM itself).
    exit_code: int
    #: seconds from the signal to its exit.
    seconds: float = 0.0
    #: its descendants still alive (not zombies) `grace` seconds after it ended.
    survivors: list[psutil.Process] = field(default_factory=list)
    #: the survivors' resident memory, in bytes, when they were found.
    survivor_rss: int = 0
    #: its standard error (on a terminal: everything it wrote there).
    output: bytes = b""

    def cursor_restored(self) -> bool:
        """Whether the cursor it last hid was shown again."""
        return self.output.rfind(SHOW_CURSOR) > self.output.rfind(HIDE_CURSOR)

    def kill_survivors(self) -> None:
        """End what the run left behind (a test or the bench must not leak it either)."""
        for process in self.survivors:
            try:
                process.kill()
            except psutil.Error:
                pass


def is_worker(process: psutil.Process) -> bool:
    """Whether `process` is a worker spawned by `multiprocessing` (not its resource tracker)."""
    try:
        return "--multiprocessing-fork" in process.cmdline()
    except psutil.Error:
        return False


def pause(processes: list[psutil.Process]) -> None:
    """Stop `processes` (SIGSTOP): they cannot finish their work before whatever follows."""
    for process in processes:
        process.suspend()


def stop_when(
    args: Sequence[str],
    ready: Ready,
    *,
    tree: Path | None = None,
    terminal: bool = False,
    signal_number: int = signal.SIGTERM,
    timeout: float = 300,
    grace: float = 30,
) -> Stopped:
    """Run `kvcanary ARGS` (from `tree`'s checkout, else the one on the path), send it SIGTERM
    (or `signal_number`) once `ready` says so, and report what was left `grace` seconds after
    it ended."""
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="100")
    env.pop("NO_COLOR", None)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "kvcanary_cli", *args]
    output = _Output()
    if terminal:
        leader, follower = os.openpty()
        process = subprocess.Popen(
            command, stdin=follower, stdout=follower, stderr=follower, env=env, cwd=tree
        )
        os.close(follower)
        output.follow(leader, owned=True)
    else:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            cwd=tree,
        )
        assert process.stderr is not None
        output.follow(process.stderr.fileno(), owned=False)
    try:
        return _stop(process, ready, output, signal_number, timeout=timeout, grace=grace)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        output.close()
        if process.stderr is not None:
            process.stderr.close()


def _stop(
    process: subprocess.Popen[bytes],
    ready: Ready,
    output: _Output,
    signal_number: int,
    *,
    timeout: float,
    grace: float,
) -> Stopped:
    top = psutil.Process(process.pid)
    seen: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + timeout
    while True:
        try:
            alive = top.children(recursive=True)
        except psutil.Error:
            alive = []
        seen.update((child.pid, child) for child in alive)
        if process.poll() is not None:
            return Stopped(signalled=False, exit_code=process.returncode, output=output.text())
        if ready(alive, output.text()):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{process.args!r} never got ready to stop")
        time.sleep(0.005)
    process.send_signal(signal_number)
    signalled = time.monotonic()
    code = process.wait(timeout)
    seconds = time.monotonic() - signalled
    _, left = psutil.wait_procs(list(seen.values()), timeout=grace)
    survivors = [p for p in left if _running(p)]
    rss = 0
    for survivor in survivors:
        try:
            rss += survivor.memory_info().rss
        except psutil.Error:
            pass
    output.settle()
    return Stopped(
        signalled=True,
        exit_code=code,
        seconds=seconds,
        survivors=survivors,
        survivor_rss=rss,
        output=output.text(),
    )


def _running(process: psutil.Process) -> bool:
    """Alive and not a zombie (one re-parented to an init that has not reaped it yet)."""
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


class _Output:
    """Bytes read from a descriptor by a thread, so the writer never blocks on a full pipe or
    terminal. Survivors may keep the descriptor open: reading stops when told, not at EOF."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._ended = threading.Event()
        self._fd: int | None = None
        self._owned = False
        self._thread: threading.Thread | None = None

    def follow(self, fd: int, *, owned: bool) -> None:
        """Read `fd` from now on (`owned`: close it when done)."""
        self._fd, self._owned = fd, owned
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._fd is not None
        try:
            while not self._done.is_set():
                readable, _, _ = select.select([self._fd], [], [], 0.05)
                if not readable:
                    continue
                try:
                    chunk = os.read(self._fd, 65536)
                except OSError:  # EIO: a terminal whose every writer is gone
                    return
                if not chunk:
                    return
                with self._lock:
                    self._chunks.append(chunk)
        finally:
            self._ended.set()

    def text(self) -> bytes:
        with self._lock:
            return b"".join(self._chunks)

    def settle(self) -> None:
        """Wait until everything written is read: EOF, or a short quiet spell."""
        self._ended.wait(2)

    def close(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if self._fd is not None and self._owned:
            os.close(self._fd)
