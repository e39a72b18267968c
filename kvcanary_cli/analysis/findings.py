"""Finding detectors: every offending slot, row or tensor of a dump, not just the first.

Detectors select offenders with vectorized masks (numpy, over the batch rows or the batch's
live cells) and build one `Finding` per offender, without provenance; `check` attaches
provenance to all of them in one table scan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import cast

import numpy as np

from kvcanary_cli.analysis.coverage import FULL_FREE_LIST, STEP_WRITES, SWA_FREE_LIST, SWA_LUT, runs
from kvcanary_cli.analysis.provenance import LiveCells, SlotSet
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import RESERVED_PAGES_KEY, SCALARS, Group, dtype_label, parse_integer
from kvcanary_cli.dump.tensor import distinct, fold_at
from kvcanary_cli.planners.base import Plan, ProblemKind, ProblemRole, ProblemTable
from kvcanary_cli.planners.frame import launch_limit
from kvcanary_cli.results.cells import CellColumns, NarrowColumn, Role, RunColumn, Space
from kvcanary_cli.results.check import Finding, JsonValue

__all__ = [
    "batch_findings",
    "held_twice",
    "lut_findings",
    "plan_findings",
    "reserved_pages",
    "slot_findings",
    "step_writes",
    "swa_findings",
    "write_findings",
]


def batch_findings(dump: KvDump) -> list[Finding]:
    """Row- and tensor-level findings that need no plan: indices, lengths, limits, dtypes."""
    found: list[Finding] = []
    rpi = dump.req_pool_indices
    prefix = dump.prefix_lens
    extend = dump.extend_seq_lens
    msl, max_reqs = dump.max_seq_len, dump.max_reqs
    active = rpi != 0
    out_of_range = active & ((rpi < 0) | (rpi >= max_reqs))
    claimed_p, claimed_e = np.maximum(prefix, 0), np.maximum(extend, 0)
    # P + E > msl, written so that no claimed length can overflow
    beyond = active & ~out_of_range & ((claimed_p > msl) | (claimed_e > msl - claimed_p))
    for r in np.flatnonzero(out_of_range).tolist():
        rp = int(rpi[r])
        found.append(
            Finding(
                code=FindingCode.ROW_OUT_OF_RANGE,
                group=Group.FULL,
                batch_row=r,
                pool_row=rp,
                message=f"req_pool_indices[{r}] = {rp} is outside [0, {max_reqs}): the GPU "
                "reads out of bounds"
                + (
                    f"; REF silently reads pool row {max_reqs + rp}"
                    if -max_reqs <= rp < 0
                    else "; REF raises IndexError"
                ),
                details={"max_reqs": max_reqs},
            )
        )
    for r in np.flatnonzero(beyond).tolist():
        p, e = int(prefix[r]), int(extend[r])
        found.append(
            Finding(
                code=FindingCode.PREFIX_BEYOND_ROW,
                group=Group.FULL,
                batch_row=r,
                pool_row=int(rpi[r]),
                position=msl,
                message=f"P={p}, P+E={p + e} exceed max_seq_len={msl}: the GPU reads "
                f"{'the following pool rows' if p > msl else 'past the pool row'}",
                details={"prefix_len": p, "extend_len": e, "max_seq_len": msl},
            )
        )
    for name, values in (("prefix_lens", prefix), ("extend_seq_lens", extend)):
        for r in np.flatnonzero(active & (values < 0)).tolist():
            found.append(
                Finding(
                    code=FindingCode.NEGATIVE_LENGTH,
                    group=Group.FULL,
                    batch_row=r,
                    pool_row=int(rpi[r]),
                    message=f"{name}[{r}] = {int(values[r])} is negative (treated as 0)",
                    details={"tensor": name, "value": int(values[r])},
                )
            )
    order = np.argsort(rpi, kind="stable")
    ordered = rpi[order]
    repeats = np.flatnonzero((ordered[1:] == ordered[:-1]) & (ordered[1:] != 0)) + 1
    if repeats.size:
        run_start = np.maximum.accumulate(
            np.where(np.r_[True, ordered[1:] != ordered[:-1]], np.arange(ordered.size), 0)
        )
        for i in repeats.tolist():
            r, first = int(order[i]), int(order[run_start[i]])
            found.append(
                Finding(
                    code=FindingCode.DUPLICATE_REQUEST_ROW,
                    group=Group.FULL,
                    batch_row=r,
                    pool_row=int(rpi[r]),
                    message=f"pool row {int(rpi[r])} is used by batch rows {first} and {r}",
                    details={"first_batch_row": first},
                )
            )
    limit = launch_limit(dump.bs, dump.write_req_capacity)
    if limit is not None:
        found.append(
            Finding(
                code=FindingCode.KERNEL_LIMIT_EXCEEDED,
                group=Group.FULL,
                message=f"bs={limit.bs} exceeds {limit.name}={limit.limit}: the GPU plan path "
                "raises before launching",
                details={"bs": limit.bs, "limit": limit.limit},
            )
        )
    for rejected in dump.rejected_scalars:
        spec = SCALARS[rejected.name]
        found.append(
            Finding(
                code=FindingCode.SCALAR_OUT_OF_RANGE,
                group=Group.FULL,
                message=f"{rejected.name} (in the dump's {rejected.source}) {rejected.reason}: "
                f"corrupt; planned as if not recorded (default: {spec.default}; pass "
                f"{spec.option} with the real value)",
                details={
                    "scalar": rejected.name,
                    "value": rejected.value,
                    "option": spec.option,
                    "minimum": spec.minimum,
                    "maximum": spec.maximum,
                },
            )
        )
    for note in dump.dtype_notes:
        found.append(
            Finding(
                code=FindingCode.GPU_DTYPE_MISMATCH,
                group=Group.FULL,
                message=f"{note.tensor} is {dtype_label(note.found)}; the production GPU path "
                f"requires {dtype_label(note.expected)} (kvcanary read it anyway)",
                details={
                    "tensor": note.tensor,
                    "found": dtype_label(note.found),
                    "expected": dtype_label(note.expected),
                },
            )
        )
    return found


#: Cells a finding lists in its details (positions, other cells): a sample, with the total.
SAMPLE_CELLS = 8


def _cell_records(
    code: FindingCode,
    cells: LiveCells,
    offending: np.ndarray,
    message: Callable[[int], str],
    *,
    run_what: str,
    group: Group = Group.FULL,
    space: Space = Space.FULL,
    slots: np.ndarray | None = None,
    role: Callable[[int], Role | None] | None = None,
    details: Callable[[int], dict[str, object]] | None = None,
    shared_details: Callable[[int], dict[str, object]] | None = None,
    full_slots: Callable[[int], tuple[int, ...]] | None = None,
    split: np.ndarray | None = None,
    columns: dict[str, np.ndarray] | None = None,
) -> list[Finding]:
    """One finding group per role of the offending cells (ascending indices into `cells`, or
    a mask over them: ten million cells are then gathered with no int64 index of them all),
    holding all of them as columns.

    `slots` (aligned with `cells`) replaces the slot reported (an SWA slot, say); `split`
    (aligned with `offending`) keeps cells with different values (a role set) in different
    groups; `columns` (aligned with `cells`) are the code's own per-cell columns. A group of
    one cell says what that cell is (`message`, `details`); a larger one what its cells
    share (`run_what`); `shared_details` (of the group's first cell) are the same for every
    cell of a group, and go with every group.
    """
    offending = np.asarray(offending)
    masked = offending.dtype == np.bool_
    if masked:
        assert offending.shape == (len(cells),)
    else:
        offending = offending.astype(np.int64, copy=False)
    if not (offending.any() if masked else offending.size):
        return []
    # the slots as held (value reads only; `CellColumns` reads them back as int64)
    reported = cells.held("slot") if slots is None else slots
    key: np.ndarray | None = None
    if masked and split is None:  # pending or not, counted a piece at a time (no copy)
        values = _pending_values(cells.pending, offending)
    else:
        pending = cells.pending[offending]
        if split is None:
            key = pending.view(np.uint8)  # 0 or 1: a byte a cell
        else:
            key = pending.astype(np.int64) * (int(split.max(initial=0)) + 1) + split.astype(
                np.int64
            )
        del pending
        values = distinct(key).tolist()
    found: list[Finding] = []
    # the rows and positions as held, read at a cell (runs: not decoded whole)
    batch_rows, pool_rows, positions = (
        cells.readable(n) for n in ("batch_row", "pool_row", "position")
    )
    for value in values:
        # ascending: batch row, then position (one key: all of them, not a copy)
        if len(values) == 1:
            members = offending
        elif key is None:  # a mask of the cells pending (1) or not (0)
            members = offending & (cells.pending == bool(value))
        elif masked:
            members = np.zeros(offending.shape, dtype=bool)
            members[offending] = key == value
        else:
            members = offending[key == value]
        first = int(np.argmax(members)) if masked else int(members[0])
        one = (int(np.count_nonzero(members)) if masked else members.size) == 1
        cell_columns = CellColumns.gathered(
            members,
            batch_row=cells.column("batch_row"),
            pool_row=cells.column("pool_row"),
            position=cells.column("position"),
            slot=cells.column("slot") if slots is None else slots,
            extra=columns,
        )
        found.append(
            Finding(
                code=code,
                group=group,
                slot=int(reported[first]),
                space=space,
                batch_row=int(batch_rows[first]),
                pool_row=int(pool_rows[first]),
                position=int(positions[first]),
                role=(role(first) if role else None)
                or (Role.PENDING_WRITE if cells.pending[first] else Role.VERIFY),
                message=message(first) if one else run_what,
                details=cast(
                    dict[str, JsonValue],
                    {
                        **(shared_details(first) if shared_details else {}),
                        **(details(first) if details and one else {}),
                    },
                ),
                full_slots=full_slots(first) if full_slots else (),
                cells=cell_columns,
            )
        )
    return found


def _pending_values(pending: np.ndarray, offending: np.ndarray) -> list[int]:
    """Of the cells a mask picks, whether any is not pending (0) and any is (1): the keys
    `np.unique` finds among their `pending` bytes, counted a piece at a time."""
    seen = [False, False]
    for a in range(0, offending.size, _PENDING_PIECE):
        picked = offending[a : a + _PENDING_PIECE]
        here = int(np.count_nonzero(picked))
        if not here:
            continue
        waiting = int(np.count_nonzero(picked & pending[a : a + _PENDING_PIECE]))
        seen[0] |= waiting < here
        seen[1] |= waiting > 0
    return [value for value in (0, 1) if seen[value]]


#: Cells `_pending_values` reads at a time.
_PENDING_PIECE = 1 << 20


def reserved_pages(dump: KvDump) -> int:
    """Full-pool pages `0 .. N - 1` no request may hold: the padding page, or a page-interleave
    allocator's `shard_size` (every rank's physical page 0)."""
    value = parse_integer(dump.metadata.get(RESERVED_PAGES_KEY) or "1")
    return value if value is not None and 1 <= value < 1 << 31 else 1


def slot_findings(dump: KvDump, cells: LiveCells) -> list[Finding]:
    """Full-space slot findings over the live cells."""
    found: list[Finding] = []
    slot = cells.held("slot")  # compared, counted and shown only: as held
    found += _cell_records(
        FindingCode.NEGATIVE_SLOT,
        cells,
        np.flatnonzero(slot < 0),
        lambda i: f"live cell holds negative slot {slot[i]}",
        run_what="negative slots",
    )
    found += _cell_records(
        FindingCode.PADDING_SLOT_IN_LIVE_RANGE,
        cells,
        np.flatnonzero((slot == 0) & ~cells.pending),
        lambda i: (
            "live prefix position holds slot 0 (never written or zeroed): the canary skips it"
        ),
        run_what="slot 0 (never written or zeroed): the canary skips them",
    )
    reserved = reserved_pages(dump) * max(1, dump.scalar("page_size") or 1)
    if reserved_pages(dump) > 1:  # pages past the padding page a page-interleave pool reserves
        found += _cell_records(
            FindingCode.RESERVED_SLOT_IN_USE,
            cells,
            np.flatnonzero((slot > 0) & (slot < reserved)),
            lambda i: (
                f"live cell holds slot {slot[i]} of a reserved page (slots 0 .. {reserved - 1})"
            ),
            run_what=f"slots of reserved pages (slots 0 .. {reserved - 1})",
            shared_details=lambda i: {"reserved_slots": reserved},
        )
    pool = dump.scalars["num_full_slots"]
    if pool.value is not None:
        # With a derived pool size (lut_len - 1) the finding holds only if the LUT is right.
        assumes = ("num_full_slots",) if pool.assumed else ()
        size = pool.value
        beyond = _cell_records(
            FindingCode.SLOT_BEYOND_POOL,
            cells,
            np.flatnonzero(slot >= size),
            lambda i: f"live slot {slot[i]} is beyond the full pool ({size} slots, {pool.source})",
            run_what=f"slots beyond the full pool ({size} slots, {pool.source})",
            shared_details=lambda i: {"num_full_slots": size},
        )
        found += [replace(f, assumes=assumes) for f in beyond]
    # A duplicate or an alias needs two cells holding one slot; most live slots have one.
    # (Each mask is a byte a cell, made where it is read, not held through the detectors.)
    shared = held_twice(slot, slot > 0)
    found.extend(_duplicates_in_row(cells, shared))
    found.extend(_shared_across_positions(cells, shared))
    invalid = slot <= 0 if pool.value is None else (slot <= 0) | (slot >= pool.value)
    found.extend(_shared_without_prefix(cells, shared, invalid))
    del shared, invalid
    free = dump.free_full_slots
    if runs(dump, FULL_FREE_LIST) and free is not None:
        found += _cell_records(
            FindingCode.FREED_SLOT_IN_LIVE_RANGE,
            cells,
            np.flatnonzero((slot > 0) & SlotSet(free).contains(slot)),
            lambda i: f"live slot {slot[i]} is on the allocator's free list (use after free)",
            run_what="slots on the allocator's free list (use after free)",
        )
    if runs(dump, STEP_WRITES):
        found.extend(write_findings(dump, cells))
    return found


#: Slot values up to this many times the cells counted with one `bincount` (else one sort).
_BINCOUNT_SPAN = 4


def held_twice(slot: np.ndarray, among: np.ndarray | None = None) -> np.ndarray:
    """The cells of `among` (default: every cell) whose slot another cell of `among` also
    holds.

    Slots are counted with a `bincount` when their values are non-negative and within a few
    times the cell count (the usual pool), otherwise by one sort: never by the values alone,
    which a corrupt dump chooses. A mask selects the cells and takes the answer back: ten
    million cells make a byte each, no int64 index or count of them."""
    values = slot if among is None else slot[among]
    out = np.zeros(slot.shape, dtype=bool)
    if values.size < 2:
        return out
    if int(values.min()) >= 0 and int(values.max()) < _BINCOUNT_SPAN * values.size + (1 << 20):
        twice = _counted_twice(values)
    else:
        order = np.argsort(values, kind="stable")
        ordered = values[order]
        same = ordered[1:] == ordered[:-1]
        twice = np.zeros(values.size, dtype=bool)
        twice[order[1:][same]] = True
        twice[order[:-1][same]] = True
    if among is None:
        return twice
    out[among] = twice
    return out


#: Cells `_counted_twice` counts or looks up at a time (bounds its int64 temporaries).
_COUNT_CHUNK = 1 << 20


def _counted_twice(values: np.ndarray) -> np.ndarray:
    """Which of `values` (non-negative, a few times their count at most) another value
    equals: counted per value, then looked up per value, `_COUNT_CHUNK` at a time (a
    `bincount` or an index of a narrow column widens it whole: 80 MB for ten million cells)."""
    span = int(values.max()) + 1
    counts = np.zeros(span, dtype=np.int64)
    for start in range(0, values.size, _COUNT_CHUNK):
        counts += np.bincount(values[start : start + _COUNT_CHUNK], minlength=span)
    many = counts > 1
    del counts
    twice = np.empty(values.size, dtype=bool)
    for start in range(0, values.size, _COUNT_CHUNK):
        stop = start + _COUNT_CHUNK
        twice[start:stop] = many[values[start:stop]]
    return twice


def _holding(values: np.ndarray) -> np.dtype:
    """The narrowest integer dtype holding every one of `values` (and 0)."""
    if not NarrowColumn.enabled:  # tests hold every column wide to compare results
        return np.dtype(np.int64)
    low, high = (int(values.min()), int(values.max())) if values.size else (0, 0)
    for dtype in (np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32)):
        if np.iinfo(dtype).min <= min(low, 0) and max(high, 0) <= np.iinfo(dtype).max:
            return dtype
    return np.dtype(np.int64)


#: Values `_ranks` looks up at a time (bounds its int64 temporaries).
_RANK_CHUNK = 1 << 20


def _ranks(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`np.searchsorted(keys, values)` in the narrowest unsigned dtype holding every rank,
    made `_RANK_CHUNK` values at a time: ten million cells of a few slots rank into a byte
    a cell, never eight."""
    ranks = np.empty(values.shape, dtype=np.min_scalar_type(keys.size))
    for start in range(0, values.size, _RANK_CHUNK):
        stop = start + _RANK_CHUNK
        ranks[start:stop] = np.searchsorted(keys, values[start:stop])
    return ranks


