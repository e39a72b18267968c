"""Finding detectors: every offending slot, row or tensor of a dump, not just the first.

Detectors select offenders with vectorized masks (numpy, over the batch rows or the batch's
live cells) and build one `Finding` per offender, without provenance; `check` attaches
provenance to all of them in one table scan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from kvcanary_cli.analysis.model import (
    Finding,
    FindingCode,
    Group,
    Role,
    Space,
)
from kvcanary_cli.analysis.provenance import LiveCells, SlotSet
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import SCALARS, dtype_label
from kvcanary_cli.planners.base import Plan, ProblemKind, ProblemRole
from kvcanary_cli.planners.frame import launch_limit

__all__ = [
    "SLOT_SPREAD",
    "batch_findings",
    "lut_findings",
    "merge_spread",
    "plan_findings",
    "slot_findings",
    "swa_findings",
    "write_findings",
]

#: More one-cell records than this of one code and slot become one spread record.
SLOT_SPREAD = 16


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
                    f"; REF silently reads row {max_reqs + rp}"
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
                f"{'the following rows' if p > msl else 'past the row'}",
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


def _cell_finding(
    code: FindingCode,
    cells: LiveCells,
    i: int | np.integer,
    message: str,
    *,
    group: Group = Group.FULL,
    slot: int | None = None,
    space: Space = Space.FULL,
    role: Role | None = None,
    details: dict[str, object] | None = None,
    full_slots: tuple[int, ...] = (),
) -> Finding:
    """A finding at live cell `i`; its role defaults to the full group's (window 0)."""
    return Finding(
        code=code,
        group=group,
        slot=int(cells.slot[i]) if slot is None else slot,
        space=space,
        batch_row=int(cells.batch_row[i]),
        pool_row=int(cells.pool_row[i]),
        position=int(cells.position[i]),
        role=role or (Role.PENDING_WRITE if cells.pending[i] else Role.VERIFY),
        message=message,
        details=details or {},
        full_slots=full_slots,
    )


#: A run of at least this many consecutive offending cells of one row (same code) is one
#: record: output then grows with the problems, not with the cells. Shorter runs are listed
#: cell by cell.
RUN_CELLS = 16
#: Cells a finding lists in its details (positions, other cells, a run's slots): a sample,
#: with the total.
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
    full_slots: Callable[[int], tuple[int, ...]] | None = None,
    split: np.ndarray | None = None,
) -> list[Finding]:
    """Findings for the offending cells (ascending indices into `cells`): one per cell, or
    one per run of `RUN_CELLS` or more consecutive positions of one row.

    `slots` (aligned with `cells`) replaces the slot reported (an SWA slot, say); `split`
    (aligned with `offending`) keeps cells with different values out of one run.
    """
    offending = np.asarray(offending, dtype=np.int64)
    if offending.size == 0:
        return []
    reported = cells.slot if slots is None else slots
    rows, positions = cells.batch_row[offending], cells.position[offending]
    new_run = np.ones(offending.size, dtype=bool)
    new_run[1:] = (
        (rows[1:] != rows[:-1])
        | (positions[1:] != positions[:-1] + 1)
        | (cells.pending[offending][1:] != cells.pending[offending][:-1])
    )
    if split is not None:
        new_run[1:] |= split[1:] != split[:-1]
    starts = np.flatnonzero(new_run)
    ends = np.r_[starts[1:], offending.size]
    found: list[Finding] = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        if b - a < RUN_CELLS:
            for i in offending[a:b].tolist():
                found.append(
                    _cell_finding(
                        code,
                        cells,
                        i,
                        message(i),
                        group=group,
                        slot=int(reported[i]),
                        space=space,
                        role=role(i) if role else None,
                        details=details(i) if details else None,
                        full_slots=full_slots(i) if full_slots else (),
                    )
                )
            continue
        members = offending[a:b]
        first, n = int(members[0]), b - a
        sample = [int(v) for v in reported[members[:SAMPLE_CELLS]]]
        shown = ", ".join(map(str, sample)) + (", ..." if n > SAMPLE_CELLS else "")
        p0 = int(cells.position[first])
        found.append(
            replace(
                _cell_finding(
                    code,
                    cells,
                    first,
                    f"{n} consecutive cells, positions {p0}..{p0 + n - 1}, hold {run_what} "
                    f"(slots {shown})",
                    group=group,
                    slot=sample[0],
                    space=space,
                    role=role(first) if role else None,
                    full_slots=full_slots(first) if full_slots else (),
                    details={
                        **(details(first) if details else {}),
                        "slots": sample,
                        "slots_total": n,
                    },
                ),
                cells=n,
            )
        )
    return found


