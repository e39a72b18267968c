"""The radix tree's locks: a locked node is a running request's matched prefix, or a
streaming session's, which keeps its prefix locked between turns, so every full slot of a
locked node (`tree_locked_full_slots`) lies in some held row of `req_to_token` (the running
rows, sessions' included: `running_req_rows`), up to its allocated length; at idle only a
session's prefix is locked.

A lock never released (a finish or retraction path that skips `dec_lock_ref`) leaves its
nodes locked after the request is gone: they can never be evicted, and SGLang's memory
check counts them as protected, not leaked. The dump must record the running requests
(`running_req_rows`, with the batch's rows): without them no lock is called stray. A row
whose allocated length is not recorded counts whole (a lock there is given the benefit of
the doubt). One sort over the locked slots, and the running rows' cells read a few million
at a time.
"""

from __future__ import annotations

from typing import cast

import numpy as np

from kvcanary_cli.analysis.cells import distinct
from kvcanary_cli.analysis.req_rows import held_rows
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.results.check import Finding, JsonValue

__all__ = ["tree_lock_findings"]

#: Slots a finding names in its details (a sample, with the total).
_SLOTS_SHOWN = 16
#: `req_to_token` cells read at a time (a production row is 131 k cells wide, a thousand
#: running rows half a gigabyte).
_CELLS_AT_ONCE = 1 << 22


def tree_lock_findings(dump: KvDump) -> list[Finding]:
    """Locked tree slots in no running request's row (all of them, at idle)."""
    locked, running = dump.tree_locked_full_slots, dump.running_req_rows
    if locked is None or running is None:
        return []
    table = dump.req_to_token
    width = int(table.shape[1])
    held = held_rows(dump)
    lens = np.full(held.size, width, dtype=np.int64)
    recorded = dump.req_pool_allocated_lens
    if recorded is not None:
        known = np.asarray(recorded, dtype=np.int64).reshape(-1)
        at = held[held < known.size]
        lens[: at.size] = np.where(known[at] > 0, np.minimum(known[at], width), width)
    pieces = [np.zeros(0, dtype=np.int64)]
    step = max(1, _CELLS_AT_ONCE // max(width, 1))
    for start in range(0, held.size, step):  # the rows a piece at a time: memory stays flat
        values, _ = table.rows(held[start : start + step])  # a cell not kept reads 0: no slot
        within = np.arange(width)[None, :] < lens[start : start + step, None]
        pieces.append(distinct(values[within].astype(np.int64)))
    inside = distinct(np.concatenate(pieces))
    slots = distinct(np.asarray(locked, dtype=np.int64).reshape(-1))
    stray = np.setdiff1d(slots[slots > 0], inside, assume_unique=True)
    if not stray.size:
        return []
    first = int(stray[0])
    where = (
        "yet no request runs"
        if not held.size
        else "yet no running request's pool row holds it"
        if stray.size == 1
        else "yet no running request's pool row holds them"
    )
    one = f"slot {first} of the radix tree is locked, {where}: a lock never released"
    many = f"{stray.size} slots of the radix tree are locked, {where}: a lock never released"
    return [
        Finding(
            code=FindingCode.TREE_LOCK_LEAKED,
            group=Group.FULL,
            slot=first,
            message=one if stray.size == 1 else many,
            details=cast(
                dict[str, JsonValue],
                {
                    "slots": [int(s) for s in stray[:_SLOTS_SHOWN]],
                    "slots_total": int(stray.size),
                    "running_rows": int(held.size),
                },
            ),
        )
    ]
