"""soak.calls: each release difference soak adapts to is read from what the objects have, in
both shapes (0.5.22 on, and 0.5.21), on stand-in requests and functions."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kvcanary_cli.soak.calls import (
    abort_finisher,
    checkpointer,
    exclude_keyword,
    extend_end,
    held_lock,
    prefix_len,
    release_keyword,
    releaser,
    retract_arguments,
    root_of,
    row_of,
    skipped_components,
    swa_boundary,
    track_decode_boundary,
    tree_unlock_name,
)


def _older_req(**kw: Any) -> SimpleNamespace:
    fields = {
        "prefix_indices": [7, 8, 9],
        "extend_range": SimpleNamespace(start=3, end=11),
        "lock_receipt": SimpleNamespace(node_id=None),
        "last_node": None,
        "swa_prefix_lock_released": False,
    }
    return SimpleNamespace(**{**fields, **kw})


def test_prefix_and_extend_end_in_both_shapes() -> None:
    assert (
        prefix_len(SimpleNamespace(prefix_len=5)),
        extend_end(SimpleNamespace(extend_end=9)),
    ) == (5, 9)
    assert (prefix_len(_older_req()), extend_end(_older_req())) == (3, 11)
    assert extend_end(_older_req(extend_range=None)) is None


def test_held_lock_in_both_shapes() -> None:
    lock = SimpleNamespace(node=4, receipt="r", swa_released=True)
    held = held_lock(SimpleNamespace(lock=lock))
    assert held is not None and (held.node, held.receipt, held.swa_released) == (4, "r", True)
    assert held.identity is lock
    assert held_lock(SimpleNamespace(lock=None)) is None
    # 0.5.21: the receipt on last_node; a receipt without a node holds nothing
    assert held_lock(_older_req(last_node=4)) is None
    receipt = SimpleNamespace(node_id=4)
    older = held_lock(_older_req(last_node=4, lock_receipt=receipt, swa_prefix_lock_released=True))
    assert older is not None and (older.node, older.swa_released) == (4, True)
    assert older.receipt is receipt and older.identity is receipt


def test_a_lock_kept_on_the_request_itself() -> None:
    """0.5.17 - 0.5.19: no receipt; the anchor, SWA boundary and the nodes left unlocked are
    the request's own fields (a new `skip_lock_node_ids` dict with each lock)."""
    skipped = {"SWA": {5}}
    req = SimpleNamespace(
        last_node=4, swa_uuid_for_lock=9, skip_lock_node_ids=skipped, swa_prefix_lock_released=0
    )
    held = held_lock(req)
    assert held is not None and (held.node, held.swa_released) == (4, False)
    assert held.unlocked is skipped and held.identity is skipped
    assert swa_boundary(held.receipt, "SWA") == 9 and skipped_components(held) == ()
    req.last_node = None
    assert held_lock(req) is None
    # a receipt's whole components, where locks count tombstones (0.5.20 on)
    lock = SimpleNamespace(node=4, receipt=SimpleNamespace(skipped_lock_components=["M"]))
    newer = held_lock(SimpleNamespace(lock=SimpleNamespace(**vars(lock), swa_released=False)))
    assert newer is not None and newer.unlocked is None and skipped_components(newer) == ("M",)


def test_a_lock_whose_skips_are_not_kept() -> None:
    """0.5.13 - 0.5.16: the request keeps its anchor node and SWA boundary, not the nodes its
    lock skipped: it skipped tombstones (`unlocked` names none), and the request stands for
    the lock; the lock is dropped by `dec_lock_ref` on the node, the root is the node itself;
    the extend ends at `fill_len` (0.5.13 - 0.5.14: no `extend_range`)."""
    node = SimpleNamespace(id=4)
    req = SimpleNamespace(last_node=node, swa_uuid_for_lock=9, swa_prefix_lock_released=1)
    held = held_lock(req)
    assert held is not None and (held.node, held.swa_released) == (node, True)
    assert held.unlocked == {} and held.identity is req
    assert swa_boundary(held.receipt, "SWA") == 9 and skipped_components(held) == ()

    class Tree:
        root_node = node

        def dec_lock_ref(self, node: Any) -> None: ...

    assert tree_unlock_name(Tree()) == "dec_lock_ref" and root_of(Tree()) is node
    assert root_of(SimpleNamespace(root_node_handle=lambda: 0, root_node=node)) == 0
    assert extend_end(SimpleNamespace(fill_len=12)) == 12
    assert extend_end(SimpleNamespace(fill_len=0)) is None


