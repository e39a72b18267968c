"""`kvcanary shrink` on the command line, and every command reading a shrunk dump: the
original ids, the shrink record, the reproduce command, and one-line errors on bad input."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open
from typer.testing import CliRunner

from kvcanary_cli.cli import app
from kvcanary_cli.dump.atomic import write_safetensors
from kvcanary_cli.dump.sparse import gap_runs
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.results.provenance import ProvenanceReport
from kvcanary_cli.synth.scenarios import make_scenario
from tests.render.record_schema import validate

runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("shrink")
    # A hostile-looking name: the reproduce command must not carry it verbatim.
    original = make_scenario("truncated-lut", seed=1).save(folder / "rank 0;$(id).safetensors")
    small = folder / "small.safetensors"
    code, out, err = run("shrink", str(original), "--out", str(small))
    assert code == 0, err
    assert "req_to_token: kept" in out and "check it: kvcanary check" in out
    return original, small


def test_refuses_what_it_must_not_write(pair: tuple[Path, Path]) -> None:
    original, small = pair
    for args, words in (
        (["--out", str(small)], "exists"),
        (["--out", str(original), "--force"], "input of this command"),
        ([], "--out: name the small dump"),
        (["--out", "-"], "--out: name the small dump"),
    ):
        code, out, err = run("shrink", str(original), *args)
        assert code == 2 and out == ""
        assert len(err.strip().splitlines()) == 1 and words in err


@pytest.mark.parametrize("change", ["replaced", "rewritten"])
def test_a_dump_changed_during_the_run_is_refused(
    change: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The small dump's hash and bytes must come from the file whose cells were analysed:
    a dump replaced (or rewritten in place) after its analysis is one line, exit 2."""
    from kvcanary_cli.analysis import shrink_selection

    dump = make_scenario("truncated-lut", seed=1).save(tmp_path / "rank0.safetensors")
    other = make_scenario("use-after-free", seed=2).save(tmp_path / "other.safetensors")
    os.utime(dump, ns=(0, 0))  # a rewrite within the clock's tick must still show
    analyse = shrink_selection.shrink_keep

    def analyse_then_change(*args: Any, **kwargs: Any) -> Any:
        kept = analyse(*args, **kwargs)
        if change == "replaced":
            os.replace(other, dump)  # a server's atomic save of its next dump
        else:
            with dump.open("r+b") as handle:
                handle.seek(-8, os.SEEK_END)
                handle.write(b"\xff" * 8)
        return kept

    monkeypatch.setattr(shrink_selection, "shrink_keep", analyse_then_change)
    small = tmp_path / "small.safetensors"
    code, out, err = run("shrink", str(dump), "--out", str(small))
    assert code == 2 and out == "", err
    assert err.splitlines() == [
        f"error: {dump}: changed on disk after kvcanary analysed it (another process replaced "
        "or rewrote it; shrink a stable copy)"
    ]
    assert not small.exists()


def test_check_json_says_where_it_came_from(pair: tuple[Path, Path]) -> None:
    original, small = pair
    code, out, _ = run("check", str(small), "--kernel", "vectorized", "--format", "json")
    assert code == 1
    record = json.loads(out)
    assert validate(record, CheckReport) == []
    shrunk = record["dumps"][0]["shrunk"]
    assert shrunk["source"]["name"] == original.name
    assert shrunk["source"]["bytes"] == original.stat().st_size
    assert len(shrunk["source"]["sha256"]) == 64
    assert shrunk["dropped_bytes"] > 0 and "kept cells only" in shrunk["note"]
    cut = {t["name"]: t for t in shrunk["tensors"]}
    assert cut["req_to_token"]["kept"] + cut["req_to_token"]["dropped"] == 12 * 48
    code, out, _ = run("check", str(original), "--kernel", "vectorized", "--format", "json")
    assert json.loads(out)["dumps"][0]["shrunk"] is None


def test_markdown_carries_the_command_that_made_it(pair: tuple[Path, Path]) -> None:
    _, small = pair
    code, out, _ = run("check", str(small), "--kernel", "vectorized", "--format", "markdown")
    assert code == 1
    assert "```bash\nkvcanary shrink rank_0___id_.safetensors --out small.safetensors\n```" in out
    assert "provenance covers the kept cells only" in out
    code, out, _ = run("check", str(small), "--kernel", "vectorized")
    assert "shrunk from rank_0___id_.safetensors" in out and "$(" not in out


