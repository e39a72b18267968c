"""`timeline` and `diff` on vLLM dumps: a planted fault shows as the step its block went bad,
with the block, its states and holders and the new code; a snapshot against itself changes
nothing; snapshots of two pools, or of two engines, are one error line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcanary_cli import api
from kvcanary_cli.catalog import PoolCode
from kvcanary_cli.cli import app
from kvcanary_cli.dump.atomic import write_safetensors
from kvcanary_cli.engines.vllm.synth import build
from kvcanary_cli.results.pool import PoolFinding
from kvcanary_cli.results.pool_timeline import PoolTimelineReport
from tests.render.record_schema import RECORDS, validate

runner = CliRunner()


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("vllm-timeline")
    out = {}
    for name in ("vllm-clean", "vllm-freed-while-held", "vllm-hybrid-clean"):
        out[name] = folder / f"{name}.safetensors"
        api.synth(name, out[name], seed=1)
    return out


def test_a_fault_is_dated_to_its_step_with_its_block(dumps: dict[str, Path]) -> None:
    clean, bad = dumps["vllm-clean"], dumps["vllm-freed-while-held"]
    [finding] = api.check(bad).dumps[0].findings
    assert isinstance(finding, PoolFinding)
    out = runner.invoke(app, ["diff", str(clean), str(bad), "--format", "json"])
    assert out.exit_code == 1, out.output
    record = json.loads(out.output)
    assert validate(record, RECORDS[record["schema"]]) == []
    [step] = record["steps"]
    assert step["new_codes"] == [PoolCode.QUEUED_BLOCK_HELD] and step["gone_codes"] == []
    assert step["went_bad"] == 1
    [changed] = step["blocks"]
    assert changed["block"] == finding.block
    assert (changed["before"], changed["after"]) == ("held", "free-and-held")
    assert changed["ref_after"] == 0 and len(changed["owners"]) == finding.holders
    assert [s["codes"] for s in record["snapshots"]] == [[], [PoolCode.QUEUED_BLOCK_HELD]]
    back = api.diff(bad, clean)
    assert isinstance(back, PoolTimelineReport)
    assert back.steps[0].gone_codes == (PoolCode.QUEUED_BLOCK_HELD,)
    for fmt in ("table", "markdown"):
        shown = runner.invoke(app, ["diff", str(clean), str(bad), "-f", fmt])
        assert shown.exit_code == 1 and f"block {finding.block}: held" in shown.output


def test_a_snapshot_against_itself_changes_nothing(dumps: dict[str, Path]) -> None:
    clean = dumps["vllm-clean"]
    out = runner.invoke(app, ["timeline", str(clean), str(clean), "--format", "json"])
    assert out.exit_code == 0, out.output
    [step] = json.loads(out.output)["steps"]
    counts = [step[k] for k in ("allocated", "freed", "rehomed", "went_bad")]
    assert counts == [0, 0, 0, 0] and step["blocks"] == []


def test_timeline_orders_snapshots_by_step(tmp_path: Path) -> None:
    paths = []
    for step, name in ((9, "vllm-freed-while-held"), (3, "vllm-clean")):
        tensors, meta = build(name, seed=1).contents()
        meta["step"] = str(step)
        paths.append(write_safetensors(tmp_path / f"{step}.st", tensors, meta))
    report = api.timeline(paths)
    assert isinstance(report, PoolTimelineReport)
    assert [s.step for s in report.snapshots] == [3, 9]
    assert report.steps[0].new_codes == (PoolCode.QUEUED_BLOCK_HELD,)


def test_two_pools_or_two_engines_are_one_line(dumps: dict[str, Path], tmp_path: Path) -> None:
    other = runner.invoke(app, ["diff", str(dumps["vllm-clean"]), str(dumps["vllm-hybrid-clean"])])
    assert other.exit_code == 2
    [line] = other.output.splitlines()
    assert "a timeline reads snapshots of one pool" in line
    api.synth("clean-decode", tmp_path / "sglang.st")
    mixed = runner.invoke(app, ["timeline", str(dumps["vllm-clean"]), str(tmp_path / "sglang.st")])
    assert mixed.exit_code == 2
    [line] = mixed.output.splitlines()
    assert "SGLang and block-pool (vLLM) dumps mixed" in line


def test_one_snapshot_is_no_timeline_and_an_sglang_dump_has_no_blocks(
    dumps: dict[str, Path], tmp_path: Path
) -> None:
    """As for SGLang's dumps, a timeline needs two dumps; `--block` on an SGLang dump says it
    is one (it said its engine, sglang, was not one kvcanary reads)."""
    one = runner.invoke(app, ["timeline", str(dumps["vllm-clean"])])
    assert one.exit_code == 2
    assert one.output.splitlines() == ["error: DUMP: give two dumps or more, of one rank"]
    api.synth("clean-decode", tmp_path / "sglang.st")
    block = runner.invoke(app, ["provenance", str(tmp_path / "sglang.st"), "--block", "3"])
    assert block.exit_code == 2
    [line] = block.output.splitlines()
    assert line.startswith(f"error: {tmp_path / 'sglang.st'}: kvcanary.engine: an SGLang dump")
    assert "--slot/--row" in line and "not one kvcanary reads" not in line
