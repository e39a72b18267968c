"""The SGLang planner against a stand-in SGLang (tests/sglang_standin.py): loading, signature
checks, plans equal to kvcanary's reference, raises tied to their findings, drift reported."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from kvcanary_cli.analysis.check import run_check
from kvcanary_cli.analysis.upstream_raise import launch_divergences
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.dump.schema import LAUNCHER_ARGUMENTS
from kvcanary_cli.dump.writer import save_dump
from kvcanary_cli.errors import PlannerUnavailableError
from kvcanary_cli.planners import PlannerChoice, make_kernel, make_planner
from kvcanary_cli.planners.base import NOT_LAUNCHED, Semantics, upstream_error
from kvcanary_cli.planners.frame import group_frame
from kvcanary_cli.planners.sglang_planner import SGLangPlanner, plan_arguments
from kvcanary_cli.planners.sglang_runtime import (
    VERIFY_PLAN_FIELDS,
    WRITE_PLAN_FIELDS,
    load_launcher,
    load_reference_launcher,
)
from kvcanary_cli.synth.scenarios import SCENARIOS, make_scenario
from tests.conftest import InstallStandin
from tests.helpers import VECTORIZED
from tests.planners.plan_helpers import assert_plans_equal
from tests.sglang_standin import VERSION

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.safetensors"))
CLEAN = [name for name, s in SCENARIOS.items() if not s.expected]


def scenario(name: str, folder: Path) -> KvDump:
    return load_dump(make_scenario(name).save(folder / f"{name}.safetensors"))


def test_the_launcher_loads_with_its_version(sglang_standin: InstallStandin) -> None:
    sglang_standin()
    launcher = load_launcher()
    assert launcher.version == VERSION
    assert launcher.where == "sglang.kernels.ops.kv_canary.plan.api:launch_canary_plan_kernels"
    planner = make_kernel(PlannerChoice.SGLANG)
    assert planner is not None and planner.name == "sglang"
    assert (planner.semantics, planner.mode) == (Semantics.REFERENCE, "reference")
    assert make_planner(PlannerChoice.SGLANG).name == "sglang"
    assert pickle.loads(pickle.dumps(planner)).mode == "reference"  # for check's workers


def test_arguments_are_the_launchers(sglang_standin: InstallStandin, tmp_path: Path) -> None:
    sglang_standin()
    dump = scenario("clean-swa", tmp_path)
    arguments = plan_arguments(load_launcher(), dump, group_frame(dump, "swa"), torch.device("cpu"))
    assert set(arguments) == set(LAUNCHER_ARGUMENTS)
    assert arguments["req_to_token"].data_ptr() == dump.req_to_token.array().ctypes.data  # no copy


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_agree_with_the_reference(sglang_standin: InstallStandin, path: Path) -> None:
    sglang_standin()
    dump = load_dump(path)
    report = run_check(dump, planner=VECTORIZED, kernel=SGLangPlanner())
    assert not [f for f in report.findings if f.code == "kernel-divergence"]
    for group in report.groups:
        assert group.unexplained_differences == 0 and not group.explained_differences
        expected = None
        if path.stem == "truncated-lut" and group.group == "swa":
            expected = "kv-canary: SWA slot 107 is outside full_to_swa_index_mapping length 107"
        assert group.kernel_launch_error == expected
    assert report.kernel_mode == "reference"


@pytest.mark.parametrize("name", CLEAN)
def test_clean_scenarios_give_the_same_plan(
    sglang_standin: InstallStandin, tmp_path: Path, name: str
) -> None:
    sglang_standin()
    dump = scenario(name, tmp_path)
    for group in dump.groups:
        assert_plans_equal(
            VECTORIZED.plan(dump, group), SGLangPlanner().plan(dump, group), upstream=True
        )


def test_the_raise_is_tied_to_the_first_raise_finding(sglang_standin: InstallStandin) -> None:
    sglang_standin()
    dump = load_dump(ROOT / "examples" / "truncated-lut.safetensors")
    first = VECTORIZED.plan(dump, "swa").problems.first_raise()
    assert first is not None
    report = run_check(dump, planner=VECTORIZED, kernel=SGLangPlanner())
    marked = [f for f in report.findings if f.upstream_raise is not None]
    assert len(marked) == 1
    finding = marked[0]
    assert (finding.code, finding.group) == ("lut-out-of-range", "swa")
    assert (finding.batch_row, finding.position, finding.slot) == (
        first.batch_row,
        first.position,
        first.value,
    )
    assert finding.upstream_raise == (
        "ValueError: kv-canary: SWA slot 107 is outside full_to_swa_index_mapping length 107"
    )


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("row-out-of-range", "row-out-of-range"),
        ("prefix-past-row", "prefix-beyond-row"),
        ("expected-token-out-of-range", "expected-token-out-of-range"),
    ],
)
def test_index_errors_are_predicted_and_marked(
    sglang_standin: InstallStandin, tmp_path: Path, name: str, code: str
) -> None:
    sglang_standin()
    dump = scenario(name, tmp_path)
    reference = VECTORIZED.plan(dump, "full")
    first = reference.problems.first_raise()
    assert first is not None
    plan = SGLangPlanner().plan(dump, "full")
    assert (plan.launch_error_type, plan.launch_error) == (
        "IndexError",
        upstream_error(first, reference.frame).message,
    )
    report = run_check(dump, planner=VECTORIZED, kernel=SGLangPlanner())
    assert not [f for f in report.findings if f.code == "kernel-divergence"]
    marked = [f for f in report.findings if f.upstream_raise is not None]
    assert [(f.code.value, f.batch_row) for f in marked] == [(code, first.batch_row)]


def test_a_drifted_seed_is_a_kernel_divergence(sglang_standin: InstallStandin) -> None:
    sglang_standin(seed_back=2)
    dump = load_dump(ROOT / "examples" / "clean-swa.safetensors")
    report = run_check(dump, planner=VECTORIZED, kernel=SGLangPlanner())
    fields = {f.details["field"] for f in report.findings if f.code == "kernel-divergence"}
    assert fields == {"write seed"}


def test_a_missed_raise_is_a_launch_divergence(sglang_standin: InstallStandin) -> None:
    sglang_standin(clamp=True)
    dump = load_dump(ROOT / "examples" / "truncated-lut.safetensors")
    report = run_check(dump, planner=VECTORIZED, kernel=SGLangPlanner())
    launch = [f for f in report.findings if f.details.get("field") == "launch"]
    assert len(launch) == 1
    assert launch[0].details["kernel"] == "no raise"
    assert str(launch[0].details["reference"]).startswith("ValueError: kv-canary: SWA slot 107")
    assert not [f for f in report.findings if f.upstream_raise is not None]
    swa = next(g for g in report.groups if g.group == "swa")
    assert (
        swa.explained_differences.get(FindingCode.LUT_OUT_OF_RANGE, 0) > 0
    )  # the clamps, explained
    assert swa.unexplained_differences == 1


def test_capacities_of_zero(sglang_standin: InstallStandin, tmp_path: Path) -> None:
    """No entries requested and no capacity recorded (C = 0), and an empty batch (R = 0):
    SGLang's allocators refuse 0, so the planner hands it empty outputs."""
    sglang_standin()
    table = np.zeros((3, 8), dtype=np.int32)
    for bs in (0, 2):
        path = save_dump(
            tmp_path / f"bs{bs}.safetensors",
            req_to_token=table,
            req_pool_indices=np.zeros(bs, dtype=np.int64),
            prefix_lens=np.zeros(bs, dtype=np.int64),
        )
        dump = load_dump(path)
        assert_plans_equal(
            VECTORIZED.plan(dump, "full"), SGLangPlanner().plan(dump, "full"), upstream=True
        )


