"""Coverage (issue 45): every verdict says which families of checks ran and which could not
for lack of a record, in every view, from the same declarations that decide what runs.

One clean dump records everything (SWA, canary buffers, the tree, the request rows and their
locks); each test drops one record and reads its coverage line."""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from kvcanary_cli.analysis import coverage as coverage_module
from kvcanary_cli.analysis.coverage import CHECKS
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.dump.schema import Layout
from kvcanary_cli.render import OutputFormat, render
from kvcanary_cli.results.check import CheckReport, DumpReport
from kvcanary_cli.synth.scenarios import SCENARIOS, SIZES, make_scenario
from kvcanary_cli.synth.state import SynthDump, build_dump
from tests.helpers import checked

#: every family a paged dump can run (the page tables are unified memory's, the Mamba slots
#: the Mamba layout's), and those of other layouts only
EVERY = {family.name for family in CHECKS if Layout.PAGED in family.layouts}
OTHER_LAYOUTS = {family.name for family in CHECKS} - EVERY
#: the HiCache host pool's families (not applicable to a dump of a server without HiCache)
HICACHE = {family.name for family in CHECKS if family.hicache}


def _whole() -> SynthDump:
    """A clean SWA state with every record kvcanary reads: the tree holds every full slot
    off the free list (so no running request's allocation is needed to account them)."""
    options: dict[str, Any] = {**SCENARIOS["clean-canary"].spec, "req_rows": True}
    spec = replace(SIZES["tiny"], **options, tree_locks=True)
    state = build_dump(spec, seed=0)
    state.tensors["tree_full_slots"] = np.asarray(state.tensors["held_full_slots"], np.int64)
    rows = int(state.tensors["req_to_token"].shape[0])
    state.tensors["req_pool_allocated_lens"] = np.zeros(rows, dtype=np.int64)
    state.tensors["host_free_slots"] = np.arange(4, 8, dtype=np.int64)  # HiCache's host pool
    state.tensors["tree_host_slots"] = np.arange(4, dtype=np.int64)
    state.metadata["num_host_slots"] = "8"
    state.metadata["host_slots_accounted"] = "1"  # the capture vouched: nothing in flight
    return state


def _report(
    tmp_path: Path, *, drop: tuple[str, ...] = (), unset: tuple[str, ...] = ()
) -> DumpReport:
    state = _whole()
    for name in [t for t in state.tensors if t in drop or t.split(".")[0] in drop]:
        del state.tensors[name]
    for key in unset:
        del state.metadata[key]
    return checked(load_dump(state.save(tmp_path / "d.safetensors")), kernel="none")


def _not_run(report: DumpReport) -> dict[str, tuple[str, ...]]:
    return {c.check: c.missing for c in report.coverage if c.status == "not-run"}


def test_a_dump_with_every_record_runs_every_check(tmp_path: Path) -> None:
    report = _report(tmp_path)
    assert report.findings == ()
    status = {c.check: c.status for c in report.coverage}
    assert status == dict.fromkeys(EVERY, "ran") | dict.fromkeys(OTHER_LAYOUTS, "not-applicable")
    assert [c.check for c in report.coverage] == [f.name for f in CHECKS]


#: record(s) dropped -> {family that no longer runs: what it says it needs}
MISSING = {
    "free_full_slots": {
        "full free list": ("free_full_slots",),
        "full pool leaks": ("free_full_slots",),
    },
    "free_swa_slots": {
        "SWA free list": ("free_swa_slots",),
        "SWA pool leaks": ("free_swa_slots",),
    },
    "full_to_swa_index_mapping": {
        "SWA LUT": ("full_to_swa_index_mapping",),
        "SWA pool leaks": ("full_to_swa_index_mapping",),
    },
    "out_cache_loc,input_ids,positions": {"step writes": ("out_cache_loc",)},
    "tree_full_slots": {"full pool leaks": ("tree_full_slots",)},
    "req_pool_allocated_lens": {"full pool leaks": ("req_pool_allocated_lens",)},
    "free_req_rows,running_req_rows": {
        "request rows": ("free_req_rows or running_req_rows",),
        "tree locks": ("running_req_rows",),
    },
    "tree_locked_full_slots": {"tree locks": ("tree_locked_full_slots",)},
    "canary": {"canary replay": ("canary buffers",)},
    "num_swa_slots": {"SWA pool leaks": ("num_swa_slots",)},
    "host_free_slots": {
        "HiCache host free list": ("host_free_slots",),
        "HiCache host slots": ("host_free_slots",),
        "HiCache host slot leaks": ("host_free_slots",),
    },
    "tree_host_slots": {
        "HiCache host slots": ("tree_host_slots",),
        "HiCache host slot leaks": ("tree_host_slots",),
    },
}


