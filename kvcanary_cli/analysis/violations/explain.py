"""Explain violation rows against a dump (docs/canary.md §7), vectorized over rows.

For each row: which verify cell read the slot (a replayed row knows its entry; a ring or log
row is matched to the live cells holding the slot), which cell holds the slot at the row's
*stored* position (the record's owner: a live cell, else any cell of the table), whether the
slot is on the free list, and whether the record before it is itself broken. The cause follows
from these facts (see `ViolationRowCause`). Lookups are sorted-key searches over the live cells
and at most one chunked pass over `req_to_token`; no loop runs per row.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvcanary_cli.analysis.provenance import LiveCells, live_cells
from kvcanary_cli.canary.constants import FailReason, LaunchTag
from kvcanary_cli.canary.ring_rows import ViolationRows
from kvcanary_cli.catalog import ViolationRowCause
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.tensor import StoredTensor, distinct
from kvcanary_cli.planners.frame import window_start
from kvcanary_cli.results.violations import CAUSES, OWNER_KINDS, Explanations, OwnerKind

__all__ = ["explain_rows"]

#: cells of req_to_token examined per step of the owner scan.
_SCAN_CELLS = 1 << 22
_POSITION = int(FailReason.VERIFY_POSITION_MISMATCH)
_CHAIN = int(FailReason.VERIFY_CHAIN_HASH_MISMATCH)
_TOKEN = int(FailReason.VERIFY_TOKEN_MISMATCH)
_REAL_KV = int(FailReason.VERIFY_REAL_KV_HASH_MISMATCH)
_WRITE = int(FailReason.WRITE_TOKEN_MISMATCH | FailReason.WRITE_POSITION_MISMATCH)
_SWA_TAGS = (int(LaunchTag.HEAD_K_SWA), int(LaunchTag.SWEEP_V_SWA))


def _keys(slot: np.ndarray, position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One int64 key per (slot, position) pair, and where the pair can be encoded at all."""
    ok = (slot >= 0) & (slot < (1 << 31) - 1) & (position >= 0) & (position < (1 << 32))
    return np.where(ok, (slot << 32) | position, -1), ok


class _Space:
    """The live cells of one slot space, sorted by (slot, position) for searches."""

    def __init__(self, cells: LiveCells, slot: np.ndarray, verify: np.ndarray) -> None:
        key, ok = _keys(slot, cells.position)
        keep = ok & (slot > 0)
        order = np.flatnonzero(keep)[np.argsort(key[keep], kind="stable")]
        self.order = order
        self.key = key[order]
        verify_order = order[verify[order]]
        self.verify_order = verify_order
        self.verify_key = key[verify_order]

    def owner(self, slot: np.ndarray, position: np.ndarray) -> np.ndarray:
        """Index (into the live cells) of a cell holding `slot` at `position`, or -1."""
        if self.key.size == 0:
            return np.full(slot.shape, -1, dtype=np.int64)
        key, ok = _keys(slot, position)
        at = np.searchsorted(self.key, key)
        found = ok & (at < self.key.size)
        found[found] = self.key[at[found]] == key[found]
        return np.where(found, self.order[np.minimum(at, max(self.key.size - 1, 0))], -1)

    def reference(self, slot: np.ndarray, position: np.ndarray, other: np.ndarray) -> np.ndarray:
        """A verify cell holding `slot`: at another position than `position` where `other`,
        else at that position (falling back to any); -1 when none."""
        key, ok = _keys(slot, position)
        lo = np.searchsorted(self.verify_key, np.where(ok, slot << 32, -1))
        hi = np.searchsorted(self.verify_key, np.where(ok, (slot + 1) << 32, -1))
        a = np.searchsorted(self.verify_key, key)
        b = np.searchsorted(self.verify_key, key, side="right")
        away = np.where(lo < a, lo, np.where(b < hi, b, -1))
        same = np.where(a < b, a, np.where(lo < hi, lo, -1))
        pick = np.where(other, away, same)
        pick = np.where(ok, pick, -1)
        if self.verify_order.size == 0:
            return np.full(slot.shape, -1, dtype=np.int64)
        return np.where(pick >= 0, self.verify_order[np.clip(pick, 0, None)], -1)


