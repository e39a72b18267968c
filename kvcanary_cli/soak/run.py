"""One soak history, and shrinking a failing one.

`run_history` builds a fresh stack, plants the fault (if any), runs the workload step by step
and audits the chosen steps (`soak.audit`: at plan time, after the step's result, at idle);
it stops at the first step kvcanary flags, or where SGLang's code raises (a crash: the dump
is the last state audited before it; where kvcanary's plan-time audit had flagged that step,
its finding is the failure and the crash is kept beside it). What SGLang's own checks say
does not stop it: every complaint is counted per check, the first few kept.
`shrink_workload` then removes arrivals while the history still fails the same way (same top
cause, or same crash): delta debugging over the arrival list, ending with one-at-a-time
removal, so the reproducer is 1-minimal in its arrivals.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

from kvcanary_cli.results.soak import (
    CheckPoint,
    SGLangCheckName,
    SGLangCrash,
    SGLangPoint,
    StatePoint,
)
from kvcanary_cli.soak.audit import Audit, Said, SGLangChecks, audit_step, record_dump
from kvcanary_cli.soak.driver import Counters, Scheduler, StepInfo, serving_options
from kvcanary_cli.soak.faults import plant
from kvcanary_cli.soak.live import LiveAudit
from kvcanary_cli.soak.stack import (
    OLDEST,
    SUPPORTED,
    SGLangModules,
    SGLangUnavailableError,
    Stack,
    StackSpec,
    build_stack,
    fitting,
    refusing_sglang_exits,
)
from kvcanary_cli.soak.storage import storage_folder
from kvcanary_cli.soak.tp import RankGlobals, first_divergence, host_tier_group
from kvcanary_cli.soak.tp_group import RanksParted, collectives_in_process
from kvcanary_cli.soak.workload import Workload

__all__ = [
    "KEEP",
    "AuditMode",
    "Complaint",
    "HistoryResult",
    "Verdict",
    "run_history",
    "shrink_workload",
]

#: How a history audits: `live` (soak.live's accounting, the whole `check` where it breaks),
#: `full` (the whole `check` on every state), `both` (both on every state, to compare).
AuditMode = Literal["live", "full", "both"]

#: Complaints kept per check (in a history, and in a soak's report); the rest are counted.
KEEP = 3


@dataclass(frozen=True)
class Complaint:
    """One complaint of SGLang's checks in a history: where it was said, and what."""

    step: int
    when: CheckPoint
    said: Said


@dataclass(frozen=True)
class Verdict:
    """One audited state seen both ways (`both`): the live audit's broken fact (None: it
    passed the state) and the whole `check`'s error codes."""

    step: int
    when: str
    broken: str | None
    codes: tuple[str, ...]


@dataclass
class HistoryResult:
    """What a history did, the first step flagged (None: clean), and what SGLang's checks
    said on the way."""

    steps: int
    audited: int
    counters: Counters
    failure: Audit | None = None
    #: per check (in the order they first complained): the audited steps it complained on
    sglang_counts: dict[SGLangCheckName, int] = field(default_factory=dict)
    #: per check: its first `KEEP` complaints
    sglang_first: dict[SGLangCheckName, list[Complaint]] = field(default_factory=dict)
    #: the first step SGLang complained at (a check or its crash), and where in it; None:
    #: silent
    sglang_step: int | None = None
    sglang_when: SGLangPoint | None = None
    #: audits the whole `check` ran for (every one without the live audit)
    checked: int = 0
    #: live audits a fact broke although `check` found nothing (its facts are stricter)
    fallbacks: int = 0
    #: with `both`: every audited state's two verdicts
    verdicts: list[Verdict] = field(default_factory=list)
    #: times the planted fault did its wrong thing (`Stack.fault_acted`)
    fault_acted: int = 0
    #: with `until_heard`: the audit of the state that check first complained of (its dump
    #: recorded where the history had a folder); None: it never did
    heard_state: Audit | None = None

    def heard(self, step: int, when: CheckPoint, said: list[Said]) -> None:
        """Count what SGLang's checks said at `step`, keeping the first few per check."""
        for one in said:
            self.sglang_counts[one.check] = self.sglang_counts.get(one.check, 0) + 1
            kept = self.sglang_first.setdefault(one.check, [])
            if len(kept) < KEEP:
                kept.append(Complaint(step, when, one))
        if said and self.sglang_step is None:
            self.sglang_step, self.sglang_when = step, when


def ranks_storage_folder(workload: Workload, tp: int) -> Any:
    """The folder `tp` ranks' storage tiers share (each rank's pages named for it, as a
    server's ranks share theirs); None where there is one rank or no storage tier, and each
    stack makes its own."""
    return storage_folder() if tp > 1 and workload.hicache_storage is not None else None