def _key_runs(
    sid: np.ndarray, position: np.ndarray, low: int, span: int, ranks: int
) -> tuple[np.ndarray, np.ndarray]:
    """The distinct keys `rank * span + position - low` of the cells (`sid`: each cell's
    slot rank, of `ranks`), ascending (int64), and how many cells hold each.

    Where the keys number an eighth of the cells at most, they are counted a chunk of cells at
    a time (their counts take a byte a cell at most, and no key a cell is made); otherwise
    sorted as one narrow key a cell, whose runs are found a chunk at a time."""
    count, keys = sid.size, ranks * span

    def keyed(a: int, b: int) -> np.ndarray:
        return sid[a:b].astype(np.int64) * span + (position[a:b].astype(np.int64) - low)

    if keys * 8 <= count:
        counts = np.zeros(keys, dtype=np.int64)
        for a, b in _pieces(count):
            counts += np.bincount(keyed(a, b), minlength=keys)
        held = np.flatnonzero(counts)
        return held, counts[held]
    place = np.empty(count, dtype=np.min_scalar_type(keys - 1))
    for a, b in _pieces(count):
        place[a:b] = keyed(a, b)
    place.sort()
    starts = np.concatenate(
        [np.zeros(1, dtype=np.int64)]
        + [
            np.flatnonzero(place[a + 1 : b + 1] != place[a:b]) + (a + 1)
            for a, b in _pieces(count - 1)
        ]
    )
    return place[starts].astype(np.int64), np.diff(np.r_[starts, count])


