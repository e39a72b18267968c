"""Hand-computed plans of tiny dumps, one per sentinel rule of docs/semantics.md §1.

Every expected tensor below was worked out by hand from §1.2 (valid input) and §1.6 (where
REF and the GPU path part ways), not produced by a planner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.dump.writer import save_dump
from kvcanary_cli.errors import UpstreamPlanError
from kvcanary_cli.planners.base import (
    Plan,
    Planner,
    PlanProblem,
    ProblemKind,
    ProblemRole,
    Semantics,
    Undefined,
)
from tests.helpers import PLANNERS, REFERENCE, STRICT
from tests.planners.plan_helpers import triton_planner

ALL = ("reference", "vectorized", "vectorized-gpu", "triton")
REF = ("reference", "vectorized")
GPU = ("vectorized-gpu", "triton")
SLOT, PREV = int(Undefined.SLOT), int(Undefined.PREV)
LUT_RANGE = ProblemKind.LUT_OUT_OF_RANGE
VERIFY, CHAIN_PREV, SEED = ProblemRole.VERIFY, ProblemRole.CHAIN_PREV, ProblemRole.SEED


def planner_named(name: str) -> Planner:
    if name == "triton":
        planner = triton_planner()
        if planner is None:
            pytest.skip("kvcanary_cli.planners.triton_planner or triton is not installed")
        return planner
    return PLANNERS[name]


def make(
    path: Path,
    *,
    table: list[list[int]],
    rpi: list[int],
    prefix: list[int],
    extend: list[int],
    lut: list[int] | None = None,
    window: int | None = None,
    pool: list[list[int]] | None = None,
    valid: list[int] | None = None,
    **scalars: Any,
) -> KvDump:
    """Save a dump from literal lists (canonical dtypes) and load it back."""
    tensors: dict[str, Any] = {
        "req_to_token": np.array(table, dtype=np.int32),
        "req_pool_indices": np.array(rpi, dtype=np.int64),
        "prefix_lens": np.array(prefix, dtype=np.int64),
        "extend_seq_lens": np.array(extend, dtype=np.int64),
    }
    metadata = {k: str(v) for k, v in scalars.items()}
    if lut is not None:
        tensors["full_to_swa_index_mapping"] = np.array(lut, dtype=np.int64)
        metadata["swa_window_size"] = str(window if window is not None else 0)
    if pool is not None:
        tensors["req_to_verify_expected_tokens"] = np.array(pool, dtype=np.int32)
        tensors["req_to_verify_expected_tokens_valid_lens"] = np.array(valid, dtype=np.int64)
    save_dump(path, metadata=metadata, **tensors)
    return load_dump(path)


def check(plan: Plan, **expected: Any) -> None:
    """Exact equality of the named plan fields (tensors compared as lists)."""
    for name, want in expected.items():
        got = getattr(plan, name)
        if isinstance(got, np.ndarray):
            got = got.tolist()
        assert got == want, f"{plan.backend} {plan.group}: {name} = {got}, expected {want}"


def check_clean(plan: Plan) -> None:
    assert plan.launch_error is None
    assert len(plan.problems) == 0, plan.problems.rows()
    assert plan.verify_undefined.tolist() == [0] * plan.entries
    assert not bool(plan.seed_undefined.any())


def problem(
    kind: ProblemKind,
    role: ProblemRole,
    batch_row: int,
    pool_row: int,
    position: int,
    value: int,
    entry: int,
    raises: bool,
) -> PlanProblem:
    return PlanProblem(
        kind=kind,
        role=role,
        batch_row=batch_row,
        pool_row=pool_row,
        position=position,
        value=value,
        entry=entry,
        raises=raises,
    )


# --- valid input: every backend gives the same plan ------------------------------------------


def four_rows(tmp_path: Path, **scalars: Any) -> KvDump:
    """Rows: P = 0 (seed -1), E = 0 (seed -1), padding (nothing), and a plain row."""
    return make(
        tmp_path / "four.safetensors",
        table=[[0, 0, 0, 0, 0], [11, 12, 13, 14, 15], [21, 22, 23, 24, 25]],
        rpi=[1, 2, 0, 1],
        prefix=[0, 3, 3, 2],
        extend=[2, 0, 2, 1],
        **scalars,
    )


FOUR_ROWS_WRITE = {
    "write_offsets": [0, 2, 2, 2, 3],
    "write_seed_slot_indices": [-1, -1, -1, 12],
    "write_num_valid_reqs": 4,
}


@pytest.mark.parametrize("backend", ALL)
def test_prev_minus_one_at_position_zero_and_seed_rules(tmp_path: Path, backend: str) -> None:
    plan = planner_named(backend).plan(four_rows(tmp_path), "full")
    check_clean(plan)
    check(
        plan,
        total_verify=5,
        verify_num_valid=5,
        enable=1,
        verify_offsets=[0, 0, 3, 3, 5],
        verify_slot_indices=[21, 22, 23, 11, 12],
        verify_expected_positions=[0, 1, 2, 0, 1],
        # chain heads (position 0) of rows 1 and 3 are -1
        verify_prev_slot_indices=[-1, 21, 22, -1, 11],
        verify_expected_tokens=[-1, -1, -1, -1, -1],
        **FOUR_ROWS_WRITE,
    )


@pytest.mark.parametrize("backend", ALL)
def test_negative_lengths_plan_nothing(tmp_path: Path, backend: str) -> None:
    dump = make(
        tmp_path / "neg.safetensors",
        table=[[0, 0, 0], [11, 12, 13]],
        rpi=[1, 1, 1],
        prefix=[-2, 2, 3],
        extend=[3, -1, 0],
    )
    plan = planner_named(backend).plan(dump, "full")
    check_clean(plan)
    check(
        plan,
        verify_offsets=[0, 0, 2, 5],
        verify_slot_indices=[11, 12, 11, 12, 13],
        verify_prev_slot_indices=[-1, 11, -1, 11, 12],
        write_offsets=[0, 3, 3, 3],
        write_seed_slot_indices=[-1, -1, -1],
    )


def token_dump(tmp_path: Path, offset: int) -> KvDump:
    return make(
        tmp_path / f"tokens{offset}.safetensors",
        table=[[0, 0, 0, 0, 0], [11, 12, 13, 14, 15]],
        rpi=[1, 1, 0, 1],
        prefix=[4, 4, 2, 2],
        extend=[1, 1, 1, 0],
        pool=[[0] * 6, [100, 101, 102, 103, 104, 105]],
        valid=[2, 4, 6, -1],
        kv_token_id_vs_position_offset=offset,
    )


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize(
    ("offset", "tokens"),
    [
        # s = pos: row 0 valid for s < 2, row 1 for s < 4, row 3 (valid_lens -1) never
        (0, [100, 101, -1, -1, 100, 101, 102, 103, -1, -1]),
        # s = pos + 1: the last position of row 1 reaches s = 4 = valid_lens -> -1
        (1, [101, -1, -1, -1, 101, 102, 103, -1, -1, -1]),
    ],
)
def test_expected_token_minus_one_outside_valid_lens(
    tmp_path: Path, backend: str, offset: int, tokens: list[int]
) -> None:
    plan = planner_named(backend).plan(token_dump(tmp_path, offset), "full")
    check_clean(plan)
    check(
        plan,
        verify_expected_tokens=tokens,
        verify_expected_positions=[0, 1, 2, 3, 0, 1, 2, 3, 0, 1],
    )


@pytest.mark.parametrize("backend", ALL)
def test_expected_tokens_are_sign_extended_int32(tmp_path: Path, backend: str) -> None:
    dump = make(
        tmp_path / "sign.safetensors",
        table=[[0, 0, 0], [11, 12, 13]],
        rpi=[1],
        prefix=[3],
        extend=[0],
        pool=[[0, 0, 0], [-2, 2**31 - 1, -(2**31)]],
        valid=[3],
    )
    plan = planner_named(backend).plan(dump, "full")
    check(plan, verify_expected_tokens=[-2, 2**31 - 1, -(2**31)])


def swa_dump(tmp_path: Path, window: int) -> KvDump:
    lut = [0] * 21
    for x in range(10, 18):
        lut[x] = 100 + x
    lut[20] = -1  # num_full_slots = 20, production layout
    return make(
        tmp_path / f"swa{window}.safetensors",
        table=[[0] * 8, [10, 11, 12, 13, 14, 15, 16, 17]],
        rpi=[1, 1, 1],
        prefix=[7, 2, 0],
        extend=[1, 1, 1],
        lut=lut,
        window=window,
    )


@pytest.mark.parametrize("backend", ALL)
def test_swa_window_start(tmp_path: Path, backend: str) -> None:
    plan = planner_named(backend).plan(swa_dump(tmp_path, 3), "swa")
    check_clean(plan)
    check(
        plan,
        window=3,
        translated=True,
        total_verify=5,
        verify_offsets=[0, 3, 5, 5],
        # row 0: W = 3, P = 7 -> positions 4..6; row 1: P = 2 < W -> positions 0..1
        verify_expected_positions=[4, 5, 6, 0, 1],
        verify_slot_indices=[114, 115, 116, 110, 111],
        # the window does not reset the chain: prev at 4 is position 3, outside the window
        verify_prev_slot_indices=[113, 114, 115, -1, 110],
        write_offsets=[0, 1, 2, 3],
        write_seed_slot_indices=[116, 111, -1],
    )


@pytest.mark.parametrize("backend", ALL)
def test_full_group_of_an_swa_dump_is_untranslated(tmp_path: Path, backend: str) -> None:
    plan = planner_named(backend).plan(swa_dump(tmp_path, 3), "full")
    check_clean(plan)
    check(
        plan,
        window=0,
        translated=False,
        verify_offsets=[0, 7, 9, 9],
        verify_expected_positions=[0, 1, 2, 3, 4, 5, 6, 0, 1],
        verify_slot_indices=[10, 11, 12, 13, 14, 15, 16, 10, 11],
        verify_prev_slot_indices=[-1, 10, 11, 12, 13, 14, 15, -1, 10],
        write_seed_slot_indices=[16, 11, -1],
    )


@pytest.mark.parametrize("backend", ALL)
def test_lut_with_window_zero_translates_without_a_window(tmp_path: Path, backend: str) -> None:
    plan = planner_named(backend).plan(swa_dump(tmp_path, 0), "swa")
    check_clean(plan)
    check(
        plan,
        window=0,
        translated=True,
        verify_offsets=[0, 7, 9, 9],
        verify_slot_indices=[110, 111, 112, 113, 114, 115, 116, 110, 111],
        verify_prev_slot_indices=[-1, 110, 111, 112, 113, 114, 115, -1, 110],
        write_seed_slot_indices=[116, 111, -1],
    )


@pytest.mark.parametrize("backend", ALL)
def test_capacity_overflow(tmp_path: Path, backend: str) -> None:
    plan = planner_named(backend).plan(four_rows(tmp_path, verify_capacity=4), "full")
    check(
        plan,
        verify_capacity=4,
        total_verify=5,
        verify_num_valid=4,
        enable=0,
        verify_slot_indices=[],
        verify_prev_slot_indices=[],
        verify_expected_tokens=[],
        verify_expected_positions=[],
        **FOUR_ROWS_WRITE,
    )  # writes still happen
    upstream = plan.upstream_tensors()
    assert upstream["verify_slot_indices"].size == 0
    assert upstream["enable"].tolist() == [0] and upstream["verify_num_valid"].tolist() == [4]


@pytest.mark.parametrize("backend", ALL)
def test_capacity_equal_to_total_is_not_overflow(tmp_path: Path, backend: str) -> None:
    plan = planner_named(backend).plan(four_rows(tmp_path, verify_capacity=5), "full")
    check_clean(plan)
    check(
        plan,
        verify_capacity=5,
        verify_num_valid=5,
        enable=1,
        verify_slot_indices=[21, 22, 23, 11, 12],
        **FOUR_ROWS_WRITE,
    )


@pytest.mark.parametrize("backend", ALL)
def test_empty_batch(tmp_path: Path, backend: str) -> None:
    dump = make(
        tmp_path / "empty.safetensors", table=[[0, 0, 0], [1, 2, 3]], rpi=[], prefix=[], extend=[]
    )
    plan = planner_named(backend).plan(dump, "full")
    check_clean(plan)
    check(
        plan,
        bs=0,
        total_verify=0,
        verify_offsets=[0],
        write_offsets=[0],
        write_seed_slot_indices=[],
        verify_num_valid=0,
        enable=1,
        write_num_valid_reqs=0,
        verify_slot_indices=[],
    )
    upstream = plan.upstream_tensors()
    assert upstream["write_offsets"].tolist() == [0]
    assert upstream["verify_num_valid"].tolist() == [0] and upstream["enable"].tolist() == [1]
    assert upstream["write_num_valid_reqs"].tolist() == [0]


@pytest.mark.parametrize("backend", ALL)
def test_negative_raw_slot_passes_through_untranslated(tmp_path: Path, backend: str) -> None:
    dump = make(
        tmp_path / "negslot.safetensors",
        table=[[0, 0, 0], [-3, 2, -1]],
        rpi=[1],
        prefix=[3],
        extend=[1],
        lut=[0, 101, 102, 103, -1],
        window=0,
    )
    planner = planner_named(backend)
    swa = planner.plan(dump, "swa")
    check_clean(swa)
    check(
        swa,
        verify_slot_indices=[-3, 102, -1],
        verify_prev_slot_indices=[-1, -3, 102],
        write_seed_slot_indices=[-1],
    )
    full = planner.plan(dump, "full")
    check_clean(full)
    check(
        full,
        verify_slot_indices=[-3, 2, -1],
        verify_prev_slot_indices=[-1, -3, 2],
        write_seed_slot_indices=[-1],
    )


# --- write_req_capacity and batch-size limits -------------------------------------------------


def small_capacity(tmp_path: Path) -> KvDump:
    return make(
        tmp_path / "cap.safetensors",
        table=[[0] * 5, [11, 12, 13, 14, 15], [21, 22, 23, 24, 25]],
        rpi=[1, 2, 1],
        prefix=[2, 1, 3],
        extend=[1, 1, 1],
        write_req_capacity=2,
    )


@pytest.mark.parametrize("backend", REF)
def test_write_capacity_below_bs_under_reference(tmp_path: Path, backend: str) -> None:
    plan = planner_named(backend).plan(small_capacity(tmp_path), "full")
    check_clean(plan)
    check(
        plan,
        bs=3,
        write_req_capacity=2,
        launch_error=None,
        verify_offsets=[0, 2, 3, 6],  # verify entries cover every row
        verify_slot_indices=[11, 12, 21, 11, 12, 13],
        verify_prev_slot_indices=[-1, 11, -1, -1, 11, 12],
        write_offsets=[0, 1, 2],  # R + 1 values
        write_seed_slot_indices=[12, 21],  # seeds for r < R only
        seed_undefined=[False, False],
        write_num_valid_reqs=3,
    )  # bs, not R


@pytest.mark.parametrize("backend", GPU)
def test_write_capacity_below_bs_is_a_gpu_launch_error(tmp_path: Path, backend: str) -> None:
    plan = planner_named(backend).plan(small_capacity(tmp_path), "full")
    assert plan.semantics is Semantics.GPU
    assert plan.launch_error == "kv-canary: bs=3 exceeds write_req_capacity=2"
    assert plan.entries == 0 and plan.write_offsets.size == 0


def padded_batch(tmp_path: Path, bs: int) -> KvDump:
    return make(
        tmp_path / f"bs{bs}.safetensors",
        table=[[0]],
        rpi=[0] * bs,
        prefix=[1] * bs,
        extend=[1] * bs,
    )


@pytest.mark.parametrize("backend", GPU)
def test_bs_above_4096_is_a_gpu_launch_error(tmp_path: Path, backend: str) -> None:
    plan = planner_named(backend).plan(padded_batch(tmp_path, 4097), "full")
    assert plan.launch_error is not None
    assert plan.launch_error.startswith(
        "kv-canary: launch_canary_plan_kernels supports at most bs=4096 reqs per launch"
    )
    assert "bs=4097" in plan.launch_error and "_PLAN_BS_BLOCK_SIZE" in plan.launch_error


@pytest.mark.parametrize("backend", ALL)
def test_bs_4096_is_accepted(tmp_path: Path, backend: str) -> None:
    plan = planner_named(backend).plan(padded_batch(tmp_path, 4096), "full")
    check_clean(plan)
    check(plan, total_verify=0, write_num_valid_reqs=4096, enable=1)
    assert plan.write_offsets.tolist() == [0] * 4097
    assert plan.write_seed_slot_indices.tolist() == [-1] * 4096


@pytest.mark.parametrize("backend", REF)
def test_bs_above_4096_is_fine_under_reference(tmp_path: Path, backend: str) -> None:
    plan = planner_named(backend).plan(padded_batch(tmp_path, 4097), "full")
    check_clean(plan)
    check(plan, write_num_valid_reqs=4097, enable=1)
    assert plan.write_seed_slot_indices.tolist() == [-1] * 4097


# --- a LUT shorter than the slots it is asked to translate -----------------------------------


def short_lut(tmp_path: Path, last: int = -1, **scalars: Any) -> KvDump:
    """lut_len = 5; row 0 holds slot 7 at position 2, row 1 slot 6 at position 1."""
    return make(
        tmp_path / f"short{last}.safetensors",
        table=[[0, 0, 0, 0], [1, 2, 7, 3], [2, 6, 0, 0]],
        rpi=[1, 2],
        prefix=[4, 2],
        extend=[1, 1],
        lut=[0, 101, 102, 103, last],
        window=10,
        **scalars,
    )


SHORT_LUT_PROBLEMS = [
    problem(LUT_RANGE, VERIFY, 0, 1, 2, 7, 2, True),
    problem(LUT_RANGE, CHAIN_PREV, 0, 1, 2, 7, 3, True),
    problem(LUT_RANGE, VERIFY, 1, 2, 1, 6, 5, True),
    problem(LUT_RANGE, SEED, 1, 2, 1, 6, -1, True),
]


@pytest.mark.parametrize("backend", GPU)
@pytest.mark.parametrize("last", [-1, 55])
def test_short_lut_is_clamped_on_the_gpu(tmp_path: Path, backend: str, last: int) -> None:
    plan = planner_named(backend).plan(short_lut(tmp_path, last), "swa")
    assert plan.launch_error is None
    check(
        plan,
        verify_expected_positions=[0, 1, 2, 3, 0, 1],
        # slots >= lut_len read LUT[lut_len - 1]
        verify_slot_indices=[101, 102, last, 103, 102, last],
        verify_prev_slot_indices=[-1, 101, 102, last, -1, 102],
        write_seed_slot_indices=[103, last],
        verify_undefined=[0] * 6,
        seed_undefined=[False, False],
    )
    # The same reads, reported but never raising.
    expected = [
        problem(p.kind, p.role, p.batch_row, p.pool_row, p.position, p.value, p.entry, False)
        for p in SHORT_LUT_PROBLEMS
    ]
    assert plan.problems.rows() == expected


def test_short_lut_strict_raises_upstream_message(tmp_path: Path) -> None:
    with pytest.raises(UpstreamPlanError) as info:
        STRICT.plan(short_lut(tmp_path), "swa")
    # the first offender in batch-row / entry order (row 0's 7, not row 1's smaller 6)
    assert info.value.message == (
        "kv-canary: SWA slot 7 is outside full_to_swa_index_mapping length 5"
    )
    assert info.value.exception_type == "ValueError"
    assert str(info.value) == (
        "ValueError: kv-canary: SWA slot 7 is outside full_to_swa_index_mapping length 5"
    )


@pytest.mark.parametrize("backend", REF)
def test_short_lut_collect_lists_every_offender(tmp_path: Path, backend: str) -> None:
    plan = planner_named(backend).plan(short_lut(tmp_path), "swa")
    assert plan.problems.rows() == SHORT_LUT_PROBLEMS
    check(
        plan,
        verify_slot_indices=[101, 102, 0, 103, 102, 0],
        verify_prev_slot_indices=[-1, 101, 102, 0, -1, 102],
        verify_undefined=[0, 0, SLOT, PREV, 0, SLOT],
        write_seed_slot_indices=[103, 0],
        seed_undefined=[False, True],
    )
    first = plan.problems.first_raise()
    assert first is not None and (first.value, first.entry) == (7, 2)


@pytest.mark.parametrize("backend", ALL)
def test_short_lut_does_not_touch_the_full_group(tmp_path: Path, backend: str) -> None:
    plan = planner_named(backend).plan(short_lut(tmp_path), "full")
    check_clean(plan)
    check(plan, verify_slot_indices=[1, 2, 7, 3, 2, 6], write_seed_slot_indices=[3, 6])


def prev_outside_window(tmp_path: Path) -> KvDump:
    """W = 2, P = 4: window 2..3; the prev of position 2 is slot 9 at position 1."""
    return make(
        tmp_path / "prevwin.safetensors",
        table=[[0] * 4, [1, 9, 2, 3]],
        rpi=[1],
        prefix=[4],
        extend=[1],
        lut=[0, 101, 102, 103, -1],
        window=2,
    )


def test_strict_raises_for_the_prev_slot_outside_the_window(tmp_path: Path) -> None:
    dump = prev_outside_window(tmp_path)
    with pytest.raises(UpstreamPlanError) as info:
        STRICT.plan(dump, "swa")
    assert info.value.message == (
        "kv-canary: SWA slot 9 is outside full_to_swa_index_mapping length 5"
    )
    collected = REFERENCE.plan(dump, "swa")
    assert collected.problems.rows() == [problem(LUT_RANGE, CHAIN_PREV, 0, 1, 1, 9, 0, True)]
    check(
        collected,
        verify_slot_indices=[102, 103],
        verify_prev_slot_indices=[0, 102],
        verify_undefined=[PREV, 0],
    )


@pytest.mark.parametrize("backend", GPU)
def test_prev_slot_outside_the_window_is_clamped_on_the_gpu(tmp_path: Path, backend: str) -> None:
    plan = planner_named(backend).plan(prev_outside_window(tmp_path), "swa")
    check(
        plan,
        verify_expected_positions=[2, 3],
        verify_slot_indices=[102, 103],
        verify_prev_slot_indices=[-1, 102],
        write_seed_slot_indices=[103],
        verify_undefined=[0, 0],
    )
    assert plan.problems.rows() == [problem(LUT_RANGE, CHAIN_PREV, 0, 1, 1, 9, 0, False)]


def test_strict_raises_even_when_capacity_overflows(tmp_path: Path) -> None:
    dump = short_lut(tmp_path, verify_capacity=1)
    with pytest.raises(UpstreamPlanError) as info:
        STRICT.plan(dump, "swa")
    assert info.value.message == (
        "kv-canary: SWA slot 7 is outside full_to_swa_index_mapping length 5"
    )
    collected = REFERENCE.plan(dump, "swa")
    assert collected.problems.rows() == SHORT_LUT_PROBLEMS  # REF still builds every entry
    check(collected, enable=0, verify_num_valid=1, verify_slot_indices=[])


@pytest.mark.parametrize("backend", GPU)
def test_overflow_with_short_lut_is_silent_on_the_gpu(tmp_path: Path, backend: str) -> None:
    plan = planner_named(backend).plan(short_lut(tmp_path, verify_capacity=1), "swa")
    check(
        plan,
        enable=0,
        verify_num_valid=1,
        total_verify=6,
        verify_slot_indices=[],
        write_offsets=[0, 1, 2],
        write_seed_slot_indices=[103, -1],
    )
    assert plan.problems.rows() == [problem(LUT_RANGE, SEED, 1, 2, 1, 6, -1, False)]


# --- a negative pool row ----------------------------------------------------------------------


def negative_row(tmp_path: Path) -> KvDump:
    """max_reqs = 3, pool row -1: Python indexing reaches row 2."""
    return make(
        tmp_path / "negrow.safetensors",
        table=[[0, 0, 0], [11, 12, 13], [21, 22, 23]],
        rpi=[-1],
        prefix=[2],
        extend=[1],
    )


@pytest.mark.parametrize("backend", ("reference", "vectorized"))
def test_negative_pool_row_wraps_under_reference(tmp_path: Path, backend: str) -> None:
    plan = planner_named(backend).plan(negative_row(tmp_path), "full")
    check(
        plan,
        verify_slot_indices=[21, 22],
        verify_prev_slot_indices=[-1, 21],
        verify_undefined=[0, 0],
        write_seed_slot_indices=[22],
        seed_undefined=[False],
    )
    assert plan.problems.rows() == [
        problem(ProblemKind.ROW_OUT_OF_RANGE, VERIFY, 0, -1, 0, -1, 0, False)
    ]


def test_negative_pool_row_does_not_raise_in_strict_mode(tmp_path: Path) -> None:
    dump = negative_row(tmp_path)
    plan = STRICT.plan(dump, "full")
    check(plan, verify_slot_indices=[21, 22], write_seed_slot_indices=[22])


@pytest.mark.parametrize("backend", GPU)
def test_negative_pool_row_is_undefined_on_the_gpu(tmp_path: Path, backend: str) -> None:
    plan = planner_named(backend).plan(negative_row(tmp_path), "full")
    # flat reads at -3 + pos fall before the table: nothing defined but the chain head
    check(
        plan,
        verify_expected_positions=[0, 1],
        verify_undefined=[SLOT, SLOT | PREV],
        verify_prev_slot_indices=[-1, 0],
        seed_undefined=[True],
    )
    assert plan.problems.rows() == [
        problem(ProblemKind.ROW_OUT_OF_RANGE, VERIFY, 0, -1, 0, -1, 0, False)
    ]
