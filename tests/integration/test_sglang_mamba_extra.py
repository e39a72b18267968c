"""SGLang 0.5.23's hybrid Mamba layout with its extra buffer (`--mamba-radix-cache-strategy
extra_buffer`, soak's `--layout mamba-extra`) on CPU: each running request holds ping-pong
track slots (`HybridReqToTokenPool._alloc_ping_pong_buffer`), a chunk's checkpoint donates the
latest one to the tree and takes a fresh one (`donate_mamba_ping_pong_slot`), a finish hands
the tree the slot it keeps and frees the rest (`free_mamba_cache(req, keep)`), at page sizes
above 1 too. A correct history checks clean, SGLang silent; each planted fault of the track
slots is named by kvcanary (slots never freed, a kept slot freed while the tree holds it, a
donated slot not replaced, the row's track map left stale), each beside the clean twin.
"""

from __future__ import annotations

from collections import Counter
from importlib import import_module
from typing import Any

import pytest

torch = pytest.importorskip("torch")


def _history(sglang: Any, page_size: int, history: int = 0, **kw: Any) -> Any:
    """The `history`-th history of `soak --layout mamba-extra --core python --seed 0
    --page-size N`."""
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec, has_path_cap

    workload = history_workload(
        0, history, 1, page_size, "mamba-extra", path_cap=has_path_cap(sglang)
    )
    spec = StackSpec.pressured(page_size, "python", "mamba-extra")
    return run_history(sglang, spec, workload, **kw)


def _pool() -> Any:
    return import_module("sglang.srt.mem_cache.memory_pool").HybridReqToTokenPool


@pytest.mark.parametrize("page_size", [1, 4])
def test_clean_extra_buffer_history(
    sglang: Any, monkeypatch: pytest.MonkeyPatch, page_size: int
) -> None:
    """Every audited state of a correct history: the live accounting and the whole `check`
    agree it is clean, SGLang's checks are silent, and the extra buffer's calls all ran
    (track buffers allocated, slots donated at checkpoints, a slot kept at a finish)."""
    pool = _pool()
    calls: Counter[str] = Counter()
    for name in ("_alloc_ping_pong_buffer", "donate_mamba_ping_pong_slot", "free_mamba_cache"):
        original = getattr(pool, name)

        def counted(self: Any, *args: Any, _name: str = name, _f: Any = original, **kw: Any) -> Any:
            keep = kw.get("mamba_ping_pong_track_buffer_to_keep")
            calls[_name + ("-keep" if keep is not None else "")] += 1
            return _f(self, *args, **kw)

        monkeypatch.setattr(pool, name, counted)
    result = _history(sglang, page_size, max_steps=80, mode="both")
    assert result.failure is None, (result.failure.step, result.failure.codes)
    assert result.sglang_counts == {}, result.sglang_first
    assert result.verdicts and all(v.broken is None and not v.codes for v in result.verdicts)
    assert result.counters.track_boundaries > 0, result.counters
    for name in ("_alloc_ping_pong_buffer", "donate_mamba_ping_pong_slot", "free_mamba_cache-keep"):
        assert calls[name] > 0, calls


def _first(sglang: Any, page_size: int = 1) -> Any:
    result = _history(sglang, page_size, max_steps=120)
    assert result.failure is not None, "the planted fault was not found"
    return result


def test_track_slots_never_freed_are_named(sglang: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A release that frees the working slot but drops the request's track slots (bench's
    `mamba-track-slots-not-freed`): named as leaked at the step of the first finish."""
    pool = _pool()
    free = pool.free_mamba_cache

    def dropping(self: Any, req: Any, *args: Any, **kw: Any) -> Any:
        self.enable_mamba_extra_buffer = False
        try:
            free(self, req)  # the working slot only
        finally:
            self.enable_mamba_extra_buffer = True
        req.kv.mamba_ping_pong_track_buffer = None

    monkeypatch.setattr(pool, "free_mamba_cache", dropping)
    assert "mamba-slot-leaked" in _first(sglang).failure.codes


def test_a_kept_track_slot_freed_is_named(sglang: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A finish that frees every track slot, the one it just handed the tree too (bench's
    `mamba-track-kept-slot-freed`): the slot is free and the tree's, named so."""
    pool = _pool()
    free = pool.free_mamba_cache

    def freeing_all(self: Any, req: Any, *args: Any, **kw: Any) -> Any:
        return free(self, req)

    monkeypatch.setattr(pool, "free_mamba_cache", freeing_all)
    assert "mamba-slot-free-and-held" in _first(sglang, 4).failure.codes


def test_a_donated_slot_not_replaced_is_named(sglang: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint that hands the tree the request's track slot and leaves it in the request's
    buffer (bench's `mamba-donated-slot-not-replaced`): one slot, two owners (or, where the
    node already held a state, the tree's insert frees it while the request tracks in it),
    and the fresh slot taken for it leaks."""

    def not_replacing(self: Any, req: Any, new_slot: Any) -> Any:
        keep = self.get_mamba_ping_pong_keep_idx(req)
        return req.kv.mamba_ping_pong_track_buffer[keep].unsqueeze(-1).clone()

    monkeypatch.setattr(_pool(), "donate_mamba_ping_pong_slot", not_replacing)
    codes = set(_first(sglang).failure.codes)
    assert "mamba-slot-leaked" in codes, codes
    assert codes & {"mamba-slot-owned-twice", "mamba-slot-free-and-held"}, codes


def test_a_stale_track_map_is_named_at_the_donation(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A donation that replaces the track slot in the request but leaves the row's track map
    naming the donated one (bench's `mamba-track-map-not-synced`): the forward would write the
    tracked state into the tree's checkpoint. kvcanary names the stale map at the donation;
    the slot accounting alone sees it only at the finish, which frees from the map (the tree's
    slot freed, the request's own leaked)."""
    pool = _pool()
    set_slot = pool.set_mamba_ping_pong_slot

    def not_syncing(self: Any, req: Any, idx: int, value: Any) -> Any:
        mapping = self.req_index_to_mamba_ping_pong_track_buffer_mapping
        row = req.kv.req_pool_idx
        before = mapping[row].clone()
        set_slot(self, req, idx, value)
        mapping[row] = before

    monkeypatch.setattr(pool, "set_mamba_ping_pong_slot", not_syncing)
    result = _first(sglang)
    assert result.failure.codes == ["mamba-row-map-mismatch"], result.failure.codes
