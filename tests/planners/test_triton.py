"""TritonPlanner: hand-computed golden plans, then differential tests against the vectorized
GPU planner (VectorizedPlanner with GPU semantics).

Without CUDA the kernels run in the triton interpreter; on a CUDA machine the same tests
exercise the compiled kernels (bench/gpu_check.sh runs them there).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")

from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.dump.writer import save_dump
from kvcanary_cli.errors import PlannerUnavailableError
from kvcanary_cli.planners import PlannerChoice, make_kernel, triton_runtime
from kvcanary_cli.planners.base import (
    Plan,
    ProblemKind,
    ProblemRole,
    ProblemTable,
    Semantics,
    Undefined,
)
from kvcanary_cli.planners.frame import GPU_MAX_BS
from kvcanary_cli.planners.reference import ReferencePlanner
from kvcanary_cli.planners.triton_planner import TritonPlanner, bs_block
from kvcanary_cli.planners.vectorized import VectorizedPlanner
from kvcanary_cli.synth.state import SynthSpec, build_dump

TRITON = TritonPlanner()
VECTORIZED_GPU = VectorizedPlanner(semantics=Semantics.GPU)
S, P, T = int(Undefined.SLOT), int(Undefined.PREV), int(Undefined.TOKEN)
LUT_OOR, ROW_OOR = ProblemKind.LUT_OUT_OF_RANGE, ProblemKind.ROW_OUT_OF_RANGE
BEYOND, TOKEN_OOR = ProblemKind.PREFIX_BEYOND_ROW, ProblemKind.EXPECTED_TOKEN_OUT_OF_RANGE
VERIFY, PREV, SEED = ProblemRole.VERIFY, ProblemRole.CHAIN_PREV, ProblemRole.SEED
EXPECTED = ProblemRole.EXPECTED_TOKEN


def _write(path: Path, metadata: dict[str, object] | None = None, **tensors: Any) -> KvDump:
    save_dump(path, metadata=metadata, **tensors)
    return load_dump(path)


def _i64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _problems(plan: Plan) -> list[tuple[int, ...]]:
    """(kind, role, batch_row, pool_row, position, value, entry) per problem, canonical order."""
    return [
        (p.kind, p.role, p.batch_row, p.pool_row, p.position, p.value, p.entry)
        for p in plan.problems.rows()
    ]


def assert_same_values(got: object, want: object, name: str) -> None:
    """Equality of plan values: tensors in dtype and values, dataclasses field by field."""
    if isinstance(got, np.ndarray) and isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert np.array_equal(got, want), f"{name}: {got.tolist()} != {want.tolist()}"
    elif isinstance(got, ProblemTable) and isinstance(want, ProblemTable):
        assert got.same_as(want), f"{name}: {got.rows()} != {want.rows()}"
    elif dataclasses.is_dataclass(got) and not isinstance(got, type):
        for f in dataclasses.fields(got):
            assert_same_values(getattr(got, f.name), getattr(want, f.name), f"{name}.{f.name}")
    else:
        assert got == want, f"{name}: {got!r} != {want!r}"


def assert_same_plan(got: Plan, want: Plan) -> None:
    """Field-by-field equality (the frame's too), the backend name excepted."""
    for f in dataclasses.fields(Plan):
        if f.name != "backend":
            assert_same_values(getattr(got, f.name), getattr(want, f.name), f.name)


def _check(dump: KvDump, group: str) -> Plan:
    plan = TRITON.plan(dump, group)
    assert_same_plan(plan, VECTORIZED_GPU.plan(dump, group))
    return plan


# --- golden cases, computed by hand from docs/semantics.md §1.2 / §1.6 -----------------


@pytest.fixture
def lut_dump(tmp_path: Path) -> KvDump:
    # LUT length 5: raw 7 and 9 are >= lut_len and clamp to LUT[4] = -1.
    return _write(
        tmp_path / "lut.safetensors",
        metadata={"swa_window_size": 8},
        req_to_token=np.array([[0, 0, 0, 0], [1, 7, -3, 9]], dtype=np.int32),
        req_pool_indices=_i64([1, 0]),
        prefix_lens=_i64([4, 2]),
        extend_seq_lens=_i64([1, 1]),
        full_to_swa_index_mapping=_i64([0, 11, 12, 13, -1]),
    )


def test_lut_clamp_and_negative_passthrough(lut_dump: KvDump) -> None:
    plan = _check(lut_dump, "swa")
    assert plan.verify_offsets.tolist() == [0, 4, 4]
    assert (plan.total_verify, plan.verify_num_valid, plan.enable) == (4, 4, 1)
    assert plan.verify_slot_indices.tolist() == [11, -1, -3, -1]
    assert plan.verify_prev_slot_indices.tolist() == [-1, 11, -1, -3]
    assert plan.verify_expected_positions.tolist() == [0, 1, 2, 3]
    assert plan.verify_expected_tokens.tolist() == [-1, -1, -1, -1]
    assert plan.verify_undefined.tolist() == [0, 0, 0, 0]
    assert plan.write_offsets.tolist() == [0, 1, 1]
    assert plan.write_seed_slot_indices.tolist() == [-1, -1]  # row 0 clamped, row 1 padding
    assert plan.seed_undefined.tolist() == [False, False]
    assert _problems(plan) == [
        (LUT_OOR, VERIFY, 0, 1, 1, 7, 1),
        (LUT_OOR, PREV, 0, 1, 1, 7, 2),
        (LUT_OOR, VERIFY, 0, 1, 3, 9, 3),
        (LUT_OOR, SEED, 0, 1, 3, 9, -1),
    ]
    assert not plan.problems.raises.any()


def test_full_group_is_untranslated(lut_dump: KvDump) -> None:
    plan = _check(lut_dump, "full")
    assert plan.verify_slot_indices.tolist() == [1, 7, -3, 9]
    assert plan.verify_prev_slot_indices.tolist() == [-1, 1, 7, -3]
    assert plan.write_seed_slot_indices.tolist() == [9, -1]
    assert len(plan.problems) == 0


def test_overflow_writes_no_entries(tmp_path: Path, lut_dump: KvDump) -> None:
    lut = lut_dump.full_to_swa_index_mapping
    assert lut is not None
    tensors = {
        "req_to_token": lut_dump.req_to_token.array(),
        "req_pool_indices": lut_dump.req_pool_indices,
        "prefix_lens": lut_dump.prefix_lens,
        "extend_seq_lens": lut_dump.extend_seq_lens,
        "full_to_swa_index_mapping": lut.array(),
    }
    dump = _write(
        tmp_path / "o.safetensors", {"swa_window_size": 8, "verify_capacity": 3}, **tensors
    )
    plan = _check(dump, "swa")
    assert (plan.total_verify, plan.verify_num_valid, plan.enable) == (4, 3, 0)
    assert plan.entries == 0 and plan.verify_undefined.dtype == np.uint8
    assert plan.verify_offsets.tolist() == [0, 4, 4]
    assert plan.write_offsets.tolist() == [0, 1, 1]
    # Seeds are still planned (and clamped); entry reads never happen.
    assert _problems(plan) == [(LUT_OOR, SEED, 0, 1, 3, 9, -1)]
    exact = _write(
        tmp_path / "e.safetensors", {"swa_window_size": 8, "verify_capacity": 4}, **tensors
    )
    assert _check(exact, "swa").enable == 1  # equality is not overflow


def test_rows_outside_the_table_are_masked(tmp_path: Path) -> None:
    dump = _write(
        tmp_path / "oob.safetensors",
        req_to_token=np.array([[10, 11, 12, 13], [14, 15, 16, 17]], dtype=np.int64),
        req_pool_indices=_i64([5, -1, 1]),
        prefix_lens=_i64([2, 6, 0]),
        extend_seq_lens=_i64([1, 1, 1]),
    )
    plan = _check(dump, "full")
    assert plan.verify_offsets.tolist() == [0, 2, 8, 8]
    # Row 0 (pool row 5): flat 20, 21 lie past the table. Row 1 (pool row -1): flat -4..1,
    # so positions 4 and 5 read row 0 of the table, like the CUDA kernel.
    assert plan.verify_slot_indices.tolist() == [0, 0, 0, 0, 0, 0, 10, 11]
    assert plan.verify_prev_slot_indices.tolist() == [-1, 0, -1, 0, 0, 0, 0, 10]
    assert plan.verify_undefined.tolist() == [S, S | P, S, S | P, S | P, S | P, P, 0]
    assert plan.write_seed_slot_indices.tolist() == [0, 11, -1]
    assert plan.seed_undefined.tolist() == [True, False, False]
    assert _problems(plan) == [(ROW_OOR, VERIFY, 0, 5, 0, 5, 0), (ROW_OOR, VERIFY, 1, -1, 0, -1, 2)]


def test_prefix_beyond_row_reads_the_next_rows(tmp_path: Path) -> None:
    table = np.array([[0, 0, 0, 0], [1, 2, 3, 4], [5, 6, 7, 8]], dtype=np.int32)
    dump = _write(
        tmp_path / "p.safetensors",
        {"swa_window_size": 3},
        req_to_token=table,
        req_pool_indices=_i64([1, 2]),
        prefix_lens=_i64([6, 6]),
        extend_seq_lens=_i64([0, 2]),
        full_to_swa_index_mapping=np.arange(10),
    )
    full = _check(dump, "full")
    assert full.verify_slot_indices.tolist() == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8, 0, 0]
    assert full.verify_undefined.tolist() == [0] * 10 + [S, S | P]
    assert full.write_seed_slot_indices.tolist() == [-1, 0]  # E=0: -1; flat 13: undefined
    assert full.seed_undefined.tolist() == [False, True]
    assert _problems(full) == [(BEYOND, VERIFY, 0, 1, 4, 4, 4), (BEYOND, VERIFY, 1, 2, 4, 4, 10)]
    swa = _check(dump, "swa")  # window 3: positions 3..5
    assert swa.verify_slot_indices.tolist() == [4, 5, 6, 8, 0, 0]
    assert swa.verify_prev_slot_indices.tolist() == [3, 4, 5, 7, 8, 0]
    assert _problems(swa) == [(BEYOND, VERIFY, 0, 1, 4, 4, 1), (BEYOND, VERIFY, 1, 2, 4, 4, 4)]


