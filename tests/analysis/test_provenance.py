"""Provenance: shared radix prefixes, aliased cells, SWA translation, row maps."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from kvcanary_cli import api
from kvcanary_cli.analysis.provenance import ProvenanceIndex, live_cells
from kvcanary_cli.analysis.query import row_map, slot_query
from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.dump.writer import save_dump
from kvcanary_cli.planners.frame import group_frame
from kvcanary_cli.render import OutputFormat, render
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.results.provenance import ProvenanceReport
from kvcanary_cli.synth.scenarios import SCENARIOS, make_scenario
from tests.helpers import checked


def _tiny_shared(tmp_path: Path) -> KvDump:
    table = np.zeros((4, 8), dtype=np.int32)
    table[1, :4] = np.array([5, 6, 7, 8])  # request A
    table[2, :3] = np.array([5, 6, 9])  # request B shares A's first two slots
    table[3, :2] = np.array([7, 11])  # idle row with a stale copy of slot 7
    path = save_dump(
        tmp_path / "shared.safetensors",
        req_to_token=table,
        req_pool_indices=np.array([1, 2, 0]),
        prefix_lens=np.array([3, 2, 0]),
        extend_seq_lens=np.array([1, 1, 0]),
    )
    return load_dump(path)


def test_radix_shared_slot_shows_both_rows_as_shared(tmp_path) -> None:  # type: ignore[no-untyped-def]
    dump = _tiny_shared(tmp_path)
    report = checked(dump, kernel="vectorized")
    assert report.findings == ()  # legitimate sharing is not a finding
    answer = slot_query(dump, report.findings, 6)
    assert answer.slot is not None
    cells = {(c.pool_row, c.position): c for c in answer.slot.cells}
    assert set(cells) == {(1, 1), (2, 1)}
    assert all(c.shared for c in cells.values())
    assert cells[(2, 1)].seed  # P-1 of a writing row
    assert cells[(1, 1)].batch_rows == (0,)


def test_stale_copy_in_idle_row_is_labelled(tmp_path) -> None:  # type: ignore[no-untyped-def]
    dump = _tiny_shared(tmp_path)
    answer = slot_query(dump, checked(dump, kernel="none").findings, 7)
    assert answer.slot is not None
    roles = {(c.pool_row, c.position): c.role for c in answer.slot.cells}
    assert roles == {(1, 2): "verify", (3, 0): "idle-row"}
    assert answer.slot.cells_total == 2


def test_aliased_slot_shows_both_cells(tmp_path) -> None:  # type: ignore[no-untyped-def]
    dump = _tiny_shared(tmp_path)
    path = tmp_path / "alias.safetensors"
    table = dump.req_to_token.array().copy()
    table[2, 2] = 8  # B's pending write reuses A's slot 8 (A holds it at position 3)
    save_dump(
        path,
        req_to_token=table,
        req_pool_indices=dump.req_pool_indices,
        prefix_lens=np.array([4, 2, 0]),
        extend_seq_lens=np.array([0, 1, 0]),
    )
    aliased = load_dump(path)
    report = checked(aliased, kernel="vectorized")
    (finding,) = [f for f in report.findings if f.code.value == "slot-shared-across-positions"]
    assert finding.slot == 8
    answer = slot_query(aliased, report.findings, 8)
    assert answer.slot is not None
    assert {(c.pool_row, c.position) for c in answer.slot.cells} == {(1, 3), (2, 2)}
    assert not any(c.shared for c in answer.slot.cells)
    assert finding in answer.findings


def test_swa_space_lists_the_full_slots_mapping_to_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = np.zeros((3, 8), dtype=np.int32)
    table[1, :4] = np.array([1, 2, 3, 4])
    lut = np.zeros(11, dtype=np.int64)
    lut[-1] = -1
    lut[3], lut[4] = 7, 7  # collision
    path = save_dump(
        tmp_path / "swa.safetensors",
        req_to_token=table,
        req_pool_indices=np.array([1]),
        prefix_lens=np.array([4]),
        full_to_swa_index_mapping=lut,
        swa_window_size=2,
        num_full_slots=10,
    )
    dump = load_dump(path)
    report = checked(dump, kernel="vectorized")
    assert {f.code.value for f in report.findings} == {"swa-slot-collision"}
    answer = slot_query(dump, report.findings, 7, space="swa")
    assert answer.slot is not None and answer.slot.mapped_from == (3, 4)
    assert {(c.pool_row, c.position) for c in answer.slot.cells} == {(1, 2), (1, 3)}
    full = slot_query(dump, report.findings, 3)
    assert full.slot is not None and full.slot.swa_slot == 7


def test_row_map_marks_bad_cells(tmp_path) -> None:  # type: ignore[no-untyped-def]
    dump = _tiny_shared(tmp_path)
    table = dump.req_to_token.array().copy()
    table[1, 1] = 0
    path = save_dump(
        tmp_path / "hole.safetensors",
        req_to_token=table,
        req_pool_indices=dump.req_pool_indices,
        prefix_lens=dump.prefix_lens,
        extend_seq_lens=dump.extend_seq_lens,
    )
    holed = load_dump(path)
    answer = row_map(holed, checked(holed, kernel="vectorized"), 1)
    assert answer.row is not None
    by_pos = {c.position: c for c in answer.row.cells}
    assert by_pos[1].marks == ("padding-slot-in-live-range",)
    assert [by_pos[p].role for p in range(5)] == [
        "verify",
        "verify",
        "verify",
        "pending-write",
        "stale-tail",
    ]


def test_provenance_index_counts_every_cell_but_keeps_few(tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = np.full((6, 50), 3, dtype=np.int32)
    path = save_dump(
        tmp_path / "many.safetensors",
        req_to_token=table,
        req_pool_indices=np.array([2]),
        prefix_lens=np.array([5]),
    )
    dump = load_dump(path)
    index = ProvenanceIndex(dump, [3], max_cells=4)
    cells, total = index.cells(3, group_frame(dump, "full"))
    assert total == 300 and len(cells) == 4
    assert all(c.pool_row == 2 for c in cells)  # live rows first
    assert len(live_cells(dump)) == 5


def test_slot_provenance_lists_its_ring_rows_and_records(tmp_path: Path) -> None:
    from kvcanary_cli.synth.scenarios import make_scenario

    synth = make_scenario("canary-use-after-free", seed=1)
    dump = load_dump(synth.save(tmp_path / "uaf.safetensors"))
    slot = synth.truth["slot"]
    answer = slot_query(dump, checked(dump, kernel="vectorized").findings, slot)
    assert answer.slot is not None
    assert [v.index for v in answer.slot.violations] == [0, 2]  # HEAD_K then TAIL_K
    assert all(v.fields[1] == slot for v in answer.slot.violations)
    assert {r.buffer for r in answer.slot.canary} == {"canary.full.head.k", "canary.full.tail.k"}
    codes = {f.code.value for f in answer.findings}
    assert {"canary-position-mismatch", "freed-slot-in-live-range"} <= codes


def test_free_list_answers_are_the_same_before_and_after_it_is_sorted() -> None:
    """The first queries scan the list, later ones search a sorted copy: same answers."""
    from kvcanary_cli.analysis import provenance

    rng = np.random.default_rng(5)
    free = rng.permutation(np.arange(0, 4000, 3, dtype=np.int64))
    slots = rng.integers(-2, 4100, size=4 * provenance._SCANS_BEFORE_SORT).tolist()
    got = [provenance._allocator_state(free, s) for s in slots]
    assert got == [
        "below the pool (negative)" if s < 0 else "free" if s % 3 == 0 and s < 4000 else "in use"
        for s in slots
    ]
    assert provenance._free_list(free).ordered is not None  # the later ones were searched


def test_a_negative_slot_is_below_every_pool_known_or_not() -> None:
    """No allocator hands out a negative slot: never "in use" (a pool of unknown size), never
    "beyond" a pool it is below."""
    from kvcanary_cli.analysis import provenance

    free = np.array([-1, 3, 5], dtype=np.int64)  # even a corrupt free list that holds it
    for pool in (None, 8):
        assert provenance._allocator_state(free, -1, pool=pool) == "below the pool (negative)"
        assert provenance._allocator_state(free, -7, pool=pool) == "below the pool (negative)"
        assert provenance._allocator_state(free, 3, pool=pool) == "free"
    assert provenance._allocator_state(free, 8, pool=8) == "beyond the pool"
    assert provenance._allocator_state(None, -1, pool=8) is None  # no free list: no state


def _live_cells_holding(dump: KvDump, slots: set[int]) -> dict[str, np.ndarray]:
    """`live_cells` filtered to `slots`: what `ProvenanceIndex(live=True)` must keep."""
    cells = live_cells(dump)
    keep = np.isin(cells.slot, np.array(sorted(slots), dtype=np.int64))
    return {name: getattr(cells, name)[keep] for name in _LIVE_FIELDS}


_LIVE_FIELDS = ("slot", "batch_row", "pool_row", "position", "pending")


def _slots_to_find(dump: KvDump, rng: np.random.Generator) -> set[int]:
    """Some live slots, some anywhere in the table, the slots just past each live range
    (the first stale cell), and slots no cell holds (negative, beyond the pool); never 0,
    the padding slot."""
    table = dump.req_to_token
    cells = live_cells(dump)
    held = np.unique(cells.slot)
    anywhere = np.unique(table.take(table.known_indices()))  # a shrunk dump: the kept cells
    picks = [rng.choice(a, size=min(5, a.size), replace=False) for a in (held, anywhere) if a.size]
    ends = np.flatnonzero(np.r_[cells.batch_row[1:] != cells.batch_row[:-1], True])
    past = cells.pool_row[ends] * dump.max_seq_len + cells.position[ends] + 1
    past = past[cells.position[ends] + 1 < dump.max_seq_len]
    slots = {int(s) for part in picks for s in part} | {-3, 1 << 40}
    slots |= set(table.take(past).tolist()) if cells.slot.size else set()
    return slots - {0}


@pytest.mark.parametrize("shrunk", [False, True])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_index_keeps_exactly_the_live_cells_of_its_slots(
    name: str, shrunk: bool, tmp_path: Path
) -> None:
    """One scan serves `provenance --slot`'s findings: the live cells it keeps are
    `live_cells`' own, in its order, on dense and shrunk dumps alike."""
    path = make_scenario(name, seed=2).save(tmp_path / "d.safetensors")
    if shrunk:
        api.shrink(path, tmp_path / "small.safetensors")
        path = tmp_path / "small.safetensors"
    dump = load_dump(path)
    rng = np.random.default_rng(len(name))
    slots = _slots_to_find(dump, rng)
    got = ProvenanceIndex(dump, slots, live=True).live_cells()
    expected = _live_cells_holding(dump, slots)
    for field in _LIVE_FIELDS:
        np.testing.assert_array_equal(getattr(got, field), expected[field], err_msg=field)


