"""The processes that check several dumps at once: how many the machine holds, and one report
per dump whatever happens to the others.

`check_dumps` says what checking one dump means (a top-level function, so a spawned process
can run it); this module only runs it: in a pool, and again alone in a process of its own for
every dump a dying worker took down with it, so that only the dump at fault gets an error,
saying how its process died.

The processes end with the run: stopped (Ctrl-C, SIGTERM, a bug), it kills them instead of
waiting for their dumps, and each is killed by the kernel when its parent dies, however it dies
(a worker left behind, re-parented, would wait forever on a queue nobody feeds).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext, SpawnProcess
from pathlib import Path

from kvcanary_cli.errors import DumpError, KvcanaryError
from kvcanary_cli.planners.base import Planner
from kvcanary_cli.planners.host_parallel import usable_cores
from kvcanary_cli.results.check import DumpReport

__all__ = [
    "FEWER_JOBS",
    "CheckOne",
    "DumpWork",
    "check_alone",
    "check_in_workers",
    "error_report",
    "worker_count",
]


@dataclass(frozen=True, kw_only=True)
class DumpWork:
    """One dump to check, with what to check it with (pickled to a worker process)."""

    path: str
    #: the `--set NAME=VALUE` overrides of the dump's scalars.
    overrides: Mapping[str, int | str | None]
    planner: Planner
    kernel: Planner | None
    #: the groups to check (None: every group of the dump).
    groups: tuple[str, ...] | None


#: Checks one dump: its report, or one with `error` set (never raises for the dump's fault).
CheckOne = Callable[[DumpWork], DumpReport]

#: What one checking process needs besides its dump's pages: numpy, triton and the plan
#: (sized when workers still loaded torch; a worker without it needs less).
_WORKER_BASE_BYTES = 768 << 20
#: What the next --jobs run may do, said after a dump that took its process down with it.
FEWER_JOBS = "check it alone, or with fewer --jobs"
#: What each fatal signal most likely means for a checking process.
_SIGNAL_HINTS: dict[int, str] = {
    signal.SIGBUS: "the file shrank while it was mapped: another process truncated or rewrote "
    "it; check a stable copy",
    signal.SIGKILL: f"often the out-of-memory killer; {FEWER_JOBS}",
}


def worker_count(dumps: int, jobs: int | None, paths: Sequence[Path] = ()) -> int:
    """Processes for checking `dumps` dumps: what was asked (default: the cores), but never
    more than the dumps, the cores this process may run on, or what the available memory
    holds (each worker may map the largest dump): more only makes them fight."""
    cores = usable_cores()
    wanted = min(dumps, jobs or cores, cores)
    available = _available_memory()
    if available is not None:
        largest = max((_size(p) for p in paths), default=0)
        wanted = min(wanted, max(1, available // (_WORKER_BASE_BYTES + largest)))
    return max(1, wanted)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _available_memory() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is no such file)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def error_report(path: str, error: KvcanaryError) -> DumpReport:
    """The report of a dump that has an error instead of findings."""
    return DumpReport(path=path, identity={}, bs=0, groups=(), findings=(), error=str(error))


def _died(path: str, exitcode: int | None) -> DumpReport:
    """The report of a dump whose checking process ended without a report."""
    if exitcode is not None and exitcode < 0:
        number = -exitcode
        try:
            name = signal.Signals(number).name
        except ValueError:  # a signal without a name here
            name = f"signal {number}"
        message = f"the process checking it was killed by {name}"
        return error_report(path, DumpError(message, path=path, hint=_SIGNAL_HINTS.get(number)))
    message = f"the process checking it ended (exit status {exitcode}) without a report"
    return error_report(path, DumpError(message, path=path))


#: prctl(2)'s request for the signal a process gets when its parent dies (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def _end_with_parent(parent: int) -> None:
    """In a checking process: have the kernel kill it when `parent` ends, however that ends
    (SIGKILL, the out-of-memory killer). Linux only; elsewhere the parent's unwinding is all."""
    if sys.platform != "linux":
        return
    try:
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent ended before the request took
        os._exit(1)


