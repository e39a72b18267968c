"""What changed in a vLLM pool between snapshots: per block its state (free, held, both,
neither) and holders in each, the requests that came and went, and the findings each
snapshot's check has. Read from the dumps' arrays alone (no replay of vLLM)."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from kvcanary_cli.catalog import PoolCode
from kvcanary_cli.dump.tensor import distinct
from kvcanary_cli.engines.vllm.check import owners_of
from kvcanary_cli.engines.vllm.state import VllmState
from kvcanary_cli.results.pool_timeline import BlockState, PoolBlockChange, PoolStep

__all__ = ["MAX_BLOCKS", "block_states", "step_between"]

#: Changed blocks a step lists.
MAX_BLOCKS = 20
_STATES: tuple[BlockState, ...] = ("lost", "free", "held", "free-and-held")


def _holders(state: VllmState) -> tuple[np.ndarray, np.ndarray]:
    """Per block its holder count, and a signature of its holders (the sum of a checksum of
    each (request id, group) holding it; a deferred free counts as one more holder)."""
    n = state.num_blocks
    real = state.table_block != state.null_block
    ids = np.array([zlib.crc32(r.encode()) for r in state.request_ids], dtype=np.uint64)
    keys = ids[state.table_request[real]] * np.uint64(1_000_003)
    keys += state.table_group[real].astype(np.uint64)
    blocks = np.concatenate([state.table_block[real], state.deferred_block]).astype(np.int64)
    keys = np.concatenate([keys, np.full(state.deferred_block.size, 7, dtype=np.uint64)])
    inside = (blocks >= 0) & (blocks < n)
    count = np.bincount(blocks[inside], minlength=n)
    signature = np.zeros(n, dtype=np.uint64)
    np.add.at(signature, blocks[inside], keys[inside])
    return count, signature


def block_states(state: VllmState, count: np.ndarray) -> np.ndarray:
    """Per block an index into `_STATES` from its place in the queue and its `count` of
    holders; the null block reads as held (never free), a block released until reuse as free
    (its table still reads it, by design)."""
    n = state.num_blocks
    queued = np.zeros(n, dtype=bool)
    queued[state.free_queue[(state.free_queue >= 0) & (state.free_queue < n)]] = True
    held = count > 0
    held[state.null_block] = True
    released = np.asarray(state.released_block, dtype=np.int64)
    held[released[(released >= 0) & (released < n)]] = False
    return queued.astype(np.int64) + 2 * held.astype(np.int64)


def _ids(state: VllmState) -> set[str]:
    """The requests the scheduler has, and those with a table."""
    live = {r for r, alive in zip(state.request_ids, state.request_live, strict=True) if alive}
    return live | {state.request_ids[int(r)] for r in distinct(state.table_request)}


def step_between(
    a: VllmState,
    b: VllmState,
    i: int,
    codes: tuple[Sequence[PoolCode], Sequence[PoolCode]],
) -> PoolStep:
    """The change from snapshot `i` (`a`) to snapshot `i + 1` (`b`) of one pool, given each
    one's finding codes."""
    ca, siga = _holders(a)
    cb, sigb = _holders(b)
    sa, sb = block_states(a, ca), block_states(b, cb)
    free, held = 1, 2
    allocated = (sa == free) & (sb == held)
    freed = (sa == held) & (sb == free)
    rehomed = (sa == held) & (sb == held) & (siga != sigb)
    bad_a = (sa == 0) | (sa == 3)
    bad_b = (sb == 0) | (sb == 3)
    went_bad = bad_a != bad_b
    changed = rehomed | (sa != sb)
    changed[b.null_block] = False
    order = np.concatenate(
        [np.flatnonzero(changed & went_bad), np.flatnonzero(changed & ~went_bad)]
    )
    codes_a, codes_b = codes
    before, after = _ids(a), _ids(b)
    return PoolStep(
        before=i,
        after=i + 1,
        requests_added=tuple(sorted(after - before)),
        requests_gone=tuple(sorted(before - after)),
        allocated=int(allocated.sum()),
        freed=int(freed.sum()),
        rehomed=int(rehomed.sum()),
        went_bad=int(went_bad.sum()),
        new_codes=tuple(c for c in dict.fromkeys(codes_b) if c not in codes_a),
        gone_codes=tuple(c for c in dict.fromkeys(codes_a) if c not in codes_b),
        blocks=tuple(
            PoolBlockChange(
                block=int(k),
                before=_STATES[int(sa[k])],
                after=_STATES[int(sb[k])],
                ref_before=int(a.ref_cnt[k]),
                ref_after=int(b.ref_cnt[k]),
                owners=owners_of(b, int(k)),
            )
            for k in order[:MAX_BLOCKS]
        ),
    )
