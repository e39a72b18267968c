"""Benchmark: what a capture dump costs a serving process (issue: capture where production runs).

Builds, as CPU tensors, what the hook writes at a violation, a failed guard or a snapshot: a
`req_to_token` of production shape with slots drawn from a shuffled free list, the SWA LUT
(`num_full_slots + 1` entries), both free lists, two canary buffers of 32 bytes per slot and the
violation ring. It then times, in the same run:

- `copy`: cloning every tensor once (on a GPU server the device-to-host copy of the same bytes
  is this, over PCIe, roughly 10-25 GB/s);
- `capture`: `store.capture_dump`, the hook's own write (tensors to numpy, checks, one file;
  the process's first dump also imports the writer, timed apart);
- `raw`: `ndarray.tofile` of the same bytes (the disk's floor).

It reports seconds, GB/s and `capture / raw`, to stdout and `bench/out/capture-<size>.json`.
Nothing here is asserted in tests. Usage:

    python bench/capture.py --size medium   # 2049 x 32772 req_to_token (268 MB)
    python bench/capture.py --size large    # 4097 x 131076 (2.1 GB), the production table
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from kvcanary_cli.capture import store

#: (max_reqs, max_seq_len, full pool slots) per size.
SIZES = {
    "small": (257, 4100, 1 << 18),
    "medium": (2049, 32772, 1 << 21),
    "large": (4097, 131076, 1 << 22),
}


def serving_state(size: str, seed: int = 0) -> tuple[dict[str, object], dict[str, object]]:
    """(launcher arguments, server context) of a busy server: every row half full of slots
    drawn from a shuffled free list."""
    rows, width, pool = SIZES[size]
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(np.arange(1, pool, dtype=np.int32))
    table = np.zeros((rows, width), dtype=np.int32)
    used = min(width // 2, (pool - 1) // rows)
    table[1:, :used] = shuffled[: (rows - 1) * used].reshape(rows - 1, used)
    lut = np.zeros(pool + 1, dtype=np.int64)
    lut[: pool // 2] = np.arange(pool // 2)
    lut[-1] = -1
    bs = 256
    call = {
        "req_pool_indices": torch.arange(1, bs + 1, dtype=torch.int64),
        "prefix_lens": torch.full((bs,), used - 1, dtype=torch.int64),
        "extend_seq_lens": torch.ones(bs, dtype=torch.int64),
        "req_to_token": torch.from_numpy(table),
        "swa_window_size": 4096,
        "full_to_swa_index_mapping": torch.from_numpy(lut),
        "verify_capacity": 1 << 20,
        "kv_token_id_vs_position_offset": 0,
    }
    context = {
        "num_full_slots": pool,
        "num_swa_slots": pool // 2,
        "page_size": 1,
        "free_full_slots": torch.from_numpy(
            np.sort(shuffled[(rows - 1) * used :]).astype(np.int64)
        ),
        "free_swa_slots": torch.arange(pool // 2, pool // 2 + 1024, dtype=torch.int64),
        "canary.full.head.k": torch.zeros((pool, 32), dtype=torch.uint8),
        "canary.full.tail.k": torch.zeros((pool, 32), dtype=torch.uint8),
        "violation_ring": torch.zeros((1024, 8), dtype=torch.int64),
        "violation_write_index": torch.zeros(1, dtype=torch.int32),
    }
    return call, context


def _timed(action: object, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="medium")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    call, context = serving_state(args.size)
    tensors = [v for v in {**call, **context}.values() if isinstance(v, torch.Tensor)]
    total = store.estimated_bytes({**call, **context})
    with tempfile.TemporaryDirectory(dir=Path(__file__).parent / "out") as folder:
        out = Path(folder)
        counter = iter(range(1 << 30))

        def capture() -> None:
            store.BUDGET = store.Budget()
            path = store.capture_dump(out, f"c{next(counter)}", call, {"step": 0}, context)
            assert path is not None
            path.unlink()

        def raw() -> None:
            target = out / "raw.bin"
            with target.open("wb") as handle:
                for tensor in tensors:
                    tensor.numpy().tofile(handle)
            target.unlink()

        copy = _timed(lambda: [t.clone() for t in tensors], args.repeat)
        first = _timed(capture, 1)  # the process's first dump imports the writer
        written = _timed(capture, args.repeat)
        floor = _timed(raw, args.repeat)
    ratios = [w / r for w, r in zip(written, floor, strict=True)]
    result = {
        "size": args.size,
        "bytes": total,
        "copy_s": copy,
        "first_capture_s": first[0],
        "capture_s": written,
        "raw_s": floor,
        "capture_gb_per_s": total / statistics.median(written) / 1e9,
        "raw_gb_per_s": total / statistics.median(floor) / 1e9,
        "capture_over_raw": {
            "min": min(ratios),
            "median": statistics.median(ratios),
            "max": max(ratios),
        },
    }
    print(json.dumps(result, indent=2))
    target = Path(__file__).parent / "out" / f"capture-{args.size}.json"
    target.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
