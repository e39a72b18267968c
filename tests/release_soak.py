"""A few soak histories on one older SGLang release, in a process of its own (one SGLang per
process): `python -m tests.release_soak WHEEL` prints one JSON line per history.

Clean histories on each layout the release has (page sizes 1, 4 and 16, both tree cores where it
has the Rust one; Mamba at page size 1, with and without the extra buffer), one with the
`lock-leak` fault planted (only kvcanary's lock counts see it) and one with
`double-free-group-end` (SGLang's checks see it too: they run on this release) and one with
`unmapped-representative` (refused in one line where the release has no SWA segment frees; a
layout the release has no code for is refused the same way), each the seed-0 workload `kvcanary
soak` gives its first history. For each: what kvcanary found (the top cause), whether SGLang's
checks spoke, and how often the live accounting fell back to the whole `check` (0 where soak
models the release exactly). First, the module of the tree core each core name builds, and the
notes the loaded tree has for the user (a Rust core it lacks).

`python -m tests.release_soak WHEEL parked` replays the shipped reproducer of 0.5.19's busy
check over a parked chunk, as it is and with the check counting the parked request (`parked`).
`python -m tests.release_soak WHEEL evict-short` replays the shipped reproducer of 0.5.21's
unified allocator evicting short of its own plan, as it is and with the plan handed to the tree
as quotas, as 0.5.22 hands it (`evict_short`).

`python -m tests.release_soak WHEEL session-unlock [twin]` replays the shipped reproducer of
0.5.17 - 0.5.19's streaming session close dropping another request's SWA lock count, as it is
or with the session slot keeping its first turn's early SWA release (`session_unlock`).

`python -m tests.release_soak WHEEL host-locked` replays the shipped reproducer of 0.5.20's
`sanity_check` counting host-locked nodes against its host LRU list (`host_locked`).

`python -m tests.release_soak WHEEL overlap` runs two histories under SGLang's overlapped loop
(`--overlap`: consecutive prefills overlapped, then synced; page sizes 1 and 4), each state
audited by the live accounting and the whole `check`, with the loop's path counts (`overlap`).

`python -m tests.release_soak WHEEL hicache` runs the host tier's first history (page size 1,
Python core) clean and with `host-evict-leak` planted, counting the live audits whose capture
vouched that only the free lists and the nodes hold host slots (the host-slot leak check on:
`hicache`).

`python -m tests.release_soak serve` runs such processes for a test session: one JSON
request a line on its standard input (`{"args": [WHEEL, ...], "out": PATH}`), each run in a
process forked for it (still one SGLang per process) with its standard output and error in
`PATH` and `PATH.err`, its exit status the line the server answers. What the first run
imported besides SGLang (torch, transformers, ...: 9.4 s of the 11 s of CPU a release takes to
import) the server imports after it, as `load_sglang` prepares them, so that the runs after
it import only their release. The costliest of those modules (`AHEAD`) it imports before its
first run, which imported them only for the server to import them again.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kvcanary_cli.soak import stack
from kvcanary_cli.soak.command import history_workload
from kvcanary_cli.soak.run import run_history
from kvcanary_cli.soak.stack import (
    SGLangUnavailableError,
    StackSpec,
    build_stack,
    drives_streaming_sessions,
    load_sglang,
)

#: (layout, page size, core, fault) of each history; a core the release lacks: the Python one
HISTORIES = (
    ("swa", 1, "python", None),
    ("swa", 4, "rust", None),
    ("swa", 16, "python", None),
    ("unified", 4, "python", None),
    ("mamba", 1, "rust", None),
    ("mamba-extra", 1, "python", None),
    ("swa", 4, "rust", "lock-leak"),
    ("swa", 1, "python", "double-free-group-end"),
    ("swa", 4, "rust", "unmapped-representative"),
)


def main(wheel: str) -> None:
    """Run `HISTORIES` on `wheel`'s SGLang, one JSON line each."""
    modules = load_sglang(wheel)
    # the tree core each core name builds (0.5.19 - 0.5.20 take it from the environment; a
    # tree without a core, 0.5.13 - 0.5.16, holds its nodes itself)
    trees = {c: build_stack(modules, StackSpec(core=c)).tree for c in modules.cores}
    built = {c: getattr(tree, "tree_core", tree) for c, tree in trees.items()}
    cores = {c: type(core).__module__ for c, core in built.items()}
    print(json.dumps({"cores": cores, "notes": list(modules.notes)}))
    for layout, page_size, core, fault in HISTORIES:
        core = core if core in modules.cores else "python"
        spec = StackSpec.pressured(page_size, core, layout)
        workload = history_workload(
            0, 0, 1, page_size, layout, streaming=drives_streaming_sessions(modules)
        )
        try:
            result = run_history(modules, spec, workload, fault=fault)
        except SGLangUnavailableError as exc:  # a fault or layout this release has no code for
            refused = {"layout": layout, "page_size": page_size, "fault": fault}
            print(json.dumps({**refused, "refused": str(exc)}), flush=True)
            continue
        failure = result.failure
        line = {
            "layout": layout,
            "page_size": page_size,
            "core": core,
            "fault": fault,
            "steps": result.steps,
            "found": None if failure is None else failure.key,
            "sglang": sorted(result.sglang_counts),
            "fallbacks": result.fallbacks,
        }
        print(json.dumps(line), flush=True)


