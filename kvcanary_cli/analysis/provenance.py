"""Slot provenance: which `req_to_token` cells hold a slot, and what each cell is to the batch.

Two vectorized views: `live_cells` (the batch's live ranges, gathered from the rows of the
batch only) and `ProvenanceIndex` (every cell of the whole table holding one of a set of
slots, found in one chunked pass, with at most `max_cells` kept per slot).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import replace
from functools import cached_property

import numpy as np

from kvcanary_cli.analysis.cells import cell_slots, distinct
from kvcanary_cli.analysis.req_rows import pool_rows
from kvcanary_cli.canary.ring import decode_ring
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.tensor import fold_at
from kvcanary_cli.planners.base import ColumnFill
from kvcanary_cli.planners.frame import GroupFrame
from kvcanary_cli.results.cells import (
    AllocatorState,
    CanaryEntry,
    Cell,
    CellRole,
    FindingOwner,
    HeldColumn,
    NarrowColumn,
    OwnerState,
    RingRow,
    Role,
    RunColumn,
    SlotProvenance,
    Space,
    WideColumn,
)
from kvcanary_cli.results.check import Finding

__all__ = [
    "LiveCells",
    "ProvenanceIndex",
    "RowStates",
    "SlotSet",
    "cell_role",
    "clamp_target",
    "clamped_sources",
    "full_slots_mapping_to",
    "live_cells",
    "live_ends",
    "slot_owners",
    "swa_provenance",
]

#: cells of req_to_token examined per step of the provenance scan (bounds temporaries).
_SCAN_CELLS = 1 << 18
#: live cells `live_cells` gathers at a time (bounds its int64 temporaries).
_LIVE_CHUNK = 1 << 17
#: values looked up at a time by `SlotSet.contains` (bounds its int64 offsets).
_LOOKUP_CHUNK = 1 << 20
#: violation-ring kernel_kind (launch tag) values of the SWA group: HEAD/TAIL/SWEEP x K/V.
_SWA_TAGS = range(6, 12)


class LiveCells:
    """Live cells of in-range active rows, flat (integer arrays of equal length, read as
    given: int64 from `live_cells`).

    Rows whose pool row repeats in the batch contribute once (their first batch row), so a
    duplicated request does not look like aliasing; `DUPLICATE_REQUEST_ROW` reports it.

    Each column is held in the narrowest dtype its values fit (`NarrowColumn`): a batch of
    ten million live cells holds tens of megabytes while its detectors run, not hundreds.
    `held` gives a column as held, for what compares, sorts or counts values.
    """

    __slots__ = ("_columns", "pending")

    def __init__(
        self,
        *,
        slot: np.ndarray | HeldColumn,
        batch_row: np.ndarray | HeldColumn,
        pool_row: np.ndarray | HeldColumn,
        position: np.ndarray | HeldColumn,
        pending: np.ndarray,
    ) -> None:
        self._columns: dict[str, HeldColumn] = {
            "slot": _hold(slot),
            "batch_row": _hold(batch_row),
            "pool_row": _hold(pool_row),
            "position": _hold(position),
        }
        #: True for pending writes `[P, P+E)`, False for the prefix `[0, P)`.
        self.pending = pending

    slot = WideColumn("Each cell's slot.")
    batch_row = WideColumn("Each cell's batch row.")
    pool_row = WideColumn("Each cell's pool row.")
    position = WideColumn("Each cell's position in its row.")

    def held(self, name: str) -> np.ndarray:
        """A column as held: values to compare, sort or count, never to compute with (its
        dtype may be narrow)."""
        return self._columns[name].values

    def column(self, name: str) -> HeldColumn:
        """A column with the dtype it reads as (what `CellColumns.gathered` keeps narrow)."""
        return self._columns[name]

    def readable(self, name: str) -> np.ndarray | RunColumn:
        """A column as held, to read a slice, an entry or the entries of an index at a time:
        the narrow array itself, or its runs, decoded only where read (ten million cells'
        pool rows held as runs are never decoded whole: 20 MB of `int16`)."""
        column = self._columns[name]
        return column if isinstance(column, RunColumn) else column.values

    def __len__(self) -> int:
        return len(self._columns["slot"])


def _hold(column: np.ndarray | HeldColumn) -> HeldColumn:
    """A live cells' column as held: as given when held already (narrow, or as runs)."""
    return column if isinstance(column, RunColumn) else NarrowColumn.of(column)


