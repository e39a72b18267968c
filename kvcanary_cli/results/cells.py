"""A slot and the cells holding it: the vocabulary the commands' results share.

Which pool a slot indexes (`Space`), what a cell is to the batch (`Role`), one cell (`Cell`),
a finding group's cells as columns (`CellColumns`, its record `CellColumnsRecord`) and where
they lie (`Span`), and where a slot lives (`SlotProvenance`, with its canary entries and
violation-ring rows). The dataclasses are records: their fields are the JSON keys.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypedDict

from kvcanary_cli.results.columns import Entries, IntColumn, int_items

if TYPE_CHECKING:  # numpy is imported where cells are handled: `--help` never loads it
    import numpy as np

__all__ = [
    "AllocatorState",
    "CanaryEntry",
    "Cell",
    "CellColumns",
    "CellColumnsRecord",
    "CellRole",
    "NarrowColumn",
    "RingRow",
    "Role",
    "RunColumn",
    "OwnerState",
    "FindingOwner",
    "SlotProvenance",
    "Space",
    "Span",
    "WideColumn",
]


class Space(StrEnum):
    """Which KV pool a slot indexes: the full pool, or the SWA pool (a LUT entry's value)."""

    FULL = "full"
    SWA = "swa"


class Role(StrEnum):
    """What a `req_to_token` cell (or a plan read) is to the batch (docs/findings.md).

    A cell is a verify cell, a live prefix cell before the window, the window's chain
    predecessor, a pending write, a stale cell past a live row's end, or a cell of an idle
    row; a finding may also name the plan read that met it: a write seed or an expected-token
    gather.
    """

    VERIFY = "verify"
    PREFIX = "prefix"
    CHAIN_PREV = "chain-prev"
    PENDING_WRITE = "pending-write"
    STALE_TAIL = "stale-tail"
    IDLE_ROW = "idle-row"
    SEED = "seed"
    EXPECTED_TOKEN = "expected-token"

    @property
    def live(self) -> bool:
        """A cell the batch reads or writes at this step."""
        return self in _LIVE_ROLES


_LIVE_ROLES = frozenset({Role.VERIFY, Role.PREFIX, Role.CHAIN_PREV, Role.PENDING_WRITE})


#: A `req_to_token` cell's role in the batch (docs/findings.md, "Roles").
CellRole = Literal[
    Role.VERIFY, Role.PREFIX, Role.CHAIN_PREV, Role.PENDING_WRITE, Role.STALE_TAIL, Role.IDLE_ROW
]
#: A slot on the allocator's free list, or not (in use), or no slot of the pool at all: below
#: it (negative) or beyond it (>= the pool size); unknown where a shrunk dump did not keep it.
AllocatorState = Literal[
    "free", "in use", "below the pool (negative)", "beyond the pool", "unknown (not kept)"
]


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One `req_to_token` cell holding the slot."""

    pool_row: int
    position: int
    #: batch rows using this pool row; [] for an idle row
    batch_rows: tuple[int, ...]
    role: CellRole
    #: P-1 of a row that writes
    seed: bool = False
    #: same slot, same position in another live row
    shared: bool = False
    #: space swa: the full slot this cell holds
    full_slot: int | None = None


@dataclass(frozen=True, kw_only=True)
class CanaryEntry:
    """The slot's record in one canary buffer."""

    #: the canary tensor, canary.<group>.<head|tail>.<k|v>
    buffer: str
    token: int
    position: int
    prev_hash: int
    real_kv_hash: int


@dataclass(frozen=True, kw_only=True)
class RingRow:
    """A violation-ring row whose slot field is this slot."""

    #: the ring row
    index: int
    #: its 8 fields (docs/canary.md §4)
    fields: tuple[int, ...]


#: Who holds a slot's cell: a running request of the batch (`running`), a cell past a running
#: row's live end that an earlier, finished request of that pool row left (`stale-tail`), a pool
#: row on the free request-row list (`finished`), a pool row a running request outside this
#: batch holds (`held`), or a pool row the dump says nothing more of (`idle`).
OwnerState = Literal["running", "stale-tail", "finished", "held", "idle"]


@dataclass(frozen=True, kw_only=True)
class FindingOwner:
    """A finding's slot and its current or last owner: the first cell holding it (live cells
    first, then stale tails, then idle pool rows), from the finding's provenance."""

    slot: int
    space: Space
    #: the owner's pool row; null when no cell of req_to_token holds the slot
    pool_row: int | None
    #: the owner cell's position in its pool row; null as pool_row
    position: int | None
    #: running (a live cell of a batch row), stale-tail (past a running row's live end: an
    #: earlier, finished request's), finished (the pool row is on free_req_rows), held
    #: (running_req_rows lists the pool row, outside the batch), idle (the dump says neither);
    #: null as pool_row
    state: OwnerState | None
    #: the batch row using the owner's pool row; null for an idle pool row or none
    batch_row: int | None = None
    #: space swa: the full slot the owner cell holds (its LUT entry reaches the slot)
    full_slot: int | None = None
    #: cells holding the slot over the whole table (the owner is one of them)
    holders: int = 0


@dataclass(frozen=True, kw_only=True)
class SlotProvenance:
    """Where one slot lives: every cell holding it, its translation, allocator and canary."""

    slot: int
    space: Space
    #: live cells first, then stale tails of batch rows, then idle rows; at most 16 in check,
    #: 256 or --max-rows if more in provenance
    cells: tuple[Cell, ...]
    #: count over the whole table, not only those listed
    cells_total: int
    #: LUT[slot], for a full slot inside the LUT
    swa_slot: int | None = None
    #: set when swa_slot is missing or 0, saying why
    translation_note: str | None = None
    #: space swa: full slots f with LUT[f] == slot (the last index too when it is not the -1)
    mapped_from: tuple[int, ...] = ()
    #: space swa, for LUT[lut_len - 1] of a LUT without its -1: the slots >= lut_len the GPU
    #: clamps here
    clamped_from: tuple[int, ...] = ()
    #: null: no free list for this space in the dump; unknown: a shrunk dump that did not keep
    #: the slot
    allocator: AllocatorState | None = None
    #: a shrunk dump: the kept records
    canary: tuple[CanaryEntry, ...] = ()
    #: the slot's first 16 ring rows, oldest first
    violations: tuple[RingRow, ...] = ()
    #: all of the slot's valid ring rows
    violations_total: int = 0


class CellColumnsRecord(TypedDict):
    """Every cell of a finding group as parallel columns: entry i of each list is cell i, in
    report order (batch row, then position). Complete: nothing is dropped. Each column is an
    `IntColumn` over the analysis' array (JSON writes it as a list; a view reads the entries
    it shows)."""

    #: -1 in the three coordinate columns: a finding about slots (a free-list entry, a LUT
    #: entry), not table cells
    batch_row: Sequence[int]
    pool_row: Sequence[int]
    position: Sequence[int]
    #: the slot of each cell (an SWA slot for space swa); null for a finding about a cell's
    #: expected-token gather (its `gather_index` column says where the gather went)
    slot: Sequence[int] | None
    #: the code's own per-cell columns (docs/json-schema.md, "Finding"): full_slot
    #: (swa-slot-collision and freed-slot-in-live-range of space swa), owner_position
    #: (slot-shared-across-positions), out_cache_loc_index (write-to-live-slot), gather_index
    #: (expected-token-out-of-range); {} for the other codes
    extra: dict[str, Sequence[int]]


@dataclass(frozen=True, kw_only=True)
class Span:
    """Where a finding group's cells lie: [first, last] ranges and distinct counts."""

    #: distinct batch rows holding its cells (0 for a finding about slots, not cells)
    rows: int
    #: [smallest, largest] batch row; null for a finding about slots (a free list, the LUT),
    #: whose cell columns hold -1
    batch_rows: tuple[int, int] | None
    #: [smallest, largest] position; null as batch_rows
    positions: tuple[int, int] | None
    #: [smallest, largest] slot; null without slots
    slots: tuple[int, int] | None
    #: distinct slots among its cells (0 without slots)
    distinct_slots: int

    @classmethod
    def of(cls, cells: CellColumns | None) -> Span | None:
        """Ranges and distinct counts of a finding group's cells (None without cells); the
        columns read as held (a narrow dtype): bounds and counts are the same."""
        if cells is None or not len(cells):
            return None
        positions = cells.bounds("position")
        assert positions is not None
        in_table = positions[1] >= 0  # some cell of the table (else -1: about slots)
        return cls(
            rows=cells.distinct_count("batch_row") if in_table else 0,
            batch_rows=cells.bounds("batch_row") if in_table else None,
            positions=positions if in_table else None,
            slots=cells.bounds("slot"),
            distinct_slots=cells.distinct_count("slot"),
        )


class WideColumn:
    """A class attribute reading the instance's held column of its own name back in the
    dtype given (`obj._columns[name].wide()`): one declaration per column, its docstring."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, owner: type | None = None) -> np.ndarray:
        columns: Mapping[str, HeldColumn] = getattr(obj, "_columns")  # noqa: B009
        return columns[self.name].wide()


class CellColumns:
    """The `req_to_token` cells a finding group stands for, as parallel integer arrays.

    One entry per cell, ordered by batch row, then position (then slot): a group of a million
    cells is five arrays, not a million objects; views turn into Python objects only what they
    show. `extra` holds the code's own per-cell columns (an SWA finding's `full_slot`, the
    position an aliased slot's owner holds it at, a write's `out_cache_loc` index).

    Each column is held in the narrowest integer dtype its values fit (a table's rows and
    positions, a small pool's slots: a few bytes a cell, not 8) and read back in the dtype it
    was given, so no reader does arithmetic in a narrow dtype: a group of ten million cells
    holds tens of megabytes, not hundreds. A large column made of runs (one batch row's many
    cells, a row's consecutive positions, one slot) is held as its runs (`RunColumn`):
    kilobytes, read back as the same narrow array.
    """

    __slots__ = ("_columns", "_extra")

    def __init__(
        self,
        *,
        batch_row: np.ndarray,
        pool_row: np.ndarray,
        position: np.ndarray,
        slot: np.ndarray | None,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        columns = {"batch_row": batch_row, "pool_row": pool_row, "position": position}
        if slot is not None:
            columns["slot"] = slot
        self._columns = {name: _held(NarrowColumn.of(v)) for name, v in columns.items()}
        self._extra = {name: _held(NarrowColumn.of(v)) for name, v in (extra or {}).items()}

    @classmethod
    def gathered(
        cls,
        index: np.ndarray,
        *,
        batch_row: np.ndarray | HeldColumn,
        pool_row: np.ndarray | HeldColumn,
        position: np.ndarray | HeldColumn,
        slot: np.ndarray | HeldColumn | None,
        extra: Mapping[str, np.ndarray | HeldColumn] | None = None,
    ) -> CellColumns:
        """The cells at `index` of whole columns, read back as int64: gathered a column at a
        time, each held narrow before the next is gathered (ten million cells gather a few
        of their columns' bytes at once, not every column at eight bytes a cell)."""
        import numpy as np

        def held(values: np.ndarray | HeldColumn) -> HeldColumn:
            if isinstance(values, RunColumn | NarrowColumn):  # held already: gathered as held
                return _gathered(values, index)
            return _held(NarrowColumn.of(values[index], np.dtype(np.int64)))  # read as int64

        columns: dict[str, np.ndarray | HeldColumn] = {
            "batch_row": batch_row,
            "pool_row": pool_row,
            "position": position,
        }
        if slot is not None:
            columns["slot"] = slot
        return cls._built(
            {name: held(values) for name, values in columns.items()},
            {name: held(values) for name, values in (extra or {}).items()},
        )

    batch_row = WideColumn("Each cell's batch row (-1: a finding about slots, not table cells).")
    pool_row = WideColumn("Each cell's pool row (its `req_to_token` row).")
    position = WideColumn("Each cell's position in its row.")

    @property
    def slot(self) -> np.ndarray | None:
        """The slot the finding is about (an SWA slot for an SWA-space finding); None for a
        finding about a cell's other reads (an expected-token gather)."""
        held = self._columns.get("slot")
        return None if held is None else held.wide()

    @property
    def extra(self) -> Mapping[str, np.ndarray]:
        """The code's own per-cell columns, by name."""
        return _WideColumns(self._extra)

    def column(self, name: str) -> np.ndarray | None:
        """A column (`batch_row`, `slot`, an extra one) as held: values to compare, count
        or sort, never to compute with (its dtype may be narrow). None: no such column."""
        held = self._find(name)
        return None if held is None else held.values

    def entries(self, name: str) -> np.ndarray | Entries | None:
        """A column as held, for a view reading a few of its entries (`[i]`, a slice, its
        length): the array, or its runs decoding only the entries read. None: no column."""
        held = self._find(name)
        return None if held is None else held.entries()

    def bounds(self, name: str) -> tuple[int, int] | None:
        """[smallest, largest] of a non-empty column (runs: from the runs). None: no column."""
        held = self._find(name)
        return None if held is None else held.bounds()

    def distinct(self, name: str) -> np.ndarray | None:
        """A column's distinct values, sorted, as held. None: no such column."""
        held = self._find(name)
        return None if held is None else held.distinct()

    def where_in(self, name: str, wanted: np.ndarray) -> np.ndarray:
        """Ascending indices of the cells whose column `name` holds one of `wanted`."""
        return self._column(name).where_in(wanted)

    def same_column(self, name: str, other: str) -> bool:
        """Whether two columns hold the same entries (runs compared as runs)."""
        return _same(self._column(name), self._column(other))

    def _column(self, name: str) -> HeldColumn:
        held = self._find(name)
        assert held is not None, name
        return held

    def _find(self, name: str) -> HeldColumn | None:
        """A column by name (an empty one too: a column's length makes its truth)."""
        held = self._columns.get(name)
        return self._extra.get(name) if held is None else held

    def __record__(self) -> CellColumnsRecord:
        """Every cell as columns, each an `IntColumn` over the column as held (its ints are
        the same): building the record converts no cell."""

        def column(held: HeldColumn) -> IntColumn:
            return IntColumn(held.entries())

        slot = self._columns.get("slot")
        return {
            "batch_row": column(self._columns["batch_row"]),
            "pool_row": column(self._columns["pool_row"]),
            "position": column(self._columns["position"]),
            "slot": None if slot is None else column(slot),
            "extra": {name: column(self._extra[name]) for name in sorted(self._extra)},
        }

    def without_slot(self) -> CellColumns:
        """The same cells without a slot column (a finding about a cell's other reads)."""
        return self._built({k: v for k, v in self._columns.items() if k != "slot"}, self._extra)

    def __len__(self) -> int:
        return len(self._columns["position"])

    def __repr__(self) -> str:
        return f"CellColumns({len(self)} cells, columns {[*self._columns, *self._extra]})"

    def __eq__(self, other: object) -> bool:
        """Equal cells, in the same order (reports compare by value)."""
        if not isinstance(other, CellColumns):
            return NotImplemented
        return _same_columns(self._columns, other._columns) and _same_columns(
            self._extra, other._extra
        )

    def __hash__(self) -> int:
        import numpy as np

        def head(name: str) -> bytes:
            return np.asarray(self._columns[name].entries()[:4]).astype(np.int64).tobytes()

        return hash((len(self), head("position"), head("batch_row")))

    def distinct_count(self, column: str) -> int:
        """How many distinct values a column (`batch_row`, `slot`, ...) holds (one sort)."""
        held = self._find(column)
        return 0 if held is None else held.distinct_count()

    def take(self, index: np.ndarray) -> CellColumns:
        """The cells at `index` (a boolean mask or integer indices), in that order."""
        return self._built(
            {name: _held(held.take(index)) for name, held in self._columns.items()},
            {name: _held(held.take(index)) for name, held in self._extra.items()},
        )

    @classmethod
    def _built(
        cls, columns: Mapping[str, HeldColumn], extra: Mapping[str, HeldColumn]
    ) -> CellColumns:
        made = cls.__new__(cls)
        made._columns = dict(columns)
        made._extra = dict(extra)
        return made

    def __getstate__(self) -> tuple[dict[str, HeldColumn], dict[str, HeldColumn]]:
        return self._columns, self._extra

    def __setstate__(self, state: tuple[dict[str, HeldColumn], dict[str, HeldColumn]]) -> None:
        self._columns, self._extra = state


#: Narrow integer dtypes a column may be held in, narrowest first (signed: a -1 is common).
_NARROW_DTYPES = ("int8", "int16", "int32")


class NarrowColumn:
    """One column held in the narrowest signed integer dtype its values fit, and the dtype it
    was given (what readers get back: bit for bit the values given). A column of ten million
    table positions holds 20 MB, not 80, and no reader computes in the narrow dtype."""

    __slots__ = ("dtype", "values")

    #: tests turn narrowing off to compare results against columns held as given.
    enabled = True

    def __init__(self, values: np.ndarray, dtype: np.dtype) -> None:
        self.values = values
        self.dtype = dtype

    @classmethod
    def of(cls, values: np.ndarray | NarrowColumn, dtype: np.dtype | None = None) -> NarrowColumn:
        """`values` held narrow (a column held already is kept as it is), read back as
        `values.astype(dtype)` (default: their own dtype)."""
        import numpy as np

        if isinstance(values, NarrowColumn):
            return values
        values = np.asarray(values)
        given = values.dtype if dtype is None else np.dtype(dtype)
        if not cls.enabled or values.dtype.kind not in "iu" or values.size == 0:
            return cls(values, given)
        low, high = int(values.min()), int(values.max())
        for name in _NARROW_DTYPES:
            narrow = np.dtype(name)
            if narrow.itemsize >= values.dtype.itemsize:
                break
            limits = np.iinfo(narrow)
            if limits.min <= low and high <= limits.max:
                return cls(values.astype(narrow), given)
        return cls(values, given)

    def wide(self) -> np.ndarray:
        """The values in the dtype given (the array held, when that is its dtype)."""
        return self.values.astype(self.dtype, copy=False)

    def take(self, index: np.ndarray) -> NarrowColumn:
        """The entries at `index`, held as these are."""
        return NarrowColumn(self.values[index], self.dtype)

    def entries(self) -> np.ndarray:
        """The column as held, for a record's `IntColumn` (or a view) to read."""
        return self.values

    def bounds(self) -> tuple[int, int]:
        """[smallest, largest] of a non-empty column."""
        return (int(self.values.min()), int(self.values.max()))

    def distinct_count(self) -> int:
        """How many distinct values it holds (one sort, as held: a fraction of the bytes)."""
        return _distinct_count(self.values)

    def distinct(self) -> np.ndarray:
        """Its distinct values, sorted."""
        from kvcanary_cli.dump.tensor import distinct

        return distinct(self.values)

    def where_in(self, wanted: np.ndarray) -> np.ndarray:
        """Ascending indices of the entries among `wanted`."""
        import numpy as np

        return np.flatnonzero(np.isin(self.values, wanted))

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def __getstate__(self) -> tuple[np.ndarray, np.dtype]:
        return self.values, self.dtype

    def __setstate__(self, state: tuple[np.ndarray, np.dtype]) -> None:
        self.values, self.dtype = state


#: Entries a `RunColumn` decodes at a time (bounds its int64 temporaries: 128 KB each).
_RUN_PIECE = 1 << 14


class RunColumn:
    """A `NarrowColumn` held as runs: where each run begins and its first value, a run's
    values all equal (`step` 0: a finding's batch rows, pool rows, its one slot) or counting
    up by one (`step` 1: a row's consecutive positions). One slot held by every cell of
    thousands of rows is ten million cells of a few thousand runs: kilobytes, where the
    narrow arrays of two findings' columns held 139 MiB.

    It reads back as the column it stands for: `values` decodes the same entries in the same
    narrow dtype, a piece at a time; an entry or a slice decodes only itself (a view shows a
    few cells, JSON writes a piece at a time). Only a column of at least `MIN_CELLS` cells
    whose runs hold a fraction of its bytes is held so (`held_as_runs`).
    """

    __slots__ = ("dtype", "firsts", "size", "starts", "step")

    #: tests turn runs off to compare results against the columns held as arrays.
    enabled = True
    #: columns shorter than this stay arrays (tests lower it to run the small corpus as runs).
    MIN_CELLS = 1 << 12
    #: runs are held where they take at most 1 / SAVING of the array's bytes (tests set 0:
    #: every column, however many its runs).
    SAVING = 8

    def __init__(
        self, *, starts: np.ndarray, firsts: np.ndarray, step: int, size: int, dtype: np.dtype
    ) -> None:
        #: the index each run begins at (int64, ascending, the first 0)
        self.starts = starts
        #: each run's first value, in the column's held dtype
        self.firsts = firsts
        self.step = step
        self.size = size
        #: the dtype the column reads back as (`wide`)
        self.dtype = dtype

    @classmethod
    def held_as_runs(cls, column: NarrowColumn) -> HeldColumn:
        """`column` as runs where its runs take at most 1 / `SAVING` of its bytes, else as
        it is. A held dtype of 32 bits at most: a run's values then count in int64 exactly."""
        import numpy as np

        values = column.values
        size = int(values.shape[0]) if values.ndim == 1 else 0
        kind, width = values.dtype.kind, values.dtype.itemsize
        if not cls.enabled or size < max(cls.MIN_CELLS, 2) or kind != "i" or width > 4:
            return column
        # breaks counted a piece at a time (a few MB of temporaries), for each step
        breaks = [0, 0]
        for start in range(0, size - 1, _RUN_PIECE):
            for step in (0, 1):
                breaks[step] += int(np.count_nonzero(_breaks(values, start, step)))
        step = int(breaks[1] < breaks[0])
        if (breaks[step] + 1) * (8 + width) * cls.SAVING > size * width:
            return column
        starts = np.concatenate(
            [np.zeros(1, dtype=np.int64)]
            + [
                np.flatnonzero(_breaks(values, start, step)) + (start + 1)
                for start in range(0, size - 1, _RUN_PIECE)
            ]
        )
        return cls(starts=starts, firsts=values[starts], step=step, size=size, dtype=column.dtype)

    @property
    def values(self) -> np.ndarray:
        """The column as held: the narrow array it stands for (decoded now, a copy)."""
        import numpy as np

        out = np.empty(self.size, dtype=self.firsts.dtype)
        for start in range(0, self.size, _RUN_PIECE):
            stop = min(start + _RUN_PIECE, self.size)
            out[start:stop] = self._piece(start, stop)
        return out

    def _piece(self, start: int, stop: int) -> np.ndarray:
        """Entries `[start, stop)` (0 <= start <= stop <= size), in the held dtype."""
        import numpy as np

        if start >= stop:
            return np.zeros(0, dtype=self.firsts.dtype)
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        last = int(np.searchsorted(self.starts, stop, side="left"))
        begins = self.starts[first:last]
        low = np.maximum(begins, start)  # each overlapping run's first entry in the piece
        lengths = np.append(begins[1:], stop) - low
        if not self.step:
            return np.repeat(self.firsts[first:last], lengths)
        # entry i of a run beginning at b: firsts + (i - b), counted in int64
        heads = self.firsts[first:last].astype(np.int64) - begins
        counted = np.repeat(heads, lengths) + np.arange(start, stop, dtype=np.int64)
        return counted.astype(self.firsts.dtype)

    def json_items(self, start: int, stop: int) -> str:
        """Entries `[start, stop)` as the items of a compact JSON list, `7,7,7`: a run of
        equal values is its value's text repeated, not each entry converted (a one-slot dump's
        JSON is ten million cells of a few thousand runs)."""
        import numpy as np

        if self.step or start >= stop:
            return int_items(self._piece(start, stop).tolist())
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        last = int(np.searchsorted(self.starts, stop, side="left"))
        begins = self.starts[first:last]
        lengths = np.append(begins[1:], stop) - np.maximum(begins, start)
        values = self.firsts[first:last].tolist()
        return "".join(f",{v}" * n for v, n in zip(values, lengths.tolist(), strict=True))[1:]

    def __getitem__(self, index: int | slice | np.ndarray) -> Any:
        """An entry (a numpy scalar), a slice (an array), or the entries at an index array
        (non-negative integers: only those decoded), as the held array gives them."""
        import numpy as np

        if isinstance(index, slice) and index.step in (None, 1):
            start, stop, _ = index.indices(self.size)
            return self._piece(start, max(start, stop))
        if isinstance(index, int | np.integer):
            at = int(index) + (self.size if index < 0 else 0)
            if not 0 <= at < self.size:
                raise IndexError(f"index {index} out of range for {self.size} entries")
            return self._piece(at, at + 1)[0]
        index = np.asarray(index)
        if index.dtype.kind in "iu" and index.ndim == 1 and (not index.size or index.min() >= 0):
            if index.size and int(index.max()) >= self.size:
                raise IndexError(f"index {int(index.max())} out of range for {self.size} entries")
            run = np.searchsorted(self.starts, index, side="right") - 1
            at = self.firsts[run].astype(np.int64) + self.step * (index - self.starts[run])
            return at.astype(self.firsts.dtype)
        return self.values[index]

    def gather(self, index: np.ndarray) -> np.ndarray:
        """`values[index]` for a mask of every entry or an index of non-negative entries,
        decoded `_RUN_PIECE` entries (or indices) at a time: a finding's cells gather the
        live cells' batch and pool rows (runs of ten million cells) with no copy of the whole
        column decoded beside the answer."""
        import numpy as np

        index = np.asarray(index)
        if index.dtype == np.bool_ and index.shape == (self.size,):
            out = np.empty(int(np.count_nonzero(index)), dtype=self.firsts.dtype)
            at = 0
            for start in range(0, self.size, _RUN_PIECE):
                stop = min(start + _RUN_PIECE, self.size)
                piece = self._piece(start, stop)[index[start:stop]]
                out[at : at + piece.size] = piece
                at += piece.size
            return out
        if index.dtype.kind in "iu" and index.ndim == 1 and (not index.size or index.min() >= 0):
            out = np.empty(index.size, dtype=self.firsts.dtype)
            for start in range(0, index.size, _RUN_PIECE):
                out[start : start + _RUN_PIECE] = self[index[start : start + _RUN_PIECE]]
            return out
        taken: np.ndarray = self.values[index]  # negative indices: the whole column read
        return taken

    def where_in(self, wanted: np.ndarray) -> np.ndarray:
        """Ascending indices of the entries among `wanted` (runs of equal values: found by
        run, not by entry)."""
        import numpy as np

        if self.step:
            return np.flatnonzero(np.isin(self.values, wanted))
        ends = np.append(self.starts[1:], self.size)
        hit = np.isin(self.firsts, wanted)
        begins, lengths = self.starts[hit], (ends - self.starts)[hit]
        offsets = np.arange(int(lengths.sum()), dtype=np.int64)
        found: np.ndarray = offsets + np.repeat(begins - (np.cumsum(lengths) - lengths), lengths)
        return found

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        values = self.values
        return values if dtype is None else values.astype(dtype)

    @property
    def shape(self) -> tuple[int]:
        """`(size,)`, as an array's."""
        return (self.size,)

    def __len__(self) -> int:
        return self.size

    def wide(self) -> np.ndarray:
        """The values in the dtype given."""
        return self.values.astype(self.dtype, copy=False)

    def take(self, index: np.ndarray) -> NarrowColumn:
        """The entries at `index`, as an array (`held_as_runs` may make runs of them)."""
        return NarrowColumn(self.values[index], self.dtype)

    def entries(self) -> RunColumn:
        """The column itself: a record's `IntColumn` (or a view) reads it a piece at a time."""
        return self

    def _lasts(self) -> np.ndarray:
        """Each run's last value (int64)."""
        import numpy as np

        lengths = np.diff(np.append(self.starts, self.size))
        lasts: np.ndarray = self.firsts.astype(np.int64) + self.step * (lengths - 1)
        return lasts

    def bounds(self) -> tuple[int, int]:
        """[smallest, largest]: a run's first value is its smallest, its last its largest."""
        return (int(self.firsts.min()), int(self._lasts().max()))

    def distinct_count(self) -> int:
        """How many distinct values it holds: its runs' values when they are equal, else
        those of the column decoded."""
        return _distinct_count(self.firsts if not self.step else self.values)

    def distinct(self) -> np.ndarray:
        """Its distinct values, sorted (its runs' values when they are equal)."""
        from kvcanary_cli.dump.tensor import distinct

        return distinct(self.firsts if not self.step else self.values)

    def __getstate__(self) -> tuple[np.ndarray, np.ndarray, int, int, np.dtype]:
        return self.starts, self.firsts, self.step, self.size, self.dtype

    def __setstate__(self, state: tuple[np.ndarray, np.ndarray, int, int, np.dtype]) -> None:
        self.starts, self.firsts, self.step, self.size, self.dtype = state


def _breaks(values: np.ndarray, start: int, step: int) -> np.ndarray:
    """For entries `start + 1 ..` of a piece: whether each begins a new run of `step` (0:
    equal to the one before; 1: one more, the dtype's largest value ending a run, since its
    `+ 1` wraps)."""
    before = values[start : start + _RUN_PIECE]
    after = values[start + 1 : start + _RUN_PIECE + 1]
    return _begins(before[: after.size], after, step)


def _begins(before: np.ndarray, after: np.ndarray, step: int) -> np.ndarray:
    """Whether each of `after` begins a new run of `step` after the entry `before` it (equal
    lengths, one dtype)."""
    import numpy as np

    if not step:
        begins: np.ndarray = after != before
        return begins
    largest = _LARGEST.get(before.dtype)
    if largest is None:  # `np.iinfo` builds its answer anew each call (a million calls a run)
        largest = _LARGEST[before.dtype] = int(np.iinfo(before.dtype).max)
    begins = (after != before + 1) | (before == largest)
    return begins


#: Each integer dtype's largest value, as `_begins` has met them.
_LARGEST: dict[Any, int] = {}


#: Source entries (or index entries) `_gathered` reads at a time.
_GATHER_PIECE = 1 << 16


def _gathered(source: HeldColumn, index: np.ndarray) -> HeldColumn:
    """`_held(NarrowColumn(<source as held>[index], int64))`: a finding group's column of the
    live cells at `index` (a mask of every cell, or non-negative indices), read back as int64.

    Where it is held as runs, they are found in the gathered entries a piece at a time, in
    two passes (counted, then made), and the gathered column is never made whole: a finding
    of ten million cells of one slot held 20 MB of a column's `int16` here, beside its runs'
    few kilobytes. Otherwise, and for a column of one piece at most, the column is gathered
    whole, as held, and `_held` finds its runs."""
    import numpy as np

    index = np.asarray(index)
    masked = index.dtype == np.bool_ and index.shape == (len(source),)
    positive = index.dtype.kind in "iu" and index.ndim == 1
    if positive and index.size and int(index.min()) < 0:
        positive = False
    held = source.firsts.dtype if isinstance(source, RunColumn) else source.values.dtype
    size = int(np.count_nonzero(index)) if masked else int(index.size)
    width = held.itemsize
    whole = (
        not (masked or positive)
        or not RunColumn.enabled
        or size <= _GATHER_PIECE
        or size < max(RunColumn.MIN_CELLS, 2)
        or held.kind != "i"
        or width > 4
    )
    if not whole:
        breaks = [0, 0]
        for last, piece in _gathered_pieces(source, index, masked):
            for step in (0, 1):
                breaks[step] += int(np.count_nonzero(_begins(piece[:-1], piece[1:], step)))
                if last is not None:
                    breaks[step] += int(_begins(last, piece[:1], step)[0])
        step = int(breaks[1] < breaks[0])
        whole = (breaks[step] + 1) * (8 + width) * RunColumn.SAVING > size * width
    if whole:
        if isinstance(source, RunColumn):  # decoded a piece at a time, never whole
            return _held(NarrowColumn(source.gather(index), np.dtype(np.int64)))
        return _held(NarrowColumn(source.values[index], np.dtype(np.int64)))
    starts: list[np.ndarray] = []
    firsts: list[np.ndarray] = []
    offset = 0
    for last, piece in _gathered_pieces(source, index, masked):
        begins = np.flatnonzero(_begins(piece[:-1], piece[1:], step)) + 1
        if last is None or _begins(last, piece[:1], step)[0]:
            begins = np.concatenate([np.zeros(1, dtype=begins.dtype), begins])
        starts.append(begins.astype(np.int64) + offset)
        firsts.append(piece[begins])
        offset += piece.size
    return RunColumn(
        starts=np.concatenate(starts),
        firsts=np.concatenate(firsts),
        step=step,
        size=size,
        dtype=np.dtype(np.int64),
    )


def _gathered_pieces(
    source: HeldColumn, index: np.ndarray, masked: bool
) -> Iterator[tuple[np.ndarray | None, np.ndarray]]:
    """The entries of `source` (as held) at `index`, in order, a piece at a time (no empty
    piece), each with the last entry before it (a one-entry array; None for the first)."""

    def read(start: int, stop: int) -> np.ndarray:
        if isinstance(source, RunColumn):
            return source._piece(start, stop)
        return source.values[start:stop]

    last: np.ndarray | None = None
    for start in range(0, len(index), _GATHER_PIECE):
        stop = min(start + _GATHER_PIECE, len(index))
        if masked:
            piece = read(start, stop)[index[start:stop]]
        elif isinstance(source, RunColumn):
            piece = source[index[start:stop]]
        else:
            piece = source.values[index[start:stop]]
        if piece.size:
            yield last, piece
            last = piece[-1:]


#: A finding group's column: an array held narrow, or its runs.
HeldColumn: TypeAlias = "NarrowColumn | RunColumn"


def _held(column: NarrowColumn) -> HeldColumn:
    """A finding group's column as it is held: as runs where that is far smaller."""
    return RunColumn.held_as_runs(column)


class _WideColumns(Mapping[str, "np.ndarray"]):
    """`CellColumns.extra`: its columns by name, each read in the dtype it was given."""

    def __init__(self, held: Mapping[str, HeldColumn]) -> None:
        self._held = held

    def __getitem__(self, name: str) -> np.ndarray:
        return self._held[name].wide()

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)


def _same_columns(a: Mapping[str, HeldColumn], b: Mapping[str, HeldColumn]) -> bool:
    return a.keys() == b.keys() and all(_same(held, b[name]) for name, held in a.items())


def _same(a: HeldColumn, b: HeldColumn) -> bool:
    """The same entries. Two columns of runs of one step are compared as runs: each run is
    as long as its step allows, so equal entries make equal runs."""
    import numpy as np

    if isinstance(a, RunColumn) and isinstance(b, RunColumn) and a.step == b.step:
        return (
            a.size == b.size
            and np.array_equal(a.starts, b.starts)
            and np.array_equal(a.firsts, b.firsts)
        )
    return bool(np.array_equal(a.values, b.values))


def _distinct_count(values: np.ndarray) -> int:
    """How many distinct values `values` holds (one sort of a copy)."""
    import numpy as np

    if len(values) == 0:
        return 0
    ordered = np.sort(values)
    return int(np.count_nonzero(ordered[1:] != ordered[:-1])) + 1