def _group_starts(sorted_keys: list[np.ndarray]) -> np.ndarray:
    """Where each run of equal key tuples begins in sorted order."""
    change = np.zeros(sorted_keys[0].size, dtype=bool)
    change[0] = True
    for key in sorted_keys:
        change[1:] |= key[1:] != key[:-1]
    return np.flatnonzero(change)


def _duplicates_in_row(cells: LiveCells, real: np.ndarray) -> list[Finding]:
    """Every cell after the first of a slot that sits at several positions of one row (found
    with one sort of a chunk of whole rows at a time; a one-cell finding lists the slot's
    positions)."""
    count = int(np.count_nonzero(real))
    if count < 2:
        return []
    # compared and sorted only: the columns as held (every cell: themselves, not copies; the
    # pool rows read a chunk at a time where they are held as runs)
    all_slot, all_position = cells.held("slot"), cells.held("position")
    all_row = cells.readable("pool_row")
    idx = None if count == len(cells) else np.flatnonzero(real)
    row, slot = (all_row, all_slot) if idx is None else (all_row[idx], all_slot[idx])
    # a pool row's cells are one run of the live cells (`live_cells`): sorted a chunk of
    # whole rows at a time, ten million cells of one slot never make an int64 index of all
    repeats = np.zeros(len(cells), dtype=bool)
    for start, stop in _row_chunks(row):
        # stable: a slot's cells in one row stay in cell order, which is position order
        order = np.lexsort((slot[start:stop], row[start:stop]))
        same = np.ones(max(order.size - 1, 0), dtype=bool)
        for column in (row, slot):  # one sorted copy at a time (a slot may be every cell's)
            ordered = column[start:stop][order]
            same &= ordered[1:] == ordered[:-1]
            del ordered
        found = order[1:][same] + start
        repeats[found if idx is None else idx[found]] = True
        del order, same, found

    def positions(i: int) -> np.ndarray:
        """The positions of cell i's slot in its row, sorted (found a piece at a time)."""
        at_row, at_slot = all_row[i], all_slot[i]
        position = all_position if idx is None else all_position[idx]
        here = [
            position[a:b][(row[a:b] == at_row) & (slot[a:b] == at_slot)]
            for a, b in _pieces(len(slot))
        ]
        return np.sort(np.concatenate(here))

    def message(i: int) -> str:
        at = positions(i)
        shown = [int(p) for p in at[:SAMPLE_CELLS]]
        listed = str(shown) if at.size <= SAMPLE_CELLS else f"{str(shown)[:-1]}, ...]"
        many = f"{at.size} positions " if at.size > SAMPLE_CELLS else ""
        return f"slot {all_slot[i]} sits at {many}positions {listed} of pool row {all_row[i]}"

    return _cell_records(
        FindingCode.DUPLICATE_SLOT_IN_ROW,
        cells,
        repeats,
        message,
        run_what="slots that also sit at other positions of the same pool row",
        details=lambda i: {
            "positions": [int(p) for p in positions(i)[:SAMPLE_CELLS]],
            "positions_total": int(positions(i).size),
        },
    )


