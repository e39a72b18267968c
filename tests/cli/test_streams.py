"""The standard streams as the shell leaves them: closed, on a full disk, or unable to encode
a character. Each is the user's setup, never a kvcanary bug: one line (when standard error
can take it) and exit 2, or the report with the characters escaped, never exit 3.

Run through the installed entry point in a shell, so that the redirections are real: each test
starts a process, so each is `slow` (tests/lanes.py: the suite's, not the fast lane's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DUMP = str(EXAMPLES / "truncated-lut.safetensors")


def kvcanary(
    redirections: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m kvcanary_cli ARGS REDIRECTIONS` in sh (`2>&-`, `> /dev/full`, ...)."""
    script = f'exec "$0" -m kvcanary_cli "$@" {redirections}'
    return subprocess.run(
        ["sh", "-c", script, sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


pytestmark = pytest.mark.slow

full_disk = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")


@full_disk
@pytest.mark.parametrize(
    "args",
    [
        ("inspect", DUMP),
        ("inspect", DUMP, "--format", "json"),
        ("synth", "clean-swa", "--out", "-"),
        ("--version",),
        ("--help",),
        ("check", "--help"),
    ],
    ids=["table", "json", "binary", "version", "help", "command-help"],
)
def test_standard_output_on_a_full_disk_is_one_line(args: tuple[str, ...]) -> None:
    done = kvcanary("> /dev/full", *args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "error: standard output: cannot be written: No space left on device"
    ]


def test_a_closed_standard_output_is_one_line() -> None:
    done = kvcanary(">&-", "inspect", DUMP)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["error: standard output: is closed (redirect it: > FILE)"]


def test_violations_from_a_closed_standard_input_is_one_line() -> None:
    done = kvcanary("<&-", "violations", "-")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "error: standard input: is closed (pipe a log into it, or name the log)"
    ]


@pytest.mark.parametrize("output_format", ["table", "markdown"])
def test_an_ascii_terminal_gets_escapes_not_a_crash(output_format: str) -> None:
    done = kvcanary(
        "",
        "check",
        DUMP,
        "-k",
        "vectorized",
        "-f",
        output_format,
        env={"PYTHONIOENCODING": "ascii"},
    )
    assert done.returncode == 1, done.stderr  # the dump's findings, as with any encoding
    assert done.stderr == "" and done.stdout.isascii()
    assert "ERRORS" in done.stdout or "findings" in done.stdout
    if output_format == "markdown":
        assert "\\xb7" in done.stdout  # the `·` separator, escaped


@pytest.mark.parametrize("redirection", ["2>&-", "2>/dev/full"], ids=["closed", "full"])
def test_bad_input_with_no_standard_error_still_exits_2(redirection: str) -> None:
    if "full" in redirection and not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    missing = str(ROOT / "no-such-dump.safetensors")
    for args in (("inspect", missing), ("check", missing), ("check", DUMP, "--bogus")):
        done = kvcanary(redirection, *args)
        assert done.returncode == 2, (args, done.stdout)