def batch_rows_of(dump: KvDump) -> dict[int, list[int]]:
    """Pool row -> batch rows using it (active rows only)."""
    rows: dict[int, list[int]] = {}
    for r, rp in enumerate(dump.req_pool_indices.tolist()):
        if rp != 0:
            rows.setdefault(rp, []).append(r)
    return rows


def _clamped_ends(dump: KvDump) -> tuple[np.ndarray, np.ndarray]:
    """Per batch row: its prefix length and the end of its live range, `P + E`, both clamped
    to the row. Each length is clamped first: claimed lengths never size a gather (nor
    overflow the sum)."""
    msl = dump.max_seq_len
    prefix = np.clip(dump.prefix_lens, 0, msl)
    extend = np.clip(dump.extend_seq_lens, 0, msl)
    return prefix, np.minimum(prefix + extend, msl).astype(np.int64)


def _live_lengths(dump: KvDump) -> tuple[np.ndarray, np.ndarray]:
    """Per batch row: its prefix length clamped to the row, and the length of its live range
    `[0, P+E)` (0 for a padding or out-of-range row, and for a row whose pool row an earlier
    batch row already uses)."""
    rpi = dump.req_pool_indices
    prefix, end = _clamped_ends(dump)
    first = np.zeros(rpi.shape, dtype=bool)
    if rpi.size:
        _, first_index = np.unique(rpi, return_index=True)
        first[first_index] = True
    usable = (rpi > 0) & (rpi < dump.max_reqs) & first
    return prefix, np.where(usable, end, 0)


def live_cells(dump: KvDump) -> LiveCells:
    """Gather `[0, P+E)` of every in-range active row (first occurrence of each pool row).

    Gathered `_LIVE_CHUNK` cells at a time (whole rows), each column held narrow as soon as
    it is built, in place (`ColumnFill`): ten million live cells are never int64 columns at
    once, only a chunk's, nor their narrow columns twice (the pieces and the joined copy)."""
    rpi = dump.req_pool_indices
    prefix, lens = _live_lengths(dump)
    ends = np.cumsum(lens)
    total = int(ends[-1]) if ends.size else 0
    if total == 0:
        empty = _joined(())
        return LiveCells(
            slot=empty,
            batch_row=empty,
            pool_row=empty,
            position=empty,
            pending=np.zeros(0, dtype=bool),
        )
    fills = [ColumnFill(total) for _ in range(4)]
    given: list[np.dtype | None] = [None] * 4
    pending = ColumnFill(total)
    r0 = 0
    while r0 < lens.size:
        before = int(ends[r0 - 1]) if r0 else 0
        r1 = max(int(np.searchsorted(ends, before + _LIVE_CHUNK, side="right")), r0 + 1)
        chunk = lens[r0:r1]
        r0 = r1
        if not chunk.any():
            continue  # no cell: an empty part would join as int64
        rows = np.repeat(np.arange(r1 - chunk.size, r1, dtype=np.int64), chunk)
        pos = np.arange(rows.size, dtype=np.int64) - np.repeat(np.cumsum(chunk) - chunk, chunk)
        pending.put(pos >= prefix[rows])
        pool_row = rpi[rows]
        flat = pool_row * dump.max_seq_len + pos
        slot = dump.req_to_token.take(flat)
        for i, values in enumerate((slot, rows, pool_row, pos)):
            held = NarrowColumn.of(values)
            fills[i].put(held.values)
            given[i] = held.dtype if given[i] is None else np.result_type(given[i], held.dtype)
        del rows, pos, pool_row, flat, slot
    columns: list[NarrowColumn] = []
    for fill, dtype in zip(fills, given, strict=True):
        assert dtype is not None  # `total` cells: one chunk of them at least
        columns.append(NarrowColumn(fill.column(), dtype))
    del fills
    slot_column, batch_rows, pool_rows, position = columns
    batch_row, pool_column = _rows_held(batch_rows), _rows_held(pool_rows)
    del columns, batch_rows, pool_rows
    return LiveCells(
        slot=slot_column,
        batch_row=batch_row,
        pool_row=pool_column,
        position=position,
        pending=pending.column(),
    )


def cell_role(
    dump: KvDump, frame: GroupFrame, batch_row: int | None, position: int
) -> tuple[CellRole, bool]:
    """(role, is_seed) of a cell at `position` of the pool row used by `batch_row`, with the
    window of `frame`'s group."""
    if batch_row is None:
        return Role.IDLE_ROW, False
    p = max(int(dump.prefix_lens[batch_row]), 0)
    e = max(int(dump.extend_seq_lens[batch_row]), 0)
    ws = int(frame.window_start[batch_row])
    seed = e > 0 and p > 0 and position == p - 1
    if ws <= position < p:
        return Role.VERIFY, seed
    if position < p:
        return (Role.CHAIN_PREV if position == ws - 1 else Role.PREFIX), seed
    if position < p + e:
        return Role.PENDING_WRITE, False
    return Role.STALE_TAIL, False