def slot_findings(dump: KvDump, cells: LiveCells) -> list[Finding]:
    """Full-space slot findings over the live cells."""
    found: list[Finding] = []
    slot = cells.slot
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
            details=lambda i: {"num_full_slots": size},
        )
        found += [replace(f, assumes=assumes) for f in beyond]
    real = slot > 0
    # A duplicate or an alias needs two cells holding one slot; most live slots have one.
    shared = _held_twice(slot, real)
    found.extend(_duplicates_in_row(cells, shared))
    found.extend(_shared_across_positions(cells, shared))
    if dump.free_full_slots is not None:
        free = dump.free_full_slots
        found += _cell_records(
            FindingCode.FREED_SLOT_IN_LIVE_RANGE,
            cells,
            np.flatnonzero(real & SlotSet(free).contains(slot)),
            lambda i: f"live slot {slot[i]} is on the allocator's free list (use after free)",
            run_what="slots on the allocator's free list (use after free)",
        )
    found.extend(write_findings(dump, cells))
    return found


#: Slot values up to this many times the cells counted with one `bincount` (else one sort).
_BINCOUNT_SPAN = 4


def _held_twice(slot: np.ndarray, among: np.ndarray) -> np.ndarray:
    """The cells of `among` whose slot another cell of `among` also holds (`among` narrowed).

    Slots are counted with a `bincount` when their values are non-negative and within a few
    times the cell count (the usual pool), otherwise by one sort: never by the values alone,
    which a corrupt dump chooses."""
    idx = np.flatnonzero(among)
    values = slot[idx]
    out = np.zeros(slot.shape, dtype=bool)
    if values.size < 2:
        return out
    if int(values.min()) >= 0 and int(values.max()) < _BINCOUNT_SPAN * values.size + (1 << 20):
        twice = np.bincount(values)[values] > 1
    else:
        order = np.argsort(values, kind="stable")
        ordered = values[order]
        same = ordered[1:] == ordered[:-1]
        twice = np.zeros(values.size, dtype=bool)
        twice[order[1:][same]] = True
        twice[order[:-1][same]] = True
    out[idx[twice]] = True
    return out


def _groups_of(*keys: np.ndarray) -> list[np.ndarray]:
    """Index arrays of cells with equal keys (cell order within a group), only for keys that
    occur twice or more. Several key arrays compare as tuples: no packing into one integer,
    which could collide (int64 slots) or overflow."""
    if keys[0].size == 0:
        return []
    order = np.lexsort(keys[::-1])  # first key primary; ties keep cell order (stable)
    starts = _group_starts([k[order] for k in keys])
    ends = np.r_[starts[1:], order.size]
    repeated = ends - starts > 1
    return [order[a:b] for a, b in zip(starts[repeated], ends[repeated], strict=True)]


def _group_starts(sorted_keys: list[np.ndarray]) -> np.ndarray:
    """Where each run of equal key tuples begins in sorted order."""
    change = np.zeros(sorted_keys[0].size, dtype=bool)
    change[0] = True
    for key in sorted_keys:
        change[1:] |= key[1:] != key[:-1]
    return np.flatnonzero(change)


def _duplicates_in_row(cells: LiveCells, real: np.ndarray) -> list[Finding]:
    """Every cell after the first of a slot that sits at several positions of one row."""
    idx = np.flatnonzero(real)
    seen: dict[int, tuple[list[int], int]] = {}
    repeats: list[np.ndarray] = []
    for group in _groups_of(cells.pool_row[idx], cells.slot[idx]):
        members = idx[group]
        positions = np.sort(cells.position[members])
        shown = ([int(p) for p in positions[:SAMPLE_CELLS]], int(positions.size))
        seen.update(dict.fromkeys(members[1:].tolist(), shown))
        repeats.append(members[1:])

    def message(i: int) -> str:
        shown, total = seen[i]
        listed = str(shown) if total <= SAMPLE_CELLS else f"{str(shown)[:-1]}, ...]"
        many = f"{total} positions " if total > SAMPLE_CELLS else ""
        return (
            f"slot {cells.slot[i]} sits at {many}positions {listed} of pool row {cells.pool_row[i]}"
        )

    return _cell_records(
        FindingCode.DUPLICATE_SLOT_IN_ROW,
        cells,
        np.sort(np.concatenate(repeats)) if repeats else np.zeros(0, dtype=np.int64),
        message,
        run_what="slots that also sit at other positions of the same row",
        details=lambda i: {"positions": seen[i][0], "positions_total": seen[i][1]},
    )


