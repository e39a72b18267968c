"""The live audit (soak.live) against the whole `check`, on SGLang 0.5.23's real stack: on
every audited state of a few histories, clean and with each planted fault, the live audit's
findings are `check`'s (it passes a state only where `check` finds nothing; where a fact
breaks, its findings are `check`'s own). The comparison is shown to catch a live rule made
too lenient. Skipped without the wheel (see conftest)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

#: (page size, core, fault): each fault where it shows, and clean twins of every page size
HISTORIES = [
    (1, "python", None),
    pytest.param(4, "rust", None, marks=pytest.mark.slow),
    pytest.param(16, "python", None, marks=pytest.mark.slow),
    (1, "rust", "unmapped-representative"),
    (4, "python", "double-free-group-end"),
    (16, "rust", "shared-boundary-page"),
]


def _history(sglang: Any, page_size: int, core: str, fault: str | None, mode: str) -> Any:
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec
    from kvcanary_cli.soak.workload import random_workload

    if core not in sglang.cores:
        pytest.skip(f"no {core} tree core in this SGLang")
    workload = random_workload(11, steps=40, requests=10, max_prompt=60, max_new=20)
    spec = StackSpec.pressured(page_size, core)
    return run_history(sglang, spec, workload, fault=fault, mode=mode)  # type: ignore[arg-type]


def _differences(result: Any) -> list[Any]:
    """The audited states where the live audit's findings are not `check`'s: it passed a
    state `check` flags (where a fact breaks, the audit's findings are `check`'s own)."""
    return [v for v in result.verdicts if v.broken is None and v.codes]


@pytest.mark.parametrize(("page_size", "core", "fault"), HISTORIES)
def test_live_audit_finds_what_check_finds(
    sglang: Any, page_size: int, core: str, fault: str | None
) -> None:
    result = _history(sglang, page_size, core, fault, "both")
    assert result.verdicts and _differences(result) == []
    if fault is None:
        assert result.failure is None and result.fallbacks == 0
    else:
        # the fault is found, and a fact broke where check flagged it
        assert result.failure is not None and result.failure.broken is not None
    live = _history(sglang, page_size, core, fault, "live")
    assert (live.steps, live.audited) == (result.steps, result.audited)
    if fault is None:
        assert live.failure is None and live.checked == 0  # no dump, no whole check
    else:
        seen, full = live.failure, result.failure
        assert seen is not None and full is not None
        assert (seen.step, seen.mode, seen.codes, seen.top_cause) == (
            full.step,
            full.mode,
            full.codes,
            full.top_cause,
        )


def test_the_comparison_catches_a_lenient_rule(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live audit that reads the full free list as a set (a slot freed twice counted
    once) misses the double free: the comparison names the states where it differs from
    `check`."""
    from dataclasses import replace

    import numpy as np

    from kvcanary_cli.soak.live import LiveAudit

    original = LiveAudit._full

    def lenient(self: LiveAudit, state: Any, idle: bool) -> str | None:
        return original(self, replace(state, free_full=np.unique(state.free_full)), idle)

    monkeypatch.setattr(LiveAudit, "_full", lenient)
    result = _history(sglang, 4, "python", "double-free-group-end", "both")
    missed = _differences(result)
    assert missed and "free-list-duplicate" in missed[0].codes