#: Cell tiers, shown in this order: live in the batch, a batch row's stale tail, idle rows.
_LIVE, _STALE, _IDLE = 0, 1, 2


def live_ends(dump: KvDump) -> tuple[np.ndarray, np.ndarray]:
    """The in-range pool rows of the batch (sorted) and, per row, one past its last live
    position (`P + E` of the batch row using it, the largest if several do, clamped to the
    row). Sized by the batch, not by the table (a shrunk dump's shape is only a claim)."""
    rpi = dump.req_pool_indices
    active = (rpi > 0) & (rpi < dump.max_reqs)
    _, end = _clamped_ends(dump)
    rows, inverse = np.unique(rpi[active], return_inverse=True)
    ends = np.zeros(rows.size, dtype=np.int64)
    fold_at(np.maximum, ends, inverse.reshape(-1), end[active])
    return rows, ends


class SlotSet:
    """A set of slots to find in table chunks: equality for one slot, a lookup table for a
    dense range (one gather per cell, far cheaper than a sorted search), `isin` otherwise."""

    #: the widest slot range that gets a lookup table (one byte per slot).
    LOOKUP_SPAN = 1 << 25

    def __init__(self, slots: np.ndarray) -> None:
        self.slots = np.asarray(slots, dtype=np.int64).reshape(-1)  # duplicates are fine
        self._lookup: np.ndarray | None = None
        self._low = self._high = 0
        if self.slots.size:
            self._low, self._high = int(self.slots.min()), int(self.slots.max())
            if self._low != self._high and self._high - self._low < self.LOOKUP_SPAN:
                self._lookup = np.zeros(self._high - self._low + 1, dtype=bool)
                self._lookup[self.slots - self._low] = True

    def contains(self, values: np.ndarray) -> np.ndarray:
        """Boolean mask of `values` (any integer dtype) that are in the set."""
        if self.slots.size == 0:
            return np.zeros(values.shape, dtype=bool)
        if self._low == self._high:
            return np.asarray(values == self._low)
        if self._lookup is None:
            return np.isin(values, self.slots)
        if values.size > _LOOKUP_CHUNK:  # a piece at a time: its int64 offsets stay small
            flat = values.reshape(-1)
            found = np.empty(flat.shape, dtype=bool)
            for a in range(0, flat.size, _LOOKUP_CHUNK):
                found[a : a + _LOOKUP_CHUNK] = self.contains(flat[a : a + _LOOKUP_CHUNK])
            return found.reshape(values.shape)
        shifted = values.astype(np.int64) - self._low
        inside = (shifted >= 0) & (shifted < self._lookup.size)
        return self._lookup[np.where(inside, shifted, 0)] & inside


