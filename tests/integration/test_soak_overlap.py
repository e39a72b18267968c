"""SGLang's overlapped loop (0.5.22 and 0.5.23) on its real stack (`soak --overlap`,
`soak.driver`): the next batch chosen and allocated before the last batch's result is
processed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.sglang_wheel import WHEEL_VERSION

pytest.importorskip("torch")


def _history(
    sglang: Any,
    history: int,
    layout: str = "swa",
    *,
    hicache: bool = False,
    seed: int = 0,
    page_size: int = 1,
    **kw: Any,
) -> Any:
    """History `history` of soak `seed`'s overlapped histories on `layout`, the Python core
    at `page_size` (its specs counted as the soak counts them for the layout; with the host
    tier: as `soak --overlap --hicache` draws it, one shape)."""
    from kvcanary_cli.soak.command import OVERLAP_RELEASES, history_workload
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec, has_path_cap

    if sglang.tree.version not in OVERLAP_RELEASES:
        pytest.skip(f"the overlapped loop is modelled on {OVERLAP_RELEASES}, not {WHEEL_VERSION}")
    specs = 1 if hicache else {"mamba": 2}.get(layout, 6)
    workload = history_workload(
        seed,
        history,
        specs,
        page_size,
        layout,
        path_cap=has_path_cap(sglang),
        hicache=hicache,
        overlap=True,
    )
    spec = StackSpec.pressured(page_size, "python", layout)
    return run_history(sglang, spec, workload, **kw)


def _clean(result: Any) -> dict[str, int]:
    """A history every state of which the live accounting, the whole `check` and SGLang's
    checks pass; its counters."""
    assert result.failure is None, (result.failure.codes, result.failure.broken)
    assert result.sglang_counts == {}, result.sglang_first
    assert all(v.broken is None and not v.codes for v in result.verdicts)
    assert len(result.verdicts) > result.steps
    counters: dict[str, int] = result.counters.as_dict()
    return counters


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
        for name, count in _clean(_history(sglang, history, mode="both")).items():
            totals[name] = totals.get(name, 0) + count
    assert totals["overlapped"] > 100 and totals["synced"] > 0
    assert totals["finishing_inflight"] > 0 and totals["decode_skips"] > 0
    assert totals["stale_rows"] > 0 and totals["released_ahead"] > 0
    assert totals["overallocated_freed"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["mamba", "mamba-extra"])
def test_overlapped_mamba_histories_are_clean_and_run_both_paths(sglang: Any, layout: str) -> None:
    """The first 100 steps of each Mamba layout's first history overlapped (the extra
    buffer's with two track slots, as SGLang sizes them overlapped), every state audited by
    both sides: all silent.
    The overlapped paths ran (results after the next batch's allocation, requests a decode
    left out for their queued result), and with the extra buffer decode track boundaries
    through the overlapped result's masks (`track_overlapped_decode`)."""
    result = _history(sglang, 0, layout, mode="both", max_steps=100)
    _clean(result)
    counters = result.counters
    assert counters.overlapped > 80 and counters.finishing_inflight > 0, counters
    assert counters.lazy_preallocs == counters.lazy_frees == 0
    if layout == "mamba-extra":
        assert counters.track_boundaries > 0, counters
    else:
        assert counters.track_boundaries == 0


@pytest.mark.slow
def test_an_overlapped_lazy_extra_buffer_history_is_clean(sglang: Any) -> None:
    """SGLang's lazy strategy (`extra_buffer_lazy`, the second history, 120 steps): a second
    track slot is taken for each decode at a track boundary (`mamba_lazy_prealloc_at_boundary`) and
    the slot the request stops tracking in freed by that decode's result
    (`mamba_lazy_post_decode_at_boundary`): every state clean on both sides."""
    result = _history(sglang, 1, "mamba-extra", mode="both", max_steps=120)
    _clean(result)
    counters = result.counters
    assert counters.lazy_preallocs > 5 and counters.lazy_frees > 5, counters
    assert counters.lazy_frees <= counters.lazy_preallocs


@pytest.mark.slow
@pytest.mark.parametrize("history", [0, 1])
def test_a_freed_tree_mamba_slot_is_found_overlapped(sglang: Any, history: int) -> None:
    """A planted free of a Mamba slot the tree still holds is found under the overlapped loop,
    with the extra buffer eager (history 0) and lazy (history 1)."""
    result = _history(sglang, history, "mamba-extra", fault="tree-mamba-slot-freed")
    assert result.fault_acted > 0
    assert result.failure is not None
    assert result.failure.top_cause == "mamba-slot-freed-while-held"


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


@pytest.mark.slow
def test_overlapped_unified_memory_is_clean_and_compacts_at_the_sync_boundary(
    sglang: Any,
) -> None:
    """Unified memory under the overlapped loop (a lazily compacted history whose consecutive
    prefills are synced), every state audited (`both`), SGLang's checks silent: the loop's
    paths ran, and `event_loop_overlap`'s compaction pass after each synced result moved
    live pages, as did the passes at idle."""
    counters = _clean(_history(sglang, 3, layout="unified", mode="both"))
    assert counters["overlapped"] > 30 and counters["synced"] > 0
    assert counters["finishing_inflight"] > 0 and counters["stale_rows"] > 0
    assert counters["released_ahead"] > 0 and counters["overallocated_freed"] == 0
    assert counters["sync_flushes"] == counters["synced"] and counters["sync_flush_moves"] > 0
    assert counters["flushes"] > 0


