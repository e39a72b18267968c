"""Slot provenance: which `req_to_token` cells hold a slot, and what each cell is to the batch.

Two vectorized views: `live_cells` (the batch's live ranges, gathered from the rows of the
batch only) and `ProvenanceIndex` (every cell of the whole table holding one of a set of
slots, found in one chunked pass, with at most `max_cells` kept per slot).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from kvcanary_cli.analysis.model import CanaryRecord, Cell, SlotProvenance, ViolationRow
from kvcanary_cli.canary.ring import decode_ring
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.planners.frame import GroupFrame

__all__ = ["LiveCells", "ProvenanceIndex", "cell_role", "live_cells"]

_I64 = torch.int64
#: cells of req_to_token examined per step of the provenance scan (bounds temporaries).
_SCAN_CELLS = 1 << 22
#: violation-ring kernel_kind (launch tag) values of the SWA group: HEAD/TAIL/SWEEP x K/V.
_SWA_TAGS = range(6, 12)


@dataclass(frozen=True, kw_only=True)
class LiveCells:
    """Live cells of in-range active rows, flat (numpy int64 arrays of equal length).

    Rows whose pool row repeats in the batch contribute once (their first batch row), so a
    duplicated request does not look like aliasing; `duplicate-request-row` reports it.
    """

    slot: np.ndarray
    batch_row: np.ndarray
    pool_row: np.ndarray
    position: np.ndarray
    #: True for pending writes `[P, P+E)`, False for the prefix `[0, P)`.
    pending: np.ndarray

    def __len__(self) -> int:
        return int(self.slot.shape[0])


def batch_rows_of(dump: KvDump) -> dict[int, list[int]]:
    """Pool row -> batch rows using it (active rows only)."""
    rows: dict[int, list[int]] = {}
    for r, rp in enumerate(dump.req_pool_indices.tolist()):
        if rp != 0:
            rows.setdefault(rp, []).append(r)
    return rows


def live_cells(dump: KvDump) -> LiveCells:
    """Gather `[0, P+E)` of every in-range active row (first occurrence of each pool row)."""
    rpi = dump.req_pool_indices
    prefix = dump.prefix_lens.clamp(min=0)
    extend = dump.extend_seq_lens.clamp(min=0)
    msl = dump.max_seq_len
    first = torch.zeros_like(rpi, dtype=torch.bool)
    if rpi.numel():
        _, inverse = torch.unique(rpi, return_inverse=True)
        order = torch.arange(rpi.numel(), dtype=_I64)
        first_index = torch.full((int(inverse.max()) + 1,), rpi.numel(), dtype=_I64)
        first_index.scatter_reduce_(0, inverse, order, reduce="amin")
        first = first_index[inverse] == order
    usable = (rpi > 0) & (rpi < dump.max_reqs) & first
    lens = torch.where(usable, (prefix + extend).clamp(max=msl), 0)
    rows = torch.repeat_interleave(torch.arange(rpi.numel(), dtype=_I64), lens)
    starts = torch.cumsum(lens, 0) - lens
    pos = torch.arange(rows.numel(), dtype=_I64) - torch.repeat_interleave(starts, lens)
    pool_row = rpi[rows]
    flat = pool_row * msl + pos
    slot = dump.req_to_token.reshape(-1)[flat].to(_I64) if flat.numel() else flat
    return LiveCells(
        slot=slot.numpy(),
        batch_row=rows.numpy(),
        pool_row=pool_row.numpy(),
        position=pos.numpy(),
        pending=(pos >= prefix[rows]).numpy(),
    )


def cell_role(
    dump: KvDump, frame: GroupFrame, batch_row: int | None, position: int
) -> tuple[str, bool]:
    """(role, is_seed) of a cell at `position` of the pool row used by `batch_row`, with the
    window of `frame`'s group."""
    if batch_row is None:
        return "idle-row", False
    p = max(int(dump.prefix_lens[batch_row]), 0)
    e = max(int(dump.extend_seq_lens[batch_row]), 0)
    ws = int(frame.window_start[batch_row])
    seed = e > 0 and p > 0 and position == p - 1
    if ws <= position < p:
        return "verify", seed
    if position < p:
        return ("chain-prev" if position == ws - 1 else "prefix"), seed
    if position < p + e:
        return "pending-write", False
    return "stale-tail", False


