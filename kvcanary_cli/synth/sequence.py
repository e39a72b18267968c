"""Synthetic dump sequences: one rank's serving state every few forward steps, with at most one
planted event, for `kvcanary timeline` (`kvcanary synth NAME --steps K -o DIR`).

A small serving loop runs on the allocator simulation `synth.state` builds one state with
(`synth.allocator`, docs/semantics.md §2-§3), step by step: pool rows handed out last-freed
first and left stale when freed; full-pool pages from a first-in first-out free list (page 0
reserved); radix-shared prefixes as refcounted whole pages (full-pool sequences); every running
request decoding one
token per step and new requests prefilled in the step they arrive; and, with an SWA window,
each full page mapped to an SWA page in lockstep when allocated, its SWA page freed (its LUT
entries cleared) once the whole page lies behind the window, before the chain predecessor.
Every `every` steps it takes a snapshot: the batch as `launch_canary_plan_kernels` sees it,
both free lists, the LUT and the held full slots, with `rank` and `step` in the metadata.

One request (the *victim*) is pinned: it runs through the whole sequence, long enough to leave
an SWA page behind the window every step. At the event step one request arrives that is also
pinned (the *newcomer*). Both happen in every sequence, so a clean twin (`clean` for the
full-pool events, `clean-swa` for the SWA ones, same seed and steps) runs the very same loop,
and differs from the event's sequence only by the plant:

- `DOUBLE_ALLOCATION`: the newcomer's first page is one of the victim's pages (not its first),
  handed out again while the victim holds it; the page it should have had stays free;
- `USE_AFTER_FREE`: one of the victim's complete pages goes back on the free list while the
  victim still holds it;
- `PREFIX_REWRITTEN`: one of the victim's complete pages is swapped, in its row, for a page
  fresh from the free list; the old page is neither freed nor held by anyone (orphaned), and
  every dump on its own is clean;
- `LUT_REWRITTEN`: the SWA mapping of the victim's newest page, in its window, moves to another
  SWA page (the old one freed, pages still in lockstep: no single dump shows it);
- `SWA_LEAK`: from the event step on, the first SWA page the window leaves behind each step has
  its LUT entries cleared but is never freed: the leak grows a page per eviction.

The truth (the event, its step, the first dump that shows it, the slots or pages, the owners)
is in every dump's metadata (`kvcanary.planted_event`, JSON). Work is per request and per page
(numpy slices), never per token, and the snapshots share the loop's arrays: each must be saved
before the next is taken (`synth_sequence` yields them one at a time).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from kvcanary_cli.catalog import EventKind
from kvcanary_cli.dump.files import write_all_atomically
from kvcanary_cli.errors import OptionError
from kvcanary_cli.option_values import checked_choice
from kvcanary_cli.synth.allocator import FullPool, RowPool, SwaPool, page_slots, slots_at
from kvcanary_cli.synth.state import SynthDump, SynthSpec

__all__ = [
    "EVENTS",
    "PLANTED_KEY",
    "SEQUENCES",
    "SEQUENCE_KEY",
    "SEQUENCE_SIZES",
    "SequenceKind",
    "SequenceShape",
    "dump_name",
    "sequence_lines",
    "synth_sequence",
    "twin_of",
    "write_sequence",
]

#: Metadata keys of a sequence's dumps: the planted event (JSON), and where the dump sits.
PLANTED_KEY = "kvcanary.planted_event"
SEQUENCE_KEY = "kvcanary.sequence"
#: The event classes a sequence can plant (the names `kvcanary timeline` reports them by).
EVENTS: tuple[EventKind, ...] = tuple(EventKind)


@dataclass(frozen=True, kw_only=True)
class SequenceShape:
    """Table shape and traffic of a sequence size."""

    max_reqs: int
    max_seq_len: int
    #: requests the loop keeps running (arrivals refill it up to this).
    running: int
    max_prompt: int
    #: full-pool slots (None: enough for every row to be full, and some spare).
    pool_slots: int | None = None
    padding_rows: int = 1
    #: the SWA window of the SWA sequences.
    window: int = 8
    finish_prob: float = 0.15
    share_prob: float = 0.4
    max_arrivals: int = 2
    #: requests started and finished before the first step (stale rows, a shuffled free list).
    history: int = 8


SEQUENCE_SIZES: dict[str, SequenceShape] = {
    "tiny": SequenceShape(max_reqs=12, max_seq_len=64, running=4, max_prompt=24),
    "small": SequenceShape(
        max_reqs=64,
        max_seq_len=512,
        running=24,
        max_prompt=300,
        window=64,
        padding_rows=2,
        finish_prob=0.08,
        max_arrivals=4,
        history=48,
    ),
    # the benchmark's shape: a 2049 x 32772 table (268 MB), a 4 M-slot pool, 256 requests
    "medium": SequenceShape(
        max_reqs=2049,
        max_seq_len=32772,
        running=256,
        max_prompt=16384,
        pool_slots=1 << 22,
        padding_rows=8,
        window=4096,
        finish_prob=0.02,
        share_prob=0.3,
        max_arrivals=8,
        history=512,
    ),
}


@dataclass(frozen=True, kw_only=True)
class SequenceKind:
    """A named sequence: the event it plants (None: clean) and the pools it runs."""

    name: str
    summary: str
    event: EventKind | None
    swa: bool


SEQUENCES: dict[str, SequenceKind] = {
    kind.name: kind
    for kind in (
        SequenceKind(
            name="clean",
            summary="full pool, radix-shared prefixes, requests arriving and finishing",
            event=None,
            swa=False,
        ),
        SequenceKind(
            name=EventKind.DOUBLE_ALLOCATION,
            summary="a page of a running request handed to a new one (no free in between)",
            event=EventKind.DOUBLE_ALLOCATION,
            swa=False,
        ),
        SequenceKind(
            name=EventKind.USE_AFTER_FREE,
            summary="a page of a running request put back on the free list",
            event=EventKind.USE_AFTER_FREE,
            swa=False,
        ),
        SequenceKind(
            name=EventKind.PREFIX_REWRITTEN,
            summary="a written page of a running request swapped for a fresh one, the old "
            "one orphaned",
            event=EventKind.PREFIX_REWRITTEN,
            swa=False,
        ),
        SequenceKind(
            name="clean-swa",
            summary="an SWA model: pages mapped in lockstep, freed once behind the window",
            event=None,
            swa=True,
        ),
        SequenceKind(
            name=EventKind.LUT_REWRITTEN,
            summary="the SWA mapping of a live in-window page moved to another SWA page",
            event=EventKind.LUT_REWRITTEN,
            swa=True,
        ),
        SequenceKind(
            name=EventKind.SWA_LEAK,
            summary="SWA pages left behind the window unmapped but never freed, one a step",
            event=EventKind.SWA_LEAK,
            swa=True,
        ),
    )
}


def twin_of(name: str) -> str:
    """The clean sequence that runs the same loop as `name` without its event."""
    return "clean-swa" if SEQUENCES[name].swa else "clean"


def sequence_lines() -> list[str]:
    """One line per sequence for `synth --list`: name, summary, and its clean twin."""
    width = max(len(name) for name in SEQUENCES)
    return [
        f"{name:<{width}}  {kind.summary}"
        + ("" if kind.event is None else f"  [twin: {twin_of(name)}]")
        for name, kind in SEQUENCES.items()
    ]


def dump_name(rank: int, step: int) -> str:
    """A sequence dump's file name: the capture hook's (`kvcanary-rank0-step000012...`)."""
    return f"kvcanary-rank{rank}-step{step:06d}.safetensors"


@dataclass(kw_only=True)
class _Request:
    row: int
    #: full pages in position order.
    pages: np.ndarray
    #: cells [0, length) of the row hold the request's slots (this step's writes included).
    length: int
    prefix: int = 0
    extend: int = 0
    pinned: bool = False
    #: per full page: its SWA page (0: unmapped, i.e. behind the window and freed).
    swa: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: leading full pages whose SWA page went back (or leaked).
    evicted: int = 0


@dataclass(frozen=True, kw_only=True)
class _Plan:
    name: str
    event: EventKind | None
    swa: bool
    steps: int
    every: int
    #: the forward step the event happens at (and the newcomer arrives at).
    at: int
    page: int


class _Loop:
    """The serving loop of one sequence."""

    def __init__(self, shape: SequenceShape, plan: _Plan, seed: int) -> None:
        self.shape, self.plan = shape, plan
        self.rng = np.random.default_rng(seed)
        # the plant's own draws: the clean twin's loop draws exactly the same numbers
        self.plant_rng = np.random.default_rng(seed + 7_919)
        p = plan.page
        row_pages = math.ceil(shape.max_seq_len / p)
        if shape.pool_slots is not None:
            full_pages = math.ceil(shape.pool_slots / p)
        else:
            full_pages = (shape.max_reqs - 1) * row_pages + 1 + math.ceil(16 / p)
        self.full = FullPool(full_pages, p, self.rng)
        self.rows = RowPool(shape.max_reqs, shape.max_seq_len)
        self.table = self.rows.table
        self.running: list[_Request] = []
        self.window = shape.window if plan.swa else 0
        total = plan.steps * plan.every
        if plan.swa:
            per_request = math.ceil((self.window + 1) / p) + 3
            swa_pages = (
                shape.running * per_request
                + (shape.max_arrivals + 1) * math.ceil(shape.max_prompt / p)
                + total
                + 8
            )
            self.swa = SwaPool(swa_pages, self.full.num_slots, p, self.rng)
        #: longest request that still fits its row through every step of the sequence.
        self.room = shape.max_seq_len - total - 2
        #: the victim's shortest length: pages older than a dump and, with a window, beyond it.
        self.low = self.window + 3 * p + plan.every
        if plan.swa and plan.every + 2 > self.window:
            raise OptionError(
                f"dumps every {plan.every} steps skip past the window of {self.window} tokens "
                "(take --every below it)",
                option="every",
            )
        if self.room < self.low + p:
            raise OptionError(
                f"{plan.steps} dumps every {plan.every} steps do not fit a row of "
                f"{shape.max_seq_len} (size too small: take fewer steps or a larger --size)",
                option="steps",
            )
        self.truth: dict[str, object] = {"event": plan.event}
        self.leaked: list[tuple[int, int]] = []
        self.victim: _Request | None = None
        self.newcomer: _Request | None = None
        #: the victim's length at the last snapshot.
        self.victim_seen = 0

    # --- pages -----------------------------------------------------------------------------

    def slots(self, request: _Request, start: int, stop: int) -> np.ndarray:
        return slots_at(request.pages, start, stop, self.plan.page)

    def map_pages(self, request: _Request, first: int) -> None:
        """Give full pages `first..` of the request SWA pages, in lockstep."""
        if not self.plan.swa:
            return
        swa = self.swa.map(request.pages[first:])
        request.swa = np.concatenate([request.swa[:first], swa])

    def unmap(self, request: _Request, start: int, stop: int, t: int | None = None) -> None:
        """Free the SWA pages of full pages `[start, stop)` of the request (the leak plant keeps
        the first one of each step it runs at)."""
        if not self.plan.swa or stop <= start:
            return
        pages, swa = request.pages[start:stop], request.swa[start:stop]
        mapped = swa > 0
        self.swa.clear(pages[mapped])
        freed = swa[mapped]
        if t is not None and freed.size and self._leaks_at(t):
            self.leaked.append((t, int(freed[0])))
            freed = freed[1:]
        self.swa.release(freed)
        request.swa[start:stop] = 0

    def _leaks_at(self, t: int) -> bool:
        return (
            self.plan.event == EventKind.SWA_LEAK
            and t >= self.plan.at
            and not any(step == t for step, _ in self.leaked)
        )

    # --- requests --------------------------------------------------------------------------

    def start(self, length: int, *, share: bool = True, pinned: bool = False) -> _Request:
        p = self.plan.page
        row = self.rows.take()
        shared = 0
        donor = None
        sharing = share and not self.plan.swa and self.running
        if sharing and self.rng.random() < self.shape.share_prob:
            donor = self.running[int(self.rng.integers(len(self.running)))]
            # only a cached prefix is shared: not the pages a request writes this step
            whole = min(donor.prefix // p, (length - 1) // p)
            shared = int(self.rng.integers(0, whole + 1)) if whole > 0 else 0
            if donor.pinned:
                # The victim keeps its last cached page to itself: an event needs one of its
                # complete pages unshared (the draw is kept, so other sequences do not change).
                shared = max(0, min(shared, donor.prefix // p - 1))
        own = self.full.alloc(math.ceil(length / p) - shared)
        pages = own
        if donor is not None:
            self.full.hold(donor.pages[:shared])
            pages = np.concatenate([donor.pages[:shared], own])
        request = _Request(row=row, pages=pages, length=length, pinned=pinned)
        request.prefix, request.extend = shared * p, length - shared * p
        self.table[row, :length] = self.slots(request, 0, length)
        self.map_pages(request, 0)
        self.running.append(request)
        return request

    def finish(self, request: _Request) -> None:
        self.running.remove(request)
        self.unmap(request, request.evicted, request.pages.size)
        self.full.release(request.pages)
        self.rows.give_back(request.row)

    def decode(self, request: _Request) -> None:
        p = self.plan.page
        request.prefix, request.extend = request.length, 1
        if request.length % p == 0:
            new = self.full.alloc(1)
            request.pages = np.concatenate([request.pages, new])
            self.map_pages(request, request.pages.size - 1)
        request.length += 1
        self.table[request.row, request.length - 1] = self.slots(
            request, request.length - 1, request.length
        )[0]

    def evict(self, request: _Request, t: int | None) -> None:
        """SWA pages wholly behind the window and its chain predecessor go back."""
        if not self.plan.swa:
            return
        p = self.plan.page
        behind = max(0, request.prefix - self.window - 1) // p
        if behind > request.evicted:
            self.unmap(request, request.evicted, behind, t)
            request.evicted = behind

    def prompt(self) -> int:
        return int(self.rng.integers(1, min(self.shape.max_prompt, self.room) + 1))

    # --- the loop --------------------------------------------------------------------------

    def warm_up(self) -> None:
        shape = self.shape
        for _ in range(shape.history):
            if len(self.running) >= shape.running or (self.running and self.rng.random() < 0.5):
                self.finish(self.running[int(self.rng.integers(len(self.running)))])
            self.settle(self.start(self.prompt()))
        while len(self.running) > shape.running - 1:
            self.finish(self.running[int(self.rng.integers(len(self.running)))])
        length = int(self.plant_rng.integers(self.low, self.room + 1))
        self.victim = self.start(length, share=False, pinned=True)
        self.settle(self.victim)
        while len(self.running) < shape.running:
            self.settle(self.start(self.prompt()))

    def settle(self, request: _Request) -> None:
        """A request of the initial state: its whole length is cached, its window mapped."""
        request.prefix, request.extend = request.length, 0
        self.evict(request, None)

    def forward(self, t: int) -> None:
        shape = self.shape
        for request in list(self.running):
            full = request.length + 1 >= shape.max_seq_len
            if not request.pinned and (full or self.rng.random() < shape.finish_prob):
                self.finish(request)
        for request in self.running:
            self.decode(request)
        arrivals = min(shape.max_arrivals, shape.running - len(self.running), len(self.rows))
        for _ in range(max(arrivals, 0)):
            self.start(self.prompt())
        if t == self.plan.at:
            self.arrive_newcomer()
        for request in self.running:
            self.evict(request, t)
        if t == self.plan.at:
            self.plant()

    def arrive_newcomer(self) -> None:
        if not self.rows:
            self.finish(next(r for r in self.running if not r.pinned))
        length = int(self.plant_rng.integers(self.plan.page, min(self.shape.max_prompt, 16) + 1))
        length = max(1, min(length, self.room))
        self.newcomer = self.start(length, share=False, pinned=True)
        if self.plan.event == EventKind.DOUBLE_ALLOCATION:
            self._double_allocate(self.newcomer)

    def _victim_page(self) -> int:
        """Index of one of the victim's unshared pages (not its first) that was complete at
        the dump before."""
        victim = self.victim
        assert victim is not None
        complete = self.victim_seen // self.plan.page
        choices = [j for j in range(1, complete) if self.full.refcount[victim.pages[j]] == 1]
        if not choices:
            raise RuntimeError("the victim holds no complete unshared page")
        return choices[int(self.plant_rng.integers(len(choices)))]

    def _hit(self, request: _Request, page: int, positions: np.ndarray, **more: object) -> None:
        """Record in the truth that the plant hit full page `page` at `positions` of the
        request's row (all within one of its pages)."""
        p = self.plan.page
        self.truth.update(
            space="full",
            slots=(page * p + positions % p).tolist(),
            pages=[page],
            pool_row=request.row,
            positions=positions.tolist(),
            **more,
        )

    def _double_allocate(self, newcomer: _Request) -> None:
        victim = self.victim
        assert victim is not None
        p = self.plan.page
        j = self._victim_page()
        page = int(victim.pages[j])
        self.full.undo(newcomer.pages[:1])  # the page it should have had
        newcomer.pages = newcomer.pages.copy()
        newcomer.pages[0] = page
        self.full.hold(newcomer.pages[:1])
        held = min(p, newcomer.length)
        self.table[newcomer.row, :held] = self.slots(newcomer, 0, held)
        self._hit(
            victim,
            page,
            j * p + np.arange(held),
            other_pool_row=newcomer.row,
            other_positions=list(range(held)),
        )

    def plant(self) -> None:
        victim = self.victim
        assert victim is not None
        p = self.plan.page
        event = self.plan.event
        if event == EventKind.USE_AFTER_FREE:
            j = self._victim_page()
            page = int(victim.pages[j])
            self.full.free.free(np.array([page], dtype=np.int64))  # still held: not released
            self._hit(victim, page, j * p + np.arange(p))
        elif event == EventKind.PREFIX_REWRITTEN:
            j = self._victim_page()
            old, new = int(victim.pages[j]), int(self.full.alloc(1)[0])
            victim.pages = victim.pages.copy()
            victim.pages[j] = new
            self.full.forget(np.array([old], dtype=np.int64))  # neither freed nor held: orphaned
            self.table[victim.row, j * p : (j + 1) * p] = self.slots(victim, j * p, (j + 1) * p)
            self._hit(
                victim,
                new,
                j * p + np.arange(p),
                old_slots=(old * p + np.arange(p)).tolist(),
                old_pages=[old],
                old_fate="orphaned",
            )
        elif event == EventKind.LUT_REWRITTEN:
            j = (self.victim_seen - 1) // p  # a page the dump before shows, still in the window
            old = int(victim.swa[j])
            if old == 0:
                raise RuntimeError("the victim's newest page is not mapped")
            new = int(self.swa.free.alloc(1)[0])
            page = int(victim.pages[j])
            self.swa.point(np.array([page]), np.array([new]))
            victim.swa[j] = new
            self.swa.release(np.array([old], dtype=np.int64))
            held = np.arange(j * p, min((j + 1) * p, self.victim_seen))
            self._hit(victim, page, held, old_swa_page=old, new_swa_page=new)

    def snapshot(self, t: int, index: int, seed: int, size: str) -> SynthDump:
        shape, p = self.shape, self.plan.page
        assert self.victim is not None
        self.victim_seen = self.victim.length
        order = self.rng.permutation(len(self.running))
        batch = [self.running[i] for i in order]
        pad = shape.padding_rows
        rows = np.array([r.row for r in batch] + [0] * pad, dtype=np.int64)
        prefix = np.array(
            [r.prefix for r in batch] + list(self.rng.integers(0, 4, pad)), dtype=np.int64
        )
        extend = np.array(
            [r.extend for r in batch] + list(self.rng.integers(0, 2, pad)), dtype=np.int64
        )
        writes = [self.table[r.row, r.prefix : r.prefix + r.extend] for r in batch]
        tensors: dict[str, np.ndarray] = {
            "req_to_token": self.table,
            "req_pool_indices": rows,
            "prefix_lens": prefix,
            "extend_seq_lens": extend,
            "out_cache_loc": (
                np.concatenate(writes).astype(np.int64) if writes else np.zeros(0, np.int64)
            ),
            "free_full_slots": self.full.free_slots(),
            "held_full_slots": page_slots(self.full.held(), p),
        }
        metadata = {
            "page_size": str(p),
            "num_full_slots": str(self.full.num_slots),
            "write_req_capacity": str(rows.size),
            "kv_token_id_vs_position_offset": "0",
            "forward_mode": "mixed",
            "model": "synthetic",
            "rank": "0",
            "step": str(t),
            "note": f"kvcanary synth {self.plan.name} --steps {self.plan.steps} seed={seed} "
            f"size={size}: dump {index + 1} of {self.plan.steps}",
            SEQUENCE_KEY: json.dumps(
                {
                    "name": self.plan.name,
                    "index": index,
                    "steps": self.plan.steps,
                    "every": self.plan.every,
                    "seed": seed,
                    "size": size,
                },
                sort_keys=True,
            ),
        }
        if self.plan.swa:
            tensors["full_to_swa_index_mapping"] = self.swa.lut
            tensors["free_swa_slots"] = self.swa.free_slots()
            metadata["swa_window_size"] = str(self.window)
            metadata["num_swa_slots"] = str(self.swa.num_slots)
        spec = SynthSpec(
            max_reqs=shape.max_reqs,
            max_seq_len=shape.max_seq_len,
            page_size=p,
            active_rows=len(batch),
            padding_rows=pad,
            mode="mixed",
            window=self.window,
        )
        return SynthDump(spec=spec, seed=seed, tensors=tensors, metadata=metadata, live=[])


