"""Benchmark: how small `kvcanary shrink` makes production-shaped dumps, and whether
compressing the result is worth offering.

For each size it builds a serving state with 256 active requests and an SWA LUT cut to 60 % of
its length (the truncated-LUT bug), its full-pool pages drawn from a shuffled free list as on a
serving engine after some churn (`--ordered`: handed out in page order, the old shape). It
saves it, checks it, shrinks it, checks the small dump (asserting the same findings and
diagnosis), and compresses both files with gzip (levels 1, 6, 9) and, when the `zstd` program
is installed, zstd (levels 3 and 19). The small dump's bytes are listed tensor by tensor (its
dtype and shape as stored), to show where they go. Sizes and seconds go to stdout and to
`bench/out/shrink-<size>.json` (`shrink-<size>-ordered.json` with `--ordered`). Nothing here
is asserted in tests. Usage:

    python bench/shrink.py --size medium           # 2049 x 32772 req_to_token (268 MB)
    python bench/shrink.py --size medium --ordered # the same, pages handed out in order
    python bench/shrink.py --size large            # 4097 x 131076 (2.1 GB; several minutes)
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from kvcanary_cli import api
from kvcanary_cli.analysis.check import run_check
from kvcanary_cli.dump.header import read_header
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.planners.base import Semantics
from kvcanary_cli.planners.vectorized import VectorizedPlanner
from kvcanary_cli.results.check import DumpReport
from kvcanary_cli.synth.scenarios import SIZES
from kvcanary_cli.synth.state import build_dump

torch.set_num_threads(1)  # as the CLI does: see kvcanary_cli.cli.main

OUT = Path(__file__).parent / "out"
ACTIVE_ROWS = 256
LUT_KEPT = 0.6


def build(size: str, seed: int, path: Path, *, ordered: bool = False) -> None:
    """A production-shaped state of `size` with 256 requests, its LUT cut to 60 %, its pages
    from a shuffled free list (`ordered`: in page order)."""
    spec = replace(
        SIZES[size],
        active_rows=ACTIVE_ROWS,
        history=2 * ACTIVE_ROWS,
        window=128,
        shuffled_free_list=not ordered,
    )
    state = build_dump(spec, seed=seed)
    lut = state.tensors["full_to_swa_index_mapping"]
    state.tensors["full_to_swa_index_mapping"] = lut[: int(lut.shape[0] * LUT_KEPT)].copy()
    state.save(path)


def _timed(run: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = run()
    return value, time.perf_counter() - start


def _check(path: Path) -> DumpReport:
    return run_check(
        load_dump(path),
        planner=VectorizedPlanner(),
        kernel=VectorizedPlanner(semantics=Semantics.GPU),
    )


def _story(report: DumpReport) -> tuple[list[tuple[object, ...]], list[str]]:
    findings = sorted(
        (f.code.value, f.group, f.slot, f.batch_row, f.pool_row, f.position)
        for f in report.findings
    )
    return [tuple(-1 if v is None else v for v in f) for f in findings], [
        c.code.value for c in report.diagnosis
    ]


def stored_bytes(path: Path) -> dict[str, dict[str, Any]]:
    """Each tensor of a safetensors file as stored (bytes, dtype, shape), largest first: where
    a small dump's bytes go (read from the header only)."""
    entries = sorted(read_header(path).entries.values(), key=lambda e: (-e.nbytes, e.name))
    return {e.name: {"bytes": e.nbytes, "dtype": e.dtype, "shape": list(e.shape)} for e in entries}


def compressed_sizes(path: Path) -> dict[str, dict[str, float]]:
    """Bytes and seconds of gzip (1, 6, 9) and zstd (3, 19, when installed) of a file."""
    data = path.read_bytes()
    sizes: dict[str, dict[str, float]] = {}
    for level in (1, 6, 9):
        start = time.perf_counter()
        packed = gzip.compress(data, compresslevel=level)
        seconds = time.perf_counter() - start
        sizes[f"gzip-{level}"] = {"bytes": len(packed), "seconds": round(seconds, 2)}
    zstd = shutil.which("zstd")
    if zstd is not None:
        for level in (3, 19):
            start = time.perf_counter()
            done = subprocess.run(
                [zstd, f"-{level}", "-q", "-c", str(path)], capture_output=True, check=True
            )
            seconds = time.perf_counter() - start
            sizes[f"zstd-{level}"] = {"bytes": len(done.stdout), "seconds": round(seconds, 2)}
    return sizes


def run(size: str, seed: int, workdir: Path, *, ordered: bool = False) -> dict[str, Any]:
    original, small = workdir / f"{size}.safetensors", workdir / f"{size}.small.safetensors"
    _, build_s = _timed(lambda: build(size, seed, original, ordered=ordered))
    report, check_s = _timed(lambda: _check(original))
    result, shrink_s = _timed(lambda: api.shrink(original, small))
    small_report, small_check_s = _timed(lambda: _check(small))
    same = _story(report) == _story(small_report)
    again = workdir / f"{size}.small2.safetensors"
    api.shrink(small, again)
    record: dict[str, Any] = {
        "size": size,
        "seed": seed,
        "allocation": "ordered" if ordered else "shuffled",
        "table": [SIZES[size].max_reqs, SIZES[size].max_seq_len],
        "active_rows": ACTIVE_ROWS,
        "findings": len(report.findings),
        "diagnosis": _story(report)[1],
        "same_findings_and_diagnosis": same,
        "reshrink_identical": again.read_bytes() == small.read_bytes(),
        "original_bytes": original.stat().st_size,
        "small_bytes": result.file_bytes,
        "seconds": {
            "build": round(build_s, 1),
            "check_original": round(check_s, 1),
            "shrink": round(shrink_s, 1),
            "check_small": round(small_check_s, 1),
        },
        "small_tensors": stored_bytes(small),
        "kept": {
            t.name: {"kept": t.kept, "of": t.kept + t.dropped, "rows": [t.kept_rows, t.rows]}
            for t in result.record.tensors
        },
        "compressed_small": compressed_sizes(small),
        "compressed_original": compressed_sizes(original),
    }
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("medium", "large"), default="medium")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary one")
    parser.add_argument(
        "--ordered", action="store_true", help="hand pages out in page order (the old shape)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        record = run(args.size, args.seed, args.workdir or Path(tmp), ordered=args.ordered)
    OUT.mkdir(exist_ok=True)
    suffix = "-ordered" if args.ordered else ""
    (OUT / f"shrink-{args.size}{suffix}.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    if not record["same_findings_and_diagnosis"]:
        raise SystemExit("FAIL: the small dump tells another story")


if __name__ == "__main__":
    main()
