"""Seeded random serving histories over SGLang's real allocators, and dumps of their states.

A history drives the allocator the way SGLang's scheduler does (srt/managers/schedule_batch.py,
srt/mem_cache/common.py and allocation.py in the 0.5.23 wheel): extend steps start requests
and continue chunked ones, decode steps add one token to every running request, out-of-window
SWA is freed by whole pages before a step allocates (`free_swa_out_of_window_slots`, in one free
group), and a finished request gives back its row the way `release_kv_cache` does (the
SWA-evicted range full-side only, the rest both sides, the tree-held prefix not at all). With a
radix cache, a new request may reuse the first pages of a cached prefix: a live request's row
checkpointed into the tree, or a finished one's. The tree frees what no running request reads:
a node's SWA side alone (a tombstone) or the whole node.

The bookkeeping (the LUT, free lists, pages, free groups) is SGLang's own; this module keeps only
what the scheduler keeps: `req_to_token`, each request's length, protected prefix and SWA
eviction cursor, and the tree's prefixes. `HistoryDump` is the state at one forward step, after
the step's allocation, as the kv canary's plan sees it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvcanary_cli.dump.writer import dump_contents, write_dump
from tests.sglang_allocator import SGLangAllocators

__all__ = ["HistoryDump", "HistorySpec", "run_history", "run_history_states"]


@dataclass(frozen=True, kw_only=True)
class HistorySpec:
    """The shape of one history; the seed decides everything else."""

    page_size: int
    #: SWA window; 0: a full-only model (plain token or paged allocator, no LUT).
    window: int
    #: prefix sharing through a radix tree; False: no cache (SGLang then evicts SWA up to
    #: the window exactly, also in extend steps).
    radix: bool
    steps: int = 60
    max_reqs: int = 9
    max_seq_len: int = 64
    #: full-pool tokens (`size`); the SWA pool gets `swa_tokens`.
    full_tokens: int = 320
    swa_tokens: int = 192


@dataclass(kw_only=True)
class HistoryDump:
    """One forward step's state, ready to save, and where its live cells are."""

    spec: HistorySpec
    seed: int
    tensors: dict[str, np.ndarray]
    metadata: dict[str, str]
    #: (pool row, prefix length) of every active batch row: the cells the plan verifies.
    live_rows: list[tuple[int, int]] = field(default_factory=list)

    def save(self, path: Path) -> Path:
        """Write the state as a format-v1 dump."""
        return write_dump(path, dump_contents(self.metadata, self.tensors))


@dataclass(kw_only=True)
class _Request:
    row: int
    #: tokens in the KV cache (row positions [0, length) are the request's).
    length: int
    #: `cache_protected_len`: the prefix the tree holds; never this request's to free.
    protected: int = 0
    #: the SWA eviction cursor: positions [protected, evicted) have no SWA side any more.
    evicted: int = 0


