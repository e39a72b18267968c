"""A small scheduler loop over SGLang's real stack: what `Scheduler` does for memory, no model.

Each `step` mirrors SGLang 0.5.23's `get_next_batch_to_run` (stash the chunked request, merge
the last prefill batch into the running one, filter finished requests), then either
`get_new_batch_prefill` (a `PrefillAdder` admits waiting requests: prefix match, locks,
chunking; the request it turns down gives back the copy-on-write Mamba slot its match took,
but for a session's request, which keeps it while it waits;
`ScheduleBatch.prepare_for_extend` allocates, evicting the tree under pressure) or
`update_running_batch` (`check_decode_mem`, `retract_decode`, `prepare_for_decode`, which frees
out-of-window SWA). Aborts come first, as SGLang's `abort_request` then
`process_pending_chunked_abort` take them: a waiting request is dropped and its cache attempt
finished as aborted (one holding a Mamba slot, which only a session's request does between
rounds, is released without caching, as SGLang's `abort_request` does), the chunked
request is released without caching (`release_kv_cache(checkpoint=False)`), a running one is
marked `to_finish` and freed by its next result. The forward is a random next token per
request; the result processing is `process_batch_result_prefill` / `_decode`'s memory part
inside one free group (`checkpoint_kv_cache`, `release_kv_cache`). Every call that touches
memory is SGLang's own.

With SGLang's host tier on (`Workload.hicache_write_policy`, `soak.hicache`), each batch
choice starts with the tree's `check_hicache_events` (write-through and load-back acks), as
`get_next_batch_to_run` does after its pending aborts, and a new prefill batch starts the
load-backs its admissions queued (`ready_to_load_host_cache`) before `prepare_for_extend`.

A fully idle step runs what SGLang's `on_idle` does to memory before its idle checks: unified
memory's compaction pass (`flush_opportunistic`). Overlapped, `event_loop_overlap` runs that
pass at one more point too: right after a synced result (below), before the next batch
launches.

A session's turn (`Arrival.session`) is made as SGLang's scheduler makes it, by
`Session.create_req` (`soak.sessions`), once the turn before it is over; a streaming session
is closed through SGLang's `SessionController` once its last turn is over (`Sessions.close_over`).

With `Workload.overlap`, the loop is the `event_loop_overlap` of SGLang 0.5.13 to 0.5.23
(batches built with `enable_overlap`): each step chooses and allocates the next batch,
launches it (`on_plan`, its `ScheduleBatch.copy` queued in `inflight`), then processes the
last batch's queued result; a prefill after a prefill processes it first where
`is_disable_overlap_for_batch` says so.
On 0.5.22 on, `update_running_batch` leaves out the requests the queued result finishes by
length (`_reqs_finishing_inflight`) and skips the decode where memory is short while they
finish; before 0.5.22 (whose `Req` has no `next_output_finishes_by_length`:
`calls.skips_finishing_decode`) it decodes them too, allocating their next slot, and where
memory is short retracts, such requests included. A result passes over rows finished or
retracted since their batch was launched. With the Mamba
extra buffer, a decode result acts on the track boundary its batch's overlapped masks name
(`track_overlapped_decode`), and under SGLang's lazy strategy (`Workload.mamba_lazy`) frees
the second track slot `prepare_for_decode` took at a boundary.

`on_plan` is called where a forward would plan the canary (the batch is allocated, nothing
written yet); `on_idle` when nothing runs and nothing waits.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from types import SimpleNamespace
from typing import Any

import numpy as np

from kvcanary_cli.capture.tree import (
    allocated_len,
    kv_record,
    radix_session_leaves,
    session_slots,
)
from kvcanary_cli.soak.calls import (
    abort_finisher,
    checkpointer,
    committed_len,
    exclude_keyword,
    extend_end,
    holds_mamba,
    lazy_checkpoint_flag,
    next_output_finishes_by_length,
    owned_len,
    prefix_len,
    releaser,
    retract_arguments,
    row_of,
    skips_finishing_decode,
    track_decode_boundary,
    track_overlapped_decode,
    turn_down_mamba,
)
from kvcanary_cli.soak.mamba import track_interval
from kvcanary_cli.soak.sessions import Sessions, session_controller
from kvcanary_cli.soak.stack import MAMBA_EXTRA, Stack
from kvcanary_cli.soak.workload import VOCAB, Arrival, Workload

__all__ = [
    "TEST_RETRACT",
    "RetractTest",
    "Scheduler",
    "StepInfo",
    "release_prefill_swa_name",
    "retract_test",
    "serving_options",
]

#: SGLang's environment switches a workload sets (`Workload.release_prefill_swa`,
#: `Workload.swa_eviction_interval`), read by SGLang at each decode. The first has had two
#: names, newest first: 0.5.22 renamed it (keeping the old one as a deprecated alias);
#: 0.5.13 - 0.5.21 read only the old one. A history sets the one its release declares
#: (`release_prefill_swa_name`).
RELEASE_PREFILL_SWA = (
    "SGLANG_OPT_RELEASE_PREFILL_SWA",
    "SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW",
)
SWA_EVICTION_INTERVAL = "SGLANG_SWA_EVICTION_INTERVAL"
#: SGLang's switch an overlapped workload sets (`Workload.consecutive_prefill_sync`), read by
#: its `is_disable_overlap_for_batch` at each batch
CONSECUTIVE_PREFILL_SYNC = "SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP"


#: SGLang's own test switch for retraction and its two settings, as its `envs` names them
#: (its scheduler module reads them at import): on, a decode retracts at every
#: INTERVAL-th forward, and no prefill is added while more than NO_PREFILL_BS requests run
TEST_RETRACT = (
    "SGLANG_TEST_RETRACT",
    "SGLANG_TEST_RETRACT_INTERVAL",
    "SGLANG_TEST_RETRACT_NO_PREFILL_BS",
)


@dataclass(frozen=True)
class RetractTest:
    """SGLang's retraction test switch, on: its two settings."""

    interval: int
    no_prefill_bs: int

    def retracts(self, forward_ct: int) -> bool:
        """Whether a decode chosen after `forward_ct` forwards retracts though memory fits
        (`update_running_batch`)."""
        return forward_ct % self.interval == 0

    def skips_prefill(self, running_bs: int) -> bool:
        """Whether no prefill is added while `running_bs` requests run
        (`get_new_batch_prefill`)."""
        return running_bs > self.no_prefill_bs

    def note(self) -> str:
        """What a soak's report notes of the switch (a run condition, not a finding)."""
        return (
            f"{TEST_RETRACT[0]} is on (SGLang's test switch): decodes retract once every "
            f"{self.interval} forwards"
            + (
                f", no prefill while over {self.no_prefill_bs} requests run"
                if self.no_prefill_bs < 2**31
                else ""
            )
        )


