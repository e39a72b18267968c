"""Benchmark kvcanary on production-shaped dumps, against SGLang's own planner and the floor.

    python bench/run.py --size medium                    # clean dump, 3 repetitions
    python bench/run.py --size medium --truncated-lut    # the LUT cut to 60 %: findings path
    python bench/run.py --size medium --truncated-lut --ordered   # pages handed out in order
    python bench/run.py --size large --repeat 1 --skip reference sglang

Builds (once, cached) a dump of the size (bench/dumps.py; slots drawn from a shuffled free list,
as on a serving engine after some churn, unless `--ordered`), then measures in one run, each
command `--repeat` times in turn (min / median / max):

- whole processes, with their peak RSS: `kvcanary check` per kernel, `check --format json`
  (and its output's size), `provenance --slot` (a slot with findings, a clean one),
  `provenance --row`, `inspect`, `kvcanary --help`; with `--truncated-lut` also `check` and
  `check --format json` on the clean dump, the baseline of the truncated-LUT target;
- whether `--help`, `inspect`, `check` and `provenance --slot` import torch or triton;
- cold runs of `check --format json` and `provenance --slot` (the dump dropped from the page
  cache first): peak RSS against the bytes of `req_to_token` the run brought in;
- in this process: each planner per group, and the floor: a bare numpy gather of the cells
  the planners read; in a bare child: one chunked scan of the whole table (the floor of
  `provenance --slot`);
- SGLang's own torch reference planner on the clean dump, both groups, when SGLang 0.5.23
  can be loaded (installed, or the release wheel cached as `.ci/run` caches it).

Children run with Python's bytecode cache, kvcanary_cli byte-compiled first, as an installed
package runs (PYTHONDONTWRITEBYTECODE would otherwise recompile this checkout on every start).

Prints the ratios the performance targets are stated in and writes everything as JSON
(`--json`, default bench/out/run-SIZE[-truncated-lut].json). Times are machine-dependent:
compare ratios from one run, never numbers across machines.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This checkout's kvcanary_cli (and tests.sglang_wheel), whatever else is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse  # noqa: E402
import importlib.metadata  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from functools import partial  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from dumps import (  # noqa: E402
    CLEAN,
    LUT_KEPT,
    SHAPES,
    TRUNCATED,
    BenchDump,
    default_cache,
    ensure_dumps,
    write_json,
)
from procs import (  # noqa: E402
    ROOT,
    ChildRun,
    compile_bytecode,
    evict,
    kvcanary,
    resident_bytes,
    run_child,
)
from timing import samples, summary  # noqa: E402

from kvcanary_cli import __version__  # noqa: E402
from kvcanary_cli.dump.loader import KvDump, load_dump  # noqa: E402
from kvcanary_cli.planners.base import Planner, Semantics  # noqa: E402
from kvcanary_cli.planners.reference import ReferencePlanner  # noqa: E402
from kvcanary_cli.planners.triton_planner import TritonPlanner  # noqa: E402
from kvcanary_cli.planners.vectorized import VectorizedPlanner  # noqa: E402

WORKERS = Path(__file__).resolve().parent / "workers.py"
KERNELS = ("triton", "vectorized", "none")
#: What `--skip` can leave out.
PARTS = {
    "check": "check per kernel (and the clean baseline of --truncated-lut)",
    "json": "check --format json",
    "provenance": "provenance --slot and --row",
    "inspect": "inspect",
    "help": "kvcanary --help",
    "imports": "whether --help, inspect, check and provenance --slot import torch/triton",
    "cold": "cold runs: peak RSS against the table pages touched",
    "planners": "the planners in this process",
    "reference": "the scalar reference planner (part of planners)",
    "floor": "the bare gather and the bare chunked scan",
    "sglang": "SGLang's own reference planner",
}
SGLANG_VERSION = "0.5.23"
GiB = 2**30


@dataclass(kw_only=True)
class Command:
    """One whole-process measurement, repeated."""

    name: str
    argv: list[str]
    dump: str
    runs: list[ChildRun] = field(default_factory=list)
    #: parses the child's stdout into extra samples (name -> seconds); None: stdout discarded.
    parse: Callable[[str], dict[str, float]] | None = None
    extra: dict[str, list[float]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def run(self, timeout: float) -> None:
        """One more run; none after a run that hit the time limit (it is a bound already)."""
        if any(r.timed_out for r in self.runs):
            return
        done = run_child(self.argv, keep_stdout=self.parse is not None, timeout=timeout)
        self.runs.append(done)
        if done.timed_out:
            return
        if self.parse is not None:
            for key, value in self.parse(done.stdout).items():
                self.extra.setdefault(key, []).append(value)

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "command": [Path(a).name if a == sys.executable else a for a in self.argv],
            "dump": self.dump,
            "seconds": summary([r.seconds for r in self.runs]),
            "peak_rss_bytes": summary([float(r.peak_rss_bytes) for r in self.runs]),
            "exit_codes": sorted({r.exit_code for r in self.runs}),
            "stdout_bytes": self.runs[-1].stdout_bytes,
            # True: stopped at --timeout; its seconds (and its ratios) are lower bounds.
            "timed_out": any(r.timed_out for r in self.runs),
        }
        out.update(self.info)
        return out


class Bench:
    """Collects the run's metrics (name -> record) and prints them as they come."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.skip: set[str] = set(args.skip)
        self.metrics: dict[str, dict[str, Any]] = {}

    def wants(self, part: str) -> bool:
        return part not in self.skip

    def add(self, name: str, record: dict[str, Any]) -> None:
        self.metrics[name] = record
        print(f"  {name:34} {_describe(record)}", flush=True)

    def median(self, name: str, key: str = "seconds") -> float | None:
        record = self.metrics.get(name)
        if record is None or key not in record:
            return None
        return float(record[key]["median"])

    def timed_out(self, name: str) -> bool:
        return bool(self.metrics.get(name, {}).get("timed_out"))


