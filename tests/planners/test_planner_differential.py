"""Differential property tests: the planner backends agree on random dumps.

- reference (scalar REF) vs vectorized (vectorized REF): every plan field, the undefined masks and
  the problem table, on valid and on corrupt dumps;
- on valid dumps, reference vs vectorized-gpu vs triton (GPU semantics): identical on the region
  upstream defines (`Plan.upstream_tensors()`, what SGLang's own differential compares), in
  fact on every field, with no problems and nothing undefined;
- strict reference vs collect reference: strict raises exactly at collect's first raising
  problem, with upstream's message, and otherwise returns the same plan.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from kvcanary_cli.errors import UpstreamPlanError
from kvcanary_cli.planners.base import Plan, ProblemKind, lut_error_message
from tests.helpers import REFERENCE, STRICT, VECTORIZED, VECTORIZED_GPU
from tests.planners.plan_helpers import assert_plans_equal, triton_planner
from tests.strategies import DumpCase, corrupt_dumps, dump_from, valid_dumps

_SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def dump_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("differential")


def _assert_clean(plan: Plan) -> None:
    """A plan of a valid dump: no problems, nothing undefined, no launch error."""
    assert plan.launch_error is None, plan.launch_error
    assert len(plan.problems) == 0, plan.problems.rows()
    assert not bool(plan.verify_undefined.any()), plan.verify_undefined.tolist()
    assert not bool(plan.seed_undefined.any()), plan.seed_undefined.tolist()


def _assert_upstream_invariants(plan: Plan) -> None:
    """Properties §1.2 states outright, checked on a valid dump's plan."""
    lens = plan.verify_offsets[1:] - plan.verify_offsets[:-1]
    assert int(plan.verify_offsets[0]) == 0 and bool((lens >= 0).all())
    assert plan.total_verify == int(plan.verify_offsets[-1])
    overflow = plan.total_verify > plan.verify_capacity
    assert plan.enable == (0 if overflow else 1)
    assert plan.verify_num_valid == (plan.verify_capacity if overflow else plan.total_verify)
    assert plan.entries == (0 if overflow else plan.total_verify)
    assert plan.write_num_valid_reqs == plan.bs
    assert int(plan.write_offsets[0]) == 0
    assert bool((plan.write_offsets[1:] >= plan.write_offsets[:-1]).all())
    if plan.entries:
        pos = plan.verify_expected_positions
        heads = pos == 0
        assert bool((plan.verify_prev_slot_indices[heads] == -1).all())


@pytest.mark.slow
@settings(_SETTINGS, max_examples=100)
@given(case=valid_dumps())
def test_reference_and_vectorized_agree_on_valid_dumps(case: DumpCase, dump_dir: Path) -> None:
    dump = dump_from(case.tensors, case.metadata, dump_dir)
    for group in case.groups:
        ref = REFERENCE.plan(dump, group)
        assert_plans_equal(ref, VECTORIZED.plan(dump, group))
        assert_plans_equal(ref, STRICT.plan(dump, group))
        _assert_clean(ref)
        _assert_upstream_invariants(ref)


@pytest.mark.slow
@settings(_SETTINGS, max_examples=130)
@given(case=corrupt_dumps())
def test_reference_and_vectorized_agree_on_corrupt_dumps(case: DumpCase, dump_dir: Path) -> None:
    dump = dump_from(case.tensors, case.metadata, dump_dir)
    for group in case.groups:
        assert_plans_equal(REFERENCE.plan(dump, group), VECTORIZED.plan(dump, group))


@pytest.mark.slow
@settings(_SETTINGS, max_examples=70)
@given(case=corrupt_dumps())
def test_strict_raises_at_the_first_raising_problem(case: DumpCase, dump_dir: Path) -> None:
    dump = dump_from(case.tensors, case.metadata, dump_dir)
    for group in case.groups:
        collected = REFERENCE.plan(dump, group)
        first = collected.problems.first_raise()
        if first is None:
            assert_plans_equal(collected, STRICT.plan(dump, group))
            continue
        with pytest.raises(UpstreamPlanError) as info:
            STRICT.plan(dump, group)
        if first.kind is ProblemKind.LUT_OUT_OF_RANGE:
            assert info.value.exception_type == "ValueError"
            assert info.value.message == lut_error_message(first.value, dump.lut_len or 0)
        else:
            assert info.value.exception_type == "IndexError"
            assert f"index {first.value} is out of bounds" in info.value.message


@pytest.mark.slow
@settings(_SETTINGS, max_examples=80)
@given(case=valid_dumps())
def test_gpu_semantics_agree_with_reference_on_valid_dumps(case: DumpCase, dump_dir: Path) -> None:
    dump = dump_from(case.tensors, case.metadata, dump_dir)
    for group in case.groups:
        ref = REFERENCE.plan(dump, group)
        gpu = VECTORIZED_GPU.plan(dump, group)
        assert_plans_equal(ref, gpu, upstream=True)
        assert_plans_equal(ref, gpu)
        _assert_clean(gpu)


@pytest.mark.slow
@settings(_SETTINGS, max_examples=50)
@given(case=valid_dumps())
def test_triton_agrees_with_reference_on_valid_dumps(case: DumpCase, dump_dir: Path) -> None:
    triton = triton_planner()
    if triton is None:
        pytest.skip("kvcanary_cli.planners.triton_planner or triton is not installed")
    dump = dump_from(case.tensors, case.metadata, dump_dir)
    for group in case.groups:
        ref = REFERENCE.plan(dump, group)
        plan = triton.plan(dump, group)
        assert_plans_equal(ref, plan, upstream=True)
        assert_plans_equal(ref, plan)
        _assert_clean(plan)


@settings(_SETTINGS, max_examples=50)
@given(case=corrupt_dumps())
def test_gpu_semantics_never_raise_on_corrupt_dumps(case: DumpCase, dump_dir: Path) -> None:
    """GPU planners report bad input as problems (never `raises`) or as a launch error."""
    dump = dump_from(case.tensors, case.metadata, dump_dir)
    for group in case.groups:
        plan = VECTORIZED_GPU.plan(dump, group)
        refused = dump.bs > dump.write_req_capacity
        assert (plan.launch_error is not None) == refused
        assert not bool(plan.problems.raises.any())
        if plan.launch_error is None:
            ref = REFERENCE.plan(dump, group)
            # Geometry never depends on the table's contents.
            for name in ("total_verify", "verify_num_valid", "enable"):
                assert getattr(plan, name) == getattr(ref, name), name
            assert np.array_equal(plan.verify_offsets, ref.verify_offsets)
            assert np.array_equal(plan.write_offsets, ref.write_offsets)