def _row_chunks(row: np.ndarray | RunColumn) -> Iterator[tuple[int, int]]:
    """`[start, stop)` spans of about `_RANK_CHUNK` cells (more where one row is longer)
    covering `row`, each cut where the row changes: a row's cells are in one span."""
    size = len(row)
    changes = np.concatenate(
        [np.zeros(0, dtype=np.int64)]
        + [
            np.flatnonzero(piece[1:] != piece[:-1]) + (a + 1)
            for a, b in _pieces(max(size - 1, 0))
            for piece in (row[a : b + 1],)
        ]
    )
    start = 0
    while start < size:
        after = int(np.searchsorted(changes, start + _RANK_CHUNK, side="left"))
        stop = int(changes[after]) if after < changes.size else size
        yield start, stop
        start = stop


def _pieces(size: int) -> Iterator[tuple[int, int]]:
    """`[a, b)` spans of `_RANK_CHUNK` entries covering `0 .. size`."""
    for a in range(0, size, _RANK_CHUNK):
        yield a, min(a + _RANK_CHUNK, size)


def _shared_across_positions(cells: LiveCells, real: np.ndarray) -> list[Finding]:
    """Cells holding a slot that other rows hold at another position (radix sharing puts one
    slot at one position in many rows; only a second position is aliasing).

    Per slot, the position most of its cells agree on is the owner's (on a tie the smallest;
    when no two agree, the position of its first cell) and every other cell is a copy; each
    copy carries its slot's owner position (column `owner_position`). Everything is computed
    per slot from one sort of a narrow (slot, position) key a cell, not per cell.
    """
    count = int(np.count_nonzero(real))
    if count == 0:
        return []
    # compared, sorted and counted only: the columns as held (every cell: themselves, and no
    # index of them; the pool rows read a chunk at a time where they are held as runs)
    all_slot, all_position = cells.held("slot"), cells.held("position")
    all_row = cells.readable("pool_row")
    idx = None if count == len(cells) else np.flatnonzero(real)
    if idx is None:
        slot, position, row = all_slot, all_position, all_row
    else:
        slot, position, row = all_slot[idx], all_position[idx], all_row[idx]
    # each slot's rank (narrow), and the runs of one (slot, position) in slot-major then
    # position order: counted, or sorted as one narrow key a cell, with no index of the cells
    # sorted (ten million cells of one slot: 150 MiB)
    slots = distinct(slot)
    sid = _ranks(slots, slot)
    low = int(position.min())
    span = int(position.max()) - low + 1
    run_key, run_len = _key_runs(sid, position, low, span, slots.size)
    run_slot = run_key // span
    run_position = run_key % span + low
    positions_per_slot = np.bincount(run_slot, minlength=slots.size)
    # held by several rows: its rows' smallest and largest differ (no sort by row); its
    # first cell in cell order; made a chunk of cells at a time
    lowest = np.full(slots.size, np.iinfo(np.int64).max, dtype=np.int64)
    highest = np.full(slots.size, np.iinfo(np.int64).min, dtype=np.int64)
    first_cell = np.full(slots.size, count, dtype=np.int64)
    for a in range(0, count, _RANK_CHUNK):
        b = min(a + _RANK_CHUNK, count)
        fold_at(np.minimum, lowest, sid[a:b], row[a:b])
        fold_at(np.maximum, highest, sid[a:b], row[a:b])
        fold_at(np.minimum, first_cell, sid[a:b], np.arange(a, b))
    suspect = (positions_per_slot > 1) & (lowest != highest)
    del lowest, highest
    if not suspect.any():
        return []
    # owner position per slot: the longest run (first = smallest position on a tie); when
    # every run has length 1, the position of the slot's first cell in cell order.
    longest = np.zeros(slots.size, dtype=np.int64)
    fold_at(np.maximum, longest, run_slot, run_len)
    is_best = run_len == longest[run_slot]
    first_best = np.full(slots.size, run_key.size, dtype=np.int64)
    fold_at(np.minimum, first_best, run_slot[is_best], np.flatnonzero(is_best))
    best = run_position[first_best]
    owner = np.where(longest > 1, best, position[first_cell]).astype(position.dtype)
    # in cell order, a chunk of cells at a time: which cells are copies, and each cell's owner
    # position, in the narrowest dtype holding the owners' (read back as int64)
    copy = np.empty(count, dtype=bool)
    owner_position = np.zeros(len(cells), dtype=_holding(owner))
    for a, b in _pieces(count):
        owner_here = owner[sid[a:b]]
        copy[a:b] = suspect[sid[a:b]] & (position[a:b] != owner_here)
        owner_position[slice(a, b) if idx is None else idx[a:b]] = owner_here
        del owner_here
    del sid
    if not copy.any():
        return []

    def holders(i: int) -> list[tuple[int, int]]:
        """(pool row, position) of the cells holding cell i's slot, in cell order."""
        here = np.flatnonzero(slot == all_slot[i])
        return list(zip(row[here].tolist(), position[here].tolist(), strict=True))

    def message(i: int) -> str:
        at = [c for c in holders(i) if c[1] == owner_position[i]][:3]
        return (
            f"slot {all_slot[i]} is also live at (pool row, position) "
            f"{', '.join(map(str, at))}: aliased across requests"
        )

    def others(i: int) -> list[list[int]]:
        near = [c for c in holders(i) if c[0] != all_row[i]]
        return [list(c) for c in near[:SAMPLE_CELLS]]

    return _cell_records(
        FindingCode.SLOT_SHARED_ACROSS_POSITIONS,
        cells,
        copy if idx is None else idx[copy],  # a mask of every cell: no index of them all
        message,
        run_what="slots that other requests hold at another position: aliased across requests",
        details=lambda i: {"other_cells": others(i)},
        columns={"owner_position": owner_position},
    )


