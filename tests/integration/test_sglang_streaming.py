"""Streaming sessions (`--enable-streaming-session`) on SGLang 0.5.23's real stack: soak's
swa histories open them, and each keeps its turn's request pool row, its KV past the tree's
part and its prefix lock between turns and through idle steps, an owner that is no running
request. kvcanary stays silent on those histories (before its capture recorded a session's
allocated length and the live audit counted its lock, it called the session's own KV leaked
and its lock leaked), and still names a session that leaks its row on close, or a turn that
frees the session's KV it then reads (bench/mutants.py's `session-close-keeps-row`,
`turn-match-frees-session-kv`; planted here by wrapping SGLang's functions, not by editing
them: the second wraps the trim a finished turn makes too)."""

from __future__ import annotations

from importlib import import_module
from typing import Any

import pytest

#: soak's swa history (seed 0, one shape: page size 1, the Python core) with a streaming turn
#: aborted while it runs, retractions, and a session held through idle steps
_HISTORY = 3


def _soak_history(sglang: Any, **kw: Any) -> Any:
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec

    workload = history_workload(0, _HISTORY, 1, 1, "swa")
    assert workload.streaming_sessions
    return run_history(sglang, StackSpec.pressured(1, "python", "swa"), workload, **kw)


def _sessions() -> Any:
    return import_module("sglang.srt.session.streaming_session").StreamingSession


def test_streaming_sessions_hold_kv_between_turns_and_soak_stays_silent(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = _sessions()
    finished = cls.try_cache_finished_req
    aborted: list[str] = []
    abort = import_module("sglang.srt.managers.schedule_batch").FINISH_ABORT

    def counting(self: Any, req: Any) -> Any:
        if req.session is not None and isinstance(req.finished_reason, abort):
            aborted.append(req.rid)
        return finished(self, req)

    monkeypatch.setattr(cls, "try_cache_finished_req", counting)
    clean = _soak_history(sglang)
    assert clean.counters.sessions_closed == 4 and clean.counters.session_idles > 0
    assert aborted, "no streaming turn was aborted"
    assert clean.failure is None and clean.sglang_counts == {}
    assert clean.fallbacks == 0


def test_a_session_closed_without_giving_its_row_back_is_named(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = _sessions()
    release = cls.release_session

    def keeps_row(self: Any, session_id: str) -> None:
        pool = self.cache.req_to_token_pool
        pool.free = lambda holder: setattr(holder.kv, "req_pool_idx", None)  # never freed
        try:
            release(self, session_id)
        finally:
            del pool.free

    monkeypatch.setattr(cls, "release_session", keeps_row)
    leaked = _soak_history(sglang)
    assert leaked.failure is not None and "req-row-leaked" in leaked.failure.codes


def test_a_turn_that_frees_the_sessions_kv_it_then_reads_is_named(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = _sessions()
    free = cls._free_kv_aligned

    def from_the_tree_part(self: Any, kv: Any, target: int, end: int) -> None:
        free(self, kv, min(target, kv.cache_protected_len), end)  # the session's KV too

    monkeypatch.setattr(cls, "_free_kv_aligned", from_the_tree_part)
    used = _soak_history(sglang)
    assert used.failure is not None, "the freed session KV was not found"
    assert "full-slot-free-and-held" in used.failure.codes, used.failure.codes
