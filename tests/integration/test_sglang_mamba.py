"""SGLang 0.5.23's hybrid Mamba layout (`HybridReqToTokenPool` with its `MambaPool` and
`MambaSlotAllocator`, `UnifiedRadixCache(FULL, MAMBA)`) on CPU, driven by kvcanary's soak
scheduler: kvcanary's capture records each audited state from the real objects (the row map,
the Mamba free list, the tree's and every live request's Mamba slots, waiting requests'
copy-on-write slots included), a correct state checks clean with SGLang's own checks silent,
and a tree-held Mamba slot pushed onto the free list is named at the next audit, while SGLang's
busy check, which has no Mamba check, says nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvcanary_cli.results.check import DumpReport

torch = pytest.importorskip("torch")


def _run(sglang: Any, seed: int, steps: int, **kw: Any) -> Any:
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec
    from kvcanary_cli.soak.workload import random_workload

    workload = random_workload(seed, steps=steps, requests=steps // 4, max_prompt=60, max_new=20)
    return run_history(sglang, StackSpec.pressured(1, "python", "mamba"), workload, **kw)


def test_clean_mamba_history(sglang: Any) -> None:
    """Every audited state of a correct history: the live accounting and the whole `check` of
    its recorded dump agree that it is clean, and SGLang's checks are silent."""
    result = _run(sglang, 100, 40, mode="both")
    assert result.failure is None, (result.failure.step, result.failure.codes)
    assert result.sglang_counts == {}, result.sglang_first
    assert result.verdicts and all(v.broken is None and not v.codes for v in result.verdicts)
    assert result.counters.finishes > 0 and result.counters.decodes > 0


def test_capture_records_the_mamba_layout(sglang: Any, tmp_path: Path) -> None:
    """The dump capture writes from the real objects names the layout and carries the Mamba
    records, so both Mamba families run on it (and the SWA ones do not apply)."""
    from kvcanary_cli.api import check

    result = _run(sglang, 100, 20, folder=tmp_path)
    assert result.failure is None
    report = check([tmp_path / "state.safetensors"], kernel="none").dumps[0]
    assert isinstance(report, DumpReport) and report.error is None and report.findings == ()
    status = {c.check: c.status for c in report.coverage}
    assert status["Mamba slots"] == status["Mamba slot leaks"] == "ran", status
    assert status["SWA LUT"] == "not-applicable"


def test_tree_mamba_slot_freed_is_named(sglang: Any) -> None:
    """A Mamba slot the tree holds pushed onto the Mamba free list (the node keeping it):
    named at the next audit with its cause in SGLang's words; SGLang's checks silent there."""
    result = _run(sglang, 100, 40, fault="tree-mamba-slot-freed")
    failure = result.failure
    assert failure is not None, "the planted fault was not found"
    assert failure.codes == ["mamba-slot-free-and-held"], failure.codes
    assert failure.top_cause == "mamba-slot-freed-while-held"
    assert failure.mode == "plan" and failure.sglang == [] and failure.crash is None
