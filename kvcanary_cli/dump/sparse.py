"""`SparseTensor`: a tensor of a shrunk dump (format 1.1 or 1.2), of which only some elements
are stored.

`kvcanary shrink` keeps what the analysis of a dump reads and drops the rest. A sparse tensor
keeps its original shape, so pool rows, positions, slots and lengths keep their original
values; its kept elements are stored as runs of consecutive flat (row-major) indices. An
element that was not kept is unknown: it reads as 0, and the reads that say so say so.
Format 1.2 stores the elements in a narrower dtype than the original's and the runs as
(gap, length) pairs (`dump.narrow`); reads hand back the original dtype either way.

It answers every read of `dump.tensor.StoredTensor` (the one type other layers see), so
analysis has one path for dense and shrunk dumps. Nothing here allocates by the original
shape: work and memory follow the stored elements. Only `dump/` imports this module.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterator, Sequence
from typing import overload

import numpy as np

from kvcanary_cli.dump.narrow import narrowest_unsigned
from kvcanary_cli.dump.schema import INTEGER_DTYPES, LaunchTag
from kvcanary_cli.dump.tensor import CellHits, Match, StoredTensor, distinct
from kvcanary_cli.errors import TensorShapeError

__all__ = [
    "MAX_ELEMENTS",
    "SparseTensor",
    "flat_runs",
    "gap_runs",
    "ring_slots",
    "sparse_tensor",
]

#: No tensor of a real dump has more elements (the header reader bounds bytes the same way).
MAX_ELEMENTS = 1 << 50
#: reads located at a time by `SparseTensor.take_known` (bounds its temporaries).
_TAKE_CHUNK = 1 << 20


class SparseTensor(StoredTensor):
    """The kept elements of a tensor of `shape`, as runs of flat indices.

    `starts` and `lengths` (int64) describe disjoint runs in increasing order; `values` holds
    the runs' elements one after the other, in the stored dtype, which widens to `dtype` (the
    original's, default the stored one): reads that keep the dtype give `dtype`.
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        starts: np.ndarray,
        lengths: np.ndarray,
        values: np.ndarray,
        dtype: np.dtype | None = None,
    ) -> None:
        self.shape = shape
        self.dtype = values.dtype if dtype is None else np.dtype(dtype)
        self.starts = starts
        self.lengths = lengths
        self.values = values
        self.offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])

    @property
    def kept(self) -> int:
        """Elements stored."""
        return int(self.values.shape[0])

    def array(self) -> np.ndarray:
        """The stored elements in the original shape, when they are all of them."""
        if not self.complete:
            raise TypeError(
                f"this tensor keeps {self.kept} of {self.size} elements (a shrunk dump): "
                "read it with take()"
            )
        return np.asarray(self.values, dtype=self.dtype).reshape(self.shape)

    def _locate(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index into `values`, kept) of each flat index; any int64 index is accepted."""
        flat = np.asarray(flat, dtype=np.int64)
        run = np.searchsorted(self.starts, flat, side="right") - 1
        safe = np.clip(run, 0, None)
        if self.starts.size == 0:
            return np.zeros(flat.shape, dtype=np.int64), np.zeros(flat.shape, dtype=bool)
        offset = flat - self.starts[safe]
        known = (run >= 0) & (offset >= 0) & (offset < self.lengths[safe])
        return np.where(known, self.offsets[safe] + offset, 0), known

    def kept_before(self, flat: np.ndarray) -> np.ndarray:
        """How many kept elements have a flat index below each of `flat` (int64)."""
        flat = np.asarray(flat, dtype=np.int64)
        if self.starts.size == 0:
            return np.zeros(flat.shape, dtype=np.int64)
        run = np.searchsorted(self.starts, flat, side="right") - 1
        safe = np.clip(run, 0, None)
        inside = np.clip(flat - self.starts[safe], 0, self.lengths[safe])
        return np.where(run >= 0, self.offsets[safe] + inside, 0)

    def take(self, flat: np.ndarray) -> np.ndarray:
        """int64 values at `flat` (0 where not kept)."""
        return self.take_known(flat)[0]

    def take_known(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """int64 values at `flat` (0 where not kept) and whether each was kept (located
        `_TAKE_CHUNK` at a time: ten million reads never hold five int64 temporaries each)."""
        flat = np.asarray(flat, dtype=np.int64)
        if flat.size > _TAKE_CHUNK:
            values = np.zeros(flat.shape, dtype=np.int64)
            known = np.zeros(flat.shape, dtype=bool)
            flat_1d, values_1d, known_1d = flat.reshape(-1), values.reshape(-1), known.reshape(-1)
            for a in range(0, flat_1d.size, _TAKE_CHUNK):
                b = a + _TAKE_CHUNK
                values_1d[a:b], known_1d[a:b] = self.take_known(flat_1d[a:b])
            return values, known
        at, known = self._locate(flat)
        values = np.zeros(at.shape, dtype=np.int64)
        if known.any():
            values[known] = self.values[at[known]]
        return values, known

    def take_raw(self, flat: np.ndarray) -> np.ndarray:
        """Values at kept flat indices, in the original dtype (the caller passes kept ones)."""
        at, known = self._locate(flat)
        if not known.all():
            raise ValueError("take_raw needs kept indices")
        return np.asarray(self.values[at], dtype=self.dtype)

    def known(self, flat: np.ndarray) -> np.ndarray:
        """Which of `flat` were kept."""
        return self._locate(flat)[1]

    def known_indices(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Every kept flat index in `[lo, hi)`, in order (int64)."""
        hi = self.size if hi is None else hi
        first = max(int(np.searchsorted(self.starts, lo, side="right")) - 1, 0)
        last = int(np.searchsorted(self.starts, hi, side="left"))
        starts, lengths = self.starts[first:last], self.lengths[first:last]
        if starts.size == 0:
            return np.zeros(0, dtype=np.int64)
        total = int(lengths.sum())
        base = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        flat = base + np.arange(total, dtype=np.int64)
        return flat[(flat >= lo) & (flat < hi)]

    def _kept_in(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(range, flat index, index into `values`) of every kept element of each flat range
        `[lo[i], hi[i])`, range by range, in order: one pass over the runs each range meets,
        so the work follows the kept elements found (and one step per range)."""
        first = np.clip(np.searchsorted(self.starts, lo, side="right") - 1, 0, None)
        last = np.searchsorted(self.starts, hi, side="left")
        count = np.maximum(last - first, 0)
        pairs = int(count.sum())
        if pairs == 0:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        which = np.repeat(np.arange(lo.size, dtype=np.int64), count)
        run = np.arange(pairs, dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
        run += np.repeat(first, count)
        start = self.starts[run]
        a = np.maximum(start, lo[which])
        b = np.minimum(start + self.lengths[run], hi[which])
        length = np.maximum(b - a, 0)
        total = int(length.sum())
        step = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(length) - length, length)
        flat = np.repeat(a, length) + step
        at = np.repeat(self.offsets[run] + (a - start), length) + step
        return np.repeat(which, length), flat, at

    def rows(self, rows: np.ndarray, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The rows' kept cells in place, the others 0."""
        index = np.asarray(rows, dtype=np.int64).reshape(-1)
        self._check_rows(index)
        cols, width = int(self.shape[1]), self._width(width)
        out = np.zeros((index.size, width), dtype=self.dtype)
        lo = index * cols
        which, flat, at = self._kept_in(lo, lo + width)
        out[which, flat - lo[which]] = self.values[at]
        return out, np.bincount(which, minlength=index.size) == width

    def row_cells(
        self, row: int, lo: int, hi: int, *, chunk_cells: int
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The kept cells of the range, in pieces."""
        self._check_rows(np.array([row], dtype=np.int64))
        cols = int(self.shape[1])
        lo, hi = max(lo, 0), min(hi, cols)
        flat = self.known_indices(row * cols + lo, row * cols + max(hi, lo))
        step = max(chunk_cells, 1)
        for a in range(0, flat.size, step):
            part = flat[a : a + step]
            yield part - row * cols, self.take(part)

    def find_cells(
        self, match: Match, *, chunk_cells: int, threads: int = 1
    ) -> Generator[CellHits, None, None]:
        """The kept cells only, `chunk_cells` at a time (one thread: the work is small), each
        chunk's flat indices made as it is read: ten million kept cells are never ten million
        int64 indices at once."""
        cols = max(int(self.shape[1]), 1)
        step = max(chunk_cells, 1)
        for a in range(0, self.kept, step):
            part = self._kept_flat(a, min(a + step, self.kept))
            values = np.asarray(self.values[a : a + part.size], dtype=np.int64)
            hit = np.flatnonzero(match(values))
            if hit.size:
                yield part[hit] // cols, part[hit] % cols, values[hit]

    def _kept_flat(self, a: int, b: int) -> np.ndarray:
        """The flat indices of the kept elements `values[a:b]` (int64, in order)."""
        first = int(np.searchsorted(self.offsets, a, side="right")) - 1
        last = int(np.searchsorted(self.offsets, b, side="left"))  # runs first .. last - 1
        begin = np.maximum(self.offsets[first:last], a)
        end = np.minimum(self.offsets[first + 1 : last + 1], b)
        length = end - begin
        base = self.starts[first:last] + (begin - self.offsets[first:last])
        shift = np.repeat(base - (np.cumsum(length) - length), length)
        return shift + np.arange(b - a, dtype=np.int64)

    def where_equal(self, wanted: np.ndarray, *, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Among the kept elements below `stop`."""
        wanted = np.asarray(wanted, dtype=np.int64)
        index = self.known_indices(0, stop)
        values = np.asarray(self.values[: index.size], dtype=np.int64)
        hit = np.isin(values, wanted)
        return index[hit], values[hit]

    def sequence(self) -> Sequence[int]:
        """The kept elements behind list-like reads."""
        index = self.known_indices()
        return _KeptSequence(index, self.take(index), int(self.shape[0]))

    def row_sequence(self, row: int) -> Sequence[int]:
        """The row's kept cells behind list-like reads."""
        self._check_rows(np.array([row], dtype=np.int64))
        cols = int(self.shape[1])
        flat = self.known_indices(row * cols, (row + 1) * cols)
        return _KeptSequence(flat - row * cols, self.take(flat), cols)


class _KeptSequence(Sequence[int]):
    """List-like reads of part of a sparse tensor: the kept elements, 0 for the others; a
    negative index counts from the end, as a list's does."""

    def __init__(self, index: np.ndarray, values: np.ndarray, length: int) -> None:
        self._values: dict[int, int] = dict(zip(index.tolist(), values.tolist(), strict=True))
        self._length = length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[int]: ...
    def __getitem__(self, i: int | slice) -> int | Sequence[int]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._length))]
        at = i + self._length if i < 0 else i
        if not 0 <= at < self._length:
            raise IndexError("index out of range")
        return self._values.get(at, 0)