@pytest.mark.parametrize("dropped", sorted(MISSING))
def test_each_missing_record_is_its_coverage_line(dropped: str, tmp_path: Path) -> None:
    names = tuple(dropped.split(","))
    scalar = dropped == "num_swa_slots"
    report = _report(tmp_path, drop=() if scalar else names, unset=names if scalar else ())
    assert report.findings == (), dropped  # a missing record is said, never a finding
    assert _not_run(report) == MISSING[dropped]
    assert {c.check for c in report.coverage if c.status == "ran"} == EVERY - set(MISSING[dropped])


def _views(report: DumpReport) -> dict[str, str]:
    whole = CheckReport(dumps=(report,))
    console = Console(file=io.StringIO(), width=200, color_system=None, record=True)
    console.print(render(whole, OutputFormat.TABLE))
    markdown = render(whole, OutputFormat.MARKDOWN)
    record = json.loads(str(render(whole, OutputFormat.JSON)))
    assert isinstance(markdown, str)
    return {
        "table": console.export_text(),
        "markdown": markdown,
        "json": json.dumps(record["dumps"][0]["coverage"]),
    }


def test_a_hybrid_swa_dump_without_its_lut_says_no_swa_check_ran(tmp_path: Path) -> None:
    """The issue's dump: labelled hybrid-SWA (an SWA window, an SWA pool and free list), no
    LUT; it reads clean, and every view says the SWA checks did not run and why."""
    report = _report(tmp_path, drop=("full_to_swa_index_mapping",))
    assert report.verdict == "clean"
    for view, text in _views(report).items():
        flat = " ".join(text.split())
        assert "SWA LUT" in flat and "full_to_swa_index_mapping" in flat, view
        if view != "json":
            said = re.search(r"not run: SWA LUT[^(;]* \(needs full_to_swa_index_mapping\)", flat)
            assert said, view
            assert "no findings in the checks that ran" in flat.lower(), view


def test_a_dump_with_everything_says_so_in_every_view(tmp_path: Path) -> None:
    report = _report(tmp_path)
    for view, text in _views(report).items():
        flat = " ".join(text.split())
        assert "not run" not in flat and "not-run" not in flat, view
        if view != "json":
            ran = ", ".join(f.name for f in CHECKS if f.name in EVERY)
            assert "checks run: " + ran in flat, view


def test_swa_checks_do_not_apply_to_a_dump_without_swa(tmp_path: Path) -> None:
    state = make_scenario("clean-decode", seed=0)
    report = checked(load_dump(state.save(tmp_path / "d.safetensors")), kernel="none")
    swa = {"SWA LUT", "SWA free list", "SWA pool leaks"}
    not_applicable = {c.check for c in report.coverage if c.status == "not-applicable"}
    assert not_applicable == swa | OTHER_LAYOUTS | HICACHE  # no host pool recorded either
    table = _views(report)["table"]
    assert not any(name in table for name in swa)  # not a gap: there is no SWA pool


def test_group_full_says_the_swa_group_was_not_checked(tmp_path: Path) -> None:
    state = make_scenario("swa-slot-collision", seed=0)
    dump = load_dump(state.save(tmp_path / "d.safetensors"))
    from kvcanary_cli.analysis.check import run_check
    from tests.helpers import VECTORIZED

    report = run_check(dump, planner=VECTORIZED, kernel=None, groups=["full"])
    [lut] = [c for c in report.coverage if c.check == "SWA LUT"]
    assert lut.status == "not-run" and lut.reason is not None and "--group" in lut.reason
    assert not any(f.code == "swa-slot-collision" for f in report.findings)


def test_what_runs_is_what_coverage_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One declaration decides both: a record the declarations cannot see stops its checks
    and shows in the coverage, though the dump holds it."""
    state = make_scenario("swa-slot-collision", seed=0)
    dump = load_dump(state.save(tmp_path / "d.safetensors"))
    assert any(f.code == "swa-slot-collision" for f in checked(dump, kernel="none").findings)
    has = coverage_module._has
    monkeypatch.setattr(
        coverage_module,
        "_has",
        lambda d, name: name != "full_to_swa_index_mapping" and has(d, name),
    )
    report = checked(dump, kernel="none")
    assert not any(f.group == "swa" for f in report.findings)
    assert _not_run(report)["SWA LUT"] == ("full_to_swa_index_mapping",)


@pytest.mark.parametrize("name", ["stale-swa-mapping", "swa-page-leak"])
def test_a_fix_gives_page_size_advice_only_where_pages_hold_several_slots(
    name: str, tmp_path: Path
) -> None:
    """A page-size-1 dump's fix says nothing about page_size > 1 (it contradicted the dump);
    a paged dump's still does."""
    for page_size in (1, 4):
        state = make_scenario(name, seed=0, page_size=page_size)
        report = checked(load_dump(state.save(tmp_path / "d.safetensors")), kernel="none")
        [cause] = [c for c in report.diagnosis if c.code == SCENARIOS[name].cause]
        assert ("page_size > 1" in cause.fix) is (page_size > 1), (page_size, cause.fix)
