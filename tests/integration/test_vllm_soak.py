"""vLLM 0.33.0's real `KVCacheManager` (from the release wheel, on CPU) under the soak's
workload: clean histories of both models are silent across every audited step, and each
planted fault is found at the step it is planted, naming its block and holders, while vLLM's
own asserts say nothing then (later, or never)."""

from __future__ import annotations

from typing import Any

import pytest

from kvcanary_cli.catalog import PoolCode
from kvcanary_cli.soak.vllm_driver import FAULTS, run_history

#: fault -> the finding it must raise at its step.
EXPECTED = {
    "block-freed-twice": PoolCode.NEGATIVE_REF_COUNT,
    "block-freed-while-held": PoolCode.QUEUED_BLOCK_HELD,
    "leak": PoolCode.REF_COUNT_HIGH,
    "free-count": PoolCode.FREE_COUNT_MISMATCH,
}


@pytest.mark.parametrize("model", ["full", "hybrid"])
def test_clean_histories_are_silent_at_every_step(vllm: Any, model: str) -> None:
    h = run_history(vllm, model, seed=11, steps=150)
    assert h.crash is None and h.findings == ()
    assert h.audited == 150
    assert h.prefix_hits > 0


def test_every_fault_has_an_expectation() -> None:
    assert set(EXPECTED) == set(FAULTS)


@pytest.mark.parametrize(
    ("fault", "model"),
    [(f, "full") for f in FAULTS]
    + [("block-freed-twice", "hybrid"), ("block-freed-while-held", "hybrid")],
)
def test_a_planted_fault_is_found_at_the_step_it_happens(vllm: Any, fault: str, model: str) -> None:
    h = run_history(vllm, model, seed=3, steps=80, fault=fault, after_steps=0)
    assert h.fault_step is not None, "the workload gave the fault a place"
    assert h.finding_step == h.fault_step
    assert h.crash is None, "vLLM said nothing at that step"
    top = h.findings[0]
    assert top.code is EXPECTED[fault]
    if top.block is not None:
        assert f"block {top.block}" in top.message
    if fault == "block-freed-while-held":
        assert top.owners and top.holders and top.holders >= 2


def test_soak_engine_vllm_reports_the_fault_and_what_vllm_said(vllm: Any) -> None:
    import json

    from typer.testing import CliRunner

    from kvcanary_cli.cli import app
    from tests.vllm_wheel import wheel_path

    args = ["soak", "--engine", "vllm", "--vllm-tree", str(wheel_path()), "--format", "json"]
    clean = CliRunner().invoke(app, [*args, "--steps", "60"])
    assert clean.exit_code == 0, clean.output
    record = json.loads(clean.output)
    assert record["schema"] == "kvcanary.pool-soak/1" and record["audited"] == 60
    from tests.render.record_schema import RECORDS, validate

    assert validate(record, RECORDS[record["schema"]]) == []
    found = CliRunner().invoke(app, [*args, "--steps", "300", "--fault", "block-freed-twice"])
    assert found.exit_code == 1, found.output
    record = json.loads(found.output)
    assert validate(record, RECORDS[record["schema"]]) == []
    [history] = record["histories"]
    assert history["finding_step"] == history["fault_step"]
    assert history["findings"][0]["code"] == "negative-ref-count"


def test_soak_refuses_an_unknown_engine_in_one_line() -> None:
    from typer.testing import CliRunner

    from kvcanary_cli.cli import app

    result = CliRunner().invoke(app, ["soak", "--engine", "tgi"])
    assert result.exit_code == 2
    assert "'tgi' is not sglang or vllm" in result.output
