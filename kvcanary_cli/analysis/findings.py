"""Finding detectors: every offending slot, row or tensor of a dump, not just the first.

Detectors select offenders with vectorized masks (numpy, over the batch rows or the batch's
live cells) and build one `Finding` per offender, without provenance; `check` attaches
provenance to all of them in one table scan.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from kvcanary_cli.analysis.model import Finding, FindingCode
from kvcanary_cli.analysis.provenance import LiveCells
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import dtype_label
from kvcanary_cli.dump.sparse import element, take_known
from kvcanary_cli.planners.base import Plan, ProblemKind, ProblemRole
from kvcanary_cli.planners.frame import launch_limit

__all__ = ["batch_findings", "lut_findings", "plan_findings", "slot_findings", "swa_findings"]


def batch_findings(dump: KvDump) -> list[Finding]:
    """Row- and tensor-level findings that need no plan: indices, lengths, limits, dtypes."""
    found: list[Finding] = []
    rpi = dump.req_pool_indices.numpy()
    prefix = dump.prefix_lens.numpy()
    extend = dump.extend_seq_lens.numpy()
    msl, max_reqs = dump.max_seq_len, dump.max_reqs
    active = rpi != 0
    out_of_range = active & ((rpi < 0) | (rpi >= max_reqs))
    beyond = active & ~out_of_range & (np.maximum(prefix, 0) + np.maximum(extend, 0) > msl)
    for r in np.flatnonzero(out_of_range).tolist():
        rp = int(rpi[r])
        found.append(
            Finding(
                code=FindingCode.ROW_OUT_OF_RANGE,
                group="full",
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
                group="full",
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
                    group="full",
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
                    group="full",
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
                group="full",
                message=f"bs={limit.bs} exceeds {limit.name}={limit.limit}: the GPU plan path "
                "raises before launching",
                details={"bs": limit.bs, "limit": limit.limit},
            )
        )
    for note in dump.dtype_notes:
        found.append(
            Finding(
                code=FindingCode.GPU_DTYPE_MISMATCH,
                group="full",
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
    group: str = "full",
    slot: int | None = None,
    space: str = "full",
    role: str | None = None,
    details: dict[str, object] | None = None,
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
        role=role or ("pending-write" if cells.pending[i] else "verify"),
        message=message,
        details=details or {},
    )


def slot_findings(dump: KvDump, cells: LiveCells) -> list[Finding]:
    """Full-space slot findings over the live cells."""
    found: list[Finding] = []
    slot = cells.slot
    for i in np.flatnonzero(slot < 0):
        found.append(
            _cell_finding(
                FindingCode.NEGATIVE_SLOT, cells, i, f"live cell holds negative slot {slot[i]}"
            )
        )
    for i in np.flatnonzero((slot == 0) & ~cells.pending):
        found.append(
            _cell_finding(
                FindingCode.PADDING_SLOT_IN_LIVE_RANGE,
                cells,
                i,
                "live prefix position holds slot 0 (never written or zeroed): the canary skips it",
            )
        )
    pool = dump.scalars["num_full_slots"]
    if pool.value is not None:
        # With a derived pool size (lut_len - 1) the finding holds only if the LUT is right.
        assumes = ("num_full_slots",) if pool.assumed else ()
        for i in np.flatnonzero(slot >= pool.value):
            found.append(
                replace(
                    _cell_finding(
                        FindingCode.SLOT_BEYOND_POOL,
                        cells,
                        i,
                        f"live slot {slot[i]} is beyond the full pool ({pool.value} slots, "
                        f"{pool.source})",
                        details={"num_full_slots": pool.value},
                    ),
                    assumes=assumes,
                )
            )
    real = slot > 0
    found.extend(_duplicates_in_row(cells, real))
    found.extend(_shared_across_positions(cells, real))
    if dump.free_full_slots is not None:
        free = dump.free_full_slots.numpy()
        for i in np.flatnonzero(real & np.isin(slot, free)):
            found.append(
                _cell_finding(
                    FindingCode.FREED_SLOT_IN_LIVE_RANGE,
                    cells,
                    i,
                    f"live slot {slot[i]} is on the allocator's free list (use after free)",
                )
            )
    found.extend(_writes_to_live(dump, cells))
    return found


def _groups_of(keys: np.ndarray) -> list[np.ndarray]:
    """Index arrays of equal keys (stable order), only for keys that occur twice or more."""
    if keys.size == 0:
        return []
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    ends = np.r_[starts[1:], sorted_keys.size]
    repeated = ends - starts > 1
    return [order[a:b] for a, b in zip(starts[repeated], ends[repeated], strict=True)]


def _duplicates_in_row(cells: LiveCells, real: np.ndarray) -> list[Finding]:
    idx = np.flatnonzero(real)
    keys = cells.pool_row[idx].astype(np.int64) * (1 << 40) + cells.slot[idx]
    found = []
    for group in _groups_of(keys):
        members = idx[group]
        positions = sorted(int(p) for p in cells.position[members])
        for i in members[1:]:
            found.append(
                _cell_finding(
                    FindingCode.DUPLICATE_SLOT_IN_ROW,
                    cells,
                    i,
                    f"slot {cells.slot[i]} sits at positions {positions} of pool row "
                    f"{cells.pool_row[i]}",
                    details={"positions": positions},
                )
            )
    return found


def _shared_across_positions(cells: LiveCells, real: np.ndarray) -> list[Finding]:
    idx = np.flatnonzero(real)
    # Radix sharing puts one slot at one position in many rows: only slots seen at two or
    # more distinct positions can be aliased (found vectorized; the loop below sees few).
    pairs = np.unique((cells.slot[idx] << 32) | cells.position[idx])  # slots, positions < 2^31
    slots, counts = np.unique(pairs >> 32, return_counts=True)
    idx = idx[np.isin(cells.slot[idx], slots[counts > 1])]
    found = []
    for group in _groups_of(cells.slot[idx]):
        members = idx[group]
        rows = cells.pool_row[members]
        if np.unique(rows).size < 2:
            continue
        positions = cells.position[members]
        values, counts = np.unique(positions, return_counts=True)
        # The position most cells agree on is the owner's; the others are copies.
        owner_pos = int(values[np.argmax(counts)]) if counts.max() > 1 else int(positions[0])
        owners = [
            (int(cells.pool_row[m]), int(cells.position[m]))
            for m in members
            if cells.position[m] == owner_pos
        ]
        for m in members:
            if cells.position[m] == owner_pos:
                continue
            others = [
                (int(r), int(p))
                for r, p in zip(rows, positions, strict=True)
                if r != cells.pool_row[m]
            ]
            if not others:
                continue
            found.append(
                _cell_finding(
                    FindingCode.SLOT_SHARED_ACROSS_POSITIONS,
                    cells,
                    m,
                    f"slot {cells.slot[m]} is also live at (pool row, position) "
                    f"{', '.join(map(str, owners[:3]))}: aliased across requests",
                    details={"other_cells": [list(o) for o in others[:8]]},
                )
            )
    return found


def _writes_to_live(dump: KvDump, cells: LiveCells) -> list[Finding]:
    """Slots written this step that are already live for another (row, position)."""
    loc = dump.out_cache_loc
    if loc is None:
        return []
    rpi = dump.req_pool_indices
    extend = dump.extend_seq_lens
    write_len = torch.where((rpi != 0) & (extend > 0), extend, 0)
    total = int(write_len.sum())
    n = min(total, int(loc.shape[0]))
    rows = torch.repeat_interleave(torch.arange(dump.bs), write_len)[:n]
    starts = torch.cumsum(write_len, 0) - write_len
    offsets = torch.arange(n) - starts[rows]
    written = loc[:n].numpy()
    w_rows = rows.numpy()
    w_pool = rpi[rows].numpy()
    w_pos = (dump.prefix_lens.clamp(min=0)[rows] + offsets).numpy()
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
        same = order[lo[i] : hi[i]]
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
                group="full",
                slot=int(x),
                space="full",
                batch_row=int(w_rows[i]),
                pool_row=int(w_pool[i]),
                position=int(w_pos[i]),
                role="pending-write",
                message=f"out_cache_loc[{i}] writes slot {x}, which is live at (pool row, "
                f"position) {', '.join(map(str, others[:3]))}",
                details={
                    "out_cache_loc_index": int(i),
                    "other_cells": [list(o) for o in others[:8]],
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
    if lut is None or lut.numel() == 0:
        return []
    found: list[Finding] = []
    lut_len, last = int(lut.shape[0]), element(lut, -1)
    pool = dump.scalars["num_full_slots"]
    if pool.value is not None and not pool.assumed and pool.value + 1 > lut_len:
        found.append(
            Finding(
                code=FindingCode.LUT_SHORTER_THAN_POOL,
                group="swa",
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
                group="swa",
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
    start = plan.frame.window_start.numpy()[cells.batch_row]
    in_window = (~cells.pending) & (cells.position >= start)
    mappable = (cells.slot > 0) & (cells.slot < lut_len - 1)
    swa = np.zeros_like(cells.slot)
    swa[mappable] = take_known(lut_tensor, cells.slot[mappable])[0]
    found: list[Finding] = []
    for i in np.flatnonzero(in_window & mappable & (swa == 0)):
        found.append(
            _cell_finding(
                FindingCode.SWA_UNMAPPED_IN_WINDOW,
                cells,
                i,
                f"slot {cells.slot[i]} is inside the SWA window but LUT[{cells.slot[i]}] = 0: its "
                "SWA peer was freed; the SWA canary is blind here",
                group="swa",
            )
        )
    idx = np.flatnonzero(in_window & mappable & (swa > 0))
    for group in _groups_of(swa[idx]):
        members = idx[group]
        full_slots = np.unique(cells.slot[members])
        if full_slots.size < 2:
            continue
        first_slot = int(cells.slot[members[0]])
        for m in members:
            if int(cells.slot[m]) == first_slot:
                continue
            found.append(
                _cell_finding(
                    FindingCode.SWA_SLOT_COLLISION,
                    cells,
                    m,
                    f"full slots {sorted(int(s) for s in full_slots)} all map to SWA slot {swa[m]}",
                    group="swa",
                    slot=int(swa[m]),
                    space="swa",
                    details={
                        "full_slot": int(cells.slot[m]),
                        "full_slots": [int(s) for s in full_slots],
                    },
                )
            )
    if dump.free_swa_slots is not None:
        free = dump.free_swa_slots.numpy()
        for i in np.flatnonzero(mappable & (swa > 0) & np.isin(swa, free)):
            found.append(
                _cell_finding(
                    FindingCode.FREED_SLOT_IN_LIVE_RANGE,
                    cells,
                    i,
                    f"live full slot {cells.slot[i]} maps to SWA slot {swa[i]}, which the SWA "
                    "allocator holds as free",
                    group="swa",
                    slot=int(swa[i]),
                    space="swa",
                    role=None if in_window[i] or cells.pending[i] else "prefix",
                    details={"full_slot": int(cells.slot[i])},
                )
            )
    return found


def plan_findings(dump: KvDump, plan: Plan) -> list[Finding]:
    """Findings from one group's reference plan: LUT range, token pool, capacity."""
    found: list[Finding] = []
    problems = plan.problems
    lut = dump.full_to_swa_index_mapping
    clamp_value = element(lut, -1) if lut is not None and lut.numel() else None
    # One finding per offending cell: a slot read as verify at p and as chain-prev at p+1.
    cells: dict[tuple[int, int], list[ProblemRole]] = {}
    values: dict[tuple[int, int], tuple[int, int]] = {}
    for i in np.flatnonzero(problems.kind == ProblemKind.LUT_OUT_OF_RANGE):
        key = (int(problems.batch_row[i]), int(problems.position[i]))
        cells.setdefault(key, []).append(ProblemRole(int(problems.role[i])))
        values[key] = (int(problems.value[i]), int(problems.pool_row[i]))
    lut_len = 0 if lut is None else int(lut.shape[0])
    for (batch_row, position), roles in sorted(cells.items()):
        slot, pool_row = values[(batch_row, position)]
        role = min(roles)  # the first read of the cell in REF's order
        found.append(
            Finding(
                code=FindingCode.LUT_OUT_OF_RANGE,
                group=plan.group,
                slot=slot,
                space="full",
                batch_row=batch_row,
                pool_row=pool_row,
                position=position,
                role=role.label,
                message=f"slot {slot} >= lut_len {lut_len}: REF raises; the GPU clamps to "
                f"LUT[{lut_len - 1}] = {clamp_value}",
                details={
                    "lut_len": lut_len,
                    "gpu_value": clamp_value,
                    "read_as": sorted({r.label for r in roles}),
                },
            )
        )
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
                role="verify",
                message=f"{what}: REF raises IndexError, the GPU reads another row's tokens",
                details={"pool_shape": shape, "index": value},
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
