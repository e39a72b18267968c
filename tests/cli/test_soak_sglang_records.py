"""A reproducer may record a complaint of SGLang's own check alone (`sglang_check`, kvcanary
silent): SGLang 0.5.19's busy check over a parked chunk ships as one (docs/soak.md); 0.5.21's
unified allocator evicting short of its plan ships as SGLang's crash. Its replay
came back where that check complains again with kvcanary silent, and says so; where the
check stays silent, or something else fails, it did not."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvcanary_cli.errors import PathError
from kvcanary_cli.results.soak import SGLangCheck, SGLangMessage, SoakReplay, SoakReport
from kvcanary_cli.soak.command import _came_back, read_reproducer

ROOT = Path(__file__).resolve().parents[2]
PARKED_CHUNK = ROOT / "docs" / "reproducers" / "sglang-0.5.19-busy-check-parked-chunk.json"
EVICT_SHORT = ROOT / "docs" / "reproducers" / "sglang-0.5.21-unified-evict-short-oom.json"
BUSY = "self_check_during_busy"


def test_the_shipped_record_reads_as_sglangs_busy_check_on_its_release() -> None:
    shipped = read_reproducer(PARKED_CHUNK)
    assert (shipped.recorded, shipped.release, shipped.fault, shipped.tp) == (
        f"sglang {BUSY}",
        "0.5.19",
        None,
        1,
    )
    assert shipped.workload.streaming_sessions and shipped.spec.layout == "swa"


def test_the_shipped_unified_record_reads_as_sglangs_crash_without_sessions() -> None:
    """0.5.21's allocation eviction short of its plan ships as a crash of SGLang's on unified
    memory, with no session in its workload: sessions are not what it needs."""
    shipped = read_reproducer(EVICT_SHORT)
    assert (shipped.recorded, shipped.release, shipped.fault, shipped.tp) == (
        "crash RuntimeError",
        "0.5.21",
        None,
        1,
    )
    assert shipped.spec.layout == "unified"
    assert all(a.session is None for a in shipped.workload.arrivals)
    assert not (shipped.workload.streaming_sessions or shipped.workload.radix_sessions)


def _body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(PARKED_CHUNK.read_text())
    body.update(changes)
    return body


@pytest.mark.parametrize(
    ("changes", "recorded"),
    [
        ({"sglang_check": "no_such_check"}, None),  # a check soak never runs
        ({"sglang_check": None}, None),
        ({"top_cause": "double-free"}, "double-free"),  # kvcanary's finding first
        ({"crash": {"exception": "RuntimeError"}}, "crash RuntimeError"),
    ],
)
def test_a_check_record_is_one_of_the_checks_soak_runs(
    tmp_path: Path, changes: dict[str, Any], recorded: str | None
) -> None:
    path = tmp_path / "soak-reproducer.json"
    path.write_text(json.dumps(_body(**changes)))
    if recorded is None:
        with pytest.raises(PathError, match="out of range"):
            read_reproducer(path)
    else:
        assert read_reproducer(path)[3] == recorded


def _result(failure: str | None, said: tuple[str, ...]) -> Any:
    failed = None if failure is None else SimpleNamespace(key=failure)
    return SimpleNamespace(failure=failed, sglang_counts=dict.fromkeys(said, 1))


@pytest.mark.parametrize(
    ("recorded", "failure", "said", "back"),
    [
        (f"sglang {BUSY}", None, (BUSY,), True),
        (f"sglang {BUSY}", None, (), False),
        (f"sglang {BUSY}", None, ("sanity_check",), False),
        (f"sglang {BUSY}", "tree-lock-leak", (BUSY,), False),  # kvcanary not silent
        ("double-free", "double-free", (BUSY,), True),
        ("double-free", None, (BUSY,), False),
    ],
)
def test_a_replay_came_back_as_recorded(
    recorded: str, failure: str | None, said: tuple[str, ...], back: bool
) -> None:
    assert _came_back(recorded, _result(failure, said)) is back


@pytest.mark.parametrize(
    ("said", "line"),
    [
        ((), "did not come back: SGLang's checks silent"),
        (("sanity_check",), "did not come back: another failure instead"),
        ((BUSY,), "came back"),
    ],
)
def test_the_replay_line_says_why_a_check_record_did_not_come_back(
    said: tuple[str, ...], line: str
) -> None:
    from kvcanary_cli.render.table.soak import replay_line

    first = SGLangMessage(
        seed=3, page_size=1, core="python", step=35, when="after-result", message="x"
    )
    checks = tuple(
        SGLangCheck(check=c, steps=1, histories=1, first=(first,))  # type: ignore[arg-type]
        for c in said
    )
    report = _report(
        sglang_version="0.5.19",
        sglang_checks=checks,
        replay=SoakReplay(
            reproducer="r.json", recorded=f"sglang {BUSY}", reproduced=said == (BUSY,)
        ),
    )
    assert replay_line(report) == f"replayed r.json: its finding (sglang {BUSY}) {line}"


@pytest.mark.parametrize(
    ("tp", "overlap", "tail"),
    [
        (1, False, "80 audited"),
        (2, False, "80 audited on 2 tensor-parallel ranks, compared"),
        (1, True, "80 audited, SGLang's overlapped loop"),
    ],
)
def test_the_ran_line_says_which_ranks_and_loop_the_histories_ran(
    tp: int, overlap: bool, tail: str
) -> None:
    from kvcanary_cli.render.table.soak import ran_line

    report = _report(sglang_version="0.5.23", tp=tp, overlap=overlap)
    assert ran_line(report) == f"seed 3, 1 history, 80 of 80 steps, {tail}"


def _report(**given: Any) -> SoakReport:
    """A soak report of one 80-step history at seed 3, with `given` on top."""
    plain: dict[str, Any] = {
        "kvcanary_version": "0",
        "sglang_root": "/",
        "seed": 3,
        "budget": 80,
        "histories": 1,
        "steps": 80,
        "audited_steps": 80,
    }
    return SoakReport(**{**plain, **given})
