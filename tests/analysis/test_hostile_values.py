"""Corrupt values in readable dumps (issue 11): reported as findings with the rest of the
dump analysed, never sized by a claimed number, never an internal error.

Each case is small on disk and was a minutes-long run, gigabytes of memory, a false finding,
a hidden one, or exit 3 before: the memory guards run the check in a fresh process and
bound its own peak RSS (a guard against unbounded work, not a speed assertion).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from kvcanary_cli.analysis import dump_pool
from kvcanary_cli.analysis.dump_pool import worker_count
from kvcanary_cli.cli import app
from kvcanary_cli.dump.writer import save_dump
from kvcanary_cli.synth.scenarios import make_scenario
from tests.child_memory import peak_rss_of

ROOT = Path(__file__).resolve().parents[2]
CLEAN = str(ROOT / "examples" / "clean-swa.safetensors")
#: Peak RSS a check of a small dump may reach: numpy and triton imported, a few arrays (no
#: torch: about 60 MB for a vectorized check of a small example, 140 MB with the kernels).
SMALL_DUMP_RSS = 400 << 20


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def report_of(path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    code, out, err = run("check", str(path), "--format", "json", "--kernel", "vectorized", *extra)
    assert code in (0, 1), err
    return code, json.loads(out)["dumps"][0]


def codes(report: dict[str, Any]) -> dict[str, int]:
    """Cells per finding code (a finding group counts its cells)."""
    out: dict[str, int] = {}
    for f in report["findings"]:
        out[f["code"]] = out.get(f["code"], 0) + f["count"]
    return out


def with_changes(
    tmp_path: Path, name: str, *, metadata: dict[str, str] | None = None, **tensors: Any
) -> Path:
    base = make_scenario("clean-swa", seed=1)
    contents: dict[str, Any] = {**base.tensors, **tensors}
    return save_dump(tmp_path / name, metadata={**base.metadata, **(metadata or {})}, **contents)


def peak_rss_of_check(path: Path, *args: str) -> tuple[int, int]:
    """(exit code, peak RSS in bytes) of `kvcanary check PATH ARGS` in a fresh process: its
    own high-water mark, whatever this process holds (`tests.child_memory`)."""
    return peak_rss_of("check", str(path), "--format", "json", *args)


# --- one slot everywhere: bounded findings and output ----------------------------------------


def spread_dump(path: Path, rows: int, cols: int) -> Path:
    """Every cell of every row holds slot 7: aliasing and in-row repeats at every cell."""
    bs = rows - 1
    return save_dump(
        path,
        req_to_token=np.full((rows, cols), 7, dtype=np.int32),
        req_pool_indices=np.arange(1, rows),
        prefix_lens=np.full((bs,), cols),
        extend_seq_lens=np.zeros(bs, dtype=np.int64),
    )


def test_one_slot_everywhere_is_one_finding_group(tmp_path: Path) -> None:
    rows, cols = 70, 128  # a 36 KB dump: 97 s, 1.4 GB and 185 MB of JSON once
    path = spread_dump(tmp_path / "spread.safetensors", rows, cols)
    code, out, err = run("check", str(path), "--format", "json", "--kernel", "vectorized")
    assert code == 1, err
    report = json.loads(out)["dumps"][0]
    # every cell is accounted for: all but the first of each row repeat within the row
    assert codes(report)["duplicate-slot-in-row"] == (rows - 1) * (cols - 1)
    # ... as one finding group with every cell in its columns, not one record per cell
    (duplicates,) = [f for f in report["findings"] if f["code"] == "duplicate-slot-in-row"]
    cells = duplicates["cells"]
    assert sorted(zip(cells["batch_row"], cells["position"], strict=True)) == [
        (row, position) for row in range(rows - 1) for position in range(1, cols)
    ]
    assert set(cells["slot"]) == {7}
    assert duplicates["span"] == {
        "rows": rows - 1,
        "batch_rows": [0, rows - 2],
        "positions": [1, cols - 1],
        "slots": [7, 7],
        "distinct_slots": 1,
    }
    assert len(out) < 400_000  # output grows with the problems (and a column per cell)


@pytest.mark.slow  # whole processes, measured in memory
def test_one_slot_everywhere_is_bounded_in_memory(tmp_path: Path) -> None:
    path = spread_dump(tmp_path / "spread.safetensors", 257, 1024)  # 1 MB: 16 GB before
    code, peak = peak_rss_of_check(path, "--kernel", "vectorized")
    assert code == 1
    assert peak < SMALL_DUMP_RSS


# --- claimed lengths never size the work --------------------------------------------------------


@pytest.mark.parametrize("value", [1 << 29, 4 * 10**13, (1 << 63) - 1])
def test_absurd_extend_length_is_a_finding(tmp_path: Path, value: int) -> None:
    extend = make_scenario("clean-swa", seed=1).tensors["extend_seq_lens"].copy()
    extend[0] = value
    path = with_changes(tmp_path, "extend.safetensors", extend_seq_lens=extend)
    code, report = report_of(path)
    assert code == 1 and report["error"] is None
    beyond = [f for f in report["findings"] if f["code"] == "prefix-beyond-row"]
    assert [f["batch_row"] for f in beyond] == [0]
    assert report["diagnosis"][0]["cause"] == "batch-metadata-corrupt"


@pytest.mark.parametrize("value", [1 << 41, (1 << 63) - 1, -(1 << 63)])
def test_absurd_prefix_length_is_a_finding(tmp_path: Path, value: int) -> None:
    prefix = make_scenario("clean-swa", seed=1).tensors["prefix_lens"].copy()
    prefix[1] = value
    path = with_changes(tmp_path, "prefix.safetensors", prefix_lens=prefix)
    code, report = report_of(path)
    assert report["error"] is None
    found = codes(report)
    if value < 0:  # a warning: planned as 0, like upstream
        assert code == 0 and found.get("negative-length") == 1
    else:
        assert code == 1 and found.get("prefix-beyond-row") == 1
        assert found.get("verify-total-implausible") == 1  # the full group is not planned
        full = next(g for g in report["groups"] if g["group"] == "full")
        assert full["total_verify"] >= value  # the claim is reported exactly
    # the rest of the dump is still analysed: the swa group is planned and compared
    swa = next(g for g in report["groups"] if g["group"] == "swa")
    assert swa["kernel"] == "vectorized-gpu" and swa["unexplained_differences"] == 0


@pytest.mark.slow  # whole processes, measured in memory
def test_absurd_lengths_stay_bounded_in_memory(tmp_path: Path) -> None:
    extend = make_scenario("clean-swa", seed=1).tensors["extend_seq_lens"].copy()
    extend[0] = 1 << 29  # 56 s and 8.6 GB before (repeat_interleave of the claim)
    path = with_changes(tmp_path, "extend.safetensors", extend_seq_lens=extend)
    code, peak = peak_rss_of_check(path)  # the default kernel: Triton, interpreted
    assert code == 1
    assert peak < SMALL_DUMP_RSS


# --- real-KV sources: each slot's bytes folded once, a step at a time ---------------------


def one_slot_real_kv_dump(path: Path, entries: int, width: int) -> Path:
    """Every verify entry reads slot 1, whose TAIL record is checked on `width` KV bytes."""
    table = np.zeros((2, entries), dtype=np.int32)
    table[1] = 1
    records = np.zeros((2, 32), dtype=np.uint8)
    records[1, 0] = 1  # written
    kv = np.random.default_rng(0).integers(0, 256, size=(2, width), dtype=np.uint8)
    return save_dump(
        path,
        req_to_token=table,
        req_pool_indices=np.array([1]),
        prefix_lens=np.array([entries]),
        extend_seq_lens=np.array([0]),
        metadata={"real_kv.mode": "all"},
        **{"canary.full.tail.k": records, "real_kv.full.k": kv},
    )


@pytest.mark.slow  # whole processes, measured in memory
@pytest.mark.parametrize(
    "command",
    [
        ["check", "--format", "json", "--kernel", "vectorized"],
        ["violations", "--replay", "--format", "json"],
        ["shrink", "--out", "{out}"],
    ],
    ids=["check", "violations", "shrink"],
)
def test_real_kv_replay_is_bounded_by_the_file(tmp_path: Path, command: list[str]) -> None:
    # 8,192 entries x 16,000 bytes of one slot: a 100 KB dump took 2.3 GB (the 1.6 MB one of
    # issue 27, 5.2 GB) when each entry gathered its slot's bytes as int64 indices.
    path = one_slot_real_kv_dump(tmp_path / "one-slot.safetensors", 8192, 16_000)
    out = str(tmp_path / "small.safetensors")
    args = [command[0], str(path), *(a.replace("{out}", out) for a in command[1:])]
    code, peak = peak_rss_of(*args)
    assert code == (0 if command[0] == "shrink" else 1)
    assert peak < SMALL_DUMP_RSS


# --- int64 tables: no packed keys that collide or overflow ---------------------------------


def int64_table(path: Path, cells: dict[tuple[int, int], int], *, cols: int = 4) -> Path:
    rows = 1 + max(r for r, _ in cells)
    table = np.zeros((rows + 1, cols), dtype=np.int64)
    for (r, c), slot in cells.items():
        table[r, c] = slot
    lens = np.array([1 + max(c for rr, c in cells if rr == r) for r in range(1, rows)])
    return save_dump(
        path,
        req_to_token=table,
        req_pool_indices=np.arange(1, rows),
        prefix_lens=lens,
        extend_seq_lens=np.zeros(rows - 1, dtype=np.int64),
    )


def test_no_false_repeat_from_colliding_keys(tmp_path: Path) -> None:
    # pool_row * 2^40 + slot is the same for (1, 2^40 + 5) and (2, 5)
    path = int64_table(tmp_path / "t.safetensors", {(1, 0): (1 << 40) + 5, (2, 0): 5})
    _, report = report_of(path)
    assert "duplicate-slot-in-row" not in codes(report)


def test_aliasing_of_a_huge_slot_is_found(tmp_path: Path) -> None:
    # (slot << 32) | position overflows for slot 2^33 + 1 and hid this aliasing
    slot = (1 << 33) + 1
    path = int64_table(tmp_path / "t.safetensors", {(1, 0): slot, (2, 1): slot})
    _, report = report_of(path)
    shared = [f for f in report["findings"] if f["code"] == "slot-shared-across-positions"]
    assert [f["slot"] for f in shared] == [slot]


def test_a_page_size_at_its_bound_is_not_a_page_of_tokens_built(tmp_path: Path) -> None:
    """`page_size` 2^31 - 1 (in range, absurd) on a dump whose diagnosis names a page freed in
    part: the headline reads the page's tokens the LUT has keys for, never 2^31 of them
    (16 GB and a minute before)."""
    path = make_scenario("stale-swa-mapping", seed=0).save(tmp_path / "stale.safetensors")
    code, peak = peak_rss_of_check(path, "--kernel", "none", "--set", "page_size=2147483647")
    assert code == 1
    assert peak < SMALL_DUMP_RSS, peak


# --- scalars: out of range in the dump is a finding, on the command line a usage error ------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("kv_token_id_vs_position_offset", str(10**22)),
        ("verify_capacity", str(10**30)),
        ("page_size", "0"),
        ("num_full_slots", str(-1)),
    ],
)
def test_recorded_scalar_out_of_range_is_a_finding(tmp_path: Path, key: str, value: str) -> None:
    path = with_changes(tmp_path, "s.safetensors", metadata={key: value})
    code, out, err = run("check", str(path), "--format", "json")  # Triton: was exit 3
    assert code == 1, err
    report = json.loads(out)["dumps"][0]
    scalar = [f for f in report["findings"] if f["code"] == "scalar-out-of-range"]
    assert [f["details"]["scalar"] for f in scalar] == [key]
    assert str(scalar[0]["details"]["value"]) == value
    assert report["diagnosis"][0]["cause"] == "scalar-metadata-corrupt"
    scalars = {s["name"]: s for s in report["scalars"]}
    assert scalars[key]["origin"] != "recorded"  # planned as if the dump did not record it


@pytest.mark.slow  # whole processes, measured in memory
def test_one_corrupt_dump_does_not_stop_the_others(tmp_path: Path) -> None:
    bad = with_changes(tmp_path, "bad.safetensors", metadata={"verify_capacity": str(10**30)})
    code, out, err = run("check", str(bad), CLEAN, "--format", "json", "--kernel", "vectorized")
    assert code == 1, err
    dumps = json.loads(out)["dumps"]
    assert [d["error"] for d in dumps] == [None, None]
    assert [bool(d["findings"]) for d in dumps] == [True, False]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["check", CLEAN, "--set", f"swa_window_size={1 << 63}"], "swa_window_size"),
        (["check", CLEAN, "--set", f"kv_token_id_vs_position_offset={10**22}"], "--set"),
        (["provenance", CLEAN, "--slot", str(1 << 63)], "--slot"),
        (["provenance", CLEAN, "--slot", str(-(1 << 63) - 1)], "--slot"),
        (["provenance", CLEAN, "--row", "3", "--positions", f"0:{10**20}"], "--positions"),
        (["plan", CLEAN, "--set", f"verify_capacity={1 << 31}"], "verify_capacity"),
        (["synth", "clean-swa", "--out", "x.safetensors", "--seed", "-1"], "--seed"),
        (["provenance", CLEAN, "--slot", "3", "--group", "bogus"], "--group"),
    ],
)
def test_out_of_range_options_are_usage_errors(args: list[str], option: str) -> None:
    code, _, err = run(*args)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and option in err


def test_api_overrides_are_range_checked_too() -> None:
    from kvcanary_cli import api
    from kvcanary_cli.errors import OptionError

    report = api.check(CLEAN, kernel="vectorized", overrides={"verify_capacity": 10**30})
    assert report.bad_input and "verify_capacity: " in str(report.dumps[0].error)
    with pytest.raises(OptionError, match="^verify_capacity: "):
        api.provenance(CLEAN, slot=3, overrides={"verify_capacity": 10**30})


@pytest.mark.parametrize(
    ("call", "option"),
    [
        (lambda api: api.provenance(CLEAN, slot=2**70), "slot"),  # was an OverflowError
        (lambda api: api.provenance(CLEAN, slot=-(2**64)), "slot"),
        (lambda api: api.provenance(CLEAN, slot=True), "slot"),
        (lambda api: api.provenance(CLEAN, row=3, positions=(0, 10**20)), "positions"),
        (lambda api: api.provenance(CLEAN, slot=3, max_cells=0), "max_cells"),
        (lambda api: api.violations([CLEAN], group="bogus"), "group"),
        (lambda api: api.violations([CLEAN], buffer="tail.q"), "buffer"),
        (lambda api: api.check(CLEAN, fail_on="fatal"), "fail_on"),  # was a ValueError
        (lambda api: api.check(CLEAN, kernel="cuda"), "kernel"),
        (lambda api: api.check(CLEAN, jobs=0), "jobs"),
        (lambda api: api.plan(CLEAN, backend="fast"), "backend"),
        (lambda api: api.synth("clean-swa", "never.safetensors", seed=-1), "seed"),
    ],
    ids=[
        "slot-2^70",
        "slot-minus-2^64",
        "slot-bool",
        "positions",
        "max-cells",
        "group",
        "buffer",
        "fail-on",
        "kernel",
        "jobs",
        "backend",
        "seed",
    ],
)
def test_the_api_checks_what_the_command_line_checks(call: Any, option: str) -> None:
    """The API names its own keyword (`max_cells`), the command line its flag."""
    from kvcanary_cli import api
    from kvcanary_cli.errors import OptionError

    with pytest.raises(OptionError) as caught:
        call(api)
    assert caught.value.option == option


def test_the_api_takes_one_path_as_one_source() -> None:
    # api.violations("path") read one source per character of the string.
    from kvcanary_cli import api

    one = api.violations(CLEAN)
    assert [s.path for s in one.sources] == [CLEAN]
    assert [s.path for s in api.violations(Path(CLEAN)).sources] == [CLEAN]


# --- a table with rows but no bytes -----------------------------------------------------------


def test_rows_without_bytes_are_not_scanned(tmp_path: Path) -> None:
    path = save_dump(  # [2^50, 0]: about 2^28 scan chunks, or a 2^53-byte array, before
        tmp_path / "empty.safetensors",
        req_to_token=np.zeros((1 << 50, 0), dtype=np.int32),
        req_pool_indices=np.array([1, 2]),
        prefix_lens=np.array([3, 0]),
        extend_seq_lens=np.zeros(2, dtype=np.int64),
    )
    code, report = report_of(path)
    assert code == 1 and codes(report) == {"prefix-beyond-row": 1}
    code, _, err = run("provenance", str(path), "--slot", "5")
    assert code == 0, err


# --- processes: never more than the machine holds ---------------------------------------------


def test_workers_are_capped_by_cores_dumps_and_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    cores = len(os.sched_getaffinity(0))
    assert worker_count(16, 16) <= cores
    assert worker_count(2, 16) <= 2
    monkeypatch.setattr(dump_pool, "_available_memory", lambda: 1 << 30)
    assert worker_count(16, 16) == 1  # 1 GiB holds one checking process
    monkeypatch.setattr(dump_pool, "_available_memory", lambda: None)
    assert worker_count(16, None) == min(16, cores)


@pytest.mark.slow  # whole processes, measured in memory
def test_rss_guard_measures_the_child_alone() -> None:
    # Linux hands a child the high-water mark of its parent at exec (ru_maxrss): a big pytest
    # process (the CUDA build of torch imported; here 512 MiB of ballast) is not the check's.
    ballast = np.ones(64 << 20)  # 512 MiB, every page touched
    code, peak = peak_rss_of_check(Path(CLEAN), "--kernel", "vectorized")
    assert code == 0
    assert peak < SMALL_DUMP_RSS
    assert peak > 10 << 20  # KiB read as such: an interpreter with numpy is bigger
    del ballast
