"""SGLang's overlapped loop (0.5.22 and 0.5.23) on its real stack (`soak --overlap`,
`soak.driver`): the next batch chosen and allocated before the last batch's result is
processed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.sglang_wheel import WHEEL_VERSION

pytest.importorskip("torch")


def _history(sglang: Any, history: int, **kw: Any) -> Any:
    from kvcanary_cli.soak.command import OVERLAP_RELEASES, history_workload
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec

    if sglang.tree.version not in OVERLAP_RELEASES:
        pytest.skip(f"the overlapped loop is modelled on {OVERLAP_RELEASES}, not {WHEEL_VERSION}")
    workload = history_workload(0, history, 6, 1, overlap=True)
    return run_history(sglang, StackSpec.pressured(1, "python"), workload, **kw)


@pytest.mark.slow
def test_overlapped_histories_are_clean_and_run_the_overlapped_paths(sglang: Any) -> None:
    """Two histories (consecutive prefills overlapped, then synced), every state audited by
    the live accounting and the whole `check` (`both`) and SGLang's checks: all silent. The
    paths the overlapped loop adds ran: results processed after the next batch was allocated,
    prefills synced, requests left out of a decode their queued result finishes
    (`_reqs_finishing_inflight`), a decode skipped for memory while they finish, rows a
    result passes over (finished or retracted since launch), and requests released holding
    the slot a decode launched ahead allocated. Nothing is allocated past a request's
    committed length without speculative decoding: release frees no over-allocation."""
    totals: dict[str, int] = {}
    for history in (0, 1):
        result = _history(sglang, history, mode="both")
        assert result.failure is None, (result.failure.codes, result.failure.broken)
        assert result.sglang_counts == {}, result.sglang_first
        assert all(v.broken is None and not v.codes for v in result.verdicts)
        assert len(result.verdicts) > result.steps
        for name, count in result.counters.as_dict().items():
            totals[name] = totals.get(name, 0) + count
    assert totals["overlapped"] > 100 and totals["synced"] > 0
    assert totals["finishing_inflight"] > 0 and totals["decode_skips"] > 0
    assert totals["stale_rows"] > 0 and totals["released_ahead"] > 0
    assert totals["overallocated_freed"] == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "cause"), [("lock-leak", "tree-lock-leak"), ("double-free-group-end", "double-free")]
)
def test_a_planted_fault_is_found_under_the_overlapped_loop(
    sglang: Any, fault: str, cause: str
) -> None:
    result = _history(sglang, 0, fault=fault)
    assert result.fault_acted > 0
    assert result.failure is not None and result.failure.top_cause == cause


def test_the_plan_audit_counts_the_queued_results_requests(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the audit reads the queued result's batch: a request a decode left out because
    that result finishes it still holds its row, KV and prefix lock at plan time. Counted
    without it, the first such state reads as a leak (the fact `check` would break too)."""
    from kvcanary_cli.soak import audit

    original = audit.running_requests

    def without_queued(scheduler: Any, batch: Any) -> list[Any]:
        queued, scheduler.inflight = scheduler.inflight, None
        try:
            return original(scheduler, batch)
        finally:
            scheduler.inflight = queued

    monkeypatch.setattr(audit, "running_requests", without_queued)
    result = _history(sglang, 0, max_steps=40)
    assert result.failure is not None and result.failure.mode == "plan"
    assert "req-row-leaked" in result.failure.codes
    assert result.sglang_counts == {}  # SGLang checks no plan-time state
