"""How a `kvcanary` process ends (`cli_app.leave`): with the command's exit code and all of its
output, its `atexit` functions run and any thread still running waited for, as at Python's
own exit, but without the interpreter's teardown (no module unloaded, no object freed one by
one). `cli.main` itself stays callable again in one process: only the console script and
`python -m kvcanary_cli` end this way."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "truncated-lut.safetensors"

#: A process that runs `kvcanary check --format json EXAMPLE` through `{entry}` with an
#: `atexit` function, an object a teardown would free (its `__del__` says so), and, with
#: `{thread}` true, a thread (not a daemon) that writes once the main thread is done (as Python
#: marks it when it begins to exit).
_SCRIPT = """
import atexit, os, sys, threading, time

class Teardown:
    def __del__(self):
        os.write(1, b"torn down\\n")

def late():
    while threading.main_thread().is_alive():
        time.sleep(0.01)
    os.write(1, b"thread done\\n")

kept = Teardown()
atexit.register(lambda: os.write(1, b"atexit ran\\n"))
if {thread}:
    threading.Thread(target=late).start()
sys.argv = ["kvcanary", "check", {dump!r}, "--kernel", "vectorized", "--format", "json"]
from kvcanary_cli.cli import console, main
{entry}
"""


def _end(entry: str, *, thread: bool = False) -> tuple[int, dict[str, object], list[str]]:
    """The exit code, the JSON report and the lines after it, of `_SCRIPT`'s process."""
    script = _SCRIPT.format(entry=entry, thread=thread, dump=str(EXAMPLE))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.stderr == "", done.stderr
    report, _, rest = done.stdout.rpartition("}\n")
    return done.returncode, json.loads(report + "}"), rest.splitlines()


@pytest.mark.slow  # a process
@pytest.mark.parametrize(
    ("entry", "then"),
    [
        ("console()", ["atexit ran"]),
        ("import runpy; runpy.run_module('kvcanary_cli', run_name='__main__')", ["atexit ran"]),
        ("main()", ["atexit ran", "torn down"]),  # the twin: Python's own exit, teardown too
    ],
    ids=["console", "python -m", "main"],
)
def test_the_console_ends_with_its_report_and_atexit_but_no_teardown(
    entry: str, then: list[str]
) -> None:
    code, report, after = _end(entry)
    assert code == 1 and report["verdict"] == "findings"
    assert after == then


@pytest.mark.slow  # a process
def test_a_thread_still_running_is_waited_for() -> None:
    code, report, after = _end("console()", thread=True)
    assert code == 1 and report["verdict"] == "findings"
    assert after == ["thread done", "atexit ran", "torn down"]  # Python's own exit, whole


#: a program that runs the console from a function of its own, and goes on after it
_AROUND = """
def around():
    try:
        console()
    except SystemExit:
        os.write(1, b"went on\\n")

around()
"""


@pytest.mark.slow  # a process
def test_a_program_around_the_command_goes_on_after_it() -> None:
    code, report, after = _end(_AROUND)
    assert code == 0 and report["verdict"] == "findings"
    assert after == ["went on", "atexit ran", "torn down"]


@pytest.mark.slow  # a process
def test_a_profiler_around_the_command_still_writes_its_results(tmp_path: Path) -> None:
    """`python -m cProfile -o FILE -m kvcanary_cli` (bench/profile_cli.py): cProfile writes
    FILE once the command has returned, so the command ends by Python's own exit."""
    profile = tmp_path / "version.prof"
    done = subprocess.run(
        [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "kvcanary_cli", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.startswith("kvcanary "), done.stderr
    assert profile.stat().st_size > 0


def test_the_installed_command_is_the_console() -> None:
    """`kvcanary` (pyproject's script) and `python -m kvcanary_cli` both end through it."""
    (script,) = entry_points(group="console_scripts", name="kvcanary")
    assert script.value == "kvcanary_cli.cli:console"
    main_module = Path(__file__).resolve().parents[2] / "kvcanary_cli" / "__main__.py"
    assert "console()" in main_module.read_text()
