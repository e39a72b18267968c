"""The in-process audit: SGLang's live objects read each step and held to the exact accounting
a correct state keeps; the whole `check` runs only where that accounting breaks.

Why this is sound (a state passed here is one `check` passes too): `check`'s error findings
are each the breach of a bookkeeping fact about the recorded state, and every fact below is
that fact or a stricter one, read from the same objects the dump would record:

- slot spaces (full, SWA) and the request pool's rows are each *exactly* partitioned: free,
  or held (full: the tree, or a running request's row up to its allocated length; SWA: the
  LUT's image; rows: a running request), nothing twice, nothing outside the domain the pools
  had when built, page 0 never (leaks, double frees, free-and-held, reserved slots, slots out
  of range, duplicate free entries: all breaches of the partition);
- a full slot in two rows is the tree's and at the same position in both (shared without a
  prefix, shared across positions, duplicates in a row); a locked tree slot lies in a running
  row, none at idle (lock leaks);
- the LUT keeps its built length and tail, maps a free or tombstoned slot and page 0 to 0,
  every other held full slot to an SWA slot of its own, a page to a page in lockstep (stale
  mappings, collisions, shared owners, lockstep, free-and-mapped, sentinel, length);
- the batch: rows running and distinct, lengths inside the row's allocation, `out_cache_loc`
  exactly the row's cells it extends, none of them the tree's, every cell of the window the
  step reads mapped (writes to live slots, unmapped window cells, corrupt metadata); the plan
  and its kernel limits are functions of these lengths and the window, and `check` has passed
  them once per history for a batch at least as long (`_planned`), else it runs.

Each fact is checked on the whole state every audit, not only where the step changed it: on
pools of soak's size the whole is a few dozen numpy calls, and a narrower read could miss a
write a faulty SGLang makes where it should not (the faults soak looks for). Where a fact does
not hold the audit falls back to the whole `check` on a recorded dump, so its findings are
`check`'s own; a fact stricter than `check` costs only that fallback (counted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvcanary_cli.capture.tree import batch_state, tree_state

__all__ = ["LiveAudit", "LiveState"]


@dataclass
class LiveState:
    """What one audit reads from the objects (host int64 arrays)."""

    table: np.ndarray
    lut: np.ndarray | None
    free_full: np.ndarray
    free_swa: np.ndarray | None
    tree: np.ndarray
    resident: np.ndarray | None
    locked: np.ndarray | None
    alloc_lens: np.ndarray
    running_rows: np.ndarray
    free_rows: np.ndarray
    batch: dict[str, Any] | None
    #: the Mamba layout's records by their dump names (None: another layout)
    mamba: dict[str, np.ndarray] | None = None


def read_state(scheduler: Any, batch: Any, requests: list[Any]) -> LiveState:
    """The live state, read by the capture code's own readers."""
    stack = scheduler.stack
    pool = stack.req_to_token_pool
    table = pool.req_to_token.numpy()
    facts = tree_state(
        allocator=stack.allocator,
        tree=stack.tree,
        requests=requests,
        rows=table.shape[0],
        req_pool=pool,
        waiting=scheduler.waiting,
    )
    lut = getattr(stack.allocator, "full_to_swa_index_mapping", None)
    empty = np.zeros(0, dtype=np.int64)
    return LiveState(
        table=table,
        lut=None if lut is None else lut.numpy(),
        free_full=facts.get("free_full_slots", empty),
        free_swa=facts.get("free_swa_slots"),
        tree=facts.get("tree_full_slots", empty),
        resident=facts.get("tree_swa_resident_slots"),
        locked=facts.get("tree_locked_full_slots"),
        alloc_lens=facts.get("req_pool_allocated_lens", np.zeros(table.shape[0], np.int64)),
        running_rows=facts.get("running_req_rows", empty),
        free_rows=np.asarray(pool.free_slots, dtype=np.int64),
        batch=None if batch is None else batch_state(batch),
        mamba=None
        if "free_mamba_slots" not in facts
        else {k: facts[k] for k in _MAMBA if k in facts},
    )


#: The Mamba layout's records the audit reads.
_MAMBA = (
    "free_mamba_slots",
    "tree_mamba_slots",
    "req_mamba_slots",
    "req_mamba_rows",
    "req_index_to_mamba_index_mapping",
)