def _describe(record: dict[str, Any]) -> str:
    if "skipped" in record:
        return f"skipped: {record['skipped']}"
    parts = []
    if "seconds" in record:
        s = record["seconds"]
        parts.append(f"{s['min']:8.3f} {s['median']:8.3f} {s['max']:8.3f} s")
    elif "imports" in record:
        parts.append(", ".join(f"{k} {'yes' if v else 'no'}" for k, v in record["imports"].items()))
    if record.get("timed_out"):
        parts.append("TIMED OUT (a lower bound)")
    if "peak_rss_bytes" in record:
        parts.append(f"rss {record['peak_rss_bytes']['median'] / 2**20:6.0f} MiB")
    if "output_bytes" in record:
        parts.append(f"output {record['output_bytes'] / 2**20:.1f} MiB")
    if "table_bytes_touched" in record:
        parts.append(f"table touched {record['table_bytes_touched'] / 2**20:.0f} MiB")
        if not record["evicted"]:
            parts.append("(could not drop it from the page cache first)")
    return "  ".join(parts)


# --- whole processes --------------------------------------------------------------------------


def commands(bench: Bench, dumps: dict[str, BenchDump], main: str) -> list[Command]:
    """The repeated whole-process measurements of this run."""
    path = str(dumps[main].path)
    queries = dumps[main].info["queries"]
    out: list[Command] = []
    if bench.wants("check"):
        for kernel in KERNELS:
            argv = kvcanary("check", path, "--kernel", kernel)
            out.append(Command(name=f"check.{main}.{kernel}", argv=argv, dump=main))
        if main != CLEAN:
            argv = kvcanary("check", str(dumps[CLEAN].path), "--kernel", "triton")
            out.append(Command(name="check.clean.triton", argv=argv, dump=CLEAN))
    if bench.wants("json"):
        for variant in dict.fromkeys([main, CLEAN]):
            argv = kvcanary("check", str(dumps[variant].path), "--format", "json")
            out.append(Command(name=f"check_json.{variant}.triton", argv=argv, dump=variant))
    if bench.wants("provenance"):
        for which in ("finding", "clean"):
            slot = str(queries[f"slot_{which}"])
            out.append(
                Command(
                    name=f"provenance_slot.{which}",
                    argv=kvcanary("provenance", path, "--slot", slot),
                    dump=main,
                    info={"slot": int(slot)},
                )
            )
        row = str(queries["row"])
        out.append(
            Command(
                name="provenance_row",
                argv=kvcanary("provenance", path, "--row", row),
                dump=main,
                info={"row": int(row)},
            )
        )
    if bench.wants("inspect"):
        out.append(Command(name="inspect", argv=kvcanary("inspect", path), dump=main))
    if bench.wants("help"):
        out.append(Command(name="help", argv=kvcanary("--help"), dump=""))
    if bench.wants("floor"):
        argv = [sys.executable, str(WORKERS), "scan", path, str(queries["slot_finding"])]
        out.append(Command(name="floor.scan", argv=argv, dump=main))
    return out