def retract_test(envs: Any) -> RetractTest | None:
    """SGLang's retraction test switch as the release whose switches `envs` holds (its
    `sglang.srt.environ.envs`) reads it from the environment; None where it is off or the
    release does not declare it."""
    switch, interval, no_prefill_bs = (getattr(envs, name, None) for name in TEST_RETRACT)
    if switch is None or interval is None or no_prefill_bs is None or not switch.get():
        return None
    return RetractTest(interval=int(interval.get()), no_prefill_bs=int(no_prefill_bs.get()))


def _pinning_on_cpu() -> Callable[[], None]:
    """Where torch has no accelerator, `Tensor.pin_memory` returns the tensor itself and
    `torch.tensor(..., pin_memory=True)` makes an unpinned one, until the returned function
    puts both back: pinning is a staging hint for copies to a GPU, and SGLang's extra-buffer
    decode pins its track positions and mask unguarded (`set_mamba_track_indices_from_reqs`,
    `prepare_for_decode`), which a CPU-only torch refuses. Nothing changes where a GPU is."""
    import torch

    if torch.cuda.is_available():
        return lambda: None
    method, make = torch.Tensor.pin_memory, torch.tensor

    def unpinned(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self

    def tensor(*args: Any, pin_memory: bool = False, **kwargs: Any) -> Any:
        return make(*args, **kwargs)

    torch.Tensor.pin_memory = unpinned  # type: ignore[method-assign]
    torch.tensor = tensor

    def undo() -> None:
        torch.Tensor.pin_memory = method  # type: ignore[method-assign]
        torch.tensor = make

    return undo


def release_prefill_swa_name(envs: Any) -> str | None:
    """The environment variable the release whose switches `envs` holds (its
    `sglang.srt.environ.envs`, as its `schedule_batch` reads them) reads for the early SWA
    prefix-lock release: the field of the first `RELEASE_PREFILL_SWA` name it declares, by the
    name that field reads. Found from the release's code, never its version: a name it does
    not read would leave the switch off unseen. None where it declares neither."""
    for declared in RELEASE_PREFILL_SWA:
        switch = getattr(envs, declared, None)
        if switch is not None:
            read = getattr(switch, "name", declared)
            return read if isinstance(read, str) else declared
    return None


def serving_options(workload: Workload, schedule_batch: Any) -> Callable[[], None]:
    """Set SGLang's environment switches as `workload` sets them, for a history (and CPU
    pinning, `_pinning_on_cpu`), by the names the release of `schedule_batch` (its module
    that reads them) reads; the returned function puts the process's own values back."""
    wanted: dict[str, str | None] = {
        SWA_EVICTION_INTERVAL: str(workload.swa_eviction_interval),
    }
    release_name = release_prefill_swa_name(getattr(schedule_batch, "envs", None))
    if release_name is not None:
        wanted[release_name] = "1" if workload.release_prefill_swa else "0"
    if workload.swa_eviction_interval <= 0:
        wanted[SWA_EVICTION_INTERVAL] = None  # SGLang's default
    if workload.overlap:
        wanted[CONSECUTIVE_PREFILL_SYNC] = "1" if workload.consecutive_prefill_sync else None
    before = {name: os.environ.get(name) for name in wanted}

    def put(values: dict[str, str | None]) -> None:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    put(wanted)
    unpin = _pinning_on_cpu()

    def undo() -> None:
        unpin()
        put(before)

    return undo


#: Idle steps the first streaming session stays open once the rest of its history is served
#: (`Sessions.close_over`): the idle audits and SGLang's idle checks meet a session's KV.
SESSION_LINGER = 4


@dataclass
class StepInfo:
    """What one step did (counts for the report; `batch` is the step's `ScheduleBatch`)."""

    step: int
    mode: str  # "extend", "decode" or "idle"
    batch: Any = None
    retracted: int = 0
    finished: int = 0


@dataclass
class Counters:
    """Events over a run (what the workload reached)."""

    extends: int = 0
    decodes: int = 0
    chunks: int = 0
    retractions: int = 0
    #: aborted requests, by where they were: waiting, in chunked prefill, running
    aborts_waiting: int = 0
    aborts_chunked: int = 0
    aborts_running: int = 0
    finishes: int = 0
    idles: int = 0
    #: unified memory's compaction passes (`flush_opportunistic`) at idle, and, overlapped,
    #: at the sync boundary: after the last result processed ahead of a prefill following a
    #: prefill (`synced`), before that prefill launches, and the pages those moved
    flushes: int = 0
    sync_flushes: int = 0
    sync_flush_moves: int = 0
    shared_prefix_tokens: int = 0
    #: the host tier's: prefill batches that started a load-back from host
    host_loads: int = 0
    #: the storage tier's (`soak.storage`): requests that asked storage (at arrival, after a
    #: retraction, or a paced retry), and requests admitted with tokens storage loaded
    storage_asks: int = 0
    storage_loads: int = 0
    #: the extra buffer's decode track boundaries (`track_decode_boundary`)
    track_boundaries: int = 0
    #: streaming or radix sessions closed (`release_session`, `release_radix_session`), and
    #: idle steps a session held KV at (a radix session: tagged the tree's nodes)
    sessions_closed: int = 0
    session_idles: int = 0
    #: the overlapped loop's (`Workload.overlap`): results processed after the next batch was
    #: chosen and allocated (`overlapped`), or before it because a prefill followed a prefill
    #: under SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP (`synced`); requests a decode left
    #: out because their queued result finishes them by length (`_reqs_finishing_inflight`),
    #: and decodes skipped for memory while such requests were finishing; rows a result
    #: passed over, finished or retracted since it was launched; requests released holding
    #: the slot of their last token, allocated by a decode launched before their finishing
    #: result (`released_ahead`); and the tokens allocated past a released request's owned
    #: length that its release freed (`release_kv_cache`'s over-allocation)
    overlapped: int = 0
    synced: int = 0
    finishing_inflight: int = 0
    decode_skips: int = 0
    stale_rows: int = 0
    released_ahead: int = 0
    overallocated_freed: int = 0
    #: 0.5.13 - 0.5.21's overlapped loop (no `_reqs_finishing_inflight`): requests a decode
    #: allocated for while its queued result finished them by length (their last slot is
    #: inside what their release caches: `released_ahead`), and such requests retracted
    #: instead (the queued result passes over them; they are prefilled again)
    finishing_decoded: int = 0
    finishing_retracted: int = 0
    #: the lazy extra buffer's (`Workload.mamba_lazy`, overlapped only): second ping-pong
    #: slots `prepare_for_decode` took at a track boundary (`mamba_lazy_prealloc_at_boundary`),
    #: those the boundary's result freed (`mamba_lazy_post_decode_at_boundary`), and finished
    #: requests released without a checkpoint while a decode in flight wrote their one slot
    lazy_preallocs: int = 0
    lazy_frees: int = 0
    lazy_uncheckpointed: int = 0
    #: the extra buffer's, overlapped: decode results that left a request's next track slot
    #: on its latest tracked state (a boundary swapped twice, `track_overlapped_decode`)
    track_reswaps: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counters by name."""
        return dict(vars(self))


@dataclass
class Scheduler:
    """The loop's state: waiting queue, running batch, chunked request (see module doc)."""

    stack: Stack
    workload: Workload
    max_prefill_tokens: int = 256
    waiting: list[Any] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)

    def __post_init__(self) -> None:
        m = self.stack.modules
        self._sb = m.schedule_batch
        self._policy = m.schedule_policy
        self._common = m.common
        #: the release's calls to publish and to release a request (see `soak.calls`)
        self._checkpoint = checkpointer(m.common)
        self._release = releaser(m.common, self.stack.tree)
        self._exclude = exclude_keyword(self._sb.ScheduleBatch.filter_batch)
        self._retract_args = retract_arguments(
            self._sb.ScheduleBatch.retract_decode, self.stack.server_args
        )
        self._rng = np.random.default_rng(self.workload.seed ^ 0x5EED)
        # no model: the extra buffer's prefill tracking reads the text config's Mamba chunk,
        # which falls back to SGLang's default when the config has none
        self._model_config = SimpleNamespace(
            vocab_size=VOCAB,
            is_encoder_decoder=False,
            is_multimodal=False,
            hf_config=None,
            hf_text_config=SimpleNamespace(),
        )
        self._spec = self._spec_none()
        #: the extra buffer's decode track interval (0: no extra buffer)
        self._track_interval = (
            track_interval(self.stack.spec) if self.stack.spec.layout == MAMBA_EXTRA else 0
        )
        #: the extra buffer's lazy strategy (SGLang's `extra_buffer_lazy`: overlapped only)
        self._lazy = bool(self._track_interval) and self.workload.mamba_lazy
        self.running = self._empty_batch()
        self.last_batch: Any = None
        #: SGLang's overlapped loop (`Workload.overlap`): the batches are built for it, and
        #: `inflight` is its result queue's one entry, the last batch's snapshot
        #: (`ScheduleBatch.copy`) and forward mode, whose result the next step processes
        self._overlap = self.workload.overlap
        #: the release's overlapped decode leaves out the requests its queued result
        #: finishes (`_reqs_finishing_inflight`, 0.5.22 on), or allocates for them too
        self._skip_finishing = self._overlap and skips_finishing_decode(self._sb.Req)
        self.inflight: tuple[Any, str] | None = None
        self.chunked_req: Any = None
        self._next_arrival = 0
        #: arrivals due but not yet made: a session's turn waits for the turn before it
        self._deferred: list[Arrival] = []
        #: SGLang's session controller (its pool statistics count the sessions it holds)
        self.session_controller = session_controller(self.stack.tree)
        #: the client's sessions (made at the first session turn)
        self._sessions: Sessions | None = None
        #: steps in a row with the history's requests all served (a session lingers)
        self._served_for = 0
        self._rid = 0
        self.step_no = 0
        #: (step, request) the client aborts at
        self._aborts: list[tuple[int, Any]] = []
        self._finish_aborted = abort_finisher(
            self.stack.tree, import_module("sglang.srt.mem_cache.base_prefix_cache")
        )
        #: the host tier is on (the tree has its controller)
        self._hicache = getattr(self.stack.tree, "cache_controller", None) is not None
        #: the host tier's storage tier (`soak.storage`), or None
        self._storage = self.stack.storage
        #: SGLang's retraction test switch (`retract_test`), and the forwards run so far
        #: (its `forward_ct`: one each batch launched)
        self._retract_test = retract_test(getattr(self._sb, "envs", None))
        self._forward_ct = 0

    def _spec_none(self) -> Any:
        spec = import_module("sglang.srt.speculative.spec_info")
        return spec.SpeculativeAlgorithm.NONE

    def _empty_batch(self) -> Any:
        return self._sb.ScheduleBatch(reqs=[], batch_is_full=False)

    def _new_req(self, prompt: tuple[int, ...], max_new: int, session: int | None = None) -> Any:
        sp = self.stack.modules.sampling_params.SamplingParams(
            max_new_tokens=max_new, ignore_eos=self.workload.ignore_eos
        )
        sp.normalize(None)  # what the tokenizer manager does: empty stop lists
        self._rid += 1
        if session is not None:
            return self._session_book().turn(session, f"soak-{self._rid}", prompt, sp)
        return self._sb.Req(f"soak-{self._rid}", "", array("q", prompt), sp, vocab_size=VOCAB)

    @property
    def done(self) -> bool:
        """Every arrival came, and nothing runs or waits (`_served`), nor did the last step,
        and every session is closed."""
        return (
            self._served()
            and (self.last_batch is None or self.last_batch.is_empty())
            and self.inflight is None
            and (self._sessions is None or not self._sessions.open_count())
        )

    def step(self, on_plan: Callable[[Any], None] | None = None) -> StepInfo:
        """One scheduler iteration (arrivals, batch choice, forward, result)."""
        arrivals = self.workload.arrivals
        while (
            self._next_arrival < len(arrivals) and arrivals[self._next_arrival].step <= self.step_no
        ):
            self._deferred.append(arrivals[self._next_arrival])
            self._next_arrival += 1
        if self._deferred:
            self._arrive()
        if self._aborts:
            self._abort_due()
        if self._sessions is not None and self._sessions.closing:
            self._served_for = self._served_for + 1 if self._served() else 0
            over = self._served_for > SESSION_LINGER
            self.counters.sessions_closed += self._sessions.close_over(all_over=over)
        info = StepInfo(step=self.step_no, mode="idle")
        batch = self._next_batch(info)
        if self._overlap:
            self._launch_overlapped(batch, info, on_plan)
        elif batch is not None:
            self._launch(batch, info, on_plan)
            self._process(batch, info)
        else:
            self._count_idle()
            self._on_idle()
        self.last_batch = batch
        self.step_no += 1
        return info

    def _launch(self, batch: Any, info: StepInfo, on_plan: Callable[[Any], None] | None) -> None:
        """Launch `batch`: the step's batch and mode, and the plan a forward would make."""
        info.batch = batch
        info.mode = "extend" if batch.forward_mode.is_extend() else "decode"
        self._forward_ct += 1
        if on_plan is not None:
            on_plan(batch)

    def _count_idle(self) -> None:
        """A step that launched no batch (and one a session held KV at)."""
        self.counters.idles += 1
        if session_slots(self.stack.tree) or radix_session_leaves(self.stack.tree):
            self.counters.session_idles += 1

    def _launch_overlapped(
        self, batch: Any, info: StepInfo, on_plan: Callable[[Any], None] | None
    ) -> None:
        """The rest of SGLang's `event_loop_overlap` iteration once `batch` is chosen and
        allocated: where `is_disable_overlap_for_batch` says so (a prefill after a prefill,
        under SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP), the last batch's result first;
        then `batch` launched (planned; its snapshot queued); then the last batch's result,
        or, with no last batch and nothing launched, `on_idle`."""
        last = self.last_batch
        synced = self._synced(batch, last)
        if synced:
            self._process_queued(info)
            self.counters.synced += 1
            # the forward stream is idle here: unified memory compacts, as at idle
            moved = self._flush()
            if moved is not None:
                self.counters.sync_flushes += 1
                self.counters.sync_flush_moves += moved
        queued = None
        if batch is not None:
            self._launch(batch, info, on_plan)
            queued = (batch.copy(), info.mode)
        else:
            self._count_idle()
        if last is not None:
            if not synced:
                self._process_queued(info)
                self.counters.overlapped += batch is not None
        elif batch is None:
            self._on_idle()
        self.inflight = queued

    def _synced(self, batch: Any, last: Any) -> bool:
        """SGLang's `is_disable_overlap_for_batch` (no speculative decoding, no DP
        attention): both batches prefills, and the release's switch on."""
        if batch is None or last is None:
            return False
        if not (batch.forward_mode.is_extend() and last.forward_mode.is_extend()):
            return False
        return bool(self._sb.envs.SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP.get())

    def _process_queued(self, info: StepInfo) -> None:
        """Pop the result queue's entry and process it (`pop_and_process`)."""
        assert self.inflight is not None, "a last batch without its queued result"
        snapshot, mode = self.inflight
        self.inflight = None
        self._process(snapshot, info, mode)

    def _arrive(self) -> None:
        """The arrivals due, in order; a session's turn waits while the turn before it is not
        over (`Arrival.session`), and the session's later turns with it."""
        held_back: set[int] = set()
        deferred = []
        for a in self._deferred:
            if a.session is not None and (
                a.session in held_back or not self._session_book().ready(a.session)
            ):
                held_back.add(a.session)
                deferred.append(a)
                continue
            req = self._new_req(a.prompt, a.max_new_tokens, a.session)
            self._ask_storage(req)
            self.waiting.append(req)
            if a.abort_after is not None:
                self._aborts.append((self.step_no + a.abort_after, req))
        self._deferred = deferred

    def _session_book(self) -> Sessions:
        if self._sessions is None:
            turns: dict[int, int] = {}
            for a in self.workload.arrivals:
                if a.session is not None:
                    turns[a.session] = turns.get(a.session, 0) + 1
            self._sessions = Sessions(
                VOCAB,
                self.session_controller,
                streaming=self.workload.streaming_sessions,
                turns=turns,
                radix=self.workload.radix_sessions,
            )
        return self._sessions

    def _served(self) -> bool:
        """Every arrival came and was served: nothing is due, waits or runs."""
        return (
            self._next_arrival >= len(self.workload.arrivals)
            and not self._deferred
            and not self.waiting
            and self.running.is_empty()
            and self.chunked_req is None
        )

    @property
    def fully_idle(self) -> bool:
        """SGLang's `is_fully_idle`: nothing waits or runs, no chunked request sits between
        chunks, the last batch ran nothing. Only then does its `on_idle` compact and run its
        idle checks; a step with no batch but a request waiting or parked is not idle to it."""
        return (
            not self.waiting
            and self.running.is_empty()
            and self.chunked_req is None
            and (self.last_batch is None or self.last_batch.is_empty())
            and self.inflight is None
        )

    def _on_idle(self) -> None:
        """SGLang's `on_idle` before its idle checks: fully idle, unified memory compacts
        (`_flush`)."""
        if self.fully_idle and self._flush() is not None:
            self.counters.flushes += 1

    def _flush(self) -> int | None:
        """Unified memory's compaction pass (`flush_opportunistic`; an error there is
        swallowed, as SGLang's scheduler does): the pages it moved, or None without unified
        memory or where it failed."""
        flush = getattr(self.stack.allocator, "flush_opportunistic", None)
        if flush is None:
            return None
        try:
            return int(flush())
        except Exception:  # noqa: BLE001  (SGLang's scheduler passes over it, and runs on)
            return None

    def _abort_due(self) -> None:
        """The aborts due at this step, each where its request is (see module doc)."""
        due = [req for at, req in self._aborts if at <= self.step_no]
        self._aborts = [(at, req) for at, req in self._aborts if at > self.step_no]
        tree = self.stack.tree
        for req in due:
            if req.finished():
                continue
            if any(req is waiting for waiting in self.waiting):
                self.waiting = [w for w in self.waiting if w is not req]
                self._finish_aborted(req)
                if holds_mamba(req):  # the copy-on-write slot a session's turn kept
                    self._release(req, tree, False)
                if self._sessions is not None:
                    self._sessions.dropped(req)
                self.counters.aborts_waiting += 1
            elif req is self.chunked_req:
                req.finished_reason = self._sb.FINISH_ABORT("Aborted")
                req.to_finish = None
                self._finish_aborted(req)
                self._release(req, tree, False)
                self.chunked_req = None
                self.counters.aborts_chunked += 1
            else:
                req.to_finish = self._sb.FINISH_ABORT()
                self.counters.aborts_running += 1

    def _ask_storage(self, req: Any, retracted: bool = False) -> None:
        """As a request enters the waiting queue with a storage tier, the scheduler asks
        storage for its prompt (a retracted one with its attempts counted afresh)."""
        if self._storage is None:
            return
        from kvcanary_cli.soak.storage import request_prefetch

        if retracted:
            req.storage_prefetch_retry_attempts = 0
            req.storage_prefetch_last_match_len = None
        request_prefetch(self.stack.tree, req)
        self.counters.storage_asks += 1

    # -- get_next_batch_to_run ---------------------------------------------------------

    def _next_batch(self, info: StepInfo) -> Any:
        if self._storage is not None:
            self._storage.pump.run()  # the storage threads kept up (see soak.storage)
        if self._hicache:
            self.stack.tree.check_hicache_events()
        if self._storage is not None:
            from kvcanary_cli.soak.storage import retry_prefetches

            self.counters.storage_asks += retry_prefetches(
                self.stack.tree, self.waiting, self.stack.server_args
            )
        exclude = []
        if self.chunked_req is not None:
            exclude.append(self.chunked_req)
            chunk = self.chunked_req
            if (extend_end(chunk) or 0) > prefix_len(chunk):
                self._checkpoint(chunk, self.stack.tree, True)
        last = self.last_batch
        if last is not None and last.forward_mode.is_extend():
            if last.chunked_req is not None:
                exclude.append(last.chunked_req)
            last.filter_batch(**{self._exclude: exclude})
            if not last.is_empty() and last is not self.running:
                if self.running.is_empty():
                    self.running = last
                else:
                    self.running.merge_batch(last)
        self.running.filter_batch()
        new_batch = self._prefill()
        if new_batch is not None:
            self.counters.extends += 1
            return new_batch
        if not self.running.is_empty():
            decode = self._update_running(info)
            if decode is not None and not decode.is_empty():
                self.counters.decodes += 1
                return decode
        return None

    def _prefill(self) -> Any:
        if not self.waiting and self.chunked_req is None:
            return None
        stack = self.stack
        pool = stack.req_to_token_pool
        if pool.available_size() <= 0 and self.chunked_req is None:
            return None
        test = self._retract_test
        if test is not None and test.skips_prefill(len(self.running.reqs)):
            return None
        adder = self._policy.PrefillAdder(
            stack.spec.page_size,
            stack.tree,
            stack.allocator,
            self.running,
            0.5,
            self.max_prefill_tokens,
            stack.spec.chunked_prefill_size,
            0,
            0,
            max_prefill_bs=0,
            max_running_requests=stack.spec.max_reqs,
        )
        if self.chunked_req is not None:
            self.chunked_req.init_next_round_input()
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        result = self._policy.AddReqResult
        for req in self.waiting:
            if adder.budget_state() == result.OTHER:
                break
            held = sum(row_of(r) is not None for r in adder.can_run_list)
            if len(adder.can_run_list) >= pool.available_size() + held:
                break
            if self._storage is not None:
                from kvcanary_cli.soak.storage import wait_for_prefetch

                ready, loaded = wait_for_prefetch(stack.tree, req)
                if not ready:
                    continue  # its prefetch is in flight: the scheduler passes it over
                self.counters.storage_loads += int(loaded > 0)
            req.init_next_round_input(stack.tree)
            res = adder.add_one_req(
                req, has_chunked_req=self.chunked_req is not None, truncation_align_size=None
            )
            if res != result.CONTINUE:
                mamba = getattr(pool, "mamba_allocator", None)
                turned_down = not adder.can_run_list or req is not adder.can_run_list[-1]
                if mamba is not None and turned_down:
                    turn_down_mamba(req, mamba)
                break
        can_run = adder.can_run_list
        if not can_run:
            return None
        chosen = set(map(id, can_run))
        self.waiting = [r for r in self.waiting if id(r) not in chosen]
        self.counters.shared_prefix_tokens += sum(prefix_len(r) for r in can_run)
        if adder.new_chunked_req is not None:
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.inflight_middle_chunks += 1
            self.counters.chunks += 1
        batch = self._sb.ScheduleBatch.init_new(
            can_run,
            pool,
            stack.allocator,
            stack.tree,
            self._model_config,
            self._overlap,
            self._spec,
            chunked_req=self.chunked_req,
        )
        if self._hicache:
            batch.hicache_consumer_index = stack.tree.ready_to_load_host_cache()
            self.counters.host_loads += int(batch.hicache_consumer_index >= 0)
        batch.prepare_for_extend()
        batch.decoding_reqs = None
        return batch

    def _update_running(self, info: StepInfo) -> Any:
        batch = self.running
        initial = batch.batch_size()
        finishing = self._finishing_inflight(batch)
        #: before 0.5.22: the finishing requests stay in the decode (counted below)
        decoded = [] if self._skip_finishing else finishing
        if self._skip_finishing:
            batch.filter_batch(**{self._exclude: finishing})
            self.counters.finishing_inflight += len(finishing)
            if batch.is_empty():
                batch.batch_is_full = False
                return None
        fits = batch.check_decode_mem()
        if not fits and finishing and self._skip_finishing:
            # the queued result frees the finishing requests: decode the rest next step
            batch.batch_is_full = False
            self.counters.decode_skips += 1
            return None
        test = self._retract_test
        if not fits or (test is not None and test.retracts(self._forward_ct)):
            retracted, _, aborted = batch.retract_decode(*self._retract_args)
            info.retracted = len(retracted) + len(aborted)
            self.counters.retractions += info.retracted
            # before 0.5.22: the queued result would have finished these (it passes over
            # them, retracted); they come back through the waiting queue
            gone = {id(req) for req in (*retracted, *aborted)}
            self.counters.finishing_retracted += sum(id(req) in gone for req in decoded)
            decoded = [req for req in decoded if id(req) not in gone]
            for req in retracted:
                self._ask_storage(req, retracted=True)
                self.waiting.append(req)
            for req in aborted:  # finished by SGLang (to_finish): nothing to requeue
                if self._sessions is not None:
                    self._sessions.dropped(req)
        if batch.batch_size() < initial:
            batch.batch_is_full = False
        if batch.is_empty():
            return None
        # before 0.5.22: the decode allocates for the requests its queued result finishes
        self.counters.finishing_decoded += len(decoded)
        if not self._lazy:
            batch.prepare_for_decode()
            return batch
        before = [kv_record(req).mamba_next_track_idx for req in batch.reqs]
        batch.prepare_for_decode()
        # SGLang's lazy prealloc points a request at a boundary to the slot it just took
        self.counters.lazy_preallocs += sum(
            bool(at) and kv_record(req).mamba_next_track_idx != was
            for req, at, was in zip(batch.reqs, batch.mamba_track_mask_cpu, before, strict=True)
        )
        return batch

    def _finishing_inflight(self, batch: Any) -> list[Any]:
        """SGLang's `_reqs_finishing_inflight`: the running requests in the queued result's
        batch whose next output token finishes them by length (none but overlapped). Where
        the release's loop does not ask (`skips_finishing_decode`: before 0.5.22) the same
        requests, by soak's own reading of the question, are counted, never left out."""
        if not self._overlap or self.inflight is None:
            return []
        queued = {id(req) for req in self.inflight[0].reqs}
        return [
            req
            for req in batch.reqs
            if id(req) in queued
            and getattr(req, "beam_group", None) is None
            and next_output_finishes_by_length(req)
        ]

    # -- forward + result processing ---------------------------------------------------

    def _process(self, batch: Any, info: StepInfo, mode: str | None = None) -> None:
        """The memory part of `process_batch_result_prefill` / `_decode` for `batch` (a
        snapshot, overlapped) run in `mode` (default: the step's): under the overlapped loop
        a row can have finished (an abort) or been retracted since its batch was launched,
        and is passed over as SGLang passes it."""
        tree, allocator = self.stack.tree, self.stack.allocator
        mode = mode or info.mode
        tokens = self._rng.integers(1, VOCAB, size=len(batch.reqs))
        allocator.free_group_begin()
        try:
            for row, (req, token) in enumerate(zip(batch.reqs, tokens, strict=True)):
                if mode == "extend":
                    if (req.finished() and req.inflight_middle_chunks <= 0) or req.is_retracted:
                        self.counters.stale_rows += 1
                        continue
                    if req.inflight_middle_chunks > 0:
                        req.inflight_middle_chunks -= 1
                        continue
                    req.output_ids.append(int(token))
                    req.update_finish_state()
                    if req.finished():
                        self._release_finished(req)
                        info.finished += 1
                    else:
                        self._checkpoint(req, tree, False)
                else:
                    if req.finished() or (self._overlap and req.is_retracted):
                        self.counters.stale_rows += 1
                        continue
                    req.output_ids.extend([int(token)])
                    req.update_finish_state(1)
                    self._track_decode(req, batch, row)
                    if req.finished():
                        self._release_finished(req, decode=True)
                        info.finished += 1
        finally:
            allocator.free_group_end()
        self.counters.finishes += info.finished

    def _track_decode(self, req: Any, batch: Any, row: int) -> None:
        """The extra buffer's part of `req`'s decode result, row `row` of `batch`: SGLang's
        overlapped one where the loop overlaps (`track_overlapped_decode`), else the plain."""
        if not self._track_interval:
            return
        pool = self.stack.req_to_token_pool
        if self._overlap:
            boundary, freed, reswapped = track_overlapped_decode(
                req, batch, row, pool, self._track_interval, self._lazy
            )
            self.counters.lazy_frees += freed
            self.counters.track_reswaps += reswapped
        else:
            boundary = track_decode_boundary(req, pool, self._track_interval)
        self.counters.track_boundaries += boundary

    def _release_finished(self, req: Any, decode: bool = False) -> None:
        """Release a request its result finished, caching it (a `decode` result's under the
        lazy extra buffer: without a checkpoint where SGLang's result cleared
        `mamba_lazy_checkpoint`); counted where it holds the slot of its last token (a decode
        launched ahead of this result allocated it) or tokens past what it owns (freed by
        the release)."""
        if self._overlap:
            # the lengths on the request's KV record (0.5.17 on) or the request (0.5.13 - 0.5.16)
            seen = len(req.origin_input_ids) + len(req.output_ids)
            self.counters.released_ahead += committed_len(req) >= seen
            allocated = allocated_len(kv_record(req))
            self.counters.overallocated_freed += max(0, allocated - owned_len(req))
        # the lazy strategy's: no checkpoint where a decode in flight writes the one slot
        lazy = self._lazy and decode
        checkpoint = bool(getattr(req, lazy_checkpoint_flag(req), True)) if lazy else True
        self.counters.lazy_uncheckpointed += not checkpoint
        self._release(req, self.stack.tree, checkpoint)
