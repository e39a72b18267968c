"""One soak history, and shrinking a failing one.

`run_history` builds a fresh stack, plants the fault (if any), runs the workload step by step
and audits the chosen steps (`soak.audit`: at plan time, after the step's result, at idle);
it stops at the first step kvcanary or SGLang's
checks flag. `shrink_workload` then removes arrivals while the history still fails the same
way (kvcanary names the same top finding): delta debugging over the arrival list, ending with
one-at-a-time removal, so the reproducer is 1-minimal in its arrivals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvcanary_cli.soak.audit import Audit, SGLangChecks, audit_step
from kvcanary_cli.soak.driver import Counters, Scheduler
from kvcanary_cli.soak.faults import plant
from kvcanary_cli.soak.stack import (
    SUPPORTED,
    SGLangModules,
    SGLangUnavailableError,
    StackSpec,
    build_stack,
    fitting,
    refusing_sglang_exits,
)
from kvcanary_cli.soak.workload import Workload

__all__ = ["HistoryResult", "run_history", "shrink_workload"]


@dataclass
class HistoryResult:
    """What a history did and the first step flagged (None: clean)."""

    steps: int
    audited: int
    counters: Counters
    failure: Audit | None = None
    sglang_said: list[str] = field(default_factory=list)
    sglang_steps: int = 0


@refusing_sglang_exits
def run_history(
    modules: SGLangModules,
    spec: StackSpec,
    workload: Workload,
    *,
    fault: str | None = None,
    audit: Callable[[int], bool] = lambda step: True,
    sglang_checks: bool = True,
    stop_on_sglang: bool = False,
    folder: Path | None = None,
    max_steps: int | None = None,
) -> HistoryResult:
    """Run `workload`; audit each step `audit(step)` picks (at plan time, and at idle).

    It ends when the workload is served, at the first step flagged, or after `max_steps`
    steps (what is left of soak's budget); never past the workload's steps * 4 + 64, time
    enough to drain."""
    stack = build_stack(modules, spec)
    with fitting(modules.tree, "scheduler objects (ScheduleBatch, SGLang's checks, the fault)"):
        scheduler = Scheduler(stack, workload)
        checks = SGLangChecks(scheduler) if sglang_checks else None
        after_step, undo = plant(fault, stack)
    result = HistoryResult(steps=0, audited=0, counters=scheduler.counters)
    found: list[Audit] = []

    planned: list[Audit] = []

    def on_plan(batch: object) -> None:
        if found or not audit(scheduler.step_no):
            return
        planned.append(audit_step(scheduler, batch, None, idle=False, folder=folder))
        result.audited += 1

    def _note(verdict: Audit) -> None:
        if verdict.sglang:
            result.sglang_steps += 1
            if not result.sglang_said:
                result.sglang_said = list(verdict.sglang)
        if verdict.kvcanary_found or (stop_on_sglang and verdict.sglang):
            found.append(verdict)

    try:
        limit = workload.steps * 4 + 64
        if max_steps is not None:
            limit = min(limit, max_steps)
        while not found and scheduler.step_no < limit:
            try:
                info = scheduler.step(on_plan)
                if planned:
                    # SGLang checks a busy step after its result is processed, as its loop does
                    verdict = planned.pop()
                    if checks is not None:
                        verdict.sglang = checks.busy()
                    _note(verdict)
                    if not found:
                        # and the state the result left (a double free shows on the free list
                        # before the next allocation hands the slot out twice)
                        after = audit_step(scheduler, None, None, idle=False, folder=folder)
                        after.mode = "after-result"
                        _note(after)
                        after.sglang = list(verdict.sglang)  # what SGLang said on this step
                after_step(stack, info.step)
            except Exception as exc:  # SGLang's own assertion inside the stack: a failure too
                _refuse_if_ours(exc, modules)
                verdict = audit_step(scheduler, None, None, idle=True, folder=folder)
                text = (str(exc).strip().splitlines() or [""])[0]
                verdict.sglang = [f"SGLang raised {type(exc).__name__}: {text}"[:300]]
                verdict.mode = "crash"
                result.sglang_steps += 1
                result.sglang_said = result.sglang_said or list(verdict.sglang)
                found.append(verdict)
                break
            if info.mode == "idle" and not found and audit(info.step):
                verdict = audit_step(scheduler, None, checks, idle=True, folder=folder)
                result.audited += 1
                _note(verdict)
            if scheduler.done and scheduler.step_no >= workload.steps:
                break
        if not found and scheduler.done:
            verdict = audit_step(scheduler, None, checks, idle=True, folder=folder)
            result.audited += 1
            _note(verdict)
    finally:
        undo()
    result.steps = scheduler.step_no
    result.failure = found[0] if found else None
    return result


def _refuse_if_ours(exc: Exception, modules: SGLangModules) -> None:
    """An error raised in kvcanary's own driver (not inside SGLang) means this release's
    scheduler API is not the one soak drives: bad input, not a finding."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if frames and "kvcanary_cli" in Path(frames[-1].filename).parts:
        text = (str(exc).strip().splitlines() or [""])[0]
        raise SGLangUnavailableError(
            f"{modules.tree.release}'s scheduler objects differ from those soak drives "
            f"(SGLang {SUPPORTED}'s): {type(exc).__name__}: {text}"[:400],
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
