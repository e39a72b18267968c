"""`dump.sparse`: reading the kept elements of a tensor in its original coordinates, exactly as
the dense tensor reads where kept (0 elsewhere), and refusing malformed runs; format 1.2's
(gap, length) runs and narrowed elements, and format 1.1 dumps written before them. (The
reads every `StoredTensor` shares are pinned for both kinds in test_tensor.py.)"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcanary_cli import api
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.dump.narrow import narrowest_dtype, narrowest_unsigned
from kvcanary_cli.dump.sparse import (
    SparseTensor,
    flat_runs,
    gap_runs,
    ring_slots,
    sparse_tensor,
)
from kvcanary_cli.dump.tensor import DenseTensor, _in_order
from kvcanary_cli.errors import TensorShapeError
from kvcanary_cli.synth.scenarios import make_scenario
from tests.helpers import checked

#: Shrunk dumps written by kvcanary's format-1.1 writer (before 1.2): they must still load.
FORMAT_1_1_DUMPS = sorted((Path(__file__).parent / "data").glob("shrunk-1.1-*.safetensors"))


def kept_part(dense: np.ndarray, flat: np.ndarray) -> SparseTensor:
    """The sparse form of `dense` keeping the flat indices `flat`, as the writer stores it."""
    flat = np.unique(flat)
    runs = flat_runs(flat)
    values = dense.reshape(-1)[flat]
    shape = np.array(dense.shape, dtype=np.int64)
    return sparse_tensor("t", values, runs, shape, (dense.ndim,))


@given(
    rows=st.integers(1, 6),
    cols=st.integers(1, 9),
    seed=st.integers(0, 2**31),
    share=st.floats(0.0, 1.0),
)
def test_reads_equal_the_dense_table_where_kept(
    rows: int, cols: int, seed: int, share: float
) -> None:
    rng = np.random.default_rng(seed)
    dense = rng.integers(-5, 50, size=(rows, cols)).astype(np.int32)
    keep = np.flatnonzero(rng.random(rows * cols) < share)
    sparse = kept_part(dense, keep)
    everything = np.arange(rows * cols, dtype=np.int64)
    values, known = sparse.take_known(everything)
    assert known.tolist() == np.isin(everything, keep).tolist()
    assert values.tolist() == np.where(known, dense.reshape(-1), 0).tolist()
    assert sparse.take(everything).tolist() == values.tolist()
    assert sparse.known_indices().tolist() == keep.tolist()
    assert sparse.kept_before(everything).tolist() == [int((keep < i).sum()) for i in everything]
    assert sparse.take_raw(keep).dtype == np.int32
    assert sparse.take_raw(keep).tolist() == dense.reshape(-1)[keep].tolist()
    # Scans visit kept cells only, with the dense scan's hits among them, in table order.
    wanted = np.array([3, 7, 11], dtype=np.int64)
    hits = [
        (int(r), int(c), int(v))
        for rs, cs, vs in sparse.find_cells(lambda v: np.isin(v, wanted), chunk_cells=4)
        for r, c, v in zip(rs, cs, vs, strict=True)
    ]
    full = [
        (int(r), int(c), int(v))
        for rs, cs, vs in DenseTensor(dense).find_cells(lambda v: np.isin(v, wanted), chunk_cells=4)
        for r, c, v in zip(rs, cs, vs, strict=True)
    ]
    assert hits == [h for h in full if h[0] * cols + h[1] in set(keep.tolist())]
    row = int(rng.integers(rows))
    positions, row_values = _row(sparse, row, 0, cols)
    in_row = keep[(keep >= row * cols) & (keep < (row + 1) * cols)] - row * cols
    assert positions.tolist() == in_row.tolist()
    assert row_values.tolist() == dense[row, in_row].tolist()


def _row(table: SparseTensor, row: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """A row's kept cells in `[lo, hi)`, its pieces joined."""
    pieces = list(table.row_cells(row, lo, hi, chunk_cells=1 << 20))
    if not pieces:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate([p for p, _ in pieces]), np.concatenate([v for _, v in pieces])