def _dump_steps(steps: int, every: int) -> list[int]:
    return [every * (i + 1) for i in range(steps)]


def synth_sequence(
    name: str,
    *,
    steps: int,
    seed: int = 0,
    size: str = "tiny",
    every: int = 1,
    at: int | None = None,
    page_size: int | None = None,
) -> Iterator[SynthDump]:
    """The dumps of sequence `name`, one every `every` forward steps (at steps `every`,
    `2·every`, ... `steps·every`), the event planted at forward step `at` (default: the middle
    dump's step); each yielded dump shares the loop's arrays and must be saved before the next.

    Every dump's metadata holds the truth (`PLANTED_KEY`): the event, the step it happened at,
    the first dump that shows it (`dump`, its `after_step` and `at_step`), and what it hit."""
    if name not in SEQUENCES:
        raise OptionError(
            f"unknown sequence {name!r} (choose {', '.join(SEQUENCES)})",
            option="scenario",
            hint="kvcanary synth --list shows them",
        )
    checked_choice(size, list(SEQUENCE_SIZES), "size")
    if steps < 2:
        raise OptionError("a sequence needs 2 dumps or more", option="steps")
    marks = _dump_steps(steps, every)
    at = marks[steps // 2] if at is None else at
    if not marks[0] < at <= marks[-1]:
        raise OptionError(
            f"step {at} is not after the first dump (step {marks[0]}) and at or before the "
            f"last (step {marks[-1]})",
            option="at",
        )
    kind = SEQUENCES[name]
    plan = _Plan(
        name=name,
        event=kind.event,
        swa=kind.swa,
        steps=steps,
        every=every,
        at=at,
        page=1 if page_size is None else page_size,
    )
    return _run(plan, SEQUENCE_SIZES[size], seed, size, marks)


def _run(
    plan: _Plan, shape: SequenceShape, seed: int, size: str, marks: list[int]
) -> Iterator[SynthDump]:
    loop = _Loop(shape, plan, seed)
    loop.warm_up()
    shown = next(i for i, step in enumerate(marks) if step >= plan.at)
    index = 0
    for t in range(1, marks[-1] + 1):
        loop.forward(t)
        if t != marks[index]:
            continue
        dump = loop.snapshot(t, index, seed, size)
        dump.metadata[PLANTED_KEY] = json.dumps(_truth(loop, plan, marks, shown), sort_keys=True)
        dump.truth = {"index": index, "step": t}
        yield dump
        index += 1


def _truth(loop: _Loop, plan: _Plan, marks: list[int], shown: int) -> dict[str, object]:
    """What was planted, as far as the loop has run: before the event, the plan (its step and
    the dump due to show it); then what it hit (a leak keeps growing, from the first page it
    actually leaked)."""
    truth: dict[str, object] = dict(loop.truth)
    if plan.event is None:
        return truth
    truth["step"] = plan.at
    if plan.event == EventKind.SWA_LEAK and loop.leaked:
        first = loop.leaked[0][0]
        shown = next(i for i, step in enumerate(marks) if step >= first)
        p = plan.page
        truth.update(
            space="swa",
            step=first,
            pages=[page for _, page in loop.leaked],
            leaked_at=[step for step, _ in loop.leaked],
            slots=(loop.leaked[0][1] * p + np.arange(p)).tolist(),
        )
    truth.update(
        dump=shown,
        after_step=marks[shown - 1] if shown > 0 else None,
        at_step=marks[shown],
    )
    return truth


def write_sequence(
    name: str,
    folder: Path,
    *,
    steps: int,
    seed: int = 0,
    size: str = "tiny",
    every: int = 1,
    at: int | None = None,
    page_size: int | None = None,
    overwrite: bool = False,
) -> list[Path]:
    """Write sequence `name` into `folder` (created if missing), one dump per snapshot named
    as the capture hook names them; an existing file is replaced only with `overwrite`."""
    dumps = synth_sequence(
        name, steps=steps, seed=seed, size=size, every=every, at=at, page_size=page_size
    )
    pending = iter(dumps)
    first = next(pending)  # the options are checked before anything is written
    paths = [folder / dump_name(0, step) for step in _dump_steps(steps, every)]
    loaded = iter([first])

    def write_next(handle: BinaryIO) -> None:
        # The dumps share the loop's arrays: each is written before the next is made.
        dump = next(loaded, None) or next(pending)
        dump.target(folder)[1](handle)

    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:  # every dump or none: a refused one leaves no earlier steps behind
        return write_all_atomically([(path, write_next) for path in paths], overwrite=overwrite)
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # empty again: nothing was published
        raise
