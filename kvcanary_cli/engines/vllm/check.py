"""vLLM's block pool checked: every invariant a correct `KVCacheManager` keeps, as findings
with the blocks they concern, their holders and the fault they point to.

Whole-array numpy passes (a production pool of 10^5 blocks takes milliseconds); Python runs
only per finding code, for the example block's story. The SGLang planner and canary have
nothing to read here (no planner inputs): the coverage says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from kvcanary_cli.catalog import POOL_CAUSE_OF, POOL_CAUSES, PoolCause, PoolCode, plural
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
from kvcanary_cli.results.pool import BlockOwner, PoolDiagnosis, PoolFinding, PoolGroup

__all__ = [
    "COVERAGE",
    "PoolAudit",
    "audit",
    "owners_of",
    "partial_requests",
    "queue_places",
    "skipped_checks",
    "tables_present",
]

#: What a vLLM check covers and leaves out, in words (the report carries it).
COVERAGE = (
    "block pool: free queue (links, duplicates, counter), reference counts against holders "
    "(tables of every group and deferred frees), leaks, the null block, groups, the prefix-cache "
    "map against the blocks' hashes, request tables against the scheduler's requests",
    "not run: the SGLang planner and canary (a vLLM dump holds no planner inputs)",
    "not checked: a request's own block hashes against its table (the dump does not carry "
    "them), worker-side block tables and slot mappings; in a Mamba group where its tables hold "
    "the null block (its prefix-caching mode leaves nulls between the states it keeps: only a "
    "table with no state block at all, a speculative decoder's scratch blocks aside, is a "
    "finding)",
)
#: Kinds whose tables drop the blocks before a window of the computed tokens (the null block
#: as a leading run, only over blocks wholly before the window): tokens kept behind the last
#: computed one, from the group's window (None: the window is not known, only the run's
#: shape is checked).
_WINDOWED = {
    SLIDING_WINDOW: lambda computed, window: computed - window + 1,
    # the current chunk's start: every block from there on is kept
    CHUNKED_LOCAL: lambda computed, window: computed // window * window,
}
#: Kinds whose tables may hold the null block anywhere (no placement rule).
_NULL_ANYWHERE = frozenset({MAMBA})
#: Kinds whose null blocks are a gap of their own (`_outside_gap`).
_GAPPED = frozenset({RSWA})


def skipped_checks(groups: tuple[GroupSpec, ...], *, prompts: bool = True) -> tuple[str, ...]:
    """What the audit leaves out for groups whose kind it has no rule for, in words (one line
    per such group): where their tables may hold the null block; likewise for a reference
    sliding window's without the requests' prompt lengths (`prompts` False) or its window."""
    known = {FULL, *_WINDOWED, *_NULL_ANYWHERE, *_GAPPED}
    unknown = tuple(
        f"not checked: group {i}'s tables (its manager, {g.kind}, keeps a block pool of its "
        "own, a host tier's: they name that pool's blocks, not this one's)"
        if g.own_pool
        else f"not checked: where group {i}'s tables hold the null block (its manager, "
        f"{g.kind}, is a kind kvcanary has no rule for)"
        for i, g in enumerate(groups)
        if g.kind not in known or g.own_pool
    )
    ungapped = tuple(
        f"not checked: where group {i}'s tables hold the null block (a reference sliding "
        "window's gap follows each request's prompt, whose length the dump does not record)"
        for i, g in enumerate(groups)
        if g.kind == RSWA and (not prompts or g.window is None)
    )
    unbounded = tuple(
        f"not checked: how many state blocks group {i}'s tables hold (its bound was not known "
        "when the dump was taken: the scheduler's requests not read, or an older dump)"
        for i, g in enumerate(groups)
        if g.kind == MAMBA and g.max_states is None
    )
    return unknown + ungapped + unbounded


#: Owners listed per example block (a block shared by every request lists a few).
MAX_OWNERS = 16


@dataclass(frozen=True, kw_only=True)
class PoolAudit:
    """The findings, the diagnosis and the counts of one state."""

    findings: tuple[PoolFinding, ...]
    diagnosis: tuple[PoolDiagnosis, ...]
    groups: tuple[PoolGroup, ...]
    referenced: int
    requests_with_blocks: int
    #: checks left out for groups of a kind without a rule (`skipped_checks`), in words
    skipped: tuple[str, ...] = ()


def owners_of(state: VllmState, block: int, limit: int = MAX_OWNERS) -> tuple[BlockOwner, ...]:
    """Every table entry and deferred free holding `block` (the first `limit`)."""
    out = [
        BlockOwner(
            request=state.request_ids[int(state.table_request[i])],
            group=int(state.table_group[i]),
            index=int(state.table_index[i]),
        )
        for i in np.flatnonzero(state.table_block == block)[:limit]
    ]
    for i in np.flatnonzero(state.deferred_block == block)[: max(0, limit - len(out))]:
        r = int(state.deferred_request[i])
        out.append(
            BlockOwner(
                request=state.request_ids[r] if r >= 0 else "",
                group=None,
                index=None,
                holds="deferred",
            )
        )
    return tuple(out)


def queue_places(state: VllmState, block: int) -> tuple[int, ...]:
    """`block`'s places in the free queue from its head."""
    places = np.flatnonzero(state.free_queue == block)
    if state.shrunk is not None:
        places = state.shrunk.queue_at[places]
    return tuple(int(i) for i in places)