def onset(wheel: str) -> None:
    """The first `swa` history of 0.5.13 - 0.5.14 (their SWA defect) at page sizes 1 and 16,
    up to step 26, one JSON line each: where kvcanary flags it (the step the defect first
    frees a held full value), with which codes, and the live audit's fallbacks before it."""
    modules = load_sglang(wheel)
    for page_size in (1, 16):
        spec = StackSpec.pressured(page_size, "python", "swa")
        workload = history_workload(
            0, 0, 1, page_size, "swa", streaming=drives_streaming_sessions(modules)
        )
        result = run_history(modules, spec, workload, sglang_checks=False, max_steps=26)
        failure = result.failure
        line = {
            "page_size": page_size,
            "step": None if failure is None else failure.step,
            "found": None if failure is None else failure.key,
            "codes": [] if failure is None else sorted(set(failure.codes)),
            "fallbacks": result.fallbacks,
        }
        print(json.dumps(line), flush=True)


#: The shrunk history where SGLang 0.5.19's busy check reads a parked chunk as leaked.
PARKED_CHUNK = "docs/reproducers/sglang-0.5.19-busy-check-parked-chunk.json"


def parked(wheel: str) -> None:
    """`PARKED_CHUNK` replayed twice on `wheel`'s SGLang, one JSON line each: as it is, then
    with the busy check counting the chunked request parked between chunks too (what 0.5.20's
    `get_chunked_req` adds). Each says kvcanary's finding, SGLang's complaints (step, and how
    many tokens short of the pool the busy check's sum came), and the decode steps that ran
    with a chunk parked (step, its uncached tokens: allocated past its cached prefix)."""
    from kvcanary_cli.soak import run
    from kvcanary_cli.soak.command import read_reproducer
    from kvcanary_cli.soak.driver import Scheduler

    modules = load_sglang(wheel)
    spec, workload, fault, *_ = read_reproducer(Path(PARKED_CHUNK))
    checker = modules.invariant_checker.SchedulerInvariantChecker
    summed = checker._get_total_uncached_sizes
    watched: list[Any] = []

    class Watched(Scheduler):
        """Soak's loop, noting the decode steps a chunked request sat out."""

        def __post_init__(self) -> None:
            super().__post_init__()
            self.parked: list[list[int]] = []
            watched[:] = [self]

        def step(self, on_plan: Any = None) -> Any:
            info = super().step(on_plan)
            if info.mode == "decode" and self.chunked_req is not None:
                self.parked.append([info.step, _uncached(self.chunked_req.kv)])
            return info

    def with_parked_chunk(self: Any) -> tuple[int, int]:
        # the release's own sum, over the last batch with the parked request in it
        chunk = watched[0].chunked_req if watched else None
        last, running = self.get_last_batch(), self.get_running_batch()
        held = [r for b in (last, running) if b is not None for r in b.reqs]
        if chunk is None or last is None or any(r is chunk for r in held):
            return summed(self)  # type: ignore[no-any-return]
        both = SimpleNamespace(reqs=[*last.reqs, chunk], is_empty=lambda: False)
        getters = self.get_last_batch, self.get_running_batch
        self.get_last_batch = lambda: both
        self.get_running_batch = lambda: both if running is last else running
        try:
            return summed(self)  # type: ignore[no-any-return]
        finally:
            self.get_last_batch, self.get_running_batch = getters

    setattr(run, "Scheduler", Watched)  # run_history's loop, for these two runs  # noqa: B010
    for counted in (False, True):
        checker._get_total_uncached_sizes = with_parked_chunk if counted else summed
        result = run.run_history(modules, spec, workload, fault=fault)
        said = [
            {"step": c.step, "short": _short(c.said.message)}
            for c in result.sglang_first.get("self_check_during_busy", [])
        ]
        line = {
            "counted": counted,
            "found": None if result.failure is None else result.failure.key,
            "sglang": result.sglang_counts,
            "busy": said,
            "parked": watched[0].parked,
        }
        print(json.dumps(line), flush=True)


