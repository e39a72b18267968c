"""Sources and dump-side canary data: dump or log, real-KV sources and their checks, and a
large ring handled without a loop per row."""

from __future__ import annotations

import io
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from kvcanary_cli import api
from kvcanary_cli.analysis.violations.collect import violations_report
from kvcanary_cli.canary import real_kv
from kvcanary_cli.canary.hashing import combine_source_hashes, fold_chunks
from kvcanary_cli.canary.logs import SWA_DIVERGENCE_KEYS
from kvcanary_cli.canary.real_kv import RealKvMode, expected_real_kv, real_kv_setup
from kvcanary_cli.canary.sources import SourceKind, source_kind
from kvcanary_cli.cli import app
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.errors import DumpError, OptionError, PathError
from kvcanary_cli.render import OutputFormat, render
from kvcanary_cli.synth.scenarios import make_scenario
from tests.fuzz.mutants import Seed


def test_source_kinds(tmp_path: Path) -> None:
    dump = make_scenario("clean-decode").save(tmp_path / "renamed.bin")
    log = tmp_path / "server.log"
    log.write_text("hello\n")
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert source_kind(str(dump)) is SourceKind.DUMP  # by content, whatever the name
    assert source_kind(str(log)) is SourceKind.LOG
    assert source_kind(str(empty)) is SourceKind.LOG
    assert source_kind("-") is SourceKind.LOG
    with pytest.raises(PathError, match="no such file"):
        source_kind(str(tmp_path / "nope\n.log"))


def test_real_kv_sources_load_and_fold(tmp_path: Path) -> None:
    synth = make_scenario("clean-canary", seed=0)
    dump = load_dump(synth.save(tmp_path / "c.safetensors"))
    assert set(dump.real_kv_sources) == {
        "real_kv.full.k",
        "real_kv.full.v",
        "real_kv.swa.k",
        "real_kv.swa.v",
    }
    setup = real_kv_setup(dump)
    assert setup.mode is RealKvMode.PARTIAL
    slots = np.array([1, 2, -1, 10**9])
    result = expected_real_kv(setup, "full", "tail.k", slots)
    assert result is not None
    values, known = result
    assert known.tolist() == [True, True, False, False]
    head = expected_real_kv(setup, "full", "head.v", slots)
    assert head is not None and head[0].tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("real_kv.mode", "sometimes"),
        ("real_kv.num_bytes_per_token", "24"),
        ("real_kv.read_bytes", "48"),
        ("real_kv.page_size", "0"),
    ],
)
def test_bad_real_kv_metadata_is_bad_input(key: str, value: str, tmp_path: Path) -> None:
    synth = make_scenario("clean-canary", seed=0)
    synth.metadata[key] = value
    dump = load_dump(synth.save(tmp_path / "bad.safetensors"))
    with pytest.raises(DumpError, match=key):
        real_kv_setup(dump)


def test_a_long_bad_real_kv_value_is_named_not_reprinted(tmp_path: Path) -> None:
    synth = make_scenario("clean-canary", seed=0)
    synth.metadata["real_kv.page_size"] = "-" + "9" * 100_000  # parses, but not positive
    dump = load_dump(synth.save(tmp_path / "bad.safetensors"))
    with pytest.raises(DumpError) as caught:
        real_kv_setup(dump)
    message = str(caught.value)
    assert "real_kv.page_size" in message and "(100001 characters)" in message
    assert len(message) < 400


