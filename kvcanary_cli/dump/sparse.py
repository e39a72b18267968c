"""Sparse tensors of a shrunk dump (format 1.1): only some elements of a tensor are stored.

`kvcanary shrink` keeps what the analysis of a dump reads and drops the rest. A sparse tensor
keeps its original shape, so pool rows, positions, slots and lengths keep their original
values; its kept elements are stored as runs of consecutive flat (row-major) indices. An
element that was not kept is unknown: it reads as 0, and `take_known` says which were kept.

The helpers here take a dense tensor (format 1: every element known) or a `SparseArray`
alike, so analysis code has one path for both, and the dense path is what it always was.
Nothing here allocates by the original shape: work and memory follow the stored elements.
"""

from __future__ import annotations

import math
import mmap
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeAlias, TypeVar

import numpy as np

from kvcanary_cli.dump.schema import LaunchTag
from kvcanary_cli.errors import TensorShapeError

__all__ = [
    "MAX_ELEMENTS",
    "SparseArray",
    "Stored",
    "dense",
    "element",
    "find_cells",
    "flat_runs",
    "is_sparse",
    "ring_slots",
    "row_cells",
    "sparse_array",
    "take",
    "take_known",
    "take_raw",
    "where_equal",
]

_T = TypeVar("_T")

#: No tensor of a real dump has more elements (the header reader bounds bytes the same way).
MAX_ELEMENTS = 1 << 50


