"""A vLLM soak with --fault says whether the fault acted, in the table and Markdown views: a
clean soak whose fault never found its place proves nothing, and a fault that acted unseen is
kvcanary's miss; neither may read as a bare "clean"."""

from __future__ import annotations

import pytest

from kvcanary_cli.render import OutputFormat, render
from kvcanary_cli.results.pool import PoolFinding
from kvcanary_cli.results.pool_soak import PoolSoakHistory, PoolSoakReport

_FOUND = PoolFinding(code="free-list-duplicate", message="block 7 queued twice", block=7)  # type: ignore[arg-type]


def _history(planted: bool, found: bool) -> PoolSoakHistory:
    return PoolSoakHistory(
        model="full",
        seed=1,
        steps=100,
        audited=100,
        preemptions=0,
        prefix_hits=0,
        aborts=0,
        fault_step=40 if planted else None,
        fault_note="block 7 freed twice" if planted else None,
        finding_step=40 if found else None,
        findings=(_FOUND,) if found else (),
        engine_said=None,
    )


def _report(fault: str | None, *histories: PoolSoakHistory) -> PoolSoakReport:
    return PoolSoakReport(
        engine="vllm", engine_version="0.34.0", steps=200, seed=0, fault=fault, histories=histories
    )


@pytest.mark.parametrize(
    ("histories", "said"),
    [
        ((_history(False, False), _history(False, False)), "block-freed-twice never acted"),
        (
            (_history(True, False), _history(False, False)),
            "block-freed-twice acted in 1 of 2 histories; kvcanary found nothing",
        ),
        ((_history(True, True),), "block-freed-twice acted in 1 of 1 history\n"),
    ],
    ids=["never-acted", "acted-unseen", "acted-found"],
)
@pytest.mark.parametrize("fmt", [OutputFormat.TABLE, OutputFormat.MARKDOWN])
def test_a_planted_fault_says_whether_it_acted(
    histories: tuple[PoolSoakHistory, ...], said: str, fmt: OutputFormat
) -> None:
    shown = str(render(_report("block-freed-twice", *histories), fmt)) + "\n"
    assert said in shown


def test_without_a_fault_nothing_is_said_of_one() -> None:
    for fmt in (OutputFormat.TABLE, OutputFormat.MARKDOWN):
        assert "planted fault" not in str(render(_report(None, _history(False, False)), fmt))