def _shared_across_positions(cells: LiveCells, real: np.ndarray) -> list[Finding]:
    """Cells holding a slot that other rows hold at another position (radix sharing puts one
    slot at one position in many rows; only a second position is aliasing).

    Per slot, the position most of its cells agree on is the owner's (on a tie the smallest;
    when no two agree, the position of its first cell) and every other cell is a copy.
    Everything is computed per slot with sorts, not per cell.
    """
    idx = np.flatnonzero(real)
    if idx.size == 0:
        return []
    slot, position, row = cells.slot[idx], cells.position[idx], cells.pool_row[idx]
    # slot-major, then position, then cell order
    order = np.lexsort((position, slot))
    s, p = slot[order], position[order]
    slot_start = _group_starts([s])
    slot_id = np.repeat(np.arange(slot_start.size), np.diff(np.r_[slot_start, s.size]))
    run_start = _group_starts([s, p])  # runs of one (slot, position)
    run_len = np.diff(np.r_[run_start, s.size])
    run_slot = slot_id[run_start]
    positions_per_slot = np.bincount(run_slot, minlength=slot_start.size)
    sid = np.empty(idx.size, dtype=np.int64)  # slot id of each cell, in cell order
    sid[order] = slot_id
    by_row = np.lexsort((row, slot))
    rows_per_slot = np.bincount(
        sid[by_row][_group_starts([slot[by_row], row[by_row]])], minlength=slot_start.size
    )
    suspect = (positions_per_slot > 1) & (rows_per_slot > 1)
    if not suspect.any():
        return []
    # owner position per slot: the longest run (first = smallest position on a tie); when
    # every run has length 1, the position of the slot's first cell in cell order.
    longest = np.zeros(slot_start.size, dtype=np.int64)
    np.maximum.at(longest, run_slot, run_len)
    is_best = run_len == longest[run_slot]
    first_best = np.full(slot_start.size, s.size, dtype=np.int64)
    np.minimum.at(first_best, run_slot[is_best], run_start[is_best])
    best = p[np.minimum(first_best, s.size - 1)]
    first_cell = np.full(slot_start.size, idx.size, dtype=np.int64)
    np.minimum.at(first_cell, slot_id, order)
    owner = np.where(longest > 1, best, position[np.minimum(first_cell, idx.size - 1)])
    copy = suspect[sid] & (position != owner[sid])
    if not copy.any():
        return []
    in_suspect = np.flatnonzero(suspect[sid])
    at_owner = in_suspect[position[in_suspect] == owner[sid[in_suspect]]]
    owners: dict[int, list[tuple[int, int]]] = {}
    for k in _first_per_group(sid, at_owner, 3).tolist():
        owners.setdefault(int(sid[k]), []).append((int(row[k]), int(position[k])))
    # A sample of each slot's cells to name other rows from (twice the sample: a finding
    # leaves out its own row's cells).
    members: dict[int, list[tuple[int, int]]] = {}
    for k in _first_per_group(sid, in_suspect, 2 * SAMPLE_CELLS).tolist():
        members.setdefault(int(sid[k]), []).append((int(row[k]), int(position[k])))

    def at(i: int) -> int:
        return int(np.searchsorted(idx, i))

    def others(i: int) -> list[list[int]]:
        k = at(i)
        near = [c for c in members[int(sid[k])] if c[0] != row[k]]
        return [list(c) for c in near[:SAMPLE_CELLS]]

    return _cell_records(
        FindingCode.SLOT_SHARED_ACROSS_POSITIONS,
        cells,
        idx[copy],
        lambda i: (
            f"slot {cells.slot[i]} is also live at (pool row, position) "
            f"{', '.join(map(str, owners[int(sid[at(i)])]))}: aliased across requests"
        ),
        run_what="slots that other requests hold at another position: aliased across requests",
        details=lambda i: {"other_cells": others(i)},
    )


def _first_per_group(group_of: np.ndarray, candidates: np.ndarray, k: int) -> np.ndarray:
    """The candidates (cell indices, ascending) among the first `k` of their group."""
    if candidates.size == 0:
        return candidates
    ordered = candidates[np.argsort(group_of[candidates], kind="stable")]
    groups = group_of[ordered]
    starts = _group_starts([groups])
    rank = np.arange(ordered.size) - np.repeat(starts, np.diff(np.r_[starts, ordered.size]))
    return np.sort(ordered[rank < k])