def test_the_row_a_request_holds_in_both_shapes() -> None:
    """`req.kv` names the row (0.5.19 on), or holds only lengths, None once released, and the
    row is the request's (0.5.17 - 0.5.18)."""
    assert row_of(SimpleNamespace(kv=SimpleNamespace(req_pool_idx=3))) == 3
    assert row_of(SimpleNamespace(kv=SimpleNamespace(req_pool_idx=None))) is None
    lengths = SimpleNamespace(kv_allocated_len=7, swa_evicted_seqlen=0)
    assert row_of(SimpleNamespace(kv=lengths, req_pool_idx=5)) == 5
    assert row_of(SimpleNamespace(kv=None, req_pool_idx=None)) is None


def test_retraction_and_abort_calls_in_both_shapes() -> None:
    def newer(self: Any) -> None: ...
    def older(self: Any, server_args: Any) -> None: ...

    assert retract_arguments(newer, "args") == ()
    assert retract_arguments(older, "args") == ("args",)
    calls: list[tuple[Any, ...]] = []

    class Finishing:
        def finish(self, handle: Any, outcome: Any) -> None:
            calls.append(("finish", handle, outcome))

    class Releasing:
        def release_aborted_request(self, rid: Any) -> None:
            calls.append(("release", rid))

    req = SimpleNamespace(rid="r1", cache_request_handle="h1")
    base = SimpleNamespace(CacheRequestOutcome=SimpleNamespace(ABORT="abort"))
    abort_finisher(Finishing(), base)(req)
    abort_finisher(Releasing(), SimpleNamespace())(req)  # 0.5.19: no outcomes, by rid
    assert calls == [("finish", "h1", "abort"), ("release", "r1")]


def test_checkpoint_and_release_calls_in_both_shapes() -> None:
    calls: list[tuple[Any, ...]] = []

    def checkpoint_kv_cache(req: Any, tree: Any) -> None:
        calls.append(("checkpoint", req, tree))

    def maybe_cache_unfinished_req(req: Any, tree: Any, **kw: Any) -> None:
        calls.append(("cache_unfinished", req, tree, kw))

    def release_new(req: Any, tree: Any, *, checkpoint: bool) -> None:
        calls.append(("release", checkpoint))

    def release_old(req: Any, tree: Any, is_insert: bool = True) -> None:
        calls.append(("release_old", is_insert))

    newer = SimpleNamespace(checkpoint_kv_cache=checkpoint_kv_cache, release_kv_cache=release_new)
    older = SimpleNamespace(
        maybe_cache_unfinished_req=maybe_cache_unfinished_req, release_kv_cache=release_old
    )
    checkpointer(newer)("q", "t", True)
    checkpointer(older)("q", "t", True)
    checkpointer(older)("q", "t", False)
    releaser(newer, object())("q", "t", False)
    releaser(older, object())("q", "t", False)
    assert calls == [
        ("checkpoint", "q", "t"),
        ("cache_unfinished", "q", "t", {"chunked": True}),
        ("cache_unfinished", "q", "t", {}),
        ("release", False),
        ("release_old", False),
    ]


def test_a_wrapped_release_takes_the_keyword_the_trees_insert_names() -> None:
    """A wrapper taking any keyword (a test's, a fault's): the tree says which release it is."""

    def wrapper(req: Any, tree: Any, **kw: Any) -> None: ...

    class Newer:
        def checkpoint(self, req: Any, up_to: int) -> None: ...

    class Older:
        def insert_req(self, req: Any, up_to: int) -> None: ...

    assert release_keyword(wrapper, Newer()) == "checkpoint"
    assert release_keyword(wrapper, Older()) == "is_insert"


