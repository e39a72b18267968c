"""Radix sessions (`--enable-session-radix-cache`) on SGLang 0.5.23's real stack: soak's swa
histories under `--session-radix-cache` open client sessions whose finished turns tag the tree
nodes their inserts ended on, and closing a session drops its tags, under soak's loop and
SGLang's overlapped one. A tag holds no row, no
lock and no KV outside the tree (the tagged node is the tree's, evicted last), so kvcanary
counts nothing of its own for it and stays silent. It still names a close that frees the KV
of a leaf it alone tagged while the node keeps it, and a tag that locks its path (bench/
mutants.py's `radix-close-frees-kv`, `radix-tag-takes-lock`; planted here by wrapping SGLang's
functions, not by editing them)."""

from __future__ import annotations

from importlib import import_module
from types import SimpleNamespace
from typing import Any

import pytest

#: soak's swa history under radix sessions (seed 0, one shape: page size 1, the Python core):
#: its 4 sessions each close with tags, and idle steps meet a session's tags
_HISTORY = 0


def _soak_history(sglang: Any, *, overlap: bool = False, **kw: Any) -> Any:
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec

    workload = history_workload(0, _HISTORY, 1, 1, "swa", radix=True, overlap=overlap)
    assert workload.radix_sessions and not workload.streaming_sessions
    return run_history(sglang, StackSpec.pressured(1, "python", "swa"), workload, **kw)


def _tracker() -> Any:
    module = import_module("sglang.srt.mem_cache.unified_cache.session_ref_tracker")
    return module.UnifiedSessionRefTracker


def _full() -> Any:
    return import_module("sglang.srt.mem_cache.unified_cache.components.full").FullComponent


@pytest.mark.parametrize("overlap", [False, True], ids=["normal-loop", "overlapped-loop"])
def test_radix_sessions_tag_the_tree_and_soak_stays_silent(
    sglang: Any, monkeypatch: pytest.MonkeyPatch, overlap: bool
) -> None:
    """As a server runs them, under soak's loop or SGLang's overlapped one (`--overlap`:
    the turn a close meets may be finished by a result still queued)."""
    from kvcanary_cli.capture.tree import radix_session_leaves

    cls = _tracker()
    release = cls.release_radix_session
    tagged_at_close: list[int] = []

    def counting(self: Any, session_id: str) -> Any:
        tree = SimpleNamespace(session_refs=self)  # the tree's tracker, read as the tree's
        tagged_at_close.append(radix_session_leaves(tree).get(session_id, 0))
        return release(self, session_id)

    monkeypatch.setattr(cls, "release_radix_session", counting)
    clean = _soak_history(sglang, overlap=overlap)
    assert clean.failure is None and clean.sglang_counts == {}
    assert (clean.counters.overlapped > 0) == overlap
    assert clean.counters.sessions_closed == 4 and clean.counters.session_idles > 0
    # each session closed with tags (the scheduler's close, then the controller's: a no-op)
    assert sum(1 for n in tagged_at_close if n > 0) == 4


def test_a_close_that_frees_a_tagged_leafs_kv_in_the_tree_is_named(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = _full()
    dec = cls._dec_session_coverage

    def freeing(self: Any, session_id: str, leaf: Any) -> None:
        data = leaf.component_data[self.component_type]
        if data.session_ref == 1 and data.lock_ref == 0 and not leaf.children:
            self._full_allocator().free_segment(data.value, start_pos=0)  # the node keeps it
        dec(self, session_id, leaf)

    monkeypatch.setattr(cls, "_dec_session_coverage", freeing)
    used = _soak_history(sglang)
    assert used.failure is not None, "the freed tagged KV was not found"
    assert used.failure.top_cause in ("use-after-free", "double-free"), used.failure.codes


def test_a_tag_that_locks_its_path_is_named(sglang: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    cls = _full()
    advance = cls._advance_session_coverage

    def locking(self: Any, session_id: str, leaf: Any, old_ancestor: Any) -> None:
        advance(self, session_id, leaf, old_ancestor)
        leaf.component_data[self.component_type].lock_ref += 1  # no request holds it

    monkeypatch.setattr(cls, "_advance_session_coverage", locking)
    locked = _soak_history(sglang)
    assert locked.failure is not None, "the session's lock was not found"
    assert "tree-lock-leaked" in locked.failure.codes, locked.failure.codes