def _shared_without_prefix(
    cells: LiveCells, real: np.ndarray, invalid: np.ndarray
) -> list[Finding]:
    """Cells holding the same slot at the same position as another row, where the rows hold
    different slots just before it: a radix tree shares whole prefixes, so that is a copy, not
    sharing (SGLang's own fault injector, `perturb/req_to_token.py`, makes exactly this).

    Checking the position before suffices: a pair shared at p and p - 1 is, by the same rule
    at p - 1, shared down to position 0. Which cell of a broken group is the copy: the one
    whose cell before is not the group's most common; on a tie, the one whose row shares the
    position before with some row (it sat in a radix run, and the copy broke it), else every
    one. A group broken only because a cell just before it is blamed, or is `invalid` (a
    slot no pool holds, which other codes report), is that cell's echo.
    """
    n = len(cells)
    if n < 2 or int(np.count_nonzero(real)) < 2:
        return []
    # compared, sorted and shown only: the columns as held (read once, never copied whole;
    # the pool rows a piece at a time where they are held as runs); the one sum (`_follows`)
    # is taken in int64
    c_slot, c_position = cells.held("slot"), cells.held("position")
    c_row = cells.readable("pool_row")
    # whether each cell (but the first) is one position after the cell before it, same row
    follows = _follows(c_row, c_position)
    # the slot one position earlier in the same row (-1: none), as held
    prior_slot = np.full(n, -1, dtype=np.result_type(c_slot.dtype, np.int8))
    prior_slot[1:][follows] = c_slot[:-1][follows]
    # cells whose (position, slot) another row also holds (sharing, or a copy); only groups
    # whose cells before disagree can hold a copy (none in a clean state)
    same_place, candidates = _place_groups(c_position, c_slot, prior_slot, real)
    if candidates.size == 0:
        return []
    # the cell one position earlier in the same row (-1: none)
    before = np.full(n, -1, dtype=np.int64)
    before[1:][follows] = np.flatnonzero(follows)
    prior_shared = np.where(before >= 0, same_place[np.maximum(before, 0)], False)
    two_before = np.where(before >= 0, before[np.maximum(before, 0)], -1)
    # the row shared two positions back but not one: its cell before is a lone gap in a shared
    # run (a bad cell other codes report), and this cell only its echo
    gap_echo = ~prior_shared & (two_before >= 0) & same_place[np.maximum(two_before, 0)]

    def blame(members: np.ndarray) -> np.ndarray:
        """The blamed cells among `members` (cell indices), grouped by (position, slot)."""
        if members.size == 0:
            return members
        o = np.lexsort((prior_slot[members], c_slot[members], c_position[members]))
        m = members[o]
        group = _group_starts([c_position[m], c_slot[m]])
        sizes = np.diff(np.r_[group, m.size])
        gid = np.repeat(np.arange(group.size), sizes)
        runs = _group_starts([c_position[m], c_slot[m], prior_slot[m]])
        run_size = np.diff(np.r_[runs, m.size])
        run_group = gid[runs]
        broken = (sizes > 1) & (np.bincount(run_group, minlength=group.size) > 1)
        largest = np.zeros(group.size, dtype=np.int64)
        fold_at(np.maximum, largest, run_group, run_size)
        top = run_size == largest[run_group]
        single = np.bincount(run_group[top], minlength=group.size) == 1
        run_of = np.repeat(np.arange(runs.size), run_size)
        common = top[run_of] & single[gid]
        odd = broken[gid] & ~common
        # a tie: the members whose row sat in a radix run just before, when only some did
        tie = broken[gid] & ~single[gid]
        in_run = prior_shared[m]
        some = np.bincount(gid[tie & in_run], minlength=group.size) > 0
        every = np.bincount(gid[tie & in_run], minlength=group.size) == sizes
        narrow = tie & some[gid] & ~every[gid]
        odd &= ~narrow | in_run
        odd &= ~(gap_echo[m] & single[gid])  # a lone gap's echo, against a majority run
        return np.sort(m[odd])

    def without_echoes(echo: np.ndarray) -> np.ndarray:
        """The candidates but groups whose disagreement comes from an `echo` cell (a
        mask) just before one of their members."""
        o = np.lexsort((c_slot[candidates], c_position[candidates]))
        c = candidates[o]
        starts = _group_starts([c_position[c], c_slot[c]])
        sizes = np.diff(np.r_[starts, c.size])
        gid = np.repeat(np.arange(starts.size), sizes)
        echoed = np.bincount(gid, weights=echo[np.maximum(before[c], 0)] & (before[c] >= 0))
        kept: np.ndarray = c[echoed[gid] == 0]
        return kept

    first = blame(without_echoes(invalid))
    if first.size == 0:
        return []
    echo = invalid.copy()
    echo[first] = True
    blamed = blame(without_echoes(echo))

    def partners(i: int) -> list[int]:
        same = np.flatnonzero((c_position == c_position[i]) & (c_slot == c_slot[i]))
        return sorted({int(r) for r in c_row[same]} - {int(c_row[i])})

    return _cell_records(
        FindingCode.SLOT_SHARED_WITHOUT_PREFIX,
        cells,
        blamed,
        lambda i: (
            f"slot {c_slot[i]} sits at position {c_position[i]} of pool rows "
            f"{[int(c_row[i]), *partners(i)]}, which hold different slots just "
            "before it: a copy, not radix sharing"
        ),
        run_what="slots shared at the same position with pool rows that hold different slots "
        "just before it: copies, not radix sharing",
        details=lambda i: {"pool_rows": partners(i)[:SAMPLE_CELLS]},
        columns={"slot_before": prior_slot},
    )