@pytest.mark.parametrize(
    ("offset", "tokens"),
    [(0, [104, 105, 106, 107]), (1, [105, 106, 107, -1]), (-1, [-1, 104, 105, 106])],
)
def test_expected_tokens(tmp_path: Path, offset: int, tokens: list[int]) -> None:
    # P + offset and valid_len both reach the pool's last column exactly: no problem.
    pool = np.arange(100, 112, dtype=np.int32).reshape(3, 4)
    dump = _write(
        tmp_path / "t.safetensors",
        {"kv_token_id_vs_position_offset": offset},
        req_to_token=np.zeros((3, 4), dtype=np.int32),
        req_pool_indices=_i64([0, 1]),
        prefix_lens=_i64([3, 4]),
        extend_seq_lens=_i64([1, 1]),
        req_to_verify_expected_tokens=pool,
        req_to_verify_expected_tokens_valid_lens=_i64([5, 4]),
    )
    plan = _check(dump, "full")
    assert plan.verify_expected_tokens.tolist() == tokens
    assert len(plan.problems) == 0


def test_expected_token_pool_out_of_range(tmp_path: Path) -> None:
    pool = np.array([[0, 1, 2], [10, 11, 12], [20, 21, 22]], dtype=np.int32)
    dump = _write(
        tmp_path / "t.safetensors",
        req_to_token=np.zeros((5, 4), dtype=np.int32),
        req_pool_indices=_i64([1, 2, 4]),
        prefix_lens=_i64([4, 4, 2]),
        extend_seq_lens=_i64([0, 0, 0]),
        req_to_verify_expected_tokens=pool,
        req_to_verify_expected_tokens_valid_lens=_i64([5, 5, 5]),
    )
    plan = _check(dump, "full")
    # s = 3 >= cols: row 1 reads the next pool row (20), row 2 reads past the pool; pool
    # row 4 does not exist at all.
    assert plan.verify_expected_tokens.tolist() == [10, 11, 12, 20, 20, 21, 22, 0, 0, 0]
    assert plan.verify_undefined.tolist() == [0, 0, 0, 0, 0, 0, 0, T, T, T]
    assert _problems(plan) == [
        (TOKEN_OOR, EXPECTED, 0, 1, 3, 3, 3),
        (TOKEN_OOR, EXPECTED, 1, 2, 3, 3, 7),
        (TOKEN_OOR, EXPECTED, 2, 4, 0, 4, 8),
    ]


