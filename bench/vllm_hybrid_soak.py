"""vLLM's hybrid models under the soak workload on one release: per model and seed one clean
history, audited after every step, and the most state blocks a live request's Mamba table
held at any step (against the bound the capture read from the group's spec).

    python bench/vllm_hybrid_soak.py [--wheel PATH | --version 0.33.0] [--steps 1000]
        [--seed 0 1 ...] [--model hybrid hybrid-mamba hybrid-chunked-local full]

Prints one JSON object per history: the release, model, seed, steps run and audited,
preemptions, prefix hits, aborts, the Mamba bound and the highest count seen (Mamba only),
kvcanary's first finding (code and step) and what vLLM's own asserts raised (step, exception,
frame), and the history's CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvcanary_cli.engines.vllm.state import MAMBA  # noqa: E402
from kvcanary_cli.soak import vllm_driver  # noqa: E402
from kvcanary_cli.soak.vllm_stack import load_vllm  # noqa: E402
from tests.vllm_wheel import wheel_path  # noqa: E402

HYBRIDS = ("hybrid", "hybrid-mamba", "hybrid-chunked-local")


def _most_states(scheduler: Any) -> int:
    """The most non-null entries any live request's Mamba table holds now (0: no Mamba group)."""
    most = 0
    for manager in scheduler.manager.coordinator.single_type_managers:
        if type(manager).__name__ != "MambaManager":
            continue
        for rid, table in manager.req_to_blocks.items():
            if rid in scheduler.requests:
                most = max(most, sum(not b.is_null for b in table))
    return most


def history(modules: Any, model: str, seed: int, steps: int) -> dict[str, Any]:
    seen: list[Any] = []
    most = 0

    def count(scheduler: Any) -> None:
        nonlocal most
        if not seen:
            seen.append(scheduler)
        most = max(most, _most_states(scheduler))

    cpu = time.process_time()
    h = vllm_driver.run_history(modules, model, seed, steps, observe=count)
    [scheduler] = seen
    bounds = [g.max_states for g in scheduler.state().groups if g.kind == MAMBA]
    out: dict[str, Any] = {
        "vllm": modules.tree.version,
        "model": model,
        "seed": seed,
        "steps": h.steps,
        "audited": h.audited,
        "preemptions": h.preemptions,
        "prefix_hits": h.prefix_hits,
        "aborts": h.aborts,
        "finding": None if not h.findings else f"{h.findings[0].code} at step {h.finding_step}",
        "vllm_said": None
        if h.crash is None
        else f"step {h.crash.step}: {h.crash.exception} in {h.crash.raised_in}",
        "cpu_s": round(time.process_time() - cpu, 2),
    }
    if bounds:
        out["mamba_bound"] = bounds[0]
        out["mamba_most_states"] = most
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wheel", default=None)
    parser.add_argument("--version", default=None, help="a cached wheel's release")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seed", type=int, nargs="+", default=[0, 1])
    # (`full`, full attention alone, beside the hybrids: the same release's baseline)
    parser.add_argument(
        "--model", nargs="+", choices=list(vllm_driver.MODELS), default=list(HYBRIDS)
    )
    args = parser.parse_args()
    wheel = args.wheel or (wheel_path(args.version) if args.version else wheel_path())
    if wheel is None:
        sys.exit("no such vLLM wheel cached: pip download vllm==X --no-deps")
    modules = load_vllm(wheel)
    for model in args.model:
        for seed in args.seed:
            print(json.dumps(history(modules, model, seed, args.steps)), flush=True)


if __name__ == "__main__":
    main()