@pytest.mark.slow
def test_a_large_ring_is_decoded_filtered_and_explained(tmp_path: Path) -> None:
    synth = make_scenario("canary-aliasing", seed=0)
    rng = np.random.default_rng(0)
    n = 200_000
    ring = rng.integers(-(1 << 40), 1 << 40, size=(n, 8), dtype=np.int64)
    ring[:, 0] = rng.integers(-2, 14, size=n)
    ring[:, 1] = rng.integers(0, 300, size=n)
    ring[:, 2] = rng.integers(0, 48, size=n)
    ring[:, 7] = rng.integers(0, 64, size=n)
    synth.tensors["violation_ring"] = ring
    synth.tensors["violation_write_index"] = np.array([n + 5], dtype=np.int32)
    path = synth.save(tmp_path / "big.safetensors")
    report = violations_report([str(path)])
    assert len(report.rows) == n and report.rows.explanations is not None
    assert report.sources[0].ring is not None and report.sources[0].ring.overflow
    assert report.slots_total > len(report.slots) == 64
    out = render(report, OutputFormat.MARKDOWN, max_rows=5)
    assert isinstance(out, str) and f"… and {n - 5} more" in out
    for fmt in (OutputFormat.TABLE, OutputFormat.MARKDOWN):  # a view makes the rows it shows
        tracemalloc.start()
        try:
            drawn = io.StringIO()
            Console(file=drawn, width=120).print(render(report, fmt, max_rows=5))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert f"{n - 5} more" in drawn.getvalue() and peak < 4 << 20, f"{peak / 2**20:.1f} MiB"
    swa_only = violations_report([str(path)], group="swa", buffer="tail.k")
    expected = np.isin(ring[:, 0], [8, 10]).sum()
    assert len(swa_only.rows) == expected


def test_option_errors(tmp_path: Path) -> None:
    a = make_scenario("clean-decode", seed=0).save(tmp_path / "a.safetensors")
    b = make_scenario("clean-decode", seed=1).save(tmp_path / "b.safetensors")
    with pytest.raises(OptionError, match="at most one dump"):
        violations_report([str(a), str(b)])
    log = tmp_path / "x.log"
    log.write_text("")
    with pytest.raises(OptionError, match="needs a dump"):
        violations_report([str(log)], replay=True)
    assert len(violations_report([str(a)], dump=str(a)).rows) == 0  # the same dump twice is one


def test_swa_divergence_samples_are_summarised(tmp_path: Path) -> None:
    log = tmp_path / "swa.log"
    samples = [(20, 100, 40, 3, 7), (40, 210, 90, 9, 2)]
    log.write_text(
        "".join(
            "[I] kv_canary_swa_divergence="
            + json.dumps(dict(zip(SWA_DIVERGENCE_KEYS, s, strict=True)), separators=(",", ":"))
            + "\n"
            for s in samples
        )
    )
    report = violations_report([str(log)])
    summary = report.sources[0].log
    assert summary is not None and summary.swa_divergence is not None
    swa = summary.swa_divergence
    assert (swa.samples, swa.peak_swa_full_idx_divergence, swa.peak_swa_out_of_window_tokens) == (
        2,
        9,
        7,
    )
    assert swa.last == dict(zip(SWA_DIVERGENCE_KEYS, samples[-1], strict=True))
    out = render(report, OutputFormat.TABLE)
    assert not isinstance(out, str)


# --- real-KV sources: work follows the bytes stored, never entries x width (issue 27) -----


def _all_mode(tmp_path: Path, name: str, **metadata: str) -> Path:
    """clean-canary with TAIL records checked on every byte of a token (mode all)."""
    synth = make_scenario("clean-canary", seed=0)
    synth.metadata.update({"real_kv.mode": "all", **metadata})
    return synth.save(tmp_path / name)


def _folded(source: np.ndarray, slot: int, page: int, per_token: int, read: int) -> int:
    """The fingerprint of one slot, straight from docs/canary.md §3."""
    row, at = divmod(slot, page)
    data = source[row : row + 1, at * per_token : at * per_token + read]
    return int(np.asarray(combine_source_hashes([fold_chunks(data)])).view(np.int64)[0])