class ProvenanceIndex:
    """Cells of the whole table holding any of a set of full slots (one chunked scan).

    Per slot it keeps the total count and the first `max_cells` cells in tier order: live cells
    of the batch first, then cells in the stale tails of batch rows, then idle rows. Vectorized:
    no Python loop per slot or per cell, so the work grows with the table and the cells kept.

    `threads` scan the table (the caller knows whether cores are free: `check` keeps them for
    its kernels). With `live=True` the same pass also keeps every cell of `live_cells(dump)`
    holding one of the slots (`live_cells()`), so `provenance --slot` checks its rows without
    gathering the whole batch's live ranges or scanning the table twice.
    """

    def __init__(
        self,
        dump: KvDump,
        slots: Iterable[int],
        *,
        max_cells: int = 16,
        live: bool = False,
        threads: int = 1,
    ) -> None:
        self.dump = dump
        self.max_cells = max_cells
        self._batch_rows = batch_rows_of(dump)
        wanted = np.array(sorted({int(s) for s in slots}), dtype=np.int64)
        self._slots = wanted
        self._counts = np.zeros(wanted.size, dtype=np.int64)
        empty = np.zeros(0, dtype=np.int64)
        self._kept = {"slot": empty, "tier": empty, "row": empty, "col": empty}
        self._live: list[tuple[NarrowColumn, ...]] | None = [] if live else None
        self._threads = threads
        if wanted.size:
            self._scan(wanted)

    @property
    def slots(self) -> frozenset[int]:
        """The slots this index answers for."""
        return frozenset(self._slots.tolist())

    def _scan(self, wanted: np.ndarray) -> None:
        batch_rows, ends = live_ends(self.dump)
        live_rows = self._first_live_rows() if self._live is not None else None
        members = SlotSet(wanted)
        one_slot = wanted.size == 1  # every hit is that slot: no search per hit
        for rows, cols, values in self.dump.req_to_token.find_cells(
            members.contains, chunk_cells=_SCAN_CELLS, threads=self._threads
        ):
            if batch_rows.size:
                at = np.minimum(np.searchsorted(batch_rows, rows), batch_rows.size - 1)
                in_batch = batch_rows[at] == rows
                end = np.where(in_batch, ends[at], 0)
            else:
                in_batch, end = np.zeros(rows.shape, dtype=bool), np.zeros_like(rows)
            tier = np.where(cols < end, _LIVE, np.where(in_batch, _STALE, _IDLE))
            slot_index = np.zeros_like(values) if one_slot else np.searchsorted(wanted, values)
            self._counts += np.bincount(slot_index, minlength=wanted.size)
            first = self._first_of_chunk(slot_index, tier)
            self._keep(values[first], tier[first], rows[first], cols[first])
            if live_rows is not None and live_rows[0].size:
                self._keep_live(live_rows, rows, cols, values)

    def _first_live_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The pool rows `live_cells` reads (sorted), the batch row it reads each for, and the
        length of its live range."""
        rpi = self.dump.req_pool_indices
        _, lens = _live_lengths(self.dump)
        batch_row = np.flatnonzero(lens > 0)
        order = np.argsort(rpi[batch_row], kind="stable")  # pool rows are unique here
        batch_row = batch_row[order]
        return rpi[batch_row].astype(np.int64), batch_row, lens[batch_row]

    def _keep_live(
        self,
        live_rows: tuple[np.ndarray, np.ndarray, np.ndarray],
        rows: np.ndarray,
        cols: np.ndarray,
        values: np.ndarray,
    ) -> None:
        pool_rows, batch_row, lens = live_rows
        at = np.minimum(np.searchsorted(pool_rows, rows), pool_rows.size - 1)
        live = (pool_rows[at] == rows) & (cols < lens[at])
        if live.any():
            assert self._live is not None
            # held narrow from the start: a slot every live cell holds keeps them all
            self._live.append(
                tuple(
                    NarrowColumn.of(column)
                    for column in (values[live], batch_row[at[live]], rows[live], cols[live])
                )
            )

    def live_cells(self) -> LiveCells:
        """The cells of `live_cells(self.dump)` that hold one of the slots, in its order.

        A shrunk dump's unknown cells read as 0 there, but the scan visits kept cells only:
        for slot 0 (padding) use `live_cells` itself. The cells are handed over, not kept: a
        second call finds none."""
        if self._live is None:
            raise ValueError("this index was built without live=True")
        parts = [list(p) for p in zip(*self._live, strict=True)] or [[] for _ in range(4)]
        self._live = []  # handed over, not kept twice: a slot every live cell holds is all of them
        # joined as held (each column reads back in the dtype joining the given ones makes), a
        # column at a time: each column's parts go as it is joined
        slot, batch_row, pool_row, position = (_joined(tuple(parts.pop(0))) for _ in range(4))
        # live_cells' order: batch row, position (sorted as held: the same order); the scan's
        # order (pool rows) already where batch rows read their pool rows in order
        if not _in_order(batch_row.values, position.values):
            order = np.lexsort((position.values, batch_row.values))
            # one column at a time: each unsorted one goes as its sorted one comes
            slot, pool_row = slot.take(order), pool_row.take(order)
            batch_row, position = batch_row.take(order), position.take(order)
            del order
        prefix, _ = _live_lengths(self.dump)
        pending = np.empty(len(position), dtype=bool)
        for a in range(0, pending.size, _LIVE_CHUNK):  # no int64 copy of every cell's prefix
            b = a + _LIVE_CHUNK
            pending[a:b] = position.values[a:b] >= prefix[batch_row.values[a:b]]
        return LiveCells(
            slot=slot,
            batch_row=_rows_held(batch_row),
            pool_row=_rows_held(pool_row),
            position=position,
            pending=pending,
        )

    def narrowed(self, max_cells: int) -> ProvenanceIndex:
        """This index as if built with a smaller `max_cells` (the same scan, fewer cells)."""
        if max_cells >= self.max_cells:
            return self
        narrow = copy.copy(self)
        narrow.max_cells = max_cells
        narrow._kept = self._first_per_slot(self._kept, max_cells)
        return narrow

    @staticmethod
    def _first_per_slot(kept: dict[str, np.ndarray], limit: int) -> dict[str, np.ndarray]:
        """The first `limit` cells of each slot of cells sorted by slot, then tier order."""
        rank = _rank_in_runs(kept["slot"])
        return {name: column[rank < limit] for name, column in kept.items()}

    def _first_of_chunk(self, slot_index: np.ndarray, tier: np.ndarray) -> np.ndarray:
        """The cells of one scanned chunk that may still be kept: the first `max_cells` of each
        (slot, tier) in the chunk's own order, which is the table's (row, then position). A
        cell behind them has `max_cells` cells of its slot ahead of it in tier order already,
        so merging only these keeps what merging them all would, at the cost of one stable
        sort of small integers instead of a four-key sort of every hit (a padding slot is
        held by most of the table)."""
        key = slot_index * (_IDLE + 1) + tier  # tiers are 0 .. _IDLE
        order = np.argsort(key, kind="stable")
        return order[_rank_in_runs(key[order]) < self.max_cells]

    def _keep(
        self, slots: np.ndarray, tier: np.ndarray, rows: np.ndarray, cols: np.ndarray
    ) -> None:
        """Merge new cells into the kept ones and keep the first `max_cells` per slot."""
        merged = {
            name: np.concatenate([self._kept[name], new])
            for name, new in (("slot", slots), ("tier", tier), ("row", rows), ("col", cols))
        }
        order = np.lexsort((merged["col"], merged["row"], merged["tier"], merged["slot"]))
        self._kept = self._first_per_slot(
            {name: column[order] for name, column in merged.items()}, self.max_cells
        )

    def kept_cells(self) -> tuple[np.ndarray, np.ndarray]:
        """(pool rows, positions) of every cell kept for any slot (what provenance can show)."""
        return self._kept["row"], self._kept["col"]

    def count(self, slot: int) -> int:
        """Cells of the whole table holding `slot`."""
        i = int(np.searchsorted(self._slots, slot))
        return int(self._counts[i]) if i < self._slots.size and self._slots[i] == slot else 0

    def cells(self, slot: int, frame: GroupFrame) -> tuple[tuple[Cell, ...], int]:
        """Cells holding `slot` (live ones first, at most `max_cells`) and their total count."""
        kept = self._kept  # sorted by slot, then tier, row, position
        lo, hi = np.searchsorted(kept["slot"], [slot, slot + 1])
        raw = zip(kept["row"][lo:hi].tolist(), kept["col"][lo:hi].tolist(), strict=True)
        labelled = []
        for row, pos in raw:
            batch_rows = tuple(self._batch_rows.get(row, ()))
            role, seed = cell_role(self.dump, frame, batch_rows[0] if batch_rows else None, pos)
            labelled.append((row, pos, batch_rows, role, seed))
        live_positions: dict[int, set[int]] = {}
        for row, pos, _, role, _ in labelled:
            if role.live:
                live_positions.setdefault(pos, set()).add(row)
        out = tuple(
            Cell(
                pool_row=row,
                position=pos,
                batch_rows=batch_rows,
                role=role,
                seed=seed,
                shared=len(live_positions.get(pos, ())) > 1 and row in live_positions[pos],
            )
            for row, pos, batch_rows, role, seed in labelled
        )
        return out, self.count(slot)

    def provenance(self, slot: int, frame: GroupFrame) -> SlotProvenance:
        """Full-space provenance of `slot`, roles labelled with `frame`'s window."""
        dump = self.dump
        cells, total = self.cells(slot, frame)
        lut = dump.full_to_swa_index_mapping
        swa_slot: int | None = None
        note: str | None = None
        if lut is None:
            note = "no LUT in this dump"
        elif slot < 0:
            note = "negative slots pass through untranslated"
        elif slot >= lut.shape[0]:
            note = (
                f"slot >= lut_len {lut.shape[0]}: REF raises, the GPU clamps to "
                f"LUT[{lut.shape[0] - 1}] = {lut.element(-1)}"
            )
        else:
            swa_slot = lut.element(slot)
            if swa_slot == 0:
                note = "unmapped (LUT = 0)"
        violations, violations_total = _violations(dump, slot, swa=False)
        return SlotProvenance(
            slot=slot,
            space=Space.FULL,
            cells=cells,
            cells_total=total,
            swa_slot=swa_slot,
            translation_note=note,
            allocator=_allocator_state(
                dump.free_full_slots,
                slot,
                dump.free_domain.get("full"),
                dump.scalar("num_full_slots"),
            ),
            canary=_canary_records(dump, "full", slot),
            violations=violations,
            violations_total=violations_total,
        )