def test_padding_rows_and_empty_lengths(tmp_path: Path) -> None:
    dump = _write(
        tmp_path / "pad.safetensors",
        req_to_token=np.arange(12, dtype=np.int32).reshape(3, 4),
        req_pool_indices=_i64([0, 1, 2, 2, 0, 1]),
        prefix_lens=_i64([3, 0, 2, -1, 0, 2]),
        extend_seq_lens=_i64([2, 3, 0, 4, 1, -2]),
    )
    plan = _check(dump, "full")
    assert plan.verify_offsets.tolist() == [0, 0, 0, 2, 2, 2, 4]
    assert plan.verify_slot_indices.tolist() == [8, 9, 4, 5]
    assert plan.write_offsets.tolist() == [0, 0, 3, 3, 7, 7, 7]
    assert plan.write_seed_slot_indices.tolist() == [-1, -1, -1, -1, -1, -1]
    assert plan.write_num_valid_reqs == 6


def test_empty_batch(tmp_path: Path) -> None:
    dump = _write(
        tmp_path / "empty.safetensors",
        req_to_token=np.zeros((2, 3), dtype=np.int32),
        req_pool_indices=_i64([]),
        prefix_lens=_i64([]),
    )
    plan = _check(dump, "full")
    assert plan.verify_offsets.tolist() == [0] and plan.write_offsets.tolist() == [0]
    assert (plan.bs, plan.total_verify, plan.verify_num_valid, plan.enable) == (0, 0, 0, 1)
    assert plan.entries == 0 and plan.write_seed_slot_indices.size == 0


