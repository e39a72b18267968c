"""Benchmark: how small `kvcanary shrink` makes vLLM block-pool dumps, and whether the small
dump tells the same story.

For every vLLM synth scenario (or those named) at one size (default `large`: 131,072 blocks,
1,024 requests) it writes the dump, checks it, shrinks it, checks the small dump and holds
the two reports equal (findings with their blocks, holders, queue places and messages,
causes, the pool's counts; the path and the coverage lines naming the original aside). It
prints one line per scenario (bytes before and after, their ratio, the seconds of the
shrink and of each check) and writes `bench/out/pool-shrink-<size>.json`. Nothing here is
asserted in tests. Usage:

    python bench/pool_shrink.py [--size large] [--scenario vllm-clean ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvcanary_cli import __version__  # noqa: E402
from kvcanary_cli.dump.atomic import write_safetensors  # noqa: E402
from kvcanary_cli.engines import check_pool_dump, shrink_pool_dump  # noqa: E402
from kvcanary_cli.engines.vllm.synth import SCENARIOS, SIZES, build  # noqa: E402
from kvcanary_cli.results.pool import PoolDumpReport  # noqa: E402

OUT = Path(__file__).parent / "out"


def _timed(fn: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def measure(name: str, size: str, folder: Path) -> dict[str, Any]:
    """One scenario written, checked, shrunk and checked again; its sizes and seconds."""
    big, small = folder / f"{name}.safetensors", folder / f"{name}.small.safetensors"
    write_safetensors(big, *build(name, seed=0, size=size).contents())
    before, check_s = _timed(lambda: check_pool_dump(big))
    _, shrink_s = _timed(
        lambda: shrink_pool_dump(big, small, kvcanary_version=__version__, force=True)
    )
    after, small_check_s = _timed(lambda: check_pool_dump(small))
    assert isinstance(before, PoolDumpReport) and isinstance(after, PoolDumpReport)
    assert before.error is None and after.error is None, (before.error, after.error)
    same = replace(after, path=before.path, coverage=before.coverage) == before
    big_bytes, small_bytes = big.stat().st_size, small.stat().st_size
    big.unlink()
    small.unlink()
    return {
        "scenario": name,
        "findings": [f.code for f in before.findings],
        "same_report": same,
        "bytes": big_bytes,
        "small_bytes": small_bytes,
        "ratio": round(big_bytes / small_bytes, 1),
        "check_s": round(check_s, 3),
        "shrink_s": round(shrink_s, 3),
        "small_check_s": round(small_check_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=list(SIZES), default="large")
    parser.add_argument("--scenario", action="append", choices=list(SCENARIOS))
    args = parser.parse_args()
    blocks, requests = SIZES[args.size]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.scenario or list(SCENARIOS):
            row = measure(name, args.size, Path(folder))
            rows.append(row)
            print(
                f"{name:34} {row['bytes']:>11,} -> {row['small_bytes']:>9,} bytes "
                f"({row['ratio']:>6}x)  shrink {row['shrink_s']:.2f} s  check "
                f"{row['check_s']:.2f} -> {row['small_check_s']:.2f} s  same report: "
                f"{row['same_report']}"
            )
    OUT.mkdir(exist_ok=True)
    result = {"size": args.size, "blocks": blocks, "requests": requests, "scenarios": rows}
    (OUT / f"pool-shrink-{args.size}.json").write_text(json.dumps(result, indent=1) + "\n")
    if not all(row["same_report"] for row in rows):
        sys.exit("a small dump told another story (see same_report)")


if __name__ == "__main__":
    main()
