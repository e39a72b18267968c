"""SGLang 0.5.23's unified-memory stack (the release wheel, on CPU) under soak's workload:
correct histories at page sizes 1 and 4, every state audited by kvcanary's whole `check`
(the dump captured from the live objects: virtual ids, both sides' page tables, the virtual
free list), SGLang's own checks on the same steps. Both must stay silent.

    python bench/unified_soak.py [--wheel PATH] [--steps 1000] [--history 120] [--mode full]

Prints one JSON object: per page size, the audited states, histories, the steps kvcanary
flagged (must be none), SGLang's complaints (none), what the workload reached (extends,
decodes, chunks, retractions, finishes, shared prefix tokens), and audited states per CPU
second.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvcanary_cli.soak.run import run_history  # noqa: E402
from kvcanary_cli.soak.stack import StackSpec, load_sglang  # noqa: E402
from kvcanary_cli.soak.workload import random_workload  # noqa: E402
from tests.sglang_wheel import wheel_path  # noqa: E402


def _page_size_run(modules: Any, page_size: int, args: argparse.Namespace) -> dict[str, object]:
    spec = StackSpec.pressured(page_size, "python", "unified")
    totals: dict[str, int] = {"audited": 0, "checked": 0, "steps": 0, "flagged": 0}
    counters: dict[str, int] = {}
    sglang: dict[str, int] = {}
    first_flag: list[object] = []
    cpu, wall = time.process_time(), time.perf_counter()
    seed = 0
    while totals["audited"] < args.steps:
        workload = random_workload(
            1000 + seed, steps=args.history, requests=args.history // 4, max_prompt=60, max_new=20
        )
        h = run_history(modules, spec, workload, mode=args.mode)
        seed += 1
        totals["audited"] += h.audited
        totals["checked"] += h.checked
        totals["steps"] += h.steps
        if h.failure is not None:
            totals["flagged"] += 1
            if not first_flag:
                first_flag.append(
                    {
                        "seed": 1000 + seed - 1,
                        "step": h.failure.step,
                        "codes": list(h.failure.codes),
                    }
                )
        for check, said in h.sglang_counts.items():
            sglang[check] = sglang.get(check, 0) + said
        for name, count in h.counters.as_dict().items():
            counters[name] = counters.get(name, 0) + count
    cpu_s = time.process_time() - cpu
    return {
        **totals,
        "histories": seed,
        "first_flagged": first_flag[0] if first_flag else None,
        "sglang_complaints": sglang,
        "workload": counters,
        "cpu_s": round(cpu_s, 1),
        "wall_s": round(time.perf_counter() - wall, 1),
        "audited_per_cpu_s": round(totals["audited"] / max(cpu_s, 1e-9), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", default=None)
    parser.add_argument("--steps", type=int, default=1000, help="audited states per page size")
    parser.add_argument("--history", type=int, default=120, help="workload steps per history")
    parser.add_argument("--mode", choices=("full", "live", "both"), default="full")
    parser.add_argument("--page-sizes", default="1,4")
    args = parser.parse_args()
    wheel = args.wheel or wheel_path()
    if wheel is None:
        sys.exit("no SGLang 0.5.23 wheel cached: pip download sglang==0.5.23 --no-deps")
    modules = load_sglang(wheel)
    out: dict[str, object] = {"sglang": modules.tree.version, "mode": args.mode}
    for page_size in (int(p) for p in args.page_sizes.split(",")):
        out[f"page_size_{page_size}"] = _page_size_run(modules, page_size, args)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