def tables_present(state: VllmState) -> np.ndarray:
    """`[groups, requests]`: the request has a table (an entry) in the group."""
    present = np.zeros((len(state.groups), len(state.request_ids)), dtype=bool)
    present[state.table_group, state.table_request] = True
    return present


def partial_requests(state: VllmState, present: np.ndarray | None = None) -> np.ndarray:
    """Per request: live, with a table in some groups and none in others (of the groups whose
    tables the dump records: not one with a pool of its own)."""
    present = tables_present(state) if present is None else present
    read = np.array([not g.own_pool for g in state.groups], dtype=bool)
    present = present[read]
    partial: np.ndarray = present.any(axis=0) & ~present.all(axis=0) & state.request_live
    return partial


def _first_disagreement(
    forward: np.ndarray,
    held: np.ndarray | None,
    back: np.ndarray | None,
    back_held: np.ndarray | None,
) -> int | None:
    """The first place where the free queue walked back disagrees with the walk forward
    (None: they agree), comparing the places both hold."""
    if back is None:
        return None
    if held is None and back_held is None and np.array_equal(forward, back):
        return None
    k = min(forward.size, back.size)
    differ = forward[:k] != back[:k]
    if held is not None:
        differ &= held[:k]
    if back_held is not None:
        differ &= back_held[:k]
    first = np.flatnonzero(differ)
    if first.size:
        return int(first[0])
    return None if forward.size == back.size else k


def _owner_text(owners: tuple[BlockOwner, ...], total: int) -> str:
    if not owners:
        return "no holder"
    shown = [
        f"request {o.request!r} (group {o.group}, index {o.index})"
        if o.holds == "table"
        else f"a deferred free of request {o.request!r}"
        for o in owners[:3]
    ]
    more = f" and {total - 3} more" if total > 3 else ""
    return "held by " + ", ".join(shown) + more