def explain_rows(dump: KvDump, rows: ViolationRows, cells: LiveCells | None = None) -> Explanations:
    """The explanation of every row (see the module doc); `cells` saves recomputing them."""
    cells = live_cells(dump) if cells is None else cells
    n = len(rows)
    tag, slot, stored = rows.tag, rows.slot, rows.fields[:, 2]
    bits = rows.bits
    space = np.where((tag >= _SWA_TAGS[0]) & (tag <= _SWA_TAGS[1]), 1, 0)
    space = np.where((tag >= 0) & (tag <= _SWA_TAGS[1]), space, -1)
    spaces = _spaces(dump, cells)
    ref = np.full(n, -1, dtype=np.int64)
    owner = np.full(n, -1, dtype=np.int64)
    ref_row, ref_pos, ref_batch = (np.full(n, -1, dtype=np.int64) for _ in range(3))
    position_bit = (bits & _POSITION) != 0
    for index, view in enumerate(spaces):
        mine = space == index
        if view is None or not mine.any():
            continue
        owner[mine] = view.owner(slot[mine], stored[mine])
        ref[mine] = view.reference(slot[mine], stored[mine], position_bit[mine])
    found = ref >= 0
    ref_row[found] = cells.pool_row[ref[found]]
    ref_pos[found] = cells.position[ref[found]]
    ref_batch[found] = cells.batch_row[ref[found]]
    replayed = (rows.batch_row >= 0) & (rows.batch_row < dump.bs)
    ref_batch[replayed] = rows.batch_row[replayed]
    ref_row[replayed] = dump.req_pool_indices[rows.batch_row[replayed]]
    ref_pos[replayed] = rows.expected_position[replayed]
    owner_row = (
        np.where(owner >= 0, cells.pool_row[np.clip(owner, 0, None)], -1)
        if len(cells)
        else np.full(n, -1)
    )
    owner_pos = np.where(owner >= 0, stored, -1)
    owner_kind = np.where(
        owner >= 0, OWNER_KINDS.index(OwnerKind.LIVE), OWNER_KINDS.index(OwnerKind.NONE)
    )
    lost = position_bit & (owner < 0) & (space >= 0)
    if lost.any():
        table_row = _table_owner(dump, space[lost], slot[lost], stored[lost])
        hit = table_row >= 0
        idx = np.flatnonzero(lost)[hit]
        owner_row[idx] = table_row[hit]
        owner_pos[idx] = stored[idx]
        in_batch = np.isin(table_row[hit], dump.req_pool_indices)
        owner_kind[idx] = np.where(
            in_batch, OWNER_KINDS.index(OwnerKind.STALE_TAIL), OWNER_KINDS.index(OwnerKind.IDLE_ROW)
        )
    prev_slot, prev_known = _prev_slots(dump, rows, space, ref_row, ref_pos)
    free = _free(dump, space, slot)
    broken = _broken_before(rows, prev_slot, prev_known)
    cause = _causes(bits, owner_kind, owner_row, ref_row, free, broken, space, found | replayed)
    return Explanations(
        cause=cause,
        space=space,
        ref_row=ref_row,
        ref_position=ref_pos,
        ref_batch_row=ref_batch,
        owner_row=owner_row,
        owner_position=owner_pos,
        owner_kind=owner_kind,
        prev_slot=prev_slot,
        prev_known=prev_known,
        free=free,
    )