@pytest.mark.parametrize("fold_bytes", [16, 64, 1 << 20])
def test_fingerprints_fold_in_steps_like_one_pass(
    tmp_path: Path, fold_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Slots read many times, pages of 4 tokens of 64 bytes, 48 read: a step of a few bytes of
    # a few slots folds to what one pass over each slot's bytes gives.
    monkeypatch.setattr(real_kv, "FOLD_BYTES", fold_bytes)
    synth = make_scenario("clean-canary", seed=0)
    rng = np.random.default_rng(5)
    for name in [n for n in synth.tensors if n.startswith("real_kv.")]:
        synth.tensors[name] = rng.integers(0, 256, size=(40, 272), dtype=np.uint8)
    synth.metadata.update(
        {
            "real_kv.mode": "all",
            "real_kv.page_size": "4",
            "real_kv.num_bytes_per_token": "64",
            "real_kv.read_bytes": "48",
        }
    )
    dump = load_dump(synth.save(tmp_path / "paged.safetensors"))
    source = dump.real_kv_sources["real_kv.full.k"].array()
    slots = rng.integers(-3, 170, size=500)
    result = expected_real_kv(real_kv_setup(dump), "full", "tail.k", slots)
    assert result is not None
    values, known = result
    inside = (slots >= 0) & (slots < 160)
    assert known.tolist() == inside.tolist()
    want = [
        _folded(source, int(s), 4, 64, 48) if ok else 0 for s, ok in zip(slots, inside, strict=True)
    ]
    assert values.tolist() == want


def test_a_source_without_rows_leaves_every_slot_unknown(tmp_path: Path) -> None:
    # A source of shape [0, 32] in mode all was an IndexError (exit 3): every command reads it.
    synth = make_scenario("clean-canary", seed=0)
    synth.metadata["real_kv.mode"] = "all"
    for name in [n for n in synth.tensors if n.startswith("real_kv.")]:
        synth.tensors[name] = synth.tensors[name][:0]
    path = synth.save(tmp_path / "empty-source.safetensors")
    result = expected_real_kv(real_kv_setup(load_dump(path)), "full", "tail.k", np.arange(5))
    assert result is not None and not result[1].any()
    report = violations_report([str(path)], replay=True)
    assert {r.buffer: r.real_kv for r in report.replay}["tail.k"] == "checked"
    assert any("real-KV source" in note for note in report.notes)
    for args in (
        ["check", str(path), "--kernel", "vectorized"],
        ["provenance", str(path), "--slot", "3", "--space", "swa"],
        ["shrink", str(path), "--out", str(tmp_path / "small.safetensors")],
    ):
        result_of = CliRunner().invoke(app, args)
        assert result_of.exit_code in (0, 1), (args, result_of.stderr)


def test_a_shrunk_source_claiming_huge_rows_reads_what_it_stores(tmp_path: Path) -> None:
    # A shrunk dump may claim rows of 2^40 bytes (`real_kv.*.shape`): np.arange(2^40) before.
    source = _all_mode(tmp_path, "all.safetensors")
    small = tmp_path / "small.safetensors"
    api.shrink(source, small)
    seed = Seed.parse("small", small.read_bytes())
    rows = int(seed.array("real_kv.full.k.shape")[0])
    claimed = tmp_path / "claimed.safetensors"
    claimed.write_bytes(seed.put("real_kv.full.k.shape", np.array([rows, 1 << 40])))
    dump = load_dump(claimed)
    setup = real_kv_setup(dump)
    assert setup.sources[("full", "k")].read_bytes == 1 << 40  # the claim, honoured as such
    result = expected_real_kv(setup, "full", "tail.k", np.arange(1, 20))
    assert result is not None and not result[1].any()  # no slot keeps 2^40 bytes
    for args in (
        ["check", str(claimed), "--kernel", "vectorized"],
        ["violations", str(claimed), "--replay"],
        ["provenance", str(claimed), "--slot", "3"],
        ["shrink", str(claimed), "--out", str(tmp_path / "again.safetensors")],
    ):
        outcome = CliRunner().invoke(app, args)
        assert outcome.exit_code in (0, 1), (args, outcome.stderr)


def test_a_huge_page_size_is_blamed_and_the_dump_named(tmp_path: Path) -> None:
    # real_kv.page_size = 2^62 made the default num_bytes_per_token 1, and the line blamed it
    # (a key the dump never recorded), naming no file.
    path = _all_mode(tmp_path, "paged.safetensors", **{"real_kv.page_size": str(1 << 62)})
    with pytest.raises(DumpError) as caught:
        real_kv_setup(load_dump(path))
    assert caught.value.field == "real_kv.page_size" and caught.value.path == str(path)
    outcome = CliRunner().invoke(app, ["violations", str(path), "--replay"])
    assert outcome.exit_code == 2
    assert outcome.stderr == f"error: {caught.value}\n"
    assert str(path) in outcome.stderr and "real_kv.page_size" in outcome.stderr
