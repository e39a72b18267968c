"""A dump's extras (tensors no reader knows, metadata keys) may be any number: the notes name a
few and count the rest, and `inspect`'s table and Markdown show `--max-rows` of them, with the
number left out; JSON lists every one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file
from typer.testing import CliRunner

from kvcanary_cli.cli import app
from kvcanary_cli.dump.loader import NAMED_IGNORED

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clean-swa.safetensors"
EXTRAS = 300


def _with_extras(source: Path, out: Path) -> Path:
    """`source` with `EXTRAS` tensors and metadata keys of no format."""
    with safe_open(str(source), "np") as handle:
        metadata = dict(handle.metadata() or {})
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    tensors |= {f"extra_{i:04}": np.zeros(1, np.int64) for i in range(EXTRAS)}
    metadata |= {f"x.note_{i:04}": "hello" for i in range(EXTRAS)}
    save_file(tensors, str(out), metadata=metadata)
    return out


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def crowded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("extras")
    source = EXAMPLE
    if request.param == "vllm":
        source = folder / "vllm.safetensors"
        made = CliRunner().invoke(app, ["synth", "vllm-clean", "--out", str(source)])
        assert made.exit_code == 0, made.stderr
    return _with_extras(source, folder / f"{request.param}-crowded.safetensors")


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.stdout


def test_check_names_a_few_ignored_tensors_and_counts_the_rest(crowded: Path) -> None:
    code, out = run("check", str(crowded), "-k", "none")
    assert code == 0
    assert sum(f"extra_{i:04}" in out for i in range(EXTRAS)) <= NAMED_IGNORED
    assert len(out.splitlines()) < 100
    code, out = run("check", str(crowded), "-k", "none", "-f", "json")
    notes = [n for d in json.loads(out)["dumps"] for n in d.get("notes", ())]
    ignored = [n for n in notes if "extra_" in n or "more tensors" in n]
    assert ignored == [] or len(ignored) == NAMED_IGNORED + 1, ignored  # vLLM's check: none
    if ignored:
        assert f"ignored {EXTRAS - NAMED_IGNORED} more tensors" in ignored[-1]


def _extras(crowded: Path) -> tuple[int, int]:
    """The ignored tensors and the metadata keys `inspect`'s views may cut, from its JSON."""
    code, out = run("inspect", str(crowded), "-f", "json")
    assert code == 0
    record = json.loads(out)
    ignored = [t for t in record["tensors"] if t.get("ignored") or t.get("role", "") is None]
    metadata = record.get("other_metadata", record.get("metadata"))
    return len(ignored), len(metadata)


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_inspect_shows_max_rows_of_the_extras_and_counts_the_rest(crowded: Path, fmt: str) -> None:
    tensors, keys = _extras(crowded)
    assert tensors >= EXTRAS and keys >= EXTRAS
    code, out = run("inspect", str(crowded), "-f", fmt, "--max-rows", "4")
    assert code == 0
    assert sum(f"extra_{i:04}" in out for i in range(EXTRAS)) <= 4 + NAMED_IGNORED  # + notes
    assert sum(f"x.note_{i:04}" in out for i in range(EXTRAS)) <= 4
    assert f"{tensors - 4} more ignored tensors" in out
    assert f"{keys - 4} more metadata keys" in out
    assert len(out.splitlines()) < 150


def test_inspect_json_lists_every_extra(crowded: Path) -> None:
    code, out = run("inspect", str(crowded), "-f", "json", "--max-rows", "4")
    assert code == 0
    record = json.loads(out)
    names = {t["name"] for t in record["tensors"]}
    assert {f"extra_{i:04}" for i in range(EXTRAS)} <= names
    metadata = record.get("other_metadata", record.get("metadata"))
    assert sum(key.startswith("x.note_") for key in metadata) == EXTRAS


def test_a_vllm_dumps_extra_tensors_are_left_unread(tmp_path: Path) -> None:
    """A tensor of no layout costs neither its size in memory nor a refusal of its dtype: the
    block-pool reader read every tensor whole (a 480 MB extra: 519 MB peak, against 55 MB) and
    refused a float one, exit 2."""
    import tracemalloc

    from kvcanary_cli.engines import describe_pool_dump

    source = tmp_path / "vllm.safetensors"
    assert CliRunner().invoke(app, ["synth", "vllm-clean", "--out", str(source)]).exit_code == 0
    with safe_open(str(source), "np") as handle:
        metadata = dict(handle.metadata() or {})
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    tensors["extra.big"] = np.zeros(2_000_000, np.int64)  # 16 MB
    tensors["extra.floats"] = np.zeros(3, np.float32)
    path = tmp_path / "extras.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    tracemalloc.start()
    try:
        described = describe_pool_dump(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak
    extras = {t.name: t for t in described.tensors if t.ignored}
    assert set(extras) == {"extra.big", "extra.floats"}
    assert (extras["extra.floats"].dtype, extras["extra.big"].bytes) == ("float32", 16_000_000)
    code, out = run("check", str(path))
    assert code == 0, out