def _spaces(dump: KvDump, cells: LiveCells) -> list[_Space | None]:
    """The live cells in the full space and (with a LUT) in the SWA space."""
    full = _Space(cells, cells.slot, ~cells.pending)
    lut = dump.full_to_swa_index_mapping
    if lut is None:
        return [full, None]
    lut_len = int(lut.shape[0])
    mappable = (cells.slot > 0) & (cells.slot < lut_len - 1)
    swa = np.where(mappable, lut.take_known(np.clip(cells.slot, 0, lut_len - 1))[0], 0)
    start = window_start(dump.prefix_lens, dump.window("swa"))
    in_window = ~cells.pending & (cells.position >= start[cells.batch_row])
    return [full, _Space(cells, swa, in_window)]


def _table_owner(
    dump: KvDump, space: np.ndarray, slot: np.ndarray, position: np.ndarray
) -> np.ndarray:
    """Pool row of any table cell holding `slot` (in its space) at `position`, or -1: one
    chunked pass over req_to_token."""
    out = np.full(slot.shape, -1, dtype=np.int64)
    lut = dump.full_to_swa_index_mapping
    for index in (0, 1):
        mine = np.flatnonzero(space == index)
        if mine.size == 0 or (index == 1 and lut is None):
            continue
        key, ok = _keys(slot[mine], position[mine])
        wanted = distinct(key[ok])
        if wanted.size == 0:
            continue
        wanted_slots = distinct(wanted >> 32)
        first = np.full(wanted.size, -1, dtype=np.int64)
        translate = _swa_translation(lut) if index == 1 else None

        def in_space(values: np.ndarray, translate: _Translate | None = translate) -> np.ndarray:
            return values if translate is None else translate(values)

        def holds(
            values: np.ndarray,
            in_space: Callable[[np.ndarray], np.ndarray] = in_space,
            wanted_slots: np.ndarray = wanted_slots,
        ) -> np.ndarray:
            return np.isin(in_space(values), wanted_slots)

        # Cells come in table order, chunk after chunk: the first hit of a key wins.
        for rows_hit, cols_hit, values in dump.req_to_token.find_cells(
            holds, chunk_cells=_SCAN_CELLS
        ):
            hit_key = (in_space(values) << 32) | cols_hit
            at = np.searchsorted(wanted, hit_key)
            good = (at < wanted.size) & (wanted[np.minimum(at, wanted.size - 1)] == hit_key)
            at, row = at[good], rows_hit[good]
            new = first[at] < 0  # earlier chunks won already
            keys_hit, first_index = np.unique(at[new], return_index=True)
            first[keys_hit] = row[new][first_index]  # the first hit in table order wins
        at = np.searchsorted(wanted, key)
        good = ok & (at < wanted.size)
        out[mine[good]] = first[np.minimum(at[good], wanted.size - 1)]
    return out


_Translate = Callable[[np.ndarray], np.ndarray]


def _swa_translation(lut: StoredTensor | None) -> _Translate:
    """Full slots to SWA slots for the owner scan (0 outside the LUT's body)."""
    assert lut is not None
    lut_len = int(lut.shape[0])

    def translate(values: np.ndarray) -> np.ndarray:
        inside = (values >= 0) & (values < lut_len - 1)
        return np.where(inside, lut.take_known(np.clip(values, 0, lut_len - 1))[0], 0)

    return translate