#: Cells handled at a time where a pass over every live cell would hold a table-long temporary
#: (`_follows`'s int64 sums, `_place_groups`' counts and masks).
_PIECE = 1 << 20


def _follows(row: np.ndarray | RunColumn, position: np.ndarray) -> np.ndarray:
    """Per cell but the first: whether it is in the row of the cell before it, one position
    later (the sum taken in int64, a piece at a time: a narrow position + 1 never wraps)."""
    out = np.empty(max(len(row) - 1, 0), dtype=bool)
    for a in range(0, out.size, _PIECE):
        b = min(a + _PIECE, out.size)
        out[a:b] = (row[a + 1 : b + 1] == row[a:b]) & (
            position[a + 1 : b + 1] == np.add(position[a:b], 1, dtype=np.int64)
        )
    return out


#: Cells `_place_groups` sorts at a time at least (a sixty-fourth of them where that is more):
#: its index, sort and gathers hold about 30 bytes a cell, beside the live cells.
_PLACE_CELLS = 1 << 18


def _place_groups(
    position: np.ndarray, slot: np.ndarray, prior: np.ndarray, real: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per cell, whether another `real` cell holds its (position, slot); and the real cells
    (sorted) of the groups whose `prior` slots disagree, at a position past 0. A group lies
    within one position, so the cells are grouped a range of positions at a time: the sort
    and its index hold a sixty-fourth of the cells (`_PLACE_CELLS` at least), never all of
    them."""
    n = position.size
    every = bool(real.all())
    counts = np.zeros(0, dtype=np.int64)  # real cells per position, a piece at a time
    for a in range(0, n, _PIECE):
        piece = position[a : a + _PIECE]
        found = np.bincount(piece if every else piece[real[a : a + _PIECE]])
        if found.size > counts.size:
            counts = np.concatenate([counts, np.zeros(found.size - counts.size, np.int64)])
        counts[: found.size] += found
    upto = np.cumsum(counts)
    step = max(_PLACE_CELLS, n // 64)
    same_place = np.zeros(n, dtype=bool)
    parts: list[np.ndarray] = []
    start = 0
    while start < counts.size:
        before = int(upto[start - 1]) if start else 0
        end = max(int(np.searchsorted(upto, before + step, side="right")), start + 1)
        index = _cells_at(position, start, end, None if every else real)
        start = end
        if index.size < 2:
            continue
        index = index[np.lexsort((slot[index], position[index]))]
        at, held = position[index], slot[index]
        group = _group_starts([at, held])
        size = np.diff(np.r_[group, index.size])
        same_place[index] = np.repeat(size > 1, size)
        before_slot = prior[index]
        low = np.minimum.reduceat(before_slot, group)
        high = np.maximum.reduceat(before_slot, group)
        disagree = (size > 1) & (low != high) & (at[group] > 0)
        if disagree.any():
            parts.append(index[np.repeat(disagree, size)])
    candidates = np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
    return same_place, candidates


def _cells_at(position: np.ndarray, start: int, end: int, real: np.ndarray | None) -> np.ndarray:
    """The (`real`) cells at positions start..end-1, found a piece at a time (no mask as long
    as the table)."""
    parts = []
    for a in range(0, position.size, _PIECE):
        piece = position[a : a + _PIECE]
        inside = (piece >= start) & (piece < end)
        if real is not None:
            inside &= real[a : a + _PIECE]
        parts.append(np.flatnonzero(inside) + a)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def step_writes(dump: KvDump) -> LiveCells | None:
    """The cells this step writes (`out_cache_loc`), as pending cells in its order: each row
    writes E tokens from its prefix length on, in batch order. None without `out_cache_loc`.

    out_cache_loc holds what the batch really wrote, so no claimed length makes this larger
    than out_cache_loc; entries past the rows' writes are ignored."""
    loc = dump.out_cache_loc
    if loc is None:
        return None
    rpi = dump.req_pool_indices
    extend = dump.extend_seq_lens
    tokens = int(loc.shape[0])
    write_len = np.where((rpi != 0) & (extend > 0), np.minimum(extend, tokens), 0)
    ends = np.cumsum(write_len)  # <= bs * tokens: no overflow
    n = min(int(ends[-1]) if ends.size else 0, tokens)
    rows = np.searchsorted(ends, np.arange(n), side="right")
    offsets = np.arange(n) - (ends - write_len)[rows]
    prefix = np.minimum(np.maximum(dump.prefix_lens, 0), np.iinfo(np.int64).max // 2)
    return LiveCells(
        slot=np.asarray(loc[:n], dtype=np.int64),
        batch_row=rows.astype(np.int64),
        pool_row=np.asarray(rpi[rows], dtype=np.int64),
        position=(prefix[rows] + offsets).astype(np.int64),
        pending=np.ones(n, dtype=bool),
    )


def write_findings(dump: KvDump, cells: LiveCells) -> list[Finding]:
    """Slots written this step that are already live for another (row, position)."""
    writes = step_writes(dump)
    if writes is None:
        return []
    written, w_pool, w_pos, n = writes.slot, writes.pool_row, writes.position, len(writes)
    # Only the live cells holding a written slot matter: sort those, not the whole batch.
    # compared and sorted only: the live columns as held (the pool rows read at the cells
    # looked at where they are held as runs)
    c_slot, c_position = cells.held("slot"), cells.held("position")
    c_row = cells.readable("pool_row")
    holders = np.flatnonzero(SlotSet(np.asarray(written)).contains(c_slot))
    order = holders[np.argsort(c_slot[holders], kind="stable")]
    live_sorted = c_slot[order]
    lo = np.searchsorted(live_sorted, written, side="left")
    hi = np.searchsorted(live_sorted, written, side="right")
    # Every pending write is live in its own cell; only look closer where there is more.
    own = (hi - lo == 1) & (written > 0)
    if own.any():
        j = order[np.minimum(lo, len(order) - 1)]
        own &= (c_row[j] == w_pool) & (c_position[j] == w_pos)
    offending = np.flatnonzero((written > 0) & (hi > lo) & ~own)

    def others(i: int) -> list[tuple[int, int]]:
        """(pool row, position) of the live cells holding write i's slot, not its own."""
        same = order[lo[i] : min(hi[i], lo[i] + SAMPLE_CELLS + 1)]  # at most one is its own
        return [
            (int(c_row[j]), int(c_position[j]))
            for j in same
            if not (c_row[j] == w_pool[i] and c_position[j] == w_pos[i])
        ]

    return _cell_records(
        FindingCode.WRITE_TO_LIVE_SLOT,
        writes,
        offending,
        lambda i: (
            f"out_cache_loc[{i}] writes slot {written[i]}, which is live at (pool row, "
            f"position) {', '.join(map(str, others(i)[:3]))}"
        ),
        run_what="slots this step writes (out_cache_loc) that other cells hold live",
        details=lambda i: {
            "out_cache_loc_index": int(i),
            "other_cells": [list(o) for o in others(i)[:SAMPLE_CELLS]],
        },
        columns={"out_cache_loc_index": np.arange(n, dtype=np.int64)},
    )


def lut_findings(dump: KvDump) -> list[Finding]:
    """The LUT against the recorded pool size, and its trailing sentinel (docs/semantics.md §2).

    A production LUT has `num_full_slots + 1` entries, the last one -1. Only a recorded (or
    command-line) pool size can contradict the LUT: a derived one is the LUT's own length.
    """
    lut = dump.full_to_swa_index_mapping
    if not runs(dump, SWA_LUT) or lut is None or lut.size == 0:
        return []
    found: list[Finding] = []
    lut_len, last = int(lut.shape[0]), lut.element(-1)
    pool = dump.scalars["num_full_slots"]
    if pool.value is not None and not pool.assumed and pool.value + 1 > lut_len:
        found.append(
            Finding(
                code=FindingCode.LUT_SHORTER_THAN_POOL,
                group=Group.SWA,
                message=f"full_to_swa_index_mapping has {lut_len} entries for a full pool of "
                f"{pool.value} slots ({pool.source}); it needs {pool.value + 1}: slots "
                f"{lut_len}..{pool.value - 1} cannot be translated",
                details={"lut_len": lut_len, "num_full_slots": pool.value},
            )
        )
    if last != -1:
        found.append(
            Finding(
                code=FindingCode.LUT_SENTINEL_MISSING,
                group=Group.SWA,
                message=f"the last LUT entry, LUT[{lut_len - 1}], is {last}, not -1: the LUT was "
                "sliced or overwritten, and a GPU clamp no longer lands on -1",
                details={"lut_len": lut_len, "last": last},
            )
        )
    return found


def swa_findings(dump: KvDump, cells: LiveCells, plan: Plan) -> list[Finding]:
    """SWA-space findings: unmapped in-window slots, SWA collisions, freed SWA peers."""
    lut_tensor = dump.full_to_swa_index_mapping
    if not runs(dump, SWA_LUT) or lut_tensor is None:
        return []
    lut_len = int(lut_tensor.shape[0])
    start = plan.frame.window_start[cells.held("batch_row")]
    in_window = (~cells.pending) & (cells.held("position") >= start)
    del start
    slot = cells.slot
    mappable = (slot > 0) & (slot < lut_len - 1)
    swa = np.zeros_like(slot)
    swa[mappable] = lut_tensor.take_known(slot[mappable])[0]
    found = _cell_records(
        FindingCode.SWA_UNMAPPED_IN_WINDOW,
        cells,
        np.flatnonzero(in_window & mappable & (swa == 0)),
        lambda i: (
            f"slot {slot[i]} is inside the SWA window but LUT[{slot[i]}] = 0: its SWA entry "
            "was cleared; the SWA canary is blind here"
        ),
        run_what="slots inside the SWA window whose LUT entry is 0 (SWA entries cleared; the "
        "SWA canary is blind here)",
        group=Group.SWA,
    )
    # a collision needs two cells on one SWA slot: the others are left out before sorting
    found += _swa_collisions(
        cells, swa, np.flatnonzero(held_twice(swa, in_window & mappable & (swa > 0)))
    )
    free = dump.free_swa_slots
    if runs(dump, SWA_FREE_LIST) and free is not None:
        freed = np.flatnonzero(mappable & (swa > 0) & SlotSet(free).contains(swa))
        prefix_only = ~(in_window[freed] | cells.pending[freed])
        found += _cell_records(
            FindingCode.FREED_SLOT_IN_LIVE_RANGE,
            cells,
            freed,
            lambda i: (
                f"live full slot {slot[i]} maps to SWA slot {swa[i]}, which the SWA "
                "allocator holds as free"
            ),
            run_what="full slots whose SWA slots the SWA allocator holds as free",
            group=Group.SWA,
            slots=swa,
            space=Space.SWA,
            role=lambda i: None if in_window[i] or cells.pending[i] else Role.PREFIX,
            details=lambda i: {"full_slot": int(slot[i])},
            full_slots=lambda i: (int(slot[i]),),
            split=prefix_only,
            columns={"full_slot": slot},
        )
    return found


def _swa_collisions(cells: LiveCells, swa: np.ndarray, idx: np.ndarray) -> list[Finding]:
    """In-window cells whose SWA slot other full slots also map to (all but the first full
    slot of each SWA slot, in cell order), found with sorts, not per SWA slot."""
    if idx.size == 0:
        return []
    full = cells.slot[idx]
    order = np.lexsort((full, swa[idx]))
    s, f = swa[idx][order], full[order]
    group_start = _group_starts([s])
    group_id = np.repeat(np.arange(group_start.size), np.diff(np.r_[group_start, s.size]))
    pair_start = _group_starts([s, f])  # one per distinct (swa, full) pair, full ascending
    fulls_per_swa = np.bincount(group_id[pair_start], minlength=group_start.size)
    gid = np.empty(idx.size, dtype=np.int64)  # group of each cell, in cell order
    gid[order] = group_id
    first_cell = np.full(group_start.size, idx.size, dtype=np.int64)
    fold_at(np.minimum, first_cell, group_id, order)
    first_full = full[first_cell]
    colliding = (fulls_per_swa[gid] > 1) & (full != first_full[gid])
    if not colliding.any():
        return []
    swa_of = swa[idx]

    def of(i: int) -> tuple[list[int], int]:
        """The distinct full slots mapping to cell i's SWA slot (the first few), and how many."""
        mapped = distinct(full[swa_of == swa[i]])
        return [int(v) for v in mapped[:SAMPLE_CELLS]], int(mapped.size)

    def listed(i: int) -> str:
        slots, total = of(i)
        return str(slots) if total <= SAMPLE_CELLS else f"{str(slots)[:-1]}, ... ({total})]"

    return _cell_records(
        FindingCode.SWA_SLOT_COLLISION,
        cells,
        idx[colliding],
        lambda i: f"full slots {listed(i)} all map to SWA slot {swa[i]}",
        run_what="full slots that share their SWA slot with other full slots",
        group=Group.SWA,
        slots=swa,
        space=Space.SWA,
        details=lambda i: {"full_slot": int(cells.held("slot")[i]), "full_slots": of(i)[0]},
        full_slots=lambda i: tuple(of(i)[0]),
        columns={"full_slot": cells.slot},
    )


def _problem_cells(problems: ProblemTable, at: np.ndarray) -> LiveCells:
    """The cells the plan problems `at` read, each problem's value as the slot (no pending
    write among them)."""
    return LiveCells(
        slot=problems.value[at].astype(np.int64),
        batch_row=problems.batch_row[at].astype(np.int64),
        pool_row=problems.pool_row[at].astype(np.int64),
        position=problems.position[at].astype(np.int64),
        pending=np.zeros(at.size, dtype=bool),
    )


def _lut_records(plan: Plan, lut_len: int, clamp_value: int | None) -> list[Finding]:
    """One `LUT_OUT_OF_RANGE` per offending cell (a slot read as verify at p and as chain-prev
    at p+1 is one cell, with the roles it was read as), in runs like the live-cell codes."""
    problems = plan.problems
    hit = np.flatnonzero(problems.kind == ProblemKind.LUT_OUT_OF_RANGE)
    if hit.size == 0:
        return []
    rows, positions = problems.batch_row[hit], problems.position[hit]
    order = np.lexsort((positions, rows))
    starts = _group_starts([rows[order], positions[order]])
    cell_of = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, hit.size]))
    first = hit[order[starts]]
    roles = problems.role[hit][order]
    role_bits = np.zeros(starts.size, dtype=np.int64)
    fold_at(np.bitwise_or, role_bits, cell_of, np.left_shift(1, roles.astype(np.int64)))
    cells = _problem_cells(problems, first)

    def read_as(c: int) -> list[ProblemRole]:
        return [r for r in ProblemRole if role_bits[c] >> int(r) & 1]

    return _cell_records(
        FindingCode.LUT_OUT_OF_RANGE,
        cells,
        np.arange(starts.size),
        lambda c: (
            f"slot {cells.slot[c]} >= lut_len {lut_len}: REF raises; the GPU clamps to "
            f"LUT[{lut_len - 1}] = {clamp_value}"
        ),
        run_what=f"slots >= lut_len {lut_len} (REF raises at the first; the GPU clamps them to "
        f"LUT[{lut_len - 1}] = {clamp_value})",
        group=plan.group,
        role=lambda c: Role(min(read_as(c)).label),  # the first read of the cell, REF's order
        shared_details=lambda c: {
            "lut_len": lut_len,
            "gpu_value": clamp_value,
            "read_as": sorted({r.label for r in read_as(c)}),
        },
        split=role_bits,
    )