def history_stack(
    modules: SGLangModules,
    spec: StackSpec,
    workload: Workload,
    *,
    rank: int = 0,
    ranks: int = 1,
    storage_folder: Any = None,
) -> Stack:
    """The stack a history of `workload` runs on: `spec`'s, with the serving switches the
    workload drew (sorted merges, lazy compaction, the Mamba path cap, radix sessions, the
    overlapped loop's server args), as tensor-parallel rank `rank` of `ranks` (a storage
    tier's pages named for it, in the ranks' shared `storage_folder`). Whatever runs a soak
    history again (the mutation benchmark's SGLang-checks-alone side) builds it here, so
    both run one stack."""
    return build_stack(
        modules,
        spec,
        need_sort=workload.need_sort,
        lazy_compaction=workload.lazy_compaction,
        mamba_max_states_per_path=workload.mamba_max_states_per_path,
        hicache_write_policy=workload.hicache_write_policy,
        mamba_track_slots=workload.mamba_track_slots,
        radix_sessions=workload.radix_sessions,
        hicache_storage=workload.hicache_storage,
        rank=rank,
        ranks=ranks,
        storage_folder=storage_folder,
        overlap=workload.overlap,
        mamba_lazy=workload.mamba_lazy,
    )


@dataclass
class _Rank:
    """One tensor-parallel rank of a history: its own stack, scheduler, audits and checks,
    and its audits still open (`planned`) and last (`last`: a crash's state)."""

    label: str
    scheduler: Scheduler
    checks: SGLangChecks | None
    live: LiveAudit | None
    after_step: Callable[[Any, int], None]
    undo: Callable[[], None]
    planned: list[Audit] = field(default_factory=list)
    last: list[Audit] = field(default_factory=list)


