"""The valid dumps the corpus mutates: small `synth` scenarios covering every tensor family."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvcanary_cli.synth.scenarios import make_scenario
from tests.fuzz.mutants import Seed

__all__ = ["SEED_FAMILIES", "SEED_SCENARIOS", "SHRUNK_SEEDS", "load_seeds", "write_seeds"]

#: seed name -> synth scenario (tiny): SWA with free lists and writes; canary buffers, a
#: violation ring and an expected-token pool; an EAGLE draft pool; everything at once (LUT,
#: K and V canary buffers of both groups, real-KV sources, expected tokens).
SEED_SCENARIOS = {
    "swa": "clean-swa",
    "canary": "canary-aliasing",
    "eagle": "clean-eagle-draft",
    "full": "clean-canary",
}
#: seed name -> the scenario (tiny) whose `kvcanary shrink` output is a seed: format 1.2, its
#: tables, LUT and canary buffers stored sparse; and its real-KV sources (`shrunk-kv`).
SHRUNK_SEEDS = {"shrunk": "truncated-lut", "shrunk-kv": "canary-kv-overwritten"}
#: seeds mutated in some families only: `shrunk-kv` adds sparse real-KV sources to the values
#: mutated; its header and its truncations would repeat those of `shrunk`.
SEED_FAMILIES = {"shrunk-kv": ("data",)}


def write_seeds(directory: Path) -> dict[str, Path]:
    """Write every seed dump into `directory`; return their paths by seed name."""
    from kvcanary_cli import api

    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, scenario in SEED_SCENARIOS.items():
        paths[name] = make_scenario(scenario, seed=0, size="tiny").save(
            directory / f"{name}.safetensors"
        )
    for name, scenario in SHRUNK_SEEDS.items():
        source = make_scenario(scenario, seed=0, size="tiny").save(directory / f"{name}-source")
        paths[name] = directory / f"{name}.safetensors"
        api.shrink(source, paths[name], force=True)
        source.unlink()
    return paths


def load_seeds(directory: Path) -> list[Seed]:
    """The seeds written by `write_seeds`, parsed, in order (the shrunk ones last)."""
    names = [*SEED_SCENARIOS, *SHRUNK_SEEDS]
    seeds = [Seed.parse(name, (directory / f"{name}.safetensors").read_bytes()) for name in names]
    return [
        replace(seed, families=SEED_FAMILIES[seed.name]) if seed.name in SEED_FAMILIES else seed
        for seed in seeds
    ]