class LiveAudit:
    """The accounting of one history's stack (see the module docstring); `broken` names the
    first fact a state breaks (None: every fact holds, `check` would find nothing)."""

    def __init__(self, scheduler: Any) -> None:
        stack = scheduler.stack
        self.page = int(stack.spec.page_size)
        self.window = int(stack.spec.window)
        first = read_state(scheduler, None, [])
        # the domains the pools had when built (everything free), as masks
        self.full_n = int(first.free_full.max(initial=0)) + 1
        self.full_domain = _mask(first.free_full, self.full_n)
        self.swa_n = 0 if first.free_swa is None else int(first.free_swa.max(initial=0)) + 1
        self.swa_n += -self.swa_n % self.page  # whole pages
        self.swa_domain = None if first.free_swa is None else _mask(first.free_swa, self.swa_n)
        self.rows_n = int(first.table.shape[0])
        self.row_domain = _mask(first.free_rows, self.rows_n)
        #: the LUT as built: its length and what lies past the full slots never change
        self.lut_tail = None if first.lut is None else first.lut[self.full_n :].copy()
        #: the Mamba slots as built (1..size; slot 0 reserved)
        mamba_free = None if first.mamba is None else first.mamba["free_mamba_slots"]
        self.mamba_n = 0 if mamba_free is None else int(mamba_free.max(initial=0)) + 1
        self.mamba_domain = None if mamba_free is None else _mask(mamba_free, self.mamba_n)
        self.fallbacks = 0
        #: per audit: the running rows' cells and how often each full slot is one
        self._cells: np.ndarray = first.free_full[:0]
        self._cell_count: np.ndarray = first.free_full[:0]
        self._tree: np.ndarray = first.free_full[:0]

    def broken(self, state: LiveState, *, idle: bool) -> str | None:
        """The first fact `state` breaks, or None (in this order: each rule may rely on the
        facts before it; a state the rules cannot even read breaks them all)."""
        try:
            rules = (self._rows, self._full, self._swa, self._mamba, self._locks, self._batch)
            for rule in rules:
                why = rule(state, idle)
                if why is not None:
                    return why
        except (IndexError, ValueError, TypeError) as exc:  # lengths or ids out of range
            return f"unreadable ({type(exc).__name__})"
        return None

    # -- the facts ------------------------------------------------------------------

    def _rows(self, s: LiveState, idle: bool) -> str | None:
        free, held = _counts(s.free_rows, self.rows_n), _counts(s.running_rows, self.rows_n)
        if free is None or held is None or not np.array_equal(free + held, self.row_domain):
            return "pool rows not partitioned"
        return None

    def _full(self, s: LiveState, idle: bool) -> str | None:
        n, ps = self.full_n, self.page
        rows = s.running_rows
        lens = s.alloc_lens[rows]
        width = s.table.shape[1]
        if np.any(lens > width) or np.any(lens < 0):
            return "an allocation beyond its row"
        positions = np.arange(width)
        inside = positions[None, :] < lens[:, None]
        table = s.table[rows]
        cells = table[inside].astype(np.int64)
        free, tree = _counts(s.free_full, n), _counts(s.tree, n)
        cell_count = _counts(cells, n)
        if free is None or tree is None or cell_count is None:
            return "a full slot out of range"
        if free.max(initial=0) > 1 or tree.max(initial=0) > 1:
            return "a full slot listed twice"
        private = (cell_count > 0) & (tree == 0)
        if np.any(cell_count[private] > 1):
            return "a slot in two rows the tree does not hold"
        owners = free + tree + private
        if ps > 1:
            # the rest of a row's last page, past its allocated length: held, unwritten
            part = (lens > 0) & (lens % ps != 0)
            last = table[part, lens[part] - 1].astype(np.int64)
            offsets = np.arange(ps)
            rest = (last - last % ps)[:, None] + offsets[None, :]
            tails = _counts(rest[offsets[None, :] >= (lens[part] % ps)[:, None]], n)
            if tails is None:
                return "a full slot out of range"
            owners += tails
        if not np.array_equal(owners, self.full_domain):
            return "full slots not partitioned"
        # a slot in two rows (or twice in one) is at one position
        where = np.zeros(n, dtype=np.int64)
        spots = np.broadcast_to(positions, table.shape)[inside]
        where[cells] = spots
        if not np.array_equal(where[cells], spots):
            return "a shared slot at two positions"
        self._cells, self._cell_count, self._tree = cells, cell_count, tree
        return None

    def _swa(self, s: LiveState, idle: bool) -> str | None:
        lut = s.lut
        if lut is None or self.lut_tail is None or self.swa_domain is None:
            return None if lut is None else "no SWA accounting"
        n, ps = self.full_n, self.page
        if lut.shape[0] != n + self.lut_tail.shape[0] or not np.array_equal(lut[n:], self.lut_tail):
            return "the LUT's length or tail changed"
        body = lut[:n]
        if np.any(body[:ps] != 0):
            return "page 0 mapped"
        free = _counts(s.free_swa, self.swa_n) if s.free_swa is not None else None
        if free is None or free.max(initial=0) > 1:
            return "an SWA slot listed twice or out of range"
        if np.any(body[s.free_full] != 0):
            return "a free full slot mapped"
        mapped = np.flatnonzero(body)
        image = body[mapped].astype(np.int64)
        held = _counts(image, self.swa_n)
        if held is None or held.max(initial=0) > 1:
            return "an SWA slot mapped twice"
        if ps > 1:
            # a full page maps into one SWA page, slot for slot (its unwritten rest
            # unmapped), and that SWA page is held whole, by that full page alone
            if np.any(image % ps != mapped % ps):
                return "a page mapped out of lockstep"
            page_of = np.full(n // ps + 1, -1, dtype=np.int64)
            page_of[mapped // ps] = image // ps
            if not np.array_equal(page_of[mapped // ps], image // ps):
                return "a page mapped out of lockstep"
            pages = np.bincount(page_of[page_of >= 0], minlength=self.swa_n // ps)
            if pages.max(initial=0) > 1:
                return "an SWA page mapped from two full pages"
            held = np.repeat(pages, ps)
        if held.shape != free.shape or not np.array_equal(held + free, self.swa_domain):
            return "SWA slots not partitioned"
        if s.resident is not None:
            resident = _counts(s.resident, n)
            if resident is None or np.any(resident > self._tree):
                return "an SWA-resident slot outside the tree"
            if np.any((resident > 0) != ((self._tree > 0) & (body != 0))):
                return "a tree slot's SWA residence and its mapping disagree"
        return None

    def _mamba(self, s: LiveState, idle: bool) -> str | None:
        """Mamba slots exactly partitioned (free, a tree node's, a live request's; slot 0
        never), and each live request's row mapped to its own slot."""
        m, domain = s.mamba, self.mamba_domain
        if m is None or domain is None:
            return None if m is None and domain is None else "no Mamba accounting"
        slots, rows = m.get("req_mamba_slots"), m.get("req_mamba_rows")
        if slots is None or rows is None or "tree_mamba_slots" not in m:
            return "no Mamba accounting"
        n = self.mamba_n
        counts = [_counts(m["free_mamba_slots"], n), _counts(m["tree_mamba_slots"], n)]
        counts.append(_counts(slots, n))
        if any(c is None for c in counts):
            return "a Mamba slot out of range"
        owners = sum(c for c in counts if c is not None)
        if not np.array_equal(owners, domain):
            return "Mamba slots not partitioned"
        live = rows > 0
        if np.any(m["req_index_to_mamba_index_mapping"][rows[live]] != slots[live]):
            return "a row mapped to another Mamba slot"
        return None

    def _locks(self, s: LiveState, idle: bool) -> str | None:
        locked = s.locked
        if locked is None:
            return "no lock record"
        if not locked.size:
            return None
        if idle:
            return "a lock at idle"
        if locked.min() < 0 or locked.max() >= self.full_n:
            return "a locked slot out of range"
        if np.any(self._cell_count[locked] == 0):
            return "a locked slot in no running row"
        return None

    def _batch(self, s: LiveState, idle: bool) -> str | None:
        b = s.batch
        if b is None:
            return None
        rpi, prefix, extend = b["req_pool_indices"], b["prefix_lens"], b["extend_seq_lens"]
        rows = _counts(rpi, self.rows_n)
        if rows is None or rows.max(initial=0) > 1:
            return "a batch row twice or out of range"
        running = _counts(s.running_rows, self.rows_n)  # inside: `_rows` read them
        if running is None or np.any(rows > running):
            return "a batch row not running"
        if np.any(prefix < 0) or np.any(extend < 1):
            return "a negative length"
        end = prefix + extend
        if np.any(end > s.alloc_lens[rpi]):
            return "a batch row beyond its allocation"
        width = s.table.shape[1]
        pos = np.arange(width)
        writes = (pos[None, :] >= prefix[:, None]) & (pos[None, :] < end[:, None])
        table = s.table[rpi]
        expected = table[writes].astype(np.int64)
        out = b.get("out_cache_loc")
        if out is None or not np.array_equal(out, expected):
            return "out_cache_loc not the extended cells"
        if np.any(self._tree[expected] != 0):
            return "a write into the tree"
        lut = s.lut
        if lut is not None and self.window > 0:
            # the cells the plan verifies ([P - W, P), `window_start`) and the writes: mapped
            start = np.maximum(prefix - self.window, 0)
            window = (pos[None, :] >= start[:, None]) & (pos[None, :] < end[:, None])
            if np.any(lut[table[window]] == 0):
                return "a window cell unmapped"
        return None


def _counts(values: np.ndarray, n: int) -> np.ndarray | None:
    """How often each of `0..n-1` is in `values` (None: one is outside)."""
    if values.size and (values.min() < 0 or values.max() >= n):
        return None
    return np.bincount(values.astype(np.int64, copy=False), minlength=n)


def _mask(values: np.ndarray, n: int) -> np.ndarray:
    """`values` (distinct, inside `0..n-1`) as 0/1 counts."""
    counts = _counts(values, n)
    assert counts is not None
    return counts