def _expected_token_records(plan: Plan, shape: list[int] | None) -> list[Finding]:
    """`EXPECTED_TOKEN_OUT_OF_RANGE`: one group for gathers from a pool row outside the
    token pool, one for columns past it; each cell carries its gather index."""
    problems = plan.problems
    hit = np.flatnonzero(problems.kind == ProblemKind.EXPECTED_TOKEN_OUT_OF_RANGE)
    if hit.size == 0:
        return []
    gathers = _problem_cells(problems, hit)
    value, pool_row = gathers.slot, gathers.pool_row
    rows = shape[0] if shape else 0
    bad_row = (value == pool_row) & ((pool_row < 0) | (pool_row >= rows)) & (shape is not None)
    order = np.lexsort((gathers.position, gathers.batch_row))

    def what(i: int) -> str:
        if bad_row[i] and shape:
            return f"pool row {pool_row[i]} is outside the expected-token pool's {shape[0]} rows"
        return (
            f"expected-token gather at column {value[i]} is inside valid_lens but outside "
            f"the pool's {shape[1] if shape else '?'} columns"
        )

    found = _cell_records(
        FindingCode.EXPECTED_TOKEN_OUT_OF_RANGE,
        gathers,
        order,
        lambda i: f"{what(i)}: REF raises IndexError, the GPU reads another pool row's tokens",
        run_what="expected-token gathers outside the token pool: REF raises IndexError, the GPU "
        "reads another pool row's tokens",
        group=plan.group,
        shared_details=lambda i: {"pool_shape": shape, "bad_pool_row": bool(bad_row[i])},
        details=lambda i: {"index": int(value[i])},
        split=bad_row[order].astype(np.int64),
        columns={"gather_index": value},
    )
    return [
        replace(
            f,
            slot=None,
            gather_index=None if f.cells is None else int(f.cells.extra["gather_index"][0]),
            cells=None if f.cells is None else f.cells.without_slot(),
        )
        for f in found
    ]