def write_findings(dump: KvDump, cells: LiveCells) -> list[Finding]:
    """Slots written this step that are already live for another (row, position)."""
    loc = dump.out_cache_loc
    if loc is None:
        return []
    rpi = dump.req_pool_indices
    extend = dump.extend_seq_lens
    tokens = int(loc.shape[0])
    # Each row writes E tokens, in batch order; out_cache_loc holds what the batch really
    # wrote, so no claimed length makes this larger than out_cache_loc.
    write_len = np.where((rpi != 0) & (extend > 0), np.minimum(extend, tokens), 0)
    ends = np.cumsum(write_len)  # <= bs * tokens: no overflow
    n = min(int(ends[-1]) if ends.size else 0, tokens)
    w_rows = np.searchsorted(ends, np.arange(n), side="right")
    offsets = np.arange(n) - (ends - write_len)[w_rows]
    written = loc[:n]
    w_pool = rpi[w_rows]
    w_pos = (
        np.minimum(np.maximum(dump.prefix_lens, 0), np.iinfo(np.int64).max // 2)[w_rows] + offsets
    )
    found = []
    order = np.argsort(cells.slot, kind="stable")
    live_sorted = cells.slot[order]
    lo = np.searchsorted(live_sorted, written, side="left")
    hi = np.searchsorted(live_sorted, written, side="right")
    # Every pending write is live in its own cell; only look closer where there is more.
    own = (hi - lo == 1) & (written > 0)
    if own.any():
        j = order[np.minimum(lo, len(order) - 1)]
        own &= (cells.pool_row[j] == w_pool) & (cells.position[j] == w_pos)
    for i in np.flatnonzero((written > 0) & (hi > lo) & ~own):
        x = written[i]
        same = order[lo[i] : min(hi[i], lo[i] + SAMPLE_CELLS + 1)]  # at most one is its own
        others = [
            (int(cells.pool_row[j]), int(cells.position[j]))
            for j in same
            if not (cells.pool_row[j] == w_pool[i] and cells.position[j] == w_pos[i])
        ]
        if not others:
            continue
        found.append(
            Finding(
                code=FindingCode.WRITE_TO_LIVE_SLOT,
                group=Group.FULL,
                slot=int(x),
                space=Space.FULL,
                batch_row=int(w_rows[i]),
                pool_row=int(w_pool[i]),
                position=int(w_pos[i]),
                role=Role.PENDING_WRITE,
                message=f"out_cache_loc[{i}] writes slot {x}, which is live at (pool row, "
                f"position) {', '.join(map(str, others[:3]))}",
                details={
                    "out_cache_loc_index": int(i),
                    "other_cells": [list(o) for o in others[:SAMPLE_CELLS]],
                },
            )
        )
    return found


def lut_findings(dump: KvDump) -> list[Finding]:
    """The LUT against the recorded pool size, and its trailing sentinel (docs/semantics.md §2).

    A production LUT has `num_full_slots + 1` entries, the last one -1. Only a recorded (or
    command-line) pool size can contradict the LUT: a derived one is the LUT's own length.
    """
    lut = dump.full_to_swa_index_mapping
    if lut is None or lut.size == 0:
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
    if lut_tensor is None:
        return []
    lut_len = int(lut_tensor.shape[0])
    start = plan.frame.window_start[cells.batch_row]
    in_window = (~cells.pending) & (cells.position >= start)
    mappable = (cells.slot > 0) & (cells.slot < lut_len - 1)
    swa = np.zeros_like(cells.slot)
    swa[mappable] = lut_tensor.take_known(cells.slot[mappable])[0]
    slot = cells.slot
    found = _cell_records(
        FindingCode.SWA_UNMAPPED_IN_WINDOW,
        cells,
        np.flatnonzero(in_window & mappable & (swa == 0)),
        lambda i: (
            f"slot {slot[i]} is inside the SWA window but LUT[{slot[i]}] = 0: its SWA peer "
            "was freed; the SWA canary is blind here"
        ),
        run_what="slots inside the SWA window whose LUT entry is 0 (SWA peers freed; the SWA "
        "canary is blind here)",
        group=Group.SWA,
    )
    # a collision needs two cells on one SWA slot: the others are left out before sorting
    found += _swa_collisions(
        cells, swa, np.flatnonzero(_held_twice(swa, in_window & mappable & (swa > 0)))
    )
    if dump.free_swa_slots is not None:
        free = dump.free_swa_slots
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
    distinct = np.bincount(group_id[pair_start], minlength=group_start.size)
    gid = np.empty(idx.size, dtype=np.int64)  # group of each cell, in cell order
    gid[order] = group_id
    first_cell = np.full(group_start.size, idx.size, dtype=np.int64)
    np.minimum.at(first_cell, group_id, order)
    first_full = full[first_cell]
    colliding = (distinct[gid] > 1) & (full != first_full[gid])
    if not colliding.any():
        return []
    sample: dict[int, list[int]] = {}
    shared = pair_start[distinct[group_id[pair_start]] > 1]  # only SWA slots that collide
    for k in _first_per_group(group_id, shared, SAMPLE_CELLS).tolist():
        sample.setdefault(int(group_id[k]), []).append(int(f[k]))

    def of(i: int) -> tuple[list[int], int]:
        g = int(gid[np.searchsorted(idx, i)])
        return sample[g], int(distinct[g])

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
        details=lambda i: {"full_slot": int(cells.slot[i]), "full_slots": of(i)[0]},
        full_slots=lambda i: tuple(of(i)[0]),
    )