def test_filter_and_unlock_names_in_both_shapes() -> None:
    def newer(self: Any, reqs_to_exclude: Any = None) -> None: ...
    def older(self: Any, chunked_req_to_exclude: Any = None, keep_indices: Any = None) -> None: ...
    def neither(self: Any, keep_indices: Any = None) -> None: ...

    assert exclude_keyword(newer) == "reqs_to_exclude"
    assert exclude_keyword(older) == "chunked_req_to_exclude"
    with pytest.raises(TypeError):
        exclude_keyword(neither)

    class Newer:
        def unlock(self, lock: Any) -> None: ...

    class Older:
        def unpin(self, req: Any) -> None: ...

    class Oldest:
        def _dec_req_lock(self, req: Any, *, skip_swa: bool = False) -> None: ...

    names = (tree_unlock_name(Newer()), tree_unlock_name(Older()), tree_unlock_name(Oldest()))
    assert names == ("unlock", "unpin", "_dec_req_lock")
    with pytest.raises(TypeError):
        tree_unlock_name(object())


def test_the_swa_boundary_by_component_or_in_its_own_field() -> None:
    swa = "SWA"
    assert swa_boundary(SimpleNamespace(component_lock_uuids={swa: 7}), swa) == 7
    assert swa_boundary(SimpleNamespace(component_lock_uuids={}), swa) is None
    assert swa_boundary(SimpleNamespace(swa_uuid_for_lock=9), swa) == 9  # 0.5.20


def test_a_release_launching_triton_on_the_cpu_needs_it_interpreted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """0.5.21's paged allocator has no CPU path (no `use_triton_kernels`): past page size 1
    it runs only where triton is interpreted, else one error line; a release with the switch,
    and page size 1, run either way."""
    from pathlib import Path

    from kvcanary_cli.soak import stack

    tree = stack.SGLangTree(Path("."), "0.5.21", "sglang.kernels.ops.kv_canary", "w.whl")
    older = SimpleNamespace(full_attn_allocator=SimpleNamespace())
    newer = SimpleNamespace(full_attn_allocator=SimpleNamespace(use_triton_kernels=False))
    monkeypatch.setattr(stack, "triton_interpreted", lambda: False)
    with pytest.raises(stack.SGLangUnavailableError, match="page size 4 needs them") as refused:
        stack._require_kernels(tree, stack.StackSpec.pressured(4, "python"), older)
    assert "\n" not in str(refused.value)
    stack._require_kernels(tree, stack.StackSpec.pressured(1, "python"), older)
    stack._require_kernels(tree, stack.StackSpec.pressured(4, "python"), newer)
    monkeypatch.setattr(stack, "triton_interpreted", lambda: True)
    stack._require_kernels(tree, stack.StackSpec.pressured(4, "python"), older)


def test_a_transfer_lock_is_replayed_as_its_release_shapes_a_request_lock() -> None:
    """The tree's in-flight transfer locks (`soak.hicache.inflight_locks`) read as each
    release's request lock: a receipt naming the components it skipped (0.5.20 on) as a
    `TreeLock`, an older receipt (its SWA boundary, the nodes it skipped) as the lock fields
    of 0.5.14 - 0.5.19's requests; a write-back's backup (no receipt) holds no lock."""
    from kvcanary_cli.soak.hicache import inflight_locks

    new = SimpleNamespace(skipped_lock_components=(), component_lock_uuids={})
    old = SimpleNamespace(swa_uuid_for_lock=7, skip_lock_node_ids={1: {3}})
    tree = SimpleNamespace(
        ongoing_write_through={4: (4, new, [4]), 5: (5, None, [5])},
        ongoing_load_back={6: (6, old, "host receipt")},
    )
    first, second = (held_lock(holder) for holder in inflight_locks(tree))
    assert first is not None and (first.node, first.receipt, first.swa_released) == (4, new, False)
    assert first.unlocked is None
    assert second is not None and second.node == 6 and second.unlocked == {1: {3}}
    assert swa_boundary(second.receipt, 1) == 7
    assert inflight_locks(SimpleNamespace()) == []


