"""Synthetic vLLM block-pool states: a clean serving state (full attention, or full plus a
sliding window, a Mamba state group or chunked local attention), and the same state with one
fault planted, each naming the finding codes
`check` must report (in its metadata, `vllm.expected_findings`).

The clean state is built by a small allocator model of this module's own (shared prefixes
with ref counts above 1, cached blocks on the queue's tail, dropped window blocks, waiting
requests, deferred frees, a block released until reuse); a fault edits it the way the bug
would, keeping every other invariant.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from kvcanary_cli.catalog import PoolCode
from kvcanary_cli.dump.tensor import distinct
from kvcanary_cli.engines.vllm.state import (
    CHUNKED_LOCAL,
    FULL,
    MAMBA,
    RSWA,
    SLIDING_WINDOW,
    GroupSpec,
    VllmState,
)

__all__ = ["SCENARIOS", "SIZES", "Scenario", "build"]

#: size -> (blocks, requests).
SIZES = {"tiny": (64, 6), "small": (2048, 64), "medium": (16384, 256), "large": (131072, 1024)}
BLOCK_SIZE = 16
WINDOW = 64
#: A Mamba group's state bound in prefix-caching ("align") mode: the last computed token's
#: state and the previous step's (what `_kept` keeps at most).
MAMBA_STATES = 2
_DIGEST = 16


def _digest(*parts: object) -> bytes:
    return hashlib.blake2b(repr(parts).encode(), digest_size=_DIGEST).digest()


@dataclass
class _Builder:
    """The allocator model: blocks handed out from a shuffled free list, holders counted."""

    n: int
    rng: np.random.Generator

    def __post_init__(self) -> None:
        self.free = [int(b) for b in self.rng.permutation(np.arange(1, self.n))]
        self.ref = np.zeros(self.n, dtype=np.int64)
        self.hash_group = np.full(self.n, -1, dtype=np.int64)
        self.hash_digest = np.zeros((self.n, _DIGEST), dtype=np.uint8)
        self.cached_free: list[int] = []
        self.entries: list[tuple[int, int, int, int]] = []  # group, request, index, block

    def take(self, count: int) -> list[int] | None:
        if count > len(self.free):
            return None
        out, self.free = self.free[:count], self.free[count:]
        return out

    def hash(self, block: int, group: int, *key: object) -> None:
        self.hash_group[block] = group
        self.hash_digest[block] = np.frombuffer(_digest(group, *key), dtype=np.uint8)


def _prompt(tokens: int) -> int:
    """A request's prompt tokens of its `tokens` (the rest generated)."""
    return max(1, tokens // 3)


def _kept(kind: str, tokens: int, blocks: int) -> list[int]:
    """The indices of a `tokens`-long request's table (`blocks` entries) that the second
    group's manager keeps (the others hold the null block): a sliding window's blocks from
    the window's first token on; chunked local attention's from the current chunk's start
    (its last block at least); a Mamba group's last state and, in a longer table, one state
    kept two blocks back (its prefix-caching mode leaves nulls between the states it keeps);
    a reference sliding window's prompt blocks and its generated tokens' window."""
    if kind == RSWA:
        prompt = _prompt(tokens)
        start = max(prompt, tokens - WINDOW) // BLOCK_SIZE
        return [i for i in range(blocks) if i < -(-prompt // BLOCK_SIZE) or i >= start]
    if kind == MAMBA:
        return sorted({blocks - 1, *([blocks - 3] if blocks >= 4 else [])})
    if kind == CHUNKED_LOCAL:
        dropped = min(tokens // WINDOW * WINDOW // BLOCK_SIZE, blocks - 1)
    else:
        dropped = max(0, tokens - WINDOW) // BLOCK_SIZE
    return list(range(dropped, blocks))


def _clean(
    seed: int, size: str, hybrid: bool, kind: str = SLIDING_WINDOW, drafts: int = 0
) -> VllmState:
    """A clean pool; `drafts`: a Mamba group's scratch blocks, real at the end of each table
    (a speculative decoder's, one per draft token)."""
    n, r_count = SIZES[size]
    rng = np.random.default_rng(seed)
    b = _Builder(n, rng)
    groups = [GroupSpec(kind=FULL, block_size=BLOCK_SIZE)]
    if hybrid:
        window = None if kind == MAMBA else WINDOW
        states = MAMBA_STATES + drafts if kind == MAMBA else None
        groups.append(
            GroupSpec(
                kind=kind,
                block_size=BLOCK_SIZE,
                window=window,
                max_states=states,
                speculative_blocks=drafts,
            )
        )
    share = 0.45 if hybrid else 0.6
    avg = max(2, int(share * (n - 1) / r_count / len(groups)))
    families: dict[int, list[int]] = {}
    ids, live, tokens = [], [], []
    for r in range(r_count):
        ids.append(f"req-{seed}-{r}")
        live.append(1)
        t = int(rng.integers(1, 2 * avg * BLOCK_SIZE))
        if r % 7 == 6:  # waiting: no blocks yet (an empty defaultdict entry at most)
            tokens.append(t)
            continue
        nb = -(-t // BLOCK_SIZE)
        complete = t // BLOCK_SIZE
        fam = r % 3
        prefix = families.get(fam)
        if prefix is None and complete >= 2:
            got = b.take(min(complete, 4))
            if got is None:
                tokens.append(t)
                continue
            prefix = families[fam] = got
            for i, blk in enumerate(prefix):
                b.hash(blk, 0, "prefix", fam, i)
        shared = prefix[: min(len(prefix), complete)] if prefix else []
        own = b.take(nb - len(shared))
        sw: list[int] = []
        kept = _kept(kind, t, nb) if hybrid else []
        dropped = nb - len(kept)
        kept += list(range(nb, nb + drafts)) if hybrid else []
        if own is not None and hybrid:
            sw_got = b.take(len(kept))
            if sw_got is None:
                b.free = own + b.free
                own = None
            else:
                sw = sw_got
        if own is None:
            tokens.append(t)
            continue
        tokens.append(t)
        table = shared + own
        for i, blk in enumerate(table):
            b.ref[blk] += 1
            b.entries.append((0, r, i, blk))
            if len(shared) <= i < complete:
                b.hash(blk, 0, "own", r, i)
        if hybrid:
            for i in range(nb + drafts):
                blk = sw[kept.index(i)] if i in kept else 0
                b.entries.append((1, r, i, blk))
                if blk:
                    b.ref[blk] += 1
                    if i < complete:
                        b.hash(blk, 1, "sw", r, i)
            for i in range(min(dropped, 2)):  # dropped window blocks kept cached on the queue
                got = b.take(1)
                if got:
                    b.hash(got[0], 1, "sw", r, i)
                    b.cached_free.append(got[0])
    # family prefix blocks no request holds are cached free blocks (hashed, ref 0)
    b.cached_free += [blk for p in families.values() for blk in p if b.ref[blk] == 0]
    # a preempted request whose blocks wait for the in-flight step: deferred frees
    deferred = b.take(3) or []
    for blk in deferred:
        b.ref[blk] = 1
    ids.append(f"req-{seed}-preempted")
    live.append(1)
    tokens.append(3 * BLOCK_SIZE)
    # a block released until reuse: queued, counted free, still in its table
    released: list[int] = []
    entries = np.array(b.entries, dtype=np.int64).reshape(-1, 4)
    single = np.flatnonzero(
        (entries[:, 0] == 0) & (b.ref[entries[:, 3]] == 1) & (b.hash_group[entries[:, 3]] < 0)
    )
    if single.size:
        blk = int(entries[single[0], 3])
        b.ref[blk] = 0
        released.append(blk)
    queue = np.array(b.free + released + b.cached_free, dtype=np.int64)
    hashed = np.flatnonzero(b.hash_group >= 0)
    return VllmState(
        num_blocks=n,
        num_free_blocks=int(queue.size),
        groups=tuple(groups),
        request_ids=tuple(ids),
        request_live=np.array(live, dtype=bool),
        request_num_tokens=np.array(tokens, dtype=np.int64),
        request_num_computed=np.array(tokens, dtype=np.int64),
        request_num_prompt=(
            np.array([_prompt(t) for t in tokens], dtype=np.int64) if kind == RSWA else None
        ),
        ref_cnt=b.ref,
        free_queue=queue,
        free_queue_reverse=queue[::-1].copy(),
        hash_group=b.hash_group,
        hash_digest=b.hash_digest,
        map_block=hashed.astype(np.int64),
        map_group=b.hash_group[hashed],
        map_digest=b.hash_digest[hashed],
        table_group=entries[:, 0],
        table_request=entries[:, 1],
        table_index=entries[:, 2],
        table_block=entries[:, 3],
        deferred_block=np.array(deferred, dtype=np.int64),
        deferred_request=np.full(len(deferred), len(ids) - 1, dtype=np.int64),
        released_block=np.array(released, dtype=np.int64),
        # the dump format is the same for 0.33.0 and 0.34.0 (only the live map's shape differs)
        version="0.33.0",
        extra={"note": "kvcanary synth: a vLLM block pool"},
    )


# --- faults: each edits the clean state as its bug would ------------------------------------


def _copy(s: VllmState) -> VllmState:
    arrays = {
        k: v.copy()
        for k, v in vars(s).items()
        if isinstance(v, np.ndarray)  # every array, so an edit never reaches the clean state
    }
    return replace(s, **arrays)  # type: ignore[arg-type]


def _holders(s: VllmState) -> np.ndarray:
    real = s.table_block != s.null_block
    out: np.ndarray = np.bincount(s.table_block[real], minlength=s.num_blocks) + np.bincount(
        s.deferred_block, minlength=s.num_blocks
    )
    return out


def _queued(s: VllmState) -> np.ndarray:
    return np.bincount(s.free_queue, minlength=s.num_blocks) > 0


def _pick(rng: np.random.Generator, candidates: np.ndarray, what: str) -> int:
    if candidates.size == 0:
        raise ValueError(f"the clean state has no {what} to plant the fault in")
    return int(candidates[rng.integers(candidates.size)])


def _requeue(s: VllmState, block: int) -> VllmState:
    """`block` appended to the free queue (both walks and the counter)."""
    q = np.append(s.free_queue, block)
    return replace(s, free_queue=q, free_queue_reverse=q[::-1].copy(), num_free_blocks=q.size)


def _release(s: VllmState, block: int) -> VllmState:
    """One reference of `block` dropped; queued when it was the last (vLLM's `free_blocks`)."""
    s.ref_cnt[block] -= 1
    return _requeue(s, block) if s.ref_cnt[block] == 0 else s


def _free_blocks(s: VllmState) -> np.ndarray:
    hashed = s.hash_group >= 0
    return np.flatnonzero(_queued(s) & ~hashed & (s.ref_cnt == 0))


def _double_free(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A freed block freed again: ref_cnt 0 → −1 (vLLM does not queue it twice)."""
    s.ref_cnt[_pick(rng, _free_blocks(s), "free block")] = -1
    return s


def _queue_duplicate(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A free block appended to the queue again (an offload path's own free)."""
    return _requeue(s, _pick(rng, _free_blocks(s), "free block"))


def _shared(s: VllmState) -> np.ndarray:
    return np.flatnonzero((_holders(s) >= 2) & (s.ref_cnt >= 2))


def _freed_while_held(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A request's free dropped every reference of a block other requests still hold."""
    block = _pick(rng, _shared(s), "shared block")
    s.ref_cnt[block] = 0
    return _requeue(s, block)


def _ref_count_low(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A shared block lost one reference too many, not yet all."""
    s.ref_cnt[_pick(rng, _shared(s), "shared block")] -= 1
    return s


def _own_held(s: VllmState) -> np.ndarray:
    """Blocks held once, by a group-0 table, unhashed (a request's partial last block)."""
    h = _holders(s)
    entries = s.table_block[(s.table_group == 0) & (s.table_block != s.null_block)]
    candidates: np.ndarray = entries[(h[entries] == 1) & (s.ref_cnt[entries] == 1)]
    unhashed: np.ndarray = candidates[s.hash_group[candidates] < 0]
    return unhashed


def _leak(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A block's last reference dropped without queueing it."""
    block = _pick(rng, _free_blocks(s), "free block")
    q = s.free_queue[s.free_queue != block]
    return replace(s, free_queue=q, free_queue_reverse=q[::-1].copy(), num_free_blocks=q.size)


def _ref_count_high(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A reference taken and never released (a prefix hit counted twice)."""
    s.ref_cnt[_pick(rng, _own_held(s), "held block")] += 1
    return s


def _queue_broken(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A `prev` link rewritten: the walk back disagrees with the walk forward."""
    rev = s.free_queue[::-1].copy()
    i = int(rng.integers(1, rev.size))
    rev[[i - 1, i]] = rev[[i, i - 1]]
    return replace(s, free_queue_reverse=rev)


def _free_count(s: VllmState, rng: np.random.Generator) -> VllmState:
    """The free counter ran ahead of the queue."""
    return replace(s, num_free_blocks=s.num_free_blocks + int(rng.integers(1, 4)))


def _last_entries(s: VllmState, group: int) -> np.ndarray:
    """Entries that are the last of their (group, request) table, real blocks, with a null
    or a real block before them (index ≥ 1)."""
    last = np.ones(s.table_block.size, dtype=bool)
    last[:-1] = (s.table_request[1:] != s.table_request[:-1]) | (
        s.table_group[1:] != s.table_group[:-1]
    )
    return np.flatnonzero(
        last & (s.table_group == group) & (s.table_block != s.null_block) & (s.table_index >= 1)
    )


def _swap_entry(s: VllmState, entry: int, block: int) -> VllmState:
    """Table entry `entry` now holds `block`; its old block released as vLLM would."""
    old = int(s.table_block[entry])
    s.table_block[entry] = block
    if 0 <= block < s.num_blocks and block != s.null_block:
        s.ref_cnt[block] += 1
    return _release(s, old)


def _null_block(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A window drop that nulled a request's last block (not a leading one)."""
    return _swap_entry(s, _pick(rng, _last_entries(s, 1), "window table"), s.null_block)


def _prompt_block_dropped(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A reference sliding window dropped its request's last prompt block (a gap begun one
    block early: the prompt's partial last block freed)."""
    assert s.request_num_prompt is not None
    g1 = (s.table_group == 1) & (s.table_block != s.null_block)
    last = -(-s.request_num_prompt[s.table_request] // BLOCK_SIZE) - 1
    entries = np.flatnonzero(g1 & (s.table_index == last))
    return _swap_entry(s, _pick(rng, entries, "prompt block of an R-SWA table"), s.null_block)


def _null_in_chunk(s: VllmState, rng: np.random.Generator) -> VllmState:
    """Chunked local attention dropped a block of the current chunk: the first real block of
    a window table (its leading null run one block longer, still a leading run)."""
    g1 = s.table_group == 1
    real = s.table_block != s.null_block
    prev_null = np.zeros(real.size, dtype=bool)
    prev_null[1:] = ~real[:-1] & (s.table_request[1:] == s.table_request[:-1])
    first = np.flatnonzero(g1 & real & ((s.table_index == 0) | prev_null))
    return _swap_entry(s, _pick(rng, first, "chunked-local table"), s.null_block)


def _freed_state(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A Mamba group freed a state block its request still holds (ref 0, queued)."""
    held = np.flatnonzero((s.table_group == 1) & (s.table_block != s.null_block))
    block = int(s.table_block[_pick(rng, held, "Mamba state block")])
    s.ref_cnt[block] = 0
    return _requeue(s, block)


def _state_dropped(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A Mamba group nulled (and freed) every state block of a request's table: the running
    state is gone."""
    g1 = np.flatnonzero(s.table_group == 1)
    request = _pick(rng, distinct(s.table_request[g1]), "Mamba table")
    for entry in g1[s.table_request[g1] == request]:
        if s.table_block[entry] != s.null_block:
            s = _swap_entry(s, int(entry), s.null_block)
    return s


def _running_state_dropped(s: VllmState, rng: np.random.Generator) -> VllmState:
    """Under speculative decoding, a Mamba group nulled (and freed) every state block of a
    request's table, the running state among them, and kept the scratch blocks after it."""
    g1 = np.flatnonzero(s.table_group == 1)
    request = _pick(rng, distinct(s.table_request[g1]), "Mamba table")
    table = g1[s.table_request[g1] == request]
    states = table.size - s.groups[1].speculative_blocks
    for entry in table[s.table_index[table] < states]:
        if s.table_block[entry] != s.null_block:
            s = _swap_entry(s, int(entry), s.null_block)
    return s


def _state_kept(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A Mamba group left a state it should have retired in a request's table: a null entry
    between the two states it keeps holds a block (taken off the free queue, unhashed)."""
    g1 = (s.table_group == 1) & s.request_live[s.table_request]
    real = s.table_block != s.null_block
    states = np.bincount(s.table_request[g1 & real], minlength=len(s.request_ids))
    full = np.flatnonzero(g1 & ~real & (states[s.table_request] >= MAMBA_STATES))
    entry = _pick(rng, full, "null entry of a Mamba table with two states")
    block = _pick(rng, _free_blocks(s), "free block")
    q = s.free_queue[s.free_queue != block]
    s = replace(s, free_queue=q, free_queue_reverse=q[::-1].copy(), num_free_blocks=q.size)
    s.table_block[entry] = block
    s.ref_cnt[block] = 1
    return s


def _state_in_flight(s: VllmState, rng: np.random.Generator) -> VllmState:
    """`_state_kept`'s table, its request with a token in flight (vLLM's async scheduling):
    that step's state is kept until the token is processed, so the third is no finding."""
    before = s.table_block.copy()
    s = _state_kept(s, rng)
    entry = int(np.flatnonzero(s.table_block != before)[0])
    in_flight = np.zeros(len(s.request_ids), dtype=np.int64)
    in_flight[s.table_request[entry]] = 1
    return replace(s, request_num_in_flight=in_flight)


def _two_groups(s: VllmState, rng: np.random.Generator) -> VllmState:
    """Group 0 took a block group 1 still holds (an unhashed one, so no hash disagrees)."""
    sw = _last_entries(s, 1)
    sw = sw[s.hash_group[s.table_block[sw]] < 0]
    block = int(s.table_block[_pick(rng, sw, "unhashed window block")])
    full = _last_entries(s, 0)
    full = full[(s.hash_group[s.table_block[full]] < 0) & (s.table_request[full] != 0)]
    return _swap_entry(s, _pick(rng, full, "unhashed full block"), block)


def _foreign_hash(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A held group-0 block cached under group 1's key (map and block agree)."""
    held = s.table_block[(s.table_group == 0) & (s.table_block != s.null_block)]
    block = _pick(rng, distinct(held[s.hash_group[held] == 0]), "hashed held block")
    s.hash_group[block] = 1
    s.map_group[s.map_block == block] = 1
    return s


def _stale_hash(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A block reused while an old prefix key still points to it."""
    block = _pick(rng, np.flatnonzero(s.hash_group >= 0), "hashed block")
    key = np.frombuffer(_digest("stale", block), dtype=np.uint8)[None, :]
    return replace(
        s,
        map_block=np.append(s.map_block, block),
        map_group=np.append(s.map_group, 0),
        map_digest=np.concatenate([s.map_digest, key]),
    )


def _hash_unmapped(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A map entry evicted without resetting its block's hash."""
    drop = int(rng.integers(s.map_block.size))
    keep = np.arange(s.map_block.size) != drop
    return replace(
        s, map_block=s.map_block[keep], map_group=s.map_group[keep], map_digest=s.map_digest[keep]
    )


def _dead_request(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A request finished (gone from the scheduler) without freeing its blocks."""
    s.request_live[_pick(rng, distinct(s.table_request), "request with blocks")] = False
    return s


def _missing_group(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A request's free reached group 1 only: its group-1 table gone, blocks released."""
    request = _pick(rng, distinct(s.table_request[s.table_group == 1]), "window table")
    drop = (s.table_group == 1) & (s.table_request == request)
    for block in s.table_block[drop]:
        if block != s.null_block:
            s = _release(s, int(block))
    keep = ~drop
    return replace(
        s,
        table_group=s.table_group[keep],
        table_request=s.table_request[keep],
        table_index=s.table_index[keep],
        table_block=s.table_block[keep],
    )


def _out_of_range(s: VllmState, rng: np.random.Generator) -> VllmState:
    """A table entry written with an id past the pool (another pool's size)."""
    entry = _pick(rng, _last_entries(s, 0), "table")
    return _swap_entry(s, entry, s.num_blocks + int(rng.integers(1, 100)))


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A vLLM synth scenario: the state it builds and the findings `check` must report."""

    summary: str
    hybrid: bool
    expected: tuple[PoolCode, ...]
    plant: Callable[[VllmState, np.random.Generator], VllmState] | None = None
    #: the second group's kind (a hybrid scenario's)
    kind: str = SLIDING_WINDOW
    #: a Mamba group's scratch blocks per table (speculative decoding's draft tokens)
    drafts: int = 0


SCENARIOS: dict[str, Scenario] = {
    "vllm-clean": Scenario(summary="a clean full-attention pool", hybrid=False, expected=()),
    "vllm-hybrid-clean": Scenario(
        summary="a clean full + sliding-window pool", hybrid=True, expected=()
    ),
    "vllm-rswa-clean": Scenario(
        summary="a clean full + reference-sliding-window pool (nulls between each prompt and "
        "its window)",
        hybrid=True,
        expected=(),
        kind=RSWA,
    ),
    "vllm-rswa-prompt-block-dropped": Scenario(
        summary="a reference sliding window's table with its last prompt block nulled",
        hybrid=True,
        expected=(PoolCode.NULL_BLOCK_MISPLACED,),
        plant=_prompt_block_dropped,
        kind=RSWA,
    ),
    "vllm-mamba-clean": Scenario(
        summary="a clean full + Mamba pool (nulls between the states a request keeps)",
        hybrid=True,
        expected=(),
        kind=MAMBA,
    ),
    "vllm-chunked-local-clean": Scenario(
        summary="a clean full + chunked-local-attention pool",
        hybrid=True,
        expected=(),
        kind=CHUNKED_LOCAL,
    ),
    "vllm-chunked-local-null-in-chunk": Scenario(
        summary="the null block in place of a block of the current chunk",
        hybrid=True,
        expected=(PoolCode.NULL_BLOCK_MISPLACED,),
        plant=_null_in_chunk,
        kind=CHUNKED_LOCAL,
    ),
    "vllm-mamba-state-freed": Scenario(
        summary="a Mamba state block freed while its request's table holds it",
        hybrid=True,
        expected=(PoolCode.QUEUED_BLOCK_HELD,),
        plant=_freed_state,
        kind=MAMBA,
    ),
    "vllm-mamba-state-dropped": Scenario(
        summary="a Mamba table with every state block dropped (the null block only)",
        hybrid=True,
        expected=(PoolCode.NULL_BLOCK_MISPLACED,),
        plant=_state_dropped,
        kind=MAMBA,
    ),
    "vllm-mamba-state-kept": Scenario(
        summary="a Mamba table holding a third state block (one its group never retired)",
        hybrid=True,
        expected=(PoolCode.MAMBA_STATES_OVER_BOUND,),
        plant=_state_kept,
        kind=MAMBA,
    ),
    "vllm-mamba-in-flight": Scenario(
        summary="the same third state while its request has a token in flight (async "
        "scheduling keeps it until the token is processed): clean",
        hybrid=True,
        expected=(),
        plant=_state_in_flight,
        kind=MAMBA,
    ),
    "vllm-mamba-drafting-clean": Scenario(
        summary="a clean full + Mamba pool under speculative decoding (each table ends with "
        "two scratch blocks, one per draft token)",
        hybrid=True,
        expected=(),
        kind=MAMBA,
        drafts=2,
    ),
    "vllm-mamba-running-state-dropped": Scenario(
        summary="under speculative decoding, a Mamba table with every state block dropped, "
        "the running state's among them (its scratch blocks kept)",
        hybrid=True,
        expected=(PoolCode.NULL_BLOCK_MISPLACED,),
        plant=_running_state_dropped,
        kind=MAMBA,
        drafts=2,
    ),
    "vllm-double-free": Scenario(
        summary="a free block freed again (ref_cnt −1)",
        hybrid=False,
        expected=(PoolCode.NEGATIVE_REF_COUNT,),
        plant=_double_free,
    ),
    "vllm-queue-duplicate": Scenario(
        summary="a free block queued twice",
        hybrid=False,
        expected=(PoolCode.FREE_QUEUE_DUPLICATE,),
        plant=_queue_duplicate,
    ),
    "vllm-freed-while-held": Scenario(
        summary="a shared block freed while other requests hold it",
        hybrid=False,
        expected=(PoolCode.QUEUED_BLOCK_HELD,),
        plant=_freed_while_held,
    ),
    "vllm-ref-count-low": Scenario(
        summary="a shared block lost a reference",
        hybrid=False,
        expected=(PoolCode.REF_COUNT_LOW,),
        plant=_ref_count_low,
    ),
    "vllm-ref-count-high": Scenario(
        summary="a reference never released",
        hybrid=False,
        expected=(PoolCode.REF_COUNT_HIGH,),
        plant=_ref_count_high,
    ),
    "vllm-leak": Scenario(
        summary="a block neither free nor held",
        hybrid=False,
        expected=(PoolCode.BLOCK_LEAKED,),
        plant=_leak,
    ),
    "vllm-queue-broken": Scenario(
        summary="a free queue prev link rewritten",
        hybrid=False,
        expected=(PoolCode.FREE_QUEUE_BROKEN,),
        plant=_queue_broken,
    ),
    "vllm-free-count": Scenario(
        summary="the free counter ahead of the queue",
        hybrid=False,
        expected=(PoolCode.FREE_COUNT_MISMATCH,),
        plant=_free_count,
    ),
    "vllm-null-block": Scenario(
        summary="the null block after a real block in a window table",
        hybrid=True,
        expected=(PoolCode.NULL_BLOCK_MISPLACED,),
        plant=_null_block,
    ),
    "vllm-two-groups": Scenario(
        summary="one block in the tables of two groups",
        hybrid=True,
        expected=(PoolCode.BLOCK_IN_TWO_GROUPS,),
        plant=_two_groups,
    ),
    "vllm-foreign-hash": Scenario(
        summary="a group-0 block cached under group 1's key",
        hybrid=True,
        expected=(PoolCode.HASH_GROUP_FOREIGN,),
        plant=_foreign_hash,
    ),
    "vllm-stale-hash": Scenario(
        summary="a prefix key pointing to a block that no longer carries it",
        hybrid=False,
        expected=(PoolCode.HASH_ENTRY_STALE,),
        plant=_stale_hash,
    ),
    "vllm-hash-unmapped": Scenario(
        summary="a hashed block missing from the prefix map",
        hybrid=False,
        expected=(PoolCode.HASHED_BLOCK_UNMAPPED,),
        plant=_hash_unmapped,
    ),
    "vllm-dead-request": Scenario(
        summary="a finished request that kept its blocks",
        hybrid=False,
        expected=(PoolCode.TABLE_OF_DEAD_REQUEST,),
        plant=_dead_request,
    ),
    "vllm-missing-group": Scenario(
        summary="a request freed in one group only",
        hybrid=True,
        expected=(PoolCode.REQUEST_MISSING_IN_GROUP,),
        plant=_missing_group,
    ),
    "vllm-block-out-of-range": Scenario(
        summary="a table entry past the pool",
        hybrid=False,
        expected=(PoolCode.BLOCK_OUT_OF_RANGE,),
        plant=_out_of_range,
    ),
}


def build(name: str, *, seed: int = 0, size: str = "tiny") -> VllmState:
    """Scenario `name`'s state, its expected findings in `extra["vllm.expected_findings"]`."""
    scenario = SCENARIOS[name]
    state = _clean(seed, size, scenario.hybrid, scenario.kind, scenario.drafts)
    if scenario.plant is not None:
        state = scenario.plant(_copy(state), np.random.default_rng(seed + 1))
    extra = {
        **state.extra,
        "scenario": name,
        "vllm.expected_findings": ",".join(scenario.expected),
    }
    return replace(state, extra=extra)
