"""The findings at one full slot, without checking the whole batch (`provenance --slot`).

Every symptom at a slot's cells depends only on the batch rows that hold the slot or a full
slot sharing its SWA slot: a repeat within a row, the same slot at other positions, a
free-list entry, a LUT read past its end, a canary record, an SWA collision. So
`focused_findings` checks a view of the dump whose other batch rows are padding, and keeps the
findings touching the slot; the rows holding those slots come from the one scan of the table
that also answers the query (`focused_index`). Writes through `out_cache_loc` are the
exception: the whole batch's rows lay that tensor out, so they are read against the whole
dump. The result is the findings `check` reports there (tests/analysis/test_focus.py compares
them on every synth scenario), at a fraction of the work on a production batch.

What it does not give is what needs the whole batch: the diagnosis (a cause weighs evidence
from every row) and where SGLang's reference raises first (an earlier row may raise). Those
fields are left empty (`cause` None, `first_raise` False); `check` has them. When the whole
batch decides more than that (a group with more verify entries than the table can supply, a
verify-capacity overflow, a pool row outside the table), the whole dump is checked instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from kvcanary_cli.analysis.cells import holding
from kvcanary_cli.analysis.check import attach_provenance, collect_findings
from kvcanary_cli.analysis.findings import write_findings
from kvcanary_cli.analysis.provenance import (
    LiveCells,
    ProvenanceIndex,
    SlotSet,
    full_slots_mapping_to,
    live_cells,
)
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.planners.base import Planner
from kvcanary_cli.planners.frame import group_frame
from kvcanary_cli.planners.host_parallel import usable_cores
from kvcanary_cli.results.cells import Space
from kvcanary_cli.results.check import Finding

__all__ = ["focused_findings", "focused_index", "related_slots", "swa_peer", "touching_part"]


def related_slots(dump: KvDump, slot: int) -> tuple[int, ...]:
    """`slot` and the full slots sharing its SWA slot (their collisions name it)."""
    lut = dump.full_to_swa_index_mapping
    if lut is None or not 0 <= slot < int(lut.shape[0]) - 1:
        return (slot,)
    swa = lut.element(slot)
    if swa <= 0:
        return (slot,)
    return tuple(sorted({slot, *full_slots_mapping_to(dump, [swa])[swa]}))


def focused_index(dump: KvDump, slot: int, *, max_cells: int = 16) -> ProvenanceIndex:
    """One scan of the table for `slot` and its related slots, keeping their live cells:
    what `focused_findings` checks and what `provenance --slot` shows, from the same pass
    (on every core this process may use, up to `_SCAN_THREADS`: nothing else runs then)."""
    return ProvenanceIndex(
        dump,
        related_slots(dump, slot),
        max_cells=max_cells,
        live=True,
        threads=min(usable_cores(), _SCAN_THREADS),
    )


#: Threads that scan the table for `provenance --slot` (measured on 2 cores: 2x faster).
_SCAN_THREADS = 4


def focused_findings(
    dump: KvDump, slot: int, *, planner: Planner, index: ProvenanceIndex | None = None
) -> list[Finding]:
    """The findings `check --kernel none` reports that touch full slot `slot` (its cells,
    and SWA findings naming it), with their provenance, before the diagnosis: no cause and
    no first-raise mark. `index` (from `focused_index`) saves a scan of the table."""
    related = related_slots(dump, slot)
    if _needs_whole_batch(dump, related):
        found = collect_findings(dump, planner=planner, kernel=None).findings
    else:
        if index is None or not index.slots.issuperset(related):
            index = focused_index(dump, slot)
        # slot 0 is padding: a shrunk dump's unknown cells read as 0 but are not scanned
        cells = live_cells(dump) if 0 in related else index.live_cells()
        view = _rows_holding(dump, cells, related)
        del cells  # the view's live cells hold them all again (one slot may be every cell's)
        # the findings only: no verify entry is held unless a canary replay reads it
        collected = collect_findings(view, planner=planner, kernel=None, keep_entries=False)
        found = [f for f in collected.findings if f.code is not FindingCode.WRITE_TO_LIVE_SLOT]
        # out_cache_loc is laid out by the whole batch's rows: its writes are read there. Only
        # writes of the related slots can touch `slot`, and the view's live cells holding them
        # are every live cell of them (the rows holding them are the view's rows).
        assert collected.cells is not None  # kept: `collect_findings`'s default
        found += write_findings(dump, _holding_slots(collected.cells, related))
        del collected
    peer = swa_peer(dump, slot)
    touching = [part for f in found if (part := touching_part(f, slot, peer)) is not None]
    # provenance from the whole dump: a masked row's stale tail is still a stale tail
    return sorted(attach_provenance(dump, touching, index=index), key=Finding.order_key)


def swa_peer(dump: KvDump, slot: int) -> int | None:
    """LUT[slot], the SWA slot full slot `slot` reaches (None: no LUT, out of range, or
    unmapped)."""
    lut = dump.full_to_swa_index_mapping
    if lut is None or not 0 < slot < int(lut.shape[0]) - 1:
        return None
    peer = lut.element(slot)
    return peer if peer > 0 else None


def touching_part(finding: Finding, slot: int, peer: int | None) -> Finding | None:
    """The part of a finding at cells of full slot `slot`, or for an SWA-space finding at
    its SWA peer `peer` (without one: the cells whose full slot is `slot`); None: no part."""
    if finding.slot is None:
        return None
    if finding.space is Space.FULL:
        return holding(finding, np.array([slot], dtype=np.int64))
    if peer is not None:
        return holding(finding, np.array([peer], dtype=np.int64))
    return holding(finding, np.array([slot], dtype=np.int64), via_full_slot=True)


def _needs_whole_batch(dump: KvDump, related: tuple[int, ...]) -> bool:
    """Whether rows other than those holding the slots can change the findings at them: a
    group decided by the whole batch (overflow, more entries than the table supplies), a pool
    row outside the table (REF wraps a negative one onto another row), or more full slots
    sharing the SWA slot than `related_slots` lists."""
    rpi = dump.req_pool_indices
    outside = bool(((rpi != 0) & ((rpi < 0) | (rpi >= dump.max_reqs))).any())
    return (
        outside
        or len(related) >= _RELATED_LIMIT
        or any(
            (frame := group_frame(dump, group)).unplannable is not None or frame.overflow
            for group in dump.groups
        )
    )


#: `full_slots_mapping_to`'s limit: at this many, some sharing full slots may be missing.
_RELATED_LIMIT = 64


def _holding_slots(cells: LiveCells, slots: Iterable[int]) -> LiveCells:
    """The live `cells` holding one of `slots`, in their order (all of them: no copy)."""
    held = SlotSet(np.asarray(list(slots), dtype=np.int64)).contains(cells.held("slot"))
    if held.all():
        return cells
    return LiveCells(
        slot=cells.column("slot").take(held),
        batch_row=cells.column("batch_row").take(held),
        pool_row=cells.column("pool_row").take(held),
        position=cells.column("position").take(held),
        pending=cells.pending[held],
    )


def _rows_holding(dump: KvDump, cells: LiveCells, slots: Iterable[int]) -> KvDump:
    """`dump` with every batch row that does not hold one of `slots` in its live `cells`
    made padding (`req_pool_indices` 0): planners and detectors skip padding rows."""
    wanted = SlotSet(np.asarray(list(slots), dtype=np.int64))
    held = cells.held("pool_row")[wanted.contains(cells.held("slot"))]
    rpi = dump.req_pool_indices
    keep = np.isin(rpi, held) & (rpi != 0)
    masked = dump.req_pool_indices.copy()
    masked[~keep] = 0
    return replace(dump, req_pool_indices=masked)