def _ints(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _ceil_align(value: int, unit: int) -> int:
    return -(-value // unit) * unit


class _History:
    """The scheduler's side of one history (see the module docstring)."""

    def __init__(self, classes: SGLangAllocators, spec: HistorySpec, seed: int) -> None:
        self.spec = spec
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.ps = spec.page_size
        self.swa = spec.window > 0
        need_sort = bool(self.rng.integers(2))
        self.interval = int(self.rng.choice([1, 1, 2, 5]))
        self.allocator: Any
        if self.swa:
            self.allocator = classes.swa(
                spec.full_tokens,
                spec.swa_tokens,
                self.ps,
                torch.int64,
                "cpu",
                classes.swa_pool(),
                need_sort,
            )
        elif self.ps == 1:
            self.allocator = classes.token(spec.full_tokens, torch.int64, "cpu", None, need_sort)
        else:
            self.allocator = classes.paged(
                spec.full_tokens, self.ps, torch.int64, "cpu", None, need_sort
            )
        self.req_to_token = torch.zeros((spec.max_reqs, spec.max_seq_len), dtype=torch.int32)
        self.free_rows = list(range(1, spec.max_reqs))
        self.running: list[_Request] = []
        #: the tree: cached prefixes (full slots, whole pages) and how many hold each page.
        self.paths: list[torch.Tensor] = []
        self.path_pages: Counter[int] = Counter()

    # -- the allocator's lists ------------------------------------------------------------

    def _full_allocator(self) -> Any:
        return self.allocator.full_attn_allocator if self.swa else self.allocator

    def _free_pages_available(self) -> int:
        return int(self.allocator.available_size()) // self.ps

    def _lut(self) -> torch.Tensor:
        return self.allocator.full_to_swa_index_mapping  # type: ignore[no-any-return]

    # -- frees --------------------------------------------------------------------------------

    def _free_row_range(self, req: _Request, start: int, end: int) -> None:
        """`free_kv_row` of [start, end): the SWA-evicted part full-side only, then the rest."""
        if end <= start:
            return
        row = self.req_to_token[req.row]
        dead_end = min(max(req.evicted, start), end)
        segment = bool(self.rng.integers(2))
        if dead_end > start:
            if segment:
                self.allocator.free_full_segment(row[start:dead_end], start_pos=start)
            else:
                self.allocator.free_full(row[start:dead_end])
        if end > dead_end:
            if segment:
                self.allocator.free_segment(row[dead_end:end], start_pos=dead_end)
            else:
                self.allocator.free(row[dead_end:end])

    def _evict_window(self, req: _Request, pre_len: int) -> None:
        """`free_swa_out_of_window_slots`: the SWA side of whole pages that left the window."""
        window = self.spec.window
        if pre_len - window < req.evicted + self.interval:
            return
        req.evicted = max(req.evicted, req.protected)
        keep = _ceil_align(max(window, self.ps), self.ps) if self.spec.radix else window
        new_evicted = max(req.evicted, pre_len - keep) // self.ps * self.ps
        if new_evicted > req.evicted:
            slots = self.req_to_token[req.row, req.evicted : new_evicted]
            if self.rng.integers(2):
                self.allocator.free_swa_segment(slots, start_pos=req.evicted)
            else:
                self.allocator.free_swa(slots)
            req.evicted = new_evicted

    def _evict_windows(self, batch: list[_Request]) -> None:
        """`maybe_evict_swa`: every request of the batch, in one free group."""
        if not self.swa:
            return
        self.allocator.free_group_begin()
        for req in batch:
            self._evict_window(req, req.length)
        self.allocator.free_group_end()

    def _checkpoint(self, req: _Request) -> None:
        """Insert the request's whole pages into the tree (it then protects them)."""
        up_to = req.length // self.ps * self.ps
        if up_to <= req.protected:
            return
        path = self.req_to_token[req.row, :up_to].to(torch.int64).clone()
        self.paths.append(path)
        self.path_pages.update((path[:: self.ps] // self.ps).tolist())
        req.protected = up_to

    def _finish(self, req: _Request) -> None:
        """`release_kv_cache`: checkpoint (or not), free the unprotected rest, free the row."""
        if self.spec.radix and self.rng.random() < 0.8:
            self._checkpoint(req)
        group = bool(self.rng.integers(2))
        if group:
            self.allocator.free_group_begin()
        self._free_row_range(req, req.protected, req.length)
        if group:
            self.allocator.free_group_end()
        self.running.remove(req)
        self.free_rows.append(req.row)

    def _running_pages(self) -> set[int]:
        pages: set[int] = set()
        for req in self.running:
            pages.update((self.req_to_token[req.row, : req.length] // self.ps).tolist())
        return pages

    def _evict_tree(self, rounds: int) -> None:
        """The tree frees pages no running request reads: tombstones (SWA side) or leaves."""
        for _ in range(rounds):
            if not self.paths:
                return
            busy = self._running_pages()
            path_index = int(self.rng.integers(len(self.paths)))
            path = self.paths[path_index]
            if self.swa and self.rng.random() < 0.4:
                self._tombstone(path, busy)
                continue
            last = path[-self.ps :]
            page = int(last[0]) // self.ps
            if self.path_pages[page] > 1 or page in busy:
                continue
            mapped = self.swa and bool(self._lut()[last[0]] != 0)
            if mapped:
                self.allocator.free(last)
            else:
                self.allocator.free_full(last)
            del self.path_pages[page]
            if len(path) == self.ps:
                del self.paths[path_index]
            else:
                self.paths[path_index] = path[: -self.ps]

    def _tombstone(self, path: torch.Tensor, busy: set[int]) -> None:
        """Free the SWA side of one unread, still mapped page of a cached prefix."""
        starts = path[:: self.ps]
        candidates = [
            int(s)
            for s in starts.tolist()
            if int(s) // self.ps not in busy and int(self._lut()[s]) != 0
        ]
        if candidates:
            start = candidates[int(self.rng.integers(len(candidates)))]
            self.allocator.free_swa(torch.arange(start, start + self.ps, dtype=torch.int64))

    # -- steps ----------------------------------------------------------------------------------

    def _shareable(self, path: torch.Tensor) -> list[int]:
        """Prefix lengths (whole pages) a new request may take from a cached prefix: with SWA,
        only those whose last window still has its SWA side (SGLang's match stops before a
        tombstone the window would read)."""
        lengths = []
        for pages in range(1, len(path) // self.ps + 1):
            length = pages * self.ps
            if self.swa:
                window = path[max(0, length - self.spec.window) : length]
                if bool((self._lut()[window] == 0).any()):
                    continue
            lengths.append(length)
        return lengths

    def _admit(self) -> tuple[_Request, int] | None:
        """A new request: its row, its shared prefix (written into the row) and its length."""
        if not self.free_rows:
            return None
        prefix = 0
        source: torch.Tensor | None = None
        if self.spec.radix and self.rng.random() < 0.6:
            if self.running and self.rng.random() < 0.5:
                donor = self.running[int(self.rng.integers(len(self.running)))]
                self._checkpoint(donor)
            if self.paths:
                source = self.paths[int(self.rng.integers(len(self.paths)))]
                lengths = self._shareable(source)
                if lengths:
                    prefix = lengths[int(self.rng.integers(len(lengths)))]
        total = prefix + int(self.rng.integers(1, 25))
        total = min(total, self.spec.max_seq_len - 1)
        if total <= prefix:
            return None
        row = self.free_rows.pop(0)
        if source is not None and prefix:
            self.req_to_token[row, :prefix] = source[:prefix].to(torch.int32)
        req = _Request(row=row, length=prefix, protected=prefix)
        return req, total

    def _pages_needed(self, prefix: list[int], seq: list[int]) -> int:
        return sum(
            math.ceil(s / self.ps) - math.ceil(p / self.ps)
            for p, s in zip(prefix, seq, strict=True)
        )

    def _allocate(self, batch: list[_Request], seq: list[int], decode: bool) -> torch.Tensor | None:
        """The step's slots (SGLang's alloc_token_slots / alloc_paged_token_slots_*), rows
        filled, or None when the pools cannot take it (nothing allocated then)."""
        prefix = [r.length for r in batch]
        extend = sum(s - p for p, s in zip(prefix, seq, strict=True))
        if self._pages_needed(prefix, seq) > self._free_pages_available():
            return None
        if self.ps == 1:
            out = self.allocator.alloc(extend)
        else:
            last_loc = _ints(
                *(
                    int(self.req_to_token[r.row, p - 1]) if p else -1
                    for r, p in zip(batch, prefix, strict=True)
                )
            )
            if decode:
                out = self.allocator.alloc_decode(_ints(*seq), _ints(*seq), last_loc)
            else:
                out = self.allocator.alloc_extend(
                    _ints(*prefix), _ints(*prefix), _ints(*seq), _ints(*seq), last_loc, extend
                )
        assert out is not None, "the allocator refused a step its available size covers"
        at = 0
        for req, p, s in zip(batch, prefix, seq, strict=True):
            self.req_to_token[req.row, p:s] = out[at : at + s - p].to(torch.int32)
            at += s - p
        return out  # type: ignore[no-any-return]

    def _make_room(self) -> None:
        """After a refused step: the tree frees what it can, else a running request ends
        (SGLang would retract it)."""
        before = self._free_pages_available()
        if self.paths:
            self._evict_tree(4)
        if self._free_pages_available() == before and self.running:
            self._finish(self.running[int(self.rng.integers(len(self.running)))])

    def step(self, dump: bool) -> HistoryDump | None:
        """One forward step (extend or decode), then finished requests and tree evictions."""
        room = [r for r in self.running if r.length < self.spec.max_seq_len]
        decode = bool(room) and self.rng.random() < 0.6
        batch: list[_Request] = []
        seq: list[int] = []
        if decode:
            batch = room
            self._evict_windows(batch)
            seq = [r.length + 1 for r in batch]
        else:
            for req in room:
                if self.rng.random() < 0.3:
                    batch.append(req)
                    seq.append(
                        min(self.spec.max_seq_len, req.length + int(self.rng.integers(1, 9)))
                    )
            if not self.spec.radix:
                self._evict_windows(batch)
            for _ in range(int(self.rng.integers(1, 4))):
                admitted = self._admit()
                if admitted is None:
                    break
                batch.append(admitted[0])
                seq.append(admitted[1])
        out = self._allocate(batch, seq, decode) if batch else None
        if out is None:
            for req in batch:
                if req not in self.running:  # admitted this step: give the row back
                    self.free_rows.append(req.row)
            self._make_room()
            return None
        for req in batch:
            if req not in self.running:
                self.running.append(req)
        result = self._dump(batch, seq, out, decode) if dump else None
        for req, s in zip(batch, seq, strict=True):
            req.length = s
        for req in list(self.running):
            if req.length >= self.spec.max_seq_len or self.rng.random() < 0.12:
                self._finish(req)
        if self.paths and self.rng.random() < 0.3:
            self._evict_tree(int(self.rng.integers(1, 4)))
        return result

    # -- the dump -------------------------------------------------------------------------------

    def _expanded(self, allocator: Any) -> np.ndarray:
        pages: np.ndarray = allocator.get_all_free_pages().to(torch.int64).numpy()
        offsets = np.arange(self.ps, dtype=np.int64)
        return (pages[:, None] * self.ps + offsets[None, :]).reshape(-1)

    def _census(self, out: torch.Tensor) -> None:
        """SGLang's strict memory check, on this state: every full page is free or held (by a
        running row, this step's writes or the tree), every SWA page free or mapped by
        exactly one full slot, never both. A state that fails it is the driver's bug."""
        held = self._running_pages() | set((out // self.ps).tolist())
        held |= set(self.path_pages)
        pages = self._full_allocator().get_all_free_pages().tolist()
        assert len(set(pages)) == len(pages), "a full page is free twice"
        assert not held & set(pages), "a held full page is free"
        everything = set(range(1, self.spec.full_tokens // self.ps + 1))
        assert held | set(pages) == everything, "a full page leaked"
        if not self.swa:
            return
        lut = self._lut()[:-1]
        mapped = lut[lut != 0]
        assert len(torch.unique(mapped)) == len(mapped), "an SWA slot has two full owners"
        free = self.allocator.swa_attn_allocator.get_all_free_pages().tolist()
        assert len(set(free)) == len(free), "an SWA page is free twice"
        assert not set((mapped // self.ps).tolist()) & set(free), "a mapped SWA page is free"
        everything = set(range(1, self.spec.swa_tokens // self.ps + 1))
        assert set((mapped // self.ps).tolist()) | set(free) == everything, "an SWA page leaked"

    def _dump(
        self, batch: list[_Request], seq: list[int], out: torch.Tensor, decode: bool
    ) -> HistoryDump:
        self._census(out)
        prefix = [r.length for r in batch]
        padding = int(self.rng.integers(0, 3)) if decode else 0
        rows = [r.row for r in batch] + [0] * padding
        positions = [np.arange(p, s, dtype=np.int64) for p, s in zip(prefix, seq, strict=True)]
        tensors: dict[str, np.ndarray] = {
            "req_to_token": self.req_to_token.numpy().copy(),
            "req_pool_indices": np.array(rows, dtype=np.int64),
            "prefix_lens": np.array(prefix + [0] * padding, dtype=np.int64),
            "extend_seq_lens": np.array(
                [s - p for p, s in zip(prefix, seq, strict=True)] + [1] * padding, dtype=np.int64
            ),
            "out_cache_loc": out.to(torch.int64).numpy().copy(),
            "positions": np.concatenate(positions),
            "free_full_slots": self._expanded(self._full_allocator()),
        }
        spec = self.spec
        metadata = {
            "page_size": str(self.ps),
            "num_full_slots": str(spec.full_tokens + self.ps),
            "write_req_capacity": str(len(rows)),
            "forward_mode": "decode" if decode else "extend",
            "model": "sglang-0.5.23-allocator-history",
            "note": f"seed={self.seed} {spec}",
        }
        if self.swa:
            tensors["full_to_swa_index_mapping"] = self._lut().numpy().copy()
            tensors["free_swa_slots"] = self._expanded(self.allocator.swa_attn_allocator)
            # what SGLang's memory check counts as held: running rows, this step, the tree
            held = self._running_pages() | set((out // self.ps).tolist()) | set(self.path_pages)
            pages = np.array(sorted(held), dtype=np.int64)
            offsets = np.arange(self.ps, dtype=np.int64)
            tensors["held_full_slots"] = (pages[:, None] * self.ps + offsets).reshape(-1)
            metadata["swa_window_size"] = str(spec.window)
            metadata["num_swa_slots"] = str(spec.swa_tokens + self.ps)
        live = [(r.row, p) for r, p in zip(batch, prefix, strict=True)]
        return HistoryDump(
            spec=spec, seed=self.seed, tensors=tensors, metadata=metadata, live_rows=live
        )


def run_history(classes: SGLangAllocators, spec: HistorySpec, seed: int) -> HistoryDump:
    """Run a history for `spec.steps` steps and return the state of a random later step
    (the first step after it that allocates, when that one could not)."""
    history = _History(classes, spec, seed)
    dump_from = int(history.rng.integers(spec.steps // 2, spec.steps))
    for index in range(spec.steps * 4):
        taken = history.step(dump=index >= dump_from)
        if taken is not None:
            return taken
    raise AssertionError(f"history {seed} never allocated after step {dump_from}")


def run_history_states(
    classes: SGLangAllocators, spec: HistorySpec, seed: int, count: int
) -> list[HistoryDump]:
    """The states of `count` consecutive allocating steps from the middle of a history on,
    each with `rank` and `step` in its metadata: one rank's dumps for a timeline."""
    history = _History(classes, spec, seed)
    states: list[HistoryDump] = []
    for index in range(spec.steps * 4):
        taken = history.step(dump=index >= spec.steps // 2)
        if taken is not None:
            taken.metadata.update(rank="0", step=str(index + 1))
            states.append(taken)
            if len(states) == count:
                return states
    raise AssertionError(f"history {seed} allocated {len(states)} times, not {count}")
