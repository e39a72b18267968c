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


def read_state(scheduler: Any, batch: Any, requests: list[Any]) -> LiveState:
    """The live state, read by the capture code's own readers."""
    stack = scheduler.stack
    pool = stack.req_to_token_pool
    table = pool.req_to_token.numpy()
    facts = tree_state(
        allocator=stack.allocator, tree=stack.tree, requests=requests, rows=table.shape[0]
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
    )


class LiveAudit:
    """The accounting of one history's stack (see the module docstring); `broken` names the
    first fact a state breaks (None: every fact holds, `check` would find nothing)."""

    def __init__(self, scheduler: Any) -> None:
        stack = scheduler.stack
        self.page = int(stack.spec.page_size)
        self.window = int(stack.spec.window)
        first = read_state(scheduler, None, [])
        # the domains the pools had when built (everything free)
        self.full_domain = np.unique(first.free_full)
        self.swa_domain = None if first.free_swa is None else np.unique(first.free_swa)
        self.row_domain = np.unique(first.free_rows)
        #: the LUT as built: its length and what lies past the full slots never change
        self.lut_tail = None if first.lut is None else first.lut.copy()
        self.fallbacks = 0
        #: the running rows' cells (slot, row, position), read by `_full` for `_locks`
        self._running: tuple[np.ndarray, np.ndarray, np.ndarray] = (first.tree,) * 3

    def broken(self, state: LiveState, *, idle: bool) -> str | None:
        """The first fact `state` breaks, or None (in this order: each rule may rely on the
        facts before it; a state the rules cannot even read breaks them all)."""
        try:
            for rule in (self._rows, self._full, self._swa, self._locks, self._batch):
                why = rule(state, idle)
                if why is not None:
                    return why
        except (IndexError, ValueError, TypeError) as exc:  # lengths or ids out of range
            return f"unreadable ({type(exc).__name__})"
        return None

    # -- the facts ------------------------------------------------------------------

    def _rows(self, s: LiveState, idle: bool) -> str | None:
        rows = np.concatenate([s.free_rows, s.running_rows])
        if rows.size != np.unique(rows).size:
            return "a pool row free or held twice"
        if not np.array_equal(np.sort(rows), self.row_domain):
            return "pool rows not partitioned"
        return None

    def _cells(self, s: LiveState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every running row's allocated cells: (slot, row, position)."""
        rows = s.running_rows
        lens = s.alloc_lens[rows]
        width = s.table.shape[1]
        if lens.size and (lens.max() > width or lens.min() < 0):
            lens = np.clip(lens, 0, width)
        pos = np.arange(width)
        mask = pos[None, :] < lens[:, None]
        cells = s.table[rows][mask].astype(np.int64)
        which = np.broadcast_to(rows[:, None], mask.shape)[mask]
        where = np.broadcast_to(pos[None, :], mask.shape)[mask]
        return cells, which, where

    def _page_tails(self, s: LiveState) -> np.ndarray:
        """The rest of each running row's last page past its allocated length (pages are
        handed out whole: the row holds them, unwritten)."""
        ps = self.page
        if ps == 1:
            return np.zeros(0, dtype=np.int64)
        rows = s.running_rows
        lens = s.alloc_lens[rows]
        part = (lens > 0) & (lens % ps != 0)
        last = s.table[rows[part], lens[part] - 1].astype(np.int64)
        rest = lens[part] % ps  # slots of the last page in use
        offsets = np.arange(ps)
        slots = (last - last % ps)[:, None] + offsets[None, :]
        tails: np.ndarray = slots[offsets[None, :] >= rest[:, None]]
        return tails

    def _full(self, s: LiveState, idle: bool) -> str | None:
        if s.alloc_lens[s.running_rows].max(initial=0) > s.table.shape[1]:
            return "an allocation beyond its row"
        free, tree = s.free_full, s.tree
        if free.size != np.unique(free).size or tree.size != np.unique(tree).size:
            return "a full slot listed twice"
        if self.page > 1 and free.size % self.page:
            return "a partial page free"
        cells, rows, positions = self._running = self._cells(s)
        slots, counts = np.unique(cells, return_counts=True)
        held = np.union1d(tree, slots)
        tails = self._page_tails(s)
        if np.intersect1d(tails, held).size or tails.size != np.unique(tails).size:
            return "a page's rest held twice"
        held = np.union1d(held, tails)
        if np.intersect1d(free, held).size:
            return "a full slot free and held"
        if not np.array_equal(np.union1d(free, held), self.full_domain):
            return "full slots not partitioned"
        if held.size + free.size != self.full_domain.size:
            return "full slots not partitioned"
        shared = slots[counts > 1]
        if shared.size:
            if np.setdiff1d(shared, tree).size:
                return "a slot in two rows the tree does not hold"
            # the same position in every row
            order = np.argsort(cells, kind="stable")
            sorted_cells, sorted_pos = cells[order], positions[order]
            same = sorted_cells[1:] == sorted_cells[:-1]
            if np.any(same & (sorted_pos[1:] != sorted_pos[:-1])):
                return "a shared slot at two positions"
            sorted_rows = rows[order]
            if np.any(same & (sorted_rows[1:] == sorted_rows[:-1])):
                return "a slot twice in one row"
        return None

    def _swa(self, s: LiveState, idle: bool) -> str | None:
        lut = s.lut
        if lut is None or self.lut_tail is None or self.swa_domain is None:
            return None if lut is None else "no SWA accounting"
        if lut.shape != self.lut_tail.shape:
            return "the LUT changed length"
        n = self.full_domain[-1] + 1 if self.full_domain.size else 0
        if not np.array_equal(lut[n:], self.lut_tail[n:]):
            return "the LUT's tail changed"
        body = lut[:n]
        if np.any(body[: self.page] != 0):
            return "page 0 mapped"
        free_swa = s.free_swa
        if free_swa is None or free_swa.size != np.unique(free_swa).size:
            return "an SWA slot listed twice"
        if np.any(body[s.free_full] != 0):
            return "a free full slot mapped"
        mapped = np.flatnonzero(body)
        image = body[mapped]
        if image.size != np.unique(image).size:
            return "an SWA slot mapped twice"
        ps = self.page
        if ps > 1:
            # a full page maps into one SWA page, slot for slot (its unwritten rest unmapped),
            # and that SWA page is held whole
            if np.any(image % ps != mapped % ps):
                return "a page mapped out of lockstep"
            pages = mapped // ps
            order = np.argsort(pages, kind="stable")
            same = pages[order][1:] == pages[order][:-1]
            if np.any(same & (image[order][1:] // ps != image[order][:-1] // ps)):
                return "a page mapped out of lockstep"
            swa_pages = np.unique(image // ps)
            if swa_pages.size != np.unique(pages).size:
                return "an SWA page mapped from two full pages"
            image = (swa_pages[:, None] * ps + np.arange(ps)).reshape(-1)
        if np.intersect1d(image, free_swa).size:
            return "an SWA slot free and mapped"
        if image.size + free_swa.size != self.swa_domain.size or not np.array_equal(
            np.union1d(image, free_swa), self.swa_domain
        ):
            return "SWA slots not partitioned"
        if s.resident is not None:
            resident = np.unique(s.resident)
            if np.setdiff1d(resident, s.tree).size:
                return "an SWA-resident slot outside the tree"
            if np.any(body[resident] == 0):
                return "an SWA-resident slot unmapped"
            tomb = np.setdiff1d(s.tree, resident)
            if np.any(body[tomb] != 0):
                return "a tombstoned slot mapped"
        return None

    def _locks(self, s: LiveState, idle: bool) -> str | None:
        locked = s.locked
        if locked is None:
            return "no lock record"
        if not locked.size:
            return None
        if idle:
            return "a lock at idle"
        cells = self._running[0]
        if np.setdiff1d(locked, cells).size:
            return "a locked slot in no running row"
        return None

    def _batch(self, s: LiveState, idle: bool) -> str | None:
        b = s.batch
        if b is None:
            return None
        rpi, prefix, extend = b["req_pool_indices"], b["prefix_lens"], b["extend_seq_lens"]
        if rpi.size != np.unique(rpi).size:
            return "a row twice in the batch"
        if np.setdiff1d(rpi, s.running_rows).size:
            return "a batch row not running"
        if np.any(prefix < 0) or np.any(extend < 1):
            return "a negative length"
        end = prefix + extend
        if np.any(end > s.alloc_lens[rpi]):
            return "a batch row beyond its allocation"
        width = s.table.shape[1]
        pos = np.arange(width)
        writes = (pos[None, :] >= prefix[:, None]) & (pos[None, :] < end[:, None])
        rows = s.table[rpi]
        expected = rows[writes].astype(np.int64)
        out = b.get("out_cache_loc")
        if out is None or not np.array_equal(out, expected):
            return "out_cache_loc not the extended cells"
        if np.intersect1d(expected, s.tree).size:
            return "a write into the tree"
        lut = s.lut
        if lut is not None and self.window > 0:
            # the cells the plan verifies ([P - W, P), `window_start`) and the writes: mapped
            start = np.maximum(prefix - self.window, 0)
            window = (pos[None, :] >= start[:, None]) & (pos[None, :] < end[:, None])
            if np.any(lut[rows[window]] == 0):
                return "a window cell unmapped"
        return None
