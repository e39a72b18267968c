"""`timeline` on snapshots of vLLM 0.33.0's real `KVCacheManager`, one per step of the soak's
workload: on a correct history every step's counts agree with the free queue's own change
(blocks freed minus blocks allocated), nothing goes bad and no snapshot has a finding; a block
freed while two requests hold it goes bad at the step it was planted, named with its holders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvcanary_cli import api
from kvcanary_cli.catalog import PoolCode
from kvcanary_cli.dump.atomic import write_safetensors
from kvcanary_cli.results.pool import PoolDumpReport
from kvcanary_cli.results.pool_timeline import PoolTimelineReport
from kvcanary_cli.soak.vllm_driver import FAULTS, _Scheduler


def _snapshots(vllm: Any, folder: Path, steps: int, fault: str | None = None) -> list[Path]:
    s = _Scheduler(vllm, "hybrid", 3)
    paths = []
    for step in range(steps):
        s.run_step()
        if fault is not None and step == steps - 2:
            assert FAULTS[fault](s) is not None
        tensors, meta = s.state().contents()
        meta["step"] = str(step)
        paths.append(write_safetensors(folder / f"{step}.st", tensors, meta))
    return paths


def test_a_correct_history_adds_up_step_by_step(vllm: Any, tmp_path: Path) -> None:
    paths = _snapshots(vllm, tmp_path, 40)
    report = api.timeline(list(reversed(paths)))  # ordered by step, not as given
    assert isinstance(report, PoolTimelineReport)
    assert [s.step for s in report.snapshots] == list(range(40))
    assert not report.failed
    moved = 0
    dumps = [api.check(p).dumps[0] for p in paths]
    queues = [d.queue_length for d in dumps if isinstance(d, PoolDumpReport)]
    assert len(queues) == len(paths)
    for step in report.steps:
        assert step.went_bad == 0 and step.new_codes == ()
        assert step.freed - step.allocated == queues[step.after] - queues[step.before]
        moved += step.allocated + step.freed
    assert moved > 0


def test_a_block_freed_while_held_goes_bad_at_its_step(vllm: Any, tmp_path: Path) -> None:
    paths = _snapshots(vllm, tmp_path, 40, fault="block-freed-while-held")
    report = api.timeline(paths)
    assert isinstance(report, PoolTimelineReport)
    bad = [step for step in report.steps if step.went_bad]
    assert bad[0].after == 38  # (later steps may show it leave the fault: handed out again)
    assert PoolCode.QUEUED_BLOCK_HELD in bad[0].new_codes
    first = bad[0].blocks[0]
    assert first.after == "free-and-held" and len(first.owners) >= 2
