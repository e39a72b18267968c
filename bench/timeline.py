"""Benchmark `kvcanary timeline` on a production-shaped sequence: 4 dumps of one rank.

    python bench/timeline.py --size medium            # 4 x 2049 x 32772 tables (~340 MB each)
    python bench/timeline.py --size medium --repeat 1 --event use-after-free

Builds (once, cached under `${KVCANARY_CACHE:-~/.cache/kvcanary}/bench/`) a sequence of
`synth --steps` (`synth/sequence.py`: 256 running requests of up to 16 K tokens, a 4 M-slot
pool, an SWA window of 4096; `--event` picks the planted event, default `swa-leak`), then
measures whole processes, `--repeat` times each, in turn:

- `kvcanary check DUMP` for each dump, one process after another (the default kernel, and
  `--kernel none`, which is how the timeline checks each dump): their summed seconds, and the
  largest peak RSS of one of them;
- `kvcanary timeline DUMP DUMP DUMP DUMP`: seconds and peak RSS;
- `kvcanary provenance --slot N DUMP...` over the four (no check): seconds and peak RSS.

It prints the ratios the target is stated in (`timeline_over_checks`: at most 2; the peak RSS
of the timeline against one check's, and against the bytes of two dumps' tables) and writes
everything as JSON (`--json`, default `bench/out/timeline-SIZE.json`). Times are
machine-dependent: compare ratios from one run. Nothing here is asserted in tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This checkout's kvcanary_cli, whatever else is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
from typing import Any  # noqa: E402

from dumps import default_cache, write_json  # noqa: E402
from procs import ChildRun, compile_bytecode, kvcanary, run_child  # noqa: E402

from kvcanary_cli import __version__  # noqa: E402
from kvcanary_cli.dump import writer  # noqa: E402
from kvcanary_cli.dump.header import read_header  # noqa: E402
from kvcanary_cli.synth import sequence  # noqa: E402
from kvcanary_cli.synth.sequence import PLANTED_KEY, write_sequence  # noqa: E402

GiB = 2**30
STEPS = 4
SEED = 0


def _key(size: str, event: str) -> str:
    """Hash of everything that decides the sequence's bytes."""
    h = hashlib.sha256("\0".join([size, event, str(STEPS), str(SEED), __version__]).encode())
    for module in (sequence, writer):
        assert module.__file__ is not None
        h.update(Path(module.__file__).read_bytes())
    return h.hexdigest()[:12]


def ensure_sequence(cache: Path, size: str, event: str) -> list[Path]:
    """The cached sequence (built when missing; stale ones of this size and event removed)."""
    folder = cache / f"timeline-{size}-{event}-{_key(size, event)}"
    done = folder / "complete"
    if not done.exists():
        for stale in cache.glob(f"timeline-{size}-{event}-*"):
            shutil.rmtree(stale)
        write_sequence(event, folder, steps=STEPS, seed=SEED, size=size, overwrite=True)
        done.write_text("ok\n")
    return sorted(folder.glob("*.safetensors"))


def _seconds(values: list[float]) -> dict[str, Any]:
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "samples": values,
    }


def _run(argv: list[str], timeout: float) -> ChildRun:
    return run_child(kvcanary(*argv), ok=(0, 1), timeout=timeout)


def measure(paths: list[Path], slot: int, repeat: int, timeout: float) -> dict[str, Any]:
    """Each measurement `repeat` times, in turn (so machine noise spreads over all of them)."""
    names = ["checks", "checks_none", "timeline", "provenance_slot"]
    seconds: dict[str, list[float]] = {name: [] for name in names}
    rss: dict[str, list[int]] = {name: [] for name in names}
    exits: dict[str, int] = {}
    dumps = [str(p) for p in paths]
    for _ in range(repeat):
        for name, kernel in (("checks", None), ("checks_none", "none")):
            runs = [
                _run(["check", d, *(["--kernel", kernel] if kernel else [])], timeout)
                for d in dumps
            ]
            seconds[name].append(sum(r.seconds for r in runs))
            rss[name].append(max(r.peak_rss_bytes for r in runs))
            exits[name] = max(r.exit_code for r in runs)
        for name, argv in (
            ("timeline", ["timeline", *dumps]),
            ("provenance_slot", ["provenance", "--slot", str(slot), *dumps]),
        ):
            run = _run(argv, timeout)
            seconds[name].append(run.seconds)
            rss[name].append(run.peak_rss_bytes)
            exits[name] = run.exit_code
    return {
        name: {
            "seconds": _seconds(seconds[name]),
            "peak_rss_bytes": max(rss[name]),
            "exit_code": exits[name],
        }
        for name in names
    }


def ratios(measured: dict[str, Any], table_bytes: int) -> dict[str, float]:
    """Medians of the per-repetition ratios, and the memory ratios."""

    def per_run(a: str, b: str) -> float:
        pairs = zip(
            measured[a]["seconds"]["samples"], measured[b]["seconds"]["samples"], strict=True
        )
        return float(statistics.median(x / y for x, y in pairs))

    timeline_rss = measured["timeline"]["peak_rss_bytes"]
    return {
        "timeline_over_checks": per_run("timeline", "checks"),
        "timeline_over_checks_none": per_run("timeline", "checks_none"),
        "provenance_slot_over_checks_none": per_run("provenance_slot", "checks_none"),
        "timeline_rss_over_one_check_rss": timeline_rss / measured["checks"]["peak_rss_bytes"],
        "timeline_rss_over_one_check_none_rss": timeline_rss
        / measured["checks_none"]["peak_rss_bytes"],
        "timeline_rss_over_two_tables": timeline_rss / (2 * table_bytes),
        "timeline_rss_gib": timeline_rss / GiB,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("tiny", "small", "medium"), default="medium")
    parser.add_argument("--event", choices=sequence.EVENTS, default="swa-leak")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per process")
    parser.add_argument("--cache", type=Path, default=None, help="default: ~/.cache/kvcanary")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    cache = args.cache or default_cache()
    cache.mkdir(parents=True, exist_ok=True)
    compiled = compile_bytecode()
    paths = ensure_sequence(cache, args.size, args.event)
    truth = json.loads(read_header(paths[-1]).metadata[PLANTED_KEY])
    slot = int((truth.get("slots") or [1])[0])
    table = read_header(paths[0]).entries["req_to_token"]
    measured = measure(paths, slot, args.repeat, args.timeout)
    record = {
        "kvcanary_version": __version__,
        "machine": {"python": platform.python_version(), "cpus": platform.machine()},
        "bytecode": compiled,
        "size": args.size,
        "event": args.event,
        "truth": {k: truth.get(k) for k in ("event", "after_step", "at_step", "pages")},
        "dumps": [{"path": str(p), "bytes": p.stat().st_size} for p in paths],
        "table": {"shape": list(table.shape), "bytes": table.nbytes},
        "repeat": args.repeat,
        "metrics": measured,
        "ratios": ratios(measured, table.nbytes),
    }
    out = args.json or Path(__file__).parent / "out" / f"timeline-{args.size}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, record)
    for name, metric in measured.items():
        s = metric["seconds"]
        print(
            f"{name:16} {s['min']:7.2f} / {s['median']:7.2f} / {s['max']:7.2f} s   "
            f"peak RSS {metric['peak_rss_bytes'] / GiB:5.2f} GiB   exit {metric['exit_code']}"
        )
    for name, value in record["ratios"].items():
        print(f"{name:40} {value:7.3f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