#: live cells from which their batch rows and pool rows are held as runs (below it, arrays:
#: an ordinary batch's few hundred thousand cells are not decoded at every read).
_RUNS_FROM = 1 << 20


def _rows_held(column: NarrowColumn) -> HeldColumn:
    """A live cells' batch-row or pool-row column: a row's cells are one run of each, held as
    runs from `_RUNS_FROM` cells (ten million cells of a few thousand rows: a few KB, not 20
    MB a column), decoded where read."""
    return RunColumn.held_as_runs(column) if len(column) >= _RUNS_FROM else column


def _in_order(major: np.ndarray, minor: np.ndarray) -> bool:
    """Whether the (major, minor) pairs are in lexicographic order (as `np.lexsort((minor,
    major))` orders them), compared `_LIVE_CHUNK` pairs at a time."""
    for a in range(0, max(major.size - 1, 0), _LIVE_CHUNK):
        b = min(a + _LIVE_CHUNK, major.size - 1)
        here, after = major[a:b], major[a + 1 : b + 1]
        less = here < after
        if not (less | ((here == after) & (minor[a:b] <= minor[a + 1 : b + 1]))).all():
            return False
    return True


def _joined(parts: tuple[NarrowColumn, ...]) -> NarrowColumn:
    """Parts of one column, joined as held (empty: int64)."""
    if not parts:
        return NarrowColumn(np.zeros(0, dtype=np.int64), np.dtype(np.int64))
    given = np.result_type(*(part.dtype for part in parts))
    return NarrowColumn(np.concatenate([part.values for part in parts]), given)