def test_provenance_reports_say_so(pair: tuple[Path, Path]) -> None:
    _, small = pair
    code, out, _ = run("provenance", str(small), "--slot", "107", "--format", "json")
    assert code == 0
    record = json.loads(out)
    assert validate(record, ProvenanceReport) == []
    assert record["shrunk"] is not None and record["slot"]["cells"]
    code, out, _ = run("provenance", str(small), "--row", "11")
    assert code == 0 and "kept cells only" in out
    code, out, _ = run("provenance", str(small), "--row", "11", "--format", "markdown")
    assert "kvcanary shrink rank_0___id_.safetensors --out small.safetensors" in out


@pytest.mark.parametrize(
    "args",
    [
        ("check", "--kernel", "vectorized"),
        ("provenance", "--slot", "107"),
        ("provenance", "--row", "11"),
        ("inspect",),
    ],
    ids=["check", "provenance-slot", "provenance-row", "inspect"],
)
def test_the_command_names_the_file_as_written_not_as_shown(
    pair: tuple[Path, Path], tmp_path: Path, args: tuple[str, ...]
) -> None:
    """A small dump whose name holds an ESC: the command that remakes it names the file made
    shell-safe from its own name, not from the escaped text the report shows it as."""
    _, small = pair
    named = tmp_path / "evil\x1b[31m.safetensors"
    named.write_bytes(small.read_bytes())
    code, out, err = run(*args, str(named), "--format", "markdown")
    assert code in (0, 1), err
    assert "--out evil__31m.safetensors" in out.replace("\\_", "_")  # Markdown text escapes _


def test_inspect_shows_the_record_and_the_sparse_tensors(pair: tuple[Path, Path]) -> None:
    original, small = pair
    code, out, _ = run("inspect", str(small), "--format", "json")
    assert code == 0
    record = json.loads(out)
    assert record["format"] == "1.2"
    assert record["shrink"]["source"]["name"] == original.name
    assert "kvcanary.shrink" not in record["other_metadata"]
    assert "kvcanary.dtypes" not in record["other_metadata"]  # part of the format, not extra
    table = next(t for t in record["tensors"] if t["name"] == "req_to_token")
    assert table["shape"] == [12, 48] and 0 < table["kept"] < 12 * 48
    code, out, _ = run("inspect", str(small))
    assert "shrunk from rank_0___id_.safetensors" in out and "sparse:" in out
    code, out, _ = run("inspect", str(small), "--format", "markdown")
    assert "| `req_to_token` | 12x48 |" in out


def test_plan_and_violations_read_it(tmp_path: Path) -> None:
    state = make_scenario("canary-aliasing", seed=0)
    original = state.save(tmp_path / "canary.safetensors")
    small = tmp_path / "canary.small.safetensors"
    assert run("shrink", str(original), "--out", str(small))[0] == 0
    for backend in ("reference", "vectorized", "triton"):
        plans = []
        for dump in (original, small):
            written = tmp_path / f"{dump.stem}.{backend}.plan.safetensors"
            code, _, err = run("plan", str(dump), "--backend", backend, "--out", str(written))
            assert code == 0, err
            with safe_open(str(written), framework="np") as handle:
                plans.append({k: handle.get_tensor(k) for k in handle.keys()})  # noqa: SIM118
        assert plans[0].keys() == plans[1].keys()
        assert all(np.array_equal(plans[0][k], plans[1][k]) for k in plans[0])
    rows = []
    for dump in (original, small):
        code, out, _ = run("violations", str(dump), "--replay", "--format", "json")
        assert code == 1
        record = json.loads(out)
        rows.append([(r["slot_idx"], r["position"], r["origin"]) for r in record["rows"]])
        notes = " ".join(record["notes"])
        assert ("is shrunk from canary.safetensors" in notes) == (dump == small)
    assert rows[0] == rows[1]


# --- malformed shrunk dumps: one line, exit 2 ---------------------------------------------


