"""vLLM 0.33.0's real `KVCacheManager` (the release wheel, on CPU) under the soak workload:
clean histories of both models audited after every step, and each planted fault in each
model, found (or not) at the step it is planted, and what vLLM's own asserts said.

    python bench/vllm_soak.py [--wheel PATH] [--steps 5000] [--history 500]

Prints one JSON object: per model, the audited steps, findings (must be none), vLLM's
crashes (none), preemptions, prefix hits, aborts, audited steps per CPU second; per fault
and model, the planted step, kvcanary's finding step and code, and vLLM's complaint's step.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvcanary_cli.soak.vllm_driver import FAULTS, MODELS, run_history  # noqa: E402
from kvcanary_cli.soak.vllm_stack import load_vllm  # noqa: E402
from tests.vllm_wheel import wheel_path  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wheel", default=None)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--history", type=int, default=500)
    args = parser.parse_args()
    wheel = args.wheel or wheel_path()
    if wheel is None:
        sys.exit("no vLLM 0.33.0 wheel cached: pip download vllm==0.33.0 --no-deps")
    modules = load_vllm(wheel)
    out: dict[str, object] = {"vllm": modules.tree.version}
    for model in MODELS:
        totals = dict(audited=0, findings=0, crashes=0, preemptions=0, prefix_hits=0, aborts=0)
        cpu = time.process_time()
        seed = 0
        while totals["audited"] < args.steps:
            h = run_history(modules, model, seed, args.history)
            seed += 1
            totals["audited"] += h.audited
            totals["findings"] += len(h.findings)
            totals["crashes"] += h.crash is not None
            totals["preemptions"] += h.preemptions
            totals["prefix_hits"] += h.prefix_hits
            totals["aborts"] += h.aborts
        rate = totals["audited"] / max(time.process_time() - cpu, 1e-9)
        out[model] = {**totals, "histories": seed, "audited_steps_per_cpu_s": round(rate)}
    faults = {}
    for fault in FAULTS:
        for model in MODELS:
            h = run_history(modules, model, 3, 300, fault=fault, after_steps=1000)
            faults[f"{fault}/{model}"] = {
                "planted": h.fault_step,
                "found": h.finding_step,
                "code": h.findings[0].code.value if h.findings else None,
                "vllm_said": None
                if h.crash is None
                else f"step {h.crash.step}: {h.crash.exception} in {h.crash.raised_in}",
            }
    out["faults"] = faults
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
