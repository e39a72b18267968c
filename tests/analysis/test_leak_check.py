"""`full-page-leaked` and the reconciliation with SGLang's printed counts, on synthetic
states (the real checker's test is tests/integration/test_sglang_leak_trigger.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.results.check import Finding
from kvcanary_cli.synth.scenarios import make_scenario
from kvcanary_cli.synth.state import SynthDump
from tests.helpers import checked


def _recorded(page_size: int, *, drop_page: bool, lens_row: bool = False) -> tuple[SynthDump, int]:
    """A clean SWA state with the tree's record: every full slot off the free list is the
    tree's, or (`lens_row`) one live row's are a running request's instead; `drop_page`
    forgets one held page in both records (the leak)."""
    state = make_scenario("clean-swa", seed=3, size="tiny", page_size=page_size)
    size = int(state.metadata["num_full_slots"])
    free = np.asarray(state.tensors["free_full_slots"], dtype=np.int64)
    held = np.setdiff1d(np.arange(page_size, size), free)
    table = np.asarray(state.tensors["req_to_token"])
    lens = np.zeros(table.shape[0], dtype=np.int64)
    row_pages = np.zeros(0, dtype=np.int64)
    if lens_row:
        row = int(state.tensors["req_pool_indices"][0])
        length = int(state.tensors["prefix_lens"][0] + state.tensors["extend_seq_lens"][0])
        lens[row] = length
        held = np.setdiff1d(held, table[row, :length])
        # SGLang allocates whole pages: the row's last page is the request's, all of it
        row_pages = np.unique(table[row, :length] // page_size)
        held = held[~np.isin(held // page_size, row_pages)]
    leaked_page = -1
    if drop_page:
        leaked_page = int(held[-1] // page_size)
        held = held[held // page_size != leaked_page]
    state.tensors["tree_full_slots"] = held
    state.tensors["req_pool_allocated_lens"] = lens
    return state, leaked_page


def _printed(state: SynthDump, leaked: int) -> None:
    """The counts SGLang's idle check would print for the state (`leaked` slots missing)."""
    meta = state.metadata
    page = int(meta.get("page_size", "1"))
    total = int(meta["num_full_slots"]) - page
    free = len(state.tensors["free_full_slots"])
    counts = {"total": total, "available": free, "evictable": total - free - leaked}
    counts.update(protected=0, session_held=0, uncached=0)
    for name, value in counts.items():
        meta[f"sglang.check.full.{name}"] = str(value)


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("lens_row", [False, True])
def test_a_page_neither_free_nor_held_is_named_and_reconciled(
    page_size: int, lens_row: bool, tmp_path: Path
) -> None:
    state, page = _recorded(page_size, drop_page=True, lens_row=lens_row)
    leaked = np.arange(page * page_size, (page + 1) * page_size)
    _printed(state, leaked.size)
    report = checked(load_dump(state.save(tmp_path / "bad.safetensors")), kernel="vectorized")
    [finding] = [f for f in report.findings if f.code is FindingCode.FULL_PAGE_LEAKED]
    assert finding.cells is not None and finding.cells.slot is not None
    assert finding.cells.slot.tolist() == leaked.tolist()
    assert report.diagnosis[0].code.value == "full-leak"
    [note] = [n for n in report.notes if "[full]" in n]
    assert f"{leaked.size} slots unaccounted" in note and "exactly the difference" in note


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("lens_row", [False, True])
def test_the_clean_twin_is_silent_and_reconciles_to_zero(
    page_size: int, lens_row: bool, tmp_path: Path
) -> None:
    state, _ = _recorded(page_size, drop_page=False, lens_row=lens_row)
    _printed(state, 0)
    report = checked(load_dump(state.save(tmp_path / "twin.safetensors")), kernel="vectorized")
    assert report.findings == ()
    [note] = [n for n in report.notes if "[full]" in n]
    assert "0 slots unaccounted" in note and "none leaked" in note


def test_without_the_tree_record_nothing_is_guessed(tmp_path: Path) -> None:
    state, _ = _recorded(4, drop_page=True)
    del state.tensors["tree_full_slots"]
    _printed(state, 4)
    report = checked(load_dump(state.save(tmp_path / "d.safetensors")), kernel="vectorized")
    assert FindingCode.FULL_PAGE_LEAKED not in {f.code for f in report.findings}
    [note] = [n for n in report.notes if "[full]" in n]
    assert "cannot name them" in note


