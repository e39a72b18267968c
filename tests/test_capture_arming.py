"""Arming the capture hook from the environment never raises into the process that imports it
(SGLang's server): a value it cannot use is one warning, and that trigger stays off."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvcanary_cli.capture import triggers

#: Values of KVCANARY_DUMP_SIGNAL no snapshot may be taken on: no such signal (too large for
#: the C call, negative, zero, past the last, unknown names, other digits), one that cannot
#: be caught, one that stops the server, and faults (a handler that returns re-runs them).
UNUSABLE = [
    "99999999999",
    "9" * 5000,
    "-3",
    "0",
    "65",
    "SIGFOO",
    "FOO",
    "SIG_DFL",
    "\u00b2",
    "KILL",
    "SIGSTOP",
    "TERM",
    "INT",
    "SEGV",
    "BUS",
]


@pytest.fixture
def handlers() -> Iterator[None]:
    """Every handler put back as it was after the test."""
    before = {number: signal.getsignal(number) for number in signal.valid_signals()}
    before = {number: handler for number, handler in before.items() if handler is not None}
    yield
    for number, handler in before.items():
        if signal.getsignal(number) != handler:
            signal.signal(number, handler)


def _python(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -c SCRIPT` in `env`: what the server's interpreter does at start-up."""
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_an_unusable_dump_signal_is_one_warning_at_import(tmp_path: Path) -> None:
    """`import kvcanary_cli.capture` (what sitecustomize does in the server) once raised
    OverflowError out of the import."""
    env = dict(os.environ, KVCANARY_DUMP_DIR=str(tmp_path), KVCANARY_DUMP_SIGNAL="99999999999")
    done = _python("import kvcanary_cli.capture", env)
    assert done.returncode == 0, done.stderr
    [line] = done.stderr.splitlines()
    assert "KVCANARY_DUMP_SIGNAL='99999999999'" in line and "off" in line


@pytest.mark.parametrize("value", UNUSABLE, ids=lambda v: v[:12])
def test_an_unusable_signal_is_refused_with_one_warning(
    value: str, handlers: None, caplog: pytest.LogCaptureFixture
) -> None:
    before = {n: signal.getsignal(n) for n in signal.valid_signals()}
    with caplog.at_level(logging.WARNING, logger="kvcanary.capture"):
        assert triggers.install_signal(value) is False
    [record] = caplog.records
    assert record.getMessage().startswith("kvcanary: KVCANARY_DUMP_SIGNAL=")
    assert {n: signal.getsignal(n) for n in signal.valid_signals()} == before


def test_only_the_main_thread_installs_and_another_says_so(
    handlers: None, caplog: pytest.LogCaptureFixture
) -> None:
    installed: list[bool] = []
    with caplog.at_level(logging.WARNING, logger="kvcanary.capture"):
        thread = threading.Thread(target=lambda: installed.append(triggers.install_signal("USR2")))
        thread.start()
        thread.join()
    assert installed == [False]
    [record] = caplog.records
    assert "main thread" in record.getMessage()


@pytest.mark.parametrize("value", ["USR2", "sigusr2", " SIGUSR1 ", str(int(signal.SIGUSR2))])
def test_a_usable_signal_is_taken(value: str, handlers: None) -> None:
    assert triggers.install_signal(value) is True
    number = signal.SIGUSR1 if "1" in value and "12" not in value else signal.SIGUSR2
    assert callable(signal.getsignal(number))


def test_arming_that_fails_anyhow_is_one_warning_at_import(tmp_path: Path) -> None:
    """Whatever arming raises (here: a stand-in that fails) stays out of the import."""
    script = (
        "import importlib, os, kvcanary_cli.capture as capture\n"
        "import kvcanary_cli.capture.launcher as l\n"
        "def boom(): raise RuntimeError('arming broke')\n"
        "l.install_from_env = boom\n"
        f"os.environ['KVCANARY_DUMP_DIR'] = {str(tmp_path)!r}\n"
        "importlib.reload(capture)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVCANARY_")}
    done = _python(script, env)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "kvcanary: the capture hook is not armed (RuntimeError: arming broke)"
    ]