def sglang_command(bench: Bench, dumps: dict[str, BenchDump]) -> Command | None:
    """SGLang's reference planner on the clean dump, in a child; None (recorded) if unavailable."""
    if not bench.wants("sglang"):
        return None
    root, why = sglang_root(bench.args.cache)
    if root is None:
        for name in ("sglang.process", "sglang.full", "sglang.swa", "sglang.both"):
            bench.add(name, {"skipped": why})
        return None

    def parse(stdout: str) -> dict[str, float]:
        record = json.loads(stdout)
        groups = record.pop("groups")
        command.info["sglang"] = {**record, "raised": {g: v["raised"] for g, v in groups.items()}}
        seconds = {g: float(v["seconds"]) for g, v in groups.items()}
        return {**seconds, "both": sum(seconds.values())}

    path = str(dumps[CLEAN].path)
    command = Command(
        name="sglang.process",
        argv=[sys.executable, str(WORKERS), "sglang", root, path],
        dump=CLEAN,
        parse=parse,
        info={"from": why},
    )
    return command


def sglang_root(cache: Path) -> tuple[str | None, str]:
    """Where SGLang comes from: ("", how) for an installed one, (extracted tree, how) for the
    cached release wheel, (None, why not) otherwise."""
    if importlib.util.find_spec("torch") is None:  # an extra: SGLang's planner runs on it
        return None, "torch is not installed (SGLang runs on it): pip install 'kvcanary[torch]'"
    if importlib.util.find_spec("sglang") is not None:
        return "", "the installed SGLang"
    from tests.sglang_wheel import extract_kv_canary, wheel_path

    wheel = wheel_path()
    if wheel is None:
        found = sorted(Path("/tmp/sglang-wheel").glob(f"sglang-{SGLANG_VERSION}-*.whl"))
        wheel = found[0] if found else None
    if wheel is None:
        return None, (
            f"SGLang is not installed and its {SGLANG_VERSION} wheel is not cached (pip download "
            f"sglang=={SGLANG_VERSION} --no-deps -d ~/.cache/kvcanary/wheels)"
        )
    root = cache / wheel.stem
    if not root.exists():
        scratch = Path(tempfile.mkdtemp(prefix=".sglang-", dir=cache))
        extract_kv_canary(wheel, scratch)
        scratch.rename(root)
    return str(root), f"the plan modules of {wheel.name}"


def cold_runs(bench: Bench, dump: BenchDump, slot: int) -> None:
    """`check --format json` and `provenance --slot` with the dump out of the page cache:
    peak RSS against the bytes of req_to_token the run brought into the cache."""
    runs = []
    if bench.wants("json"):
        runs.append(("cold.check_json", kvcanary("check", str(dump.path), "--format", "json")))
    if bench.wants("provenance"):
        runs.append(
            ("cold.provenance_slot", kvcanary("provenance", str(dump.path), "--slot", str(slot)))
        )
    for name, argv in runs:
        evict(dump.path)
        before = resident_bytes(dump.path, dump.table_offset, dump.table_bytes)
        done = run_child(argv, timeout=bench.args.timeout)
        touched = resident_bytes(dump.path, dump.table_offset, dump.table_bytes)
        bench.add(
            name,
            {
                "command": argv[1:],
                "dump": dump.variant,
                "seconds": summary([done.seconds]),
                "peak_rss_bytes": summary([float(done.peak_rss_bytes)]),
                "table_bytes_cached_before": before,
                # False: the page cache kept the table (tmpfs?), so "touched" is an upper bound.
                "evicted": before == 0,
                "table_bytes_touched": touched,
                "table_bytes": dump.table_bytes,
                "batch_table_bytes": dump.info["batch_table_bytes"],
                "rss_above_table_touched_bytes": done.peak_rss_bytes - touched,
                "timed_out": done.timed_out,
            },
        )


