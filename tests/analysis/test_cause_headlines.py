"""Every cause that can rank first on an SGLang dump heads its report with a bug-report
sentence built from the dump (issue 45): the pages or slots, the pool rows holding them, the
step that went wrong; both mechanisms and what decides where the dump cannot tell them apart;
a clause for what its nested causes add. Each test builds the state and checks that the
headline names the dump's own pool rows and slots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcanary_cli.catalog import CauseCode
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.results.check import Cause, DumpReport
from kvcanary_cli.synth.scenarios import SCENARIOS, make_scenario
from kvcanary_cli.synth.state import SynthDump
from tests.analysis import test_hicache, test_mamba, test_unified
from tests.helpers import checked
from tests.test_row_words import bare_rows

P = 4


def _check(d: SynthDump, path: Path) -> DumpReport:
    return checked(load_dump(d.save(path)))


def _first(name: str, tmp_path: Path, page_size: int | None = P) -> tuple[SynthDump, Cause]:
    d = make_scenario(name, seed=0, page_size=page_size)
    report = _check(d, tmp_path / f"{name}.safetensors")
    return d, report.diagnosis[0]


def _pool_row(d: SynthDump, batch_row: int) -> int:
    return int(d.tensors["req_pool_indices"][batch_row])


def _holder(d: SynthDump, full_slot: int, other_than: int = -1) -> int:
    """The pool row of the batch whose req_to_token row holds `full_slot`."""
    table = d.tensors["req_to_token"]
    return next(
        int(r)
        for b, r in enumerate(d.tensors["req_pool_indices"].tolist())
        if b != other_than and r > 0 and full_slot in table[r].tolist()
    )


def _pages(first: int, size: int = P) -> str:
    return f"page {first} (slots {first * size}..{first * size + size - 1})"


def _says(headline: str | None, *parts: str) -> None:
    assert headline is not None
    missing = [p for p in parts if p not in headline]
    assert not missing, f"{missing} not in: {headline}"


#: Causes that are not SGLang bookkeeping (the batch's shape, the planner, the canary, the
#: file): their summary heads them.
_NOT_BOOKKEEPING = frozenset(
    {
        CauseCode.VERIFY_CAPACITY_OVERFLOW,
        CauseCode.KERNEL_LIMIT,
        CauseCode.NONCANONICAL_DTYPE,
        CauseCode.PLANNER_DIVERGENCE,
        CauseCode.EXPECTED_TOKEN_POOL_MISMATCH,
        CauseCode.SCALAR_METADATA_CORRUPT,
        CauseCode.KV_OVERWRITTEN,
        CauseCode.FOREIGN_CANARY_RECORD,
    }
)


@pytest.mark.parametrize("page_size", [None, P])
@pytest.mark.slow
def test_every_bookkeeping_cause_of_a_scenario_has_a_headline(
    tmp_path: Path, page_size: int | None
) -> None:
    """Every synth scenario's causes: a headline for each bookkeeping cause, spelled with
    pool row and batch row, never a bare row."""
    missing, bare = [], []
    for name in SCENARIOS:
        d = make_scenario(name, seed=0, page_size=page_size)
        for c in _check(d, tmp_path / f"{name}.safetensors").diagnosis:
            if c.code in _NOT_BOOKKEEPING or c.confidence.value == "possible":
                continue  # a possible cause is another reading of the likely one's cells
            if c.headline is None:
                missing.append(f"{name}: {c.code.value}")
            elif bare_rows(c.headline):
                bare.append(f"{name}: {c.headline}")
    assert not missing, missing
    assert not bare, bare


def test_a_sliced_lut_names_its_length_the_pool_and_the_slots_past_it(tmp_path: Path) -> None:
    d, c = _first("truncated-lut", tmp_path, None)
    lut_len = int(d.tensors["full_to_swa_index_mapping"].shape[0])
    pool = int(d.metadata["num_full_slots"])
    _says(c.headline, f"{lut_len} entries", f"full pool of {pool} slots", "sliced", "pool row ")


def test_a_lut_past_an_unrecorded_pool_names_both_readings(tmp_path: Path) -> None:
    d, c = _first("truncated-lut-unrecorded", tmp_path, None)
    lut_len = int(d.tensors["full_to_swa_index_mapping"].shape[0])
    _says(c.headline, f"{lut_len} entries", "corrupt slot indices", "record num_full_slots")


@pytest.mark.parametrize(
    ("name", "why"), [("negative-slot", "negative"), ("slot-beyond-pool", "beyond")]
)
def test_a_corrupt_slot_names_its_cell(tmp_path: Path, name: str, why: str) -> None:
    d, c = _first(name, tmp_path, None)
    row = _pool_row(d, int(d.truth["batch_row"]))
    _says(c.headline, f"batch row {d.truth['batch_row']} (pool row {row}", why)
    _says(c.headline, f"position {d.truth['position']}")


@pytest.mark.parametrize("name", ["row-out-of-range", "prefix-past-row", "negative-length"])
def test_corrupt_batch_metadata_names_the_batch_row(tmp_path: Path, name: str) -> None:
    d, c = _first(name, tmp_path, None)
    row = int(d.truth.get("pool_row", _pool_row(d, int(d.truth["batch_row"]))))
    _says(c.headline, f"batch row {d.truth['batch_row']} (pool row {row})")


def test_the_reserved_full_page_on_the_free_list(tmp_path: Path) -> None:
    _, c = _first("reserved-slot-freed", tmp_path)
    _says(c.headline, f"the reserved full {_pages(0)}", "free_full_slots", "freed")


def test_the_reserved_swa_page_freed_twice_and_its_double_free(tmp_path: Path) -> None:
    _, c = _first("reserved-swa-page-freed-twice", tmp_path)
    _says(c.headline, f"the reserved SWA {_pages(0)}", "free_swa_slots twice", "freed twice")
    assert CauseCode.DOUBLE_FREE in c.nests
    _says(c.headline, "this also shows as a double free of SWA slots 0..3")


def test_the_reserved_swa_page_handed_out_names_its_new_owner(tmp_path: Path) -> None:
    d, c = _first("reserved-swa-page-handed-out", tmp_path)
    full = int(d.truth["full_slot"])
    _says(c.headline, "the reserved SWA page 0", str(full), f"pool row {_holder(d, full)}")


def test_a_partial_page_free_names_the_page_and_its_swa_page(tmp_path: Path) -> None:
    d, c = _first("partial-page-free", tmp_path)
    full, swa = int(d.truth["slot"]) // P, int(d.truth["swa_slot"]) // P
    _says(c.headline, f"full {_pages(full)}", "2 of its 4", f"SWA {_pages(swa)}", "whole")


def test_a_reissued_swa_page_names_the_old_page_and_the_new_owner(tmp_path: Path) -> None:
    d, c = _first("swa-page-reissued", tmp_path)
    swa, old = int(d.truth["slot"]) // P, int(d.truth["full_slot"]) // P
    lut = d.tensors["full_to_swa_index_mapping"][:-1]
    into = np.flatnonzero((lut // P == swa) & (lut > 0))
    new = next(int(s) for s in into if int(s) // P != old)
    _says(
        c.headline,
        f"SWA {_pages(swa)}",
        f"full {_pages(old)}",
        f"pool row {_holder(d, new)}",
        "reissued",
    )


def test_a_cleared_boundary_page_names_the_page_its_pool_row_and_both_mechanisms(
    tmp_path: Path,
) -> None:
    d, c = _first("swa-boundary-page-cleared", tmp_path)
    page = int(d.truth["slot"]) // P
    row = _pool_row(d, int(d.truth["batch_row"]))
    _says(
        c.headline,
        f"full {_pages(page)}",
        f"pool row {row}",
        "two nodes share",
        "one page past",
        "the tree",
        "a snapshot one step earlier",
    )


def test_entries_cleared_in_the_window_name_the_cells_and_both_mechanisms(
    tmp_path: Path,
) -> None:
    d, c = _first("swa-lut-cleared-in-window", tmp_path)
    row = _pool_row(d, int(d.truth["batch_row"]))
    _says(
        c.headline,
        f"full slot {d.truth['slot']}",
        f"pool row {row}",
        f"position {d.truth['position']}",
        "ran past the window's start",
        "SWA lock",
        "a timeline",
        "tree",
    )


def test_a_mapping_collision_names_both_owners_and_both_mechanisms(tmp_path: Path) -> None:
    d, c = _first("swa-slot-collision", tmp_path)
    full = int(d.truth["full_slot"])
    _says(
        c.headline,
        f"SWA slot {d.truth['slot']}",
        str(full),
        f"pool row {_holder(d, full)}",
        "handed out twice",
        "stale",
        "a timeline",
    )


def test_a_swa_write_into_a_live_slot_names_writer_and_holder(tmp_path: Path) -> None:
    d, c = _first("swa-write-into-live-slot", tmp_path)
    writer = int(d.truth["batch_row"])
    lut = d.tensors["full_to_swa_index_mapping"]
    holder = next(
        lr.pool_row
        for lr in d.live
        if lr.batch_row != writer and int(d.truth["slot"]) in lut[lr.slots[: lr.prefix_len]]
    )
    _says(
        c.headline,
        f"SWA slot {d.truth['slot']}",
        f"pool row {_pool_row(d, writer)}",
        f"pool row {holder}",
        f"out_cache_loc[{d.truth['out_cache_loc_index']}]",
    )


def test_a_write_into_a_live_slot_names_writer_and_holder(tmp_path: Path) -> None:
    d, c = _first("write-into-live-slot", tmp_path)
    writer, slot = int(d.truth["batch_row"]), int(d.truth["slot"])
    _says(
        c.headline,
        f"full slot {slot}",
        f"pool row {_pool_row(d, writer)}",
        f"pool row {_holder(d, slot, other_than=writer)}",
        f"out_cache_loc[{d.truth['out_cache_loc_index']}]",
    )


def test_a_rewritten_mapping_names_its_slots_and_pool_row(tmp_path: Path) -> None:
    d, c = _first("swa-mapping-rewritten", tmp_path)
    slot = int(d.truth["slot"])
    _says(c.headline, str(slot), str(d.truth["swa_slot"]), f"pool row {_holder(d, slot)}")
    _says(c.headline, f"full page {slot // P}", "lockstep")


def test_unwritten_cells_name_their_pool_row_and_positions(tmp_path: Path) -> None:
    d, c = _first("unfilled-cells", tmp_path)
    row = _pool_row(d, int(d.truth["batch_row"]))
    _says(c.headline, f"pool row {row}", f"position {d.truth['position']}", "slot 0")


def test_a_copied_cell_names_its_slot_and_pool_rows(tmp_path: Path) -> None:
    d, c = _first("radix-copy", tmp_path)
    slot, pos = int(d.truth["slot"]), int(d.truth["position"])
    table = d.tensors["req_to_token"]
    rows = sorted(int(r) for r in np.flatnonzero(table[:, pos] == slot))
    assert len(rows) >= 2
    _says(c.headline, f"full slot {slot}", f"position {pos}", *(str(r) for r in rows))


@pytest.mark.parametrize("page_size", [1, P])
def test_a_leaked_swa_page_names_the_page(tmp_path: Path, page_size: int) -> None:
    d, c = _first("swa-page-leak", tmp_path, page_size)
    slot = int(d.truth["slot"])
    where = f"SWA slot {slot}" if page_size == 1 else f"SWA {_pages(slot // P)}"
    _says(c.headline, where, "neither free nor mapped")


def test_a_leaked_full_page_names_the_page(tmp_path: Path) -> None:
    d, c = _first("full-page-leak", tmp_path)
    _says(c.headline, f"full {_pages(int(d.truth['slot']) // P)}", "leaked")


@pytest.mark.parametrize(
    "name", ["req-row-leaked", "req-row-freed-while-running", "req-row-freed-twice"]
)
def test_a_request_pool_row_fault_names_the_pool_row(tmp_path: Path, name: str) -> None:
    d, c = _first(name, tmp_path)
    _says(c.headline, f"pool row {d.truth['pool_row']}")


def test_a_leaked_lock_names_the_slot(tmp_path: Path) -> None:
    d, c = _first("tree-lock-leaked", tmp_path)
    _says(c.headline, f"full slot {d.truth['slot']}", "locked", "no running request")


def _planted_first(module: Any, fault: str, tmp_path: Path) -> Cause:
    report = module._check(tmp_path, module._planted(fault))
    return report.diagnosis[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("fault", "named"),
    [
        ("free-and-held", "Mamba slot 4"),
        ("owned-twice", "Mamba slot 4"),
        ("freed-twice", "Mamba slot 7"),
        ("reserved", "Mamba slot 0"),
        ("leaked", "Mamba slot 5"),
        ("beyond", "Mamba slots 9, 12"),
    ],
)
def test_a_mamba_fault_names_the_mamba_slot(tmp_path: Path, fault: str, named: str) -> None:
    _says(_planted_first(test_mamba, fault, tmp_path).headline, named)


@pytest.mark.parametrize(
    ("fault", "named"),
    [
        ("free-and-held", "host slot 0"),
        ("held-twice", "host slot 4"),
        ("freed-twice", "host slots 10, 11"),
        ("out-of-range", "host slot 40"),
        ("leaked", "host slot 7"),
    ],
)
def test_a_hicache_fault_names_the_host_slot(tmp_path: Path, fault: str, named: str) -> None:
    _says(_planted_first(test_hicache, fault, tmp_path).headline, named)


def test_a_stale_mamba_row_map_names_the_pool_row(tmp_path: Path) -> None:
    c = _planted_first(test_mamba, "row-map", tmp_path)
    _says(c.headline, "pool row 2", "Mamba slot 4", "Mamba slot 2")


@pytest.mark.parametrize(
    ("fault", "named"),
    [
        ("free-and-bound", "slot 3"),
        ("unbound", "slot 3"),
        ("two-physical", "slot 2"),
        # both pages bound to the shared one: which bind came later, no table says
        ("shared-physical", "virtual slots 2, 3 share physical page 6"),
        ("sentinel-bound", "slot 3"),
    ],
)
def test_a_unified_fault_names_the_virtual_slot(tmp_path: Path, fault: str, named: str) -> None:
    c = _planted_first(test_unified, fault, tmp_path)
    _says(c.headline, named, "pool row 1")


def _aliased(tmp_path: Path, locks: str) -> tuple[int, Cause]:
    """The aliasing scenario with the tree's locks recorded as the synth records them (every
    live prefix, so the copied slot is locked), without the copied slot, or not at all."""
    d = make_scenario("cross-request-aliasing", seed=0)
    slot = int(d.truth["slot"])
    live = np.unique(np.concatenate([lr.slots[: lr.prefix_len] for lr in d.live]))
    if locks == "locked":
        d.tensors["tree_locked_full_slots"] = live.astype(np.int64)
    elif locks == "unlocked":
        d.tensors["tree_locked_full_slots"] = live[live != slot].astype(np.int64)
    if locks != "unrecorded":
        d.tensors.setdefault("running_req_rows", np.array([lr.pool_row for lr in d.live]))
        d.tensors.setdefault("free_req_rows", np.zeros(0, dtype=np.int64))
    report = _check(d, tmp_path / f"{locks}.safetensors")
    c = report.diagnosis[0]
    assert c.code is CauseCode.CROSS_REQUEST_ALIASING, report.diagnosis
    return slot, c


def test_aliasing_says_the_copied_slot_is_still_locked(tmp_path: Path) -> None:
    slot, c = _aliased(tmp_path, "locked")
    _says(c.headline, f"full slot {slot}", "tree_locked_full_slots lists it", "copied")
    assert "evicted under" not in (c.headline or "")


def test_aliasing_says_the_slot_lost_its_lock(tmp_path: Path) -> None:
    slot, c = _aliased(tmp_path, "unlocked")
    _says(c.headline, f"full slot {slot}", "tree_locked_full_slots does not list it", "evict")
    _says(c.headline, "a timeline")


def test_aliasing_without_the_locks_names_both_mechanisms(tmp_path: Path) -> None:
    slot, c = _aliased(tmp_path, "unrecorded")
    _says(c.headline, f"full slot {slot}", "evict", "copied", "tree_locked_full_slots")


def test_a_nested_leak_is_a_clause_of_its_parent(tmp_path: Path) -> None:
    d, c = _first("swa-freed-while-live", tmp_path)
    assert c.code is CauseCode.SWA_FREED_WHILE_LIVE and CauseCode.SWA_LEAK in c.nests
    _says(c.headline, "; this also shows as a leak of SWA page")
