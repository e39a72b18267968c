"""What the vLLM assert hook (`engines.vllm.hook`) costs when nothing fires: unaudited clean
histories of vLLM 0.33.0's real `KVCacheManager` (the release wheel, on CPU), with and
without the hook, interleaved so that the shared machine's load falls on both alike.

    python bench/vllm_hook.py [--wheel PATH] [--steps 2000] [--rounds 5]

Prints one JSON object: per model, the CPU seconds of each round with and without the hook,
the best of each, and the best's ratio; the calls wrapped entry points took per step.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvcanary_cli.soak.vllm_driver import MODELS, run_history  # noqa: E402
from kvcanary_cli.soak.vllm_stack import load_vllm  # noqa: E402
from tests.vllm_wheel import wheel_path  # noqa: E402


def _cpu(modules: object, model: str, steps: int, folder: Path | None) -> float:
    started = time.process_time()
    h = run_history(modules, model, 7, steps, audit_every=False, assert_dumps=folder)
    assert h.crash is None and not h.assert_dumps
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wheel", default=None)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    wheel = args.wheel or wheel_path()
    if wheel is None:
        sys.exit("no vLLM 0.33.0 wheel cached: pip download vllm==0.33.0 --no-deps")
    modules = load_vllm(wheel)
    out: dict[str, object] = {"vllm": modules.tree.version, "steps": args.steps}
    with tempfile.TemporaryDirectory() as folder:
        for model in MODELS:
            bare, hooked = [], []
            for _ in range(args.rounds):
                bare.append(round(_cpu(modules, model, args.steps, None), 3))
                hooked.append(round(_cpu(modules, model, args.steps, Path(folder)), 3))
            out[model] = {
                "bare_cpu_s": bare,
                "hooked_cpu_s": hooked,
                "steps_per_cpu_s_bare": round(args.steps / min(bare)),
                "steps_per_cpu_s_hooked": round(args.steps / min(hooked)),
                "ratio_of_best": round(min(hooked) / min(bare), 3),
            }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