#: The shrunk history where SGLang 0.5.19's streaming session close drops another request's
#: SWA lock count (its first turn had released its own early).
SESSION_UNLOCK = "docs/reproducers/sglang-0.5.19-session-close-swa-unlock.json"


def session_unlock(wheel: str, twin: bool) -> None:
    """`SESSION_UNLOCK` replayed on `wheel`'s SGLang, one JSON line: as it is, or (`twin`)
    with the session slot keeping its first turn's early SWA release and its close then
    leaving the SWA part alone (what 0.5.20's slot does). The line says kvcanary's finding
    (step, where in it, codes), SGLang's complaints, the live audit's fallbacks, and each
    close of a session whose first turn released its SWA lock early: the SWA lock counts it
    took off its path's nodes (`taken`) and how many of those were another lock's (`others`:
    the running requests' locks through the node, counted before the close); None where
    the slot keeps the flag itself (0.5.20 on: the history runs unwatched, and no twin)."""
    from kvcanary_cli.soak import run
    from kvcanary_cli.soak.command import read_reproducer

    modules = load_sglang(wheel)
    spec, workload, fault, *_ = read_reproducer(Path(SESSION_UNLOCK))
    streaming = importlib.import_module("sglang.srt.session.streaming_session")
    kinds = importlib.import_module("sglang.srt.mem_cache.unified_cache.component_type")
    swa = kinds.ComponentType.SWA
    slots = streaming.SessionSlot
    closes: list[dict[str, int]] = []
    #: the watched loop's running requests, read at a close
    running: list[Callable[[], list[Any]]] = []
    early: dict[int, bool] = {}
    save, release = slots.save_from_req, streaming.StreamingSession.release_session

    def saving(self: Any, req: Any, is_first: bool) -> None:
        if is_first:
            early[id(self)] = bool(req.swa_prefix_lock_released)
        save(self, req, is_first)

    def counts(tree: Any, node: Any) -> dict[int, int]:
        core = tree.tree_core
        node, seen = core.node_by_id(node), {}
        while node is not core.root_node:
            seen[node.id] = node.component_data[swa].lock_ref
            node = node.parent
        return seen

    def others(tree: Any, ids: set[int]) -> int:
        """The running requests' SWA locks through `ids` (each reaching its window's edge)."""
        core, held = tree.tree_core, 0
        for req in running[0]() if running else ():
            if req.last_node is None or req.swa_prefix_lock_released or req.session:
                continue
            node = core.node_by_id(req.last_node)
            while node is not core.root_node:
                data = node.component_data[swa]
                held += node.id in ids and data.lock_ref > 0
                if data.metadata.get("uuid") == req.swa_uuid_for_lock:
                    break
                node = node.parent
        return held

    def releasing(self: Any, session_id: str) -> None:
        slot = self.slots.get(session_id)
        if slot is None or slot.last_node is None or not early.get(id(slot)):
            release(self, session_id)
            return
        tree = self.inner
        before = counts(tree, slot.last_node)
        theirs = others(tree, {i for i, n in before.items() if n})
        if twin:  # the close leaves the SWA part alone, as 0.5.20's `skip_swa` does
            plain = tree.dec_lock_ref
            tree.dec_lock_ref = lambda node, params=None: plain(node, params, skip_swa=True)
        try:
            release(self, session_id)
        finally:
            if twin:
                del tree.dec_lock_ref
        after = counts(tree, slot.last_node)
        taken = sum(before[i] - after.get(i, 0) for i in before)
        closes.append({"taken": taken, "others": theirs})

    class Watched(run.Scheduler):  # type: ignore[name-defined,misc]
        """Soak's loop, its running requests readable by the close's watch."""

        def __post_init__(self) -> None:
            super().__post_init__()
            running[:] = [lambda: list(self.running.reqs)]

    # 0.5.20 on the slot keeps the flag itself: the history runs as it is, unwatched
    kept = hasattr(slots(), "swa_prefix_lock_released")
    if twin and kept:
        raise SystemExit(f"{wheel}: the slot keeps its early release already (no twin)")
    if not kept:
        slots.save_from_req = saving
        streaming.StreamingSession.release_session = releasing
        setattr(run, "Scheduler", Watched)  # noqa: B010
    result = run.run_history(modules, spec, workload, fault=fault)
    failure = result.failure
    line = {
        "twin": twin,
        "found": None if failure is None else failure.key,
        "step": None if failure is None else failure.step,
        "when": None if failure is None else failure.mode,
        "codes": [] if failure is None else sorted(set(failure.codes)),
        "sglang": result.sglang_counts,
        "fallbacks": result.fallbacks,
        "closes": None if kept else closes,
    }
    print(json.dumps(line), flush=True)


