"""The host tier under soak (`soak --hicache`): per seed, the clean soak's events and cost beside
the same soak without the host tier, and each host fault's kill step under soak beside
where SGLang's own checks alone first complain (the same histories, no kvcanary audit).

    python bench/hicache_soak.py [--wheel PATH] [--seeds 0,1,7] [--steps 2000] [--alone 600]

The histories are those `kvcanary soak --hicache` runs (page sizes 1, 4, 16, both tree
cores, the write policies in turn); the faults act on the Python core's nodes, so their
histories are the Python core's. CPU seconds per step are the loop's (audits and SGLang's
checks included), SGLang's import excluded.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FAULTS = ("host-evict-leak", "load-back-frees-host", "backup-twice")


def _first_complaint(scheduler: Any, checks: Any, limit: int) -> tuple[int, str] | None:
    """One history to `limit` steps under SGLang's checks alone (busy after each step, idle
    at idle, once more when it is served): the step and the first line of their first
    complaint, or of SGLang's own raise; None: silent."""
    while scheduler.step_no < limit:
        at = scheduler.step_no
        try:
            info = scheduler.step()
        except Exception as exc:  # SGLang's own assert or error: it saw something
            return at, f"{type(exc).__name__}: {exc}".splitlines()[0]
        said = checks.idle() if info.mode == "idle" else checks.busy()
        if not said and scheduler.done and scheduler.step_no >= scheduler.workload.steps:
            said = checks.idle()
            if not said:
                return None
        if said:
            return at, f"{said[0].check}: {said[0].message}"
    return None


def _clean(modules: Any, seed: int, steps: int, hicache: bool) -> dict[str, Any]:
    """A soak's histories of `seed` until `steps` are spent: events, findings, CPU per step."""
    from kvcanary_cli.soak.command import _specs, history_workload
    from kvcanary_cli.soak.run import run_history

    specs = _specs(None, modules.cores, None)
    urc = modules.unified_radix_cache.UnifiedRadixCache
    calls = {"load_back": 0, "evict_host": 0}
    originals = {name: getattr(urc, name) for name in calls}

    def counted(name: str) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = originals[name](self, *args, **kwargs)
            calls[name] += int(bool(out))
            return out

        return call

    for name in calls:
        setattr(urc, name, counted(name))
    run = histories = fallbacks = 0
    failure = None
    started = time.process_time()
    try:
        while run < steps and failure is None:
            spec = specs[histories % len(specs)]
            workload = history_workload(
                seed, histories, len(specs), spec.page_size, hicache=hicache
            )
            result = run_history(modules, spec, workload, max_steps=steps - run)
            run += result.steps
            histories += 1
            fallbacks += result.fallbacks
            if result.failure is not None or result.sglang_step is not None:
                failure = {
                    "history": histories - 1,
                    "step": result.failure.step if result.failure else result.sglang_step,
                    "codes": result.failure.codes if result.failure else [],
                    "crash": None if result.failure is None else str(result.failure.crash),
                }
    finally:
        for name, original in originals.items():
            setattr(urc, name, original)
    cpu = time.process_time() - started
    return {
        "steps": run,
        "histories": histories,
        "ms_per_step": round(1000 * cpu / max(run, 1), 2),
        "fallbacks": fallbacks,
        "load_backs": calls["load_back"],
        "host_evictions": calls["evict_host"],
        "failure": failure,
    }


def _killed(modules: Any, seed: int, fault: str, alone: int) -> dict[str, Any]:
    """Soak's kill (the first Python-core history it finds the fault in: history, step) and
    SGLang's checks alone on the same histories with the same fault, up to `alone` steps."""
    from kvcanary_cli.soak.audit import SGLangChecks
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.driver import Scheduler, serving_options
    from kvcanary_cli.soak.faults import plant
    from kvcanary_cli.soak.run import history_stack, run_history
    from kvcanary_cli.soak.stack import StackSpec

    spec = StackSpec.pressured(1, "python")
    soak: dict[str, Any] = {"history": None}
    for history in range(6):
        workload = history_workload(seed, history, 1, hicache=True)
        result = run_history(modules, spec, workload, fault=fault)
        if result.failure is not None:
            soak = {
                "history": history,
                "policy": workload.hicache_write_policy,
                "step": result.failure.step,
                "codes": result.failure.codes,
                "acted": result.fault_acted,
                "sglang_by_then": result.sglang_step,
            }
            break
    own: dict[str, Any] = {"step": None}
    run = 0
    for history in range(64):
        if run >= alone:
            break
        workload = history_workload(seed, history, 1, hicache=True)
        stack = history_stack(modules, spec, workload)
        scheduler = Scheduler(stack, workload)
        after, undo_fault = plant(fault, stack)
        undo = serving_options(workload, modules.schedule_batch)
        try:
            first = _first_complaint(scheduler, SGLangChecks(scheduler), alone - run)
        finally:
            undo()
            undo_fault()
        if first is not None:
            own = {"history": history, "step": first[0], "said": first[1][:160]}
            break
        run += scheduler.step_no
    return {"soak": soak, "sglang_alone": own}


def main() -> int:
    from kvcanary_cli.soak.stack import load_sglang

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", default=None)
    parser.add_argument("--seeds", default="0,1,7")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--alone", type=int, default=600)
    parser.add_argument("--no-clean", action="store_true")
    args = parser.parse_args()
    wheel = args.wheel or str(
        sorted((Path.home() / ".cache/kvcanary/wheels").glob("sglang-0.5.23-*.whl"))[0]
    )
    modules = load_sglang(wheel)
    figures: dict[str, Any] = {"sglang": modules.tree.version, "seeds": {}}
    for seed in (int(s) for s in args.seeds.split(",")):
        row: dict[str, Any] = {}
        if not args.no_clean:
            row["hicache"] = _clean(modules, seed, args.steps, True)
            row["without"] = _clean(modules, seed, args.steps, False)
        row["faults"] = {fault: _killed(modules, seed, fault, args.alone) for fault in FAULTS}
        figures["seeds"][seed] = row
        print(json.dumps({seed: row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
