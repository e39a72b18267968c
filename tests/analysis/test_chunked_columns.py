"""Per-cell computations made a chunk at a time (to bound their int64 temporaries on ten
million cells) give what the whole-array computation gives, with chunk boundaries planted
inside runs of equal values, at a chunk's first and last cell, and past the last chunk."""

from __future__ import annotations

import tracemalloc
from collections import Counter

import numpy as np
import pytest

from kvcanary_cli.analysis import cells as cells_module
from kvcanary_cli.analysis import findings as findings_module
from kvcanary_cli.analysis.cells import pairs_among
from kvcanary_cli.analysis.findings import _ranks
from kvcanary_cli.analysis.provenance import LiveCells

CHUNK = 7  # no divisor of the sizes below: the last chunk is short


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(findings_module, "_RANK_CHUNK", CHUNK)
    monkeypatch.setattr(cells_module, "_KEY_CHUNK", CHUNK)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("size", [1, CHUNK, CHUNK + 1, 5 * CHUNK + 3])
def test_ranks_are_searchsorted_held_narrow(small_chunks: None, seed: int, size: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.integers(-3, 300, size=size).astype(np.int16)
    values[: min(size, CHUNK + 2)] = values[0]  # a run across the first boundary
    keys = np.unique(values)
    ranks = _ranks(keys, values)
    assert ranks.tolist() == np.searchsorted(keys, values).tolist()
    assert ranks.dtype == np.min_scalar_type(keys.size)  # a byte a cell below 256 slots
    assert ranks.dtype.kind == "u"


def _pairs_among_whole(
    rows: np.ndarray, slots: np.ndarray, among_rows: np.ndarray, among_slots: np.ndarray
) -> np.ndarray:
    """The whole-array answer: each (row, slot) pair compared as a pair."""
    mine = set(zip(among_rows.tolist(), among_slots.tolist(), strict=True))
    return np.array(
        [(r, s) in mine for r, s in zip(rows.tolist(), slots.tolist(), strict=True)], dtype=bool
    )


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("size", "among"), [(1, 1), (CHUNK, 3), (4 * CHUNK + 2, 3 * CHUNK + 5)])
def test_pairs_among_chunked_is_the_pairs_membership(
    small_chunks: None, seed: int, size: int, among: int
) -> None:
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 6, size=size).astype(np.int16)
    slots = rng.integers(-2, 9, size=size).astype(np.int8)
    among_rows = rng.integers(0, 6, size=among).astype(np.int16)
    among_slots = rng.integers(-2, 9, size=among).astype(np.int8)
    # a row and a slot found only apart (no pair), then a pair at both ends of the cells
    rows[size // 2], slots[size // 2] = 99, 7
    among_rows[among // 2], among_slots[among // 2] = 98, 7
    if among > 2:
        among_rows[1], among_slots[1] = 99, 6
    among_rows[0], among_slots[0] = rows[0], slots[0]
    among_rows[-1], among_slots[-1] = rows[-1], slots[-1]
    hit = pairs_among(rows, slots, among_rows, among_slots)
    assert hit.tolist() == _pairs_among_whole(rows, slots, among_rows, among_slots).tolist()
    assert hit[0] and hit[-1]
    if size > 2 and among > 2:
        assert not hit[size // 2]


def _aliased_whole(
    slot: np.ndarray, position: np.ndarray, row: np.ndarray, real: np.ndarray
) -> dict[int, int]:
    """The whole-array answer, slot by slot: each copy's cell and its slot's owner position
    (the position most cells agree on, the smallest on a tie; the first cell's when no two
    agree), for slots at several positions in several rows."""
    holders: dict[int, list[int]] = {}
    for i in np.flatnonzero(real).tolist():
        holders.setdefault(int(slot[i]), []).append(i)
    copies: dict[int, int] = {}
    for members in holders.values():
        counts = Counter(int(position[i]) for i in members)
        if len(counts) < 2 or len({int(row[i]) for i in members}) < 2:
            continue
        top = max(counts.values())
        owner = min(p for p, c in counts.items() if c == top) if top > 1 else position[members[0]]
        copies.update({i: int(owner) for i in members if position[i] != owner})
    return copies


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("subset", [False, True])
def test_shared_across_positions_is_the_slot_by_slot_answer(
    small_chunks: None, seed: int, subset: bool
) -> None:
    rng = np.random.default_rng(seed)
    rows, width = int(rng.integers(2, 7)), int(rng.integers(3, 9))
    batch_row = np.repeat(np.arange(rows), width)
    position = np.tile(np.arange(width), rows) + int(rng.integers(0, 3)) * 200  # past int8
    slot = rng.integers(1, 2 + rows * width // 3, size=rows * width)
    slot[rng.random(slot.size) < 0.3] = 5  # one slot at many positions: ties, long runs
    slot[: width + 1] = 900 + np.arange(width + 1) % 2  # runs across a chunk boundary
    cells = LiveCells(
        slot=slot,
        batch_row=batch_row,
        pool_row=batch_row + 1,
        position=position,
        pending=rng.random(slot.size) < 0.2,
    )
    real = rng.random(slot.size) < 0.8 if subset else np.ones(slot.size, dtype=bool)
    expected = _aliased_whole(slot, position, batch_row + 1, real)
    found = findings_module._shared_across_positions(cells, real)
    got: dict[int, int] = {}
    for f in found:
        assert f.cells is not None
        for b, p, o in zip(
            f.cells.batch_row.tolist(),
            f.cells.position.tolist(),
            f.cells.extra["owner_position"].tolist(),
            strict=True,
        ):
            got[int(b) * width + int(p) - int(position[0])] = int(o)
    assert got == expected
    assert bool(expected) == bool(found)


@pytest.mark.parametrize("detector", ["_shared_across_positions", "_duplicates_in_row"])
def test_a_detector_holds_no_index_of_every_cell(
    detector: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One slot in every cell (the hostile dump's shape): beyond the finding it returns, a
    detector holds a few bytes a cell at once (its answer's mask, a chunk's sort, a column
    gathered before it is held as runs), not an int64 index of every cell sorted (16 a cell
    with a lexsort) nor of every repeat (8). Measured with numpy's allocations traced, chunks
    made small."""
    monkeypatch.setattr(findings_module, "_RANK_CHUNK", 1 << 12)
    rows, width = 256, 1024
    batch_row = np.repeat(np.arange(rows), width)
    cells = LiveCells(
        slot=np.full(rows * width, 7),
        batch_row=batch_row,
        pool_row=batch_row + 1,
        position=np.tile(np.arange(width), rows),
        pending=np.zeros(rows * width, dtype=bool),
    )
    real = np.ones(rows * width, dtype=bool)
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        found = getattr(findings_module, detector)(cells, real)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(found) == 1 and found[0].cells is not None
    assert len(found[0].cells) == rows * (width - 1)
    assert held - start > 0
    assert (peak - held) / (rows * width) < 6, f"{(peak - held) / (rows * width):.1f} bytes a cell"


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("subset", [False, True])
def test_duplicates_in_row_by_chunks_of_rows_is_the_whole_answer(
    small_chunks: None, seed: int, subset: bool
) -> None:
    """Rows of 1 to 3 chunks' cells (a row longer than a chunk, rows ending mid-chunk), slots
    repeated within a row and across rows: the cells after a slot's first in its row, and
    the cells whose slot another cell holds, are what one sort of every cell finds."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 3 * CHUNK, size=int(rng.integers(2, 7)))
    batch_row = np.repeat(np.arange(lengths.size), lengths)
    position = np.concatenate([np.arange(n) for n in lengths])
    slot = rng.integers(1, 12, size=batch_row.size)
    cells = LiveCells(
        slot=slot,
        batch_row=batch_row,
        pool_row=batch_row + 1,
        position=position,
        pending=np.zeros(slot.size, dtype=bool),
    )
    real = rng.random(slot.size) < 0.7 if subset else np.ones(slot.size, dtype=bool)
    seen: set[tuple[int, int]] = set()
    expected = set()
    for i in np.flatnonzero(real).tolist():
        if (int(batch_row[i]), int(slot[i])) in seen:
            expected.add((int(batch_row[i]), int(position[i])))
        seen.add((int(batch_row[i]), int(slot[i])))
    found = findings_module._duplicates_in_row(cells, real)
    got = set()
    for f in found:
        assert f.cells is not None
        got |= set(zip(f.cells.batch_row.tolist(), f.cells.position.tolist(), strict=True))
    assert got == expected
    held = Counter(slot[real].tolist())
    twice = [bool(real[i]) and held[int(slot[i])] > 1 for i in range(slot.size)]
    assert findings_module.held_twice(slot, real).tolist() == twice
    alone = [t for t, r in zip(twice, real.tolist(), strict=True) if r]
    assert findings_module.held_twice(slot[real]).tolist() == alone


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("size", [2, CHUNK, CHUNK + 1, 5 * CHUNK + 3])
def test_held_twice_counted_by_chunks_is_the_whole_count(
    monkeypatch: pytest.MonkeyPatch, seed: int, size: int
) -> None:
    monkeypatch.setattr(findings_module, "_COUNT_CHUNK", CHUNK)
    rng = np.random.default_rng(seed)
    slot = rng.integers(0, 3 * size, size=size).astype(np.int16)
    slot[-1] = slot[0]  # a pair split across the first and last chunk
    among = rng.random(size) < 0.8
    among[0] = among[-1] = True
    for subset in (None, among):
        chosen = np.ones(size, dtype=bool) if subset is None else subset
        counts = Counter(slot[chosen].tolist())
        whole = [bool(c) and counts[s] > 1 for s, c in zip(slot.tolist(), chosen, strict=True)]
        assert findings_module.held_twice(slot, subset).tolist() == whole
        assert findings_module.held_twice(slot, subset)[[0, -1]].all()


def test_held_twice_of_a_clean_column_marks_no_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(findings_module, "_COUNT_CHUNK", CHUNK)
    slot = np.arange(1, 5 * CHUNK + 3, dtype=np.int16)[::-1].copy()
    assert not findings_module.held_twice(slot).any()