def _uncached(kv: Any) -> int:
    """A request's KV past what the tree caches for it (page size 1)."""
    return int(kv.kv_allocated_len - kv.cache_protected_len) if kv.holds_kv else 0


def _short(message: str) -> int:
    """How many tokens the busy check's sum (`[full] total=..., available=..., ...`) came
    short of its total."""
    counts = dict(re.findall(r"(\w+)=(\d+)", message))
    total = int(counts.pop("total"))
    return total - sum(int(v) for v in counts.values())


#: The shrunk history where SGLang 0.5.21's unified allocator evicts short of its own plan.
EVICT_SHORT = "docs/reproducers/sglang-0.5.21-unified-evict-short-oom.json"
#: Where 0.5.21's unified (full + SWA) allocator lives.
UNIFIED_SWA = "sglang.srt.mem_cache.allocator.unified_hybrid_swa"


def overlap(wheel: str) -> None:
    """Two overlapped histories of `wheel`'s SGLang (see the module's docstring), one JSON line
    each: what was found, SGLang's checks, and the overlapped loop's counters."""
    modules = load_sglang(wheel)
    streaming = drives_streaming_sessions(modules)  # as a soak: not where the sessions' defects are
    for history, page_size in ((0, 1), (1, 4)):
        workload = history_workload(0, history, 6, page_size, overlap=True, streaming=streaming)
        spec = StackSpec.pressured(page_size, "python")
        result = run_history(modules, spec, workload, mode="both")
        failure = result.failure
        line = {
            "page_size": page_size,
            "steps": result.steps,
            "found": None if failure is None else failure.key,
            "sglang": sorted(result.sglang_counts),
            "counters": result.counters.as_dict(),
        }
        print(json.dumps(line), flush=True)