@refusing_sglang_exits
def run_history(
    modules: SGLangModules,
    spec: StackSpec,
    workload: Workload,
    *,
    fault: str | None = None,
    audit: Callable[[int], bool] = lambda step: True,
    sglang_checks: bool = True,
    folder: Path | None = None,
    max_steps: int | None = None,
    mode: AuditMode = "live",
    tp: int = 1,
    until_heard: SGLangCheckName | None = None,
) -> HistoryResult:
    """Run `workload`; audit each step `audit(step)` picks (at plan time, and at idle).

    With `tp` ranks (`soak.tp`), each runs its own stack and scheduler in lockstep, is audited
    the same way, and at each audited point every rank's state is compared with rank 0's as
    `kvcanary ranks` compares them: a divergence fails the history. With the host tier, the
    ranks' steps run in lockstep threads meeting at SGLang's ack all-reduce
    (`tp.host_tier_group`); a rank left waiting at a collective the others skipped is a crash
    (`tp_group.RanksParted`: a server's ranks would hang there).

    It ends when the workload is served, at the first step kvcanary flags or SGLang crashes
    at (or, with `until_heard`, that check of SGLang's complains at: `heard_state`), or after
    `max_steps` steps (what is left of soak's budget); never past the workload's steps * 4 +
    64, time enough to drain."""
    counters = RankGlobals(tp) if tp > 1 else None

    def as_rank(i: int) -> AbstractContextManager[None]:
        return nullcontext() if counters is None else counters.as_rank(i)

    ranks: list[_Rank] = []
    shared = ranks_storage_folder(workload, tp)
    for i in range(tp):
        with as_rank(i):
            stack = history_stack(modules, spec, workload, rank=i, ranks=tp, storage_folder=shared)
            with fitting(
                modules.tree, "scheduler objects (ScheduleBatch, SGLang's checks, the fault)"
            ):
                scheduler = Scheduler(stack, workload)
                checks = SGLangChecks(scheduler) if sglang_checks else None
                after_step, undo = plant(fault, stack)
                # with a folder too: the lock counts are the live audit's alone (a dump has none)
                live = None if mode == "full" else LiveAudit(scheduler)
        ranks.append(_Rank(str(i), scheduler, checks, live, after_step, undo))
    lead = ranks[0]
    #: with the host tier, the group the ranks' acks meet in (each rank's step in lockstep)
    group = None if counters is None else host_tier_group([r.scheduler for r in ranks], counters)
    result = HistoryResult(steps=0, audited=0, counters=lead.scheduler.counters)
    found: list[Audit] = []
    #: with several ranks, this step's recorded states: audit point -> each rank's dump
    states: dict[StatePoint, dict[str, Path]] = {}
    scratch = tempfile.TemporaryDirectory(prefix="kvcanary-soak-tp-") if tp > 1 else None

    def record(rank: _Rank, batch: object, point: StatePoint, step: int) -> None:
        """Rank `rank`'s state at `point` of `step` (every rank's of one point as that step's,
        whether recorded inside the step or after it: `kvcanary ranks` compares one step's)."""
        if scratch is not None:
            path = Path(scratch.name) / f"{point}-{rank.label}.safetensors"
            states.setdefault(point, {})[rank.label] = path
            record_dump(rank.scheduler, batch, path, rank=rank.label, step=step)

    def audited(
        rank: _Rank,
        batch: object,
        sglang: SGLangChecks | None,
        *,
        idle: bool,
        when: StatePoint,
        step: int,
    ) -> Audit:
        own = folder if folder is None or tp == 1 else folder / f"rank-{rank.label}"
        if own is not None:
            own.mkdir(exist_ok=True)
        verdict = audit_step(
            rank.scheduler,
            batch,
            sglang,
            idle=idle,
            folder=own,
            live=rank.live,
            full=mode == "both",
        )
        record(rank, batch, when, step)
        verdict.rank = None if tp == 1 else rank.label
        result.checked += verdict.checked
        if mode == "both":
            result.verdicts.append(
                Verdict(verdict.step, when, verdict.broken, tuple(verdict.codes))
            )
        return verdict

    def note(rank: _Rank, verdict: Audit) -> None:
        rank.last[:] = [verdict]
        if verdict.kvcanary_found:
            found.append(verdict)
        elif result.heard_state is None and any(s.check == until_heard for s in verdict.sglang):
            result.heard_state = verdict  # the state SGLang's check complained of

    def planner(rank: _Rank) -> Callable[[object], None]:
        def on_plan(batch: object) -> None:
            if found or not audit(rank.scheduler.step_no):
                return
            at = rank.scheduler.step_no
            rank.planned.append(audited(rank, batch, None, idle=False, when="plan", step=at))
            rank.last[:] = rank.planned[-1:]
            result.audited += rank is lead

        return on_plan

    def idle(rank: _Rank, step: int) -> None:
        verdict = audited(rank, None, rank.checks, idle=True, when="idle", step=step)
        verdict.step = step
        result.audited += rank is lead
        result.heard(verdict.step, "idle", verdict.sglang)
        note(rank, verdict)

    def step_rank(rank: _Rank, at: int) -> StepInfo | None:
        """The rank's step `at` and its audits; None: SGLang crashed in it."""
        try:
            info = rank.scheduler.step(planner(rank))
            if rank.planned:
                # SGLang checks a busy step after its result is processed, as its loop does
                verdict = rank.planned.pop()
                if rank.checks is not None:
                    verdict.sglang = rank.checks.busy()
                    result.heard(at, "after-result", verdict.sglang)
                if verdict.kvcanary_found:
                    found.append(verdict)
                else:
                    # and the state the result left (a double free shows on the free list
                    # before the next allocation hands the slot out twice)
                    after = audited(rank, None, None, idle=False, when="after-result", step=at)
                    after.step, after.mode = at, "after-result"
                    after.sglang = list(verdict.sglang)  # what SGLang said on this step
                    note(rank, after)
            rank.after_step(rank.scheduler.stack, info.step)
            return info
        except Exception as exc:  # raised inside SGLang's code: a crash, a finding too
            if isinstance(exc, RanksParted) and found:
                return None  # left waiting by a rank that failed first: that is the finding
            if not isinstance(exc, RanksParted):
                _refuse_if_ours(exc, modules)
            crash = _crash(exc, at, modules.tree.root, rank.last[0] if rank.last else None)
            crash.rank = None if tp == 1 else rank.label
            if rank.planned and rank.planned[-1].kvcanary_found:
                # kvcanary flagged this step at plan time, before SGLang raised: its
                # finding is the failure, the crash said beside it
                verdict = rank.planned.pop()
                verdict.crash_after = crash.crash
                found.append(verdict)
            else:
                found.append(crash)
            if result.sglang_step is None:
                result.sglang_step, result.sglang_when = at, "crash"
            return None

    def step_as_rank(i: int, rank: _Rank, at: int) -> StepInfo | None:
        """`step_rank` with rank `i`'s process-wide counters in place."""
        with as_rank(i):
            return step_rank(rank, at)

    def compare(point: StatePoint, step: int) -> None:
        """Every rank's state at `point` against rank 0's (a rank that did not reach it, as
        it stands): the first divergence fails the history."""
        dumps = states.get(point)
        if found or not dumps:
            return
        for i, rank in enumerate(ranks):
            if rank.label not in dumps:
                with as_rank(i):
                    record(rank, None, point, step)
        row = first_divergence([dumps[rank.label] for rank in ranks])
        if row is None:
            return
        verdict = Audit(step=step, mode=point, rank=row.rank, divergence=row.divergence)
        if folder is not None:
            verdict.dump = Path(shutil.copy(dumps[row.rank], folder / "rank-state.safetensors"))
            verdict.reference_dump = Path(
                shutil.copy(dumps[lead.label], folder / "reference-state.safetensors")
            )
        found.append(verdict)

    options_undo = serving_options(workload, modules.schedule_batch)
    in_process = nullcontext() if group is None else collectives_in_process()
    in_process.__enter__()
    try:
        limit = workload.steps * 4 + 64
        if max_steps is not None:
            limit = min(limit, max_steps)
        while not found and result.heard_state is None and lead.scheduler.step_no < limit:
            at = lead.scheduler.step_no
            states.clear()
            infos: list[StepInfo] = []
            if group is not None:  # the ranks' steps in lockstep threads, all run
                stepped: Iterable[StepInfo | None] = group.run(
                    [partial(step_rank, rank, at) for rank in ranks]
                )
            else:  # one rank after another, none after a rank that failed
                stepped = (step_as_rank(i, rank, at) for i, rank in enumerate(ranks))
            for info in stepped:
                if info is None or found:
                    break
                infos.append(info)
            compare("plan", at)
            compare("after-result", at)
            for i, (rank, info) in enumerate(zip(ranks, infos, strict=False)):
                if info.mode == "idle" and not found and audit(info.step):
                    with as_rank(i):
                        idle(rank, at)
            compare("idle", at)
            if lead.scheduler.done and lead.scheduler.step_no >= workload.steps:
                break
        final = max(lead.scheduler.step_no - 1, 0)  # the state the last step left, once
        if (
            not found
            and result.heard_state is None
            and lead.scheduler.done
            and not (lead.last and (lead.last[0].step, lead.last[0].mode) == (final, "idle"))
        ):
            states.clear()
            for i, rank in enumerate(ranks):
                with as_rank(i):
                    idle(rank, final)
            compare("idle", final)
    finally:
        for rank in reversed(ranks):
            rank.undo()
            rank.scheduler.stack.close()
        options_undo()
        in_process.__exit__(None, None, None)
        if scratch is not None:
            scratch.cleanup()
    result.steps = lead.scheduler.step_no
    result.fault_acted = sum(rank.scheduler.stack.fault_acted for rank in ranks)
    result.fallbacks = sum(0 if rank.live is None else rank.live.fallbacks for rank in ranks)
    result.failure = found[0] if found else None
    return result


