"""The hybrid Mamba layout's checks (analysis/mamba.py) on small hand-made dumps: a correct
state checks clean (its waiting request's copy-on-write slot included), and each fault of the
Mamba slots (free and held, held twice, freed twice, slot 0 handed out, a row mapped to another
slot, a leak) is named with its cause, each beside its clean twin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcanary_cli.api import check
from kvcanary_cli.dump.writer import dump_contents, write_dump

#: Mamba slots 1..SIZE (slot 0 reserved); rows 1 and 2 run, the tree holds 3 and 4, a waiting
#: request holds 5 (its copy-on-write slot), 6..8 are free
SIZE = 8


def _state() -> dict[str, Any]:
    table = np.zeros((4, 8), dtype=np.int32)
    table[1, :3] = [1, 2, 3]
    table[2, :2] = [4, 5]
    row_map = np.zeros(4, dtype=np.int64)
    row_map[1], row_map[2] = 1, 2
    return {
        "req_to_token": table,
        "req_pool_indices": np.array([1, 2]),
        "prefix_lens": np.array([2, 1]),
        "extend_seq_lens": np.array([1, 1]),
        "free_full_slots": np.arange(6, 16),
        "tree_full_slots": np.zeros(0, dtype=np.int64),
        "req_pool_allocated_lens": np.array([0, 3, 2, 0]),
        "req_index_to_mamba_index_mapping": row_map,
        "free_mamba_slots": np.array([6, 7, 8]),
        "tree_mamba_slots": np.array([3, 4]),
        "req_mamba_slots": np.array([1, 2, 5]),
        "req_mamba_rows": np.array([1, 2, -1]),
    }


def _check(tmp_path: Path, state: dict[str, Any]) -> Any:
    metadata = {
        "layout": "hybrid-mamba",
        "num_full_slots": 16,
        "num_mamba_slots": SIZE + 1,
        "page_size": 1,
    }
    path = write_dump(tmp_path / "m.safetensors", dump_contents(metadata, state))
    return check([path], kernel="none").dumps[0]


def _errors(report: Any) -> list[str]:
    return [f.code.value for f in report.findings if f.severity.value == "error"]


def test_correct_state_is_clean(tmp_path: Path) -> None:
    report = _check(tmp_path, _state())
    assert report.error is None
    assert _errors(report) == []
    status = {c.check: c.status for c in report.coverage}
    assert status["Mamba slots"] == status["Mamba slot leaks"] == "ran"
    assert status["page tables"] == status["SWA LUT"] == "not-applicable"


def _planted(name: str) -> dict[str, Any]:
    state = _state()
    if name == "free-and-held":  # a tree node's slot pushed onto the free list
        state["free_mamba_slots"] = np.array([6, 7, 8, 4])
    elif name == "owned-twice":  # the tree's slot handed to the waiting request as well
        state["req_mamba_slots"] = np.array([1, 2, 4])
        state["free_mamba_slots"] = np.array([5, 6, 7, 8])
    elif name == "freed-twice":
        state["free_mamba_slots"] = np.array([6, 7, 8, 7])
    elif name == "reserved":  # slot 0 freed (a padding row's map entry)
        state["free_mamba_slots"] = np.array([0, 6, 7, 8])
    elif name == "row-map":  # row 2 maps to the tree's slot, its request holds 2
        state["req_index_to_mamba_index_mapping"][2] = 4
    elif name == "beyond":  # a slot id past the pool (9 of 0..8) freed, and held by a node
        state["free_mamba_slots"] = np.array([6, 7, 8, 9])
        state["tree_mamba_slots"] = np.array([3, 4, 12])
    elif name == "leaked":  # the waiting request dropped without freeing its slot
        state["req_mamba_slots"] = np.array([1, 2])
        state["req_mamba_rows"] = np.array([1, 2])
    return state


#: Each planted Mamba-layout fault, the finding it must give and its cause; the catalog's
#: coverage test (test_findings) counts these codes as planted.
MAMBA_FAULTS = (
    ("free-and-held", "mamba-slot-free-and-held", "mamba-slot-freed-while-held"),
    ("owned-twice", "mamba-slot-owned-twice", "mamba-slot-double-free"),
    ("freed-twice", "mamba-slot-freed-twice", "mamba-slot-double-free"),
    ("reserved", "mamba-reserved-slot-in-use", "mamba-reserved-slot-handed-out"),
    ("row-map", "mamba-row-map-mismatch", "mamba-row-map-stale"),
    ("leaked", "mamba-slot-leaked", "mamba-slot-leak"),
    ("beyond", "mamba-slot-beyond-pool", "mamba-slot-id-corrupt"),
)


@pytest.mark.parametrize(("fault", "code", "cause"), MAMBA_FAULTS)
def test_each_fault_is_named(tmp_path: Path, fault: str, code: str, cause: str) -> None:
    report = _check(tmp_path, _planted(fault))
    assert _errors(report) == [code]
    assert report.diagnosis[0].code.value == cause, report.diagnosis


def test_slots_beyond_the_pool_are_named_where_they_are(tmp_path: Path) -> None:
    """Each id past the pool is named once, with the place it was found, and no other check
    counts it (not a free-and-held slot, not a leak)."""
    [finding] = _check(tmp_path, _planted("beyond")).findings
    assert finding.details["mamba_slots"] == [9, 12]
    assert "the Mamba free list" in finding.message and "the tree" in finding.message
    assert "0..8" in finding.message


def test_requests_unknown_no_leak_is_said(tmp_path: Path) -> None:
    """A capture that did not know every live request (a guard trigger) records no request
    slots: the tree's and the free list's slots are still checked, no slot is called leaked,
    and the coverage says why."""
    state = _planted("free-and-held")
    del state["req_mamba_slots"], state["req_mamba_rows"]
    report = _check(tmp_path, state)
    assert _errors(report) == ["mamba-slot-free-and-held"]
    [leaks] = [c for c in report.coverage if c.check == "Mamba slot leaks"]
    assert leaks.status == "not-run" and "req_mamba_slots" in leaks.missing


def test_a_pool_size_no_list_could_describe_leaves_the_leak_check_out(tmp_path: Path) -> None:
    """A corrupt `num_mamba_slots` (2^44 beside a few slots listed) would cost a bit per slot:
    the leak check does not run and says why, and the slot checks still run."""
    metadata = {
        "layout": "hybrid-mamba",
        "num_full_slots": 16,
        "num_mamba_slots": 1 << 44,
        "page_size": 1,
    }
    state = _planted("free-and-held")
    path = write_dump(tmp_path / "m.safetensors", dump_contents(metadata, state))
    report: Any = check([path], kernel="none").dumps[0]
    assert _errors(report) == ["mamba-slot-free-and-held"]
    [leaks] = [c for c in report.coverage if c.check == "Mamba slot leaks"]
    assert leaks.status == "not-run"
    assert f"num_mamba_slots {1 << 44} is not a pool" in (leaks.reason or "")


def _extra_buffer_state() -> dict[str, Any]:
    """`_state` with SGLang's extra buffer: row 1 tracks in slots 6 and 7, row 2 in 8 (its
    second entry empty, -1); the free list is empty. Row 3 is free, its map row stale."""
    state = _state()
    track = np.full((4, 2), -1, dtype=np.int64)
    track[1], track[2, 0], track[3] = [6, 7], 8, [3, 4]  # row 3: a finished request's, stale
    state["req_index_to_mamba_ping_pong_track_buffer_mapping"] = track
    state["free_mamba_slots"] = np.zeros(0, dtype=np.int64)
    state["req_mamba_slots"] = np.array([1, 6, 7, 2, 8, 5])
    state["req_mamba_rows"] = np.array([1, -2, -2, 2, -2, -1])
    return state


def test_extra_buffer_track_slots_check_clean(tmp_path: Path) -> None:
    """A correct extra-buffer state: each live row's ping-pong map names its request's track
    slots (in either order, an empty entry -1), a free row's stale map row is not read."""
    state = _extra_buffer_state()
    state["req_index_to_mamba_ping_pong_track_buffer_mapping"][1] = [7, 6]
    report = _check(tmp_path, state)
    assert report.error is None and _errors(report) == []


def test_a_stale_track_map_entry_is_named(tmp_path: Path) -> None:
    """Row 1's ping-pong map still names slot 3, which its request gave the tree (a donation
    that replaced the slot in the request but not in the map): the forward would write its
    tracked state into the tree's checkpoint. The row's working slot map is right, so before
    the ping-pong map was read this dump checked clean."""
    state = _extra_buffer_state()
    state["req_index_to_mamba_ping_pong_track_buffer_mapping"][1] = [6, 3]
    report = _check(tmp_path, state)
    assert _errors(report) == ["mamba-row-map-mismatch"]
    finding = report.findings[0]
    assert finding.pool_row == 1
    assert finding.details["mapped_track"] == [6, 3] and finding.details["held_track"] == [6, 7]
    assert report.diagnosis[0].code.value == "mamba-row-map-stale"