def _prev_slots(
    dump: KvDump, rows: ViolationRows, space: np.ndarray, ref_row: np.ndarray, ref_pos: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The slot before each row's cell (in its space): from the replay, else from the table."""
    n = len(rows)
    prev = np.full(n, -1, dtype=np.int64)
    known = np.zeros(n, dtype=bool)
    replayed = rows.batch_row >= 0
    prev[replayed] = rows.prev_slot[replayed]
    known[replayed] = True
    lookup = ~replayed & (ref_row > 0) & (ref_row < dump.max_reqs) & (ref_pos > 0)
    lookup &= ref_pos <= dump.max_seq_len
    if lookup.any():
        flat = ref_row[lookup] * dump.max_seq_len + ref_pos[lookup] - 1
        values = dump.req_to_token.take_known(flat)[0]
        lut = dump.full_to_swa_index_mapping
        if lut is not None:
            lut_len = int(lut.shape[0])
            inside = (values >= 0) & (values < lut_len)
            swa = np.where(inside, lut.take_known(np.clip(values, 0, lut_len - 1))[0], values)
            values = np.where(space[lookup] == 1, swa, values)
        prev[lookup] = values
        known[lookup] = True
    return prev, known


def _free(dump: KvDump, space: np.ndarray, slot: np.ndarray) -> np.ndarray:
    """Per row: 1 on its space's free list, 0 in use, 3 below the pool (negative), 2 beyond
    it (a slot the allocator never hands out is not "in use"), -1 without a free list."""
    out = np.full(slot.shape, -1, dtype=np.int64)
    lists = ((0, dump.free_full_slots, "num_full_slots"), (1, dump.free_swa_slots, "num_swa_slots"))
    for index, free, pool_name in lists:
        mine = space == index
        if free is not None and mine.any():
            out[mine] = np.isin(slot[mine], free).astype(np.int64)
            pool = dump.scalars[pool_name].value
            if pool is not None:
                out[mine & (slot >= pool)] = 2
            out[mine & (slot < 0)] = 3  # no pool has a negative slot, whatever its size
    return out


def _broken_before(
    rows: ViolationRows, prev_slot: np.ndarray, prev_known: np.ndarray
) -> np.ndarray:
    """Rows whose predecessor slot has a position mismatch of its own in the same launch."""
    bad = (rows.bits & _POSITION) != 0
    if not bad.any():
        return np.zeros(len(rows), dtype=bool)
    bad_pairs = np.unique(np.stack([rows.tag[bad], rows.slot[bad]], axis=1), axis=0)
    pairs = np.stack([rows.tag, prev_slot], axis=1)
    combined = np.concatenate([bad_pairs, pairs])
    _, inverse = np.unique(combined, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    return prev_known & np.isin(inverse[bad_pairs.shape[0] :], inverse[: bad_pairs.shape[0]])


def _causes(
    bits: np.ndarray,
    owner_kind: np.ndarray,
    owner_row: np.ndarray,
    ref_row: np.ndarray,
    free: np.ndarray,
    broken: np.ndarray,
    space: np.ndarray,
    referenced: np.ndarray,
) -> np.ndarray:
    """The cause of every row, first matching rule first (the order of `ViolationRowCause`)."""
    live = owner_kind == OWNER_KINDS.index(OwnerKind.LIVE)
    elsewhere = owner_kind > OWNER_KINDS.index(OwnerKind.LIVE)
    position = (bits & _POSITION) != 0
    chain = (bits & _CHAIN) != 0
    rules = [
        ((bits & _WRITE) != 0, ViolationRowCause.WRITE_CHECK),
        (position & live & (owner_row != ref_row), ViolationRowCause.ALIASING),
        (position & live, ViolationRowCause.DUPLICATE_IN_ROW),
        (position & (free == 1), ViolationRowCause.USE_AFTER_FREE),
        (position & elsewhere, ViolationRowCause.STALE_SLOT),
        (position & referenced, ViolationRowCause.FOREIGN_RECORD),
        (chain & broken, ViolationRowCause.FOLLOWS_BAD_RECORD),
        (chain & (free == 1) & referenced, ViolationRowCause.STALE_ROW),
        (chain & referenced, ViolationRowCause.CHAIN_BREAK),
        (((bits & _TOKEN) != 0) & ~position & ~chain, ViolationRowCause.WRONG_TOKEN),
        (((bits & _REAL_KV) != 0) & ~position & ~chain, ViolationRowCause.KV_OVERWRITTEN),
    ]
    return np.select(
        [mask & (space >= 0) for mask, _ in rules],
        [CAUSES.index(c) for _, c in rules],
        default=CAUSES.index(ViolationRowCause.NO_LIVE_CELL),
    ).astype(np.int64)
