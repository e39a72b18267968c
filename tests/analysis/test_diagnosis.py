"""Diagnosis: causes ranked first, symptoms grouped."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvcanary_cli.cli import app
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.dump.writer import save_dump
from kvcanary_cli.synth.scenarios import make_scenario
from tests.analysis.conftest import LoadSynth
from tests.helpers import checked


def test_the_per_request_view_appears_when_findings_span_requests(tmp_path: Path) -> None:
    spread = make_scenario("truncated-lut", seed=1).save(tmp_path / "spread.safetensors")
    single = make_scenario("use-after-free", seed=1).save(tmp_path / "single.safetensors")
    runner = CliRunner()
    out = runner.invoke(app, ["check", str(spread), "-k", "vectorized"]).stdout
    assert "requests with findings" in out
    assert "requests with findings" not in runner.invoke(app, ["check", str(single)]).stdout
    record = json.loads(runner.invoke(app, ["check", str(spread), "-f", "json"]).stdout)
    [dump] = record["dumps"]
    cells = [  # (batch row, position) of every cell, groups expanded
        pair
        for f in dump["findings"]
        for pair in (
            zip(f["cells"]["batch_row"], f["cells"]["position"], strict=True)
            if f["cells"] is not None
            else [(f["batch_row"], f["position"])]
        )
        if pair[0] is not None
    ]
    assert [r["batch_row"] for r in dump["requests"]] == sorted({row for row, _ in cells})
    for request in dump["requests"]:
        mine = [position for row, position in cells if row == request["batch_row"]]
        assert sum(request["counts"].values()) == len(mine)
        assert request["first_bad_position"] == min(mine)


def test_causes_come_before_symptoms_in_every_format(tmp_path: Path) -> None:
    path = make_scenario("prefix-past-row", seed=0).save(tmp_path / "p.safetensors")
    runner = CliRunner()
    table = runner.invoke(app, ["check", str(path), "-k", "vectorized"]).stdout
    assert table.index("batch-metadata-corrupt") < table.index("findings by code")
    markdown = runner.invoke(app, ["check", str(path), "-k", "vectorized", "-f", "markdown"]).stdout
    assert markdown.index("#### Diagnosis") < markdown.index("#### Cause 1")
    [dump] = json.loads(runner.invoke(app, ["check", str(path), "-f", "json"]).stdout)["dumps"]
    assert dump["diagnosis"][0]["cause"] == "batch-metadata-corrupt"
    assert {f["cause"] for f in dump["findings"]} == {"batch-metadata-corrupt"}


def _tail_dump(tmp_path: Path, tail: list[int], free: list[int]) -> Path:
    """One request of prefix 6 whose last cells hold `tail`; `free` is the free list."""
    table = np.zeros((3, 10), dtype=np.int32)
    table[1, :6] = np.arange(1, 7, dtype=np.int32)
    table[1, 6 - len(tail) : 6] = np.array(tail, dtype=np.int32)
    return save_dump(
        tmp_path / "tail.safetensors",
        req_to_token=table,
        req_pool_indices=np.array([1]),
        prefix_lens=np.array([6]),
        free_full_slots=np.array(free),
        metadata={"num_full_slots": "32"},
    )


def test_a_run_of_freed_slots_at_the_end_of_the_prefix_is_a_stale_read(tmp_path: Path) -> None:
    report = checked(load_dump(_tail_dump(tmp_path, [20, 21, 22], free=[20, 21, 22, 30])))
    assert report.diagnosis[0].code.value == "stale-row-read"
    assert "positions 3..5" in report.diagnosis[0].evidence[0]


def test_one_freed_slot_is_a_use_after_free(tmp_path: Path) -> None:
    report = checked(load_dump(_tail_dump(tmp_path, [20], free=[20, 30])))
    assert [c.code.value for c in report.diagnosis] == ["use-after-free"]


def test_without_a_pool_size_the_free_list_argues_for_a_short_lut(load_synth: LoadSynth) -> None:
    synth = make_scenario("truncated-lut-unrecorded", seed=0)
    report = checked(load_synth(synth))
    first, second = report.diagnosis[:2]
    assert (first.code.value, first.confidence.value) == ("lut-too-short", "likely")
    assert (second.code.value, second.confidence.value) == ("slot-index-corrupt", "possible")
    assert any("record it to decide" in e for e in first.evidence)


def test_a_partial_page_whose_cells_a_batch_cause_took_first_adds_no_cause(
    tmp_path: Path,
) -> None:
    """Out-of-window cells of a corrupt batch row go to batch-metadata-corrupt first; the page
    rule then has nothing to claim, and the diagnosis says so instead of failing."""
    from kvcanary_cli.analysis.diagnosis import diagnose
    from kvcanary_cli.catalog import FindingCode
    from kvcanary_cli.dump.schema import Group
    from kvcanary_cli.results.cells import CellColumns, Role, Space
    from kvcanary_cli.results.check import Finding

    state = make_scenario("partial-page-free", seed=0, page_size=4)
    dump = load_dump(state.save(tmp_path / "d.safetensors"))
    full, swa = state.truth["slot"], state.truth["swa_slot"]
    one = np.array([0], dtype=np.int64)
    freed = Finding(
        code=FindingCode.FREED_SLOT_IN_LIVE_RANGE,
        group=Group.SWA,
        space=Space.SWA,
        role=Role.PREFIX,
        message="a stand-in",
        slot=swa,
        cells=CellColumns(
            batch_row=one,
            pool_row=one + 1,
            position=one,
            slot=one + swa,
            extra={"full_slot": one + full},
        ),
    )
    bad_row = Finding(
        code=FindingCode.NEGATIVE_LENGTH, group=Group.FULL, message="a stand-in", batch_row=0
    )
    _, causes = diagnose(dump, [freed, bad_row])
    assert [c.code.value for c in causes] == ["batch-metadata-corrupt"]


def test_many_stale_rows_are_one_pass_and_a_bounded_argument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2,000 batch rows each reading a stale tail: one cause whose evidence names the first
    few rows and counts the rest, built without a pass over the cells per row (which made a
    10 MB dump run for minutes)."""
    from kvcanary_cli.analysis import diagnosis
    from tests.helpers import stale_rows_dump

    lines: list[object] = []
    counted = diagnosis._counted

    def counting(codes: Counter[str]) -> str:
        lines.append(codes)
        return counted(codes)

    monkeypatch.setattr(diagnosis, "_counted", counting)
    report = checked(load_dump(stale_rows_dump(tmp_path / "rows.safetensors", 2_000)))
    [cause] = report.diagnosis
    assert cause.code.value == "stale-row-read"
    shown = diagnosis.STALE_ROWS_SHOWN
    assert len(lines) <= shown  # a tally per row shown, not per row
    assert len(cause.evidence) == shown + 1
    assert cause.evidence[0].startswith("batch row 0 (pool row 1): positions 4..7, the last 4")
    assert "4 freed-slot-in-live-range cells" in cause.evidence[shown - 1]
    assert cause.evidence[-1] == (
        f"... and {2_000 - shown} more batch rows with a stale tail "
        f"({4 * (2_000 - shown)} cells; every one is in the findings)"
    )
    assert sum(cause.explains.values()) == 8_000


def test_a_few_stale_rows_are_each_named(tmp_path: Path) -> None:
    from tests.helpers import stale_rows_dump

    report = checked(load_dump(stale_rows_dump(tmp_path / "rows.safetensors", 3, tail=3)))
    [cause] = report.diagnosis
    assert [e.split(":")[0] for e in cause.evidence] == [
        "batch row 0 (pool row 1)",
        "batch row 1 (pool row 2)",
        "batch row 2 (pool row 3)",
    ]
    assert all("3 freed-slot-in-live-range cells" in e for e in cause.evidence)
