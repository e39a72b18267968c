"""bench/run.py runs end to end on a tiny dump and records every figure the performance targets
are stated in. Nothing here asserts a time: timings belong to the benchmark's own output.

The two end-to-end runs (bench/run.py, bench/timeline.py: half a minute of CPU) are the deep
lane's: the harnesses are run whenever their figures are measured, and the suite keeps their
`--help` and the module walk."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.sglang_wheel import wheel_path
from tests.torch_extra import HAS_TORCH

ROOT = Path(__file__).resolve().parents[1]

#: Whole-process measurements (seconds and peak RSS), with --truncated-lut.
PROCESSES = [
    "check.truncated-lut.triton",
    "check.truncated-lut.vectorized",
    "check.truncated-lut.none",
    "check.clean.triton",
    "check_json.truncated-lut.triton",
    "check_json.clean.triton",
    "provenance_slot.finding",
    "provenance_slot.clean",
    "provenance_row",
    "inspect",
    "help",
    "floor.scan",
]
#: Measured in the benchmark's own process (seconds).
IN_PROCESS = [
    f"planners.{group}.{planner}"
    for group in ("full", "swa")
    for planner in ("vectorized", "vectorized-gpu", "triton", "triton_first_call", "reference")
] + ["floor.gather.full", "floor.gather.swa", "floor.gather"]
SGLANG = ["sglang.process", "sglang.full", "sglang.swa", "sglang.both"]
COLD = ["cold.check_json", "cold.provenance_slot"]
RATIOS = [
    "sglang_reference_over_check_triton",
    "truncated_json_over_clean_check",
    "truncated_json_over_clean_json",
    "provenance_slot_finding_over_scan",
    "provenance_slot_clean_over_scan",
    "check_json_rss_above_table_touched_gib",
    "provenance_slot_rss_above_table_touched_gib",
    "help_imports_torch",
    "help_imports_triton",
    "inspect_imports_torch",
    "inspect_imports_triton",
    "check_imports_torch",
    "provenance_imports_torch",
    "help_seconds",
]


def _seconds(record: dict[str, Any]) -> None:
    s = record["seconds"]
    assert all(math.isfinite(s[k]) and s[k] >= 0 for k in ("min", "median", "max"))
    assert s["min"] <= s["median"] <= s["max"]
    assert len(s["samples"]) >= 1


@pytest.mark.slow
@pytest.mark.deep
def test_the_benchmark_records_every_metric(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    argv = ["--size", "tiny", "--truncated-lut", "--repeat", "1", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), *argv, "--cache", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    metrics = record["metrics"]
    for name in PROCESSES:
        _seconds(metrics[name])
        assert metrics[name]["peak_rss_bytes"]["median"] > 0, name
    for name in IN_PROCESS:
        _seconds(metrics[name])
    for name in ("check_json.truncated-lut.triton", "check_json.clean.triton"):
        assert metrics[name]["output_bytes"] > 0
    # The tiny truncated dump has out-of-range slots, so check finds them (exit 1).
    assert record["dumps"]["truncated-lut"]["queries"]["lut_out_of_range_cells"] > 0
    assert metrics["check.truncated-lut.triton"]["exit_codes"] == [1]
    assert metrics["check.clean.triton"]["exit_codes"] == [0]
    for name in COLD:
        _seconds(metrics[name])
        assert metrics[name]["table_bytes_touched"] > 0
    for name in ("help", "inspect", "check", "provenance"):
        assert set(metrics[f"imports.{name}"]["imports"]) >= {"torch", "triton"}
    assert metrics["imports.check"]["imports"]["triton"]  # it did run the kernels
    sglang_here = HAS_TORCH and (
        wheel_path() is not None or importlib.util.find_spec("sglang") is not None
    )
    for name in SGLANG:
        if "skipped" in metrics[name]:
            assert not sglang_here, metrics[name]["skipped"]
        else:
            _seconds(metrics[name])
    ratios = record["ratios"]
    missing = [n for n in RATIOS if ratios.get(n) is None and not n.startswith("sglang")]
    assert not missing
    if sglang_here:
        assert ratios["sglang_reference_over_check_triton"] is not None
    assert "ratios (the performance targets" in done.stdout


def test_the_benchmark_explains_itself() -> None:
    """`--help` lists the options and the parts --skip takes (argparse formats help text with
    %, so a stray percent sign in it would turn --help into a traceback)."""
    shown = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "--truncated-lut" in shown.stdout and "parts for --skip" in shown.stdout


#: The most kvcanary_cli modules `check` may enter on one example dump, in any format (issue 44:
#: a step the dump gives nothing to do is not taken; one topic is one module).
CHECK_MODULES = 40


@pytest.mark.slow
def test_check_of_an_example_enters_at_most_40_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/walk.py's count for `check` on the truncated-LUT example, in every format."""
    spec = importlib.util.spec_from_file_location("bench_walk", ROOT / "bench" / "walk.py")
    assert spec is not None and spec.loader is not None
    walk = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, walk)  # its dataclasses look their module up
    spec.loader.exec_module(walk)
    import kvcanary_cli
    from kvcanary_cli.cli import app

    package = Path(kvcanary_cli.__file__).resolve().parent
    dump = ROOT / "examples" / "truncated-lut.safetensors"
    entered = {}
    for fmt in walk.FORMATS:
        command = ["check", str(dump), "--format", fmt]
        walk.run_check(app, command, None)  # its lazy imports first, as the walk does
        entered[fmt] = sorted(walk.run_check(app, command, package).walk.visits())
    over = {fmt: modules for fmt, modules in entered.items() if len(modules) > CHECK_MODULES}
    assert not over, {fmt: (len(modules), modules) for fmt, modules in over.items()}