def hicache(wheel: str) -> None:
    """The host tier's first history on `wheel`'s SGLang (page size 1, Python core, up to
    60 steps) clean, then with `host-evict-leak` planted, one JSON line each: what was found
    (step, codes), how often the fault acted, SGLang's checks, and how many live host audits
    ran and how many of them the capture vouched for (`host_slots_accounted`: the leak
    check ran)."""
    from kvcanary_cli.soak import live

    modules = load_sglang(wheel)
    counted = {"audits": 0, "vouched": 0}
    audit = live.LiveAudit._host

    def counting(self: Any, state: Any, idle: bool) -> Any:
        counted["audits"] += 1
        counted["vouched"] += int((state.host or {}).get("host_slots_accounted", 0)) == 1
        return audit(self, state, idle)

    setattr(live.LiveAudit, "_host", counting)  # noqa: B010
    try:
        for fault in (None, "host-evict-leak"):
            counted.update(audits=0, vouched=0)
            spec = StackSpec.pressured(1, "python")
            workload = history_workload(0, 0, 1, 1, hicache=True)
            result = run_history(modules, spec, workload, fault=fault, max_steps=60)
            failure = result.failure
            line = {
                "fault": fault,
                "steps": result.steps,
                "found": None if failure is None else failure.key,
                "step": None if failure is None else failure.step,
                "codes": [] if failure is None else sorted(set(failure.codes)),
                "acted": result.fault_acted,
                "sglang": sorted(result.sglang_counts),
                **counted,
            }
            print(json.dumps(line), flush=True)
    finally:
        setattr(live.LiveAudit, "_host", audit)  # noqa: B010


#: The shrunk history (a soak kept it: only SGLang's check complained) where SGLang 0.5.20's
#: `sanity_check` counts host-locked nodes against the SWA host LRU list they are out of.
HOST_LOCKED = "docs/reproducers/sglang-0.5.20-storage-sanity-check-host-locked.json"


def host_locked(wheel: str) -> None:
    """`HOST_LOCKED` replayed on `wheel`'s SGLang (its recorded environment, as `--replay`
    sets it), one JSON line: kvcanary's finding, SGLang's complaints per check and where the
    first was, and the first complaint's message."""
    from kvcanary_cli.soak import run
    from kvcanary_cli.soak.command import read_reproducer

    modules = load_sglang(wheel)
    spec, workload, fault, *_ = read_reproducer(Path(HOST_LOCKED))
    result = run.run_history(modules, spec, workload, fault=fault)
    first = [c.said.message for kept in result.sglang_first.values() for c in kept[:1]]
    line = {
        "found": None if result.failure is None else result.failure.key,
        "sglang": result.sglang_counts,
        "sglang_step": result.sglang_step,
        "sglang_when": result.sglang_when,
        "said": first[:1],
    }
    print(json.dumps(line), flush=True)