def _crash(exc: Exception, step: int, root: Path, state: Audit | None) -> Audit:
    """SGLang's crash at `step` as a failing audit: its exception, where in SGLang's code it
    came out, and the last state audited before it (`state`; its dump, when one was kept)."""
    import traceback

    text = (str(exc).strip().splitlines() or [""])[0]
    raised_in = None
    top = root.resolve()
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        where = Path(frame.filename).resolve()
        if where.is_relative_to(top):
            raised_in = f"{where.relative_to(top).as_posix()}:{frame.lineno} in {frame.name}"
            break
    verdict = Audit(step=step, mode="crash", dump=state.dump if state else None)
    verdict.crash = SGLangCrash(
        exception=type(exc).__name__,
        message=text[:300],
        raised_in=raised_in,
        state_step=state.step if state else None,
        state_when=None if state is None or state.mode == "crash" else state.mode,
    )
    return verdict


def _refuse_if_ours(exc: Exception, modules: SGLangModules) -> None:
    """An error raised in kvcanary's own driver (not inside SGLang) means this release's
    scheduler API is not the one soak drives: bad input, not a finding."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if frames and "kvcanary_cli" in Path(frames[-1].filename).parts:
        text = (str(exc).strip().splitlines() or [""])[0]
        raise SGLangUnavailableError(
            f"{modules.tree.release}'s scheduler objects differ from those soak drives "
            f"(SGLang {OLDEST} to {SUPPORTED}'s): {type(exc).__name__}: {text}"[:400],
            source=modules.tree.label,
        ) from None


def shrink_workload(
    workload: Workload, fails: Callable[[Workload], bool], *, budget: int = 200
) -> Workload:
    """The smallest workload `fails` still accepts found within `budget` runs (ddmin)."""
    current = list(range(len(workload.arrivals)))
    runs = 0
    chunks = 2
    while len(current) > 1 and runs < budget:
        size = max(1, len(current) // chunks)
        pieces = [current[i : i + size] for i in range(0, len(current), size)]
        reduced = False
        for piece in pieces:
            rest = [i for i in current if i not in piece]
            if not rest:
                continue
            runs += 1
            if fails(workload.without(rest)):
                current, chunks, reduced = rest, max(chunks - 1, 2), True
                break
            if runs >= budget:
                break
        if not reduced:
            if size == 1:
                break
            chunks = min(len(current), chunks * 2)
    return workload.without(current)
