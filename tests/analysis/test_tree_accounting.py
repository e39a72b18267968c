"""SWA leak accounting from the tree's own record (`tree_full_slots`, `tree_swa_resident_slots`,
`req_pool_allocated_lens`): a page mapped only from a tombstoned tree slot is leaked (SGLang's
check counts only the tree's SWA-resident part), its twin with the slot SWA-resident is clean,
and the same states without the tree record are accounted as before (from the free lists).

A hand-made pool of 8 full and 8 SWA slots (page size 1): one running request on row 1 holds
full slots 1, 2 (its cached prefix: the tree holds them too); the tree also holds slot 3
(SWA-resident, mapped to SWA slot 3) and slot 4 (tombstoned).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvcanary_cli.analysis.bookkeeping import leaked_swa_pages
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.dump.writer import dump_contents, write_dump


def _state(
    *, tombstone_mapped: bool, resident: list[int], tree: bool = True
) -> dict[str, np.ndarray]:
    table = np.zeros((3, 8), dtype=np.int32)
    table[1, :2] = [1, 2]
    lut = np.zeros(10, dtype=np.int64)
    lut[-1] = -1
    lut[[1, 2, 3]] = [1, 2, 3]
    free_swa = [4, 5, 6, 7, 8]
    if tombstone_mapped:  # the tombstone kept its mapping and its SWA page never went back
        lut[4] = 4
        free_swa = [5, 6, 7, 8]
    tensors: dict[str, np.ndarray] = {
        "req_to_token": table,
        "req_pool_indices": np.array([1], dtype=np.int64),
        "prefix_lens": np.array([1], dtype=np.int64),
        "extend_seq_lens": np.array([1], dtype=np.int64),
        "out_cache_loc": np.array([2], dtype=np.int64),
        "full_to_swa_index_mapping": lut,
        "free_full_slots": np.array([5, 6, 7, 8], dtype=np.int64),
        "free_swa_slots": np.array(free_swa, dtype=np.int64),
    }
    if tree:
        tensors["tree_full_slots"] = np.array([1, 2, 3, 4], dtype=np.int64)
        tensors["tree_swa_resident_slots"] = np.array(resident, dtype=np.int64)
        tensors["req_pool_allocated_lens"] = np.array([0, 2, 0], dtype=np.int64)
    return tensors


def _leaked(tmp_path: Path, tensors: dict[str, np.ndarray], name: str) -> list[int]:
    metadata = {"swa_window_size": "4", "num_full_slots": "9", "num_swa_slots": "9"}
    path = write_dump(tmp_path / f"{name}.safetensors", dump_contents(metadata, tensors))
    leaked, reason = leaked_swa_pages(load_dump(path))
    assert reason is None and leaked is not None
    return [int(p) for p in leaked]


def test_page_mapped_only_from_a_tombstone_is_leaked(tmp_path: Path) -> None:
    assert _leaked(tmp_path, _state(tombstone_mapped=True, resident=[1, 2, 3]), "bad") == [4]


def test_twin_with_the_slot_swa_resident_is_clean(tmp_path: Path) -> None:
    assert _leaked(tmp_path, _state(tombstone_mapped=True, resident=[1, 2, 3, 4]), "twin") == []
    assert _leaked(tmp_path, _state(tombstone_mapped=False, resident=[1, 2, 3]), "clean") == []


def test_running_rows_hold_their_slots_without_the_tree_listing_them(tmp_path: Path) -> None:
    """The running row's slots count as held even when the tree does not hold them, and
    without `free_full_slots` the held set comes from the tree and the rows alone."""
    tensors = _state(tombstone_mapped=False, resident=[3])
    tensors["tree_full_slots"] = np.array([3, 4], dtype=np.int64)
    del tensors["free_full_slots"]
    assert _leaked(tmp_path, tensors, "rows") == []
    tensors["req_pool_allocated_lens"] = np.array([0, 0, 0], dtype=np.int64)  # rows forgotten
    assert _leaked(tmp_path, tensors, "forgotten") == [1, 2]


def test_without_the_tree_record_accounting_is_as_before(tmp_path: Path) -> None:
    """No tree record: every full slot off the free list counts as held, so the tombstone's
    page reads as held (the gap the record closes), and a clean state stays clean."""
    bad = _state(tombstone_mapped=True, resident=[], tree=False)
    assert _leaked(tmp_path, bad, "old-bad") == []
    assert _leaked(tmp_path, _state(tombstone_mapped=False, resident=[], tree=False), "old") == []
