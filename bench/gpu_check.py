"""Device check: the compiled Triton planner against VectorizedPlanner(GPU) and the reference.

Checks that the three agree on a synthetic serving state (field by field with the vectorized
GPU semantics; upstream fields with the reference), then prints median wall times and ratios.
Run by bench/gpu_check.sh on a CUDA machine; on a CPU it runs the interpreter (use --size tiny).

    python bench/gpu_check.py --size medium --repeat 5
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from timing import timed

from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.planners.base import Plan, Semantics
from kvcanary_cli.planners.reference import ReferencePlanner
from kvcanary_cli.planners.triton_planner import TritonPlanner
from kvcanary_cli.planners.vectorized import VectorizedPlanner
from kvcanary_cli.synth.scenarios import make_scenario


def differences(got: Plan, want: Plan) -> list[str]:
    """Names of the Plan fields that differ (backend excepted)."""
    bad = []
    for name in Plan.__dataclass_fields__:
        a, b = getattr(got, name), getattr(want, name)
        if name == "backend":
            continue
        if isinstance(a, np.ndarray):
            same = a.dtype == b.dtype and np.array_equal(a, b)
        elif name == "problems":
            same = a.same_as(b)
        else:
            same = a == b
        if not same:
            bad.append(name)
    return bad


def check_group(dump: KvDump, group: str, repeat: int, skip_reference: bool) -> dict[str, float]:
    """Agreement, then timings of one group; returns seconds per planner."""
    triton = TritonPlanner()
    vectorized_gpu = VectorizedPlanner(semantics=Semantics.GPU)
    start = time.perf_counter()
    plan = triton.plan(dump, group)  # warm-up: compiles (CUDA) or traces (interpreter)
    first = time.perf_counter() - start
    bad = differences(plan, vectorized_gpu.plan(dump, group))
    if bad:
        sys.exit(f"FAIL {group}: triton differs from vectorized-gpu in {bad}")
    seconds = {"triton (first call)": first}
    if not skip_reference:
        ref = ReferencePlanner().plan(dump, group)
        if plan.enable == 1:
            for name, value in plan.upstream_tensors().items():
                if not np.array_equal(value, ref.upstream_tensors()[name]):
                    sys.exit(f"FAIL {group}: triton differs from the reference in {name}")
    seconds["triton"] = timed(lambda: triton.plan(dump, group), repeat)
    seconds["vectorized-gpu"] = timed(lambda: vectorized_gpu.plan(dump, group), repeat)
    if not skip_reference:
        seconds["reference"] = timed(lambda: ReferencePlanner().plan(dump, group), 1)
    if torch.cuda.is_available():
        table = dump.req_to_token.array()
        host = torch.from_numpy(table)
        seconds["req_to_token to cuda"] = timed(lambda: host.to("cuda"), repeat)
    print(f"[{group}] {plan.entries} entries, bs {plan.bs}, mode {triton.mode}: agree")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="medium", choices=["tiny", "small", "medium", "large"])
    parser.add_argument("--scenario", default="clean-swa")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        path = make_scenario(args.scenario, size=args.size).save(Path(tmp) / "d.safetensors")
        dump = load_dump(path)
        print(
            f"{args.scenario}/{args.size}: req_to_token {tuple(dump.req_to_token.shape)}, "
            f"bs {dump.bs}, built in {time.perf_counter() - start:.1f}s"
        )
        results = {g: check_group(dump, g, args.repeat, args.skip_reference) for g in dump.groups}
    print(f"\n{'group':6} {'planner':22} {'seconds':>10} {'vs triton':>10}")
    for group, seconds in results.items():
        base = seconds["triton"]
        for name, value in seconds.items():
            print(f"{group:6} {name:22} {value:10.4f} {value / base:10.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