def _tracking(committed: int, **kw: Any) -> SimpleNamespace:
    """A 0.5.23-shaped request (its KV record holds the row, the lengths and the track state)
    tracking in ping-pong slot 1, its latest state at 16 tokens in slot 0."""
    kv = SimpleNamespace(
        req_pool_idx=3,
        kv_committed_len=committed,
        mamba_ping_pong_track_buffer=[7, 8],
        mamba_next_track_idx=1,
        mamba_last_track_idx=0,
        mamba_last_track_seqlen=16,
        mamba_prev_track_seqlen=None,
        **kw,
    )
    return SimpleNamespace(kv=kv)


_POOL = SimpleNamespace(get_mamba_ping_pong_other_idx=lambda i: 1 - i)


def test_a_decode_at_a_track_boundary_moves_the_latest_state() -> None:
    """At a multiple of the interval the slot the forward wrote becomes the latest, the one
    before stays named, and the next boundary writes the other slot."""
    req = _tracking(32)
    assert track_decode_boundary(req, _POOL, 16)
    kv = req.kv
    assert (kv.mamba_last_track_idx, kv.mamba_next_track_idx) == (1, 0)
    assert (kv.mamba_last_track_seqlen, kv.mamba_prev_track_seqlen) == (32, 16)


def test_a_decode_between_boundaries_or_without_a_track_buffer_moves_nothing() -> None:
    between = _tracking(33)
    assert not track_decode_boundary(between, _POOL, 16)
    assert (between.kv.mamba_next_track_idx, between.kv.mamba_last_track_seqlen) == (1, 16)
    none = _tracking(32)
    none.kv.mamba_ping_pong_track_buffer = None
    assert not track_decode_boundary(none, _POOL, 16)
    assert none.kv.mamba_last_track_seqlen == 16


def test_an_older_request_tracks_on_itself() -> None:
    """0.5.13's request holds the row and the track state itself, and names no last track
    index or previous length: only the fields it has are moved."""
    req = SimpleNamespace(
        kv=None,
        req_pool_idx=2,
        kv_committed_len=48,
        mamba_ping_pong_track_buffer=[5, 6],
        mamba_next_track_idx=0,
        mamba_last_track_seqlen=32,
    )
    assert track_decode_boundary(req, _POOL, 16)
    assert (req.mamba_next_track_idx, req.mamba_last_track_seqlen) == (1, 48)
    assert not hasattr(req, "mamba_last_track_idx")


class _VirtualNode:
    """Named as SGLang's streaming-session stand-in node (`session/streaming_session.py`)."""


def test_a_turn_anchored_at_its_sessions_stand_in_node_holds_no_lock() -> None:
    """A streaming turn that runs on its session's record is anchored at the slot's stand-in
    node, whose locking SGLang skips: the lock is the slot's (counted there, once), not the
    turn's (counted twice, or read at a node the tree does not have, on the old code)."""
    virtual = _VirtualNode()
    assert held_lock(SimpleNamespace(lock=SimpleNamespace(node=virtual))) is None
    receipt = SimpleNamespace(node_id=4)
    assert held_lock(_older_req(last_node=virtual, lock_receipt=receipt)) is None
    # 0.5.13 - 0.5.16's session slot: the anchor and boundary, no early SWA release kept
    slot = SimpleNamespace(last_node=4, swa_uuid_for_lock=None)
    held = held_lock(slot)
    assert held is not None and (held.node, held.swa_released) == (4, False)
    assert held.identity is slot


class _CheckerBefore:
    """SGLang 0.5.19's busy checker's arguments (the ones that matter here): its busy check
    sums the last and running batches' uncached KV only."""

    def __init__(self, *, get_last_batch: Any, get_running_batch: Any) -> None:
        self.batches = (get_last_batch, get_running_batch)


class _CheckerSince(_CheckerBefore):
    """0.5.20's: it counts the chunked request parked between chunks too."""

    def __init__(
        self, *, get_last_batch: Any, get_running_batch: Any, get_chunked_req: Any = None
    ) -> None:
        super().__init__(get_last_batch=get_last_batch, get_running_batch=get_running_batch)
        self.chunked = get_chunked_req


