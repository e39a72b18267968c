"""A finding's owners: for each slot its provenance lists, the current or last owner (pool
row, position, what the request is), so that a report names who held a double-freed or stale
slot without a second command (`provenance`).

Read from the provenance the check already attaches (its cells are ordered live first, then
stale tails, then idle pool rows): the owners of a finding are as many as its provenance's
slots (a few), whatever its cell count. An idle pool row is told apart by the dump's request
row lists where it has them: free (its request finished) or held by a running request outside
the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvcanary_cli.analysis.req_rows import pool_rows
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.results.cells import FindingOwner, OwnerState, Role, SlotProvenance

__all__ = ["RowStates", "slot_owners"]


class RowStates:
    """What the dump's request row lists say of an idle pool row (sorted arrays, built once
    per dump: as long as the pool has rows)."""

    def __init__(self, dump: KvDump) -> None:
        rows = int(dump.req_to_token.shape[0])
        self.free = np.unique(pool_rows(dump.free_req_rows, rows))
        self.running = np.unique(pool_rows(dump.running_req_rows, rows))

    def idle(self, pool_row: int) -> OwnerState:
        """`finished` (on the free list), `held` (a running request's), else `idle`."""
        if _has(self.free, pool_row):
            return "finished"
        if _has(self.running, pool_row):
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
