"""Benchmark: many seeded random histories on SGLang's real memory-cache stack on CPU, every
step audited by kvcanary (a dump recorded by capture.tree, `check`) and by SGLang's own
checks. Reports histories, scheduler steps, audited states, findings and seconds (import
apart), to stdout and `bench/out/sglang-stack.json`. A clean SGLang must give zero findings
and zero SGLang complaints. Nothing here is asserted in tests. Usage:

    python bench/sglang_stack.py --histories 2000 [--wheel PATH] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--histories", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=60, help="steps per history")
    parser.add_argument("--wheel", default=None, help="SGLang wheel or tree (default: cached)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from kvcanary_cli.soak.command import _specs
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import load_sglang
    from kvcanary_cli.soak.workload import random_workload
    from tests.sglang_wheel import wheel_path

    started = time.monotonic()
    modules = load_sglang(args.wheel or wheel_path())
    imported = time.monotonic() - started
    specs = _specs(None, modules.cores, None)
    steps = audited = 0
    findings: Counter[str] = Counter()
    complaints: Counter[str] = Counter()
    events: Counter[str] = Counter()
    t0 = time.monotonic()
    for history in range(args.histories):
        spec = specs[history % len(specs)]
        workload = random_workload(
            args.seed * 1_000_003 + history,
            steps=args.steps,
            requests=max(4, args.steps // 4),
            max_prompt=60,
            max_new=20,
        )
        result = run_history(modules, spec, workload)
        steps += result.steps
        audited += result.audited
        events.update(result.counters.as_dict())
        if result.failure is not None:
            findings.update(result.failure.codes)
        complaints.update(result.sglang_counts)  # per check: audited steps it fired on
        if (history + 1) % 100 == 0:
            print(
                f"{history + 1} histories, {steps} steps, {time.monotonic() - t0:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    seconds = time.monotonic() - t0
    out = {
        "sglang": modules.tree.version,
        "cores": list(modules.cores),
        "histories": args.histories,
        "steps": steps,
        "audited_states": audited,
        "seconds": round(seconds, 1),
        "import_seconds": round(imported, 1),
        "ms_per_step": round(1000 * seconds / max(steps, 1), 2),
        "findings": dict(findings),
        "sglang_complaints": dict(complaints),
        "events": dict(events),
    }
    text = json.dumps(out, indent=1, sort_keys=True)
    print(text)
    folder = ROOT / "bench" / "out"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sglang-stack.json").write_text(text + "\n")
    return 1 if findings or complaints else 0


if __name__ == "__main__":
    sys.exit(main())
