"""Fixtures for analysis tests: synthetic states and scenarios saved and loaded as dumps."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.synth.scenarios import make_scenario
from kvcanary_cli.synth.state import SynthDump

#: the `load_synth` fixture: save a synthetic state and load it back.
LoadSynth = Callable[[SynthDump], KvDump]
#: the `scenario_dump` fixture: (scenario name, seed=0, corrupt=True) -> (dump, truth).
ScenarioDump = Callable[..., tuple[KvDump, dict[str, int]]]


@pytest.fixture
def load_synth(tmp_path: Path) -> LoadSynth:
    counter = iter(range(10_000))

    def load(synth: SynthDump) -> KvDump:
        return load_dump(synth.save(tmp_path / f"d{next(counter)}.safetensors"))

    return load


@pytest.fixture
def scenario_dump(load_synth: LoadSynth) -> ScenarioDump:
    def build(name: str, seed: int = 0, corrupt: bool = True) -> tuple[KvDump, dict[str, int]]:
        synth = make_scenario(name, seed=seed, corrupt=corrupt)
        return load_synth(synth), synth.truth

    return build