def _rank_in_runs(ordered: np.ndarray) -> np.ndarray:
    """Each element's position in its run of equal values (`ordered` is grouped)."""
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    return np.arange(ordered.size) - np.repeat(starts, np.diff(np.r_[starts, ordered.size]))


_ROLE_TIER = {
    Role.VERIFY: _LIVE,
    Role.PREFIX: _LIVE,
    Role.CHAIN_PREV: _LIVE,
    Role.PENDING_WRITE: _LIVE,
    Role.STALE_TAIL: _STALE,
    Role.IDLE_ROW: _IDLE,
}


#: Why SWA slot 0 has no holders: every full slot without an SWA peer reads it.
_UNMAPPED_NOTE = (
    "SWA slot 0 is the reserved padding slot, and LUT[f] = 0 means full slot f has no SWA "
    "peer (unmapped): no full slot holds it"
)


def swa_provenance(
    dump: KvDump,
    index: ProvenanceIndex,
    swa_slot: int,
    mapped_from: tuple[int, ...],
    frame: GroupFrame,
    *,
    clamped_from: tuple[int, ...] = (),
) -> SlotProvenance:
    """SWA-space provenance: the full slots that reach `swa_slot`, and their cells.

    A full slot reaches it through its LUT entry (`mapped_from`) or, on the GPU path, by the
    clamp of a slot >= lut_len onto `LUT[lut_len - 1]` (`clamped_from`). Each cell names its
    full slot; live cells come first, whichever full slot they hold.
    """
    cells: list[Cell] = []
    total = 0
    for full_slot in (*mapped_from, *clamped_from):
        found, count = index.cells(full_slot, frame)
        cells.extend(replace(c, full_slot=full_slot) for c in found)
        total += count
    cells.sort(key=lambda c: _ROLE_TIER.get(c.role, _IDLE))
    violations, violations_total = _violations(dump, swa_slot, swa=True)
    return SlotProvenance(
        slot=swa_slot,
        space=Space.SWA,
        cells=tuple(cells[: index.max_cells]),
        cells_total=total,
        translation_note=_UNMAPPED_NOTE if swa_slot == 0 else None,
        mapped_from=mapped_from,
        clamped_from=clamped_from,
        allocator=_allocator_state(
            dump.free_swa_slots, swa_slot, dump.free_domain.get("swa"), dump.scalar("num_swa_slots")
        ),
        canary=_canary_records(dump, "swa", swa_slot),
        violations=violations,
        violations_total=violations_total,
    )


def clamp_target(dump: KvDump) -> int | None:
    """The SWA slot the GPU path clamps every slot >= lut_len onto (`LUT[lut_len - 1]`), when
    that is a real slot: a LUT that lost its trailing -1 (sliced) sends them somewhere."""
    lut = dump.full_to_swa_index_mapping
    if lut is None or lut.size == 0 or lut.element(-1) < 0:
        return None
    return lut.element(-1)


