"""`StoredTensor`: a big tensor of a dump behind one set of reads, whatever stores it.

A format-1 dump stores every element of its tables, LUT, canary buffers and real-KV sources
(`DenseTensor`: a numpy array, memory-mapped when big); a shrunk dump (format 1.1 or 1.2) stores
only some (`dump.sparse`). Planners, canary checks and analysis read both through the
methods here and never ask which kind they hold: where the kinds genuinely differ (a shrunk
dump's unknown elements read 0), a read says which elements are known, and `complete` says
whether every one is. Only `dump/` builds tensors or knows their kinds.

Every read is vectorized and sized by the indices asked for or by what the file stores,
never by a shape the file claims; a scan of a memory-mapped table hands its pages back.
"""

from __future__ import annotations

import math
import mmap
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeAlias, TypeVar

import numpy as np

__all__ = [
    "CellHits",
    "DenseTensor",
    "Match",
    "StoredTensor",
    "common",
    "difference",
    "distinct",
    "fold_at",
    "release_pages",
    "union",
]

_T = TypeVar("_T")

#: (rows, cols, int64 values) of the cells a scan found.
CellHits: TypeAlias = tuple[np.ndarray, np.ndarray, np.ndarray]
#: A scan's test: integer values (any shape and integer dtype) to a mask of that shape.
Match: TypeAlias = Callable[[np.ndarray], np.ndarray]