def plan_findings(dump: KvDump, plan: Plan) -> list[Finding]:
    """Findings from one group's reference plan: LUT range, token pool, capacity."""
    found: list[Finding] = []
    lut = dump.full_to_swa_index_mapping
    clamp_value = lut.element(-1) if lut is not None and lut.size else None
    lut_len = 0 if lut is None else int(lut.shape[0])
    found += _lut_records(plan, lut_len, clamp_value)
    pool = dump.req_to_verify_expected_tokens
    shape = None if pool is None else [int(d) for d in pool.shape]
    found += _expected_token_records(plan, shape)
    if plan.skipped is not None:
        frame = plan.frame
        found.append(
            Finding(
                code=FindingCode.VERIFY_TOTAL_IMPLAUSIBLE,
                group=plan.group,
                message=plan.skipped,
                details={
                    "requested": frame.total_verify if frame.enable else frame.reach_total,
                    "limit": frame.entry_limit,
                    "table_shape": list(frame.table_shape),
                },
            )
        )
    if plan.total_verify > plan.verify_capacity:
        found.append(
            Finding(
                code=FindingCode.VERIFY_CAPACITY_OVERFLOW,
                group=plan.group,
                message=f"{plan.total_verify} verify entries requested > capacity "
                f"{plan.verify_capacity}: the whole verify launch is skipped (enable = 0)",
                details={"requested": plan.total_verify, "capacity": plan.verify_capacity},
            )
        )
    return found
