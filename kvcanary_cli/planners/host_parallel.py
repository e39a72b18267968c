"""Parts of an interpreted kernel launch run in forked processes, on the host's spare cores.

The Triton interpreter runs a launch's programs one after another on one core, and holds the
GIL while it does. The programs of the entries kernel are independent (each writes its own
entries), so on a host with cores to spare the launch is cut into contiguous entry ranges,
each run by a forked child writing into shared memory (`triton_runtime.shared_host_arrays`),
while the parent, which only waits, leaves its core to the rest of `check`. The outputs are
the bytes one process would write; `tests/planners/test_host_parallel.py` compares them.

Only where it is safe and worth it: Linux (`fork`), the interpreter, no torch in the process
(a process running torch's threads must not fork), a plan of at least `MIN_FORKED_ENTRIES`,
and not inside a worker process of `check_dumps` (each already has its core). A child runs
only its part (the interpreter and numpy, no lock another thread of `check` may hold) and
leaves with `os._exit`: no stdio flushed twice, no parent cleanup run in it. A child that
dies (killed, out of memory) costs time, not results: its part runs again here. A run stopped
while its children work (Ctrl-C, SIGTERM; in another thread: `stop_children`) kills them: none
outlives it.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvcanary_cli.errors import Terminated

__all__ = [
    "MIN_FORKED_ENTRIES",
    "host_processes",
    "run_parts",
    "split",
    "stop_children",
    "usable_cores",
]

#: Below this many entries a fork costs more than it saves.
MIN_FORKED_ENTRIES = 1 << 19
#: The most processes one launch uses (the rest of `check` needs a core too).
_MAX_PROCESSES = 2
#: Seconds the waiting thread sleeps at most between looks for a stop that another thread of
#: the process took (see `_wait`).
_STOP_LATENCY = 0.05
#: A child's exit code when Ctrl-C stopped it (the shell's 128 + SIGINT), or SIGTERM (128 + 15).
_INTERRUPTED = 130
_TERMINATED = 143


def usable_cores() -> int:
    """Cores this process may keep busy: its CPU affinity, but one inside a worker process
    of `check_dumps` (which gives each worker its own core)."""
    if multiprocessing.parent_process() is not None:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores or 1)


def host_processes(entries: int) -> int:
    """How many forked processes should run a launch of `entries` here (1: none, in turn)."""
    if entries < MIN_FORKED_ENTRIES or sys.platform != "linux" or "torch" in sys.modules:
        return 1
    return min(_MAX_PROCESSES, usable_cores())


def split(stop: int, parts: int, align: int) -> list[tuple[int, int]]:
    """`[0, stop)` cut into at most `parts` contiguous ranges whose inner bounds are multiples
    of `align` (a kernel block)."""
    step = -(-stop // max(parts, 1))
    step = max(align, -(-step // align) * align)
    return [(start, min(start + step, stop)) for start in range(0, stop, step)]


def run_parts(parts: Sequence[Callable[[], None]]) -> None:
    """Run each part in a forked child of its own and wait for all (a single part runs here).

    A part that fails in its child is run again here, so that its exception (with its
    traceback) reaches the caller as if it had never been forked.
    """
    if len(parts) <= 1:
        for part in parts:
            part()
        return
    mallopt = _glibc_mallopt()  # looked up once, here: the children only call it
    children = _Children()
    codes: list[tuple[int, Callable[[], None]]] = []
    with _LOCK:
        _RUNNING.add(children)
    try:
        for part in parts:
            _fork(part, mallopt, children)
        for pid, part in list(children.parts.items()):
            status = _wait(pid)
            children.reaped(pid)
            codes.append((os.waitstatus_to_exitcode(status), part))
    except BaseException:  # stopped (Ctrl-C, SIGTERM): no child outlives the run
        children.stop()
        children.reap()
        raise
    finally:
        with _LOCK:
            _RUNNING.discard(children)
    if children.stopped:
        raise KeyboardInterrupt  # `stop_children`: the run stops, its parts are not redone
    if any(code == _TERMINATED for code, _ in codes):
        raise Terminated  # SIGTERM reached the process group: stop as the parent would
    if any(code in (_INTERRUPTED, -signal.SIGINT) for code, _ in codes):
        raise KeyboardInterrupt  # the user stopped the run: do not redo the parts here
    for code, part in codes:
        if code != 0:
            part()


def _wait(pid: int) -> int:
    """`os.waitpid(pid, 0)`'s status, but a stop reaches the waiting thread within
    `_STOP_LATENCY` seconds.

    Python runs a stop's handler in the main thread at its next instruction, and a main thread
    blocked in `waitpid` has none. A stop that another thread of the process took (one that
    `check`, a library or the test runner started), or that came just before the wait began
    (after Python last looked), is not seen until a child exits, after its whole part
    (`kill PID` reaches the parent alone). So the wait is a child's exit (its pidfd, where
    Linux has one) or a short sleep, in turn."""
    try:
        exited: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (before Linux 5.3): sleep in turn
        exited = None
    try:
        ready = select.poll()  # not `select.select`: a pidfd may be numbered past 1023
        if exited is not None:
            ready.register(exited, select.POLLIN)
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            if exited is None:
                time.sleep(_STOP_LATENCY)
            else:
                ready.poll(_STOP_LATENCY * 1000)
    finally:
        if exited is not None:
            os.close(exited)


class _Children:
    """The forked children of one `run_parts` not yet reaped, by pid, with their parts."""

    def __init__(self) -> None:
        self.parts: dict[int, Callable[[], None]] = {}
        self.stopped = False
        self._lock = threading.Lock()

    def add(self, pid: int, part: Callable[[], None]) -> None:
        """A child just forked (killed at once when the run stopped while it was forked)."""
        with self._lock:
            self.parts[pid] = part
            if self.stopped:
                os.kill(pid, signal.SIGKILL)

    def reaped(self, pid: int) -> None:
        with self._lock:
            del self.parts[pid]

    def stop(self) -> None:
        """Kill every child not yet reaped (the waiting thread reaps them)."""
        with self._lock:
            self.stopped = True
            for pid in self.parts:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:  # reaped just before
                    pass

    def reap(self) -> None:
        with self._lock:
            for pid in list(self.parts):
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:  # reaped just before the stop
                    pass
                del self.parts[pid]


#: Every `run_parts` waiting now (another thread's, beside the detectors of `check`).
_RUNNING: set[_Children] = set()
_LOCK = threading.Lock()


def stop_children() -> None:
    """Kill the forked children of every `run_parts` in progress, in any thread: each then
    raises KeyboardInterrupt instead of redoing their parts. For a run that stops in another
    thread than the one waiting on them (the main one gets Ctrl-C and SIGTERM)."""
    with _LOCK:
        running = list(_RUNNING)
    for children in running:
        children.stop()


#: The signals that stop a run; held back while a child is forked and recorded.
_STOPS = {signal.SIGINT, signal.SIGTERM}


def _fork(
    part: Callable[[], None],
    mallopt: Callable[[int, int], int] | None,
    children: _Children,
) -> None:
    """Fork a child running `part`, and add it to `children`. Ctrl-C and SIGTERM wait until
    the parent holds the pid (so that it can kill the child) and the child is inside its `try`
    (so that it leaves by `os._exit`, never by unwinding a copy of the parent's stack).

    Blocking them in this thread is not enough when the process has another thread: the
    signal goes to that one, and Python runs the handler in the main thread at once, inside
    `os.fork`'s after-fork hooks (logging's among them), which swallow its exception and may
    keep logging's lock: the stop was lost and the next fork waited forever. So the main
    thread's handlers only note a stop while it forks, raised again once the child is held.

    Python runs a handler at an instruction, so a Ctrl-C may raise between any two of them
    here (one that came just before the block, one another thread takes once a handler is
    back): the mask and the handlers are set inside the `try` and put back in its `finally`,
    the mask first (while stops are only noted), each handler recorded before it is
    replaced. A mask left blocked made the next run sleep through Ctrl-C in `waitpid`."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, ())  # the mask as it is, to put back
    noted: list[int] = []
    handlers: dict[int, Any] = {}
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
        _noting(noted, handlers)
        pid = os.fork()
        if pid == 0:  # the child: run the part, leave without unwinding the parent's stack
            code = 1
            try:
                _restore(handlers)
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
                _reuse_freed_memory(mallopt)
                part()
                code = 0
            except KeyboardInterrupt as exc:  # Ctrl-C reaches the whole process group
                code = _TERMINATED if isinstance(exc, Terminated) else _INTERRUPTED
            finally:
                os._exit(code)
        children.add(pid, part)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        _restore(handlers)
        for signum in noted:
            signal.raise_signal(signum)  # its own handler, now: the run stops here


