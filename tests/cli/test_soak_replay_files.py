"""`soak --replay FILE` reads a file a soak wrote, a few kilobytes: anything else that is not a
regular file of a reproducer's size is one error line, exit 2, read no further. Before, a
character device (`/dev/zero`) was read until memory ran out (exit 3, "internal error:
MemoryError") and a FIFO without a writer hung the command. Each runs in its own process,
its address space capped, with a timeout: the failure modes are a hang and a memory blow-up."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcanary_cli.cli import app

ROOT = Path(__file__).resolve().parents[2]
#: A soak process's address-space cap: the interpreter and its imports fit many times over.
_CAP = 3 << 30


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_CAP, _CAP))


def _replay(path: Path | str, *engine: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvcanary_cli", "soak", *engine, "--replay", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=_capped,
    )


#: vLLM's replay reads its file by the same function: the whole suite runs it, the fast lane
#: SGLang's (a process each).
ENGINES = [
    pytest.param((), id="sglang"),
    pytest.param(("--engine", "vllm"), id="vllm", marks=pytest.mark.slow),
]


def _oversized(tmp_path: Path) -> Path:
    """A sparse file of 64 MiB: a few disk blocks, far above any reproducer."""
    path = tmp_path / "soak-reproducer.json"
    with open(path, "wb") as handle:
        handle.truncate(64 << 20)
    return path


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "soak-reproducer.json"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda _: Path("/dev/zero"), "is not a regular file"),
        (_fifo, "is not a regular file"),
        (_oversized, "is 64.0 MiB"),
    ],
    ids=["device", "fifo", "oversized"],
)
@pytest.mark.slow
def test_a_replay_file_soak_did_not_write_is_one_line(
    tmp_path: Path, engine: tuple[str, ...], make: object, said: str
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    done = _replay(path, *engine)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
    assert str(path) in done.stderr


_LONG = "x" * 10_000
_SGLANG = {
    "spec": {"page_size": 1, "core": "python"},
    "workload": {"seed": 3, "steps": 10, "arrivals": []},
    "fault": None,
    "crash": None,
    "top_cause": "double-free",
}
_VLLM = {"engine": "vllm", "model": "full", "seed": 0, "steps": 10, "after_steps": 0}
_VLLM |= {"fault": None, "recorded": "leak"}


@pytest.mark.parametrize(
    ("engine", "body"),
    [
        ((), {**_SGLANG, "top_cause": _LONG}),
        ((), {**_SGLANG, "sglang_version": _LONG}),
        (("--engine", "vllm"), {**_VLLM, "recorded": _LONG}),
        (("--engine", "vllm"), {**_VLLM, "engine_version": _LONG}),
    ],
    ids=["sglang-recorded", "sglang-release", "vllm-recorded", "vllm-release"],
)
def test_a_reproducer_recording_a_text_no_soak_writes_is_one_line(
    tmp_path: Path, engine: tuple[str, ...], body: dict[str, object]
) -> None:
    """The recorded finding and release are repeated by the replay's report: a short code and
    a version, never ten thousand characters."""
    path = tmp_path / "soak-reproducer.json"
    path.write_text(json.dumps(body))
    result = CliRunner().invoke(app, ["soak", *engine, "--replay", str(path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and "out of range" in result.stderr