def imports(bench: Bench, dump: BenchDump) -> None:
    """Whether `kvcanary --help`, `inspect`, `check` and `provenance --slot` import torch or
    triton (a check runs the kernels: triton, but on a CPU never torch)."""
    slot = str(dump.info["queries"]["slot_finding"])
    for name, args in (
        ("help", ["--help"]),
        ("inspect", ["inspect", str(dump.path)]),
        ("check", ["check", str(dump.path), "--format", "json"]),
        ("provenance", ["provenance", str(dump.path), "--slot", slot]),
    ):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "modules.json"
            run_child([sys.executable, str(WORKERS), "modules", str(out), "--", *args])
            bench.add(f"imports.{name}", {"imports": json.loads(out.read_text())})


def warm(path: Path) -> None:
    """Read a file once, so that every timed run starts with it in the page cache."""
    with path.open("rb") as f:
        while f.read(16 << 20):
            pass


# --- in this process ---------------------------------------------------------------------------


def timed(fn: Callable[[], object], repeat: int) -> dict[str, Any]:
    return {"seconds": summary(samples(fn, repeat))}


def planners(bench: Bench, dump: KvDump, repeat: int) -> None:
    """Each planner per group, as `check` runs them (this process never imports torch, so
    the interpreted Triton planner forks as it does in `check`)."""
    chosen: dict[str, Planner] = {
        "vectorized": VectorizedPlanner(),
        "vectorized-gpu": VectorizedPlanner(semantics=Semantics.GPU),
        "triton": TritonPlanner(),
    }
    if bench.wants("reference"):
        chosen["reference"] = ReferencePlanner()
    for group in dump.groups:
        for name, planner in chosen.items():
            if name == "triton":
                start = time.perf_counter()
                planner.plan(dump, group)  # traces the kernels (interpreter) or compiles (CUDA)
                first = time.perf_counter() - start
                bench.add(f"planners.{group}.triton_first_call", {"seconds": summary([first])})
            record = timed(partial(planner.plan, dump, group), repeat)
            record["entries"] = planner.plan(dump, group).entries
            bench.add(f"planners.{group}.{name}", record)


def floor_cells(dump: KvDump, group: str) -> tuple[np.ndarray, np.ndarray]:
    """Flat indices into req_to_token of the cells planning `group` reads: the verify range
    of each live row, `[max(0, P - W), P)` (W = 0: `[0, P)`)."""
    rpi = dump.req_pool_indices
    prefix = np.clip(dump.prefix_lens, 0, dump.max_seq_len)
    live = (rpi != 0) & (prefix > 0)
    rows, stops = rpi[live], prefix[live]
    window = dump.window(group)
    starts = np.maximum(stops - window, 0) if window > 0 else np.zeros_like(stops)
    lens = stops - starts
    first = np.repeat(rows * dump.max_seq_len + starts - (np.cumsum(lens) - lens), lens)
    return first + np.arange(int(lens.sum())), lens


def floor_gather(bench: Bench, dump: KvDump, repeat: int) -> None:
    """The bare numpy gather of the cells the planners read (SWA: and their LUT entries)."""
    table = dump.req_to_token.array().reshape(-1)
    lut = dump.full_to_swa_index_mapping
    lut_np = None if lut is None else lut.array()

    def gather(group: str) -> np.ndarray:
        index, _ = floor_cells(dump, group)
        slots: np.ndarray = table[index]
        if group == "swa" and lut_np is not None:
            inside = (slots >= 0) & (slots < lut_np.shape[0])
            slots = lut_np[slots[inside]]
        return slots

    for group in dump.groups:
        bench.add(f"floor.gather.{group}", timed(partial(gather, group), repeat))
    both = timed(lambda: [gather(g) for g in dump.groups], repeat)
    bench.add("floor.gather", both)


# --- ratios ------------------------------------------------------------------------------------