def clamped_sources(
    dump: KvDump, findings: Iterable[Finding], *, limit: int = 64
) -> tuple[int, ...]:
    """The full slots >= lut_len the SWA plan translates (its `LUT_OUT_OF_RANGE` findings):
    the GPU path redirects them to `clamp_target(dump)`."""
    if clamp_target(dump) is None:
        return ()
    parts = [
        cell_slots(f)
        for f in findings
        if f.code is FindingCode.LUT_OUT_OF_RANGE and f.slot is not None
    ]
    if not parts:
        return ()
    return tuple(int(s) for s in distinct(np.concatenate(parts))[:limit])


def full_slots_mapping_to(
    dump: KvDump, swa_slots: Iterable[int], *, limit: int = 64
) -> dict[int, tuple[int, ...]]:
    """For each SWA slot s, the full slots f with LUT[f] == s (one pass over the LUT); none
    for s <= 0 (0 is the LUT's "unmapped").

    The trailing -1 is the LUT's sentinel, not a mapping; a LUT whose last entry is not -1
    (sliced) maps its last index like any other. At most `limit` full slots per SWA slot.
    """
    every = sorted({int(s) for s in swa_slots})
    found: dict[int, tuple[int, ...]] = dict.fromkeys(every, ())
    # LUT[f] == 0 is "no SWA peer" (every unmapped full slot reads it), not a mapping to the
    # padding slot 0; nor does any entry map to a negative slot
    wanted = [s for s in every if s > 0]
    lut = dump.full_to_swa_index_mapping
    if lut is None or not wanted:
        return found
    stop = int(lut.shape[0]) - (1 if lut.element(-1) == -1 else 0)
    hits, held = lut.where_equal(np.asarray(wanted, dtype=np.int64), stop=stop)
    order = np.argsort(held, kind="stable")  # by SWA slot, full slots ascending
    values, hits = held[order], hits[order]
    starts = np.searchsorted(values, wanted, side="left")
    ends = np.searchsorted(values, wanted, side="right")
    for slot, a, b in zip(wanted, starts.tolist(), ends.tolist(), strict=True):
        found[slot] = tuple(hits[a : min(b, a + limit)].tolist())
    return found


#: Membership queries answered by a linear scan of a free list before it is sorted once: a
#: `provenance --slot` asks about a handful of slots (a scan each, milliseconds), a `check`
#: with findings about thousands (one sort, then binary searches).
_SCANS_BEFORE_SORT = 8


class _FreeList:
    """One free list's membership answers: scans at first, a sorted copy once it pays."""

    def __init__(self) -> None:
        self.scans = 0
        self.ordered: np.ndarray | None = None

    def holds(self, free: np.ndarray, slot: int) -> bool:
        """Whether `slot` is on `free` (the list this entry belongs to)."""
        if self.ordered is None and self.scans < _SCANS_BEFORE_SORT:
            self.scans += 1
            return bool((free == slot).any())
        if self.ordered is None:
            self.ordered = np.sort(free)
        i = int(np.searchsorted(self.ordered, slot))
        return i < self.ordered.size and int(self.ordered[i]) == slot


#: per free list (by identity; an entry dies with its array): a list can hold millions of
#: slots, and findings ask about it slot by slot.
_FREE_LISTS: dict[int, tuple[weakref.ref[np.ndarray], _FreeList]] = {}


def _free_list(free: np.ndarray) -> _FreeList:
    cached = _FREE_LISTS.get(id(free))
    if cached is not None and cached[0]() is free:
        return cached[1]
    key = id(free)
    entry = _FreeList()
    _FREE_LISTS[key] = (weakref.ref(free, lambda _: _FREE_LISTS.pop(key, None)), entry)
    return entry


def _allocator_state(
    free: np.ndarray | None,
    slot: int,
    known: np.ndarray | None = None,
    pool: int | None = None,
) -> AllocatorState | None:
    """`free`, `in use`, `below the pool (negative)` or `beyond the pool` (outside the `pool`
    slots the allocator hands out: never "in use"), `unknown (not kept)`, or None without a
    free list."""
    if free is None:
        return None
    if slot < 0:  # below every pool, whatever its size (known or not)
        return "below the pool (negative)"
    if pool is not None and slot >= pool:
        return "beyond the pool"
    if known is not None:  # sorted: a shrunk dump keeps the entries of its kept slots
        at = int(np.searchsorted(known, slot))
        if at >= known.size or int(known[at]) != slot:
            return "unknown (not kept)"
    return "free" if _free_list(free).holds(free, slot) else "in use"


