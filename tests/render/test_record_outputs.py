"""Real outputs match the record declarations exactly: every bundled example and every `synth`
scenario through check, provenance, violations, inspect and plan as JSON, and the selftest,
each parsed back and validated against its TypedDict (no missing key, no extra key, every
value of its declared type or Literal)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvcanary_cli import api
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.render import OutputFormat, render
from kvcanary_cli.synth.scenarios import SCENARIOS, make_scenario
from kvcanary_cli.synth.sequence import PLANTED_KEY, SEQUENCES, write_sequence
from tests.render.record_schema import RECORDS, validate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.safetensors"))
DUMPS = [f"example:{p.stem}" for p in EXAMPLES] + [f"synth:{name}" for name in SCENARIOS]


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("synth")
    for name in SCENARIOS:
        make_scenario(name, seed=0, size="tiny").save(folder / f"{name}.safetensors")
    return folder


def _path(dump: str, synth_dir: Path) -> Path:
    kind, name = dump.split(":")
    return (ROOT / "examples" if kind == "example" else synth_dir) / f"{name}.safetensors"


def _valid(rendered: object) -> dict[str, Any]:
    """The JSON text parsed, checked against the record its `schema` names."""
    assert isinstance(rendered, str)
    record: dict[str, Any] = json.loads(rendered)
    assert validate(record, RECORDS[record["schema"]]) == []
    return record


#: SGLang's idle message, set against every dump by `leak`.
_LEAK_LINE = (
    "pool memory leak detected! [full] total=64, available=60, evictable=8, protected=0, "
    "session_held=0, uncached=0\n[swa] total=32, available=30, evictable=0, protected=0, "
    "session_held=0, uncached=0"
)


def _json_outputs(path: Path) -> Iterator[tuple[str, object]]:
    """Each command's JSON on one dump: check, provenance (a slot in each space, a pool row),
    violations (its ring, replayed), inspect, ranks, leak (an SGLang message against it) and
    plan (each group)."""
    report = api.check(path, kernel="vectorized")
    check = _valid(render(report, OutputFormat.JSON))
    yield "check", check
    findings = check["dumps"][0]["findings"]
    dump = load_dump(path)
    for space in ("full", "swa"):
        slots = [f["slot"] for f in findings if f["space"] == space and f["slot"] is not None]
        if space == "full" or slots:
            slot = slots[0] if slots else 1
            answer = api.provenance(path, slot=slot, space=space)
            yield (
                f"provenance --slot {slot} --space {space}",
                render(answer, OutputFormat.JSON),
            )
    row = int(dump.req_pool_indices[0])
    yield "provenance --row", render(api.provenance(path, row=row), OutputFormat.JSON)
    violations = api.violations([str(path)], replay=True)
    yield "violations --replay", render(violations, OutputFormat.JSON)
    yield "inspect", render(api.inspect(path), OutputFormat.JSON)
    yield "ranks (the dump as two ranks)", render(api.ranks([path, path]), OutputFormat.JSON)
    yield "leak LINE DUMP", render(api.leak(_LEAK_LINE, path), OutputFormat.JSON)
    for group in dump.groups:
        run = api.plan(path, group)
        if run.summary is not None:
            yield f"plan --group {group}", render(run.summary, OutputFormat.JSON)


@pytest.mark.parametrize("dump", DUMPS)
def test_every_command_on_every_dump_matches_its_record(
    dump: str, synth_dir: Path, no_sglang: None
) -> None:
    seen = set()
    for command, rendered in _json_outputs(_path(dump, synth_dir)):
        record = rendered if isinstance(rendered, dict) else _valid(rendered)
        seen.add(record["schema"])
        assert record["schema"] in RECORDS, command
    # plan: unless every group is refused (corrupt lengths: nothing planned, no record);
    # selftest and timeline read no one dump (below), soak reads none
    # (tests/cli/test_soak_outputs.py)
    others = {"kvcanary.selftest/1", "kvcanary.plan/1", "kvcanary.timeline/1", "kvcanary.soak/2"}
    # the block-pool records are vLLM's (below; pool-soak: tests/integration/test_vllm_soak.py)
    others |= {r for r in RECORDS if r.startswith("kvcanary.pool-")}
    assert seen >= set(RECORDS) - others


@pytest.mark.parametrize("scenario", ["vllm-hybrid-clean", "vllm-freed-while-held"])
def test_block_pool_check_and_provenance_match_their_records(tmp_path: Path, scenario: str) -> None:
    from kvcanary_cli.engines import pool_provenance, write_pool_scenario

    path = tmp_path / "pool.safetensors"
    write_pool_scenario(scenario, path, seed=2)
    record = _valid(render(api.check([path]), OutputFormat.JSON))
    assert record["schema"] == "kvcanary.pool-check/1"
    findings = record["dumps"][0]["findings"]
    block = findings[0]["block"] if findings else 1
    assert _valid(render(pool_provenance(path, block), OutputFormat.JSON))["block"] == block


@pytest.mark.parametrize("name", SEQUENCES)
def test_timelines_match_their_record(tmp_path: Path, name: str) -> None:
    """timeline, diff and provenance --slot over the dumps of every sequence, and of its
    shrunk dumps."""
    paths = write_sequence(name, tmp_path, steps=4, seed=1)
    small = []
    for path in paths:
        small.append(tmp_path / f"small-{path.name}")
        api.shrink(path, small[-1])
    for dumps in (paths, small):
        record = _valid(render(api.timeline(dumps), OutputFormat.JSON))
        assert record["checked"] and len(record["dumps"]) == 4
        _valid(render(api.diff(dumps[0], dumps[-1]), OutputFormat.JSON))
        truth = json.loads(load_dump(paths[-1]).metadata[PLANTED_KEY])
        slot = (truth.get("slots") or [1])[0]
        space = truth.get("space", "full")
        history = api.provenance(dumps, slot=slot, space=space if dumps is paths else "full")
        assert _valid(render(history, OutputFormat.JSON))["slot"]["slot"] == slot


def test_other_kernels_and_bad_input_match_the_check_record(
    tmp_path: Path, no_sglang: None
) -> None:
    """Triton's mode, no kernel at all, and an unreadable dump among readable ones."""
    example = ROOT / "examples" / "truncated-lut.safetensors"
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a dump")
    triton = _valid(render(api.check(example, kernel="triton"), OutputFormat.JSON))
    assert triton["dumps"][0]["kernel_mode"] in ("interpreter", "compiled")
    # checked in this process (jobs=1): the record is the point, not the worker processes
    none = _valid(render(api.check([example, bad], kernel="none", jobs=1), OutputFormat.JSON))
    assert [d["verdict"] for d in none["dumps"]][1] == "bad-input"
    assert {g["kernel"] for g in none["dumps"][0]["groups"]} == {"none"}
    for backend in ("reference", "triton"):
        run = api.plan(example, "swa", backend=backend)
        assert run.summary is not None
        assert _valid(render(run.summary, OutputFormat.JSON))["backend"] == backend


def test_a_shrunk_dump_and_a_log_match_their_records(tmp_path: Path, no_sglang: None) -> None:
    """The `shrunk` objects of check, provenance and inspect; violations read from a log."""
    small = tmp_path / "small.safetensors"
    api.shrink(ROOT / "examples" / "truncated-lut.safetensors", small)
    check = _valid(render(api.check(small, kernel="vectorized"), OutputFormat.JSON))
    assert check["dumps"][0]["shrunk"] is not None
    provenance = _valid(render(api.provenance(small, slot=107), OutputFormat.JSON))
    assert provenance["shrunk"] is not None
    assert _valid(render(api.inspect(small), OutputFormat.JSON))["shrink"] is not None
    log = ROOT / "examples" / "canary-aliasing.log"
    report = api.violations([str(log)], dump=ROOT / "examples" / "canary-aliasing.safetensors")
    violations = _valid(render(report, OutputFormat.JSON))
    assert violations["rows"] and violations["rows"][0]["explanation"] is not None
    assert violations["sources"][0]["log"] is not None
