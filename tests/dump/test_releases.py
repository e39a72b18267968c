"""A dump from a release outside 0.5.13 .. 0.5.23 says so in one note and is still read."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.dump.releases import parse_release
from kvcanary_cli.synth.scenarios import make_scenario
from tests.helpers import checked


@pytest.mark.parametrize(
    ("version", "says"),
    [
        ("0.5.12", "older than 0.5.13"),
        ("0.4.9", "older than 0.5.13"),
        ("0.5.24", "newer than 0.5.23"),
        ("0.6.0.post1", "newer than 0.5.23"),
        ("nightly\x1b[31m", "not a release number"),
    ],
)
def test_a_dump_from_outside_the_range_says_so_once_and_checks_as_usual(
    version: str, says: str, tmp_path: Path
) -> None:
    state = make_scenario("truncated-lut", seed=0, size="tiny")
    clean = checked(load_dump(state.save(tmp_path / "in.safetensors")), kernel="vectorized")
    state.metadata["sglang.version"] = version
    dump = load_dump(state.save(tmp_path / "out.safetensors"))
    [note] = [n for n in dump.notes if "SGLang" in n]
    assert says in note and "\x1b" not in note
    report = checked(dump, kernel="vectorized")
    assert [f.code for f in report.findings] == [f.code for f in clean.findings]


@pytest.mark.parametrize("version", ["0.5.13", "0.5.16", "0.5.20", "0.5.23", "0.5.23+cu128"])
def test_a_dump_from_inside_the_range_has_no_release_note(version: str, tmp_path: Path) -> None:
    state = make_scenario("clean-swa", seed=0, size="tiny")
    state.metadata["sglang.version"] = version
    dump = load_dump(state.save(tmp_path / "d.safetensors"))
    assert not [n for n in dump.notes if "SGLang" in n]


def test_release_numbers() -> None:
    assert parse_release("0.5.23.post2") == (0, 5, 23)
    assert parse_release("v0.5.13") == (0, 5, 13)
    assert parse_release("0.5") is None and parse_release("") is None
