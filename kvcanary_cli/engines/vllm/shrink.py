"""What a shrunk vLLM dump keeps (`kvcanary shrink`): the story of every finding, in the
original's block ids.

The small dump keeps, whole, the state of every block a finding names (its reference count
and hash, every place it has in the free queue, every map key and extra key pointing to it) and
the whole tables (every group) of every request holding one: a block's holders are then
counted exactly, its owners listed in the original's order, and a table's indices, its null
run and its groups read as before. It keeps the tables of requests missing from a group, the
entries naming ids outside the pool, the null block's queue places, and for each kept
forward-queue place its partner in the walk back (so the two walks still agree where they
did, and part where they did first). The request list, deferred frees and released blocks are
small: kept whole.

What it drops is not read: the check runs its per-block invariants on the kept blocks only,
and takes the pool's counts (queue length, referenced blocks, requests with tables, entries
per group) from the original's, recorded in `vllm.shrunk` (`state.ShrunkPool`). So a dropped
block is no leak, a shortened queue no count mismatch, and a clean pool shrinks to the
pool's shape and counts, which check clean.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from kvcanary_cli.engines.vllm.check import PoolAudit, audit, partial_requests
from kvcanary_cli.engines.vllm.state import ShrunkPool, VllmState

__all__ = ["SHRUNK_TENSORS", "shrunk_state"]

#: The tensors a shrunk dump adds (what it kept); not the original's.
SHRUNK_TENSORS = ("vllm.kept_blocks", "vllm.free_queue_at", "vllm.free_queue_reverse_at")


def _kept_blocks(state: VllmState, found: PoolAudit) -> np.ndarray:
    """Per block: a finding names it (inside the pool)."""
    n = state.num_blocks
    named = np.array([b for f in found.findings for b in f.blocks], dtype=np.int64)
    blocks: np.ndarray = np.zeros(n, dtype=bool)
    blocks[named[(named >= 0) & (named < n)]] = True
    return blocks


def _kept_requests(state: VllmState, blocks: np.ndarray) -> np.ndarray:
    """Per request: its tables are kept (it holds a kept block, an id outside the pool, or
    has a table in some groups only)."""
    tb = state.table_block
    inside = (tb >= 0) & (tb < state.num_blocks)
    named = ~inside
    named[inside] = blocks[tb[inside]]
    requests = np.zeros(len(state.request_ids), dtype=bool)
    requests[state.table_request[named]] = True
    kept: np.ndarray = requests | partial_requests(state)
    return kept


def _outside(ids: np.ndarray, n: int) -> np.ndarray:
    return (ids < 0) | (ids >= n)


def _queue(state: VllmState, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stored forward-queue entries to keep, their places, and the stored entries of the
    walk back to keep (each kept place's partner)."""
    n = state.num_blocks
    fq = state.free_queue
    keep = _outside(fq, n) | (fq == state.null_block)
    keep[~keep] = blocks[fq[~keep]]
    shrunk = state.shrunk
    at = np.arange(fq.size) if shrunk is None else shrunk.queue_at
    rev_at, length = _reverse_places(state)
    partners = length - 1 - at[keep]  # the same place, counted from the tail
    return keep, at[keep], np.isin(rev_at, partners)


def _reverse_places(state: VllmState) -> tuple[np.ndarray, int]:
    """The places of the stored walk back's entries, and its original length."""
    rev = state.free_queue_reverse
    size = 0 if rev is None else rev.size
    shrunk = state.shrunk
    if shrunk is None or shrunk.reverse_at is None or shrunk.reverse_length is None:
        return np.arange(size), size
    return shrunk.reverse_at, shrunk.reverse_length


def shrunk_state(state: VllmState) -> VllmState:
    """`state` cut to what its check reads, in its ids (a `ShrunkPool` saying what)."""
    found = audit(state)
    n = state.num_blocks
    blocks = _kept_blocks(state, found)
    if state.shrunk is not None:
        blocks &= state.shrunk.blocks
    entries = _kept_requests(state, blocks)[state.table_request]
    fq_keep, queue_at, rev_keep = _queue(state, blocks)
    mb = state.map_block
    map_keep = _outside(mb, n)
    map_keep[~map_keep] = blocks[mb[~map_keep]]
    eb = state.extra_key_block
    key_keep = ~_outside(eb, n)
    key_keep[key_keep] = blocks[eb[key_keep]]
    rev = state.free_queue_reverse
    rev_at, rev_length = _reverse_places(state)
    return replace(
        state,
        ref_cnt=np.where(blocks, state.ref_cnt, 0),
        hash_group=np.where(blocks, state.hash_group, -1),
        hash_digest=np.where(blocks[:, None], state.hash_digest, 0).astype(np.uint8),
        free_queue=state.free_queue[fq_keep],
        free_queue_reverse=None if rev is None else rev[rev_keep],
        map_block=mb[map_keep],
        map_group=state.map_group[map_keep],
        map_digest=state.map_digest[map_keep],
        extra_key_block=eb[key_keep],
        extra_key_group=state.extra_key_group[key_keep],
        extra_key_digest=state.extra_keys()[key_keep],
        table_group=state.table_group[entries],
        table_request=state.table_request[entries],
        table_index=state.table_index[entries],
        table_block=state.table_block[entries],
        shrunk=ShrunkPool(
            blocks=blocks,
            queue_at=queue_at,
            queue_length=state.queue_length,
            reverse_at=None if rev is None else rev_at[rev_keep],
            reverse_length=None if rev is None else rev_length,
            referenced=found.referenced,
            requests_with_blocks=found.requests_with_blocks,
            group_entries=tuple(g.entries for g in found.groups),
        ),
    )