class SparseArray:
    """The kept elements of a tensor of `shape`, as runs of flat indices.

    `starts` and `lengths` (int64) describe disjoint runs in increasing order; `values` holds
    the runs' elements one after the other, in the stored dtype (memory-mapped).
    """

    def __init__(
        self, shape: tuple[int, ...], starts: np.ndarray, lengths: np.ndarray, values: np.ndarray
    ) -> None:
        self.shape = shape
        self.starts = starts
        self.lengths = lengths
        self.values = values
        self.offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])

    @property
    def ndim(self) -> int:
        """Dimensions of the original tensor."""
        return len(self.shape)

    def numel(self) -> int:
        """Elements of the original tensor (kept or not), like `torch.Tensor.numel`."""
        return math.prod(self.shape)

    @property
    def size(self) -> int:
        """Elements of the original tensor, like `numpy.ndarray.size`."""
        return self.numel()

    @property
    def kept(self) -> int:
        """Elements stored."""
        return int(self.values.shape[0])

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

    def take(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """int64 values at `flat` (0 where not kept) and whether each was kept."""
        at, known = self._locate(flat)
        values = np.zeros(at.shape, dtype=np.int64)
        if known.any():
            values[known] = self.values[at[known]]
        return values, known

    def take_raw(self, flat: np.ndarray) -> np.ndarray:
        """Values at kept flat indices, in the stored dtype (the caller passes kept ones)."""
        at, known = self._locate(flat)
        if not known.all():
            raise ValueError("take_raw needs kept indices")
        return np.asarray(self.values[at])

    def flat_indices(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Every kept flat index in `[lo, hi)`, in order (int64)."""
        hi = self.numel() if hi is None else hi
        first = max(int(np.searchsorted(self.starts, lo, side="right")) - 1, 0)
        last = int(np.searchsorted(self.starts, hi, side="left"))
        starts, lengths = self.starts[first:last], self.lengths[first:last]
        if starts.size == 0:
            return np.zeros(0, dtype=np.int64)
        total = int(lengths.sum())
        base = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        flat = base + np.arange(total, dtype=np.int64)
        return flat[(flat >= lo) & (flat < hi)]


#: A tensor of a dump as analysis sees it: dense (memory-mapped or read) or sparse (shrunk dumps).
Stored: TypeAlias = np.ndarray | SparseArray


def is_sparse(array: object) -> bool:
    """True for the kept part of a tensor of a shrunk dump."""
    return isinstance(array, SparseArray)


def take(array: Stored, flat: np.ndarray) -> np.ndarray:
    """int64 values at flat indices inside the array; elements not kept read as 0."""
    if isinstance(array, SparseArray):
        return array.take(flat)[0]
    return np.asarray(array.reshape(-1)[flat], dtype=np.int64)


def take_known(array: Stored | np.ndarray, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int64 values at flat indices inside the array, and which of them are known (all, for a
    dense array)."""
    if isinstance(array, SparseArray):
        return array.take(flat)
    values = np.asarray(array.reshape(-1)[np.asarray(flat, dtype=np.int64)], dtype=np.int64)
    return values, np.ones(values.shape, dtype=bool)


def take_raw(array: Stored, flat: np.ndarray) -> np.ndarray:
    """Values at known flat indices in the stored dtype (what a writer copies)."""
    if isinstance(array, SparseArray):
        return array.take_raw(flat)
    return np.asarray(array.reshape(-1)[np.asarray(flat, dtype=np.int64)])


def dense(array: Stored) -> np.ndarray:
    """A dense tensor, for code that only runs on format-1 dumps (tests, benchmarks)."""
    if isinstance(array, SparseArray):
        raise TypeError("this tensor is sparse (a shrunk dump): read it with take()")
    return array


def element(array: Stored, index: int) -> int:
    """One element of a 1-D array (negative: from the end); 0 when not kept."""
    length = int(array.shape[0])
    at = index + length if index < 0 else index
    if not isinstance(array, SparseArray):
        return int(array[at])
    values, _ = array.take(np.array([at], dtype=np.int64))
    return int(values[0])


def find_cells(
    table: Stored,
    match: Callable[[np.ndarray], np.ndarray],
    *,
    chunk_cells: int,
    mapped: np.memmap | None = None,
    threads: int = 1,
) -> Generator[tuple[np.ndarray, np.ndarray, np.ndarray], None, None]:
    """(rows, cols, values) of the cells of a 2-D table whose int64 value `match` accepts.

    `match` takes integer values (any shape and integer dtype) and returns a mask of that
    shape; the values yielded are int64. A dense table is scanned in chunks of about
    `chunk_cells` cells, in order, by up to `threads` threads (numpy lets go of the GIL while
    it compares, so two cores scan about twice as fast; `match` must be thread-safe); a sparse
    one visits its kept cells only. `mapped`, the file mapping behind a dense `table`, lets
    the scan hand each chunk's pages back once read, so a scan of a 2 GB table does not keep
    2 GB resident.
    """
    cols = max(int(table.shape[1]), 1)
    if isinstance(table, SparseArray):
        flat = table.flat_indices()
        for a in range(0, flat.size, chunk_cells):
            part = flat[a : a + chunk_cells]
            values = np.asarray(table.values[a : a + part.size], dtype=np.int64)
            hit = np.flatnonzero(match(values))
            if hit.size:
                yield part[hit] // cols, part[hit] % cols, values[hit]
        return
    # several threads share the chunk size: what is in flight stays about one chunk's worth
    step = max(1, chunk_cells // max(threads, 1) // cols)
    table_rows = int(table.shape[0]) if table.size else 0  # no bytes, nothing to scan

    def scan(r0: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        chunk = table[r0 : r0 + step]
        # flat, not 2-D: np.nonzero of a 2-D mask costs ~40x more than flatnonzero of it
        hits = np.flatnonzero(match(chunk))
        found = (hits // cols + r0, hits % cols, chunk.reshape(-1)[hits].astype(np.int64))
        if mapped is not None:
            release_pages(mapped, r0 * cols, min(r0 + step, table_rows) * cols)
        return found

    for found in _in_order(scan, range(0, table_rows, step), threads):
        if found[0].size:
            yield found


def _in_order(work: Callable[[int], _T], items: Iterable[int], threads: int) -> Iterator[_T]:
    """`work(item)` for each item, on up to `threads` threads, yielded in item order. While
    the caller handles one result, each thread works on (or holds) one more: never more than
    `threads + 1` results exist at once, so memory stays that of a few chunks."""
    if threads <= 1:
        yield from map(work, items)
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="kvcanary-scan") as pool:
        pending: deque[Future[_T]] = deque()
        try:
            for item in items:
                pending.append(pool.submit(work, item))
                if len(pending) > threads:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:  # the caller stopped early, or a chunk raised: drop what has not started
            for future in pending:
                future.cancel()


def release_pages(mapped: np.memmap, start: int, stop: int) -> None:
    """Drop from this process the whole pages of elements `[start, stop)` of a read-only
    file mapping: they leave its resident set, and a later read maps them again from the
    file (the page cache). Only for a copy-on-write or read-only mapping never written to,
    where dropping a page loses nothing; anything else is left alone."""
    region = getattr(mapped, "_mmap", None)
    if region is None or mapped.mode not in ("c", "r") or not hasattr(region, "madvise"):
        return
    page = mmap.PAGESIZE
    base = int(mapped.offset) % mmap.ALLOCATIONGRANULARITY  # where the array starts in `region`
    first = base + start * mapped.itemsize
    last = base + stop * mapped.itemsize
    first, last = -(-first // page) * page, (last // page) * page  # whole pages only
    if last > first:
        region.madvise(mmap.MADV_DONTNEED, first, last - first)


def where_equal(vector: Stored, wanted: np.ndarray, *, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices `i < stop` (in order) whose element is one of `wanted`, and those elements."""
    wanted = np.asarray(wanted, dtype=np.int64)
    if isinstance(vector, SparseArray):
        index = vector.flat_indices(0, stop)
        values = np.asarray(vector.values[: index.size], dtype=np.int64)
        hit = np.isin(values, wanted)
        return index[hit], values[hit]
    body = vector[:stop]
    # one value (the usual question: which full slots map to this SWA slot) is one compare
    hits = np.flatnonzero(body == int(wanted[0]) if wanted.size == 1 else np.isin(body, wanted))
    return hits.astype(np.int64), body[hits].astype(np.int64)


def row_cells(table: SparseArray, row: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions, int64 values) of the kept cells of `row` in positions `[lo, hi)`."""
    cols = int(table.shape[1])
    flat = table.flat_indices(row * cols + lo, row * cols + hi)
    values, _ = table.take(flat)
    return flat - row * cols, values


def flat_runs(flat: np.ndarray) -> np.ndarray:
    """Sorted unique flat indices as runs `[k, 2]` of (start, length), merged where they touch."""
    flat = np.asarray(flat, dtype=np.int64)
    if flat.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    breaks = np.flatnonzero(np.diff(flat) != 1) + 1
    starts = flat[np.r_[0, breaks]]
    ends = np.r_[flat[breaks - 1] + 1, flat[-1] + 1]
    return np.stack([starts, ends - starts], axis=1).astype(np.int64)


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
    return np.unique(slot[full]), np.unique(slot[swa])


def sparse_array(
    name: str, values: np.ndarray, runs: np.ndarray, shape: np.ndarray, ranks: tuple[int, ...]
) -> SparseArray:
    """Check the three stored parts of sparse tensor `name` and join them; `TensorShapeError`
    naming the part at fault. Every check is bounded by what the file stores."""
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
        raise TensorShapeError(
            f"has shape {list(runs.shape)}, expected [runs, 2] (flat start, length)",
            field=f"{name}.runs",
        )
    numel = math.prod(dims)
    table = np.array(runs, dtype=np.int64)  # a copy: the runs are checked, then trusted
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
    return SparseArray(dims, starts, lengths, values)
