"""A seeded random serving workload: which requests arrive when, with which prompt.

A workload is a list of `Arrival`s, nothing else: the scheduler loop (`soak.driver`) turns it
into prefills, chunks, decodes, window frees, retractions and evictions, and the random next
tokens come from the seed. Dropping arrivals gives a smaller workload of the same kind, which
is what shrinking (`soak.shrink`) does.

Prompts share prefixes on purpose: each draws a stem from a few shared ones (a system prompt,
a conversation's earlier turns) and adds a tail of its own, so the radix tree matches, splits
and tombstones nodes. A storage history's requests also come back, late, to early prompts
(`returns`): by then the host has often evicted them, and storage serves what it backed up.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

import numpy as np

#: SGLang's storage prefetch policies soak runs (`--hicache-storage-prefetch-policy`), in
#: turn: `best_effort` admits with what has landed, `wait_complete` waits for the whole read
#: (`timeout` reads the wall clock, which no seed fixes)
PREFETCH_POLICIES = ("best_effort", "wait_complete")
#: SGLang's HiCache write policies (`--hicache-write-policy`), in the order soak's histories
#: take them: backup on the first insert; on the second hit (SGLang's default); at eviction
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")

__all__ = ["Arrival", "Workload", "random_workload"]


@dataclass(frozen=True)
class Arrival:
    """One request: the scheduler step it arrives at, its prompt and its output length."""

    step: int
    prompt: tuple[int, ...]
    max_new_tokens: int
    #: the client aborts it this many steps after it arrives (0: in the step it arrives, while
    #: it waits; None: never): waiting, in chunked prefill or running, each the way SGLang's
    #: scheduler aborts there
    abort_after: int | None = None
    #: the client session it is a turn of (None: none). A session's turns, in arrival order,
    #: each continue the latest one that finished, as SGLang's `Session.create_req` builds a
    #: turn (that turn's prompt and output, then this prompt); a turn arrives at its step or,
    #: while the turn before it still runs or waits, the step after that one is over (a
    #: client sends its next turn once it has the reply)
    session: int | None = None


@dataclass(frozen=True)
class Workload:
    """Arrivals ordered by step, and the seed of the forward's random next tokens."""

    seed: int
    arrivals: tuple[Arrival, ...]
    #: scheduler steps to run (past the last arrival, so requests can finish)
    steps: int
    #: SGLang's SGLANG_OPT_RELEASE_PREFILL_SWA (0.5.13 - 0.5.21:
    #: SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW): a decode past the window drops the SWA
    #: part of its prefix's tree lock (`release_swa_prefix_lock`; `dec_swa_lock_only` before)
    release_prefill_swa: bool = False
    #: SGLang's SGLANG_SWA_EVICTION_INTERVAL: decode frees out-of-window SWA once this many
    #: tokens slid out (0: SGLang's default, 128, which outputs this short never reach)
    swa_eviction_interval: int = 0
    #: the allocators' `need_sort`, as SGLang sets it under prefill-decode disaggregation:
    #: a freed slot is staged (`release_pages`) and merged back sorted when an allocation runs
    #: short (`merge_and_sort_free`)
    need_sort: bool = False
    #: unified memory's lazy compaction (`--layout unified`; SGLang's default there, which
    #: SGLANG_DISABLE_LAZY_COMPACTION turns off): a freed physical page is left a hole, taken
    #: back from the free end or compacted later
    lazy_compaction: bool = False
    #: every request's `ignore_eos`: True, fixed-length requests, whose whole output the
    #: prefill adder reserves; False, requests that may stop early, whose rest it estimates at
    #: the new-token ratio, as for a server's usual requests. Here they run to their length
    #: (the forward never samples a stop token), so decode outgrows the estimate and retracts
    ignore_eos: bool = True
    #: SGLang's --mamba-max-states-per-path (None: not set, SGLang's unlimited): after each
    #: insert the tree drops the Mamba states of a path's shallowest nodes past the cap and
    #: keeps the nodes (a Mamba state evicted from a node that stays)
    mamba_max_states_per_path: int | None = None
    #: SGLang's host tier (`--enable-hierarchical-cache`) under this write policy
    #: (`--hicache-write-policy`, one of `soak.hicache.WRITE_POLICIES`); None: no host tier
    hicache_write_policy: str | None = None
    #: the extra buffer's ping-pong track slots per request (`--layout mamba-extra`: 2, as
    #: SGLang sizes it for its overlapped scheduler, or 1; None: no extra buffer)
    mamba_track_slots: int | None = None
    #: the sessions are streaming ones (`--enable-streaming-session`): each keeps its turn's
    #: request pool row, KV and prefix lock between turns, until a turn aborts or the session
    #: closes (soak closes it once its last turn is over: `soak.sessions`)
    streaming_sessions: bool = False
    #: SGLang's radix sessions (`--enable-session-radix-cache`) on the sessions, which are
    #: client ones: a finished turn tags the tree nodes its insert ended on with its session,
    #: which the tree then evicts last, and closing the session drops the tags
    #: (`release_radix_session`); they hold no row, no lock and no KV outside the tree
    radix_sessions: bool = False
    #: the host tier's storage tier behind it (`--hicache-storage`: SGLang's file backend in a
    #: folder of soak's, `soak.storage`) under this prefetch policy
    #: (`--hicache-storage-prefetch-policy`, one of `PREFETCH_POLICIES`); None: no storage
    #: tier. Only with `hicache_write_policy`
    hicache_storage: str | None = None
    #: SGLang's overlapped scheduler loop (its default; `soak.driver`): each step chooses and
    #: allocates the next batch before the last batch's result is processed
    overlap: bool = False
    #: with `overlap`, SGLang's SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP: a prefill batch
    #: after a prefill batch waits for the last one's result before it runs
    consecutive_prefill_sync: bool = False
    #: with `overlap` and the extra buffer (two track slots, as SGLang sizes them overlapped),
    #: SGLang's lazy strategy (`--mamba-radix-cache-strategy extra_buffer_lazy`, which it
    #: refuses without the overlapped scheduler): a request holds one track slot, and takes
    #: the second only for a decode at a track boundary, until that decode's result
    mamba_lazy: bool = False

    def without(self, keep: list[int]) -> Workload:
        """The workload with only the arrivals at the indices `keep`."""
        arrivals = tuple(self.arrivals[i] for i in keep)
        return replace(self, arrivals=arrivals)

    def to_json(self) -> str:
        """The workload as JSON (a reproducer file); the overlapped loop's switches only where
        it is on (other files stay as they were)."""
        overlapped = (
            {"overlap": True, "consecutive_prefill_sync": self.consecutive_prefill_sync}
            if self.overlap
            else {}
        )
        if self.mamba_lazy:
            overlapped["mamba_lazy"] = True
        return json.dumps(
            {
                "seed": self.seed,
                "steps": self.steps,
                "arrivals": [_arrival_json(a) for a in self.arrivals],
                "release_prefill_swa": self.release_prefill_swa,
                "swa_eviction_interval": self.swa_eviction_interval,
                "need_sort": self.need_sort,
                "lazy_compaction": self.lazy_compaction,
                "ignore_eos": self.ignore_eos,
                "mamba_max_states_per_path": self.mamba_max_states_per_path,
                "hicache_write_policy": self.hicache_write_policy,
                "mamba_track_slots": self.mamba_track_slots,
                "streaming_sessions": self.streaming_sessions,
                "radix_sessions": self.radix_sessions,
                "hicache_storage": self.hicache_storage,
                **overlapped,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Workload:
        """Read a workload `to_json` wrote."""
        data = json.loads(text)
        arrivals = tuple(
            Arrival(
                int(a["step"]),
                tuple(int(t) for t in a["prompt"]),
                int(a["max_new_tokens"]),
                _abort_after(a.get("abort_after")),
                _session(a.get("session")),  # absent in files before sessions
            )
            for a in data["arrivals"]
        )
        release = data.get("release_prefill_swa", False)
        interval = data.get("swa_eviction_interval", 0)
        need_sort = data.get("need_sort", False)
        lazy = data.get("lazy_compaction", False)
        ignore_eos = data.get("ignore_eos", True)
        path_cap = data.get("mamba_max_states_per_path")  # absent in files before the cap
        policy = data.get("hicache_write_policy")  # absent in files before the host tier
        if policy is not None and policy not in WRITE_POLICIES:
            raise TypeError("an unknown HiCache write policy")
        track = data.get("mamba_track_slots")  # absent in files before the extra buffer
        streaming = data.get("streaming_sessions", False)  # absent in files before them
        radix = data.get("radix_sessions", False)  # absent in files before them
        storage = data.get("hicache_storage")  # absent in files before the tier
        if storage is not None and (storage not in PREFETCH_POLICIES or policy is None):
            raise TypeError("an unknown storage prefetch policy, or one without a host tier")
        overlap = data.get("overlap", False)  # absent where it is off
        sync = data.get("consecutive_prefill_sync", False)
        mamba_lazy = data.get("mamba_lazy", False)  # absent where it is off
        flags = (release, need_sort, lazy, ignore_eos, streaming, radix, overlap, sync, mamba_lazy)
        if (
            not all(isinstance(flag, bool) for flag in flags)
            or type(interval) is not int
            or interval < 0
            or (path_cap is not None and (type(path_cap) is not int or path_cap < 1))
            or (track is not None and (type(track) is not int or track not in (1, 2)))
            or (mamba_lazy and not (overlap and track == 2))
        ):
            raise TypeError("a serving knob out of range")
        steps = int(data["steps"])
        return cls(
            int(data["seed"]),
            arrivals,
            steps,
            release,
            interval,
            need_sort,
            lazy,
            ignore_eos,
            path_cap,
            policy,
            track,
            streaming,
            radix,
            storage,
            overlap,
            sync,
            mamba_lazy,
        )


def _arrival_json(arrival: Arrival) -> dict[str, object]:
    """An arrival's fields, without `session` where it has none (files stay as they were)."""
    fields = asdict(arrival)
    if arrival.session is None:
        del fields["session"]
    return fields


def _session(value: object) -> int | None:
    if value is not None and (type(value) is not int or value < 0):
        raise TypeError("session is not null or a session number")
    return value


def _abort_after(value: object) -> int | None:
    if value is not None and (type(value) is not int or value < 0):
        raise TypeError("abort_after is not null or a step count")
    return value


#: The share of sessions' later turns the client aborts (where the workload has aborts).
SESSION_TURN_ABORTS = 0.5

#: Token ids of prompts and outputs (a small vocabulary: outputs repeat prompts' prefixes too).
VOCAB = 64

#: The shortest early prompt a return comes back to: past the storage tier's prefetch
#: threshold (`soak.storage.PREFETCH_THRESHOLD`, 8 tokens) and a page of 16, so what storage
#: holds of it is long enough to read.
RETURN_MIN = 24


def random_workload(
    seed: int,
    *,
    steps: int,
    requests: int,
    max_prompt: int,
    max_new: int,
    aborts: float = 0.0,
    release_prefill_swa: bool = False,
    swa_eviction_interval: int = 0,
    need_sort: bool = False,
    lazy_compaction: bool = False,
    ignore_eos: bool = True,
    mamba_max_states_per_path: int | None = None,
    mamba_track_slots: int | None = None,
    abort_within: int | None = None,
    warmups: bool = False,
    warmup_grid: int = 16,
    sessions: int = 0,
    hicache_write_policy: str | None = None,
    streaming_sessions: bool = False,
    radix_sessions: bool = False,
    returns: int = 0,
) -> Workload:
    """`requests` arrivals over the first 3/4 of `steps`, prompts up to `max_prompt` tokens
    sharing a few stems, outputs up to `max_new` tokens; a share `aborts` of them aborted a
    few steps after they arrive (drawn apart: the arrivals are those of `aborts=0`), within
    `abort_within` steps (default: twice `max_new`). With `warmups`, the earliest request
    sharing each stem's first `warmup_grid` tokens has a warm-up come just before it, in the
    same step: those tokens alone, one output token (a client caching a system prompt). The
    warm-up finishes in its prefill, where the other request's first chunk may end, so that
    chunk's checkpoint finds its node already holding a Mamba state. With `sessions`, that
    many of the drawn requests each open a client session, continued by one or two later
    turns (`_open_sessions`), drawn apart: the other arrivals and their aborts are those
    drawn without; with `aborts`, half the later turns are aborted after they arrive, within
    twice `abort_within` steps (never at once: a turn aborted before its first round never
    matched). With `streaming_sessions` the sessions are streaming ones; with `radix_sessions`
    client ones under SGLang's radix sessions. With `returns`, that many requests come back
    late to an early request's prompt (`_returns`), drawn apart: the other arrivals are those
    drawn without."""
    rng = np.random.default_rng(seed)
    stems = [
        tuple(int(t) for t in rng.integers(1, VOCAB, size=int(rng.integers(4, max_prompt))))
        for _ in range(int(rng.integers(1, 4)))
    ]
    arrivals = []
    shared: list[tuple[int, ...]] = []  # the stem part of each prompt
    last = max(1, steps * 3 // 4)
    for _ in range(requests):
        stem = stems[int(rng.integers(len(stems)))] if rng.random() < 0.7 else ()
        cut = int(rng.integers(0, len(stem) + 1))
        tail_len = int(rng.integers(1, max(2, max_prompt - cut)))
        tail = tuple(int(t) for t in rng.integers(1, VOCAB, size=tail_len))
        prompt = (stem[:cut] + tail)[:max_prompt]
        shared.append(stem[: min(cut, len(prompt))])
        arrivals.append(
            Arrival(int(rng.integers(0, last)), prompt, int(rng.integers(1, max_new + 1)))
        )
    later = _open_sessions(arrivals, seed, sessions, max_prompt + max_new, max_new)
    if warmups:
        first: dict[tuple[int, ...], int] = {}  # a stem's first chunk: its earliest sharer
        for i, stem in enumerate(shared):
            key = stem[:warmup_grid]
            if len(key) < warmup_grid:
                continue
            if key not in first or arrivals[i].step < arrivals[first[key]].step:
                first[key] = i
        warmed = set(first.values())
        arrivals = [
            one
            for i, arrival in enumerate(arrivals)
            for one in (
                [Arrival(arrival.step, shared[i][:warmup_grid], 1), arrival]
                if i in warmed
                else [arrival]
            )
        ]
    if aborts > 0:
        within = max(2, abort_within or 2 * max_new)
        draw = np.random.default_rng([seed, 0xAB0])
        arrivals = [
            replace(a, abort_after=0 if draw.random() < 1 / 3 else int(draw.integers(1, within)))
            if draw.random() < aborts
            else a
            for a in arrivals
        ]
        # half the later turns, drawn apart: a user who gives up on a follow-up waiting
        draw = np.random.default_rng([seed, 0x5E55, 0xAB0])
        later = [
            replace(a, abort_after=int(draw.integers(1, 2 * within)))
            if draw.random() < SESSION_TURN_ABORTS
            else a
            for a in later
        ]
    arrivals += later
    arrivals += _returns(arrivals, seed, returns, steps, max_prompt, max_new)
    arrivals.sort(key=lambda a: a.step)
    return Workload(
        seed,
        tuple(arrivals),
        steps,
        release_prefill_swa,
        swa_eviction_interval,
        need_sort,
        lazy_compaction,
        ignore_eos,
        mamba_max_states_per_path,
        hicache_write_policy,
        mamba_track_slots,
        streaming_sessions,
        radix_sessions,
    )


def _open_sessions(
    arrivals: list[Arrival], seed: int, sessions: int, room: int, max_new: int
) -> list[Arrival]:
    """Make `sessions` of `arrivals` (in place) the first turns of as many client sessions,
    and return their later turns: one or two each, a few new tokens of prompt and an output,
    a few steps apart (a lower bound: a turn waits for the one before it). A session's whole
    conversation, every turn's prompt and output, stays within `room` tokens (the longest
    request drawn alone), so it fits the pool as any request does."""
    if sessions <= 0:
        return []
    draw = np.random.default_rng([seed, 0x5E55])
    fits = [i for i, a in enumerate(arrivals) if len(a.prompt) + a.max_new_tokens + 2 <= room]
    chosen = sorted(int(i) for i in draw.permutation(fits)[:sessions])
    later = []
    for number, i in enumerate(chosen):
        turn = arrivals[i] = replace(arrivals[i], session=number)
        used = len(turn.prompt) + turn.max_new_tokens
        step = turn.step
        for _ in range(int(draw.integers(1, 3))):
            if room - used < 2:
                break
            tail = int(draw.integers(1, min(8, room - used - 1) + 1))
            new = int(draw.integers(1, min(max_new, room - used - tail) + 1))
            step += int(draw.integers(1, 6))
            prompt = tuple(int(t) for t in draw.integers(1, VOCAB, size=tail))
            later.append(Arrival(step, prompt, new, session=number))
            used += tail + new
    return later


def _returns(
    arrivals: list[Arrival], seed: int, returns: int, steps: int, max_prompt: int, max_new: int
) -> list[Arrival]:
    """`returns` requests that come back, after every drawn arrival, to the prompt of a request
    that arrived in the first quarter of the history (never aborted, no session, at least
    `RETURN_MIN` tokens) and add a tail of their own: by then the host tier has evicted much of
    what came early, and the storage tier, which took its backups, still holds it (a user who
    comes back to an old conversation). None where no early request qualifies."""
    if returns <= 0:
        return []
    draw = np.random.default_rng([seed, 0x57E3])
    last = max(1, steps * 3 // 4)
    early = [
        a
        for a in arrivals
        if a.step < last // 3
        and a.abort_after is None
        and a.session is None
        and len(a.prompt) >= RETURN_MIN
    ]
    if not early:
        return []
    back = []
    for _ in range(returns):
        old = early[int(draw.integers(len(early)))]
        tail = tuple(int(t) for t in draw.integers(1, VOCAB, size=int(draw.integers(1, 9))))
        prompt = old.prompt[: max_prompt - len(tail)] + tail
        step = int(draw.integers(last, last + max(1, (steps - last) // 2)))
        back.append(Arrival(step, prompt, int(draw.integers(1, max_new + 1))))
    return back