@pytest.mark.slow
def test_overlapped_host_tier_is_clean_and_loads_back_under_a_batch_in_flight(
    sglang: Any,
) -> None:
    """The host tier under the overlapped loop (two write policies; the second history's
    consecutive prefills synced), every state audited (`both`), SGLang's checks silent: the
    acks polled and load-backs started while the last batch's result was still queued."""
    totals: dict[str, int] = {}
    for history in (1, 2):
        for name, count in _clean(_history(sglang, history, hicache=True, mode="both")).items():
            totals[name] = totals.get(name, 0) + count
    assert totals["overlapped"] > 100 and totals["synced"] > 0
    assert totals["finishing_inflight"] > 0 and totals["decode_skips"] > 0
    assert totals["stale_rows"] > 0 and totals["released_ahead"] > 0
    assert totals["host_loads"] > 0 and totals["sync_flushes"] == 0


def test_the_mamba_host_tier_overlapped_is_clean_and_a_freed_state_is_named(
    sglang: Any,
) -> None:
    """The host tier on the Mamba extra buffer under the overlapped loop (soak's second
    `mamba-extra` history: SGLang's lazy strategy, its boundary slots taken and freed), the
    Mamba states backed up and loaded back while the last batch's result is queued: silent
    on both sides; a tree's Mamba state freed while its node holds it is named."""
    clean = _history(sglang, 1, "mamba-extra", hicache=True)
    assert clean.failure is None and clean.fallbacks == 0, clean.failure
    assert clean.sglang_counts == {}, clean.sglang_first
    counters = clean.counters
    assert counters.overlapped > 100 and counters.host_loads > 0 and counters.lazy_preallocs > 0
    freed = _history(sglang, 0, "mamba-extra", hicache=True, fault="tree-mamba-slot-freed")
    assert freed.failure is not None, "the freed Mamba state was not found"
    assert freed.failure.top_cause == "mamba-slot-freed-while-held"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("layout", "fault", "cause"),
    [
        ("unified", "lock-leak", "tree-lock-leak"),
        ("hicache", "lock-leak", "tree-lock-leak"),
        ("hicache", "host-evict-leak", "host-slot-leak"),
    ],
)
def test_a_planted_fault_is_found_on_unified_memory_and_the_host_tier_overlapped(
    sglang: Any, layout: str, fault: str, cause: str
) -> None:
    """A lock leak on unified memory (soak seed 1's history 2, page size 4: a retraction
    releases without caching) and on the host tier, and a host eviction that forgets its
    host frees (0.5.23 and 0.5.22: the host-slot leak check's releases): each acts and is
    named, the overlapped loop in place."""
    if layout == "unified":
        result = _history(sglang, 2, layout="unified", seed=1, page_size=4, fault=fault)
    else:
        if fault == "host-evict-leak" and sglang.tree.version not in ("0.5.23", "0.5.22"):
            # the capture vouches that only the free lists and the nodes hold host slots on
            # 0.5.23's and 0.5.22's trees alone (`capture.tree._accounted_facts`)
            version = sglang.tree.version
            pytest.skip(f"the host-slot leak check reads SGLang 0.5.23 and 0.5.22, not {version}")
        result = _history(sglang, 0, hicache=True, fault=fault)
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


def _queued_unmapped(scheduler: Any) -> int:
    """At a plan (the next batch allocated, the last one's result queued): how many rows of
    the queued batch, each still held by its request, have a cell its forward writes or reads
    back (`[prefix - window, end)`) that lost its SWA mapping."""
    import numpy as np

    from kvcanary_cli.soak.calls import row_of

    queued, mode = scheduler.inflight
    lut = scheduler.stack.allocator.full_to_swa_index_mapping.numpy()
    table = scheduler.stack.req_to_token_pool.req_to_token.numpy()
    window = scheduler.stack.spec.window
    rows = queued.req_pool_indices.numpy()
    if mode == "extend":
        first = np.asarray(queued.prefix_lens)
        end = first + np.asarray(queued.extend_lens)
    else:
        end = queued.seq_lens_cpu.numpy()
        first = end - 1
    unmapped = 0
    for i, req in enumerate(queued.reqs):
        if req.finished() or req.is_retracted or row_of(req) != rows[i]:
            continue
        cells = table[rows[i], max(int(first[i]) - window, 0) : int(end[i])]
        unmapped += not lut[cells].all()
    return unmapped


@pytest.mark.slow
def test_sglangs_chunk_checkpoint_unmaps_cells_of_the_chunk_in_flight(sglang: Any) -> None:
    """Why no audit holds the queued batch's cells (docs/soak.md, the `swa-overlap` mutants):
    SGLang 0.5.23 frees a chunked request's out-of-window SWA slots at the checkpoint that
    schedules its next chunk (`stash_chunked_request`,
    SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS), while the last chunk is still in
    flight under the overlapped loop: a clean history has cells of a queued prefill its
    request still holds unmapped at a prefill's plan, never at a decode's."""
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.driver import Scheduler, serving_options
    from kvcanary_cli.soak.run import history_stack
    from kvcanary_cli.soak.stack import StackSpec

    if sglang.tree.version != "0.5.23":
        pytest.skip(f"the overlapped loop is modelled on SGLang 0.5.23, not {WHEEL_VERSION}")
    workload = history_workload(0, 0, 6, 1, overlap=True)
    scheduler = Scheduler(
        history_stack(sglang, StackSpec.pressured(1, "python"), workload), workload
    )
    #: per plan with such rows: (the launched batch is a prefill, the queued one's mode)
    seen: list[tuple[bool, str]] = []

    def on_plan(batch: Any) -> None:
        if scheduler.inflight is not None and _queued_unmapped(scheduler):
            seen.append((bool(batch.forward_mode.is_extend()), scheduler.inflight[1]))

    undo = serving_options(workload, sglang.schedule_batch)
    try:
        while not scheduler.done and scheduler.step_no < 200:
            scheduler.step(on_plan)
    finally:
        undo()
    assert seen and all(prefill and mode == "extend" for prefill, mode in seen)