def test_cuda_batches_reading_outside_the_table_are_not_launched(
    sglang_standin: InstallStandin, tmp_path: Path
) -> None:
    sglang_standin()
    dump = scenario("row-out-of-range", tmp_path)
    planner = SGLangPlanner(device="cuda")  # refused before any tensor goes to the device
    assert (planner.semantics, planner.mode) == (Semantics.GPU, "cuda")
    plan = planner.plan(dump, "full")
    assert plan.launch_error_type == NOT_LAUNCHED
    assert plan.launch_error is not None and "row-out-of-range" in plan.launch_error
    assert launch_divergences(VECTORIZED.plan(dump, "full"), plan) == []


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"drop_argument": True}, f"SGLang {VERSION}'s launch_canary_plan_kernels does not"),
        ({"import_error": True}, "RuntimeError: stand-in: CUDA driver missing"),
        ({"launcher": False}, f"SGLang {VERSION} has no sglang.kernels.ops.kv_canary.plan.api"),
    ],
)
def test_unusable_sglang_is_one_error_naming_the_version(
    sglang_standin: InstallStandin, options: dict[str, bool], needle: str
) -> None:
    sglang_standin(**options)
    with pytest.raises(PlannerUnavailableError) as caught:
        make_kernel(PlannerChoice.SGLANG)
    assert needle in str(caught.value)
    assert str(caught.value).startswith("--kernel sglang: ")
    assert "\n" not in str(caught.value)


def test_missing_sglang(no_sglang: None) -> None:
    with pytest.raises(PlannerUnavailableError, match="SGLang is not installed here"):
        make_planner(PlannerChoice.SGLANG)


def test_the_reference_launcher_for_benchmarks(
    sglang_standin: InstallStandin, tmp_path: Path
) -> None:
    """`load_reference_launcher` loads SGLang's torch reference; the stand-in has none."""
    sglang_standin()
    with pytest.raises(PlannerUnavailableError, match="plan_ref"):
        load_reference_launcher()


def test_plans_name_their_upstream_fields_as_sglang_does(tmp_path: Path) -> None:
    """`Plan.upstream_tensors` (what kvcanary compares and saves) and the fields read back
    from SGLang's VerifyPlan / WritePlan are the same names in the same order."""
    dump = load_dump(make_scenario("clean-swa").save(tmp_path / "d.safetensors"))
    plan = make_planner(PlannerChoice.VECTORIZED).plan(dump, "full")
    assert tuple(plan.upstream_tensors()) == (*VERIFY_PLAN_FIELDS, *WRITE_PLAN_FIELDS)