def flat_runs(flat: np.ndarray) -> np.ndarray:
    """Sorted unique flat indices as runs `[k, 2]` of (start, length), merged where they touch."""
    flat = np.asarray(flat, dtype=np.int64)
    if flat.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    breaks = np.flatnonzero(np.diff(flat) != 1) + 1
    starts = flat[np.r_[0, breaks]]
    ends = np.r_[flat[breaks - 1] + 1, flat[-1] + 1]
    return np.stack([starts, ends - starts], axis=1).astype(np.int64)


def gap_runs(runs: np.ndarray) -> np.ndarray:
    """Runs `[k, 2]` of (start, length) as format 1.2 stores them: (gap, length), the gap
    being the elements skipped since the previous run's end (the first: since 0), in the
    narrowest unsigned dtype. Gaps stay small where starts grow large."""
    table = np.asarray(runs, dtype=np.int64).reshape(-1, 2)
    ends = table[:, 0] + table[:, 1]
    gaps = table[:, 0] - np.concatenate([np.zeros(1, dtype=np.int64), ends])[:-1]
    pairs = np.stack([gaps, table[:, 1]], axis=1)
    return pairs.astype(INTEGER_DTYPES[narrowest_unsigned(pairs)])


def ring_slots(ring: np.ndarray | None, write_index: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(full-pool, SWA-pool) slots the valid rows of a violation ring name (sorted, unique)."""
    if ring is None or write_index is None:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    rows = np.asarray(ring, dtype=np.int64).reshape(-1, 8)
    valid = rows.shape[0] if write_index < 0 else min(write_index, rows.shape[0])
    tag, slot = rows[:valid, 0], rows[:valid, 1]
    swa = (tag >= int(LaunchTag.HEAD_K_SWA)) & (tag < len(LaunchTag))
    full = (tag >= 0) & (tag < int(LaunchTag.HEAD_K_SWA))
    return distinct(slot[full]), distinct(slot[swa])


def sparse_tensor(
    name: str,
    values: np.ndarray,
    runs: np.ndarray,
    shape: np.ndarray,
    ranks: tuple[int, ...],
    *,
    gaps: bool = False,
    dtype: np.dtype | None = None,
) -> SparseTensor:
    """Check the three stored parts of sparse tensor `name` and join them; `TensorShapeError`
    naming the part at fault. Every check is bounded by what the file stores. `gaps`: the
    runs are format 1.2's (gap, length) pairs (`gap_runs`), not (start, length); `dtype`:
    the original dtype, which the stored one widens to (the caller checked it)."""
    if values.ndim != 1:
        raise TensorShapeError(
            f"a sparse tensor stores its kept elements 1-D, found shape {list(values.shape)}",
            field=name,
        )
    if shape.ndim != 1 or int(shape.shape[0]) not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise TensorShapeError(
            f"has shape {list(shape.shape)}, expected [{want}] (the original shape)",
            field=f"{name}.shape",
        )
    dims = tuple(int(d) for d in shape.tolist())
    if any(d < 0 or d > MAX_ELEMENTS for d in dims) or math.prod(dims) > MAX_ELEMENTS:
        raise TensorShapeError(
            f"original shape {list(dims)} is not a real tensor's (negative or > 2^50 elements)",
            field=f"{name}.shape",
        )
    if runs.ndim != 2 or int(runs.shape[1]) != 2:
        pair = "gap, length" if gaps else "flat start, length"
        raise TensorShapeError(
            f"has shape {list(runs.shape)}, expected [runs, 2] ({pair})",
            field=f"{name}.runs",
        )
    numel = math.prod(dims)
    # a copy: the runs are checked, then trusted
    table = _starts_from_gaps(name, runs, numel) if gaps else np.array(runs, dtype=np.int64)
    starts, lengths = table[:, 0].copy(), table[:, 1].copy()
    if starts.size:
        if (lengths < 1).any() or (lengths > numel).any() or (starts < 0).any():
            raise TensorShapeError(
                "holds a run with a negative start or a length outside [1, numel]",
                field=f"{name}.runs",
            )
        if (starts > numel - lengths).any():
            raise TensorShapeError(
                f"holds a run past the end of the original tensor ({numel} elements)",
                field=f"{name}.runs",
            )
        if (starts[1:] < starts[:-1] + lengths[:-1]).any():
            raise TensorShapeError(
                "holds runs out of order or overlapping (expected increasing, disjoint runs)",
                field=f"{name}.runs",
            )
    kept = int(lengths.sum()) if lengths.size else 0  # <= numel: the runs are disjoint
    if kept != int(values.shape[0]):
        raise TensorShapeError(
            f"the runs cover {kept} elements but {int(values.shape[0])} are stored",
            field=f"{name}.runs",
        )
    return SparseTensor(dims, starts, lengths, values, dtype)


def _starts_from_gaps(name: str, runs: np.ndarray, numel: int) -> np.ndarray:
    """Format 1.2's runs (gap, length; an unsigned dtype) as (start, length) int64, refusing
    a gap or length beyond the tensor and runs that end past it."""
    if runs.size and ((runs < 0) | (runs > numel)).any():  # in the stored dtype: no wrap
        raise TensorShapeError(
            f"holds a gap or length outside [0, {numel}] (the original tensor's elements)",
            field=f"{name}.runs",
        )
    pairs = runs.astype(np.int64)  # each at most 2^50 now
    steps = pairs[:, 0] + pairs[:, 1]
    # summed in float first, so that the exact sum below cannot wrap around
    if float(steps.sum(dtype=np.float64)) > 2.0 * numel + 1:
        raise TensorShapeError(
            f"holds runs that end past the original tensor ({numel} elements)",
            field=f"{name}.runs",
        )
    ends = np.cumsum(steps)
    return np.stack([ends - pairs[:, 1], pairs[:, 1]], axis=1)
