"""What a shrunk dump keeps (`kvcanary shrink`): everything the analysis of its original reads.

A production dump holds the whole `req_to_token` (hundreds of MB) while the analysis reads the
batch's rows and a few cells elsewhere. The small dump keeps, in the original coordinates:

- `req_to_token`: every cell a plan reads (the live range of each batch row, the verify window,
  chain predecessors and seeds, GPU reads that cross into the next row), the cells provenance
  shows for every slot a finding or a violation row names (the first 16 per slot, in the order
  provenance lists them), and the cell a violation's stored position points to;
- the expected-token pool: every cell a plan gathers a token from;
- the LUT: the entries of every slot those cells hold, of every finding's slot, the full slots
  that map to a finding's SWA slot (the first 64, as provenance lists them), and the last entry;
- the free lists: the entries among the slots kept, plus each list's largest entry;
- canary buffers: the records of the slots findings and violation rows name, of every entry the
  verify replay fails (and the record before it), and one written record when only that tells
  the replay the buffer was written; real-KV sources: the bytes those records fingerprint;
- everything small (the batch, writes, the violation ring, scalars) whole, and unified
  memory's page tables and holes (their audit compares whole tables).

Every rule keeps what a read of the analysis touches, so the small dump gives the same
findings and diagnosis; counts over the whole table (cells holding a slot) cover what was kept.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from kvcanary_cli.analysis.cells import cell_slots, distinct
from kvcanary_cli.analysis.check import (
    CollectedFindings,
    collect_findings,
    provenance_slots,
)
from kvcanary_cli.analysis.provenance import ProvenanceIndex, full_slots_mapping_to
from kvcanary_cli.analysis.violations.explain import explain_rows
from kvcanary_cli.canary.buffers import dump_buffers, read_records
from kvcanary_cli.canary.constants import BUFFERS, RECORD_BYTES, LaunchTag, buffer_tensor_name
from kvcanary_cli.canary.real_kv import PARTIAL_BYTES, RealKvMode, real_kv_setup, slot_bytes
from kvcanary_cli.canary.replay import BufferReplay, replay_dump
from kvcanary_cli.canary.ring import decode_ring
from kvcanary_cli.canary.ring_rows import RowOrigin, ViolationRows
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import SCALARS, Group
from kvcanary_cli.dump.shrink_writer import FREE_LISTS, Keep, ShrinkResult, write_shrunk
from kvcanary_cli.dump.tensor import StoredTensor, union
from kvcanary_cli.planners.base import Plan, Planner, Undefined
from kvcanary_cli.planners.frame import GroupFrame, group_frame
from kvcanary_cli.results.check import Finding
from kvcanary_cli.results.violations import OWNER_KINDS, OwnerKind

__all__ = ["PROVENANCE_CELLS", "shrink_dump", "shrink_keep"]

#: Cells kept per slot for provenance: as many as `check` and `violations` show.
PROVENANCE_CELLS = 16
_SWA_TAG = int(LaunchTag.HEAD_K_SWA)


def _ranges(lo: np.ndarray, hi: np.ndarray, total: int) -> np.ndarray:
    """Every index of the ranges `[lo, hi)`, clipped to `[0, total)`."""
    lo = np.maximum(np.asarray(lo, dtype=np.int64), 0)
    hi = np.minimum(np.asarray(hi, dtype=np.int64), total)
    live = lo < hi
    lo, hi = lo[live], hi[live]
    counts = hi - lo
    if counts.size == 0:
        return np.zeros(0, dtype=np.int64)
    base = np.repeat(lo - (np.cumsum(counts) - counts), counts)
    return base + np.arange(int(counts.sum()), dtype=np.int64)


def _python_rows(rp: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows Python indexing reaches (negative rows wrap), and where it reaches one."""
    row = np.where(rp < 0, rp + rows, rp)
    return row, (row >= 0) & (row < rows)


def _table_reads(dump: KvDump, frames: Mapping[Group, GroupFrame]) -> np.ndarray:
    """Flat cells of `req_to_token` the plans and the live cells read."""
    rp = dump.req_pool_indices
    prefix = np.maximum(dump.prefix_lens, 0)
    live = prefix + np.maximum(dump.extend_seq_lens, 0)
    rows, width = dump.max_reqs, dump.max_seq_len
    total = rows * width
    active = rp != 0
    row, resolves = _python_rows(rp, rows)
    parts = [  # REF reads (and the live cells) stay inside the row Python indexing reaches
        _ranges(
            (row * width)[active & resolves],
            (row * width + np.minimum(live, width))[active & resolves],
            total,
        )
    ]
    for frame in frames.values():
        start = np.maximum(frame.window_start - 1, 0)
        if frame.enable:  # GPU reads are flat: past the row's end they cross into the next
            gpu = active & (frame.verify_len > 0)
            parts.append(_ranges((rp * width + start)[gpu], (rp * width + prefix)[gpu], total))
        wanted = frame.seed_wanted
        seed = (rp * width + prefix - 1)[: wanted.size][wanted]
        parts.append(_ranges(seed, seed + 1, total))
    return distinct(np.concatenate(parts))