def _same_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise equality of two digest arrays `[n, D]` uint8 (8 bytes a compare when D allows)."""
    if a.shape[1] % 8 == 0:
        a = np.ascontiguousarray(a).view(np.uint64)
        b = np.ascontiguousarray(b).view(np.uint64)
    same: np.ndarray = (a == b).all(axis=1)
    return same


class _Audit:
    """One pass over a state: the shared arrays, then one method per invariant."""

    def __init__(self, state: VllmState) -> None:
        self.s = state
        n = state.num_blocks
        self.n = n
        self.findings: list[PoolFinding] = []
        tb = state.table_block
        self.table_ok = (tb >= 0) & (tb < n)
        q = state.free_queue
        self.queue_ok = q[(q >= 0) & (q < n)]
        self.queued_count = np.bincount(self.queue_ok, minlength=n)
        self.queued = self.queued_count > 0
        released = state.released_block
        self.released = np.zeros(n, dtype=bool)
        self.released[released[(released >= 0) & (released < n)]] = True
        null = state.null_block
        real = self.table_ok & (tb != null)
        self.real_entry = real
        held_entry = real.copy()
        held_entry[real] = ~self.released[tb[real]]
        db = state.deferred_block
        deferred_ok = db[(db >= 0) & (db < n) & (db != null)]
        self.holders = np.bincount(tb[held_entry], minlength=n) + np.bincount(
            deferred_ok, minlength=n
        )
        self.nonnull = np.ones(n, dtype=bool)
        if n:
            self.nonnull[null] = False
        # a shrunk dump: per-block invariants on the blocks whose state it holds
        self.known = state.known()
        self.checked = self.nonnull if self.known is None else self.nonnull & self.known

    def of_kept(self, mask: np.ndarray, blocks: np.ndarray | None = None) -> np.ndarray:
        """`mask` (over `blocks`, or over every block) where the block's state is held."""
        if self.known is None:
            return mask
        kept: np.ndarray = mask & (self.known if blocks is None else self.known[blocks])
        return kept

    # --- the story of a block ---------------------------------------------------------------

    def add(self, code: PoolCode, blocks: np.ndarray, what: str) -> None:
        """A finding over `blocks` (ascending, distinct), told from the first."""
        blocks = distinct(blocks)
        if blocks.size == 0:
            return
        s = self.s
        b = int(blocks[0])
        inside = 0 <= b < self.n
        owners = owners_of(s, b)
        places = queue_places(s, b)
        ref = int(s.ref_cnt[b]) if inside else None
        holders = int(self.holders[b]) if inside else None
        facts = [f"block {b}: {what}"]
        if inside:
            facts.append(f"ref_cnt {ref}, {plural(int(self.holders[b]), 'holder')}")
            facts.append(f"queued at {list(places)}" if places else "not queued")
        facts.append(_owner_text(owners, max(len(owners), holders or 0)))
        more = f" (and {blocks.size - 1} more blocks)" if blocks.size > 1 else ""
        self.findings.append(
            PoolFinding(
                code=code,
                message="; ".join(facts) + more,
                block=b,
                blocks=tuple(int(x) for x in blocks),
                owners=owners,
                queue_position=places[0] if places else None,
                ref_cnt=ref,
                holders=holders,
            )
        )

    def add_pool(self, code: PoolCode, message: str) -> None:
        """A pool-wide finding (no block)."""
        self.findings.append(PoolFinding(code=code, message=message))

    # --- the invariants ---------------------------------------------------------------------

    def ids_in_range(self) -> None:
        s, n = self.s, self.n
        sources = {
            "a table": s.table_block,
            "the free queue": s.free_queue,
            "the hash map": s.map_block,
            "the deferred frees": s.deferred_block,
            "the released blocks": s.released_block,
        }
        bad = {k: v[(v < 0) | (v >= n)] for k, v in sources.items()}
        every = np.concatenate(list(bad.values())) if bad else np.zeros(0, np.int64)
        where = ", ".join(k for k, v in bad.items() if v.size)
        self.add(PoolCode.BLOCK_OUT_OF_RANGE, every, f"outside the pool of {n} (in {where})")

    def queue(self) -> None:
        s = self.s
        walks = s.walks()
        forward, held, back, _ = walks
        if not s.queue_complete:
            self.add_pool(
                PoolCode.FREE_QUEUE_BROKEN,
                f"the walk from the head did not reach the tail sentinel in {self.n} steps: "
                "the links form a cycle",
            )
        elif back is not None and (at := _first_disagreement(*walks)) is not None:
            what = (
                f"the walk back by `prev` links ({back.size} blocks) disagrees with the walk "
                f"forward ({forward.size}) at place {at}"
            )
            where = forward[at : at + 1]
            if held is not None and not held[at : at + 1].all():
                where = where[:0]  # a shrunk dump that did not keep the place
            if where.size and 0 <= int(where[0]) < self.n:
                self.add(PoolCode.FREE_QUEUE_BROKEN, where, what)
            else:
                self.add_pool(PoolCode.FREE_QUEUE_BROKEN, what)
        dup = np.flatnonzero(self.of_kept(self.queued_count > 1))
        self.add(PoolCode.FREE_QUEUE_DUPLICATE, dup, "in the free queue more than once")
        if s.num_free_blocks != s.queue_length:
            self.add_pool(
                PoolCode.FREE_COUNT_MISMATCH,
                f"num_free_blocks is {s.num_free_blocks}, the queue holds {s.queue_length} blocks",
            )

    def references(self) -> None:
        ref, holders, queued, real = self.s.ref_cnt, self.holders, self.queued, self.checked
        self.add(PoolCode.NEGATIVE_REF_COUNT, np.flatnonzero(real & (ref < 0)), "negative ref_cnt")
        held = queued & real & ((holders > 0) | (ref > 0))
        self.add(PoolCode.QUEUED_BLOCK_HELD, np.flatnonzero(held), "on the free queue but held")
        settled = real & ~queued & (ref >= 0)
        self.add(
            PoolCode.REF_COUNT_LOW,
            np.flatnonzero(settled & (ref < holders)),
            "ref_cnt below its holders",
        )
        self.add(
            PoolCode.REF_COUNT_HIGH,
            np.flatnonzero(settled & (ref > holders)),
            "ref_cnt above its holders",
        )
        self.add(
            PoolCode.BLOCK_LEAKED,
            np.flatnonzero(settled & (ref == 0) & (holders == 0)),
            "neither free nor held",
        )

    def null_block(self) -> None:
        s = self.s
        null = s.null_block
        misplaced: list[str] = []
        if self.n and self.queued[null]:
            misplaced.append("on the free queue")
        entries = self.table_ok & (s.table_block == null)
        kinds = [g.kind for g in s.groups]
        full_kinds = np.array([k == FULL for k in kinds])
        windowed = np.array([k in _WINDOWED for k in kinds])
        in_full = entries & full_kinds[s.table_group]
        if in_full.any():
            misplaced.append("in a full-attention table")
        prev_null = np.zeros(entries.size, dtype=bool)
        prev_null[1:] = entries[:-1]
        not_leading = entries & windowed[s.table_group] & (s.table_index > 0) & ~prev_null
        if not_leading.any():
            misplaced.append("after a real block in a window's table")
        in_window = entries & windowed[s.table_group] & ~not_leading & self._in_window(entries)
        if in_window.any():
            misplaced.append("in place of a block its window still reads")
        outside_gap = self._outside_gap(entries)
        if outside_gap.any():
            misplaced.append(
                "in a reference sliding window's table outside the gap between its prompt and "
                "its window"
            )
        stateless = self._stateless(entries)
        if stateless.any():
            drafting = any(s.groups[g].speculative_blocks for g in s.table_group[stateless])
            aside = ", its scratch blocks aside" if drafting else ""
            misplaced.append(f"in every entry of a Mamba table{aside} (no state block kept)")
        if misplaced:
            bad = in_full | not_leading | in_window | outside_gap | stateless
            entry = int(np.flatnonzero(bad)[0]) if bad.any() else None
            where = (
                f"; first: request {s.request_ids[int(s.table_request[entry])]!r} (group "
                f"{int(s.table_group[entry])}, index {int(s.table_index[entry])})"
                if entry is not None
                else ""
            )
            self.findings.append(
                PoolFinding(
                    code=PoolCode.NULL_BLOCK_MISPLACED,
                    message=f"the null block {null} is " + " and ".join(misplaced) + where,
                    block=null,
                    blocks=(null,),
                    owners=owners_of(s, null) if entry is not None else (),
                    queue_position=(queue_places(s, null) or (None,))[0],
                )
            )

    def _processed(self, req: np.ndarray) -> np.ndarray:
        """Per request of `req`: its tokens processed, where the dump says which tokens in
        flight are its table's own (the stale share recorded); else its tokens computed (as
        many or more: a bound on what the manager freed on)."""
        s = self.s
        computed: np.ndarray = s.request_num_computed[req]
        flying, stale = s.request_num_in_flight, s.request_num_stale_in_flight
        if flying is not None and stale is not None:
            own = np.clip(flying[req] - np.maximum(stale[req], 0), 0, np.maximum(computed, 0))
            computed = computed - own
        return computed

    def _outside_gap(self, entries: np.ndarray) -> np.ndarray:
        """Per table entry: a null `entries` entry of a reference sliding window's table
        outside the blocks its manager drops: those wholly after the prompt's last block and
        before the block of the window's first token (the generated tokens less the window's,
        from the tokens processed), for a live request whose prompt the dump records."""
        s = self.s
        out = np.zeros(entries.size, dtype=bool)
        prompt = s.request_num_prompt
        at = np.flatnonzero(entries)
        if prompt is None or at.size == 0:
            return out
        req = s.table_request[at]
        known = s.request_live[req] & (prompt[req] > 0)
        for g, spec in enumerate(s.groups):
            if spec.kind != RSWA or spec.window is None or spec.window <= 0:
                continue
            mine = known & (s.table_group[at] == g)
            size = max(1, spec.block_size)
            first = -(-prompt[req][mine] // size)
            start = np.maximum(prompt[req][mine], self._processed(req[mine]) - spec.window)
            index = s.table_index[at][mine]
            out[at[mine]] = (index < first) | (index >= start // size)
        return out

    def _stateless(self, entries: np.ndarray) -> np.ndarray:
        """Per table entry: the first entry of a live request's Mamba table whose entries
        hold the null block only, its scratch blocks aside (a request keeps the state of its
        last computed token, a real block, whatever else its table has dropped; a speculative
        decoder's scratch blocks, the table's last `speculative_blocks` entries, are real
        whether or not that state is)."""
        s = self.s
        mamba = np.array([g.kind == MAMBA for g in s.groups])
        out = np.zeros(entries.size, dtype=bool)
        at = np.flatnonzero(mamba[s.table_group] & s.request_live[s.table_request])
        if at.size == 0:
            return out
        # one table per (group, request), wherever its entries lie
        key = s.table_group[at] * len(s.request_ids) + s.table_request[at]
        _, first, table, length = np.unique(
            key, return_index=True, return_inverse=True, return_counts=True
        )
        scratch = np.array([g.speculative_blocks for g in s.groups], dtype=np.int64)
        states = length - scratch[s.table_group[at[first]]]
        state_entry = s.table_index[at] < states[table]
        real = np.bincount(table, weights=~entries[at] & state_entry, minlength=first.size)
        out[at[first[(real == 0) & (states > 0)]]] = True
        return out

    def mamba_states(self) -> None:
        """A live request's Mamba table holds no more state blocks than its group's bound,
        plus one per block its tokens in flight reach (their states are freed once those
        tokens are processed)."""
        s = self.s
        bound = np.array(
            [g.max_states if g.kind == MAMBA and g.max_states else -1 for g in s.groups],
            dtype=np.int64,
        )
        at = np.flatnonzero(
            self.real_entry & (bound[s.table_group] > 0) & s.request_live[s.table_request]
        )
        if at.size == 0:
            return
        # one table per (group, request), wherever its entries lie
        key = s.table_group[at] * len(s.request_ids) + s.table_request[at]
        tables, first, counts = np.unique(key, return_index=True, return_counts=True)
        table_group = s.table_group[at[first]]
        table_request = s.table_request[at[first]]
        in_flight = np.zeros(tables.size, dtype=np.int64)
        flying = s.request_num_in_flight
        if flying is not None:
            sizes = np.array([max(1, g.block_size) for g in s.groups], dtype=np.int64)
            tokens = np.maximum(flying[table_request], 0)
            # (no table holds more than every entry: a count past that allows nothing more,
            # and a dump's huge one cannot overflow the sum)
            in_flight = np.minimum(-(-tokens // sizes[table_group]), at.size)
        allowed = bound[table_group] + in_flight
        over = np.flatnonzero(counts > allowed)
        if over.size == 0:
            return
        worst = over[0]
        entries = at[key == tables[worst]]
        group, request = int(table_group[worst]), int(table_request[worst])
        more = f" ({over.size} tables)" if over.size > 1 else ""
        flight = ""
        if flying is not None and in_flight[worst]:
            said = plural(int(flying[request]), "token")
            flight = f" with its {said} in flight ({int(bound[group])} without)"
        self.add(
            PoolCode.MAMBA_STATES_OVER_BOUND,
            s.table_block[entries],
            f"one of {entries.size} state blocks request {s.request_ids[request]!r} holds in "
            f"Mamba group {group} (indices {sorted(int(i) for i in s.table_index[entries])}); "
            f"its manager keeps at most {int(allowed[worst])}{flight}{more}",
        )

    def _in_window(self, entries: np.ndarray) -> np.ndarray:
        """Per table entry: a null `entries` entry of a windowed group whose block ends after
        the first token the window still reads (its request's computed tokens known: a live
        request with tokens; the group's window known). A step in flight reads the window of
        the tokens processed before it (vLLM's async scheduling frees on those): where the
        dump says which tokens in flight are the request's table's own (the stale share of a
        preempted request's old steps recorded), the window is the processed tokens'."""
        s = self.s
        out = np.zeros(entries.size, dtype=bool)
        at = np.flatnonzero(entries)
        if at.size == 0:
            return out
        req = s.table_request[at]
        known = s.request_live[req] & (s.request_num_tokens[req] > 0)
        computed = self._processed(req)
        for g, spec in enumerate(s.groups):
            keep_from = _WINDOWED.get(spec.kind)
            if keep_from is None or spec.window is None or spec.window <= 0:
                continue
            mine = known & (s.table_group[at] == g)
            first_read = keep_from(computed[mine], spec.window)
            block_end = (s.table_index[at][mine] + 1) * spec.block_size
            out[at[mine]] = block_end > first_read
        return out

    def groups(self) -> None:
        s = self.s
        real = self.real_entry
        tb, tg = s.table_block[real], s.table_group[real]
        first_group = np.full(self.n, -1, dtype=np.int64)
        first_group[tb] = tg
        self.add(
            PoolCode.BLOCK_IN_TWO_GROUPS,
            tb[tg != first_group[tb]],
            "in the tables of two groups",
        )
        hg = s.hash_group[tb]
        self.add(
            PoolCode.HASH_GROUP_FOREIGN,
            tb[self.of_kept((hg >= 0) & (hg != tg), tb)],
            "its hash names another group than the table holding it",
        )

    def hashes(self) -> None:
        s, n = self.s, self.n
        mb = s.map_block
        ok = (mb >= 0) & (mb < n)
        stale = np.zeros(mb.size, dtype=bool)
        inside = np.flatnonzero(ok)
        blocks = mb[inside]
        same = (s.hash_group[blocks] == s.map_group[inside]) & (blocks != s.null_block)
        if s.hash_digest.shape[1]:
            same &= _same_rows(s.hash_digest[blocks], s.map_digest[inside])
        stale[inside] = self.of_kept(~same, blocks)
        if s.extra_key_block.size and stale.any():
            stale[self._extra_keyed(np.flatnonzero(stale))] = False
        self.add(
            PoolCode.HASH_ENTRY_STALE,
            mb[stale],
            "a hash-map key points to it that it does not carry",
        )
        mapped = np.zeros(n, dtype=bool)
        mapped[blocks[same]] = True
        unmapped = (s.hash_group >= 0) & ~mapped & self.checked
        self.add(
            PoolCode.HASHED_BLOCK_UNMAPPED,
            np.flatnonzero(unmapped),
            "carries a hash no hash-map entry points to it under",
        )

    def _extra_keyed(self, entries: np.ndarray) -> np.ndarray:
        """Those of the map `entries` whose (block, key) is one of the block's extra keys."""
        s = self.s
        known = {
            (int(b), int(g), bytes(d))
            for b, g, d in zip(s.extra_key_block, s.extra_key_group, s.extra_keys(), strict=True)
        }
        keyed = [
            i
            for i in entries
            if (int(s.map_block[i]), int(s.map_group[i]), bytes(s.map_digest[i])) in known
        ]
        return np.array(keyed, dtype=np.int64)

    def requests(self) -> None:
        s = self.s
        g = len(s.groups)
        present = tables_present(s)
        self.requests_with_blocks = int(present.any(axis=0).sum())
        dead = ~s.request_live[s.table_request] & self.real_entry
        self.add(
            PoolCode.TABLE_OF_DEAD_REQUEST,
            s.table_block[dead],
            "in the table of a request the scheduler no longer has",
        )
        partial = partial_requests(s, present)
        if partial.any():
            req = int(np.flatnonzero(partial)[0])
            missing = [str(k) for k in range(g) if not present[k, req] and not s.groups[k].own_pool]
            names = [repr(s.request_ids[int(i)]) for i in np.flatnonzero(partial)[:5]]
            self.add_pool(
                PoolCode.REQUEST_MISSING_IN_GROUP,
                f"request {names[0]} has blocks in some groups and none in "
                f"{'group' if len(missing) == 1 else 'groups'} "
                f"{', '.join(missing)}"
                + (
                    f" ({int(partial.sum())} requests: {', '.join(names)})"
                    if partial.sum() > 1
                    else ""
                ),
            )


def _diagnosis(findings: list[PoolFinding]) -> tuple[PoolDiagnosis, ...]:
    by_cause: dict[PoolCause, list[PoolFinding]] = {}
    for f in findings:
        by_cause.setdefault(POOL_CAUSE_OF[f.code], []).append(f)
    out = []
    for cause in PoolCause:
        these = by_cause.get(cause)
        if not these:
            continue
        entry = POOL_CAUSES[cause]
        blocks = {b for f in these for b in f.blocks}
        out.append(
            PoolDiagnosis(
                cause=cause,
                summary=entry.summary,
                fix=entry.fix,
                story=f"{entry.summary}: {these[0].message}",
                findings=tuple(dict.fromkeys(f.code for f in these)),
                blocks=len(blocks),
            )
        )
    return tuple(out)


def audit(state: VllmState) -> PoolAudit:
    """Every invariant of `state`, checked: findings in catalog order, and the diagnosis."""
    a = _Audit(state)
    a.ids_in_range()
    a.queue()
    a.references()
    a.null_block()
    a.mamba_states()
    a.groups()
    a.hashes()
    a.requests()
    order = {code: i for i, code in enumerate(PoolCode)}
    findings = sorted(a.findings, key=lambda f: order[f.code])
    counts = np.bincount(state.table_group, minlength=len(state.groups))
    groups = tuple(
        PoolGroup(
            group=i,
            kind=g.kind,
            block_size=g.block_size,
            window=g.window,
            entries=int(counts[i]),
        )
        for i, g in enumerate(state.groups)
    )
    referenced = int(((state.ref_cnt > 0) & a.nonnull).sum())
    requests_with_blocks = a.requests_with_blocks
    if state.shrunk is not None:  # the original's counts
        referenced = state.shrunk.referenced
        requests_with_blocks = state.shrunk.requests_with_blocks
        groups = tuple(
            replace(g, entries=e) for g, e in zip(groups, state.shrunk.group_entries, strict=True)
        )
    return PoolAudit(
        findings=tuple(findings),
        diagnosis=_diagnosis(findings),
        groups=groups,
        referenced=referenced,
        requests_with_blocks=requests_with_blocks,
        skipped=skipped_checks(state.groups, prompts=state.request_num_prompt is not None),
    )