def _parts(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    with safe_open(str(path), framework="np") as handle:
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
        return tensors, dict(handle.metadata())


Change = Callable[[dict[str, np.ndarray], dict[str, str]], Any]


def _set(name: str, value: np.ndarray) -> Change:
    return lambda tensors, _: tensors.__setitem__(name, value)


def _drop(name: str) -> Change:
    return lambda tensors, _: tensors.pop(name)


def _meta(key: str, value: str | None) -> Change:
    return lambda _, meta: meta.pop(key) if value is None else meta.__setitem__(key, value)


def _starts(runs: np.ndarray) -> np.ndarray:
    """Format 1.2's runs (gap, length) as (flat start, length), int64."""
    pairs = runs.astype(np.int64)
    ends = np.cumsum(pairs[:, 0] + pairs[:, 1])
    return np.stack([ends - pairs[:, 1], pairs[:, 1]], axis=1)


def _first_run_past_the_end(tensors: dict[str, np.ndarray], _: dict[str, str]) -> None:
    runs = tensors["req_to_token.runs"].astype(np.uint64)
    runs[-1, 0] = 12 * 48 - 1  # a gap that skips past the table's end
    tensors["req_to_token.runs"] = runs


def _lost_live_cells(tensors: dict[str, np.ndarray], _: dict[str, str]) -> None:
    runs = tensors["req_to_token.runs"].astype(np.uint64)
    runs[0, 1] -= 1  # one cell of a batch row's live range is no longer kept
    runs[0, 0] += 1
    tensors["req_to_token.runs"] = runs
    tensors["req_to_token"] = tensors["req_to_token"][1:].copy()


def _dtypes(**changes: str | None) -> Change:
    """`kvcanary.dtypes` with some tensors' original dtype changed (None: left out)."""

    def change(_: dict[str, np.ndarray], meta: dict[str, str]) -> None:
        recorded = json.loads(meta["kvcanary.dtypes"])
        recorded.update(changes)
        meta["kvcanary.dtypes"] = json.dumps({k: v for k, v in recorded.items() if v})

    return change


def _widened_values(tensors: dict[str, np.ndarray], _: dict[str, str]) -> None:
    tensors["req_to_token"] = tensors["req_to_token"].astype(np.int64)  # the record says int32


def _huge_gap(tensors: dict[str, np.ndarray], _: dict[str, str]) -> None:
    runs = tensors["req_to_token.runs"].astype(np.uint64)
    runs[0, 0] = 2**64 - 1
    tensors["req_to_token.runs"] = runs


_I64 = np.int64


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (_first_run_past_the_end, "req_to_token.runs", "run"),
        (
            _set("req_to_token.runs", np.zeros((2, 3), dtype=np.uint8)),
            "req_to_token.runs",
            "[runs, 2]",
        ),
        (
            _set("req_to_token.shape", np.array([12, 48, 1], dtype=_I64)),
            "req_to_token.shape",
            "original shape",
        ),
        (
            _set("req_to_token.shape", np.array([1 << 40, 1 << 20], dtype=_I64)),
            "req_to_token.shape",
            "2^50",
        ),
        (
            _set("req_to_token.runs", np.zeros((0, 2), dtype=np.int64)),
            "req_to_token.runs",
            "expected uint8 or uint16",
        ),
        (_drop("req_to_token.shape"), "req_to_token.shape", "required with req_to_token.runs"),
        (_set("prefix_lens.runs", np.zeros((0, 2), dtype=_I64)), "prefix_lens.runs", "sparse"),
        (_lost_live_cells, "req_to_token", "live cells"),
        (_meta("kvcanary.shrink", None), "kvcanary.shrink", "required"),
        (_meta("kvcanary.shrink", "{not json"), "kvcanary.shrink", "not JSON"),
        (_meta("kvcanary.shrink", '{"schema": "kvcanary.shrink/9"}'), "kvcanary.shrink", "schema"),
        (_meta("kvcanary.format", "1.3"), "kvcanary.format", "not supported"),
        # format 1.2's own fields
        (_huge_gap, "req_to_token.runs", "outside [0, 576]"),
        (_meta("kvcanary.dtypes", None), "kvcanary.dtypes", "required"),
        (_meta("kvcanary.dtypes", '{"req_to_token": '), "kvcanary.dtypes", "not JSON"),
        (_meta("kvcanary.dtypes", '["I32"]'), "kvcanary.dtypes", "JSON object"),
        (_dtypes(req_to_token=None), "kvcanary.dtypes", "original dtype of the sparse"),
        (_dtypes(prefix_lens="I64"), "kvcanary.dtypes", "does not store sparse"),
        (_dtypes(req_to_token="F32"), "kvcanary.dtypes", "not an integer dtype"),
        (_dtypes(req_to_token="I16"), "req_to_token", "expected int32 or int64"),
        (_dtypes(req_to_token="I8"), "req_to_token", "cannot hold"),
        (_widened_values, "req_to_token", "int64, which its original dtype int32"),
    ],
)
def test_malformed_shrunk_dumps_are_one_line(
    pair: tuple[Path, Path], tmp_path: Path, change: Change, field: str, words: str
) -> None:
    _, small = pair
    tensors, meta = _parts(small)
    change(tensors, meta)
    broken = write_safetensors(tmp_path / "broken.safetensors", tensors, meta)
    code, out, err = run("inspect", str(broken))
    assert code == 2 and out == "", err
    assert len(err.strip().splitlines()) == 1
    assert field in err and words in err, err
    code, _, err = run("check", str(broken))
    assert code == 2 and field in err


