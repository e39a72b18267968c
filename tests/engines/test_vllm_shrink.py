"""`shrink` on vLLM block-pool dumps: the small dump tells the same story (every finding, its
blocks, holders, queue places and message, the causes and the pool's counts), a clean pool
stays clean, the small file is smaller and names its original, and the output rules hold."""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvcanary_cli import api
from kvcanary_cli.cli import app
from kvcanary_cli.dump.atomic import write_safetensors
from kvcanary_cli.dump.engine import read_arrays
from kvcanary_cli.engines.vllm.synth import SCENARIOS
from kvcanary_cli.results.pool import PoolDumpReport, PoolProvenance

runner = CliRunner()


@pytest.fixture(scope="module")
def shrunk(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Every vLLM scenario (a 2,048-block pool), written and shrunk."""
    folder = tmp_path_factory.mktemp("vllm-shrink")
    out = {}
    for name in SCENARIOS:
        big, small = folder / f"{name}.safetensors", folder / f"{name}.small.safetensors"
        api.synth(name, big, seed=0, size="small")
        api.shrink(big, small)
        out[name] = (big, small)
    return out


def _report(path: Path) -> PoolDumpReport:
    [report] = api.check(path).dumps
    assert isinstance(report, PoolDumpReport) and report.error is None, report.error
    return report


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_small_dump_tells_the_same_story(
    shrunk: dict[str, tuple[Path, Path]], name: str
) -> None:
    big, small = shrunk[name]
    before, after = _report(big), _report(small)
    assert [f.code for f in before.findings] == list(SCENARIOS[name].expected)
    # every field: findings (blocks, owners, queue places, messages), causes, counts
    assert replace(after, path=before.path, coverage=before.coverage) == before
    assert any(big.name in line for line in after.coverage), after.coverage
    assert os.path.getsize(small) < os.path.getsize(big)


def test_a_clean_pool_shrinks_to_a_clean_pool_a_fraction_of_its_size(
    shrunk: dict[str, tuple[Path, Path]],
) -> None:
    for name in ("vllm-clean", "vllm-hybrid-clean"):
        big, small = shrunk[name]
        assert _report(small).findings == ()
        assert os.path.getsize(small) * 4 < os.path.getsize(big)


def test_the_record_names_the_original_and_a_second_shrink_writes_the_same_bytes(
    shrunk: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    big, small = shrunk["vllm-dead-request"]
    again = api.shrink(small, tmp_path / "again.safetensors")
    record = again.record
    assert record.source_name == big.name and record.source_bytes == os.path.getsize(big)
    assert record.source_sha256 == hashlib.sha256(big.read_bytes()).hexdigest()
    assert (tmp_path / "again.safetensors").read_bytes() == small.read_bytes()
    cuts = {cut.name: cut for cut in record.tensors}
    assert cuts["vllm.ref_cnt"].shape == (2048,) and cuts["vllm.ref_cnt"].dropped > 0
    assert cuts["vllm.table_block"].dropped > 0
    assert "vllm.ref_cnt: kept" in "\n".join(again.summary_lines())


def test_provenance_of_a_kept_block_is_the_originals_and_a_dropped_one_is_one_line(
    shrunk: dict[str, tuple[Path, Path]],
) -> None:
    big, small = shrunk["vllm-freed-while-held"]
    [finding] = _report(big).findings
    assert finding.block is not None
    before, after = (api.provenance(p, block=finding.block) for p in (big, small))
    assert isinstance(before, PoolProvenance) and isinstance(after, PoolProvenance)
    assert replace(after, path=before.path) == before
    dropped = next(b for b in range(1, 2048) if b not in finding.blocks)
    out = runner.invoke(app, ["provenance", str(small), "--block", str(dropped)])
    assert out.exit_code == 2, out.output
    [line] = out.output.splitlines()
    assert f"block {dropped}" in line and "not kept" in line and big.name in line


def test_the_cli_writes_once_refuses_overwrites_links_and_scalars(
    shrunk: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    big, _ = shrunk["vllm-double-free"]
    small = tmp_path / "small.safetensors"
    first = runner.invoke(app, ["shrink", str(big), "--out", str(small)])
    assert first.exit_code == 0, first.output
    assert "vllm.ref_cnt: kept" in first.output and big.name in first.output
    assert "provenance covers the kept blocks only" in first.output
    link = tmp_path / "link.safetensors"
    link.symlink_to(tmp_path / "elsewhere.safetensors")
    refusals = [
        ["--out", str(small)],
        ["--out", str(big), "--force"],
        ["--out", str(link), "--force"],
        ["--out", str(tmp_path / "x.safetensors"), "--set", "page_size=16"],
    ]
    for extra in refusals:
        out = runner.invoke(app, ["shrink", str(big), *extra])
        assert out.exit_code == 2, (extra, out.output)
        assert len(out.output.splitlines()) == 1 and "Traceback" not in out.output
    assert not (tmp_path / "elsewhere.safetensors").exists()
    assert not (tmp_path / "x.safetensors").exists()
    forced = runner.invoke(app, ["shrink", str(big), "--out", str(small), "--force"])
    assert forced.exit_code == 0, forced.output


def _rewritten(small: Path, tmp_path: Path, **changes: np.ndarray | str) -> Path:
    stored = read_arrays(small)
    tensors, meta = dict(stored.arrays), dict(stored.metadata)
    for key, value in changes.items():
        name = key.replace("__", ".")
        if isinstance(value, str):
            meta[name] = value
        else:
            tensors[name] = value
    return write_safetensors(tmp_path / "bad.safetensors", tensors, meta, overwrite=True)


def test_a_damaged_small_dump_is_one_line_exit_2(
    shrunk: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    many, queued = shrunk["vllm-dead-request"][1], shrunk["vllm-freed-while-held"][1]
    kept = read_arrays(many).arrays["vllm.kept_blocks"]
    at = read_arrays(queued).arrays["vllm.free_queue_at"]
    assert kept.size > 1 and at.size
    cases: list[tuple[Path, dict[str, np.ndarray | str]]] = [
        (many, {"vllm__kept_blocks": kept[::-1].copy()}),
        (many, {"vllm__kept_blocks": np.append(kept[:-1], 4096)}),
        (many, {"vllm__kept_blocks": kept[:-1].copy()}),
        (queued, {"vllm__free_queue_at": at[:-1].copy()}),
        (queued, {"vllm__free_queue_at": at + 10_000}),
        (queued, {"vllm__shrunk": "{"}),
        (queued, {"vllm__shrunk": '{"free_queue_length": -1}'}),
        (queued, {"kvcanary__shrink": "[]"}),
    ]
    for small, changes in cases:
        path = _rewritten(small, tmp_path, **changes)
        out = runner.invoke(app, ["check", str(path)])
        assert out.exit_code == 2, (changes, out.output)
        assert "Traceback" not in out.output and str(path) in out.output


def test_a_timeline_of_small_dumps_is_refused_in_one_line(
    shrunk: dict[str, tuple[Path, Path]],
) -> None:
    big, small = shrunk["vllm-clean"]
    out = runner.invoke(app, ["diff", str(big), str(small)])
    assert out.exit_code == 2, out.output
    [line] = out.output.splitlines()
    assert "shrunk" in line and str(small) in line