class _Started:
    """The processes `check_alone` started, to kill when the run stops (`stop`); one started
    after that is killed at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._processes: list[SpawnProcess] = []
        self._stopped = False

    def add(self, process: SpawnProcess) -> None:
        with self._lock:
            self._processes.append(process)
            if self._stopped:
                process.kill()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            for process in self._processes:
                process.kill()


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """End the pool now: no dump not yet begun, and the workers killed (a shutdown alone
    waits for the dumps they hold). `_processes` is the pool's own record of its workers
    (Python has no public one before 3.14)."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        worker.kill()
    for pid in _spawned_children():  # one whose spawn the stop interrupted is in no record
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _spawned_children() -> list[int]:
    """This process's children that multiprocessing spawned (`--multiprocessing-fork` on
    their command line), read from /proc (elsewhere: none). A stop that lands while the pool
    spawns a worker leaves that worker started but unrecorded, before its initializer asked
    the kernel to end it with its parent: seen under load, a paused worker outliving `check`."""
    me = os.getpid()
    try:
        entries = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []
    found = []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
            if int(fields[1]) != me:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if b"--multiprocessing-fork" in cmdline.read().split(b"\0"):
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):  # gone meanwhile, or not readable
            continue
    return found


def _check_and_send(check: CheckOne, item: DumpWork, send: Connection, parent: int) -> None:
    """In a process of its own: check one dump and send its report (or the bug raised)."""
    _end_with_parent(parent)
    try:
        outcome: DumpReport | Exception = check(item)
    except Exception as exc:
        outcome = exc
    send.send(outcome)
    send.close()


def check_alone(
    check: CheckOne, item: DumpWork, context: SpawnContext, started: _Started | None = None
) -> DumpReport:
    """Check one dump in a process of its own: if that process dies, only this dump is lost,
    and how it died (its signal) is known. `started` is told of the process."""
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_check_and_send, args=(check, item, send, os.getpid()))
    process.start()
    if started is not None:
        started.add(process)
    send.close()  # the child's end: EOF once the child is gone
    try:
        outcome = receive.recv()
    except EOFError:
        outcome = None
    finally:
        receive.close()
        process.join()
    if isinstance(outcome, Exception):
        raise outcome  # a bug in the worker, as the pool would have raised it
    return _died(item.path, process.exitcode) if outcome is None else outcome


def check_in_workers(
    check: CheckOne,
    work: Sequence[DumpWork],
    workers: int,
    progress: Callable[[int, int], None] | None,
) -> list[DumpReport]:
    """Check dumps in `workers` processes, one report per dump whatever happens to the others.

    A worker that dies (SIGBUS, SIGKILL) breaks the whole pool and takes every unfinished
    dump down with it: those are checked again, each alone in a process of its own, where
    only the dump at fault dies again, and gets one error saying how.
    """
    # spawn, not fork: forking a process that already runs threads (a kernel's torch or
    # triton, the background planner) can deadlock.
    context = multiprocessing.get_context("spawn")
    reports: list[DumpReport | None] = [None] * len(work)
    done = 0
    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=_end_with_parent,
        initargs=(os.getpid(),),
    ) as pool:
        try:
            futures = [pool.submit(check, item) for item in work]
            for i, future in enumerate(futures):
                try:
                    reports[i] = future.result()
                except BrokenProcessPool:
                    continue
                done += 1
                if progress:
                    progress(done, len(work))
        except BaseException:  # stopped: the workers go now, not after their dumps
            _stop_workers(pool)
            raise
    lost = [i for i, report in enumerate(reports) if report is None]
    if lost:  # as many at once as there were workers: threads that wait on a process each
        started = _Started()
        with ThreadPoolExecutor(min(workers, len(lost))) as alone:
            try:
                again = alone.map(lambda i: check_alone(check, work[i], context, started), lost)
                for i, report in zip(lost, again, strict=True):
                    reports[i] = report
                    done += 1
                    if progress:
                        progress(done, len(work))
            except BaseException:
                alone.shutdown(wait=False, cancel_futures=True)
                started.stop()
                raise
    return [report for report in reports if report is not None]
