"""Parts of an interpreted kernel launch run in forked processes, on the host's spare cores.

The Triton interpreter runs a launch's programs one after another on one core, and holds the
GIL while it does. The programs of the entries kernel are independent (each writes its own
entries), so on a host with cores to spare the launch is cut into contiguous entry ranges,
each run by a forked child writing into shared memory (`kernel_arrays.shared_host_arrays`),
while the parent, which only waits, leaves its core to the rest of `check`. The outputs are
the bytes one process would write; `tests/planners/test_host_parallel.py` compares them.

Only where it is safe and worth it: Linux (`fork`), the interpreter, no torch in the process
(a process running torch's threads must not fork), a plan of at least `MIN_FORKED_ENTRIES`,
and not inside a worker process of `check_dumps` (each already has its core). A child runs
only its part (the interpreter and numpy, no lock another thread of `check` may hold) and
leaves with `os._exit`: no stdio flushed twice, no parent cleanup run in it. A child that
dies (killed, out of memory) costs time, not results: its part runs again here.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Sequence

__all__ = ["MIN_FORKED_ENTRIES", "host_processes", "run_parts", "split", "usable_cores"]

#: Below this many entries a fork costs more than it saves.
MIN_FORKED_ENTRIES = 1 << 19
#: The most processes one launch uses (the rest of `check` needs a core too).
_MAX_PROCESSES = 2
#: A child's exit code when Ctrl-C stopped it (the shell's 128 + SIGINT).
_INTERRUPTED = 130


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
    children: list[tuple[int, Callable[[], None]]] = []
    mallopt = _glibc_mallopt()  # looked up once, here: the children only call it
    for part in parts:
        pid = os.fork()
        if pid == 0:  # the child: run the part, leave without unwinding the parent's stack
            code = 1
            try:
                _reuse_freed_memory(mallopt)
                part()
                code = 0
            except KeyboardInterrupt:  # Ctrl-C reaches the whole process group
                code = _INTERRUPTED
            finally:
                os._exit(code)
        children.append((pid, part))
    codes = [(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), part) for pid, part in children]
    if any(code in (_INTERRUPTED, -signal.SIGINT) for code, _ in codes):
        raise KeyboardInterrupt  # the user stopped the run: do not redo the parts here
    for code, part in codes:
        if code != 0:
            part()


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