def ratios(bench: Bench, main: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The figures the targets are stated in (None where this run lacks a side), and which of
    them are bounds ('>=' or '<=') because a side hit --timeout."""
    m = bench.median
    out: dict[str, Any] = {}
    bounds: dict[str, str] = {}
    spread: dict[str, list[float]] = {}

    def paired(a: str, b: str) -> list[float]:
        """[min, median, max] of the ratios of the runs made in the same repetition."""
        top = bench.metrics.get(a, {}).get("seconds", {}).get("samples", [])
        bottom = bench.metrics.get(b, {}).get("seconds", {}).get("samples", [])
        ratios = [x / y for x, y in zip(top, bottom, strict=False) if y > 0]
        if not ratios:
            return []
        return [min(ratios), statistics.median(ratios), max(ratios)]

    def ratio(key: str, a: str, b: str) -> None:
        top, bottom = m(a), m(b)
        out[key] = None if top is None or bottom is None or bottom == 0 else top / bottom
        pairs = paired(a, b)
        if pairs:
            spread[key] = pairs
        over, under = bench.timed_out(a), bench.timed_out(b)
        if out[key] is not None and over != under:
            bounds[key] = ">=" if over else "<="
        elif out[key] is not None and over:
            bounds[key] = "?"

    for kernel in KERNELS:
        ratio(f"sglang_reference_over_check_{kernel}", "sglang.both", f"check.clean.{kernel}")
    ratio("sglang_process_over_check_triton", "sglang.process", "check.clean.triton")
    if main != CLEAN:
        json_main = f"check_json.{main}.triton"
        ratio("truncated_json_over_clean_check", json_main, "check.clean.triton")
        ratio("truncated_json_over_clean_json", json_main, "check_json.clean.triton")
        ratio("truncated_check_over_clean_check", f"check.{main}.triton", "check.clean.triton")
        truncated, clean = bench.metrics.get(json_main), bench.metrics.get("check.clean.triton")
        if truncated is not None and clean is not None:
            above = truncated["peak_rss_bytes"]["median"] - clean["peak_rss_bytes"]["median"]
            out["truncated_json_rss_above_clean_check_gib"] = above / GiB
            out["truncated_json_output_mib"] = truncated["stdout_bytes"] / 2**20
    for which in ("finding", "clean"):
        ratio(f"provenance_slot_{which}_over_scan", f"provenance_slot.{which}", "floor.scan")
    ratio("check_triton_over_floor_gather", f"check.{main}.triton", "floor.gather")
    for name in ("cold.check_json", "cold.provenance_slot"):
        record = bench.metrics.get(name)
        key = name.replace("cold.", "") + "_rss_above_table_touched_gib"
        out[key] = None if record is None else record["rss_above_table_touched_bytes"] / GiB
        if record is not None and record["timed_out"]:
            bounds[key] = ">="
    for name in ("help", "inspect", "check", "provenance"):
        record = bench.metrics.get(f"imports.{name}")
        for module in ("torch", "triton") if name in ("help", "inspect") else ("torch",):
            out[f"{name}_imports_{module}"] = None if record is None else record["imports"][module]
    out["help_seconds"] = m("help")
    out["paired_min_median_max"] = spread
    return out, bounds


TARGETS = {
    "sglang_reference_over_check_triton": ">= 10 (aim 20): check, default kernel, clean",
    "truncated_json_over_clean_check": "<= 2 medium, <= 3 large: truncated-LUT check --format "
    "json vs clean check (shuffled slots)",
    "truncated_json_rss_above_clean_check_gib": "<= 0.5 on medium",
    "truncated_json_output_mib": "<= 10 on medium",
    "truncated_json_over_clean_json": "<= 2: the same, both JSON",
    "provenance_slot_finding_over_scan": "<= 2: provenance --slot vs one bare chunked scan",
    "provenance_slot_clean_over_scan": "<= 2",
    "check_json_rss_above_table_touched_gib": "<= 1 on large (findings path included)",
    "provenance_slot_rss_above_table_touched_gib": "<= 1 on large",
    "help_imports_torch": "false",
    "help_imports_triton": "false",
    "inspect_imports_torch": "false",
    "inspect_imports_triton": "false",
    "check_imports_torch": "false (on a CPU)",
    "provenance_imports_torch": "false (on a CPU)",
}


def print_ratios(values: dict[str, Any], bounds: dict[str, str]) -> None:
    print("\nratios (the performance targets on the right; >= / <=: a side hit --timeout)")
    spread = values.get("paired_min_median_max", {})
    for name, value in values.items():
        if name == "paired_min_median_max":
            continue
        shown = "n/a" if value is None else value if isinstance(value, bool) else f"{value:.3f}"
        shown = f"{bounds.get(name, '')}{shown}"
        target = TARGETS.get(name, "")
        print(f"  {name:46} {shown!s:>10}   {target}")
        if name in spread and len(spread[name]) == 3:
            low, middle, high = spread[name]
            print(f"  {'':46} {'':>10}   paired runs: {low:.3f} / {middle:.3f} / {high:.3f}")


# --- main --------------------------------------------------------------------------------------


def _version(package: str) -> str | None:
    """An installed package's version, without importing it."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "platform": platform.platform(),
        "kvcanary": __version__,
        "commit": commit,
        "mem_available_bytes": _mem_available(),
    }


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="parts for --skip:\n" + "\n".join(f"  {k:11} {v}" for k, v in PARTS.items()),
    )
    parser.add_argument("--size", default="medium", choices=list(SHAPES))
    parser.add_argument(
        "--truncated-lut",
        action="store_true",
        help=f"cut the LUT to {LUT_KEPT * 100:.0f} %% of its length (the production bug)",
    )
    parser.add_argument(
        "--ordered",
        action="store_true",
        help="hand slots out in page order instead of from a shuffled free list (the old "
        "shape: the slots past a truncated LUT form one run per request)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--timeout",
        type=float,
        default=0,
        metavar="S",
        help="stop a whole-process run after S seconds and count it as a lower bound, not "
        "repeated (default: no limit)",
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=list(PARTS), metavar="PART")
    parser.add_argument(
        "--cache", type=Path, default=default_cache(), help="where the dumps are cached"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the CLI runs: kvcanary_cli.cli.main
    main_variant = TRUNCATED if args.truncated_lut else CLEAN
    dumps = ensure_dumps(
        args.size, list(dict.fromkeys([CLEAN, main_variant])), args.cache, ordered=args.ordered
    )
    target = dumps[main_variant]
    info = target.info
    print(
        f"{args.size} {main_variant} ({info['allocation']} slots): req_to_token "
        f"{info['req_to_token']}, bs {info['bs']} "
        f"({info['active_rows']} live), window {info['window']}, verify entries "
        f"{info['entries']['full']} full + {info['entries']['swa']} swa, lut_len "
        f"{info['lut_len']}, file {info['file_bytes'] / 2**20:.0f} MiB"
    )
    bytecode = compile_bytecode()
    print(f"bytecode: {bytecode}")
    bench = Bench(args)
    started, load_start = time.perf_counter(), os.getloadavg()
    print(f"\n{'metric':36} {'min':>8} {'median':>8} {'max':>8}")
    if bench.wants("cold"):
        cold_runs(bench, target, int(info["queries"]["slot_finding"]))
    if bench.wants("imports"):
        imports(bench, target)
    repeated = commands(bench, dumps, main_variant)
    sglang = sglang_command(bench, dumps)
    if sglang is not None:
        repeated.append(sglang)
    for dump in dumps.values():
        warm(dump.path)
    for _ in range(args.repeat):  # in turn, so that drift on a noisy machine spreads evenly
        for command in repeated:
            command.run(args.timeout)
    for command in repeated:
        record = command.record()
        if command.name.startswith("check_json."):
            record["output_bytes"] = record["stdout_bytes"]
        bench.add(command.name, record)
        for key, values in command.extra.items():
            bench.add(f"sglang.{key}", {"seconds": summary(values), "dump": CLEAN})
    if bench.wants("planners") or bench.wants("floor"):
        loaded = load_dump(target.path)
        if bench.wants("planners"):
            planners(bench, loaded, args.repeat)
        if bench.wants("floor"):
            floor_gather(bench, loaded, args.repeat)
    figures, bounds = ratios(bench, main_variant)
    print_ratios(figures, bounds)
    record = {
        "schema": "kvcanary.bench/1",
        "size": args.size,
        "truncated_lut": args.truncated_lut,
        "allocation": "ordered" if args.ordered else "shuffled",
        "repeat": args.repeat,
        "skipped": sorted(bench.skip),
        "machine": {**machine(), "loadavg_start": load_start, "loadavg_end": os.getloadavg()},
        "bytecode": bytecode,
        "seconds": time.perf_counter() - started,
        "dumps": {variant: {**d.info, "path": str(d.path)} for variant, d in dumps.items()},
        "metrics": bench.metrics,
        "ratios": figures,
        "ratio_bounds": bounds,
        "targets": TARGETS,
    }
    out = (
        args.json
        or ROOT
        / "bench"
        / "out"
        / f"run-{args.size}-{main_variant}{'-ordered' if args.ordered else ''}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, record)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
