"""A next command per cause (issue 45): `kvcanary provenance DUMP --slot N [--space swa]`
for its first slot, the dump's path one shell word whatever its characters."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcanary_cli.cli import app
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.safe_text import shell_path
from kvcanary_cli.synth.scenarios import make_scenario
from tests.helpers import checked


def test_each_cause_names_a_provenance_command_that_runs(tmp_path: Path) -> None:
    path = make_scenario("swa-shared-owner", seed=0).save(tmp_path / "my dump's $HOME.safetensors")
    report = checked(load_dump(path), kernel="vectorized")
    first = report.diagnosis[0]
    assert first.next_command is not None, first
    words = shlex.split(first.next_command)
    assert words[:3] == ["kvcanary", "provenance", str(path)], words
    [owner] = [f for f in report.findings if f.cause is first.code][:1]
    assert words[3:] == ["--slot", str(owner.slot), "--space", "swa"], words
    result = CliRunner().invoke(app, words[1:])
    assert result.exit_code in (0, 1), result.stderr
    assert f"slot {owner.slot}" in result.stdout


def test_a_full_pool_cause_names_no_space(tmp_path: Path) -> None:
    path = make_scenario("use-after-free", seed=0).save(tmp_path / "d.safetensors")
    report = checked(load_dump(path), kernel="vectorized")
    command = report.diagnosis[0].next_command
    assert command == f"kvcanary provenance {path} --slot {report.findings[0].slot}", command


@pytest.mark.parametrize(
    ("path", "word"),
    [
        ("dumps/a.safetensors", "dumps/a.safetensors"),
        ("-rf.safetensors", "./-rf.safetensors"),
        ("a b;rm -rf ~.safetensors", "'a b;rm -rf ~.safetensors'"),
        ("x/\x1b]52;c;evil\x07.safetensors", "__52_c_evil_.safetensors"),
        ("x/\u202etxt.safetensors", "_txt.safetensors"),
    ],
)
def test_the_dump_path_is_one_shell_word_that_does_not_act(path: str, word: str) -> None:
    assert shell_path(path) == word
    assert len(shlex.split(shell_path(path))) == 1