#: What bench/timeline.py measures (whole processes) and the ratios the target is stated in.
TIMELINE_PROCESSES = ["checks", "checks_none", "timeline", "provenance_slot"]
TIMELINE_RATIOS = [
    "timeline_over_checks",
    "timeline_over_checks_none",
    "provenance_slot_over_checks_none",
    "timeline_rss_over_one_check_rss",
    "timeline_rss_over_one_check_none_rss",
    "timeline_rss_over_two_tables",
    "timeline_rss_gib",
]


@pytest.mark.slow
@pytest.mark.deep
def test_the_timeline_benchmark_records_its_ratios(tmp_path: Path) -> None:
    out = tmp_path / "timeline.json"
    argv = ["--size", "tiny", "--repeat", "1", "--json", str(out), "--cache", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "timeline.py"), *argv],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    for name in TIMELINE_PROCESSES:
        _seconds(record["metrics"][name])
        assert record["metrics"][name]["peak_rss_bytes"] > 0
    # the planted leak: every check and the timeline find it (exit 1); provenance exits 0
    assert [record["metrics"][n]["exit_code"] for n in TIMELINE_PROCESSES] == [1, 1, 1, 0]
    assert all(math.isfinite(record["ratios"][n]) for n in TIMELINE_RATIOS)
    assert len(record["dumps"]) == 4 and "timeline_over_checks" in done.stdout


def test_the_pool_shrink_benchmark_holds_the_small_dumps_report_to_the_originals(
    tmp_path: Path,
) -> None:
    """bench/pool_shrink.py's measure on a tiny pool: a held block's fault keeps its story and
    a clean pool shrinks, so the figures it prints come from a working shrink."""
    spec = importlib.util.spec_from_file_location(
        "bench_pool_shrink", ROOT / "bench" / "pool_shrink.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for name in ("vllm-freed-while-held", "vllm-clean"):
        row = bench.measure(name, "small", tmp_path)
        assert row["same_report"] and row["small_bytes"] < row["bytes"], row
    assert row["findings"] == [] and not list(tmp_path.iterdir())  # both files removed