@pytest.mark.parametrize(
    ("checker", "opens"),
    [(_CheckerBefore, False), (_CheckerSince, True), (None, True)],
)
def test_streaming_sessions_are_opened_where_the_busy_check_counts_a_parked_chunk(
    checker: Any, opens: bool
) -> None:
    """Streaming sessions are opened where SGLang's busy check counts a chunked request parked
    between chunks (its checker takes `get_chunked_req`), or there is no such check; before,
    the check reads a parked chunk's KV as leaked, and in soak's histories only sessions park
    one (docs/soak.md): those releases' histories run without sessions."""
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.stack import drives_streaming_sessions

    module = None if checker is None else SimpleNamespace(SchedulerInvariantChecker=checker)
    modules = SimpleNamespace(invariant_checker=module)
    streaming = drives_streaming_sessions(modules)  # type: ignore[arg-type]
    assert streaming is opens
    workload = history_workload(0, 0, 1, streaming=streaming)
    assert workload.streaming_sessions is opens
    assert any(a.session is not None for a in workload.arrivals) is opens


class _IdleChecker:
    """A checker whose idle checks each complain (what SGLang's say over a leak)."""

    pool_stats_observer = SimpleNamespace(get_pool_stats=lambda: None)

    def _check_all_pools(self, stats: Any) -> tuple[bool, list[str]]:
        return True, ["[full] short"]

    def _report_leak(self, name: str, message: str) -> None:
        raise ValueError(f"{name} memory leak detected! {message}")

    def _check_req_pool(self) -> None:
        raise ValueError("req_to_token_pool memory leak detected!")


@pytest.mark.parametrize(
    ("waiting", "chunked", "queued", "ran"),
    [
        ([], None, None, True),
        (["req"], None, None, False),
        ([], "chunk", None, False),
        ([], None, ("batch", "decode"), False),
    ],
)
def test_sglangs_idle_checks_run_only_once_fully_idle(
    waiting: list[str], chunked: str | None, queued: tuple[str, str] | None, ran: bool
) -> None:
    """SGLang's `on_idle` runs its idle checks only where the scheduler is fully idle: a step
    with no batch while a request waits or a chunk sits parked runs none (its pool sums would
    leave the parked chunk's KV and row out), nor, under the overlapped loop, while a result
    is queued (`is_fully_idle`: an empty result queue)."""
    from kvcanary_cli.soak.audit import SGLangChecks
    from kvcanary_cli.soak.driver import Scheduler

    scheduler = SimpleNamespace(
        waiting=waiting,
        running=SimpleNamespace(is_empty=lambda: True),
        chunked_req=chunked,
        last_batch=None,
        inflight=queued,
        stack=SimpleNamespace(tree=SimpleNamespace(sanity_check=lambda: None)),
    )
    scheduler.fully_idle = Scheduler.fully_idle.fget(scheduler)  # type: ignore[attr-defined]
    checks = SGLangChecks.__new__(SGLangChecks)
    checks.scheduler, checks.checker = scheduler, _IdleChecker()  # type: ignore[assignment]
    said = [one.check for one in checks.idle()]
    assert said == (["_check_all_pools", "_check_req_pool"] if ran else [])


class _RadixTree:
    """A unified tree that tags radix sessions (0.5.17 on)."""

    def open_radix_session(self, session_id: str) -> int:
        return 1

    def ensure_session_generation(self, session_id: str) -> int:
        return 1

    def release_radix_session(self, session_id: str) -> int:
        return 0


@pytest.mark.parametrize(
    ("tree", "field", "core", "drives"),
    [
        (_RadixTree, True, "python", True),
        (_RadixTree, True, "rust", False),  # SGLang refuses them on the Rust core
        (_RadixTree, False, "python", False),  # the build cannot switch them on
        (object, True, "python", False),  # 0.5.15 - 0.5.16: only the full-attention tree tags
    ],
)
def test_radix_sessions_need_the_trees_tagging_and_the_python_core(
    tree: type, field: bool, core: str, drives: bool
) -> None:
    from kvcanary_cli.soak.stack import drives_radix_sessions

    def params(disable: bool = False, enable_session_radix_cache: bool = False) -> None: ...

    def older(disable: bool = False) -> None: ...

    modules = SimpleNamespace(
        unified_radix_cache=SimpleNamespace(UnifiedRadixCache=tree),
        cache_init_params=SimpleNamespace(CacheInitParams=params if field else older),
    )
    assert drives_radix_sessions(modules, core) is drives  # type: ignore[arg-type]