@pytest.mark.parametrize("name", ["cross-request-aliasing", "stale-tail", "truncated-lut"])
def test_a_narrowed_index_is_the_index_built_narrow(name: str, tmp_path: Path) -> None:
    dump = load_dump(make_scenario(name, seed=1).save(tmp_path / "d.safetensors"))
    slots = _slots_to_find(dump, np.random.default_rng(7))
    frame = group_frame(dump, "full")
    wide = ProvenanceIndex(dump, slots, max_cells=256).narrowed(2)
    narrow = ProvenanceIndex(dump, slots, max_cells=2)
    assert wide.max_cells == 2
    for slot in sorted(slots):
        assert wide.cells(slot, frame) == narrow.cells(slot, frame), slot


@pytest.mark.parametrize("max_cells", [1, 3])
@pytest.mark.parametrize("name", ["cross-request-aliasing", "stale-tail", "clean-swa"])
def test_the_index_keeps_the_first_cells_in_tier_order(
    name: str, max_cells: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Brute force: every cell holding each slot, ordered (tier, row, position), first
    `max_cells` kept, every one counted; chunks of a few rows, so a slot spans chunks. Slot 0
    (the padding most of a table holds) included."""
    from kvcanary_cli.analysis import provenance

    dump = load_dump(make_scenario(name, seed=3).save(tmp_path / "d.safetensors"))
    table = np.asarray(dump.req_to_token.array(), dtype=np.int64)
    slots = _slots_to_find(dump, np.random.default_rng(max_cells)) | {0}
    rows, ends = provenance.live_ends(dump)
    end_of = dict(zip(rows.tolist(), ends.tolist(), strict=True))

    def tier(row: int, col: int) -> int:
        return 0 if col < end_of.get(row, 0) else 1 if row in end_of else 2

    monkeypatch.setattr(provenance, "_SCAN_CELLS", table.shape[1])  # a chunk per row
    assert table.shape[0] > 4
    for wanted in [*([s] for s in sorted(slots)), sorted(slots)]:  # one slot, then all
        index = ProvenanceIndex(dump, wanted, max_cells=max_cells)
        for slot in wanted:
            held = sorted(
                (tier(int(r), int(c)), int(r), int(c))
                for r, c in zip(*np.nonzero(table == slot), strict=True)
            )
            kept = index._kept
            mine = kept["slot"] == slot
            columns = (kept[name][mine].tolist() for name in ("tier", "row", "col"))
            got = list(zip(*columns, strict=True))
            assert got == held[:max_cells], (slot, wanted)
            assert index.count(slot) == len(held)


def test_a_full_slot_whose_swa_peer_is_free_shows_that_finding(tmp_path: Path) -> None:
    """`provenance --slot F` lists the SWA-space finding on F's SWA peer when the SWA
    allocator holds it as free: the finding names F (`Finding.full_slots`), as a collision
    does; an unrelated full slot's answer does not list it."""
    from kvcanary_cli import api
    from kvcanary_cli.synth.scenarios import make_scenario

    synth = make_scenario("clean-swa", seed=1)
    tensors = synth.tensors
    row = int(np.flatnonzero(tensors["req_pool_indices"])[0])
    pool_row, prefix = int(tensors["req_pool_indices"][row]), int(tensors["prefix_lens"][row])
    full = int(tensors["req_to_token"][pool_row, prefix - 1])
    other = int(tensors["req_to_token"][pool_row, prefix - 2])
    swa = int(tensors["full_to_swa_index_mapping"][full])
    free = tensors["free_swa_slots"]
    tensors["free_swa_slots"] = np.concatenate([free, np.array([swa], dtype=free.dtype)])
    path = synth.save(tmp_path / "swa-peer-free.safetensors")
    answer = api.provenance(path, slot=full)
    assert isinstance(answer, ProvenanceReport)
    assert answer.findings  # one per live cell of F (radix sharing may put it in two rows)
    assert {(f.code.value, f.space.value, f.slot, f.full_slots) for f in answer.findings} == {
        ("freed-slot-in-live-range", "swa", swa, (full,))
    }
    assert api.provenance(path, slot=other).findings == ()


def test_swa_slot_0_has_no_holders(tmp_path: Path) -> None:
    """LUT[f] == 0 means "no SWA peer": every unmapped full slot reads 0, so SWA slot 0 (the
    reserved padding slot) is held by none of them (was: "swa slot 0 is held at ... +N more")."""
    state = make_scenario("clean-swa", seed=0)
    free = state.tensors["free_swa_slots"]
    state.tensors["free_swa_slots"] = np.concatenate([np.zeros(1, dtype=free.dtype), free])
    dump = load_dump(state.save(tmp_path / "d.safetensors"))
    lut = dump.full_to_swa_index_mapping
    assert lut is not None and int((lut.array()[:-1] == 0).sum()) > 1  # unmapped full slots
    report = checked(dump, kernel="vectorized")
    [finding] = [f for f in report.findings if f.space == "swa" and f.slot == 0]
    [prov] = finding.provenance
    assert (prov.mapped_from, prov.cells, prov.cells_total) == ((), (), 0)
    assert prov.translation_note is not None and "unmapped" in prov.translation_note
    answer = slot_query(dump, report.findings, 0, space="swa")
    assert answer.slot is not None and answer.slot.mapped_from == ()
    console = Console(file=io.StringIO(), width=120, color_system=None, record=True)
    console.print(render(CheckReport(dumps=(report,)), OutputFormat.TABLE))
    text = console.export_text()
    assert "reserved-slot-in-use" in text and "swa slot 0 is held at" not in text


@pytest.mark.parametrize("seed", range(8))
def test_pairs_in_order_are_those_lexsort_leaves_in_place(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index hands its live cells over unsorted when the scan's order is already theirs
    (batch rows reading their pool rows in order): only when a lexsort would leave them."""
    from kvcanary_cli.analysis import provenance as provenance_module

    monkeypatch.setattr(provenance_module, "_LIVE_CHUNK", 5)  # pairs compared across chunks
    rng = np.random.default_rng(seed)
    major = rng.integers(0, 4, size=23).astype(np.int16)
    minor = rng.integers(0, 3, size=23).astype(np.int8)
    order = np.lexsort((minor, major))
    major, minor = major[order], minor[order]
    assert provenance_module._in_order(major, minor)
    for at in (4, 5, 21):  # a pair out of order at a chunk's end, its start, the last pair
        swapped = major.copy(), minor.copy()
        for column in swapped:
            column[at], column[at + 1] = column[at + 1], column[at].copy()
        moved = not (np.lexsort(swapped[::-1]) == np.arange(23)).all()
        assert provenance_module._in_order(*swapped) is not moved
