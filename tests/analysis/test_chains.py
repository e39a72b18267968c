"""One fault, one story (docs/findings.md, "Chains"): a cause that explains another's symptoms
absorbs it (`explained_by`), the page mechanisms are named first with their pages and rows,
and the report says one top-level cause per planted fault."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from kvcanary_cli.catalog import CauseCode
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.render.markdown.check import check_markdown
from kvcanary_cli.render.table.check import check_table
from kvcanary_cli.results.check import CheckReport, DumpReport
from kvcanary_cli.synth.scenarios import SCENARIOS, make_scenario
from kvcanary_cli.synth.state import SynthDump
from tests.helpers import checked, page_sizes_in_turn
from tests.render.record_schema import record_of

#: the page mechanisms: scenario -> the page sizes its test runs at
MECHANISMS = {
    "swa-boundary-page-cleared": (4, 16),
    "swa-page-reissued": (4, 16),
    "reserved-swa-page-freed-twice": (1, 4, 16),
}


def _check(dump: SynthDump, path: Path) -> DumpReport:
    return checked(load_dump(dump.save(path)), kernel="vectorized")


def _top(report: DumpReport) -> list[str]:
    """The top-level causes: not absorbed by another, not an alternative reading."""
    return [
        c.code.value
        for c in report.diagnosis
        if c.explained_by is None and c.confidence.value != "possible"
    ]


def _table_text(report: DumpReport) -> str:
    console = Console(file=io.StringIO(), record=True, width=100, color_system=None)
    console.print(check_table(CheckReport(dumps=(report,))))
    return console.export_text()


@pytest.mark.parametrize("size", ["tiny", "small"])
@pytest.mark.parametrize(
    ("name", "page_size"), [(n, p) for n, sizes in MECHANISMS.items() for p in sizes]
)
def test_each_page_mechanism_is_named_first_and_its_twin_is_silent(
    name: str, page_size: int, size: str, tmp_path: Path
) -> None:
    for seed in (0, 1):
        bad = make_scenario(name, seed=seed, size=size, page_size=page_size)
        report = _check(bad, tmp_path / "bad.safetensors")
        first = report.diagnosis[0]
        assert first.code.value == SCENARIOS[name].cause, (seed, report.diagnosis)
        assert _top(report) == [first.code.value], (seed, report.diagnosis)
        # the evidence has numbers: the page, its slots, the rows holding it
        evidence = " ".join(first.evidence)
        assert re.search(r"page \d+ \(slots? \d+(\.\.\d+)?\)", evidence), evidence
        # the fix names the mechanism, not a pull request
        assert "PR #" not in first.fix and first.fix, first.fix
        twin = make_scenario(name, seed=seed, size=size, page_size=page_size, corrupt=False)
        assert _check(twin, tmp_path / "twin.safetensors").findings == ()


def test_the_boundary_page_evidence_names_rows_and_positions(tmp_path: Path) -> None:
    bad = make_scenario("swa-boundary-page-cleared", seed=0, page_size=4)
    report = _check(bad, tmp_path / "d.safetensors")
    evidence = " ".join(report.diagnosis[0].evidence)
    row = bad.truth["batch_row"]
    assert f"batch row {row} (pool row " in evidence, evidence
    assert f"window starts at {bad.truth['position']}" in evidence, evidence
    assert "free per entry" in report.diagnosis[0].fix


def test_the_reissued_page_names_both_owners(tmp_path: Path) -> None:
    bad = make_scenario("swa-page-reissued", seed=0, page_size=4)
    report = _check(bad, tmp_path / "d.safetensors")
    evidence = " ".join(report.diagnosis[0].evidence)
    old_page = bad.truth["full_slot"] // 4
    assert f"full page {old_page} (slots {old_page * 4}..{old_page * 4 + 3})" in evidence
    assert "stale" in evidence and "batch row" in evidence


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_a_reserved_page_freed_twice_is_the_reserved_cause(page_size: int, tmp_path: Path) -> None:
    bad = make_scenario("reserved-swa-page-freed-twice", seed=0, page_size=page_size)
    report = _check(bad, tmp_path / "d.safetensors")
    codes = {c.code: c for c in report.diagnosis}
    assert report.diagnosis[0].code is CauseCode.RESERVED_SLOT_FREED
    assert codes[CauseCode.DOUBLE_FREE].explained_by is CauseCode.RESERVED_SLOT_FREED
    also = " ".join(report.diagnosis[0].also_shows)
    assert "free-list-duplicate" in also and "double-free" in also, also
    text = _table_text(report)
    # one fix, the reserved page's; the double free shows as a symptom line
    assert text.count("fix:") == 1 and "also shows" in text, text


def test_the_reserved_page_freed_twice_and_handed_out_is_one_cause(tmp_path: Path) -> None:
    """Page 0 of the SWA pool freed twice and handed out: once five certain causes, now the
    reserved page with the others under it."""
    bad = make_scenario("reserved-swa-page-handed-out", seed=0, page_size=4)
    padding = np.arange(4, dtype=np.int64)
    free = bad.tensors["free_swa_slots"]
    bad.tensors["free_swa_slots"] = np.concatenate([free, padding, padding])
    report = _check(bad, tmp_path / "d.safetensors")
    assert len(report.diagnosis) >= 2
    assert _top(report) == ["reserved-slot-freed"], report.diagnosis


def test_a_freed_slot_still_read_is_the_free_not_the_mapping(tmp_path: Path) -> None:
    """A live in-window full slot put on the free list: its LUT entry is still mapped (it is
    live), so the free is what happened, and the stale mapping its symptom."""
    bad = make_scenario("clean-swa-paged", seed=0, page_size=4)
    window = int(bad.metadata["swa_window_size"])
    lr = next(lr for lr in bad.live if lr.prefix_len > window)
    slot = int(lr.slots[lr.prefix_len - 1])
    bad.tensors["free_full_slots"] = np.sort(np.r_[bad.tensors["free_full_slots"], slot])
    report = _check(bad, tmp_path / "d.safetensors")
    assert report.diagnosis[0].code is CauseCode.USE_AFTER_FREE, report.diagnosis
    assert _top(report) == ["use-after-free"], report.diagnosis


def test_a_leak_of_a_cleared_mapping_joins_the_mapping(tmp_path: Path) -> None:
    """A deferred free cleared a live page's mappings inside the window and never freed its
    SWA page: one cause, the cleared mapping, with the leak under it."""
    bad = make_scenario("clean-swa-paged", seed=0, page_size=4)
    lut = bad.tensors["full_to_swa_index_mapping"]
    window = int(bad.metadata["swa_window_size"])
    lr = next(lr for lr in bad.live if lr.prefix_len > window + 8)
    page = int(lr.slots[lr.prefix_len - 5]) // 4
    lut[page * 4 + np.arange(4)] = 0
    report = _check(bad, tmp_path / "d.safetensors")
    causes = {c.code: c for c in report.diagnosis}
    assert CauseCode.SWA_LEAK in causes, report.diagnosis
    assert _top(report) == ["swa-mapping-cleared-in-window"], report.diagnosis
    assert causes[CauseCode.SWA_LEAK].explained_by is CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW
    record = record_of(CheckReport(dumps=(report,)))["dumps"][0]
    by_code = {c["cause"]: c for c in record["diagnosis"]}
    cleared = CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW
    assert by_code[CauseCode.SWA_LEAK]["explained_by"] == "swa-mapping-cleared-in-window"
    assert by_code[cleared]["explained_by"] is None
    assert any("swa-page-leaked" in line for line in by_code[cleared]["also_shows"])
    markdown = check_markdown(CheckReport(dumps=(report,)))
    assert "also shows" in markdown and markdown.count("**fix:**") == 1


@pytest.mark.parametrize(
    ("name", "page_size"), page_sizes_in_turn(n for n, s in SCENARIOS.items() if s.expected)
)
def test_one_top_level_cause_per_planted_fault(name: str, page_size: int, tmp_path: Path) -> None:
    """Every synth scenario plants one fault: the report has one top-level cause, the
    planted one (at its own page size; others may name a neighbour's mechanism first only
    where the scenario's page size makes it so)."""
    for seed in (0, 1):
        bad = make_scenario(name, seed=seed, page_size=page_size)
        report = _check(bad, tmp_path / "d.safetensors")
        top = _top(report)
        assert len(top) == 1, (seed, [(c.code.value, c.explained_by) for c in report.diagnosis])
        assert top[0] == SCENARIOS[name].cause, (seed, top)
        explained = {c.code for c in report.diagnosis}
        for c in report.diagnosis:
            assert c.explained_by is None or c.explained_by in explained


def test_swa_write_wording_says_whose_slot_and_where_the_target_came_from(
    tmp_path: Path,
) -> None:
    bad = make_scenario("swa-write-into-live-slot", seed=0)
    report = _check(bad, tmp_path / "d.safetensors")
    [write] = [f for f in report.findings if f.code.value == "swa-write-to-live-slot"]
    assert "another request" in write.message and "LUT[" in write.message, write.message
    assert "other requests" not in write.message
    # recorded swa_out_cache_loc: the target came from it, not from the LUT
    bad.tensors["swa_out_cache_loc"] = bad.tensors["full_to_swa_index_mapping"][
        bad.tensors["out_cache_loc"]
    ]
    report = _check(bad, tmp_path / "e.safetensors")
    [write] = [f for f in report.findings if f.code.value == "swa-write-to-live-slot"]
    assert "swa_out_cache_loc[" in write.message, write.message


def test_swa_write_onto_the_same_request_says_so(tmp_path: Path) -> None:
    bad = make_scenario("clean-swa", seed=0)
    loc = bad.tensors["out_cache_loc"]
    lut = bad.tensors["full_to_swa_index_mapping"]
    window = int(bad.metadata["swa_window_size"])
    rpi, _, extend = (
        bad.tensors["req_pool_indices"],
        bad.tensors["prefix_lens"],
        bad.tensors["extend_seq_lens"],
    )
    writes = np.where((rpi != 0) & (extend > 0), extend, 0)
    row = int(np.flatnonzero(writes)[0])
    lr = next(lr for lr in bad.live if lr.batch_row == row)
    index = int(writes[:row].sum())
    lut[int(loc[index])] = lut[int(lr.slots[lr.prefix_len - min(window, lr.prefix_len)])]
    report = _check(bad, tmp_path / "d.safetensors")
    [write] = [f for f in report.findings if f.code.value == "swa-write-to-live-slot"]
    assert "the same request" in write.message, write.message


def test_swa_evidence_has_numbers(tmp_path: Path) -> None:
    for name in ("swa-shared-owner", "swa-write-into-live-slot", "stale-swa-mapping"):
        report = _check(make_scenario(name, seed=0), tmp_path / f"{name}.safetensors")
        evidence = " ".join(report.diagnosis[0].evidence)
        assert re.search(r"SWA slots? \d+", evidence) and re.search(r"full slots? \d+", evidence), (
            name,
            evidence,
        )


def test_the_legend_explains_the_terms_the_report_uses(tmp_path: Path) -> None:
    report = _check(make_scenario("truncated-lut", seed=0), tmp_path / "d.safetensors")
    assert len(report.requests) >= 2
    text = " ".join(_table_text(report).split())
    assert "P: prefix length" in text and "E: extend length" in text, text
    markdown = " ".join(check_markdown(CheckReport(dumps=(report,))).split())
    assert "P: prefix length" in markdown and "chain-prev: the cell" in text
    slots = _check(make_scenario("double-free", seed=0), tmp_path / "e.safetensors")
    # free-list entries are entries, not cells
    assert "free-list-duplicate entr" in " ".join(_table_text(slots).split())
