"""The peak memory of a `kvcanary` command run in a child process, for tests that bound it.

`ru_maxrss` cannot say it: Linux carries the high-water mark of the process that called `exec`
into the new program's, so a child of a big pytest process (with the CUDA build of torch
imported, half a gigabyte) reports the parent's size, not its own. `VmHWM` in
/proc/self/status is the high-water mark of the child's own address space, which `exec`
starts afresh: the child reads it just before it exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["PEAK_RSS_SCRIPT", "peak_rss_of"]

ROOT = Path(__file__).resolve().parents[1]

#: `python -c` this with kvcanary's arguments: it runs the command, then prints its own peak RSS
#: (KiB) as the last line of stderr.
PEAK_RSS_SCRIPT = """
import sys
from kvcanary_cli.cli import main
code = 0
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
with open("/proc/self/status", encoding="ascii") as status:
    peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
print(peak, file=sys.stderr)
sys.exit(code)
"""


def peak_rss_of(*args: str, timeout: float = 300) -> tuple[int, int]:
    """(exit code, peak RSS in bytes) of `kvcanary ARGS` in a fresh process (its stdout is
    dropped: what is measured is the command, not a reader of its output)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", PEAK_RSS_SCRIPT, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    lines = done.stderr.strip().splitlines()
    assert lines and lines[-1].isdigit(), done.stderr[-2000:]
    return done.returncode, int(lines[-1]) * 1024  # KiB