def test_empty_table(tmp_path: Path) -> None:
    dump = _write(
        tmp_path / "z.safetensors",
        req_to_token=np.zeros((2, 0), dtype=np.int32),
        req_pool_indices=_i64([1]),
        prefix_lens=_i64([2]),
        extend_seq_lens=_i64([1]),
    )
    plan = _check(dump, "full")
    assert plan.verify_undefined.tolist() == [S, S | P] and plan.seed_undefined.tolist() == [True]


@pytest.mark.parametrize(("bs", "capacity"), [(3, 2), (GPU_MAX_BS + 1, GPU_MAX_BS + 1)])
def test_launch_errors(tmp_path: Path, bs: int, capacity: int) -> None:
    dump = _write(
        tmp_path / "big.safetensors",
        {"write_req_capacity": capacity},
        req_to_token=np.zeros((2, 3), dtype=np.int32),
        req_pool_indices=np.ones(bs, dtype=np.int64),
        prefix_lens=np.full((bs,), 2, dtype=np.int64),
    )
    plan = _check(dump, "full")
    assert plan.launch_error is not None and plan.entries == 0
    assert plan.write_offsets.size == 0 and plan.verify_offsets.tolist() == [0] * (bs + 1)


def test_binary_search_over_many_rows(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    bs = 300  # 512 lanes: nine halving steps
    lens = rng.integers(-2, 6, bs) * (rng.random(bs) < 0.6)  # many zero-length rows
    rpi = rng.integers(0, 9, bs)
    dump = _write(
        tmp_path / "rows.safetensors",
        req_to_token=rng.integers(-5, 99, (9, 8), dtype=np.int32),
        req_pool_indices=rpi,
        prefix_lens=lens,
    )
    plan = _check(dump, "full")
    rows = plan.entry_batch_rows()
    start = plan.verify_offsets[rows]
    assert np.array_equal(plan.verify_expected_positions, np.arange(plan.entries) - start)
    # Prefix sums through the kernel's own combine function (no triton standard library).
    own_scan = TritonPlanner(std_scan=False)
    assert_same_plan(own_scan.plan(dump, "full"), plan)


def test_chunked_launches_match(tmp_path: Path) -> None:
    spec = SynthSpec(max_reqs=20, max_seq_len=200, active_rows=12, history=30, spare_slots=64)
    dump = load_dump(build_dump(spec, seed=3).save(tmp_path / "big.safetensors"))
    one = TRITON.plan(dump, "full")
    assert one.entries > 4 * 256
    chunked = TritonPlanner(block_size=256, entries_per_launch=1).plan(dump, "full")
    assert chunked.entries % 256 != 0  # the last program of the last launch is partial
    assert_same_plan(chunked, one)
    assert_same_plan(one, VECTORIZED_GPU.plan(dump, "full"))


def test_bs_block() -> None:
    assert [bs_block(n) for n in (0, 14, 15, 16, 4095, 4096)] == [16, 16, 16, 32, 4096, 8192]


def test_registry_and_mode() -> None:
    planner = make_kernel(PlannerChoice.TRITON)
    assert planner is not None
    assert planner.name == "triton" and planner.semantics is Semantics.GPU
    expected = "compiled" if triton_runtime.cuda_available() else "interpreter"
    assert TRITON.mode == triton_runtime.mode() == expected


def test_missing_triton_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def fake(name: str, *args: Any) -> Any:
        if name.startswith("triton"):
            raise ImportError("No module named 'triton'")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(PlannerUnavailableError, match="pip install triton"):
        triton_runtime.load_triton()


@pytest.mark.skipif(triton_runtime.cuda_available(), reason="needs a machine without CUDA")
def test_compiled_mode_without_cuda_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(PlannerUnavailableError, match="TRITON_INTERPRET"):
        triton_runtime.load_triton()


@pytest.mark.slow
@pytest.mark.skipif(triton_runtime.cuda_available(), reason="needs a machine without CUDA")
def test_interpreter_is_chosen_even_if_triton_was_imported_first(tmp_path: Path) -> None:
    script = (
        "import triton\n"
        "import numpy as np\n"
        "from kvcanary_cli.dump.writer import save_dump\n"
        "from kvcanary_cli.dump.loader import load_dump\n"
        "from kvcanary_cli.planners.triton_planner import TritonPlanner\n"
        f"p = save_dump({str(tmp_path / 'd.safetensors')!r}, req_to_token=np.arange(8, "
        "dtype=np.int32).reshape(2, 4), req_pool_indices=[1], prefix_lens=[3])\n"
        "plan = TritonPlanner().plan(load_dump(p), 'full')\n"
        "print(TritonPlanner().mode, plan.verify_slot_indices.tolist())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["interpreter", "[4,", "5,", "6]"]


@pytest.mark.gpu
@pytest.mark.skipif(not triton_runtime.cuda_available(), reason="needs a CUDA device")
def test_compiled_kernels_on_cuda(tmp_path: Path) -> None:
    assert TRITON.mode == "compiled" and triton_runtime.cuda_available()
    spec = SynthSpec(
        max_reqs=200,
        max_seq_len=2048,
        active_rows=150,
        history=300,
        window=128,
        expected_pool=True,
        spare_slots=256,
    )
    dump = load_dump(build_dump(spec, seed=11).save(tmp_path / "gpu.safetensors"))
    for group in dump.groups:
        _check(dump, group)


# --- differential: random dumps, valid or not --------------------------------------------


@st.composite
def raw_dumps(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, object], str]:
    """Small tensors with every corruption the GPU path meets: rows out of range, prefix past
    the row, slots >= lut_len or negative, short pools, overflow, duplicates, bs = 0."""
    ints = st.integers
    max_reqs, msl = draw(ints(1, 5)), draw(ints(0, 6))
    bs = draw(ints(0, 6))
    slot_hi = draw(ints(1, 12))
    table_dtype = draw(st.sampled_from([np.int32, np.int64]))
    table = np.array(
        draw(st.lists(ints(-3, slot_hi), min_size=max_reqs * msl, max_size=max_reqs * msl)),
        dtype=table_dtype,
    )
    in_range = ints(0, max_reqs - 1)
    row = in_range | in_range | ints(-2, max_reqs + 1) | st.sampled_from([2**40, -(2**40)])
    tensors: dict[str, Any] = {
        "req_to_token": table.reshape(max_reqs, msl),
        "req_pool_indices": np.array(draw(st.lists(row, min_size=bs, max_size=bs)), np.int64),
        "prefix_lens": np.array(
            draw(st.lists(ints(-2, msl + 4), min_size=bs, max_size=bs)), np.int64
        ),
        "extend_seq_lens": np.array(
            draw(st.lists(ints(-1, 3), min_size=bs, max_size=bs)), np.int64
        ),
    }
    metadata: dict[str, object] = {}
    group = "full"
    if draw(ints(0, 2)):
        lut_len = draw(ints(1, slot_hi // 2 + 1) | ints(1, slot_hi + 3))
        lut = draw(st.lists(ints(-2, 20), min_size=lut_len, max_size=lut_len))
        tensors["full_to_swa_index_mapping"] = np.array(lut, np.int64)
        metadata["swa_window_size"] = draw(ints(-1, 5))
        group = draw(st.sampled_from(["full", "swa", "swa", "swa"]))
    if draw(ints(0, 2)):
        rows, cols = draw(ints(1, 5)), draw(ints(1, 7) | st.just(max(msl, 1)))
        pool_dtype = draw(st.sampled_from([np.int32, np.int64]))
        tensors["req_to_verify_expected_tokens"] = np.array(
            draw(st.lists(ints(-5, 50), min_size=rows * cols, max_size=rows * cols)), pool_dtype
        ).reshape(rows, cols)
        tensors["req_to_verify_expected_tokens_valid_lens"] = np.array(
            draw(
                st.lists(
                    ints(-1, 9) | st.sampled_from([cols - 1, cols, cols + 1]),
                    min_size=bs,
                    max_size=bs,
                )
            ),
            np.int64,
        )
        metadata["kv_token_id_vs_position_offset"] = draw(st.sampled_from([0, 1, -1]))
    if not draw(ints(0, 2)):
        metadata["verify_capacity"] = draw(ints(0, 25))
    if draw(st.booleans()):
        metadata["write_req_capacity"] = max(0, bs + draw(ints(-1, 1)))
    return tensors, metadata, group


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw_dumps())
def test_matches_vectorized_gpu_on_random_dumps(
    case: tuple[dict[str, Any], dict[str, object], str],
) -> None:
    tensors, metadata, group = case
    with tempfile.TemporaryDirectory() as tmp:
        dump = _write(Path(tmp) / "r.safetensors", metadata, **tensors)
        _check(dump, group)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw_dumps(), st.sampled_from([16, 32, 64]))
@pytest.mark.slow
def test_small_blocks_spanning_rows_match_vectorized_gpu(
    case: tuple[dict[str, Any], dict[str, object], str], block: int
) -> None:
    """Programs of a few entries start and end inside rows, span zero-length and padding rows,
    or sit inside one row: each finds its entries' rows between those of its first and last
    entry, and the plan is the one of one wide block and of the vectorized GPU planner."""
    tensors, metadata, group = case
    with tempfile.TemporaryDirectory() as tmp:
        dump = _write(Path(tmp) / "r.safetensors", metadata, **tensors)
        narrow = TritonPlanner(block_size=block).plan(dump, group)
        assert_same_plan(narrow, VECTORIZED_GPU.plan(dump, group))


@st.composite
def synth_dumps(draw: st.DrawFn) -> tuple[SynthSpec, int, dict[str, int]]:
    spec = SynthSpec(
        max_reqs=draw(st.integers(3, 10)),
        max_seq_len=draw(st.integers(8, 40)),
        page_size=draw(st.sampled_from([1, 1, 4])),
        active_rows=draw(st.integers(0, 2)),
        padding_rows=draw(st.integers(0, 2)),
        history=draw(st.integers(0, 6)),
        mode=draw(st.sampled_from(["decode", "extend", "mixed"])),
        window=draw(st.sampled_from([0, 3, 16])),
        expected_pool=draw(st.booleans()),
        token_offset=draw(st.sampled_from([0, 1])),
        free_lists=False,
        write_tensors=False,
        verify_capacity=draw(st.none() | st.integers(0, 60)),
    )
    corrupt = draw(st.sampled_from(["none", "row", "prefix", "slot", "lut", "dup"]))
    return spec, draw(st.integers(0, 2**16)), {corrupt: draw(st.integers(0, 1000))}


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(synth_dumps())
def test_matches_vectorized_gpu_on_synthetic_states(
    case: tuple[SynthSpec, int, dict[str, int]],
) -> None:
    spec, seed, corruption = case
    state = build_dump(spec, seed)
    t = state.tensors
    ((kind, k),) = corruption.items()
    bs = int(t["req_pool_indices"].shape[0])
    if bs and kind == "row":
        t["req_pool_indices"][k % bs] = (-1, spec.max_reqs, spec.max_reqs + 3)[k % 3]
    elif bs and kind == "prefix":
        t["prefix_lens"][k % bs] += spec.max_seq_len
    elif kind == "slot":
        flat = t["req_to_token"].reshape(-1)
        flat[k % flat.size] = (-7, 10**6)[k % 2]
    elif kind == "lut" and "full_to_swa_index_mapping" in t:
        lut = t["full_to_swa_index_mapping"]
        t["full_to_swa_index_mapping"] = lut[: max(1, lut.size // 2)].copy()
    elif bs and kind == "dup":
        t["req_pool_indices"][k % bs] = t["req_pool_indices"][(k + 1) % bs]
    with tempfile.TemporaryDirectory() as tmp:
        dump = load_dump(state.save(Path(tmp) / "s.safetensors"))
        for group in dump.groups:
            plan = _check(dump, group)
            if kind == "none" and plan.enable:
                ref = ReferencePlanner().plan(dump, group)
                for name, value in plan.upstream_tensors().items():
                    assert np.array_equal(value, ref.upstream_tensors()[name]), name
