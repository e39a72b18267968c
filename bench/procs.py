"""Whole-process measurements: wall time and peak RSS of one child, and the page cache.

A child's peak RSS comes from `os.wait4` (the kernel's `ru_maxrss` for that child alone, file
pages it mapped included), taken by a small launcher process (see `_LAUNCHER`). For the memory
target ("peak RSS at most 1 GiB above the pages of the table it touches"), `evict` drops a file
from the page cache before a cold run and `resident_bytes` counts (with `mincore`) the pages of
a byte range that are cached after it: what the run read of the table, readahead included.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "ROOT",
    "ChildRun",
    "compile_bytecode",
    "evict",
    "kvcanary",
    "resident_bytes",
    "run_child",
]

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, kw_only=True)
class ChildRun:
    """One finished child process."""

    seconds: float
    peak_rss_bytes: int
    exit_code: int
    #: stopped at the time limit: `seconds` is a lower bound.
    timed_out: bool
    #: bytes it wrote to standard output (kept only when asked for).
    stdout_bytes: int
    stdout: str
    stderr: str


def child_env() -> dict[str, str]:
    """The environment children run in: this checkout's kvcanary first on the path, and
    Python's bytecode cache allowed (see `compile_bytecode`)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def compile_bytecode() -> str:
    """Byte-compile this checkout's kvcanary_cli (into its `__pycache__`, ignored by git), so
    that every timed child starts as an installed package does: `pip install` compiles a
    package's bytecode, but with PYTHONDONTWRITEBYTECODE set a checkout is compiled from
    source on every start (about 0.09 s more here). Says what it did, for the record."""
    import compileall

    ok = compileall.compile_dir(ROOT / "kvcanary_cli", quiet=1)
    was = "set" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "not set"
    return f"kvcanary_cli byte-compiled ({'ok' if ok else 'failed'}); PYTHONDONTWRITEBYTECODE {was}"


def kvcanary(*args: str) -> list[str]:
    """The command line of `kvcanary ARGS` from this checkout (what the console script runs)."""
    return [sys.executable, "-m", "kvcanary_cli", *args]


#: Runs the measured command from a small process (`python -S -I`, about 8 MiB): the peak RSS a
#: child inherits at exec is that of the process that spawned it, so a child spawned by the
#: benchmark itself (torch loaded, dumps built) would report the benchmark's peak instead.
#: A positive limit (seconds) kills the command when it runs past it.
_LAUNCHER = """
import os, signal, sys, time
out, limit, argv = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
start = time.perf_counter()
pid = os.posix_spawn(argv[0], argv, os.environ)
stopped = []
def stop(*_):
    stopped.append(1)
    os.kill(pid, signal.SIGKILL)
if limit > 0:
    signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, limit)
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - start
code = os.waitstatus_to_exitcode(status)
with open(out, "w") as f:
    f.write(f"{seconds} {usage.ru_maxrss} {code} {len(stopped)}")
"""


def run_child(
    argv: list[str],
    *,
    keep_stdout: bool = False,
    ok: tuple[int, ...] = (0, 1),
    timeout: float = 0,
) -> ChildRun:
    """Run `argv` (argv[0] a path) to completion, or until `timeout` seconds (0: none): wall
    time, peak RSS (ru_maxrss of the child alone) and exit code; its stdout goes to a scratch
    file (counted, kept if asked)."""
    with tempfile.TemporaryDirectory(prefix="kvcanary-bench-") as tmp:
        out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        measured = Path(tmp) / "measured"
        launcher = [sys.executable, "-S", "-I", "-c", _LAUNCHER, str(measured), str(timeout)]
        with out_path.open("wb") as out, err_path.open("wb") as err:
            subprocess.run(
                [*launcher, *argv], stdout=out, stderr=err, env=child_env(), cwd=ROOT, check=True
            )
        seconds, maxrss, code, stopped = measured.read_text().split()
        stderr = err_path.read_text(errors="replace")
        timed_out = stopped == "1"
        if int(code) not in ok and not timed_out:
            tail = "\n".join(stderr.splitlines()[-20:])
            raise RuntimeError(f"{' '.join(argv)} exited {code}:\n{tail}")
        return ChildRun(
            seconds=float(seconds),
            peak_rss_bytes=int(maxrss) * 1024,  # KiB on Linux
            exit_code=int(code),
            timed_out=timed_out,
            stdout_bytes=out_path.stat().st_size,
            stdout=out_path.read_text(errors="replace") if keep_stdout else "",
            stderr=stderr,
        )


def evict(path: Path) -> None:
    """Drop `path`'s pages from the page cache (they must be clean and mapped by nobody)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


_PROT_READ = 1
_MAP_SHARED = 1
_MAP_FAILED = ctypes.c_void_p(-1).value


def resident_bytes(path: Path, offset: int, length: int) -> int:
    """Bytes of `path[offset : offset + length]` in the page cache (whole pages, by mincore)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = os.sysconf("SC_PAGE_SIZE")
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            vector = (ctypes.c_ubyte * ((size + page - 1) // page))()
            if libc.mincore(address, size, vector) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            first, last = offset // page, (offset + length - 1) // page
            flags = np.frombuffer(memoryview(vector).cast("B"), dtype=np.uint8)[first : last + 1]
            resident = int(np.count_nonzero(flags & 1))
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)
    return resident * page