def evict_short(wheel: str) -> None:
    """`EVICT_SHORT` replayed twice on `wheel`'s SGLang, one JSON line each: as it is, then
    with the unified allocator's `evict_to_free_tokens` handing its reclaim plan to the tree
    as eviction quotas (`evict`: what 0.5.22's calls) instead of as capacity targets
    (`evict_for_alloc`: what 0.5.21's calls). Each says kvcanary's finding, SGLang's
    complaints, where a crash was raised, and each allocation that needed eviction:
    [tokens asked, the plan's full and SWA tokens, full and SWA tokens the tree evicted, the
    joint tokens available after, full tokens still evictable after]."""
    from kvcanary_cli.dump.streams import standard_output_on_standard_error
    from kvcanary_cli.soak.command import read_reproducer

    modules = load_sglang(wheel)
    spec, workload, fault, *_ = read_reproducer(Path(EVICT_SHORT))
    allocator = importlib.import_module(UNIFIED_SWA).UnifiedSWATokenToKVPoolAllocator
    params = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache").EvictParams
    shipped = allocator.evict_to_free_tokens
    evictions: list[list[int]] = []

    def plan_of(self: Any, tree: Any, tokens: int, swa_tokens: int) -> Any:
        return self.reclaim_plan(
            tokens,
            swa_tokens,
            full_evictable_tokens=tree.full_evictable_size(),
            swa_evictable_tokens=tree.swa_evictable_size(),
        )

    def by_quotas(self: Any, tree: Any, tokens: int, *, swa_num_tokens: Any = None) -> Any:
        swa_tokens = tokens if swa_num_tokens is None else swa_num_tokens
        plan = plan_of(self, tree, tokens, swa_tokens)
        if plan is None:
            return None
        if plan != (0, 0):
            tree.evict(params(num_tokens=plan[0], swa_num_tokens=plan[1]))
        return self.ensure_capacity(tokens, swa_tokens)

    def noted(evict: Any) -> Any:
        def run(self: Any, tree: Any, tokens: int, *, swa_num_tokens: Any = None) -> Any:
            swa_tokens = tokens if swa_num_tokens is None else swa_num_tokens
            plan = plan_of(self, tree, tokens, swa_tokens)
            full, swa = tree.full_evictable_size(), tree.swa_evictable_size()
            fits = evict(self, tree, tokens, swa_num_tokens=swa_num_tokens)
            if plan is not None and plan != (0, 0):
                left = tree.full_evictable_size()
                evicted = [full - left, swa - tree.swa_evictable_size()]
                evictions.append([tokens, *plan, *evicted, self.available_size(), left])
            return fits

        return run

    try:
        for quotas in (False, True):
            evictions.clear()
            allocator.evict_to_free_tokens = noted(by_quotas if quotas else shipped)
            with standard_output_on_standard_error():  # the tree SGLang prints at its crash
                result = run_history(modules, spec, workload, fault=fault)
            crash = None if result.failure is None else result.failure.crash
            line = {
                "quotas": quotas,
                "found": None if result.failure is None else result.failure.key,
                "step": None if result.failure is None else result.failure.step,
                "raised_in": None if crash is None else crash.raised_in,
                "sglang": result.sglang_counts,
                "evictions": evictions,
            }
            print(json.dumps(line), flush=True)
    finally:
        allocator.evict_to_free_tokens = shipped


def leak_rows(wheel: str, folder: str) -> None:
    """A leak dump the capture hook writes (`capture_leak`, in `folder`) at the first decode
    step of a seed-0 `swa` history (page size 1) where a chunked request sits parked, with the
    release's streaming sessions on: one JSON line saying whether the dump records the rows
    the checker's requests hold (`running_req_rows`), whether the parked request's row is
    among them, and the error codes `check` finds (a correct state: none). Beside it, the
    codes of the same state recorded with the batches' requests alone (the parked request
    left out)."""
    from kvcanary_cli.api import check
    from kvcanary_cli.capture import leaks, triggers
    from kvcanary_cli.capture import tree as tree_capture
    from kvcanary_cli.dump.loader import load_dump
    from kvcanary_cli.dump.writer import save_dump
    from kvcanary_cli.soak.audit import SGLangChecks
    from kvcanary_cli.soak.driver import Scheduler, serving_options
    from kvcanary_cli.soak.run import history_stack

    modules = load_sglang(wheel)
    triggers.configure(triggers.Settings(dump_dir=Path(folder)))
    spec = StackSpec.pressured(1, "python", "swa")
    for history in range(12):
        workload = history_workload(0, history, 1, 1, "swa", streaming=True)
        scheduler = Scheduler(history_stack(modules, spec, workload), workload)
        checker = SGLangChecks(scheduler).checker
        undo = serving_options(workload, modules.schedule_batch)
        try:
            while scheduler.step_no < workload.steps * 4 and not scheduler.done:
                info = scheduler.step(None)
                chunk = scheduler.chunked_req
                if info.mode == "decode" and chunk is not None:
                    break
            else:
                continue
            leaks.capture_leak(checker, "Full Pool Mem Leak Detected! (kvcanary test)", raised=True)
            (written,) = sorted(Path(folder).glob("*.safetensors"))
            rows = load_dump(written).running_req_rows
            stack = scheduler.stack
            batches = [r for b in (scheduler.last_batch, scheduler.running) for r in b.reqs]
            tensors, metadata = tree_capture.capture_state(
                req_to_token_pool=stack.req_to_token_pool,
                allocator=stack.allocator,
                tree=stack.tree,
                requests=list({id(r): r for r in batches}.values()),
                window=spec.window,
            )
            alone = Path(folder) / "batches-alone.sft"
            save_dump(alone, metadata={**metadata, "sglang.version": "x"}, **tensors)
            line = {
                "history": history,
                "step": info.step,
                "rows_recorded": rows is not None,
                "chunk_row_in_rows": rows is not None
                and int(chunk.kv.req_pool_idx) in [int(r) for r in rows],
                "codes": _error_codes(check([written], kernel="none")),
                "batches_alone_codes": _error_codes(check([alone], kernel="none")),
            }
            print(json.dumps(line), flush=True)
            return
        finally:
            undo()
    print(json.dumps({"history": None}), flush=True)


