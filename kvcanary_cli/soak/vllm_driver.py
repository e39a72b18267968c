"""A seeded random workload on vLLM's real `KVCacheManager`, audited every step.

vLLM's own `Scheduler` needs a whole engine configuration, so this module is a small scheduler
of its own with the calls vLLM's makes, in its order: running requests first (a decode token,
or the next prefill chunk), the newest running request preempted (freed, recomputed later) when
a step does not fit; then waiting requests with their prefix-cache hits; finished and aborted
requests freed at once or, as vLLM's async scheduling does, after the in-flight step
(`deferred_frees`; a release before 0.24.0 has no such frees, and frees at once). With
`overlap`, as vLLM's async scheduling runs it (a server's default): a step is scheduled while
the last one is still in flight, whose output is processed only after that, so each request's
`num_in_flight_tokens` counts what it was scheduled for in both until then; the manager frees
windows and Mamba states on the tokens processed, not those computed. The audit reads the pool
twice a step, as a running server's passes through both: both steps in flight (the GPU runs
one, the next is queued), and once the older one's output is processed (a release that counts
no tokens in flight, before 0.26.0, is refused). A preempted request's steps still in flight
are stale (0.27.0 on): it is not readmitted until they drain. With `speculative` K, as a
server with a drafter runs: each decode step also verifies K drafts, in K lookahead slots, and
the rejected ones are taken off the tokens computed; under async scheduling only once that
step's output is processed, the next step scheduled past them meanwhile. The calls are made
as the loaded release takes them (its constructor's arguments, its prefix lookup's result),
never by its version number.
Requests share a few prompt prefixes, so prefix hits, shared blocks and evictions happen. The
models (`MODELS`): full attention alone, and full attention beside one other group in one
shared pool: a sliding window (`hybrid`: blocks that left the window replaced by the null
block), a Mamba state group (`hybrid-mamba`: a request keeps its last state blocks, the rest
null) or chunked local attention (`hybrid-chunked-local`: blocks before the current chunk
null). A soak runs `DEFAULT_MODELS` in turn unless told which.

After every step the manager is read (`engines.vllm.capture.snapshot`) and checked
(`engines.vllm.check.audit`). A planted fault edits the pool the way its bug would, at a
drawn step; whatever vLLM raises (its asserts) is recorded with the step and the frame of
vLLM's code it came from, and ends the history. Nothing here is vLLM's code.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvcanary_cli.engines.vllm.capture import KNOWN_LAYOUTS, VllmLayoutError, snapshot
from kvcanary_cli.engines.vllm.check import audit
from kvcanary_cli.engines.vllm.hook import raised_in, watch_asserts
from kvcanary_cli.results.pool import PoolFinding

__all__ = [
    "DEFAULT_MODELS",
    "FAULTS",
    "MODELS",
    "History",
    "ModelUnavailableError",
    "VllmCrash",
    "model_available",
    "run_history",
]

#: Every model the workload builds: its name and what its groups are (a soak's --vllm-model).
MODELS = {
    "full": "full attention",
    "hybrid": "full attention + sliding window",
    "hybrid-mamba": "full attention + Mamba state",
    "hybrid-chunked-local": "full attention + chunked local attention",
    "hybrid-rswa": "full attention + reference sliding window",
}
#: The models a soak cycles through when not told which.
DEFAULT_MODELS = ("full", "hybrid")
BLOCK_SIZE = 16
WINDOW = 64
#: Chunked local attention's chunk (tokens): a few blocks, so that chunks turn within a request.
CHUNK = 64
#: A reference sliding window's generated tokens kept (tokens): a few blocks, so that decodes
#: leave gaps after their prompts within a request's output.
RSWA_WINDOW = 20
#: The spec class each model's second group needs (a release without it cannot build it).
_NEEDS = {
    "hybrid": "SlidingWindowSpec",
    "hybrid-mamba": "MambaSpec",
    "hybrid-chunked-local": "ChunkedLocalAttentionSpec",
    "hybrid-rswa": "RSWASpec",
}
#: A `Request`'s arguments that older releases want and the workload gives as None (see
#: `_Scheduler`).
_REQUEST_NONES = (
    "eos_token_id",
    "multi_modal_inputs",
    "multi_modal_kwargs",
    "multi_modal_hashes",
    "multi_modal_placeholders",
)
#: A small pool, so that steps preempt and evict.
NUM_BLOCKS = 96
MAX_MODEL_LEN = 1024
#: Tokens one step may schedule (prefill chunks included).
STEP_TOKENS = 256


class ModelUnavailableError(VllmLayoutError):
    """The loaded release has no manager for the model's group kind: one line, exit 2."""


