"""`check` on a production-sized vLLM block pool (a synth dump: 131,072 blocks, 1,024 requests,
full attention, or full + sliding window with --hybrid), against a bare numpy pass over the
same arrays: read them, count holders and queue places, compare with the reference counts,
compare the prefix map's digests with its blocks'.

    python bench/pool_check.py [--hybrid] [--repeat 5]

Prints one JSON object: the pool's size, the median seconds of the check (read + every
invariant + the report) and of the bare pass, and their ratio (target: ≤ 5x, ≤ 2 s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvcanary_cli.dump.atomic import write_safetensors  # noqa: E402
from kvcanary_cli.dump.engine import read_arrays  # noqa: E402
from kvcanary_cli.engines import check_pool_dump  # noqa: E402
from kvcanary_cli.engines.vllm.synth import build  # noqa: E402


def bare_pass(path: Path) -> int:
    """The floor: the same arrays read, and one numpy operation on each of them: holders
    counted (tables, deferred frees), queue places counted, reference counts compared, the
    prefix map's digests compared with its blocks' digests."""
    a = read_arrays(path).arrays
    n = a["vllm.ref_cnt"].size
    holders = np.bincount(a["vllm.table_block"], minlength=n)
    holders += np.bincount(a["vllm.deferred_block"], minlength=n)
    queued = np.bincount(a["vllm.free_queue"], minlength=n)
    wrong = (holders != a["vllm.ref_cnt"]) & (queued == 0)
    digests = a["vllm.hash_digest"][a["vllm.map_block"]].view(np.uint64)
    stale = (digests != a["vllm.map_digest"].view(np.uint64)).any(axis=1)
    return int(wrong.sum() + stale.sum())


def median_time(fn: object, repeat: int) -> float:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - start)
    return statistics.median(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hybrid", action="store_true")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    name = "vllm-hybrid-clean" if args.hybrid else "vllm-clean"
    state = build(name, seed=0, size="large")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "pool.safetensors"
        write_safetensors(path, *state.contents())
        report = check_pool_dump(path)
        assert report.error is None and not report.findings, report
        check_s = median_time(lambda: check_pool_dump(path), args.repeat)
        bare_s = median_time(lambda: bare_pass(path), args.repeat)
    print(
        json.dumps(
            {
                "scenario": name,
                "blocks": state.num_blocks,
                "requests": len(state.request_ids),
                "table_entries": int(state.table_block.size),
                "queued": int(state.free_queue.size),
                "check_s": round(check_s, 4),
                "bare_numpy_s": round(bare_s, 4),
                "ratio": round(check_s / bare_s, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
