"""Benchmark: where a soak step's time goes, the whole `check` per audit against the live
audit (`soak.live`), on the same seeded histories of SGLang's real stack on CPU.

For each audit mode it runs the same histories (every page size and tree core, every step
audited) and splits the time: SGLang's step (the scheduler loop, its allocations and frees,
the audits taken out), SGLang's own checks (`self_check_during_busy`,
`_check_kv_page_invariants`, the idle checks), and kvcanary's audits (both of a step's:
at plan time and after the result). It also counts the audits the whole `check` ran for.
The times are CPU seconds of the thread that runs the histories (`--clock wall`: wall
seconds, which on a loaded machine count the time other work held the cores).
Prints a table and writes `bench/out/soak-audit.json`. Nothing here is asserted. Usage:

    python bench/soak_audit.py [--histories 12] [--steps 100] [--modes full,live] [--wheel PATH]
        [--clock cpu|wall]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


#: the clock: CPU seconds of this thread (`--clock cpu`, the default: other work on a shared
#: machine weighs far less on it), or wall seconds (`--clock wall`)
CLOCK = {"cpu": time.thread_time, "wall": time.perf_counter}


def _timers(clock: Any = time.thread_time) -> dict[str, float]:
    """Wrap the audit and SGLang's checks with timers (returns the running totals)."""
    import kvcanary_cli.soak.audit as audit
    import kvcanary_cli.soak.run as run

    totals = {"audit": 0.0, "checks": 0.0}
    step = audit.audit_step
    busy, idle = audit.SGLangChecks.busy, audit.SGLangChecks.idle

    def timed(key: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started, inner = clock(), totals["checks"]
            try:
                return fn(*args, **kwargs)
            finally:
                # an idle audit runs SGLang's idle checks inside it: theirs, not the audit's
                nested = totals["checks"] - inner if key == "audit" else 0.0
                totals[key] += clock() - started - nested

        return wrapper

    run.audit_step = timed("audit", step)  # type: ignore[attr-defined]
    audit.SGLangChecks.busy = timed("checks", busy)  # type: ignore[method-assign]
    audit.SGLangChecks.idle = timed("checks", idle)  # type: ignore[method-assign]
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--histories", type=int, default=12)
    parser.add_argument("--steps", type=int, default=100, help="steps per history")
    parser.add_argument("--modes", default="full,live", help="audit modes to run, in order")
    parser.add_argument("--wheel", default=None, help="SGLang wheel or tree (default: cached)")
    parser.add_argument("--clock", choices=tuple(CLOCK), default="cpu")
    args = parser.parse_args()
    clock = CLOCK[args.clock]

    from kvcanary_cli.soak.command import _specs
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import load_sglang
    from kvcanary_cli.soak.workload import random_workload
    from tests.sglang_wheel import wheel_path

    started = time.monotonic()
    modules = load_sglang(args.wheel or wheel_path())
    imported = time.monotonic() - started
    specs = _specs(None, modules.cores, None)
    totals = _timers(clock)
    workloads = [
        random_workload(seed, steps=args.steps, requests=args.steps // 4, max_prompt=60, max_new=20)
        for seed in range(args.histories)
    ]
    out: dict[str, Any] = {
        "sglang": modules.tree.version,
        "import_seconds": round(imported, 1),
        "clock": args.clock,
    }
    for mode in args.modes.split(","):
        totals.update(audit=0.0, checks=0.0)
        steps = audited = checked = findings = 0
        t0 = clock()
        for i, workload in enumerate(workloads):
            result = run_history(modules, specs[i % len(specs)], workload, mode=mode)
            steps += result.steps
            audited += result.audited
            checked += result.checked
            findings += result.failure is not None
        whole = clock() - t0
        sglang_step = whole - totals["audit"] - totals["checks"]

        def ms(seconds: float, steps: int = steps) -> float:
            return round(1000 * seconds / max(steps, 1), 3)

        out[mode] = {
            "histories": len(workloads),
            "steps": steps,
            "audited_states": audited,
            "checked_whole": checked,
            "findings": findings,
            "ms_per_step": {
                "sglang_step": ms(sglang_step),
                "sglang_checks": ms(totals["checks"]),
                "kvcanary_audit": ms(totals["audit"]),
                "total": ms(whole),
            },
            "audit_over_sglang_checks": round(totals["audit"] / max(totals["checks"], 1e-9), 2),
        }
        print(f"{mode}: {json.dumps(out[mode])}", file=sys.stderr, flush=True)
    text = json.dumps(out, indent=1, sort_keys=True)
    print(text)
    folder = ROOT / "bench" / "out"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "soak-audit.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