def model_available(modules: Any, model: str) -> bool:
    """The loaded release defines the spec the model's second group needs."""
    need = _NEEDS.get(model)
    return need is None or hasattr(modules.interface, need)


def _mamba_align(interface: Any) -> bool:
    """The release caches Mamba states by prefix (`mamba_cache_mode` "align", from 0.1x on)."""
    fields = getattr(interface.MambaSpec, "__dataclass_fields__", {})
    return "mamba_cache_mode" in fields


@dataclass(frozen=True)
class VllmCrash:
    """What vLLM raised during a step."""

    step: int
    exception: str
    message: str
    raised_in: str | None


@dataclass
class History:
    """One history's outcome: the audited steps, kvcanary's first finding, vLLM's crash."""

    model: str
    seed: int
    steps: int = 0
    audited: int = 0
    preemptions: int = 0
    prefix_hits: int = 0
    aborts: int = 0
    #: speculative decoding: the draft tokens verified, and of those accepted
    drafted: int = 0
    accepted: int = 0
    #: the step a planted fault was planted at, and what it did (the block, its holders)
    fault_step: int | None = None
    fault_note: str = ""
    #: kvcanary's first findings and their step
    finding_step: int | None = None
    findings: tuple[PoolFinding, ...] = ()
    dump: Any = None
    crash: VllmCrash | None = None
    #: what the assert hook wrote when vLLM raised (with `assert_dumps`)
    assert_dumps: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _request_counts(modules: Any, field: str) -> bool:
    """The release's `Request` keeps the count `field` (read in its source: a count vLLM
    sets in `__init__` is no class attribute to look up)."""
    try:
        source = inspect.getsource(modules.request.Request)
    except (OSError, TypeError):
        return False
    return field in source


def counts_tokens_in_flight(modules: Any) -> bool:
    """The release counts each request's tokens scheduled but not yet processed (its
    `Request` has `num_in_flight_tokens`, which its manager frees on: 0.26.0 on)."""
    return _request_counts(modules, "num_in_flight_tokens")


def counts_stale_share(modules: Any) -> bool:
    """The release counts a preempted request's tokens in flight as stale (its `Request` has
    `num_stale_output_tokens`, 0.27.0 on), so their drafts' rejections never reach its new
    count: the scheduler soak models under async scheduling with drafts."""
    return _request_counts(modules, "num_stale_output_tokens")