def _canary_records(dump: KvDump, space: str, slot: int) -> tuple[CanaryEntry, ...]:
    records = []
    for name, buffer in sorted(dump.canary_buffers.items()):
        if not name.startswith(f"canary.{space}.") or not 0 <= slot < buffer.shape[0]:
            continue
        if buffer.shape[1] < 32:
            continue
        raw, known = buffer.take_known(slot * int(buffer.shape[1]) + np.arange(32))
        if not known.all():
            continue  # a shrunk dump that did not keep this record
        fields = raw.astype(np.uint8).view("<i8")
        records.append(
            CanaryEntry(
                buffer=name,
                token=int(fields[0]),
                position=int(fields[1]),
                prev_hash=int(fields[2]),
                real_kv_hash=int(fields[3]),
            )
        )
    return tuple(records)


#: ring rows a slot's provenance lists (`violations_total` counts them all).
VIOLATION_ROWS_SHOWN = 16
#: decoded rings, by the ring array's identity (a ring is decoded once, not per slot).
_DECODED: dict[int, tuple[weakref.ref[np.ndarray], np.ndarray]] = {}


def _ring_rows(ring: np.ndarray, write_index: int) -> np.ndarray:
    cached = _DECODED.get(id(ring))
    if cached is not None and cached[0]() is ring:
        return cached[1]
    key = id(ring)
    rows = decode_ring(ring, write_index).rows
    _DECODED[key] = (weakref.ref(ring, lambda _: _DECODED.pop(key, None)), rows)
    return rows


def _violations(dump: KvDump, slot: int, *, swa: bool) -> tuple[tuple[RingRow, ...], int]:
    """The first ring rows (docs/canary.md §4) whose slot is `slot`, in that slot's space,
    and how many there are."""
    ring = dump.violation_ring
    if ring is None or dump.violation_write_index is None:
        return (), 0
    rows = _ring_rows(ring, dump.violation_write_index)
    tags = rows[:, 0]
    mine = np.flatnonzero(
        (rows[:, 1] == slot) & (((tags >= _SWA_TAGS.start) & (tags < _SWA_TAGS.stop)) == swa)
    )
    shown = tuple(
        RingRow(index=int(i), fields=tuple(int(x) for x in rows[i]))
        for i in mine[:VIOLATION_ROWS_SHOWN]
    )
    return shown, int(mine.size)


# -- a finding's owners: for each slot its provenance lists, the current or last owner (pool
# row, position, what the request is), so a report names who held a double-freed or stale slot
# without a second command; an idle pool row told apart by the dump's request row lists.


class RowStates:
    """What the dump's request row lists say of an idle pool row (sorted arrays, as long as
    the pool has rows: built once per dump, and only when an owner is an idle pool row)."""

    def __init__(self, dump: KvDump) -> None:
        self._dump = dump

    @cached_property
    def _lists(self) -> tuple[np.ndarray, np.ndarray]:
        """(the free pool rows, the running ones)."""
        dump = self._dump
        rows = int(dump.req_to_token.shape[0])
        free = distinct(pool_rows(dump.free_req_rows, rows))
        return free, distinct(pool_rows(dump.running_req_rows, rows))

    def idle(self, pool_row: int) -> OwnerState:
        """`finished` (on the free list), `held` (a running request's), else `idle`."""
        free, running = self._lists
        if _has(free, pool_row):
            return "finished"
        if _has(running, pool_row):
            return "held"
        return "idle"


def _has(values: np.ndarray, value: int) -> bool:
    i = int(np.searchsorted(values, value))
    return i < values.size and int(values[i]) == value


def slot_owners(provenance: Sequence[SlotProvenance], rows: RowStates) -> tuple[FindingOwner, ...]:
    """Per slot of `provenance`, its first cell as its owner (none: no cell holds it)."""
    owners = []
    for p in provenance:
        if not p.cells:
            owners.append(
                FindingOwner(slot=p.slot, space=p.space, pool_row=None, position=None, state=None)
            )
            continue
        cell = p.cells[0]
        state: OwnerState
        if cell.role == Role.STALE_TAIL:
            state = "stale-tail"
        elif cell.role == Role.IDLE_ROW:
            state = rows.idle(cell.pool_row)
        else:
            state = "running"
        owners.append(
            FindingOwner(
                slot=p.slot,
                space=p.space,
                pool_row=cell.pool_row,
                position=cell.position,
                state=state,
                batch_row=cell.batch_rows[0] if cell.batch_rows else None,
                full_slot=cell.full_slot,
                holders=p.cells_total,
            )
        )
    return tuple(owners)


#: Owners a headline names before it counts the rest.
_OWNERS_NAMED = 2