def test_vectors_read_like_the_dense_lut() -> None:
    lut = np.array([0, 5, 0, 7, 5, 9, -1], dtype=np.int64)
    sparse = kept_part(lut, np.array([1, 2, 4, 6]))
    assert sparse.element(-1) == -1 and sparse.element(1) == 5
    assert sparse.element(3) == 0  # not kept: reads 0
    index, values = sparse.where_equal(np.array([5]), stop=6)
    assert index.tolist() == [1, 4] and values.tolist() == [5, 5]
    dense_index, _ = DenseTensor(lut).where_equal(np.array([5]), stop=6)
    assert dense_index.tolist() == [1, 4]
    values, known = DenseTensor(lut).take_known(np.array([3, 5]))
    assert values.tolist() == [7, 9] and known.all()


@pytest.mark.parametrize("wanted", [[5], [-1], [1 << 40], [5, 9], [0, 1 << 40]])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_where_equal_finds_what_isin_finds(wanted: list[int], dtype: type) -> None:
    """One value is looked up with one compare, several with `isin`: the same answer, in the
    table's own dtype (an int32 LUT never holds 2**40)."""
    lut: np.ndarray = np.array([0, 5, 0, 7, 5, 9, -1, 5], dtype=dtype)
    index, values = DenseTensor(lut).where_equal(np.array(wanted), stop=7)
    expected = np.flatnonzero(np.isin(lut[:7].astype(np.int64), wanted))
    assert index.tolist() == expected.tolist()
    assert values.tolist() == lut[expected].tolist() and values.dtype == np.int64


def test_runs_merge_where_they_touch() -> None:
    assert flat_runs(np.array([2, 3, 4, 7, 9, 10])).tolist() == [[2, 3], [7, 1], [9, 2]]
    assert flat_runs(np.zeros(0, dtype=np.int64)).shape == (0, 2)


@given(flat=st.lists(st.integers(0, 2**50 - 1), max_size=40, unique=True))
def test_gap_runs_read_back_as_the_runs(flat: list[int]) -> None:
    """Format 1.2's run table: (gap, length) in the narrowest unsigned dtype, read back as the
    (start, length) runs it came from, wherever in a 2^50-element tensor they lie."""
    indices = np.array(sorted(flat), dtype=np.int64)
    runs = flat_runs(indices)
    stored = gap_runs(runs)
    assert stored.dtype.kind == "u" and stored.shape == runs.shape
    if stored.size and stored.dtype.itemsize > 1:  # no narrower unsigned dtype holds them
        assert int(stored.max()) >= 2 ** (4 * stored.dtype.itemsize)
    table = sparse_tensor(
        "t", np.zeros(indices.size, np.int8), stored, np.array([2**50]), (1,), gaps=True
    )
    assert table.starts.tolist() == runs[:, 0].tolist()
    assert table.lengths.tolist() == runs[:, 1].tolist()
    assert table.known_indices().tolist() == indices.tolist()


def test_the_narrowest_dtype_holds_the_values_and_widens_to_the_original() -> None:
    assert narrowest_dtype(np.array([0, 200]), "I32") == "U8"
    assert narrowest_dtype(np.array([-1, 200]), "I32") == "I16"
    assert narrowest_dtype(np.array([-1, 40_000]), "I32") == "I32"
    assert narrowest_dtype(np.array([3, 4_000_000_000]), "I64") == "U32"
    assert narrowest_dtype(np.array([2**40, -(2**40)]), "I64") == "I64"
    assert narrowest_dtype(np.array([-1, 5]), "I16") == "I8"
    assert narrowest_dtype(np.array([0, 255]), "U8") == "U8"  # never I8 for a uint8 buffer
    assert narrowest_dtype(np.zeros(0, np.int64), "I64") == "U8"
    assert narrowest_unsigned(np.array([[0, 255], [3, 1]])) == "U8"
    assert narrowest_unsigned(np.array([[2**32, 1]])) == "U64"