class _Scheduler:
    """The workload: requests arriving, scheduled, preempted, finished and aborted."""

    def __init__(
        self, modules: Any, model: str, seed: int, *, overlap: bool = False, speculative: int = 0
    ) -> None:
        import torch

        m = modules
        self.m = m
        self.rng = np.random.default_rng(seed)
        spec: dict[str, Any] = dict(
            block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8, dtype=torch.float16
        )
        # (before 0.11.0 an attention spec says whether it is MLA's: these are not)
        if "use_mla" in inspect.signature(m.interface.FullAttentionSpec).parameters:
            spec["use_mla"] = False
        if model not in MODELS:
            raise ModelUnavailableError(f"{model!r} is not a model: {', '.join(MODELS)}")
        if not model_available(m, model):
            raise ModelUnavailableError(
                f"this vLLM ({m.tree.version}) has no {_NEEDS[model]}: it cannot build {model} "
                f"({MODELS[model]})"
            )
        groups = [m.interface.KVCacheGroupSpec(["full.0"], m.interface.FullAttentionSpec(**spec))]
        #: prefix caching on (off only for a Mamba group of a release that cannot cache its
        #: states: before "align" mode vLLM serves such a model without prefix caching)
        caching = True
        if model == "hybrid":
            groups.append(
                m.interface.KVCacheGroupSpec(
                    ["window.0"], m.interface.SlidingWindowSpec(**spec, sliding_window=WINDOW)
                )
            )
        elif model == "hybrid-chunked-local":
            groups.append(
                m.interface.KVCacheGroupSpec(
                    ["local.0"],
                    m.interface.ChunkedLocalAttentionSpec(**spec, attention_chunk_size=CHUNK),
                )
            )
        elif model == "hybrid-rswa":
            groups.append(
                m.interface.KVCacheGroupSpec(
                    ["rswa.0"], m.interface.RSWASpec(**spec, rswa_window=RSWA_WINDOW)
                )
            )
        elif model == "hybrid-mamba":
            # "align" mode: states kept per block (the block size the attention's), prefix
            # cached; before it, one state block per request (the block size the model's
            # length, as vLLM sizes it) and no prefix caching
            mamba: dict[str, Any] = dict(shapes=((1, 8),), dtypes=(torch.float16,))
            if "dtypes" not in getattr(m.interface.MambaSpec, "__dataclass_fields__", {}):
                mamba["dtype"] = mamba.pop("dtypes")[0]  # (0.10.0: one dtype for all states)
            if _mamba_align(m.interface):
                mamba.update(block_size=BLOCK_SIZE, mamba_cache_mode="align")
            else:
                mamba.update(block_size=MAX_MODEL_LEN)
                caching = False
            if speculative:  # a state block per draft token, as vLLM sizes a drafting model's
                mamba["num_speculative_blocks"] = speculative
            groups.append(m.interface.KVCacheGroupSpec(["mamba.0"], m.interface.MambaSpec(**mamba)))
        self.caching = caching
        self.rswa = model == "hybrid-rswa"
        config = m.interface.KVCacheConfig(
            num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=groups
        )
        # (before 0.23.0 the manager takes no scheduler_block_size: it schedules by hash
        # blocks; 0.10.0's hashes a request's blocks itself, with the function it is named)
        sizes = dict(
            scheduler_block_size=BLOCK_SIZE, hash_block_size=BLOCK_SIZE, caching_hash_algo="sha256"
        )
        taken = inspect.signature(m.manager.KVCacheManager).parameters
        self.manager = m.manager.KVCacheManager(
            config,
            max_model_len=MAX_MODEL_LEN,
            **{k: v for k, v in sizes.items() if k in taken},
            enable_caching=caching,
        )
        #: the manager hands a request's blocks out to be freed later (from 0.24.0 on: the
        #: frees vLLM's async scheduling defers past the in-flight step); else frees at once
        self.defers = callable(getattr(self.manager, "pop_blocks_for_free", None))
        #: what a release's `Request` wants beyond 0.17.0's, all None: before 0.17.0 an
        #: `eos_token_id` (the workload ends a request by its own count), before 0.10.2 the
        #: multi-modal inputs' lists (none); and from 0.10.1 on the hasher filling its block
        #: hashes (0.10.0's manager hashes them, and forgets them when told a request finished)
        wants = inspect.signature(m.request.Request).parameters
        self.request_extra: dict[str, Any] = {k: None for k in _REQUEST_NONES if k in wants}
        if "block_hasher" in wants:
            hash_fn = m.hashing.sha256
            m.kv_cache_utils.init_none_hash(hash_fn)
            hasher = m.kv_cache_utils.get_request_block_hasher(BLOCK_SIZE, hash_fn)
            self.request_extra["block_hasher"] = hasher
        self.prefixes = [
            [int(t) for t in self.rng.integers(0, 30000, int(self.rng.integers(1, 6)) * BLOCK_SIZE)]
            for _ in range(4)
        ]
        #: async scheduling: the (request, tokens, drafts rejected) of the steps in flight,
        #: oldest first (None: every step's output processed before the next is scheduled)
        self.in_flight: deque[list[tuple[Any, int, int]]] | None = deque() if overlap else None
        #: async scheduling with drafts: per request, the drafts its steps in flight had
        #: rejected, still counted computed until their output is processed (as vLLM's
        #: scheduler counts a step's drafts computed when it schedules it)
        self.rejected_in_flight: dict[str, int] = {}
        #: speculative decoding: the draft tokens a decode step verifies (0: none), and the
        #: drafts verified and accepted so far
        self.speculative = speculative
        self.drafted = 0
        self.accepted = 0
        self.requests: dict[str, Any] = {}
        self.output_left: dict[str, int] = {}
        self.waiting: deque[Any] = deque()
        self.running: list[Any] = []
        self.deferred: deque[tuple[int, list[Any]]] = deque()
        self.next_id = 0
        self.step = 0
        self.preemptions = 0
        self.prefix_hits = 0
        self.aborts = 0

    # --- requests ---------------------------------------------------------------------------

    def arrive(self) -> None:
        rng = self.rng
        prompt: list[int] = []
        if rng.random() < 0.7:
            prompt += self.prefixes[int(rng.integers(len(self.prefixes)))]
        prompt += [int(t) for t in rng.integers(0, 30000, int(rng.integers(1, 80)))]
        prompt = prompt[: MAX_MODEL_LEN // 2]
        rid = f"r{self.next_id}"
        self.next_id += 1
        params = self.m.sampling_params.SamplingParams(max_tokens=64)
        request = self.m.request.Request(
            request_id=rid,
            prompt_token_ids=prompt,
            sampling_params=params,
            pooling_params=None,
            **self.request_extra,
        )
        self.requests[rid] = request
        # (a reference sliding window's gaps open only past its window: longer outputs)
        self.output_left[rid] = int(rng.integers(1, 48)) * (4 if self.rswa else 1)
        self.waiting.append(request)

    def release(self, request: Any, *, deferred: bool) -> None:
        """The request's blocks back to the pool: now, or after the in-flight step."""
        if deferred and self.defers:
            blocks = self.manager.pop_blocks_for_free(request)
            if blocks:
                self.deferred.append((self.step, blocks))
        else:
            self.manager.free(request)

    def finish(self, request: Any, *, deferred: bool) -> None:
        self.release(request, deferred=deferred)
        self.forget_hashes(request)
        self.requests.pop(request.request_id, None)
        self.output_left.pop(request.request_id, None)
        self.rejected_in_flight.pop(request.request_id, None)

    def forget_hashes(self, request: Any) -> None:
        """A finished request's block hashes dropped where the manager keeps them (0.10.0: as
        vLLM's scheduler does on a finish, never on a preemption)."""
        forget = getattr(self.manager, "free_block_hashes", None)
        if callable(forget):
            forget(request)

    def drain(self) -> None:
        """Deferred frees whose step has completed go back to the pool, tail blocks first."""
        while self.deferred and self.deferred[0][0] < self.step:
            _, blocks = self.deferred.popleft()
            self.manager.block_pool.free_blocks(reversed(blocks))

    def preempt(self, request: Any) -> None:
        self.running.remove(request)
        self.manager.free(request)
        request.num_computed_tokens = 0
        request.spec_token_ids = []  # its drafts go with its KV, as vLLM's preemption drops them
        # (its steps in flight are stale now: their rejections are not taken off the count)
        self.rejected_in_flight.pop(request.request_id, None)
        if self.in_flight is not None and hasattr(request, "num_stale_output_tokens"):
            request.num_stale_output_tokens = request.num_in_flight_tokens  # its steps' now
        self.waiting.appendleft(request)
        self.preemptions += 1

    # --- one step ---------------------------------------------------------------------------

    def settle(self) -> bool:
        """Async scheduling: the step before last has its output processed (a preempted or
        finished request's tokens drain too, as vLLM drains them), the last one stays in
        flight; whether there was one to settle. Its rejected drafts come off the tokens
        computed then, unless its output is stale (the request preempted since)."""
        settled = False
        while self.in_flight is not None and len(self.in_flight) > 1:
            for request, count, rejected in self.in_flight.popleft():
                request.num_in_flight_tokens -= count
                if getattr(request, "num_stale_output_tokens", 0) > 0:  # drained in step
                    request.num_stale_output_tokens -= count
                elif rejected and request.request_id in self.rejected_in_flight:
                    request.num_computed_tokens -= rejected
                    self.rejected_in_flight[request.request_id] -= rejected
            settled = True
        return settled

    def run_step(self) -> None:
        rng = self.rng
        # (a Mamba group forgets which states this step cached: vLLM's scheduler says so at
        # the start of each schedule, where the release has the call)
        starts = getattr(self.manager, "new_step_starts", None)
        if callable(starts):
            starts()
        self.drain()
        self.settle()
        for _ in range(int(rng.poisson(0.6))):
            self.arrive()
        budget = STEP_TOKENS
        scheduled: list[tuple[Any, int]] = []
        for request in list(self.running):
            if request not in self.running:
                continue  # preempted for an earlier one
            # (under async scheduling the count holds the drafts a step in flight will
            # reject: vLLM schedules past them, from its output placeholders)
            behind = self.rejected_in_flight.get(request.request_id, 0)
            want = min(request.num_tokens_with_spec - request.num_computed_tokens + behind, budget)
            if want <= 0:
                continue
            while self.allocate(request, want) is None:
                victim = self.running[-1]
                self.preempt(victim)
                if victim is request:
                    break
            else:
                scheduled.append((request, want))
                budget -= want
        skipped: list[Any] = []
        while self.waiting and budget > 0 and not any(r is self.waiting[0] for r, _ in scheduled):
            request = self.waiting[0]
            if getattr(request, "num_stale_output_tokens", 0) > 0:
                # a preempted request whose old steps are still in flight waits for them to
                # drain (from 0.27.0 on vLLM's scheduler skips it, and admits the next)
                skipped.append(self.waiting.popleft())
                continue
            # (blocks, hit tokens), and from 0.26.0 on the shared-prefix boundary (unused)
            hit_blocks, hit = self.manager.get_computed_blocks(request)[:2]
            want = min(request.num_tokens - hit, budget)
            if self.allocate(request, want, hit, hit_blocks) is None:
                break
            self.waiting.popleft()
            self.prefix_hits += hit > 0
            request.num_computed_tokens = hit
            self.running.append(request)
            scheduled.append((request, want))
            budget -= want
        self.waiting.extendleft(reversed(skipped))
        flying: list[tuple[Any, int, int]] = []
        for request, count in scheduled:
            request.num_computed_tokens += count
            behind = self.rejected_in_flight.get(request.request_id, 0)
            rejected = 0
            if request.num_computed_tokens - behind >= request.num_tokens:
                rejected = self.sample(request, behind)
            flying.append((request, count, rejected))
        if self.in_flight is not None:
            # this step goes in flight beside the last, whose output is processed when the
            # next step has been scheduled (`run_step`'s start)
            for request, count, _ in flying:
                request.num_in_flight_tokens += count
            self.in_flight.append(flying)
        for request in list(self.running):
            done = self.output_left[request.request_id] <= 0
            if done or request.num_tokens >= MAX_MODEL_LEN - 1:
                self.running.remove(request)
                self.finish(request, deferred=bool(rng.random() < 0.5))
        if rng.random() < 0.04 and (self.running or self.waiting):
            pool = self.running + list(self.waiting)
            victim = pool[int(rng.integers(len(pool)))]
            if victim in self.running:
                self.running.remove(victim)
            else:
                self.waiting.remove(victim)
            self.finish(victim, deferred=bool(rng.random() < 0.5))
            self.aborts += 1
        self.step += 1

    def allocate(self, request: Any, want: int, *hit: Any) -> Any:
        """The manager's `allocate_slots` for `want` new tokens (after a prefix hit's `hit`
        tokens and blocks), with a drafting model's lookahead slots where it drafts."""
        if self.speculative:
            return self.manager.allocate_slots(
                request, want, *hit, num_lookahead_tokens=self.speculative
            )
        return self.manager.allocate_slots(request, want, *hit)

    def sample(self, request: Any, behind: int = 0) -> int:
        """The step's tokens are computed: one token sampled; under speculative decoding the
        scheduled drafts verified first (each accepted while the last was, with probability
        0.6), the rejected ones taken off the tokens computed and the accepted ones output
        before the sampled one, as vLLM's scheduler updates a request from its output; then
        the next step's drafts, within the model's length. Under async scheduling the
        rejected ones stay counted until the step's output is processed (`settle`):
        returned, and added to the request's `behind` (the drafts its earlier steps in
        flight rejected)."""
        rng = self.rng
        # (scheduled and verified)
        drafts = int(request.num_computed_tokens - behind - request.num_tokens)
        left = self.output_left[request.request_id]
        accepted = 0
        while accepted < min(drafts, left - 1) and rng.random() < 0.6:
            accepted += 1
        self.drafted += drafts
        self.accepted += accepted
        if self.in_flight is None:
            request.num_computed_tokens -= drafts - accepted
        elif drafts > accepted:
            self.rejected_in_flight[request.request_id] = behind + drafts - accepted
        proposed = list(request.spec_token_ids)
        request.spec_token_ids = []
        for token in [*proposed[:accepted], int(rng.integers(0, 30000))]:
            request.append_output_token_ids(token)
        self.output_left[request.request_id] = left - accepted - 1
        room = MAX_MODEL_LEN - 1 - request.num_tokens
        if self.speculative and self.output_left[request.request_id] > 0 and room > 0:
            count = min(self.speculative, room)
            request.spec_token_ids = [int(t) for t in rng.integers(0, 30000, count)]
        return drafts - accepted

    def state(self) -> Any:
        return snapshot(
            self.manager,
            requests=self.requests,
            deferred_frees=self.deferred,
            version=self.m.tree.version,
        )


# --- planted faults: each edits the pool as its bug would; None when this step has no place -


def _holders_text(s: _Scheduler, block: Any) -> str:
    names = [
        f"{rid} (group {g})"
        for g, m in enumerate(s.manager.coordinator.single_type_managers)
        for rid, table in m.req_to_blocks.items()
        if any(b is block for b in table)
    ]
    return ", ".join(names) or "none"


def _running_blocks(s: _Scheduler) -> list[tuple[Any, Any]]:
    out: list[Any] = []
    for m in s.manager.coordinator.single_type_managers:
        for request in s.running:
            out.extend((request, b) for b in m.req_to_blocks.get(request.request_id, ()))
    return [(r, b) for r, b in out if not b.is_null]


def _double_free(s: _Scheduler) -> str | None:
    """A finished request's blocks freed, then freed again (an offload path's own free)."""
    if not s.running:
        return None
    request = s.running[-1]
    held = [b for b in _running_blocks(s) if b[0] is request]
    if not held:
        return None
    block = held[-1][1]
    s.running.remove(request)
    s.finish(request, deferred=False)
    s.manager.block_pool.free_blocks([block])
    return f"block {block.block_id} of {request.request_id} freed twice"


def _freed_while_held(s: _Scheduler) -> str | None:
    """A block two requests hold dropped to ref 0 and queued (a free reaching a shared block)."""
    shared = [b for _, b in _running_blocks(s) if b.ref_cnt >= 2]
    if not shared:
        return None
    block = shared[int(s.rng.integers(len(shared)))]
    holders = _holders_text(s, block)
    # one free per holder (one call freeing it twice queues it twice before 0.24.0)
    for _ in range(block.ref_cnt):
        s.manager.block_pool.free_blocks([block])
    return f"block {block.block_id} freed while held by {holders}"


def _forget(s: _Scheduler, request: Any) -> list[Any]:
    """The request's bookkeeping dropped and its blocks handed back unfreed: the manager's
    `pop_blocks_for_free`, or where it has none (before 0.24.0) each group's table taken out
    as that call does."""
    if s.defers:
        return list(s.manager.pop_blocks_for_free(request))
    blocks: list[Any] = []
    for m in s.manager.coordinator.single_type_managers:
        blocks += m.req_to_blocks.pop(request.request_id, [])
        m.num_cached_block.pop(request.request_id, None)
    return blocks


def _leak(s: _Scheduler) -> str | None:
    """A finished request's deferred blocks forgotten: references never released."""
    if not s.running:
        return None
    request = s.running.pop()
    blocks = _forget(s, request)
    s.forget_hashes(request)
    s.requests.pop(request.request_id, None)
    s.output_left.pop(request.request_id, None)
    real = [b.block_id for b in blocks if not b.is_null]
    return f"blocks {real[:6]} of {request.request_id} never freed" if real else None


def _free_count(s: _Scheduler) -> str | None:
    """The free counter run ahead of the queue."""
    s.manager.block_pool.free_block_queue.num_free_blocks += 1
    return "num_free_blocks one ahead of the free queue"


FAULTS: dict[str, Callable[[_Scheduler], str | None]] = {
    "block-freed-twice": _double_free,
    "block-freed-while-held": _freed_while_held,
    "leak": _leak,
    "free-count": _free_count,
}


def run_history(
    modules: Any,
    model: str,
    seed: int,
    steps: int,
    *,
    fault: str | None = None,
    audit_every: bool = True,
    after_steps: int = 200,
    assert_dumps: Path | None = None,
    observe: Callable[[Any], None] | None = None,
    overlap: bool = False,
    speculative: int = 0,
) -> History:
    """`steps` steps of one seeded history, audited after each; a planted `fault` at a drawn
    step. After kvcanary's first finding the history runs on unaudited (`after_steps` at
    most) to hear whether vLLM's own asserts ever say anything. With `assert_dumps`, the
    manager carries the assert hook (`engines.vllm.hook`), writing there when vLLM raises.
    `observe` is handed the workload's scheduler after each step (a bench's own counts).
    With `overlap`, under vLLM's async scheduling (tokens in flight a step); with
    `speculative`, under speculative decoding (that many draft tokens a decode step)."""
    try:
        s = _Scheduler(modules, model, seed, overlap=overlap, speculative=speculative)
    except ModelUnavailableError:
        raise
    except Exception as exc:  # the constructors' calls do not fit this release
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        raise VllmLayoutError(
            f"kvcanary cannot build its KV-cache manager ({KNOWN_LAYOUTS} are built): {text}"
        ) from None
    h = History(model=model, seed=seed)
    if assert_dumps is not None:
        hook = watch_asserts(
            s.manager,
            assert_dumps,
            requests=s.requests,
            deferred_frees=s.deferred,
            version=modules.tree.version,
            context=lambda: {"step": str(s.step), "model": model},
            log=False,
        )
        h.assert_dumps = hook.written
    plant_from = int(s.rng.integers(steps // 4, max(steps // 4 + 1, steps // 2))) if fault else -1
    end = steps
    step = 0
    while step < end:
        try:
            s.run_step()
            if fault and h.fault_step is None and step >= plant_from:
                note = FAULTS[fault](s)
                if note is not None:
                    h.fault_step, h.fault_note = step, note
        except Exception as exc:  # vLLM's asserts, or any raise out of its code
            where = raised_in(exc)
            if where is None and isinstance(exc, (AttributeError, TypeError)):
                # raised by this driver's own calls (a method or signature this release
                # lacks): the tree is not one kvcanary drives, not a complaint of vLLM's
                text = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
                raise VllmLayoutError(
                    f"kvcanary's workload cannot drive its KV-cache manager ({KNOWN_LAYOUTS} "
                    f"are driven): {text}"
                ) from None
            h.crash = VllmCrash(
                step=step,
                exception=type(exc).__name__,
                message=(str(exc).splitlines() or [""])[0][:300],
                raised_in=where,
            )
            break
        h.steps = step + 1
        if observe is not None:
            observe(s)
        if audit_every and h.finding_step is None:
            h.audited += 1
            state = s.state()
            findings = audit(state).findings
            # under async scheduling, read again once the older step's output is processed
            # (a server's pool passes through both states)
            if not findings and s.settle():
                state = s.state()
                findings = audit(state).findings
            if findings:
                h.finding_step, h.findings, h.dump = step, findings, state
                end = min(steps, step + 1 + after_steps)
        step += 1
    h.preemptions, h.prefix_hits, h.aborts = s.preemptions, s.prefix_hits, s.aborts
    h.drafted, h.accepted = s.drafted, s.accepted
    return h