def _error_codes(report: Any) -> list[str]:
    """The error finding codes of a one-dump `check` report, sorted."""
    (dump,) = report.dumps
    return sorted({f.code.value for f in dump.findings if f.severity.value == "error"})


def _run(args: list[str]) -> None:
    if args[1:] == ["onset"]:
        onset(args[0])
    elif args[1:] == ["parked"]:
        parked(args[0])
    elif args[1:] in (["session-unlock"], ["session-unlock", "twin"]):
        session_unlock(args[0], twin=args[2:] == ["twin"])
    elif args[1:] == ["host-locked"]:
        host_locked(args[0])
    elif args[1:] == ["overlap"]:
        overlap(args[0])
    elif args[1:] == ["hicache"]:
        hicache(args[0])
    elif args[1:] == ["evict-short"]:
        evict_short(args[0])
    elif args[1:2] == ["leak-rows"]:
        leak_rows(args[0], args[2])
    else:
        main(args[0])


#: What every release's memory cache imports besides SGLang that costs most (SGLang 0.5.23:
#: 8.4 s of the 9.4 s of CPU its import spends outside SGLang), imported by the server before
#: its first run: that run imports the rest, and so does the server after it.
AHEAD = (
    *("torch", "torch._dynamo", "torch._dynamo.repro.after_dynamo", "torch._inductor.compile_fx"),
    *("transformers.configuration_utils", "transformers.image_processing_utils"),
    *("openai.types.responses", "IPython.display", "gguf", "requests"),
)


def serve() -> None:
    """Answer each request line of standard input with the exit status of a forked run
    (see the module's docstring)."""
    _import_as_sglang_does(list(AHEAD))
    warm = False
    for request in sys.stdin:
        asked = json.loads(request)
        out = asked["out"]
        pid = os.fork()
        if pid == 0:  # the run: nothing of it returns to the server but its files
            status = 1
            try:
                for fd, path in ((1, out), (2, out + ".err")):
                    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
                _run(asked["args"])
                imported = [name for name in sys.modules if not stack._is_sglang(name)]
                with open(out + ".modules", "w") as modules:
                    json.dump(imported, modules)
                status = 0
            except BaseException:  # noqa: BLE001  (the run's failure is its exit status)
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code == 0 and not warm:
            warm = True
            with open(out + ".modules") as modules:
                _import_as_sglang_does(json.load(modules))
        print(json.dumps({"exit": code}), flush=True)


def _import_as_sglang_does(names: list[str]) -> None:
    """Import `names` (what a run imported besides SGLang) here, prepared as `load_sglang`
    prepares them (transformers first, stand-ins for what is missing, triton interpreted); a
    module that does not import outside SGLang's is left to the runs."""
    stack._prepare_imports()
    stack._interpret_triton()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            if name not in sys.modules:
                try:
                    importlib.import_module(name)
                except BaseException:  # noqa: BLE001, S112  (the run imports it, or says)
                    continue


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
        # its input closed, every answer given: what it imported (torch, transformers, ...)
        # is left to the exit, not collected again first (3.7 s, the test session waiting)
        sys.stdout.flush()
        os._exit(0)
    else:
        _run(sys.argv[1:])