@pytest.mark.parametrize(
    ("runs", "dtype", "shape", "words"),
    [
        ([[17, 1]], np.uint8, [4, 4], "outside [0, 16]"),
        ([[2**64 - 1, 1]], np.uint64, [4, 4], "outside [0, 16]"),
        ([[-1, 2]], np.int64, [4, 4], "outside [0, 16]"),
        ([[0, 0]], np.uint8, [4, 4], "length"),
        ([[10, 4], [2, 1]], np.uint8, [4, 4], "past the end"),
        ([[16, 1]], np.uint8, [4, 4], "past the end"),
        # 2^14 steps of 2^51: an int64 sum would wrap around to small numbers
        ([[2**50, 2**50]] * (1 << 14), np.uint64, [2**50], "end past"),
    ],
)
def test_malformed_gap_runs_are_refused(
    runs: list[list[int]], dtype: type, shape: list[int], words: str
) -> None:
    table: np.ndarray = np.array(runs, dtype=dtype).reshape(-1, 2)
    with pytest.raises(TensorShapeError) as caught:
        sparse_tensor(
            "t",
            np.zeros(5, dtype=np.int8),
            table,
            np.array(shape, dtype=np.int64),
            (len(shape),),
            gaps=True,
        )
    assert caught.value.field == "t.runs"
    assert words in str(caught.value)


@pytest.mark.parametrize("path", FORMAT_1_1_DUMPS, ids=lambda p: p.name)
def test_a_format_1_1_dump_still_reads(path: Path, tmp_path: Path) -> None:
    """A shrunk dump from the 1.1 writer (elements in their own dtype, int64 (start, length)
    runs) loads, and reads exactly as its 1.2 rewrite does: the same elements, dtypes,
    findings and diagnosis."""
    old = load_dump(path)
    assert old.metadata["kvcanary.format"] == "1.1" and old.shrink is not None
    rewritten = api.shrink(path, tmp_path / "rewritten.safetensors").path
    new = load_dump(rewritten)
    assert new.metadata["kvcanary.format"] == "1.2"
    sparse = [name for name, info in old.tensors.items() if info.kept is not None]
    assert "req_to_token" in sparse
    for name in sparse:
        assert new.tensors[name].dtype == old.tensors[name].dtype, name
        assert new.tensors[name].nbytes <= old.tensors[name].nbytes, name
    tensors = [(old.req_to_token, new.req_to_token)]
    tensors += [(old.canary_buffers[n], new.canary_buffers[n]) for n in old.canary_buffers]
    if old.full_to_swa_index_mapping is not None:
        assert new.full_to_swa_index_mapping is not None
        tensors.append((old.full_to_swa_index_mapping, new.full_to_swa_index_mapping))
    for before, after in tensors:
        assert after.shape == before.shape and after.dtype == before.dtype
        kept = before.known_indices()
        assert after.known_indices().tolist() == kept.tolist()
        assert after.take_raw(kept).tolist() == before.take_raw(kept).tolist()
    assert old.dtype_notes == new.dtype_notes
    report, again = checked(old), checked(new)
    assert [f.code for f in again.findings] == [f.code for f in report.findings]
    assert [c.code for c in again.diagnosis] == [c.code for c in report.diagnosis]
    assert report.findings  # the fixtures show a bug: there is a story to compare


def test_ring_slots_split_by_launch_tag() -> None:
    ring = np.zeros((4, 8), dtype=np.int64)
    ring[:, 0] = [0, 7, 3, 9]  # HEAD_K_FULL, an SWA tag, a full tag, an SWA tag
    ring[:, 1] = [11, 22, 33, 44]
    full, swa = ring_slots(ring, 3)  # the fourth row is past the write index
    assert full.tolist() == [11, 33] and swa.tolist() == [22]
    full, swa = ring_slots(ring, -5)  # a wrapped counter: the whole ring
    assert swa.tolist() == [22, 44]


