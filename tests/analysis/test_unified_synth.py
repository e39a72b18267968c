"""The synthetic unified-memory state (`SynthSpec.unified`, the `clean-unified` scenario and
its `unified-*` faults): it holds what a correct unified state holds, and each fault's finding
names the page the scenario broke. Tiny dumps; every scenario's codes and first cause are
checked with the others' (test_findings, tests/cli/test_check_cli.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvcanary_cli.api import check
from kvcanary_cli.catalog import CauseCode
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.synth.scenarios import SCENARIOS, make_scenario
from kvcanary_cli.synth.state import SynthDump
from tests.helpers import checked

UNIFIED = [name for name in SCENARIOS if "unified" in name]


def _tables(d: SynthDump, side: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = d.tensors
    return (
        t[f"{side}_virtual_to_physical"],
        t[f"{side}_physical_to_virtual"],
        t[f"{side}_physical_holes"],
    )


def _bound(v2p: np.ndarray) -> np.ndarray:
    """The virtual pages a side binds (page 0, the padding sink, aside)."""
    return np.flatnonzero(v2p[1:-1] >= 0) + 1


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_the_clean_state_holds_what_a_unified_state_holds(page_size: int) -> None:
    for seed in range(8):  # holes are drawn: several states, a few milliseconds each
        _holds_a_unified_state(make_scenario("clean-unified", seed=seed, page_size=page_size))
        # SWA pages of twice the bytes: the SWA side counts half the physical pages
        twin = make_scenario(
            "unified-swa-table-sized-by-its-pool", seed=seed, page_size=page_size, corrupt=False
        )
        assert twin.spec.swa_page_scale == 2
        _holds_a_unified_state(twin)


def _holds_a_unified_state(d: SynthDump) -> None:
    page_size, scale = d.spec.page_size, d.spec.swa_page_scale
    p, t = page_size, d.tensors
    pages = int(d.metadata["num_full_slots"]) // p
    assert d.metadata["layout"] == "unified-swa" and "free_swa_slots" not in t
    spans = {}
    for side in ("full", "swa"):
        v2p, p2v, holes = _tables(d, side)
        physical_pages = pages if side == "full" else pages // scale
        assert v2p.size == pages + 1 and p2v.size == physical_pages + 1
        assert v2p[0] == p2v[0] == 0 and v2p[-1] == p2v[-1] == -1
        bound = _bound(v2p)
        assert np.array_equal(p2v[v2p[bound]], bound)  # the tables name each other
        assert np.unique(v2p[bound]).size == bound.size  # no physical page behind two
        assert np.array_equal(np.sort(_bound(p2v)), np.sort(v2p[bound]))
        # holes: free pages of the side, once each, inside its span: from the buffer's end
        # (the full side's top page, the SWA side's page 1) to its growing edge, always live
        assert holes.size and np.all(np.diff(holes) > 0) and np.all(p2v[holes] == -1)
        live = v2p[bound]
        low, high = (int(live.min()), pages - 1) if side == "full" else (1, int(live.max()))
        assert low <= holes.min() and holes.max() <= high and low < high
        assert live.size + holes.size == high - low + 1 == np.union1d(live, holes).size
        spans[side] = (low, high)
    # the sides never share bytes: the SWA span ends (in full pages) below the full one
    assert (spans["swa"][1] + 1) * scale <= spans["full"][0]
    full_v2p, swa_v2p = t["full_virtual_to_physical"], t["swa_virtual_to_physical"]
    # the SWA side binds only pages the full side holds; the LUT is its table, slot by slot
    assert np.all(full_v2p[_bound(swa_v2p)] > 0)
    lut = t["full_to_swa_index_mapping"]
    slots = np.arange(pages * p)
    physical = swa_v2p[slots // p]
    want = np.where(physical > 0, physical * p + slots % p, 0)
    assert lut.size == pages * p + 1 and lut[-1] == -1 and np.array_equal(lut[:-1], want)
    # the virtual free list: unbound ids; the tree and the running rows: bound ones
    free = np.unique(t["free_full_slots"] // p)
    assert np.all(full_v2p[free] == -1)
    held = np.union1d(free, np.unique(t["tree_full_slots"] // p))
    assert np.array_equal(np.union1d(held, _bound(full_v2p)), np.arange(1, pages))
    cached = np.setdiff1d(np.unique(t["tree_full_slots"] // p), _bound(swa_v2p))
    assert cached.size  # the tree caches finished requests' pages, their SWA side tombstoned


def test_the_unified_state_is_off_unless_asked_for() -> None:
    """`clean-swa` keeps the paged SWA pools: no layout, an SWA free list, no page tables."""
    d = make_scenario("clean-swa")
    assert "layout" not in d.metadata and "free_swa_slots" in d.tensors
    assert not any("virtual" in name for name in d.tensors)


def _report(tmp_path: Path, name: str, seed: int) -> tuple[dict[str, int], dict[str, object]]:
    d = make_scenario(name, seed=seed)
    report = check([d.save(tmp_path / f"{name}.safetensors")], kernel="none").dumps[0]
    return d.truth, {f.code.value: f for f in report.findings}


@pytest.mark.parametrize("seed", [0, 1])
def test_each_fault_names_the_page_it_broke(tmp_path: Path, seed: int) -> None:
    truth, found = _report(tmp_path, "unified-tombstone-freed-again", seed)
    assert found["physical-hole-invalid"].details["out_of_range"] == [-1]  # type: ignore[attr-defined]
    truth, found = _report(tmp_path, "unified-hole-freed-twice", seed)
    hole = found["physical-hole-invalid"]
    assert hole.details["listed_twice"] == [truth["physical_page"]]  # type: ignore[attr-defined]
    truth, found = _report(tmp_path, "unified-hole-still-bound", seed)
    assert found["physical-hole-invalid"].details["bound"] == [truth["physical_page"]]  # type: ignore[attr-defined]
    for name, code in (
        ("unified-tombstone-bound", "page-table-sentinel-overwritten"),
        ("unified-virtual-freed-while-bound", "virtual-page-free-and-bound"),
        ("unified-rebind-lost", "page-table-mismatch"),
        ("unified-physical-bound-twice", "physical-page-shared"),
        ("unified-unbound-under-holder", "virtual-page-unbound"),
    ):
        truth, found = _report(tmp_path, name, seed)
        slots = found[code].cells.slot.tolist()  # type: ignore[attr-defined]
        assert truth["slot"] in slots, (name, truth, slots)
    assert slots == [truth["slot"]]  # the one page unbound, no other
    truth, found = _report(tmp_path, "unified-physical-bound-twice", seed)
    owners = found["physical-page-shared"].cells.slot.tolist()  # type: ignore[attr-defined]
    assert sorted(owners) == sorted([truth["slot"], truth["owner_slot"]])
    truth, found = _report(tmp_path, "unified-swa-table-sized-by-its-pool", seed)
    assert found["page-table-size-mismatch"].details == {  # type: ignore[attr-defined]
        "tensor": "swa_virtual_to_physical",
        "virtual_pages": truth["virtual_pages"],
        "full_virtual_pages": truth["full_virtual_pages"],
    }
    assert truth["virtual_pages"] * 2 <= truth["full_virtual_pages"]  # half the ids, or fewer


FAULTS = [name for name in UNIFIED if SCENARIOS[name].expected]


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_each_fault_ranks_its_cause_first_and_leads_with_its_finding(
    tmp_path: Path, page_size: int
) -> None:
    """The planted cause comes first, and its story starts at the finding that names the
    fault (the scenario's first expected code), not at a side effect it left (the mismatch a
    physical page bound twice leaves: `physical_to_virtual` names one of its pages): its
    headline, first evidence line, first count and next command are that finding's."""
    for name in FAULTS:
        scenario = SCENARIOS[name]
        for seed in range(3):
            d = make_scenario(name, seed=seed, page_size=page_size)
            report = checked(load_dump(d.save(tmp_path / f"{name}.safetensors")), kernel="none")
            first = report.diagnosis[0]
            where = (name, seed, [(c.code.value, c.headline) for c in report.diagnosis])
            assert first.code.value == scenario.cause, where
            [lead] = [f for f in report.findings if f.code.value == scenario.expected[0]]
            assert lead.cause is first.code, where
            assert [c.value for c in first.explains][0] == scenario.expected[0], where
            assert (first.headline or "").startswith(lead.message), where
            assert first.evidence[0].startswith(lead.message), where
            if lead.slot is not None:
                assert first.next_command is not None, where
                assert first.next_command.endswith(f"--slot {lead.slot}"), where


def test_the_lut_is_the_short_table_only_where_it_is_as_long(tmp_path: Path) -> None:
    """Unified memory's LUT is the SWA side's virtual table read slot by slot: one as long as
    that table stands for is its side effect (nested under the table's cause); one shorter
    still was cut by something else, and stays a cause of its own."""
    d = make_scenario("unified-swa-table-sized-by-its-pool", seed=0, page_size=4)
    report = checked(load_dump(d.save(tmp_path / "d.safetensors")), kernel="none")
    causes = {c.code.value: c for c in report.diagnosis}
    assert causes["lut-too-short"].explained_by is CauseCode.PAGE_TABLE_CORRUPT
    assert "also shows as a LUT shorter than the pool" in (
        causes["page-table-corrupt"].headline or ""
    )
    lut = d.tensors["full_to_swa_index_mapping"]
    d.tensors["full_to_swa_index_mapping"] = np.r_[lut[: lut.size - 1 - 4], -1]
    report = checked(load_dump(d.save(tmp_path / "e.safetensors")), kernel="none")
    causes = {c.code.value: c for c in report.diagnosis}
    assert causes["lut-too-short"].explained_by is None, report.diagnosis
    assert causes["page-table-corrupt"].explained_by is None