def test_lengths_that_claim_every_cell_stay_bounded(tmp_path: Path) -> None:
    """Hostile lengths (every row allocated to its end): the reading is chunked and the
    slots past the pool are ignored; the check still answers."""
    state, _ = _recorded(1, drop_page=False)
    table = np.asarray(state.tensors["req_to_token"])
    state.tensors["req_pool_allocated_lens"] = np.full(table.shape[0], 2**40, dtype=np.int64)
    report = checked(load_dump(state.save(tmp_path / "d.safetensors")), kernel="vectorized")
    assert FindingCode.FULL_PAGE_LEAKED not in {f.code for f in report.findings}


def _held_outside_batch(page_size: int, *, freed: bool) -> tuple[SynthDump, np.ndarray]:
    """`_recorded`'s clean state with one more running request, outside the batch, whose
    row holds one page it took off the free list; `freed`: the page is back on the free list
    while the request still holds it (SGLang 0.5.13 - 0.5.14's SWA tombstone recovery frees a
    locked node's full value so, a step before that request is in a batch again)."""
    state, _ = _recorded(page_size, drop_page=False)
    table = state.tensors["req_to_token"]
    batch_rows = np.asarray(state.tensors["req_pool_indices"], dtype=np.int64)
    row = int(next(r for r in range(1, table.shape[0]) if r not in batch_rows))
    free = np.asarray(state.tensors["free_full_slots"], dtype=np.int64)
    page = np.arange(page_size, dtype=np.int64) + int(free[-1] // page_size) * page_size
    assert np.isin(page, free).all()
    table[row, :page_size] = page
    state.tensors["req_pool_allocated_lens"][row] = page_size
    state.tensors["running_req_rows"] = np.append(batch_rows[batch_rows > 0], row)
    state.tensors["held_full_slots"] = np.append(state.tensors["held_full_slots"], page)
    if not freed:
        state.tensors["free_full_slots"] = free[~np.isin(free, page)]
    return state, page


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_free_slot_a_running_request_outside_the_batch_holds_is_named(
    page_size: int, tmp_path: Path
) -> None:
    state, page = _held_outside_batch(page_size, freed=True)
    report = checked(load_dump(state.save(tmp_path / "bad.safetensors")), kernel="vectorized")
    [finding] = report.findings
    assert finding.code is FindingCode.FULL_SLOT_FREE_AND_HELD
    assert finding.cells is not None and finding.cells.slot is not None
    assert finding.cells.slot.tolist() == page.tolist()
    assert report.diagnosis[0].code.value == "use-after-free"


@pytest.mark.parametrize("page_size", [1, 4])
def test_its_clean_twin_is_silent(page_size: int, tmp_path: Path) -> None:
    state, _ = _held_outside_batch(page_size, freed=False)
    report = checked(load_dump(state.save(tmp_path / "twin.safetensors")), kernel="vectorized")
    assert report.findings == ()


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_slot_two_running_requests_hold_outside_the_tree_is_named(
    page_size: int, tmp_path: Path
) -> None:
    """The freed page handed out again (to a second running request outside the batch) in
    the same step: off the free list, in two rows, not the tree's."""
    state, page = _held_outside_batch(page_size, freed=False)
    table = state.tensors["req_to_token"]
    taken = [*state.tensors["running_req_rows"].tolist(), *state.tensors["req_pool_indices"]]
    row = int(next(r for r in range(1, table.shape[0]) if r not in taken))
    table[row, :page_size] = page
    state.tensors["req_pool_allocated_lens"][row] = page_size
    state.tensors["running_req_rows"] = np.append(state.tensors["running_req_rows"], row)
    report = checked(load_dump(state.save(tmp_path / "bad.safetensors")), kernel="vectorized")
    [finding] = report.findings
    assert finding.code is FindingCode.FULL_SLOT_HELD_TWICE
    assert finding.cells is not None and finding.cells.slot is not None
    assert sorted(finding.cells.slot.tolist()) == sorted(page.tolist() * 2)
    assert report.diagnosis[0].code.value == "cross-request-aliasing"


def _tree_page(page_size: int, *, freed: bool) -> tuple[SynthDump, np.ndarray]:
    """`_recorded`'s clean state with one more page the tree holds and no row does (taken off
    the free list; unmapped, as a tombstoned node's); `freed`: the page is back on the free
    list while the node keeps it (soak's `tree-page-freed`)."""
    state, _ = _recorded(page_size, drop_page=False)
    free = np.asarray(state.tensors["free_full_slots"], dtype=np.int64)
    page = np.arange(page_size, dtype=np.int64) + int(free[-1] // page_size) * page_size
    state.tensors["tree_full_slots"] = np.append(state.tensors["tree_full_slots"], page)
    state.tensors["held_full_slots"] = np.append(state.tensors["held_full_slots"], page)
    if not freed:
        state.tensors["free_full_slots"] = free[~np.isin(free, page)]
    return state, page


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("freed", [True, False])
def test_a_tree_page_on_the_free_list_is_named(page_size: int, freed: bool, tmp_path: Path) -> None:
    """Nothing else shows an unmapped tree page on the free list until it is handed out."""
    state, page = _tree_page(page_size, freed=freed)
    report = checked(load_dump(state.save(tmp_path / "d.safetensors")), kernel="vectorized")
    if not freed:
        assert report.findings == ()
        return
    [finding] = report.findings
    assert finding.code is FindingCode.FULL_SLOT_FREE_AND_HELD
    assert finding.cells is not None and finding.cells.slot is not None
    assert finding.cells.slot.tolist() == page.tolist()


def _both_faults(page_size: int) -> SynthDump:
    """One page freed under a running request outside the batch, and another handed to two
    running requests outside the batch and the tree: both held-cell findings at once."""
    state, _ = _held_outside_batch(page_size, freed=True)
    table = state.tensors["req_to_token"]
    free = np.asarray(state.tensors["free_full_slots"], dtype=np.int64)
    other = np.arange(page_size, dtype=np.int64) + int(free[0] // page_size) * page_size
    taken = [*state.tensors["running_req_rows"].tolist(), *state.tensors["req_pool_indices"]]
    rows = [r for r in range(1, table.shape[0]) if r not in taken][:2]
    for row in rows:
        table[row, :page_size] = other
        state.tensors["req_pool_allocated_lens"][row] = page_size
    state.tensors["running_req_rows"] = np.append(state.tensors["running_req_rows"], rows)
    state.tensors["free_full_slots"] = free[~np.isin(free, other)]
    return state


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_running_cells_read_a_chunk_at_a_time_find_what_one_read_finds(
    page_size: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The held-cell findings, the full pool's accounting and the held slots, with chunks of
    a few cells (rows split across chunks, chunks of one row, a lookahead shorter than the
    rows), are those of one whole read."""
    import kvcanary_cli.analysis.bookkeeping as bookkeeping

    dump = load_dump(_both_faults(page_size).save(tmp_path / "d.safetensors"))
    whole = bookkeeping.held_findings(dump)
    assert {f.code for f in whole} == {
        FindingCode.FULL_SLOT_FREE_AND_HELD,
        FindingCode.FULL_SLOT_HELD_TWICE,
    }

    def cells(findings: list[Finding]) -> list[tuple[str, list[int], list[int], list[int]]]:
        return [
            (f.code, f.cells.pool_row.tolist(), f.cells.position.tolist(), f.cells.slot.tolist())  # type: ignore[union-attr]
            for f in findings
        ]

    leaks, held = bookkeeping.full_leaks(dump), bookkeeping.recorded_held_slots(dump)
    assert leaks is not None and leaks[1]["uncached"] > 0 and held is not None

    for chunk, ahead in ((1, 1), (3, 2), (7, 5), (64, 3)):
        monkeypatch.setattr(bookkeeping, "_RUNNING_CHUNK_CELLS", chunk)
        monkeypatch.setattr(bookkeeping, "_ROWS_AHEAD", ahead)
        assert cells(bookkeeping.held_findings(dump)) == cells(whole), (chunk, ahead)
        chunked = bookkeeping.full_leaks(dump)
        assert chunked is not None and chunked[1] == leaks[1], (chunk, ahead)
        assert np.array_equal(chunked[0], leaks[0]), (chunk, ahead)
        again = bookkeeping.recorded_held_slots(dump)
        assert again is not None and np.array_equal(again, held), (chunk, ahead)