@pytest.mark.parametrize(
    ("runs", "shape", "values", "field", "words"),
    [
        ([[0, 3], [2, 2]], [4, 4], 5, "t.runs", "overlapping"),
        ([[2, 2], [0, 1]], [4, 4], 3, "t.runs", "out of order"),
        ([[14, 3]], [4, 4], 3, "t.runs", "past the end"),
        ([[-1, 2]], [4, 4], 2, "t.runs", "negative start"),
        ([[0, 0]], [4, 4], 0, "t.runs", "length"),
        ([[0, 3]], [4, 4], 2, "t.runs", "cover 3 elements but 2"),
        ([[0, 2]], [4, 4, 4], 2, "t.shape", "expected [2]"),
        ([[0, 2]], [1 << 40, 1 << 20], 2, "t.shape", "2^50"),
        ([[0, 2]], [4, -4], 2, "t.shape", "negative"),
    ],
)
def test_malformed_parts_are_refused_naming_the_part(
    runs: list[list[int]], shape: list[int], values: int, field: str, words: str
) -> None:
    with pytest.raises(TensorShapeError) as caught:
        sparse_tensor(
            "t",
            np.zeros(values, dtype=np.int32),
            np.array(runs, dtype=np.int64).reshape(-1, 2),
            np.array(shape, dtype=np.int64),
            (2,),
        )
    assert caught.value.field == field
    assert words in str(caught.value)


def test_the_original_shape_costs_nothing() -> None:
    """A table claiming 2^45 cells with three kept: reads stay sized by what is stored."""
    shape = np.array([1 << 20, 1 << 25], dtype=np.int64)
    runs = np.array([[5 << 25, 3]], dtype=np.int64)
    table = sparse_tensor("t", np.array([7, 8, 9], np.int32), runs, shape, (2,))
    assert table.size == 1 << 45 and table.kept == 3 and not table.complete
    assert _row(table, 5, 0, 1 << 25)[1].tolist() == [7, 8, 9]
    hits = list(table.find_cells(lambda v: v == 8, chunk_cells=1 << 22))
    assert [(int(r[0]), int(c[0])) for r, c, _ in hits] == [(5, 1)]
    cells, known = table.rows(np.array([5, 6]), width=4)
    assert cells.tolist() == [[7, 8, 9, 0], [0, 0, 0, 0]] and known.tolist() == [False, False]
    assert table.row_sequence(5)[:4] == [7, 8, 9, 0] and len(table.row_sequence(5)) == 1 << 25
    with pytest.raises(TypeError, match="keeps 3 of"):
        table.array()  # no dense form of 2^45 cells


def test_format_1_reads_runs_tensors_as_unknown_tensors(tmp_path: Path) -> None:
    """Only a format-1.1 dump stores tensors sparse: in format 1 a `NAME.runs` tensor is just
    a tensor the format does not define, ignored with a note, as before."""
    state = make_scenario("clean-decode", seed=0)
    state.tensors["req_to_token.runs"] = np.zeros((1, 2), dtype=np.int64)
    dump = load_dump(state.save(tmp_path / "v1.safetensors"))
    assert isinstance(dump.req_to_token, DenseTensor) and dump.shrink is None
    assert any("req_to_token.runs" in note for note in dump.notes)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_threaded_scan_holds_few_results_at_once(threads: int) -> None:
    """Results come back in order, and no more than `threads + 1` exist at any time: a scan
    whose every cell matches (slot 0, padding) stays a few chunks in memory."""
    lock = threading.Lock()
    alive = [0, 0]  # now, most

    def work(item: int) -> int:
        with lock:
            alive[0] += 1
            alive[1] = max(alive[1], alive[0])
        return item

    seen = []
    for result in _in_order(work, range(40), threads):
        seen.append(result)
        with lock:
            alive[0] -= 1
    assert seen == list(range(40))
    assert alive[1] <= threads + 1
