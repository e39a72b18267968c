"""kvcanary against SGLang 0.5.23 itself: its kv-canary plan modules from the release wheel.

The wheel is found in the cache `.ci/run` fills (`pip download sglang==0.5.23 --no-deps`), or
through `$KVCANARY_SGLANG_WHEEL`; without it these tests are skipped. Only the plan launcher's
modules are unpacked, into a temporary tree with stub package levels (tests/sglang_wheel.py),
and imported the way `--kernel sglang` imports SGLang. Off CUDA the launcher runs SGLang's
torch reference, so these tests hold kvcanary's reference model against SGLang's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvcanary_cli.analysis.check import run_check
from kvcanary_cli.analysis.selftest import run_selftest
from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.errors import UpstreamPlanError
from kvcanary_cli.planners import make_selftest_planners
from kvcanary_cli.planners.base import NOT_LAUNCHED
from kvcanary_cli.planners.sglang_planner import SGLangPlanner
from kvcanary_cli.planners.sglang_runtime import load_launcher, load_reference_launcher
from kvcanary_cli.results.check import UPSTREAM_RAISE
from kvcanary_cli.synth.scenarios import SCENARIOS, make_scenario
from tests.helpers import NOT_HANDED_TO_SGLANG, STRICT, UPSTREAM_RAISING_SCENARIOS, VECTORIZED
from tests.planners.plan_helpers import assert_plans_equal
from tests.sglang_standin import forget_sglang
from tests.sglang_wheel import MISSING_WHEEL, WHEEL_VERSION, extract_kv_canary, wheel_path
from tests.shared_plans import sharing_triton_plans
from tests.torch_extra import needs_torch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.safetensors"))
WHEEL = wheel_path()
#: Bug scenarios where SGLang's reference raises (the others plan through).

pytestmark = pytest.mark.skipif(WHEEL is None, reason=MISSING_WHEEL)


@pytest.fixture(scope="module")
def real_sglang(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """SGLang 0.5.23's plan modules first on sys.path for this module's tests."""
    assert WHEEL is not None
    needs_torch()  # SGLang's plan modules run on torch
    root = extract_kv_canary(WHEEL, tmp_path_factory.mktemp("sglang-wheel"))
    forget_sglang()
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        yield root
    forget_sglang()


@pytest.fixture(scope="module")
def scenario_dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, KvDump]:
    folder = tmp_path_factory.mktemp("scenarios")
    return {
        name: load_dump(make_scenario(name).save(folder / f"{name}.safetensors"))
        for name in SCENARIOS
    }


def test_the_real_launcher_has_the_modelled_signature(real_sglang: Path) -> None:
    launcher = load_launcher()
    assert launcher.version == WHEEL_VERSION
    assert load_reference_launcher().where.endswith("launch_canary_plan_kernels_torch_reference")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_agree(real_sglang: Path, path: Path) -> None:
    report = run_check(load_dump(path), planner=VECTORIZED, kernel=SGLangPlanner())
    assert not [f.message for f in report.findings if f.code == "kernel-divergence"]
    raised = {g.group: g.kernel_launch_error for g in report.groups if g.kernel_launch_error}
    assert raised == (
        {"swa": "kv-canary: SWA slot 107 is outside full_to_swa_index_mapping length 107"}
        if path.stem == "truncated-lut"
        else {}
    )


def test_every_scenario_agrees(real_sglang: Path, scenario_dumps: dict[str, KvDump]) -> None:
    """Clean scenarios: the same plan, field by field. Bug scenarios: no unexplained
    difference, and SGLang raises exactly where (and with what) kvcanary's strict reference
    raises."""
    sglang = SGLangPlanner()
    for name, dump in scenario_dumps.items():
        for group in dump.groups:
            ours, theirs = VECTORIZED.plan(dump, group), sglang.plan(dump, group)
            if theirs.launch_error_type == NOT_LAUNCHED:
                assert name in NOT_HANDED_TO_SGLANG and ours.skipped, (name, group)
                continue
            try:
                STRICT.plan(dump, group)
                expected = None
            except UpstreamPlanError as exc:
                expected = (exc.exception_type, exc.message)
            got = (
                None
                if theirs.launch_error is None
                else (
                    theirs.launch_error_type,
                    theirs.launch_error,
                )
            )
            assert got == expected, (name, group)
            if got is None:
                assert_plans_equal(ours, theirs, upstream=True)
        report = run_check(dump, planner=VECTORIZED, kernel=sglang)
        assert not [f for f in report.findings if f.code == "kernel-divergence"], name


def test_the_truncated_lut_raise_is_kvcanarys_first_raise(real_sglang: Path) -> None:
    dump = load_dump(ROOT / "examples" / "truncated-lut.safetensors")
    first = VECTORIZED.plan(dump, "swa").problems.first_raise()
    assert first is not None
    report = run_check(dump, planner=VECTORIZED, kernel=SGLangPlanner())
    marked = [f for f in report.findings if f.upstream_raise is not None]
    assert [(f.code.value, f.batch_row, f.position, f.slot) for f in marked] == [
        ("lut-out-of-range", first.batch_row, first.position, first.value)
    ]
    with pytest.raises(UpstreamPlanError) as strict:
        STRICT.plan(dump, "swa")
    assert marked[0].upstream_raise == str(strict.value)


def test_selftest_agrees_and_lists_the_raises(real_sglang: Path) -> None:
    baselines, planners = make_selftest_planners(sglang=True)
    report = run_selftest(
        baselines,
        sharing_triton_plans(planners),  # the releases' selftests' plans, where one ran here
        kvcanary_version="test",
        sglang_installed=WHEEL_VERSION,
    )
    assert report.verdict == "agree", report.summary
    raised = {}
    for scenario in report.scenarios:
        for group in scenario.groups:
            (sglang,) = [c for c in group.comparisons if c.planner == "sglang"]
            if sglang.not_launched:
                assert scenario.scenario in NOT_HANDED_TO_SGLANG
                continue
            assert sglang.agree and sglang.raised == sglang.expected_raise
            if sglang.raised:
                assert group.ref_raise is not None
                assert group.ref_raise.error == sglang.raised
                raised[scenario.scenario] = sglang.raised
            elif scenario.clean:
                assert set(sglang.fields.values()) == {"agree"}
    assert set(raised) == UPSTREAM_RAISING_SCENARIOS


def _kvcanary_with(sglang: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`kvcanary ARGS` in a fresh interpreter with the `sglang` tree on PYTHONPATH."""
    path = os.pathsep.join([str(sglang), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "kvcanary_cli", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path, "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_the_cli_imports_sglang_the_normal_way(real_sglang: Path) -> None:
    """A fresh interpreter with the tree on PYTHONPATH: `check --kernel sglang`, as a user
    would run it."""
    done = _kvcanary_with(
        real_sglang,
        *("check", "examples/truncated-lut.safetensors", "--kernel", "sglang", "--format", "json"),
    )
    assert done.returncode == 1, done.stderr
    record = json.loads(done.stdout)
    assert record["sglang_installed"] == WHEEL_VERSION
    findings = record["dumps"][0]["findings"]
    assert sum(UPSTREAM_RAISE in f["details"] for f in findings) == 1


@pytest.mark.slow
@pytest.mark.deep
def test_selftest_sglang_runs_in_a_fresh_interpreter(real_sglang: Path) -> None:
    """`selftest --sglang` the same way (the deep lane: the suite runs it in process,
    `test_selftest_agrees_and_lists_the_raises`)."""
    done = _kvcanary_with(real_sglang, "selftest", "--sglang")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "full agreement" in done.stdout
