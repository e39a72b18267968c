"""SGLang 0.5.23's real hybrid Mamba stack (`soak --layout mamba`, page size 1, on CPU) under
the soak workload: clean histories audited at every step (the live accounting; `--full`: the
whole `check` of every recorded state too), and the planted `tree-mamba-slot-freed` fault per
seed, where kvcanary names it and where SGLang's own checks alone (busy after every step,
idle at idle, no kvcanary audit) first complain.

    python bench/mamba_soak.py [--wheel PATH] [--steps 2000] [--history 500] [--faults 5]

Prints one JSON object: the clean histories' steps, audited states, findings (must be none),
live audits `check` did not confirm (none), SGLang's complaints (none), the scheduler's
events and wall seconds per 1,000 steps; per fault seed, the step the fault was planted at,
kvcanary's finding (step, code, cause) and SGLang's first complaint (step, check, message).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvcanary_cli.soak.audit import SGLangChecks  # noqa: E402
from kvcanary_cli.soak.command import (  # noqa: E402
    MAMBA_ABORT_WITHIN,
    MAMBA_ABORTS,
    MAMBA_NEW,
    MAMBA_PROMPT,
)
from kvcanary_cli.soak.driver import Scheduler  # noqa: E402
from kvcanary_cli.soak.faults import plant  # noqa: E402
from kvcanary_cli.soak.run import AuditMode, run_history  # noqa: E402
from kvcanary_cli.soak.stack import StackSpec, build_stack, load_sglang  # noqa: E402
from kvcanary_cli.soak.workload import Workload, random_workload  # noqa: E402
from tests.sglang_wheel import wheel_path  # noqa: E402

FAULT = "tree-mamba-slot-freed"


def _workload(seed: int, steps: int) -> Workload:
    """A long history of the soak's Mamba shape (`soak.command.history_workload`)."""
    return random_workload(
        seed,
        steps=steps,
        requests=steps // 4,
        max_prompt=MAMBA_PROMPT,
        max_new=MAMBA_NEW,
        aborts=MAMBA_ABORTS,
        ignore_eos=False,
        abort_within=MAMBA_ABORT_WITHIN,
    )


def sglang_alone(modules: Any, spec: StackSpec, workload: Workload) -> dict[str, Any]:
    """The history under SGLang's checks alone, the fault planted: where it was planted and
    where SGLang first complained (or crashed)."""
    stack = build_stack(modules, spec)
    scheduler = Scheduler(stack, workload)
    checks = SGLangChecks(scheduler)
    after_step, undo = plant(FAULT, stack)
    planted = None
    try:
        while scheduler.step_no < workload.steps * 4 + 64:
            at = scheduler.step_no
            try:
                info = scheduler.step()
            except Exception as exc:
                return {"planted": planted, "step": at, "said": f"crash {exc!r}"[:200]}
            after_step(stack, info.step)
            if planted is None and stack.fault_acted:
                planted = at
            said = checks.idle() if info.mode == "idle" else checks.busy()
            if not said and scheduler.done and scheduler.step_no >= workload.steps:
                said = checks.idle()
                if not said:
                    break
            if said:
                one = said[0]
                return {"planted": planted, "step": at, "said": f"{one.check}: {one.message}"}
    finally:
        undo()
    return {"planted": planted, "step": None, "said": None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wheel", default=None)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--history", type=int, default=500)
    parser.add_argument("--faults", type=int, default=5)
    parser.add_argument("--full", action="store_true", help="also check every state whole")
    args = parser.parse_args()
    wheel = args.wheel or wheel_path()
    if wheel is None:
        sys.exit("no SGLang 0.5.23 wheel cached: pip download sglang==0.5.23 --no-deps")
    modules = load_sglang(wheel)
    spec = StackSpec.pressured(1, "python", "mamba")
    clean: dict[str, Any] = dict(steps=0, audited=0, checked=0, findings=0, fallbacks=0, sglang=0)
    events: dict[str, int] = {}
    seed = 0
    wall = time.monotonic()
    while clean["steps"] < args.steps:
        mode: AuditMode = "both" if args.full else "live"
        h = run_history(modules, spec, _workload(seed, args.history), mode=mode)
        seed += 1
        clean["steps"] += h.steps
        clean["audited"] += h.audited
        clean["checked"] += h.checked
        clean["findings"] += h.failure is not None
        clean["fallbacks"] += h.fallbacks  # the live accounting broke, `check` found nothing
        clean["sglang"] += sum(h.sglang_counts.values())
        for name, count in h.counters.as_dict().items():
            events[name] = events.get(name, 0) + count
    seconds = time.monotonic() - wall
    out: dict[str, Any] = {
        "sglang": modules.tree.version,
        "clean": {
            **clean,
            "histories": seed,
            "events": events,
            "wall_s_per_1000_steps": round(seconds * 1000 / max(clean["steps"], 1), 2),
        },
    }
    faults = []
    for seed in range(args.faults):
        workload = _workload(seed, args.history)
        h = run_history(modules, spec, workload, fault=FAULT)
        f = h.failure
        faults.append(
            {
                "seed": seed,
                "kvcanary": None
                if f is None
                else {"step": f.step, "when": f.mode, "codes": f.codes, "cause": f.top_cause},
                "sglang_alone": sglang_alone(modules, spec, workload),
            }
        )
    out["faults"] = faults
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
