"""`kvcanary soak`: histories of a seeded random workload on SGLang's real stack, audited after
every step, until the step budget is spent or something is found.

Histories cycle through page sizes (1, 4, 16 unless one is given) and the tree cores the
install has. On kvcanary's first finding, or SGLang's crash: the dump of that step (a crash:
of the last state audited before it), the workload with its seed and step, and a shrunk
workload that still fails the same way go to `--out`. What SGLang's own checks say never stops
a soak: the report counts every complaint per check over the whole run, keeps the first few,
and says who saw a fault first; where only they complained, the first history they complained
in is kept as a finding is (`_keep_complaint`). Importing this module costs only the standard
library: SGLang and torch load when a soak runs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, get_args

from kvcanary_cli.results.soak import (
    SGLANG_RECORDED,
    FirstSeen,
    SGLangCheck,
    SGLangCheckName,
    SGLangMessage,
    SGLangReading,
    SoakFailure,
    SoakFile,
    SoakReplay,
    SoakReport,
)

if TYPE_CHECKING:
    from kvcanary_cli.results.pool_soak import PoolSoakReport
    from kvcanary_cli.soak.driver import RetractTest

__all__ = ["Reproducer", "read_reproducer", "replay", "run_soak", "soak"]

#: Steps per history: short histories find the planted faults early and shrink fast.
HISTORY_STEPS = 80
#: The share of requests the client aborts (waiting, in chunked prefill or running).
ABORTS = 0.15
#: SGLANG_SWA_EVICTION_INTERVAL per history, in turn (0: SGLang's default, 128): decode frees
#: out-of-window SWA only once that many tokens slid out, which short outputs never reach.
SWA_EVICTION_INTERVALS = (1, 0, 4, 16)
#: Every this many histories one builds its allocators with `need_sort` (prefill-decode
#: disaggregation's staged, sorted free lists); 5 is prime to the 6 default stack shapes,
#: so each shape meets it.
NEED_SORT_EVERY = 5
#: Unified memory runs with lazy compaction (SGLang's default there), but for one history in
#: this many (SGLANG_DISABLE_LAZY_COMPACTION, the opt-out SGLang keeps for rollback).
EAGER_COMPACTION_EVERY = 5
#: The Mamba layout's workload (see `history_workload`): prompts up to three chunks, longer
#: outputs, requests that may stop early, aborts more often and within a few steps.
MAMBA_PROMPT = 96
MAMBA_NEW = 40
MAMBA_ABORTS = 0.25
MAMBA_ABORT_WITHIN = 4
#: Client sessions per Mamba history (each a drawn request and one or two later turns): a
#: session's request the adder turns down keeps its copy-on-write Mamba slot while it waits.
MAMBA_SESSIONS = 8
#: Streaming sessions per history of the other layouts (each a drawn request and one or two
#: later turns): each keeps its turn's row, KV and prefix lock between turns and idle steps.
STREAMING_SESSIONS = 4
#: SGLang's per-path Mamba state cap (`--mamba-max-states-per-path`) of the Mamba layout's
#: capped histories, every other history where the release has the option: past it the tree
#: drops a path's shallow Mamba states and keeps their nodes, which an uncapped history
#: never does (its full pool runs short first, and evicted states leave with their node).
MAMBA_PATH_CAP = 2
#: Requests per storage history that come back late to an early request's prompt
#: (`random_workload`'s `returns`): what the host tier evicted by then, storage serves.
STEM_RETURNS = 4
#: Runs a replay of ranks that parted may take: where a per-process order (the ranks' object
#: addresses) decided it, a run in another process can keep the ranks together.
RANK_REPLAYS = 3


#: The releases whose overlapped loop soak models (`--overlap`, `soak.driver`: one loop, whose
#: decode on 0.5.22 on leaves out the requests its queued result finishes by length,
#: `_reqs_finishing_inflight`, and before it allocates for them too:
#: `calls.skips_finishing_decode`), and the layouts it was validated on there (unified memory
#: with its compaction at the sync boundary; the Mamba ones with the decode result's
#: overlapped track masks and the lazy extra buffer; each with the host tier where it runs):
#: another release's loop, or another layout's memory paths under it, may differ in ways the
#: model does not follow. 0.5.13 - 0.5.20's `event_loop_overlap` is 0.5.21's.
OVERLAP_RELEASES = (
    *("0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17"),
    *("0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"),
)
OVERLAP_LAYOUTS = ("swa", "unified", "mamba", "mamba-extra")
#: The releases validated under the overlapped loop on fewer layouts than `OVERLAP_LAYOUTS`:
#: those layouts. Unified memory is left out before 0.5.21: SGLang's own defects end its
#: histories overlapped as without, where the model could not be validated (0.5.17 - 0.5.20's
#: busy check prices the free room in another view than the allocator's and reports a leak on
#: correct states; 0.5.15 - 0.5.18's tree crashes recovering an SWA tombstone under it;
#: docs/soak.md)
OVERLAP_RELEASE_LAYOUTS: dict[str, tuple[str, ...]] = {
    release: ("swa", "mamba", "mamba-extra")
    for release in OVERLAP_RELEASES[: OVERLAP_RELEASES.index("0.5.21")]
}


def _refuse_overlap(version: str | None, layout: str) -> None:
    """One error line where `--overlap` meets what its model was not validated on: another
    release (None: not loaded yet, not checked), another layout; on a release validated on
    fewer layouts (`OVERLAP_RELEASE_LAYOUTS`), another of its layouts."""
    from kvcanary_cli.errors import OptionError

    if layout not in OVERLAP_LAYOUTS:
        raise OptionError(
            f"models SGLang's overlapped loop on the {', '.join(OVERLAP_LAYOUTS)} layouts: "
            f"drop --layout {layout}",
            option="overlap",
        )
    if version is None:
        return
    if version not in OVERLAP_RELEASES:
        raise OptionError(
            f"models the overlapped loop (event_loop_overlap) of SGLang {OVERLAP_RELEASES[0]} "
            f"to {OVERLAP_RELEASES[-1]}, not SGLang {version}'s: run it on one of those",
            option="overlap",
        )
    if not _overlap_modelled(version, layout):
        layouts = OVERLAP_RELEASE_LAYOUTS[version]
        raise OptionError(
            f"models SGLang {version}'s overlapped loop on the {', '.join(layouts)} layouts "
            f"(0.5.21 - 0.5.23's on every layout): drop --layout {layout}",
            option="overlap",
        )


def _overlap_modelled(version: str, layout: str) -> bool:
    """Whether soak models release `version`'s overlapped loop on `layout`, the options' own
    limits aside (`_refuse_overlap`)."""
    if version not in OVERLAP_RELEASES:
        return False
    layouts = OVERLAP_RELEASE_LAYOUTS.get(version)
    return layouts is None or layout in layouts


def history_workload(
    seed: int,
    history: int,
    specs: int,
    page_size: int = 1,
    layout: str = "swa",
    *,
    path_cap: bool = False,
    hicache: bool = False,
    streaming: bool = True,
    radix: bool = False,
    storage: bool = False,
    overlap: bool = False,
) -> Any:
    """The workload of a soak's `history`-th history: its arrivals from its own seed, and the
    serving options it runs under, in turn over rounds of the `specs` stack shapes (so each
    shape meets each option): the early SWA prefix-lock release every other round, the SWA
    eviction interval cycling; every `NEED_SORT_EVERY`-th history with `need_sort`; unified
    memory with lazy compaction but every `EAGER_COMPACTION_EVERY`-th history. Prompts
    reach 60 tokens, or two pages where a page is larger (a prompt shorter than a page is
    never chunked).

    The Mamba layout's requests may stop early (`ignore_eos` off: the adder reserves half of
    a running request's rest, and decode, which runs them to their length, retracts), with
    prompts up to three chunks and aborts within a few steps of arriving (some land in
    chunked prefill): there, fixed-length requests never retracted and no abort ever met a
    chunk. A warm-up of one Mamba chunk (`CHUNK` tokens, one output token) comes before the
    earliest request of each stem: a chunk's checkpoint then can land on a node that already
    holds a state (none did without them). `MAMBA_SESSIONS` of its requests open a client
    session continued by later turns: a session's request the adder turns down keeps its
    copy-on-write Mamba slot, and one aborted then releases it with no KV held (no other
    request does). The other layouts' histories open `STREAMING_SESSIONS` streaming sessions
    instead (with `streaming`: the release is one soak opens them on), whose rows, KV and
    prefix locks outlive their turns. With `path_cap` (the release has
    `--mamba-max-states-per-path`), every other history caps a path's Mamba states at
    `MAMBA_PATH_CAP`, the others run uncapped (a server's default): in a round the first
    shape is capped, the next not, and the next round swaps them, so the first history
    already runs capped and each shape meets both within two rounds. The extra buffer's layout
    (`mamba-extra`) runs the Mamba workload; its track buffer holds two slots (SGLang's
    overlapped scheduler sizes it so) but in every other round, where it holds one
    (`TRACK_SLOTS`). With `hicache`, each history runs SGLang's host tier under one of its
    write policies, in turn (`WRITE_POLICIES`: history by history, so each shape meets each
    within three rounds), and with `storage` (`--hicache-storage`) its storage tier behind it
    under SGLang's prefetch policies in turn (`PREFETCH_POLICIES`, every three histories),
    without streaming sessions (SGLang 0.5.23's storage prefetch crashes on a session's turn:
    docs/soak.md, The storage tier), and with `STEM_RETURNS` requests coming back late to
    early prompts, which by then have left the host and storage serves (no other history
    draws them, so theirs stay as they were).
    With `radix` (`--session-radix-cache`), the sessions are client
    sessions under SGLang's radix sessions in every layout (`STREAMING_SESSIONS` of them
    outside the Mamba layouts), closed once their turns are over (`soak.sessions`).
    With `overlap` (`--overlap`), under SGLang's overlapped loop, every other history with
    SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP on (a prefill after a prefill waits for the
    last one's result), the first one with SGLang's default (off); there the extra buffer's
    track buffer always holds two slots (SGLang's sizing overlapped), and the second and third
    of every four histories run SGLang's lazy strategy (`extra_buffer_lazy`) instead."""
    from kvcanary_cli.soak.mamba import CHUNK, TRACK_SLOTS
    from kvcanary_cli.soak.stack import MAMBA_LAYOUTS
    from kvcanary_cli.soak.workload import PREFETCH_POLICIES, WRITE_POLICIES, random_workload

    rounds = history // specs
    mamba = layout in MAMBA_LAYOUTS
    streaming = streaming and not (hicache and storage)
    drawn = random_workload(
        seed * 1_000_003 + history,
        steps=HISTORY_STEPS,
        requests=20,
        max_prompt=MAMBA_PROMPT if mamba else max(60, 2 * page_size),
        max_new=MAMBA_NEW if mamba else 20,
        aborts=MAMBA_ABORTS if mamba else ABORTS,
        ignore_eos=not mamba,
        abort_within=MAMBA_ABORT_WITHIN if mamba else None,
        warmups=mamba,
        warmup_grid=CHUNK,
        sessions=MAMBA_SESSIONS if mamba else STREAMING_SESSIONS if streaming or radix else 0,
        streaming_sessions=not mamba and streaming and not radix,
        radix_sessions=radix,
        returns=STEM_RETURNS if hicache and storage else 0,
        release_prefill_swa=rounds % 2 == 1,
        swa_eviction_interval=SWA_EVICTION_INTERVALS[rounds % len(SWA_EVICTION_INTERVALS)],
        need_sort=history % NEED_SORT_EVERY == NEED_SORT_EVERY - 1,
        lazy_compaction=layout == "unified" and history % EAGER_COMPACTION_EVERY != 2,
        mamba_max_states_per_path=(
            MAMBA_PATH_CAP if mamba and path_cap and (rounds + history % specs) % 2 == 0 else None
        ),
        hicache_write_policy=WRITE_POLICIES[history % len(WRITE_POLICIES)] if hicache else None,
        mamba_track_slots=TRACK_SLOTS[rounds % 2] if layout == "mamba-extra" else None,
    )
    if overlap:
        drawn = replace(drawn, overlap=True, consecutive_prefill_sync=history % 2 == 1)
    if overlap and layout == "mamba-extra":
        # SGLang sizes the track buffer two slots overlapped; the lazy strategy holds one of
        # them, in two of every four histories (each with and without the prefill sync)
        drawn = replace(drawn, mamba_track_slots=TRACK_SLOTS[0], mamba_lazy=history % 4 in (1, 2))
    if not (hicache and storage):
        return drawn
    # by round, so each write policy meets each prefetch policy
    prefetch = PREFETCH_POLICIES[(history // len(WRITE_POLICIES)) % len(PREFETCH_POLICIES)]
    return replace(drawn, hicache_storage=prefetch)


def _specs(
    page_size: int | None, cores: tuple[str, ...], core: str | None, layout: str = "swa"
) -> list[Any]:
    from kvcanary_cli.soak.stack import StackSpec

    sizes = [page_size] if page_size else [1] if layout == "mamba" else [1, 4, 16]
    chosen = [core] if core else list(cores)
    return [StackSpec.pressured(ps, c, layout) for ps in sizes for c in chosen]


@dataclass
class _Heard:
    """One of SGLang's checks over the soak so far: how often, where, its first complaints."""

    steps: int = 0
    histories: int = 0
    first: list[SGLangMessage] = field(default_factory=list)


def _hear(heard: dict[SGLangCheckName, _Heard], result: Any, spec: Any, seed: int) -> None:
    """Add a history's complaints (`HistoryResult`) to the soak's, keeping the first few."""
    from kvcanary_cli.soak.run import KEEP

    for check, count in result.sglang_counts.items():
        tally = heard.setdefault(check, _Heard())
        tally.steps += count
        tally.histories += 1
        for one in result.sglang_first[check][: KEEP - len(tally.first)]:
            tally.first.append(
                SGLangMessage(
                    seed=seed,
                    page_size=spec.page_size,
                    core=spec.core,
                    step=one.step,
                    when=one.when,
                    message=one.said.message,
                )
            )


def _seen(result: Any, spec: Any, seed: int) -> FirstSeen:
    """Who saw something first in a history that failed or SGLang complained in."""
    failure = result.failure
    kvcanary = failure if failure is not None and failure.crash is None else None
    return FirstSeen(
        seed=seed,
        page_size=spec.page_size,
        core=spec.core,
        kvcanary_step=None if kvcanary is None else kvcanary.step,
        kvcanary_when=None if kvcanary is None else kvcanary.mode,
        sglang_step=result.sglang_step,
        sglang_when=result.sglang_when,
    )


def soak(
    *,
    sglang_tree: str | None,
    steps: int,
    seed: int,
    page_size: int | None = None,
    core: str | None = None,
    fault: str | None = None,
    out: Path,
    force: bool = False,
    timings: bool = False,
    progress: Callable[[int, int], None] | None = None,
    layout: str = "swa",
    coverage: bool = False,
    hicache: bool = False,
    session_radix_cache: bool = False,
    tp: int = 1,
    hicache_storage: bool = False,
    overlap: bool = False,
) -> SoakReport:
    """Run histories until `steps` scheduler steps are spent or one fails (see module); with
    `coverage`, say which memory-cache functions and free paths they ran; with `hicache`,
    with SGLang's host tier on (and with `hicache_storage`, its storage tier behind it:
    `soak.storage`); with `session_radix_cache`, with SGLang's radix sessions on
    (the Python tree core only); with `tp`, on that many tensor-parallel ranks in lockstep,
    compared at every audited step (`soak.tp`); with `overlap`, under SGLang's overlapped
    loop (0.5.13 - 0.5.23: every layout but unified memory before 0.5.21; `_refuse_overlap`).

    `--out` is checked first: a soak is not run to find that its finding cannot be kept."""
    from kvcanary_cli import __version__
    from kvcanary_cli.errors import OptionError
    from kvcanary_cli.option_values import checked_choice
    from kvcanary_cli.output import complain
    from kvcanary_cli.soak.faults import FAULTS, PYTHON_CORE_FAULTS
    from kvcanary_cli.soak.outputs import check_out
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import (
        LAYOUTS,
        drives_radix_sessions,
        drives_streaming_sessions,
        has_path_cap,
        load_sglang,
    )

    if fault is not None:
        checked_choice(fault, list(FAULTS), "fault")
    checked_choice(layout, list(LAYOUTS), "layout")
    if layout == "mamba" and page_size not in (None, 1):
        raise OptionError(
            f"the Mamba layout runs at page size 1 only, not {page_size} (SGLang's Mamba tree "
            "component needs it without the extra buffer: --layout mamba-extra runs it)",
            option="page_size",
        )
    if fault is not None and tp > 1:
        raise OptionError(
            "plants its bug on one stack: run it with --tp 1 (a bug that makes ranks part is "
            "found by the comparison --tp adds)",
            option="fault",
        )
    if fault in PYTHON_CORE_FAULTS and core not in (None, "python"):
        raise OptionError(
            f"the {fault} fault acts on the Python tree core's nodes (the {core} core keeps "
            "their host values out of Python's reach, so it would never act): drop --core",
            option="fault",
        )
    if hicache and layout == "unified":
        raise OptionError(
            "drives SGLang's host tier on the swa, mamba and mamba-extra layouts, not unified "
            "memory",
            option="hicache",
        )
    if hicache_storage and not hicache:
        raise OptionError(
            "runs SGLang's storage tier behind its host tier: add --hicache",
            option="hicache_storage",
        )
    if overlap:
        _refuse_overlap(None, layout)
    check_out(out, force=force)
    modules = load_sglang(sglang_tree)
    if overlap:
        _refuse_overlap(modules.tree.version, layout)
    if hicache_storage:
        from kvcanary_cli.soak.storage import has_storage

        if not has_storage(modules.unified_radix_cache.UnifiedRadixCache):
            raise OptionError(
                f"SGLang {modules.tree.version}'s unified tree takes no storage tier the way "
                "soak drives it (prefetch_from_storage, check_prefetch_progress, "
                "pop_prefetch_loaded_span, is_backuped, get_last_hash_value)",
                option="hicache_storage",
            )
    if hicache:
        from kvcanary_cli.soak.hicache import has_hicache

        if not has_hicache(modules.unified_radix_cache.UnifiedRadixCache):
            raise OptionError(
                f"SGLang {modules.tree.version}'s unified tree takes no host tier "
                "(no init_hicache, check_hicache_events, ready_to_load_host_cache)",
                option="hicache",
            )
    if session_radix_cache:
        if hicache:
            raise OptionError(
                "runs SGLang's radix sessions without its host tier: drop --hicache",
                option="session_radix_cache",
            )
        if core not in (None, "python"):
            raise OptionError(
                f"runs on the Python tree core only (SGLang refuses radix sessions on the "
                f"{core} one): drop --core",
                option="session_radix_cache",
            )
        if not drives_radix_sessions(modules):
            raise OptionError(
                f"SGLang {modules.tree.version}'s unified tree has no radix sessions "
                "(open_radix_session, ensure_session_generation, release_radix_session: "
                "0.5.17 on)",
                option="session_radix_cache",
            )
        core = "python"
    if core is not None and core not in modules.cores:
        why = "".join(f"; {note}" for note in modules.notes)
        raise OptionError(
            f"tree core {core!r} is not in this SGLang (available: "
            f"{', '.join(modules.cores)}){why}",
            option="core",
        )
    specs = _specs(page_size, modules.cores, core, layout)
    if fault in PYTHON_CORE_FAULTS and any(spec.core != "python" for spec in specs):
        complain(
            f"note: the {fault} fault acts on the Python tree core's nodes only: the "
            "histories on the Rust core run without it"
        )
    path_cap = has_path_cap(modules)
    streaming = drives_streaming_sessions(modules)
    tracing = _Coverage(modules, specs, hicache, session_radix_cache) if coverage else None
    started = time.monotonic()
    histories = steps_run = audited = acted = 0
    failed: tuple[Any, Any, Any] | None = None  # the spec, the workload, the audit
    #: the first history only SGLang's checks complained in: its spec, workload, first check
    complained: tuple[Any, Any, SGLangCheckName] | None = None
    heard: dict[SGLangCheckName, _Heard] = {}
    seen: FirstSeen | None = None  # the failing history's, else the first SGLang complained in
    while steps_run < steps and failed is None:
        spec = specs[histories % len(specs)]
        workload = history_workload(
            seed,
            histories,
            len(specs),
            spec.page_size,
            layout,
            path_cap=path_cap,
            hicache=hicache,
            streaming=streaming,
            radix=session_radix_cache,
            storage=hicache_storage,
            overlap=overlap,
        )
        # the budget is steps run: the last history stops where it is spent
        with tracing.tracer.tracing() if tracing else nullcontext():
            result = run_history(
                modules, spec, workload, fault=fault, max_steps=steps - steps_run, tp=tp
            )
        histories += 1
        steps_run += result.steps
        audited += result.audited
        acted += result.fault_acted
        if progress is not None:
            progress(min(steps_run, steps), steps)
        _hear(heard, result, spec, workload.seed)
        if result.failure is not None:
            failed = (spec, workload, result.failure)
        elif complained is None and result.sglang_counts:
            complained = (spec, workload, next(iter(result.sglang_counts)))
        if result.failure is not None or (seen is None and result.sglang_step is not None):
            seen = _seen(result, spec, workload.seed)
    report = SoakReport(
        kvcanary_version=__version__,
        sglang_version=modules.tree.version,
        sglang_root=str(modules.tree.root),
        seed=seed,
        budget=steps,
        histories=histories,
        steps=steps_run,
        audited_steps=audited,
        sglang_checks=tuple(
            SGLangCheck(check=check, steps=t.steps, histories=t.histories, first=tuple(t.first))
            for check, t in heard.items()
        ),
        seen=seen,
        coverage=None if tracing is None else tracing.summary(),
        fault=fault,
        fault_acted=None if fault is None else acted,
        tp=tp,
        overlap=overlap,
    )
    if failed is not None:
        report = _keep_finding(report, modules, *failed, fault, out, force, tp)
    elif complained is not None:
        report = _keep_complaint(report, modules, *complained, fault, out, force, tp)
    if timings:
        report = replace(report, seconds=round(time.monotonic() - started, 2))
    if core is None:  # a tree core the default would have soaked too, once the run went well
        for note in modules.notes:
            complain(f"note: {note}")
    test = _release_retract_test(modules)
    if test is not None:
        complain(f"note: {test.note()}")
    return report


class _Coverage:
    """The tracer of a soak's histories and the free paths of the stacks it builds."""

    def __init__(
        self, modules: Any, specs: list[Any], hicache: bool = False, radix: bool = False
    ) -> None:
        from kvcanary_cli.soak.coverage import Tracer, free_paths, stack_objects
        from kvcanary_cli.soak.stack import build_stack, drives_streaming_sessions
        from kvcanary_cli.soak.workload import WRITE_POLICIES

        folder = modules.tree.root / "sglang" / "srt" / "mem_cache"
        sessions = modules.tree.root / "sglang" / "srt" / "session"
        self.tracer = Tracer(folder, sessions)
        self.mamba = any(spec.layout in ("mamba", "mamba-extra") for spec in specs)
        self.hicache = hicache
        self.radix = radix
        #: the other layouts' histories open streaming sessions (`history_workload`), on the
        #: releases soak opens them on, but under radix sessions (client ones)
        self.streaming = (
            not radix
            and drives_streaming_sessions(modules)
            and any(spec.layout not in ("mamba", "mamba-extra") for spec in specs)
        )
        self.paths: dict[str, Any] = {}
        policy = WRITE_POLICIES[0] if hicache else None
        for spec in specs:  # what each stack shape resolves to (a paged side at page size > 1)
            built = build_stack(modules, spec, hicache_write_policy=policy, radix_sessions=radix)
            objects = stack_objects(built)
            # the allocation functions live in `common` itself before 0.5.16: listed once
            frees = [modules.common]
            if modules.allocation is not modules.common:
                frees.append(modules.allocation)
            self.paths.update(free_paths(objects, frees, folder, sessions))

    def summary(self) -> Any:
        from kvcanary_cli.soak.coverage import summary

        return summary(
            self.tracer,
            self.paths,
            mamba=self.mamba,
            hicache=self.hicache,
            streaming=self.streaming,
            radix=self.radix,
        )


def _keep_finding(
    report: SoakReport,
    modules: Any,
    spec: Any,
    workload: Any,
    failure: Any,
    fault: str | None,
    out: Path,
    force: bool,
    tp: int = 1,
) -> SoakReport:
    """Shrink the failing workload, record the dumps of both (a crash: the last state audited
    before it; ranks that parted: rank 0's state beside the diverging rank's), write the
    files, and say so in the report."""
    from kvcanary_cli.soak.outputs import restamp_step, scratch, write_outputs
    from kvcanary_cli.soak.run import run_history, shrink_workload

    found = _failure(spec, workload, failure, fault)
    key = failure.key

    def fails(candidate: Any) -> bool:
        again = run_history(modules, spec, candidate, fault=fault, sglang_checks=False, tp=tp)
        return again.failure is not None and again.failure.key == key

    shrunk = shrink_workload(workload, fails)
    contents: dict[SoakFile, Path | bytes] = {}
    dumps: dict[SoakFile, Any] = {"dump": workload, "shrunk_dump": shrunk}
    workloads: dict[SoakFile, tuple[Any, SoakFailure]] = {"workload": (workload, found)}
    with scratch() as folder:
        # the dumps: the original failing step, and the shrunk workload's (which still fails,
        # maybe at another step: its reproducer says which)
        for name, chosen in dumps.items():
            (folder / name).mkdir()
            again = run_history(modules, spec, chosen, fault=fault, folder=folder / name, tp=tp)
            if again.failure is None:
                continue
            if again.failure.dump is not None:
                contents[name] = _failing_steps_dump(again.failure, restamp_step)
            reference = again.failure.reference_dump
            if name == "dump" and reference is not None:
                contents["reference_dump"] = _failing_steps_dump(
                    replace(again.failure, dump=reference), restamp_step
                )
            if name == "shrunk_dump":
                workloads["reproducer"] = (shrunk, _failure(spec, shrunk, again.failure, fault))
        workloads.setdefault("reproducer", (shrunk, found))
        for name, (chosen, failed) in workloads.items():
            contents[name] = _workload_file(modules, spec, chosen, asdict(failed), tp)
        files = write_outputs(out, contents, force=force)
    return replace(
        report,
        failure=found,
        files=files,
        shrunk_arrivals=(len(workload.arrivals), len(shrunk.arrivals)),
    )


def _keep_complaint(
    report: SoakReport,
    modules: Any,
    spec: Any,
    workload: Any,
    check: SGLangCheckName,
    fault: str | None,
    out: Path,
    force: bool,
    tp: int = 1,
) -> SoakReport:
    """Only SGLang's `check` complained in this history, kvcanary silent: keep it as a finding
    is kept. The workload shrunk while that check still complains with kvcanary silent, the
    state it first complained of in each (for `kvcanary leak MESSAGE DUMP`: a real leak, or
    the check's count wrong), and the two workload files (`sglang_check`: `--replay` says
    whether the complaint comes back)."""
    from kvcanary_cli.soak.outputs import restamp_step, scratch, write_outputs
    from kvcanary_cli.soak.run import run_history, shrink_workload

    def heard(candidate: Any, folder: Path | None = None) -> Any:
        again = run_history(
            modules, spec, candidate, fault=fault, folder=folder, tp=tp, until_heard=check
        )
        return again.heard_state if again.failure is None else None

    shrunk = shrink_workload(workload, lambda candidate: heard(candidate) is not None)
    contents: dict[SoakFile, Path | bytes] = {}
    chosen: dict[SoakFile, tuple[SoakFile, Any]] = {
        "dump": ("workload", workload),
        "shrunk_dump": ("reproducer", shrunk),
    }
    reading = None
    with scratch() as folder:
        for name, (file, history) in chosen.items():
            (folder / name).mkdir()
            state = heard(history, folder / name)
            if state is None:  # not again (a history is seeded: never seen)
                continue
            said = next(one for one in state.sglang if one.check == check)
            if state.dump is not None:
                contents[name] = _failing_steps_dump(state, restamp_step)
                if name == "dump":
                    reading = _read_complaint(check, state, said.message, contents[name])
            record = {
                **asdict(_failure(spec, history, state, fault)),
                "sglang_check": check,
                "sglang_message": said.message,
            }
            contents[file] = _workload_file(modules, spec, history, record, tp)
        files = write_outputs(out, contents, force=force)
    arrivals = (len(workload.arrivals), len(shrunk.arrivals))
    return replace(report, files=files, shrunk_arrivals=arrivals, reading=reading)


def _read_complaint(
    check: SGLangCheckName, state: Any, message: str, dump: Path | bytes
) -> SGLangReading | None:
    """`kvcanary leak MESSAGE DUMP` on the kept complaint and the state it was said of; None
    where `leak` does not read the message (`sanity_check`'s, or one cut short)."""
    from kvcanary_cli.analysis.leak import leak_report
    from kvcanary_cli.errors import KvcanaryError

    if not isinstance(dump, Path):
        return None
    try:
        told = leak_report(message, dump=dump)
    except KvcanaryError:
        return None
    cause = None if told.cause is None else str(told.cause)
    return SGLangReading(
        check=check, step=state.step, when=state.mode, verdict=told.verdict, cause=cause,
        summary=told.summary,
    )  # fmt: skip


def _workload_file(
    modules: Any, spec: Any, workload: Any, record: dict[str, Any], tp: int
) -> bytes:
    """A workload file (`soak-workload.json`, `soak-reproducer.json`): the stack, what the
    history found (`record`), the release, the ranks, SGLang's retraction test switch where
    it was on (the replay sets it again), and the workload."""
    on = retract_switch_environment(modules)
    meta = {
        "spec": asdict(spec),
        **record,
        "sglang_version": modules.tree.version,
        "tp": tp,
        **({"environment": on} if on else {}),
        "workload": json.loads(workload.to_json()),
    }
    return (json.dumps(meta, indent=1) + "\n").encode()


def _failing_steps_dump(failure: Any, restamp: Callable[[Path, int], Path]) -> Path:
    """The failure's dump, saying the failing step: a state audited once a step's result is
    processed (or at idle) is recorded after the step ran, under the next step's number."""
    crash = failure.crash
    when = failure.mode if crash is None else crash.state_when
    step = failure.step if crash is None else crash.state_step
    if when in ("after-result", "idle") and step is not None:
        return restamp(failure.dump, step)
    return Path(failure.dump)


def _failure(spec: Any, workload: Any, failure: Any, fault: str | None) -> SoakFailure:
    """A failing history (`run.HistoryResult.failure`) as the record says it."""
    return SoakFailure(
        seed=workload.seed,
        page_size=spec.page_size,
        core=spec.core,
        step=failure.step,
        when=failure.mode,
        codes=tuple(failure.codes),
        top_cause=failure.top_cause,
        fault=fault,
        crash=failure.crash,
        crash_after=failure.crash_after,
        rank=failure.rank,
        divergence=failure.divergence,
    )


class Reproducer(NamedTuple):
    """A soak reproducer (or workload) file, as `replay` runs it again."""

    spec: Any
    workload: Any
    fault: str | None
    #: its top cause, `crash <exception>`, `ranks <kind>` or `sglang <check>`
    recorded: str
    #: the SGLang release it ran (None: an earlier soak's file does not say)
    release: str | None
    #: tensor-parallel ranks (an earlier soak's file: 1)
    tp: int
    #: SGLang's environment switches its history ran under (only its retraction test switch,
    #: `driver.TEST_RETRACT`), which a replay sets again; empty for most
    environment: dict[str, str]


def read_reproducer(path: Path) -> Reproducer:
    """The stack spec, workload, fault, recorded finding (its top cause, `crash <exception>`,
    `ranks <kind>`, or `sglang <check>` where the file records only a complaint of SGLang's
    own check: `sglang_check`), SGLang release (None: an earlier soak's file does not say)
    and tensor-parallel ranks (an earlier file: 1) of a reproducer (or workload) file a soak
    wrote; anything else is one error line (exit 2)."""
    from kvcanary_cli.errors import PathError
    from kvcanary_cli.option_values import TP_RANKS
    from kvcanary_cli.soak.faults import FAULTS
    from kvcanary_cli.soak.outputs import RECORDED_CHARACTERS, read_reproducer_text
    from kvcanary_cli.soak.stack import CORES, LAYOUTS, StackSpec
    from kvcanary_cli.soak.workload import Workload

    hint = "give the soak-reproducer.json (or soak-workload.json) a soak wrote"
    text = read_reproducer_text(path, hint=hint)
    try:
        data = json.loads(text)
        spec = StackSpec(**data["spec"])
        workload = Workload.from_json(json.dumps(data["workload"]))
        fault = data["fault"]
        crash = data["crash"]
        recorded = f"crash {crash['exception']}" if crash else data["top_cause"]
        said = data.get("sglang_check")  # only SGLang's own check complained (kvcanary silent)
        if recorded is None and said in get_args(SGLangCheckName):
            recorded = f"{SGLANG_RECORDED}{said}"
        if data.get("divergence"):
            recorded = f"ranks {data['divergence']['kind']}"
        release = data.get("sglang_version")
        tp = data.get("tp", 1)
        environment = _recorded_switches(data.get("environment"))
        fits = (
            (fault is None or fault in FAULTS)
            and spec.core in CORES
            and spec.layout in LAYOUTS
            and isinstance(recorded, str)
            and isinstance(tp, int)
            and TP_RANKS.refusal(tp) is None
            and len(recorded) <= RECORDED_CHARACTERS
            and len(str(release)) <= RECORDED_CHARACTERS
            and all(
                isinstance(v, int) and v > 0
                for k, v in asdict(spec).items()
                if k not in ("core", "layout")
            )
            and all(a.step >= 0 and a.max_new_tokens > 0 and a.prompt for a in workload.arrivals)
        )
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise PathError(
            f"is not a soak reproducer ({type(exc).__name__}: {exc})"[:300],
            path=str(path),
            hint=hint,
        ) from None
    if not fits:
        raise PathError(
            "is not a soak reproducer (a value out of range)", path=str(path), hint=hint
        )
    known = release if isinstance(release, str) else None
    return Reproducer(spec, workload, fault, recorded, known, tp, environment)


def _release_retract_test(modules: Any) -> RetractTest | None:
    """SGLang's retraction test switch as the loaded release reads it (`driver.retract_test`,
    through its `envs`); None where it is off, or the modules carry no such release."""
    from kvcanary_cli.soak.driver import retract_test

    return retract_test(getattr(getattr(modules, "schedule_batch", None), "envs", None))


def retract_switch_environment(modules: Any) -> dict[str, str]:
    """SGLang's retraction test switch and its settings as the environment sets them, where
    the release of `modules` reads the switch on (`driver.retract_test`); empty where off."""
    from kvcanary_cli.soak.driver import TEST_RETRACT

    if _release_retract_test(modules) is None:
        return {}
    return {name: os.environ[name] for name in TEST_RETRACT if name in os.environ}


def _recorded_switches(recorded: object) -> dict[str, str]:
    """The environment switches of SGLang's a reproducer records its history ran under
    (only SGLang's retraction test switch, `driver.TEST_RETRACT`); empty for any other."""
    from kvcanary_cli.soak.driver import TEST_RETRACT

    if not isinstance(recorded, dict):
        return {}
    return {
        name: value
        for name, value in recorded.items()
        if name in TEST_RETRACT and isinstance(value, str) and len(value) <= 32
    }


def replay(*, reproducer: Path, sglang_tree: str | None, timings: bool = False) -> SoakReport:
    """Run a reproducer's workload again (its page size, tree core and fault), audited as a
    soak audits, on `sglang_tree`: whether the finding it recorded comes back. Nothing is
    written: the reproducer's soak wrote the files."""
    from kvcanary_cli import __version__
    from kvcanary_cli.errors import OptionError
    from kvcanary_cli.soak.environment import environment_set
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import load_sglang

    spec, workload, fault, recorded, release, tp, recorded_environment = read_reproducer(reproducer)
    modules = load_sglang(sglang_tree)
    if workload.overlap and not _overlap_modelled(modules.tree.version, spec.layout):
        raise OptionError(
            f"the reproducer's history ran SGLang's overlapped loop on the {spec.layout} "
            f"layout, which soak does not model on SGLang {modules.tree.version}",
            option="replay",
        )
    if spec.core not in modules.cores:
        raise OptionError(
            f"the reproducer's tree core {spec.core!r} is not in this SGLang (available: "
            f"{', '.join(modules.cores)})",
            option="replay",
        )
    started = time.monotonic()
    with ExitStack() as switched:
        for name, value in recorded_environment.items():
            switched.enter_context(environment_set(name, value))
        for _ in range(RANK_REPLAYS if recorded.startswith("ranks ") else 1):
            result = run_history(modules, spec, workload, fault=fault, tp=tp)
            if result.failure is not None and result.failure.key == recorded:
                break
    heard: dict[SGLangCheckName, _Heard] = {}
    _hear(heard, result, spec, workload.seed)
    failure = result.failure
    complained = failure is not None or result.sglang_step is not None
    return SoakReport(
        kvcanary_version=__version__,
        sglang_version=modules.tree.version,
        sglang_root=str(modules.tree.root),
        seed=workload.seed,
        budget=result.steps,
        histories=1,
        steps=result.steps,
        audited_steps=result.audited,
        sglang_checks=tuple(
            SGLangCheck(check=check, steps=t.steps, histories=t.histories, first=tuple(t.first))
            for check, t in heard.items()
        ),
        seen=_seen(result, spec, workload.seed) if complained else None,
        failure=None if failure is None else _failure(spec, workload, failure, fault),
        seconds=round(time.monotonic() - started, 2) if timings else None,
        fault=fault,
        fault_acted=None if fault is None else result.fault_acted,
        tp=tp,
        overlap=workload.overlap,
        replay=SoakReplay(
            reproducer=str(reproducer),
            recorded=recorded,
            reproduced=_came_back(recorded, result),
            recorded_on=release,
        ),
    )


def _came_back(recorded: str, result: Any) -> bool:
    """Whether a replayed history failed as its reproducer recorded: the same top cause or
    crash, or (`sglang <check>`) that check of SGLang's complaining with kvcanary silent."""
    failure = result.failure
    if recorded.startswith(SGLANG_RECORDED):
        return failure is None and recorded[len(SGLANG_RECORDED) :] in result.sglang_counts
    return failure is not None and bool(failure.key == recorded)


def run_soak(
    engine: str = "sglang",
    *,
    sglang_tree: str | None = None,
    vllm_tree: str | None = None,
    vllm_model: str | None = None,
    steps: int = 600,
    seed: int = 0,
    page_size: int | None = None,
    core: str | None = None,
    fault: str | None = None,
    layout: str | None = None,
    out: Path,
    force: bool = False,
    timings: bool = False,
    replaying: Path | None = None,
    coverage: bool = False,
    hicache: bool = False,
    session_radix_cache: bool = False,
    tp: int = 1,
    hicache_storage: bool = False,
    overlap: bool = False,
    speculative_tokens: int = 0,
) -> SoakReport | PoolSoakReport:
    """The command: `engine`'s soak (sglang or vllm: an option of the other's is one error
    line), with a progress bar on a terminal (bad input raises before it runs, exit 2), or
    with `replaying` the replay of that reproducer. Whatever SGLang prints on standard output
    goes to standard error: standard output carries the report."""
    from kvcanary_cli.dump.streams import standard_output_on_standard_error
    from kvcanary_cli.errors import OptionError
    from kvcanary_cli.option_values import checked_choice
    from kvcanary_cli.render.console import progress

    if engine == "vllm":
        from kvcanary_cli.option_values import DRAFT_TOKENS, checked_integer
        from kvcanary_cli.soak.vllm_command import run_vllm_soak

        if coverage:
            raise OptionError("traces SGLang's memory cache only", option="--coverage")
        if hicache:
            raise OptionError("runs SGLang's host tier only", option="--hicache")
        if hicache_storage:
            raise OptionError("runs SGLang's storage tier only", option="--hicache-storage")
        if session_radix_cache:
            raise OptionError("runs SGLang's radix sessions only", option="--session-radix-cache")
        if tp != 1:
            raise OptionError("runs SGLang's tensor-parallel ranks only", option="--tp")
        sglang_options = {"--page-size": page_size, "--core": core, "--layout": layout}
        return run_vllm_soak(
            vllm_tree,
            steps,
            seed,
            fault,
            models=vllm_model,
            out=out,
            force=force,
            timings=timings,
            replaying=replaying,
            sglang_options={**sglang_options, "--sglang-tree": sglang_tree},
            overlap=overlap,
            speculative=checked_integer(speculative_tokens, "speculative_tokens", DRAFT_TOKENS),
        )
    checked_choice(engine, ["sglang", "vllm"], "engine")
    for flag, given in (("--vllm-tree", vllm_tree), ("--vllm-model", vllm_model)):
        if given is not None:
            raise OptionError("is a vLLM soak option: add --engine vllm", option=flag)
    if speculative_tokens:
        raise OptionError(
            "drives vLLM's speculative decoding: add --engine vllm (SGLang's is not modelled)",
            option="speculative_tokens",
        )
    if replaying is not None:
        if coverage:
            raise OptionError(
                "reports coverage of a soak's histories: drop --coverage", option="replay"
            )
        if (
            page_size is not None
            or core is not None
            or fault is not None
            or hicache
            or hicache_storage
            or session_radix_cache
            or tp != 1
            or overlap
        ):
            raise OptionError(
                "takes the page size, tree core, fault, host tier, storage tier, radix "
                "sessions, ranks and scheduler loop from the reproducer: drop --page-size, "
                "--core, --fault, --hicache, --hicache-storage, --session-radix-cache, --tp "
                "and --overlap",
                option="replay",
            )
        with standard_output_on_standard_error():
            return replay(reproducer=replaying, sglang_tree=sglang_tree, timings=timings)
    with (
        standard_output_on_standard_error(),
        progress(f"soaking SGLang for {steps} steps", 2) as tick,
    ):
        return soak(
            sglang_tree=sglang_tree,
            steps=steps,
            seed=seed,
            page_size=page_size,
            core=core,
            fault=fault,
            out=out,
            force=force,
            timings=timings,
            progress=tick,
            layout=layout or "swa",
            coverage=coverage,
            hicache=hicache,
            session_radix_cache=session_radix_cache,
            tp=tp,
            hicache_storage=hicache_storage,
            overlap=overlap,
        )


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use `kvcanary soak`")
