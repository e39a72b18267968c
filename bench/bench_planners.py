"""Benchmark: kvcanary's planners and check against a literal scalar loop and a bare numpy gather.

Figures are ratios measured in the same run (these machines are noisy), never asserted in
tests. Usage:

    python bench/bench_planners.py --size medium            # 2049 x 32772 req_to_token
    python bench/bench_planners.py --size large --skip-scalar   # 4097 x 131076 (2.1 GB)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from timing import timed

from kvcanary_cli.analysis.check import run_check
from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.dump.scenarios import make_scenario
from kvcanary_cli.dump.sparse import dense
from kvcanary_cli.planners.base import Semantics
from kvcanary_cli.planners.reference import ReferencePlanner
from kvcanary_cli.planners.triton_planner import TritonPlanner
from kvcanary_cli.planners.vectorized import TorchPlanner

torch.set_num_threads(1)  # as the CLI does: see kvcanary_cli.cli.main

OUT = Path(__file__).parent / "out"


def numpy_gather(dump: KvDump) -> np.ndarray:
    """The floor: gather every verify slot of the full group with one numpy fancy index."""
    table = dense(dump.req_to_token).numpy().reshape(-1)
    rpi = dump.req_pool_indices.numpy()
    prefix = np.clip(dump.prefix_lens.numpy(), 0, None)
    lens = np.where(rpi != 0, prefix, 0)
    rows = np.repeat(np.arange(rpi.size), lens)
    pos = np.arange(rows.size) - np.repeat(np.cumsum(lens) - lens, lens)
    gathered: np.ndarray = table[rpi[rows] * dump.max_seq_len + pos]
    return gathered


def scalar_loop(dump: KvDump) -> list[int]:
    """A literal per-token Python loop over the same gather (what kvcanary must beat)."""
    table = dense(dump.req_to_token)
    out = []
    for rp, p in zip(dump.req_pool_indices.tolist(), dump.prefix_lens.tolist(), strict=True):
        if rp == 0:
            continue
        row = table[rp]
        for pos in range(max(p, 0)):
            out.append(int(row[pos]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="medium", choices=["tiny", "small", "medium", "large"])
    parser.add_argument("--scenario", default="clean-swa")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--skip-scalar",
        action="store_true",
        help="skip the per-token Python loops (minutes on large)",
    )
    parser.add_argument("--triton", action="store_true", help="also time the Triton planner")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    path = OUT / f"{args.scenario}-{args.size}.safetensors"
    if not path.exists():
        start = time.perf_counter()
        make_scenario(args.scenario, size=args.size).save(path)
        print(f"built {path.name} in {time.perf_counter() - start:.1f}s")
    dump = load_dump(path)
    entries = int(numpy_gather(dump).size)
    print(
        f"{path.name}: req_to_token {tuple(dump.req_to_token.shape)}, bs {dump.bs}, "
        f"{entries} full-group verify entries, file {path.stat().st_size / 2**20:.0f} MiB"
    )
    t: dict[str, float] = {}
    t["load_dump (lazy)"] = timed(lambda: load_dump(path), args.repeat)
    t["numpy gather"] = timed(lambda: numpy_gather(dump), args.repeat)
    torch_planner = TorchPlanner()
    t["torch planner, full group"] = timed(lambda: torch_planner.plan(dump, "full"), args.repeat)
    t["check (torch kernel)"] = timed(
        lambda: run_check(
            dump, reference=torch_planner, kernel=TorchPlanner(semantics=Semantics.GPU)
        ),
        1,
    )
    if args.triton:
        triton_planner = TritonPlanner()
        triton_planner.plan(dump, "full")  # warm-up: compile (CUDA) or trace (interpreter)
        t["triton planner, full group"] = timed(lambda: triton_planner.plan(dump, "full"), 1)
    if not args.skip_scalar:
        t["scalar loop (gather only)"] = timed(lambda: scalar_loop(dump), 1)
        t["reference planner (scalar)"] = timed(lambda: ReferencePlanner().plan(dump, "full"), 1)
    base = t["numpy gather"]
    print(f"{'what':32} {'seconds':>10} {'x numpy':>10}")
    for name, seconds in t.items():
        print(f"{name:32} {seconds:10.4f} {seconds / base:10.1f}")
    if "scalar loop (gather only)" in t:
        speedup = t["scalar loop (gather only)"] / t["torch planner, full group"]
        print(f"torch planner is {speedup:.0f}x faster than the literal scalar loop")
    (OUT / f"results-{args.size}.json").write_text(
        json.dumps({"dump": path.name, "entries": entries, "seconds": t}, indent=2)
    )


if __name__ == "__main__":
    main()