def distinct(values: Any) -> np.ndarray:
    """The distinct values, sorted: `np.unique(values)` by one sort. numpy 2.4's `np.unique`
    hashes, and is 15 to 60 times slower on 10^5 to 10^6 distinct ints (3.6 s for 3.5 million
    slots, where a sort takes 0.06 s); its `union1d`, `setdiff1d` and `intersect1d` call it
    (here: `union`, `difference`, `common`)."""
    ordered = np.sort(np.asarray(values).reshape(-1))
    if ordered.size < 2:
        return ordered
    keep = np.empty(ordered.size, dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    unique: np.ndarray = ordered[keep]
    return unique


def union(*arrays: Any) -> np.ndarray:
    """`np.union1d` of any number of arrays (sorted, distinct), by one sort (`distinct`)."""
    return distinct(np.concatenate([np.asarray(a).reshape(-1) for a in arrays]))


def difference(values: Any, removed: Any) -> np.ndarray:
    """`np.setdiff1d(values, removed)`: the distinct values not in `removed`, sorted."""
    return np.setdiff1d(distinct(values), distinct(removed), assume_unique=True)


def common(a: Any, b: Any) -> np.ndarray:
    """`np.intersect1d(a, b)`: the distinct values in both, sorted."""
    return np.intersect1d(distinct(a), distinct(b), assume_unique=True)


#: Below this many values, `fold_at` is `ufunc.at` as it is (finding the runs costs more).
_FOLD_RUNS_FROM = 4096


def fold_at(ufunc: np.ufunc, out: np.ndarray, keys: np.ndarray, values: np.ndarray) -> None:
    """`ufunc.at(out, keys, values)` for an associative ufunc (`np.minimum`, `np.maximum`,
    `np.add`, `np.bitwise_or`), each run of equal consecutive keys reduced first (`reduceat`):
    a dump's cells hold their keys in long runs (a row's cells share their batch row; a
    hostile dump's one slot fills every cell), and `ufunc.at` costs tens of nanoseconds a
    value (seconds for ten million), where a few thousand runs cost a few thousand. Keys
    with no runs to speak of go to `ufunc.at` as they are."""
    if keys.size < _FOLD_RUNS_FROM:
        ufunc.at(out, keys, values)
        return
    change = keys[1:] != keys[:-1]
    changes = int(np.count_nonzero(change))
    if 4 * changes > keys.size:
        ufunc.at(out, keys, values)
        return
    starts = np.empty(changes + 1, dtype=np.intp)
    starts[0] = 0
    starts[1:] = np.flatnonzero(change) + 1
    ufunc.at(out, keys[starts], ufunc.reduceat(values, starts))


class StoredTensor(ABC):
    """One tensor of a dump in its original coordinates: flat (row-major) indices, rows and
    positions are the original's, whichever elements the file stores.

    An element the file does not store is unknown: it reads as 0, and `take_known`,
    `known` and `rows` say which are known. Unless a method says otherwise, flat indices
    must lie in `[0, size)` and rows in `[0, shape[0])`.
    """

    #: the original shape (a shrunk dump's claimed one: reads never allocate by it).
    shape: tuple[int, ...]
    #: the dtype the file stores the elements in.
    dtype: np.dtype[Any]

    @property
    def ndim(self) -> int:
        """Dimensions of the original tensor."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Elements of the original tensor, known or not (like `numpy.ndarray.size`)."""
        return math.prod(self.shape)

    @property
    @abstractmethod
    def kept(self) -> int:
        """Elements the file stores (all of them for a dense tensor)."""

    @property
    def complete(self) -> bool:
        """Every element is known: `array()` can hand the whole tensor over."""
        return self.kept == self.size

    @abstractmethod
    def array(self) -> np.ndarray:
        """The whole tensor as a numpy array in the stored dtype (the memory-mapped table
        itself when it is mapped: no copy). `TypeError` unless `complete`: a tensor with
        unknown elements has no honest dense form."""

    @abstractmethod
    def take(self, flat: np.ndarray) -> np.ndarray:
        """int64 values at flat indices; unknown elements read 0."""

    @abstractmethod
    def take_known(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """int64 values at flat indices (0 where unknown) and which of them are known."""

    @abstractmethod
    def take_raw(self, flat: np.ndarray) -> np.ndarray:
        """Values at known flat indices in the stored dtype (what a writer copies);
        `ValueError` if one is unknown."""

    @abstractmethod
    def known(self, flat: np.ndarray) -> np.ndarray:
        """Which of `flat` (any int64: outside `[0, size)` is never known) are known."""

    @abstractmethod
    def kept_before(self, flat: np.ndarray) -> np.ndarray:
        """How many known elements have a flat index below each of `flat` (any int64)."""

    @abstractmethod
    def known_indices(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Every known flat index in `[lo, hi)` (clipped to the tensor), in order (int64)."""

    def element(self, index: int) -> int:
        """One element of a 1-D tensor (negative: from the end, as in Python); 0 when
        unknown; `IndexError` outside `[-len, len)`."""
        length = int(self.shape[0])
        at = index + length if index < 0 else index
        if not 0 <= at < length:
            raise IndexError(f"index {index} is outside a tensor of {length} elements")
        return int(self.take(np.array([at], dtype=np.int64))[0])

    @abstractmethod
    def rows(self, rows: np.ndarray, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The first `width` cells (default: all) of each of `rows` of a 2-D tensor, as a
        new C-contiguous `[len(rows), width]` array in the stored dtype (unknown cells 0;
        the caller may write to it), and whether each row's cells are all known.
        `IndexError` for a row outside the table."""

    @abstractmethod
    def row_cells(
        self, row: int, lo: int, hi: int, *, chunk_cells: int
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(positions, int64 values) of the known cells of `row` in positions `[lo, hi)`
        (clipped to the row), in order, in pieces of at most `chunk_cells` cells: memory
        stays a piece's, work follows the cells the file stores."""

    @abstractmethod
    def find_cells(
        self, match: Match, *, chunk_cells: int, threads: int = 1
    ) -> Generator[CellHits, None, None]:
        """(rows, cols, int64 values) of the known cells of a 2-D table whose value `match`
        accepts, in table order, in pieces (empty ones are not yielded).

        A dense table is scanned in chunks of about `chunk_cells` cells by up to `threads`
        threads (numpy lets go of the GIL while it compares, so two cores scan about twice
        as fast; `match` must be thread-safe), and a memory-mapped one hands each chunk's
        pages back once read, so a scan of a 2 GB table does not keep 2 GB resident. A
        shrunk table visits its stored cells only."""

    @abstractmethod
    def where_equal(self, wanted: np.ndarray, *, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Known indices `i < stop` of a 1-D tensor (in order) whose element is one of
        `wanted`, and those elements (both int64)."""

    @abstractmethod
    def sequence(self) -> Sequence[int]:
        """A 1-D tensor as a Python sequence of ints (unknown elements 0), for the scalar
        reference planner: Python indexing, as SGLang's torch reference does."""

    @abstractmethod
    def row_sequence(self, row: int) -> Sequence[int]:
        """One row of a 2-D tensor as a Python sequence of ints (unknown cells 0)."""

    def _check_rows(self, rows: np.ndarray) -> None:
        if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= int(self.shape[0])):
            raise IndexError(f"a row is outside a table of {int(self.shape[0])} rows")

    def _width(self, width: int | None) -> int:
        cols = int(self.shape[1])
        return cols if width is None else min(max(int(width), 0), cols)


class DenseTensor(StoredTensor):
    """Every element stored: a numpy array, read or memory-mapped from the file.

    `mapping` is the read-only (or copy-on-write) file mapping behind the array, if any:
    a whole-table scan hands its pages back as it goes (`find_cells`). Loaded tables are
    read-only by contract: nothing in kvcanary writes to them.
    """

    def __init__(self, array: np.ndarray, *, mapping: np.memmap | None = None) -> None:
        self._array = array
        self._mapping = mapping
        self.shape = tuple(int(d) for d in array.shape)
        self.dtype = array.dtype

    @property
    def size(self) -> int:
        """Elements of the tensor."""
        return int(self._array.size)

    @property
    def kept(self) -> int:
        """Every element is stored."""
        return int(self._array.size)

    @property
    def complete(self) -> bool:
        """Always: every element is stored."""
        return True

    def array(self) -> np.ndarray:
        """The array itself (mapped or read)."""
        return self._array

    def take(self, flat: np.ndarray) -> np.ndarray:
        """int64 values at flat indices."""
        return np.asarray(self._array.reshape(-1)[flat], dtype=np.int64)

    def take_known(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """int64 values at flat indices, all known."""
        flat = np.asarray(flat, dtype=np.int64)
        values = np.asarray(self._array.reshape(-1)[flat], dtype=np.int64)
        return values, np.ones(values.shape, dtype=bool)

    def take_raw(self, flat: np.ndarray) -> np.ndarray:
        """Values at flat indices in the stored dtype."""
        return np.asarray(self._array.reshape(-1)[np.asarray(flat, dtype=np.int64)])

    def known(self, flat: np.ndarray) -> np.ndarray:
        """Every index inside the tensor is known."""
        flat = np.asarray(flat, dtype=np.int64)
        return np.asarray((flat >= 0) & (flat < self.size), dtype=bool)

    def kept_before(self, flat: np.ndarray) -> np.ndarray:
        """Every element below each index (clipped to the tensor)."""
        return np.clip(np.asarray(flat, dtype=np.int64), 0, self.size)

    def known_indices(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """`[lo, hi)` clipped to the tensor."""
        stop = self.size if hi is None else min(hi, self.size)
        return np.arange(max(lo, 0), max(stop, max(lo, 0)), dtype=np.int64)

    def rows(self, rows: np.ndarray, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One gather of the rows (one copy: what the caller reads)."""
        index = np.asarray(rows, dtype=np.int64).reshape(-1)
        self._check_rows(index)
        cols = self._width(width)
        picked = self._array[index] if cols == int(self.shape[1]) else self._array[index, :cols]
        return np.ascontiguousarray(picked), np.ones(index.shape, dtype=bool)

    def row_cells(
        self, row: int, lo: int, hi: int, *, chunk_cells: int
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every cell of the range, a chunk at a time."""
        self._check_rows(np.array([row], dtype=np.int64))
        cols = int(self.shape[1])
        lo, hi = max(lo, 0), min(hi, cols)
        line = self._array[row]
        for a in range(lo, hi, max(chunk_cells, 1)):
            b = min(a + max(chunk_cells, 1), hi)
            yield np.arange(a, b, dtype=np.int64), np.asarray(line[a:b], dtype=np.int64)

    def find_cells(
        self, match: Match, *, chunk_cells: int, threads: int = 1
    ) -> Generator[CellHits, None, None]:
        """Row chunks in order, on up to `threads` threads; mapped pages handed back."""
        table, mapped = self._array, self._mapping
        cols = max(int(table.shape[1]), 1)
        # several threads share the chunk size: what is in flight stays about one chunk's worth
        step = max(1, chunk_cells // max(threads, 1) // cols)
        table_rows = int(table.shape[0]) if table.size else 0  # no bytes, nothing to scan

        def scan(r0: int) -> CellHits:
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

    def where_equal(self, wanted: np.ndarray, *, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """One compare (one wanted value) or `isin` over `[0, stop)`."""
        wanted = np.asarray(wanted, dtype=np.int64)
        body = self._array[: max(stop, 0)]
        # one value (the usual question: which full slots map to this SWA slot) is one compare
        hits = np.flatnonzero(body == int(wanted[0]) if wanted.size == 1 else np.isin(body, wanted))
        return hits.astype(np.int64), body[hits].astype(np.int64)

    def sequence(self) -> Sequence[int]:
        """A list of the elements."""
        return list(self._array.tolist())

    def row_sequence(self, row: int) -> Sequence[int]:
        """A list of the row's cells."""
        self._check_rows(np.array([row], dtype=np.int64))
        return list(self._array[row].tolist())


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