def test_a_shrunk_record_with_a_bad_hash_is_refused(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    _, small = pair
    tensors, meta = _parts(small)
    record = json.loads(meta["kvcanary.shrink"])
    record["source"]["sha256"] = "xyz"
    meta["kvcanary.shrink"] = json.dumps(record)
    broken = write_safetensors(tmp_path / "broken.safetensors", tensors, meta)
    code, _, err = run("inspect", str(broken))
    assert code == 2 and "sha256" in err


def test_a_lut_claiming_2_to_the_40_entries_is_read_as_kept(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """The recorded original length is what lut_len means; nothing is allocated by it: the
    entries not kept read 0, so the last one (not kept) is no -1 any more."""
    _, small = pair
    tensors, meta = _parts(small)
    tensors["full_to_swa_index_mapping.shape"] = np.array([1 << 40], dtype=_I64)
    huge = write_safetensors(tmp_path / "huge-lut.safetensors", tensors, meta)
    for kernel in ("vectorized", "triton"):
        code, out, err = run("check", str(huge), "--kernel", kernel, "--format", "json")
        assert code == 1, err
        found = json.loads(out)["dumps"][0]["findings"]
        codes = {f["code"] for f in found}
        assert "lut-sentinel-missing" in codes and "lut-out-of-range" not in codes
        sentinel = next(f for f in found if f["code"] == "lut-sentinel-missing")
        assert sentinel["details"]["lut_len"] == 1 << 40


def test_the_kernels_will_not_stage_a_claimed_width(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """A table claiming 2^30 positions per row: Triton would need the batch's rows dense, so
    `check` plans the kernel side with the kernels' numpy model and says so in a note (the shrunk
    dump checks like its source); the vectorized kernel model reads the kept cells only."""
    _, small = pair
    tensors, meta = _parts(small)
    width = 1 << 30
    runs = _starts(tensors["req_to_token.runs"])
    runs[:, 0] = runs[:, 0] // 48 * width + runs[:, 0] % 48
    tensors["req_to_token.runs"] = gap_runs(runs)
    tensors["req_to_token.shape"] = np.array([12, width], dtype=_I64)
    wide = write_safetensors(tmp_path / "wide.safetensors", tensors, meta)
    code, out, err = run("check", str(wide), "--kernel", "triton", "--format", "json")
    assert code == 1, err
    staged = json.loads(out)["dumps"][0]
    assert any("model of the triton kernels" in note for note in staged["notes"])
    code, out, err = run("check", str(wide), "--kernel", "vectorized", "--format", "json")
    assert code == 1, err
    modelled = json.loads(out)["dumps"][0]
    assert modelled["bs"] == 5
    assert [f["code"] for f in staged["findings"]] == [f["code"] for f in modelled["findings"]]


def test_dtype_findings_read_as_on_the_original(tmp_path: Path) -> None:
    """Narrowed elements still report the dtype they had: an int64 table and an int32 LUT
    give the same dtype warnings on the small dump, and `inspect` shows the original dtypes
    next to the bytes actually stored."""
    state = make_scenario("truncated-lut", seed=0)
    state.tensors["req_to_token"] = state.tensors["req_to_token"].astype(np.int64)
    lut = state.tensors["full_to_swa_index_mapping"]
    state.tensors["full_to_swa_index_mapping"] = lut.astype(np.int32)
    original = state.save(tmp_path / "wide.safetensors")
    small = tmp_path / "wide.small.safetensors"
    assert run("shrink", str(original), "--out", str(small))[0] == 0
    stored = _parts(small)[0]
    assert stored["req_to_token"].dtype.itemsize < 8
    assert stored["full_to_swa_index_mapping"].dtype.itemsize < 4
    warnings = []
    for dump in (original, small):
        code, out, _ = run("check", str(dump), "--kernel", "vectorized", "--format", "json")
        assert code == 1
        found = json.loads(out)["dumps"][0]["findings"]
        warnings.append(
            sorted(
                json.dumps(f, sort_keys=True) for f in found if f["code"] == "gpu-dtype-mismatch"
            )
        )
    assert len(warnings[0]) == 2 and warnings[1] == warnings[0]
    code, out, _ = run("inspect", str(small), "--format", "json")
    tensors = {t["name"]: t for t in json.loads(out)["tensors"]}
    assert tensors["req_to_token"]["dtype"] == "int64"
    assert tensors["full_to_swa_index_mapping"]["dtype"] == "int32"
    assert tensors["req_to_token"]["bytes"] == stored["req_to_token"].nbytes
