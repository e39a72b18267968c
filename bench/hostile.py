"""Benchmark: the bounded-work cases of the fourth hostile-input round, as whole processes
(seconds and peak RSS, the child's own `VmHWM`), optionally of another checkout to compare.

- `stale-rows-N`: N batch rows each reading a stale tail (the last 4 of 8 cells freed):
  `check --kernel none --quiet`, and `--format markdown` (its length, and whether the
  diagnosis survived the body's trim). The stale-row diagnosis once filtered every cell per
  batch row (minutes at 100 K rows) and argued with one line per row.
- `wide-shrunk`: a production-shaped pool (2049 x 131,076, 256 live rows, SWA window 4096,
  LUT cut to 60 %) shrunk: `check --quiet`, `check` (table), `provenance --slot` of a
  finding's slot. The Triton staging once held int64 copies of every staged cell.
- `wide-pool-all-live`: a shrunk 2049 x 131,076 pool whose 2048 batch rows are all live
  (only their cells stored): `check`, which once said BAD INPUT (2^28 cells to stage).
- `one-slot-shrunk`: a 9.9 MB shrunk dump (format 1.2, uint8 elements, one run) of a 4097 x
  2400 table whose every live cell holds slot 7 (`tests.helpers.one_slot_shrunk_dump`):
  `provenance --slot 7` (table and JSON) and `check` (table, `--kernel none`, JSON, JSON to a
  file). Its table views once built every cell of both findings (9.8 M each) as Python ints
  to show a few (3.9 GB); `check`'s table once held both plans' 9.8 M entries as int64
  columns beside its findings (965 MiB; 590-620 MiB since, the Triton kernel's thread making
  it vary, 457 MiB with `--kernel none`), then int64 temporaries of every cell (a lexsort
  index, slot ranks, an index of the copies, the kernel's entries read back whole, an
  `np.isin` sort) and the live cells beside the plans: 530 MiB, 376 with `--kernel none`;
  then both findings' columns held a value a cell (139 MiB; now as runs, 240 KB) and the
  duplicate-in-row search sorted every cell at once: 361-396 MiB, 264 with `--kernel none`;
  then the slot counts, the diagnosis and the summaries indexed every cell at once and the
  plans took a million entries a chunk: 334 MiB, 218 with `--kernel none`, 222 for
  `provenance --slot 7` (322 before); then the alias search sorted a key of every cell, the
  detectors decoded the live cells' pool rows whole, a finding's columns were gathered whole
  before their runs were found, and the kernel's entries came back on top of the detectors:
  319 MiB, 271 now, 170 with `--kernel none` (docs/performance.md). Its JSON views (335 MB of
  text) were built whole, joined from each column's whole text, and a file's held again as
  bytes: 1.2-1.3 GB; written a piece at a time, they peak where the table views do (the
  check itself).

The fifth round's SIGTERM cases (a real process stopped mid-run, `tests/stopping.py`):

- `sigterm-pool`: `check` of four small dumps with `-j 2`, SIGTERM once both workers run: its
  exit code, seconds to exit, and the processes it left alive 10 s later (workers, the
  resource tracker) with their RSS. They once stayed forever, re-parented and blocked.
- `sigterm-writer`: `synth clean-swa --size medium --out` (285 MB), SIGTERM while its
  `.NAME.XXXX.tmp` is being written: the bytes left staged in the folder.
- `sigterm-cursor`: the `sigterm-pool` run on a pseudo-terminal, SIGTERM once the progress
  bar hid the cursor: whether the cursor was shown again.

Usage:

    python bench/hostile.py                     # this checkout
    python bench/hostile.py --tree /work/main   # another one, for a before/after
    python bench/hostile.py --skip wide-shrunk  # leave out the slow-to-build dump

Figures go to stdout and `bench/out/hostile.json` (`--json` elsewhere). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dumps import shape  # noqa: E402

from kvcanary_cli.results.check import CheckReport  # noqa: E402
from tests.child_memory import PEAK_RSS_SCRIPT  # noqa: E402
from tests.helpers import one_slot_shrunk_dump, stale_rows_dump, wide_shrunk_dump  # noqa: E402
from tests.stopping import HIDE_CURSOR, Stopped, is_worker, stop_when  # noqa: E402

OUT = ROOT / "bench" / "out"


def measure(tree: Path, *args: str, timeout: float = 1800) -> dict[str, Any]:
    """Exit code, seconds, peak RSS (MiB) and output of `kvcanary ARGS` run from `tree`."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    start = time.perf_counter()
    done = subprocess.run(  # run from `tree`: `python -c` puts the working directory first
        [sys.executable, "-c", PEAK_RSS_SCRIPT, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
        timeout=timeout,
        check=False,
    )
    seconds = time.perf_counter() - start
    lines = done.stderr.strip().splitlines()
    return {
        "args": list(args),
        "exit": done.returncode,
        "seconds": round(seconds, 2),
        "peak_rss_mib": round(int(lines[-1]) / 1024) if lines and lines[-1].isdigit() else None,
        "output_chars": len(done.stdout),
        "first_line": (done.stdout.splitlines() or [""])[0][:200],
        "stderr": "\n".join(lines[:-1])[-300:],
        "diagnosis_kept": "#### Diagnosis" in done.stdout,
    }


def _wide_shrunk(workdir: Path) -> tuple[Path, int]:
    """The shrunk production-shaped pool, and the slot of its largest finding."""
    from kvcanary_cli import api
    from kvcanary_cli.synth.state import build_dump

    source, small = workdir / "wide.safetensors", workdir / "wide.small.safetensors"
    state = build_dump(replace(shape("medium"), max_seq_len=131_076), seed=0)
    lut = state.tensors["full_to_swa_index_mapping"]
    state.tensors["full_to_swa_index_mapping"] = lut[: int(lut.shape[0] * 0.6)].copy()
    state.save(source)
    del state
    api.shrink(source, small)
    source.unlink()
    report = api.check([small], kernel="vectorized")
    assert isinstance(report, CheckReport)
    slot = max(
        (f for f in report.dumps[0].findings if f.slot is not None), key=lambda f: f.count
    ).slot
    assert slot is not None
    return small, slot


def one_slot_shrunk(tree: Path, workdir: Path) -> dict[str, Any]:
    """The `one-slot-shrunk` case: every live cell of a shrunk table holds slot 7."""
    path = str(one_slot_shrunk_dump(workdir / "one-slot.safetensors"))
    report = workdir / "one-slot.json"
    to_file = measure(tree, "check", path, "-f", "json", "-o", str(report))
    to_file["output_bytes"] = report.stat().st_size if report.exists() else None
    report.unlink(missing_ok=True)
    return {
        "file_bytes": Path(path).stat().st_size,
        "provenance_slot": measure(tree, "provenance", path, "--slot", "7"),
        "provenance_slot_json": measure(tree, "provenance", path, "--slot", "7", "-f", "json"),
        "check_table": measure(tree, "check", path),
        "check_table_no_kernel": measure(tree, "check", path, "--kernel", "none"),
        "check_json": measure(tree, "check", path, "-f", "json"),
        "check_json_file": to_file,
    }


def run(tree: Path, workdir: Path, skip: set[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for rows in (20_000, 100_000):
        name = f"stale-rows-{rows}"
        if name in skip:
            continue
        path = stale_rows_dump(workdir / f"{name}.safetensors", rows)
        results[name] = {
            "file_bytes": path.stat().st_size,
            "quiet": measure(tree, "check", str(path), "--kernel", "none", "--quiet"),
            "markdown": measure(
                tree, "check", str(path), "--kernel", "none", "--format", "markdown"
            ),
        }
    if "wide-shrunk" not in skip:
        small, slot = _wide_shrunk(workdir)
        results["wide-shrunk"] = {
            "file_bytes": small.stat().st_size,
            "check_quiet": measure(tree, "check", str(small), "--quiet"),
            "check_table": measure(tree, "check", str(small)),
            "provenance_slot": measure(tree, "provenance", str(small), "--slot", str(slot)),
        }
    if "wide-pool-all-live" not in skip:
        path = wide_shrunk_dump(workdir / "all-live.safetensors")
        results["wide-pool-all-live"] = {
            "file_bytes": path.stat().st_size,
            "check": measure(tree, "check", str(path), "--quiet"),
        }
    if "one-slot-shrunk" not in skip:
        results["one-slot-shrunk"] = one_slot_shrunk(tree, workdir)
    results.update(run_sigterm_cases(tree, workdir, skip))
    return results


#: Seconds a stopped run's processes get to end before they count as left behind.
_GRACE = 10


def _left(stopped: Stopped) -> dict[str, Any]:
    """What a signalled run ended with, and what it left alive (then ended here)."""
    record = {
        "signalled": stopped.signalled,
        "exit": stopped.exit_code,
        "seconds_to_exit": round(stopped.seconds, 2),
        "processes_left": len(stopped.survivors),
        "rss_left_mib": round(stopped.survivor_rss / 2**20),
    }
    stopped.kill_survivors()
    return record


def _four_small(workdir: Path) -> list[str]:
    from kvcanary_cli.synth.scenarios import make_scenario

    path = make_scenario("clean-swa", size="small").save(workdir / "sigterm-small.safetensors")
    return [str(path)] * 4


def _two_workers(alive: list[Any], written: bytes) -> bool:
    return sum(map(is_worker, alive)) >= 2


def sigterm_pool(tree: Path, workdir: Path) -> dict[str, Any]:
    args = ["check", *_four_small(workdir), "-j", "2"]
    return _left(stop_when(args, _two_workers, tree=tree, grace=_GRACE))


def sigterm_writer(tree: Path, workdir: Path) -> dict[str, Any]:
    out = workdir / "sigterm-out"
    out.mkdir()
    args = ["synth", "clean-swa", "--size", "medium", "--out", str(out / "big.safetensors")]
    record = _left(stop_when(args, lambda *_: any(out.glob(".*.tmp")), tree=tree, grace=_GRACE))
    staged = list(out.glob(".*.tmp"))
    record["staged_files_left"] = len(staged)
    record["staged_bytes_left"] = sum(p.stat().st_size for p in staged)
    record["output_written"] = (out / "big.safetensors").exists()
    for path in out.iterdir():
        path.unlink()
    return record


def sigterm_cursor(tree: Path, workdir: Path) -> dict[str, Any]:
    def bar_and_workers(alive: list[Any], written: bytes) -> bool:
        return HIDE_CURSOR in written and _two_workers(alive, written)

    args = ["check", *_four_small(workdir), "-j", "2"]
    stopped = stop_when(args, bar_and_workers, tree=tree, terminal=True, grace=_GRACE)
    restored = stopped.cursor_restored()
    return {**_left(stopped), "cursor_restored": restored}


#: The SIGTERM cases, by name (`--skip NAME` leaves one out).
SIGTERM_CASES = {
    "sigterm-pool": sigterm_pool,
    "sigterm-writer": sigterm_writer,
    "sigterm-cursor": sigterm_cursor,
}


def run_sigterm_cases(tree: Path, workdir: Path, skip: set[str]) -> dict[str, Any]:
    return {name: case(tree, workdir) for name, case in SIGTERM_CASES.items() if name not in skip}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to measure")
    parser.add_argument("--skip", action="append", default=[], help="a case to leave out")
    parser.add_argument("--json", type=Path, default=OUT / "hostile.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        record = {"tree": str(args.tree), "cases": run(args.tree, Path(tmp), set(args.skip))}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