def _pool_reads(dump: KvDump, frames: Mapping[Group, GroupFrame]) -> np.ndarray:
    """Flat cells of the expected-token pool the plans gather tokens from."""
    pool, valid = dump.req_to_verify_expected_tokens, dump.req_to_verify_expected_tokens_valid_lens
    if pool is None or valid is None:
        return np.zeros(0, dtype=np.int64)
    rows, width = int(pool.shape[0]), int(pool.shape[1])
    rp = dump.req_pool_indices
    off = dump.token_offset
    prefix = dump.prefix_lens
    row, resolves = _python_rows(rp, rows)
    parts = []
    for frame in frames.values():
        s_lo = np.maximum(frame.window_start + off, 0)
        s_hi = np.maximum(np.minimum(prefix + off, valid), s_lo)
        reads = (rp != 0) & (frame.verify_len > 0)
        ref = reads & resolves
        parts.append(
            _ranges(
                (row * width + s_lo)[ref],
                (row * width + np.minimum(s_hi, width))[ref],
                rows * width,
            )
        )
        if frame.enable:
            parts.append(
                _ranges((rp * width + s_lo)[reads], (rp * width + s_hi)[reads], rows * width)
            )
    return distinct(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def _replays(dump: KvDump, plans: list[Plan]) -> list[tuple[Plan, BufferReplay]]:
    """Verify replayed on every canary buffer, with each plan."""
    return [
        (plan, replay)
        for plan in plans
        if dump_buffers(dump, plan.group)
        for replay in replay_dump(dump, {plan.group: plan})
    ]


def _violation_rows(dump: KvDump, replays: list[tuple[Plan, BufferReplay]]) -> ViolationRows:
    """The ring's rows and the rows the replays yield."""
    parts = [replay.rows for _, replay in replays]
    if dump.violation_ring is not None and dump.violation_write_index is not None:
        state = decode_ring(dump.violation_ring, dump.violation_write_index)
        parts.append(ViolationRows.build(state.rows, origin=RowOrigin.RING))
    return ViolationRows.concat(parts) if parts else ViolationRows.empty()


def _row_slots(dump: KvDump, rows: ViolationRows) -> tuple[set[int], set[int]]:
    """The (full, SWA) slots violation rows name, their chain predecessors included."""
    tag = rows.tag
    known = (tag >= 0) & (tag < len(LaunchTag))
    swa = known & (tag >= _SWA_TAG)
    full_rows = known & ~swa
    prev = rows.prev_slot
    full = {int(s) for s in rows.slot[full_rows]} | {int(s) for s in prev[full_rows] if s > 0}
    swa_slots = {int(s) for s in rows.slot[swa]} | {int(s) for s in prev[swa] if s > 0}
    if dump.full_to_swa_index_mapping is None:
        swa_slots = set()
    return full, swa_slots


def _owner_cells(dump: KvDump, rows: ViolationRows, found: CollectedFindings) -> np.ndarray:
    """Flat cells outside the live ranges that explain a violation row (the stored
    position's owner in a stale tail or an idle row)."""
    if not len(rows):
        return np.zeros(0, dtype=np.int64)
    assert found.cells is not None  # kept: `collect_findings`'s default
    why = explain_rows(dump, rows, found.cells)
    elsewhere = np.isin(
        why.owner_kind,
        [OWNER_KINDS.index(OwnerKind.STALE_TAIL), OWNER_KINDS.index(OwnerKind.IDLE_ROW)],
    )
    ok = elsewhere & (why.owner_row >= 0) & (why.owner_position >= 0)
    flat: np.ndarray = why.owner_row[ok] * dump.max_seq_len + why.owner_position[ok]
    return flat


def _written_witness(plan: Plan, data: StoredTensor) -> tuple[int, int] | None:
    """(slot, prev slot) of the first replayed entry whose record (or the one before it) is
    written: the replay takes a buffer whose records are all zero for one never written."""
    num_slots = int(data.shape[0])
    slot = plan.verify_slot_indices
    prev = plan.verify_prev_slot_indices
    undefined = (plan.verify_undefined & int(Undefined.SLOT | Undefined.PREV)) != 0
    usable = (slot > 0) & ~undefined & (slot < num_slots) & (prev < num_slots)
    idx = np.flatnonzero(usable)
    if idx.size == 0:
        return None
    written = read_records(data, slot[idx]).written
    reads_prev = prev[idx] > 0
    before = np.zeros(idx.size, dtype=bool)
    before[reads_prev] = read_records(data, prev[idx][reads_prev]).written
    hit = np.flatnonzero(written | before)
    if hit.size == 0:
        return None
    i = idx[hit[0]]
    return int(slot[i]), int(prev[i])


def _canary_slots(
    dump: KvDump, replays: list[tuple[Plan, BufferReplay]], named: dict[str, set[int]]
) -> dict[str, set[int]]:
    """Per canary buffer tensor, the slots whose records the analysis reads."""
    kept: dict[str, set[int]] = {}
    for plan, replay in replays:
        name = buffer_tensor_name(plan.group, replay.buffer)
        slots = kept.setdefault(name, set())
        failing = {int(s) for s in replay.rows.slot}
        failing |= {int(s) for s in replay.rows.prev_slot if s > 0}
        slots |= failing
        data = dump.canary_buffers[name]
        records = read_records(data, np.array(sorted(failing), dtype=np.int64))
        if len(replay.rows) and not records.written.any():
            witness = _written_witness(plan, data)
            if witness is not None:
                slots.update(s for s in witness if s > 0)
    for group in ("full", "swa"):
        for buffer, _ in dump_buffers(dump, group):
            kept.setdefault(buffer_tensor_name(group, buffer), set()).update(named[group])
    return kept


def _record_cells(data: StoredTensor, slots: set[int]) -> np.ndarray:
    """Flat bytes of the records of `slots` (inside the buffer) in a canary buffer."""
    wanted = np.array(sorted(s for s in slots if 0 <= s < int(data.shape[0])), dtype=np.int64)
    stride = int(data.shape[1])
    return (wanted[:, None] * stride + np.arange(RECORD_BYTES)[None, :]).reshape(-1)


def _real_kv_cells(dump: KvDump, canary: dict[str, set[int]]) -> dict[str, np.ndarray]:
    """Per real-KV source, the bytes TAIL fingerprints of the kept records read: of each slot
    whose bytes the dump stores all of (the others' fingerprints are unknown, kept or not),
    so the bytes kept are stored bytes, whatever width a shrunk source claims."""
    setup = real_kv_setup(dump)
    if setup.mode is None or setup.mode is RealKvMode.NONE:
        return {}
    out: dict[str, np.ndarray] = {}
    for (group, half), source in setup.sources.items():
        slots = set().union(
            *(canary.get(buffer_tensor_name(group, b), set()) for b in BUFFERS if b[-1] == half)
        )
        read = PARTIAL_BYTES if setup.mode is RealKvMode.PARTIAL else source.read_bytes
        wanted = np.array(sorted(slots), dtype=np.int64)
        wanted = wanted[(wanted >= 0) & (wanted // source.page_size < int(source.data.shape[0]))]
        base = slot_bytes(source, wanted)
        stored = source.data.kept_before(base + read) - source.data.kept_before(base) == read
        out[source.name] = _ranges(base[stored], base[stored] + read, source.data.size)
    return out


def _free_masks(dump: KvDump, full: np.ndarray, swa: np.ndarray) -> dict[str, np.ndarray]:
    """Per free list, the entries to keep: those among the slots kept, and the largest."""
    masks = {}
    for name, slots in zip(FREE_LISTS, (full, swa), strict=True):
        free = getattr(dump, name)
        if free is None:
            continue
        values = free
        mask = np.isin(values, slots)
        if values.size:
            mask[int(np.argmax(values))] = True  # the diagnosis reads how far the pool goes
        masks[name] = mask
    if dump.held_full_slots is not None:  # read only by leak accounting, which a shrunk dump
        # cannot do (it keeps too little of the free lists): none of it is kept
        masks["held_full_slots"] = np.zeros(dump.held_full_slots.shape, dtype=bool)
    for name in ("tree_full_slots", "tree_swa_resident_slots"):  # the same: leak accounting
        held = getattr(dump, name)
        if held is not None:
            masks[name] = np.zeros(held.shape, dtype=bool)
    if dump.tree_locked_full_slots is not None:  # only the slots kept: a stray lock stays
        # stray, and a rightful one whose row's cells the shrink drops is not kept to look stray
        masks["tree_locked_full_slots"] = np.isin(dump.tree_locked_full_slots, full)
    for name in ("free_req_rows", "running_req_rows"):  # a list per pool row: kept whole
        rows = getattr(dump, name)
        if rows is not None:
            masks[name] = np.ones(rows.shape, dtype=bool)
    return masks


def _finding_slots(findings: list[Finding], space: str) -> np.ndarray:
    """Every slot of `space` a finding holds, at any of its cells (sorted, distinct)."""
    parts = [cell_slots(f) for f in findings if f.slot is not None and f.space == space]
    return distinct(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


#: Findings a shrunk dump cannot carry (docs/dump-format.md, "Shrunk dumps").
_NOT_CARRIED = frozenset(
    {
        FindingCode.FULL_PAGE_LEAKED,
        FindingCode.FULL_SLOT_FREE_AND_HELD,
        FindingCode.FULL_SLOT_HELD_TWICE,
    }
)


def shrink_dump(
    dump: KvDump,
    out: str | os.PathLike[str],
    *,
    planner: Planner,
    kernel: Planner,
    overrides: Mapping[str, int | str | None] | None,
    kvcanary_version: str,
    force: bool,
) -> ShrinkResult:
    """Write the small dump of `dump` at `out`, recording the scalar `overrides` it was
    analysed with (the small dump then says the same without them)."""
    keep, _ = shrink_keep(dump, planner=planner, kernel=kernel)
    scalars = {
        name: int(value)
        for name, value in (overrides or {}).items()
        if name in SCALARS and value is not None
    }
    return write_shrunk(
        dump, keep, out, kvcanary_version=kvcanary_version, overrides=scalars, overwrite=force
    )


def shrink_keep(
    dump: KvDump, *, planner: Planner, kernel: Planner
) -> tuple[Keep, CollectedFindings]:
    """What the small dump of `dump` keeps, and the findings it must reproduce.

    `planner` (REF semantics) and `kernel` (GPU semantics) plan like `check` does; the canary
    replay runs on both plans, so the small dump replays like the original whichever plan a
    later check replays.
    """
    found = collect_findings(dump, planner=planner, kernel=kernel)
    frames = {group: group_frame(dump, group) for group in dump.groups}
    replays = _replays(dump, [*found.plans, *found.kernel_plans.values()])
    rows = _violation_rows(dump, replays)
    row_full, row_swa = _row_slots(dump, rows)
    # a shrunk dump cannot carry a full-pool leak (its accounting reads the whole free list
    # and tree record) nor the cells running requests hold outside the batch (every running
    # request's allocated length): their slots are not kept for them, so shrinking again
    # keeps the same
    kept = [f for f in found.findings if f.code not in _NOT_CARRIED]
    slots = provenance_slots(dump, kept)
    row_sources = full_slots_mapping_to(dump, row_swa)
    wanted = set(slots.wanted) | row_full
    for sources in (*slots.swa_sources.values(), *row_sources.values()):
        wanted.update(sources)
    width = dump.max_seq_len
    table_parts = [_table_reads(dump, frames), _owner_cells(dump, rows, found)]
    if wanted:
        index = ProvenanceIndex(dump, wanted, max_cells=PROVENANCE_CELLS)
        cell_rows, cell_cols = index.kept_cells()
        table_parts.append(cell_rows * width + cell_cols)
    table = distinct(np.concatenate(table_parts))
    elements = {"req_to_token": table}
    if dump.req_to_verify_expected_tokens is not None:
        elements["req_to_verify_expected_tokens"] = _pool_reads(dump, frames)
    held = distinct(dump.req_to_token.take_known(table)[0])
    finding_full = _finding_slots(kept, "full")
    finding_swa = _finding_slots(kept, "swa")
    full_slots = union(
        held, finding_full, np.fromiter(row_full, dtype=np.int64, count=len(row_full))
    )
    swa_held = np.zeros(0, dtype=np.int64)
    lut = dump.full_to_swa_index_mapping
    if lut is not None:
        lut_len = int(lut.shape[0])
        mapped = [
            s for group in (slots.swa_sources, row_sources) for v in group.values() for s in v
        ]
        entries = union(full_slots, np.array([*mapped, lut_len - 1], dtype=np.int64))
        entries = entries[(entries >= 0) & (entries < lut_len)]
        elements["full_to_swa_index_mapping"] = entries
        swa_held = distinct(lut.take_known(entries)[0])
    swa_slots = union(
        swa_held, finding_swa, np.fromiter(row_swa, dtype=np.int64, count=len(row_swa))
    )
    named = {
        "full": {int(s) for s in finding_full.tolist()} | row_full,
        "swa": {int(s) for s in finding_swa.tolist()} | row_swa,
    }
    canary = _canary_slots(dump, replays, named)
    for name, kept_slots in canary.items():
        elements[name] = _record_cells(dump.canary_buffers[name], kept_slots)
    elements.update(_real_kv_cells(dump, canary))
    keep = Keep(elements=elements, free_lists=_free_masks(dump, full_slots, swa_slots))
    return keep, found