def _lut_records(plan: Plan, lut_len: int, clamp_value: int | None) -> list[Finding]:
    """One `lut-out-of-range` per offending cell (a slot read as verify at p and as chain-prev
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
    np.bitwise_or.at(role_bits, cell_of, np.left_shift(1, roles.astype(np.int64)))
    cells = LiveCells(
        slot=problems.value[first].astype(np.int64),
        batch_row=problems.batch_row[first].astype(np.int64),
        pool_row=problems.pool_row[first].astype(np.int64),
        position=problems.position[first].astype(np.int64),
        pending=np.zeros(starts.size, dtype=bool),
    )

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
        details=lambda c: {
            "lut_len": lut_len,
            "gpu_value": clamp_value,
            "read_as": sorted({r.label for r in read_as(c)}),
        },
        split=role_bits,
    )


def plan_findings(dump: KvDump, plan: Plan) -> list[Finding]:
    """Findings from one group's reference plan: LUT range, token pool, capacity."""
    found: list[Finding] = []
    problems = plan.problems
    lut = dump.full_to_swa_index_mapping
    clamp_value = lut.element(-1) if lut is not None and lut.size else None
    lut_len = 0 if lut is None else int(lut.shape[0])
    found += _lut_records(plan, lut_len, clamp_value)
    pool = dump.req_to_verify_expected_tokens
    shape = None if pool is None else [int(d) for d in pool.shape]
    for i in np.flatnonzero(problems.kind == ProblemKind.EXPECTED_TOKEN_OUT_OF_RANGE):
        value, pool_row = int(problems.value[i]), int(problems.pool_row[i])
        bad_row = shape is not None and value == pool_row and not 0 <= pool_row < shape[0]
        what = (
            f"pool row {pool_row} is outside the expected-token pool's {shape[0]} rows"
            if bad_row and shape
            else f"expected-token gather at column {value} is inside valid_lens but outside "
            f"the pool's {shape[1] if shape else '?'} columns"
        )
        found.append(
            Finding(
                code=FindingCode.EXPECTED_TOKEN_OUT_OF_RANGE,
                group=plan.group,
                batch_row=int(problems.batch_row[i]),
                pool_row=pool_row,
                position=int(problems.position[i]),
                role=Role.VERIFY,
                message=f"{what}: REF raises IndexError, the GPU reads another row's tokens",
                details={"pool_shape": shape, "index": value},
                gather_index=value,
            )
        )
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


def merge_spread(findings: list[Finding]) -> list[Finding]:
    """One record per (code, group, slot) that has more than `SLOT_SPREAD` one-cell
    records: one slot aliased over a thousand rows is one problem, reported once with its
    count and a sample of its cells (its provenance lists where it lives). Records that mark
    a raise stay apart, so the report still points at the exact cell."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, f in enumerate(findings):
        if (
            f.slot is not None
            and f.position is not None
            and f.cells == 1
            and not f.first_raise
            and f.upstream_raise is None
        ):
            # not the cause: one slot's cells of one code are one problem, and `provenance`
            # (which has no diagnosis) must merge them the way `check` does
            key = (f.code, f.group, f.space, f.slot, f.assumes)
            groups.setdefault(key, []).append(i)
    merged: dict[int, Finding] = {}
    dropped: set[int] = set()
    for members in groups.values():
        if len(members) <= SLOT_SPREAD:
            continue
        members.sort(key=lambda i: findings[i].order_key())
        first = findings[members[0]]
        sample = [
            [findings[i].batch_row, findings[i].pool_row, findings[i].position]
            for i in members[:SAMPLE_CELLS]
        ]
        merged[members[0]] = replace(
            first,
            cells=len(members),
            spread=True,
            message=f"{len(members)} cells hold slot {first.slot}, the first at (pool row "
            f"{first.pool_row}, position {first.position}): {first.message}",
            details={**first.details, "cells_sample": sample},
        )
        dropped.update(members[1:])
    if not merged:
        return findings
    return [merged.get(i, f) for i, f in enumerate(findings) if i not in dropped]
