"""The CLI with SGLang: `check --kernel sglang`, `plan --backend sglang`, `selftest [--sglang]`,
the installed version in reports, and one-line exit-2 errors when SGLang cannot be used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcanary_cli.cli import app
from kvcanary_cli.planners import make_selftest_planners
from kvcanary_cli.planners.base import Planner
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.results.selftest import SelftestReport
from kvcanary_cli.synth.scenarios import SCENARIOS
from tests.conftest import InstallStandin
from tests.helpers import UPSTREAM_RAISING_SCENARIOS
from tests.render.record_schema import validate
from tests.sglang_standin import VERSION
from tests.sglang_wheel import RELEASES, WHEEL_VERSION
from tests.shared_plans import sharing_triton_plans
from tests.torch_extra import HAS_TORCH

ROOT = Path(__file__).resolve().parents[2]
TRUNCATED = str(ROOT / "examples" / "truncated-lut.safetensors")
CLEAN = str(ROOT / "examples" / "clean-swa.safetensors")
SLOT_107 = "kv-canary: SWA slot 107 is outside full_to_swa_index_mapping length 107"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_check_reports_the_raise_at_its_finding(sglang_standin: InstallStandin) -> None:
    sglang_standin()
    code, out, err = run("check", TRUNCATED, "--kernel", "sglang", "--format", "json")
    assert code == 1, err
    record = json.loads(out)
    assert validate(record, CheckReport) == []
    assert record["sglang_installed"] == VERSION
    dump = record["dumps"][0]
    assert dump["kernel_mode"] == "reference"
    swa = next(g for g in dump["groups"] if g["group"] == "swa")
    assert (swa["kernel"], swa["kernel_launch_error"]) == ("sglang", SLOT_107)
    assert swa["unexplained_differences"] == 0
    marked = [f for f in dump["findings"] if "upstream_raise" in f["details"]]
    assert [(f["slot"], f["position"]) for f in marked] == [(107, 14)]
    table = run("check", TRUNCATED, "--kernel", "sglang", "--max-rows", "1")[1]
    assert f"SGLang installed here: {VERSION}" in table
    words = " ".join(w for w in table.split() if w != "│")  # the message cell's lines, joined
    assert "← the kernel's launch raised at (batch row 0, pos 14)" in words


def test_check_clean_with_sglang_exits_0(sglang_standin: InstallStandin) -> None:
    sglang_standin()
    code, out, err = run("check", CLEAN, "--kernel", "sglang")
    assert code == 0, (out, err)


def test_plan_backend_sglang(sglang_standin: InstallStandin, tmp_path: Path) -> None:
    sglang_standin()
    ours, theirs = tmp_path / "vectorized.safetensors", tmp_path / "sglang.safetensors"
    assert run("plan", CLEAN, "-g", "swa", "--backend", "vectorized", "--out", str(ours))[0] == 0
    code, out, err = run("plan", CLEAN, "-g", "swa", "--backend", "sglang", "--out", str(theirs))
    assert code == 0, err
    assert theirs.read_bytes() == ours.read_bytes()
    raised = tmp_path / "raised.safetensors"
    code, out, err = run(
        "plan", TRUNCATED, "-g", "swa", "-b", "sglang", "--out", str(raised), "-f", "json"
    )
    assert code == 1
    assert err.strip() == f"ValueError: {SLOT_107}"
    assert json.loads(out)["launch_error"] == SLOT_107 and not raised.exists()
    assert run("plan", CLEAN, "--backend", "sglang", "--strict")[0] == 2


def test_inspect_shows_both_versions(sglang_standin: InstallStandin) -> None:
    sglang_standin()
    code, out, _ = run("inspect", CLEAN, "--format", "json")
    assert code == 0 and json.loads(out)["sglang_installed"] == VERSION
    lines = [line for line in run("inspect", CLEAN)[1].splitlines() if "installed here" in line]
    assert len(lines) == 1 and VERSION in lines[0]


@pytest.mark.parametrize(
    "args",
    [
        ("check", CLEAN, "--kernel", "sglang"),
        ("plan", CLEAN, "--backend", "sglang"),
        ("selftest", "--sglang"),
    ],
)
def test_missing_sglang_is_one_line_exit_2(no_sglang: None, args: tuple[str, ...]) -> None:
    code, out, err = run(*args)
    assert code == 2
    assert out == ""
    # without torch, the planner says first that SGLang's planners need it (they cannot run)
    said = "SGLang is not installed here" if HAS_TORCH else "pip install 'kvcanary[torch]'"
    assert len(err.strip().splitlines()) == 1 and said in err


def test_a_changed_signature_names_the_version(sglang_standin: InstallStandin) -> None:
    sglang_standin(drop_argument=True)
    code, _, err = run("check", CLEAN, "--kernel", "sglang")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"SGLang {VERSION}'s launch_canary_plan_kernels" in err
    assert "kv_token_id_vs_position_offset" in err


@pytest.fixture
def shared_triton_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    """selftest's Triton planner with its plans shared by every selftest this process runs
    (tests/shared_plans.py: the corpus planned once, interpreted; a plan is a function of the
    dump alone, so a run compares the same plans a fresh planner would make)."""

    def sharing(*, sglang: bool) -> tuple[list[Planner], list[Planner]]:
        baselines, planners = make_selftest_planners(sglang=sglang)
        return baselines, sharing_triton_plans(planners)

    monkeypatch.setattr("kvcanary_cli.api.make_selftest_planners", sharing)


@pytest.mark.slow  # every scenario through two planners; the fast lane's is test_sglang_wheel's
def test_selftest_without_sglang_agrees(no_sglang: None, shared_triton_plans: None) -> None:
    code, out, err = run("selftest", "--format", "json")
    assert code == 0, err
    record = json.loads(out)
    assert validate(record, SelftestReport) == []
    assert record["verdict"] == "agree"
    assert [p["name"] for p in record["planners"]] == ["vectorized", "triton"]
    assert record["sglang"] == {
        "installed": None,
        "run": False,
        "mode": None,
        "verified": [*RELEASES, WHEEL_VERSION],  # the releases the release tests run
    }
    assert [s["scenario"] for s in record["scenarios"]] == list(SCENARIOS)
    assert record["summary"]["scenarios"] == len(SCENARIOS)
    # each comparison says every compared field (the record's own check: one corpus run
    # serves both, it is the fast lane's costliest in-process test)
    said = {
        frozenset(c["fields"])
        for s in record["scenarios"]
        for g in s["groups"]
        for c in g["comparisons"]
    }
    assert said == {frozenset(record["fields"])}


@pytest.mark.slow  # every scenario through every planner
def test_selftest_with_sglang(sglang_standin: InstallStandin, shared_triton_plans: None) -> None:
    sglang_standin()
    code, out, err = run("selftest", "--sglang", "--format", "json")
    assert code == 0, err
    record = json.loads(out)
    assert validate(record, SelftestReport) == []
    assert record["sglang"]["installed"] == VERSION and record["sglang"]["run"]
    raises = {
        s["scenario"]: c["raised"]
        for s in record["scenarios"]
        for g in s["groups"]
        for c in g["comparisons"]
        if c["planner"] == "sglang" and c["raised"]
    }
    assert set(raises) == UPSTREAM_RAISING_SCENARIOS
    markdown = run("selftest", "--sglang", "--format", "markdown")[1]
    assert markdown.startswith("## kvcanary selftest: agreement")
    assert "| `truncated-lut` | `swa` | agree, raises | agree | agree, raises |" in markdown


@pytest.mark.slow  # every scenario through every planner
def test_selftest_reports_drift(sglang_standin: InstallStandin, shared_triton_plans: None) -> None:
    sglang_standin(seed_back=2)
    code, out, _ = run("selftest", "--sglang")
    assert code == 1
    assert "DISAGREEMENT" in out and "write_seed_slot_indices" in out
    record = json.loads(run("selftest", "--sglang", "--format", "json")[1])
    assert record["verdict"] == "disagree"
    assert record["summary"]["by_planner"]["sglang"]["disagreements"] > 0
    assert record["summary"]["by_planner"]["vectorized"]["disagreements"] == 0


def test_selftest_sizes() -> None:
    assert run("selftest", "--size", "medium")[0] == 2