class ProvenanceIndex:
    """Cells of the whole table holding any of a set of full slots (one chunked scan)."""

    def __init__(self, dump: KvDump, slots: Iterable[int], *, max_cells: int = 16) -> None:
        self.dump = dump
        self.max_cells = max_cells
        wanted = sorted({int(s) for s in slots})
        self._cells: dict[int, list[tuple[int, int]]] = {s: [] for s in wanted}
        self._counts: dict[int, int] = dict.fromkeys(wanted, 0)
        self._live_first: dict[int, list[tuple[int, int]]] = {s: [] for s in wanted}
        self._batch_rows = batch_rows_of(dump)
        if wanted:
            self._scan(torch.tensor(wanted, dtype=_I64))

    def _scan(self, wanted: torch.Tensor) -> None:
        table = self.dump.req_to_token
        msl = max(self.dump.max_seq_len, 1)
        step = max(1, _SCAN_CELLS // msl)
        live_rows = np.array(sorted(self._batch_rows), dtype=np.int64)
        for r0 in range(0, self.dump.max_reqs, step):
            chunk = table[r0 : r0 + step].to(_I64)
            hits = torch.isin(chunk, wanted).nonzero()
            if hits.numel() == 0:
                continue
            values = chunk[hits[:, 0], hits[:, 1]].numpy()
            rows = (hits[:, 0] + r0).numpy()
            cols = hits[:, 1].numpy()
            is_live = np.isin(rows, live_rows)
            for slot in np.unique(values):
                mask = values == slot
                key = int(slot)
                self._counts[key] += int(mask.sum())
                for bucket, select in (
                    (self._live_first[key], mask & is_live),
                    (self._cells[key], mask & ~is_live),
                ):
                    room = self.max_cells - len(bucket)
                    if room > 0:
                        idx = np.flatnonzero(select)[:room]
                        bucket.extend(zip(rows[idx].tolist(), cols[idx].tolist(), strict=True))

    def cells(self, slot: int, frame: GroupFrame) -> tuple[tuple[Cell, ...], int]:
        """Cells holding `slot` (live rows first, at most `max_cells`) and their total count."""
        raw = (self._live_first.get(slot, []) + self._cells.get(slot, []))[: self.max_cells]
        labelled = []
        for row, pos in raw:
            batch_rows = tuple(self._batch_rows.get(row, ()))
            role, seed = cell_role(self.dump, frame, batch_rows[0] if batch_rows else None, pos)
            labelled.append((row, pos, batch_rows, role, seed))
        live_positions: dict[int, set[int]] = {}
        for row, pos, _, role, _ in labelled:
            if role in ("verify", "prefix", "chain-prev", "pending-write"):
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
        return out, self._counts.get(slot, 0)

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
                f"LUT[{lut.shape[0] - 1}] = {int(lut[-1])}"
            )
        else:
            swa_slot = int(lut[slot])
            if swa_slot == 0:
                note = "unmapped (LUT = 0)"
        return SlotProvenance(
            slot=slot,
            space="full",
            cells=cells,
            cells_total=total,
            swa_slot=swa_slot,
            translation_note=note,
            allocator=_allocator_state(dump.free_full_slots, slot),
            canary=_canary_records(dump, "full", slot),
            violations=_violations(dump, slot, swa=False),
        )


def swa_provenance(
    dump: KvDump,
    index: ProvenanceIndex,
    swa_slot: int,
    mapped_from: tuple[int, ...],
    frame: GroupFrame,
) -> SlotProvenance:
    """SWA-space provenance: the full slots mapping to `swa_slot` and their cells."""
    cells: list[Cell] = []
    total = 0
    for full_slot in mapped_from:
        found, count = index.cells(full_slot, frame)
        cells.extend(found)
        total += count
    return SlotProvenance(
        slot=swa_slot,
        space="swa",
        cells=tuple(cells[: index.max_cells]),
        cells_total=total,
        mapped_from=mapped_from,
        allocator=_allocator_state(dump.free_swa_slots, swa_slot),
        canary=_canary_records(dump, "swa", swa_slot),
        violations=_violations(dump, swa_slot, swa=True),
    )


def full_slots_mapping_to(
    dump: KvDump, swa_slots: Iterable[int], *, limit: int = 64
) -> dict[int, tuple[int, ...]]:
    """For each SWA slot s, the full slots f with LUT[f] == s (one pass over the LUT).

    The trailing sentinel index is excluded; at most `limit` full slots are kept per SWA slot.
    """
    wanted = sorted({int(s) for s in swa_slots})
    lut = dump.full_to_swa_index_mapping
    found: dict[int, tuple[int, ...]] = dict.fromkeys(wanted, ())
    if lut is None or not wanted:
        return found
    body = lut[:-1]
    hits = torch.nonzero(torch.isin(body, torch.tensor(wanted, dtype=_I64))).reshape(-1)
    values = body[hits]
    for slot in wanted:
        found[slot] = tuple(int(x) for x in hits[values == slot][:limit])
    return found


def _allocator_state(free: torch.Tensor | None, slot: int) -> str | None:
    if free is None:
        return None
    return "free" if bool((free == slot).any()) else "in use"


def _canary_records(dump: KvDump, space: str, slot: int) -> tuple[CanaryRecord, ...]:
    records = []
    for name, buffer in sorted(dump.canary_buffers.items()):
        if not name.startswith(f"canary.{space}.") or not 0 <= slot < buffer.shape[0]:
            continue
        if buffer.shape[1] < 32:
            continue
        fields = np.frombuffer(buffer[slot, :32].numpy().tobytes(), dtype="<i8")
        records.append(
            CanaryRecord(
                buffer=name,
                token=int(fields[0]),
                position=int(fields[1]),
                prev_hash=int(fields[2]),
                real_kv_hash=int(fields[3]),
            )
        )
    return tuple(records)


def _violations(dump: KvDump, slot: int, *, swa: bool) -> tuple[ViolationRow, ...]:
    """The ring's valid rows (docs/canary.md §4) whose slot is `slot`, in that slot's space."""
    ring = dump.violation_ring
    if ring is None or dump.violation_write_index is None:
        return ()
    rows = decode_ring(ring.numpy(), dump.violation_write_index).rows
    tags = rows[:, 0]
    mine = (rows[:, 1] == slot) & (((tags >= _SWA_TAGS.start) & (tags < _SWA_TAGS.stop)) == swa)
    return tuple(
        ViolationRow(index=int(i), fields=tuple(int(x) for x in rows[i]))
        for i in np.flatnonzero(mine)  # the slot's rows only
    )
