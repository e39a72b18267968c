"""The unified-memory layout's checks (analysis/unified.py) on small hand-made dumps: a correct
state checks clean, and each fault of the page tables (a free page still bound, a held page
unbound, a virtual page bound to two physical pages, a physical page behind two virtual
pages, a leak, a table sized by the wrong id space, a compaction hole that is no free page, a
table's sentinel overwritten) is named, each beside its clean twin (the correct state, which
keeps a free physical page on each side's holes). A dump whose layout kvcanary does not know
gets one note and no finding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcanary_cli.api import check
from kvcanary_cli.capture.tree import _lut_of
from kvcanary_cli.dump.writer import dump_contents, write_dump
from kvcanary_cli.render.phrases.check import coverage_lines

#: virtual pages (and physical pages per side), page size 1: row 1 holds virtual 1, 2, 3
PAGES = 8


def _state() -> dict[str, Any]:
    full_v2p = np.full(PAGES + 1, -1, dtype=np.int64)
    full_p2v = np.full(PAGES + 1, -1, dtype=np.int64)
    swa_v2p = np.full(PAGES + 1, -1, dtype=np.int64)
    swa_p2v = np.full(PAGES + 1, -1, dtype=np.int64)
    full_v2p[0] = full_p2v[0] = swa_v2p[0] = swa_p2v[0] = 0
    for v, p in ((1, 7), (2, 6), (3, 5)):  # the full side grows down, the SWA side up
        full_v2p[v], full_p2v[p] = p, v
        swa_v2p[v], swa_p2v[v] = v, v
    table = np.zeros((2, 8), dtype=np.int32)
    table[1, :3] = [1, 2, 3]
    return {
        "req_to_token": table,
        "req_pool_indices": np.array([1]),
        "prefix_lens": np.array([2]),
        "extend_seq_lens": np.array([1]),
        "out_cache_loc": np.array([3]),
        "free_full_slots": np.array([4, 5, 6, 7]),
        "tree_full_slots": np.zeros(0, dtype=np.int64),
        "req_pool_allocated_lens": np.array([0, 3]),
        "full_virtual_to_physical": full_v2p,
        "full_physical_to_virtual": full_p2v,
        "swa_virtual_to_physical": swa_v2p,
        "swa_physical_to_virtual": swa_p2v,
        # lazy compaction's free physical pages, bound on neither side
        "full_physical_holes": np.array([3]),
        "swa_physical_holes": np.array([4]),
    }


def _check(tmp_path: Path, state: dict[str, Any], layout: str = "unified-swa") -> Any:
    tensors = dict(state)
    tensors.setdefault("full_to_swa_index_mapping", _lut_of(_state()["swa_virtual_to_physical"], 1))
    metadata = {"layout": layout, "num_full_slots": PAGES, "page_size": 1, "swa_window_size": 16}
    path = write_dump(tmp_path / "u.safetensors", dump_contents(metadata, tensors))
    return check([path], kernel="none").dumps[0]


def _errors(report: Any) -> list[str]:
    return [f.code.value for f in report.findings if f.severity.value == "error"]


def test_correct_state_is_clean(tmp_path: Path) -> None:
    report = _check(tmp_path, _state())
    assert report.error is None
    assert _errors(report) == []
    assert not any("not checked" in note for note in report.notes), report.notes
    status = {c.check: c.status for c in report.coverage}
    assert status["page tables"] == "ran"  # and the paged layout's SWA free list is not a gap
    assert status["SWA free list"] == status["SWA pool leaks"] == "not-applicable"


def _planted(name: str) -> dict[str, Any]:
    state = _state()
    full_v2p, full_p2v = state["full_virtual_to_physical"], state["full_physical_to_virtual"]
    if name == "free-and-bound":  # the tree's page pushed onto the free list, still bound
        state["tree_full_slots"] = np.array([3])
        state["req_pool_allocated_lens"] = np.array([0, 2])
        state["free_full_slots"] = np.array([3, 4, 5, 6, 7])
    elif name == "unbound":  # a held page unbound under its holder
        full_v2p[3], full_p2v[5] = -1, -1
        state["free_full_slots"] = np.array([4, 5, 6, 7])
    elif name == "two-physical":  # virtual page 2 also claimed by physical page 4
        full_p2v[4] = 2
    elif name == "shared-physical":  # virtual 3 rebound onto virtual 2's physical page
        full_v2p[3] = 6
        full_p2v[5] = -1
    elif name == "leaked":  # page 7 neither free nor held
        state["free_full_slots"] = np.array([4, 5, 6])
    elif name == "table-size":  # the SWA table sized by its own pool (SGLang #37560)
        state["swa_virtual_to_physical"] = state["swa_virtual_to_physical"][:6].copy()
        state["swa_virtual_to_physical"][-1] = -1
    elif name == "tombstone-freed-again":  # a tombstoned SWA page's -1 freed as a page
        state["swa_physical_holes"] = np.array([-1, 4])
    elif name == "hole-bound":  # SWA physical page 3 freed while virtual page 3 keeps it
        state["swa_physical_holes"] = np.array([3, 4])
    elif name == "hole-twice":  # full physical page 3 freed twice
        state["full_physical_holes"] = np.array([3, 3])
    elif name == "sentinel-bound":  # that -1 then bound: virtual page 3 to physical page -1
        swa_v2p, swa_p2v = state["swa_virtual_to_physical"], state["swa_physical_to_virtual"]
        swa_v2p[3], swa_p2v[3], swa_p2v[-1] = -1, -1, 3
        state["swa_physical_holes"] = np.array([3, 4])
        state["full_to_swa_index_mapping"] = _lut_of(swa_v2p, 1)
    return state


#: Each planted unified-layout fault, the finding it must give and its cause (the synth
#: `unified-*` scenarios plant them in whole states, tests/analysis/test_unified_synth.py).
UNIFIED_FAULTS = (
    ("free-and-bound", "virtual-page-free-and-bound", "virtual-page-freed-while-bound"),
    ("unbound", "virtual-page-unbound", "page-table-corrupt"),
    ("two-physical", "page-table-mismatch", "page-table-corrupt"),
    ("shared-physical", "physical-page-shared", "page-table-corrupt"),
    ("leaked", "full-page-leaked", "full-leak"),
    ("table-size", "page-table-size-mismatch", "page-table-corrupt"),
    ("tombstone-freed-again", "physical-hole-invalid", "physical-page-double-free"),
    ("hole-bound", "physical-hole-invalid", "physical-page-double-free"),
    ("hole-twice", "physical-hole-invalid", "physical-page-double-free"),
    ("sentinel-bound", "page-table-sentinel-overwritten", "physical-page-double-free"),
)


@pytest.mark.parametrize(("fault", "code", "cause"), UNIFIED_FAULTS)
def test_each_fault_is_named(tmp_path: Path, fault: str, code: str, cause: str) -> None:
    report = _check(tmp_path, _planted(fault))
    assert code in _errors(report), _errors(report)
    assert cause in [c.code.value for c in report.diagnosis], report.diagnosis


def test_unsupported_layout_gets_one_note_and_no_finding(tmp_path: Path) -> None:
    """A layout kvcanary does not know: its pool size (here far too small for the table's
    ids) and free lists are not read, so nothing is flagged, and one note says what was not
    checked."""
    state = _planted("free-and-bound")
    report = _check(tmp_path, state, layout="future-layout")
    assert report.error is None
    assert report.findings == ()
    said = [note for note in report.notes if "layout" in note]
    assert len(said) == 1 and "'future-layout'" in said[0] and "not checked" in said[0]
    assert not any("not checked without" in note for note in report.notes)
    unread = {c.check for c in report.coverage if c.reason and "'future-layout'" in c.reason}
    assert {"full free list", "SWA LUT", "full pool leaks", "tree locks"} <= unread
    assert "step writes" not in unread  # the batch is read whatever the layout
    [line] = [ln for ln in coverage_lines(report) if ln.startswith("not run: ")]
    assert line.count("'future-layout'") == 1  # the families it stopped, said together


def test_paged_dump_without_layout_reads_as_before(tmp_path: Path) -> None:
    """No `layout` key: the paged layout, its checks as today (a slot past the recorded pool)."""
    state = _state()
    for name in list(state):
        if "virtual" in name or "physical" in name:
            del state[name]
    tensors = {**state, "free_full_slots": np.array([4])}
    metadata = {"num_full_slots": 3, "page_size": 1}
    path = write_dump(tmp_path / "p.safetensors", dump_contents(metadata, tensors))
    report = check([path], kernel="none").dumps[0]
    assert "slot-beyond-pool" in _errors(report)


def test_a_mismatch_the_shared_page_leaves_follows_the_sharing(tmp_path: Path) -> None:
    """A physical page behind two virtual pages is named back by one of them at most: the
    other's mismatch is what the sharing left, so the cause's counts, evidence and headline
    start at the sharing. A mismatch of a page bound to a physical page of its own is no such
    side effect and keeps the report's order (the codes table: mismatch first)."""
    report = _check(tmp_path, _planted("shared-physical"))
    [cause] = report.diagnosis
    assert [c.value for c in cause.explains] == ["physical-page-shared", "page-table-mismatch"]
    assert "share physical page 6" in cause.evidence[0] and "share" in (cause.headline or "")
    state = _planted("shared-physical")
    state["full_physical_to_virtual"][7] = -1  # virtual 1's page no longer named back
    [cause] = _check(tmp_path, state).diagnosis
    assert [c.value for c in cause.explains] == ["page-table-mismatch", "physical-page-shared"]
    assert "do not name each other" in cause.evidence[0], cause.evidence