def _noting(noted: list[int], replaced: dict[int, Any]) -> None:
    """In the main thread, where Python runs signal handlers: each stop's handler replaced by
    one that notes it in `noted`, and recorded in `replaced` first, to put back (`_restore`)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in _STOPS:
        handler = signal.getsignal(signum)
        if callable(handler):
            replaced[signum] = handler
            signal.signal(signum, lambda signum, _: noted.append(signum))


def _restore(handlers: dict[int, Any]) -> None:
    """Put the handlers back; a stop raised by one already back (at the next instruction)
    does not leave the others noting."""
    left = dict(handlers)
    try:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
            del left[signum]
    finally:
        for signum, handler in left.items():
            signal.signal(signum, handler)


#: glibc's `mallopt` parameters (malloc.h), and the size from which a child's allocations
#: are mapped on their own (glibc's own ceiling for its adaptive threshold): the
#: interpreter's temporaries, a few MiB each, come from the heap below it.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_LARGEST_HEAP_BLOCK = 32 << 20


@functools.cache
def _glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's `mallopt`, or None where the C library has none (then nothing is tuned)."""
    try:
        import ctypes

        function: Callable[[int, int], int] = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    return function


def _reuse_freed_memory(mallopt: Callable[[int, int], int] | None) -> bool:
    """In a forked child: keep freed memory for the next allocations instead of handing it
    back to the system.

    The interpreter allocates and frees block-sized temporaries for every operation of every
    program. By default glibc maps large ones afresh and trims its heap as they are freed,
    so each operation faults its pages in again, or copies those the heap shares with the
    parent. Measured on the medium bench plan (2.2 M + 0.9 M entries, two children): 448 K
    page faults became 80 K, the children's system time 0.9 s became 0.2 s and the plan 1.2 s
    became 0.7 s. What a child holds goes back to the system when it exits. True when glibc
    took both settings."""
    if mallopt is None:
        return False
    taken = mallopt(_M_MMAP_THRESHOLD, _LARGEST_HEAP_BLOCK) == 1
    return mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1 and taken
