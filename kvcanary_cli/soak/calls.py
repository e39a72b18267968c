"""What soak reads of SGLang's `Req` and calls of its memory functions, where releases differ.

Each difference is found by what the loaded tree has, never by its version string:

- the request's prefix: `prefix_len` (0.5.22 on) or the length of `prefix_indices` (0.5.21);
  the end of its extend: `extend_end` (0.5.22 on), `extend_range.end` (0.5.15 - 0.5.21) or
  `fill_len` (0.5.13 - 0.5.14);
- the tree lock it holds: `req.lock`, a `TreeLock` of anchor, receipt and whether its SWA part
  went early (0.5.22 on), or the receipt `req.lock_receipt` on `req.last_node` with
  `req.swa_prefix_lock_released` (0.5.20 and 0.5.21, where a receipt without a node holds
  nothing); the receipt's SWA boundary by component, or (0.5.20) in a field of its own; or
  (0.5.17 - 0.5.19, no receipt) `req.last_node` with the request's own `swa_uuid_for_lock`
  and `skip_lock_node_ids` (the nodes, by component, the lock left unlocked: those locks
  skip tombstones, where later ones count them); or (0.5.13 - 0.5.16) the same without
  `skip_lock_node_ids` (the lock skips tombstones and keeps no record of which: the
  request, with its anchor node, stands for the lock);
- publishing an unfinished request: `checkpoint_kv_cache` (0.5.22 on) or
  `maybe_cache_unfinished_req` (0.5.21: `chunked=True` for a stashed chunk, as its scheduler
  does); releasing one: `release_kv_cache(..., checkpoint=)` or `(..., is_insert=)`;
- the tree's release of a request's lock: `unlock(req.lock)`, `unpin(req)` or (0.5.20)
  `_dec_req_lock(req)`;
- the requests a batch's filter keeps out: `filter_batch(reqs_to_exclude=)` (0.5.22 on) or
  `(chunked_req_to_exclude=)` (0.5.21);
- the request pool row a request holds: `req.kv.req_pool_idx` (0.5.19 on) or
  `req.req_pool_idx` (0.5.17 - 0.5.18, whose `req.kv` holds only its lengths; see
  `capture.tree.kv_record`);
- retracting decode requests: `retract_decode()` (0.5.19 on) or `retract_decode(server_args)`
  (0.5.17 - 0.5.18);
- the KV length a release of a finished request keeps, all past it freed as over-allocated:
  `req.owned_kv_len()` (0.5.21 on) or `req.effective_kv_committed_len()` (0.5.20; `owned_len`);
- the lazy extra buffer's flag for a release without a checkpoint: `mamba_lazy_checkpoint`
  (0.5.22 on) or `mamba_lazy_is_insert` (0.5.20 - 0.5.21; `lazy_checkpoint_flag`);
- the overlapped loop's decode leaving out the requests its queued result finishes by length
  (`_reqs_finishing_inflight`, 0.5.22 on): the release's `Req` has the question that loop asks,
  `next_output_finishes_by_length`; earlier releases' decode allocates for them too
  (`skips_finishing_decode`);
- the tree's end of an aborted request's cache attempt: `finish(req.cache_request_handle,
  CacheRequestOutcome.ABORT)` (0.5.20 on) or `release_aborted_request(req.rid)` (0.5.19).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvcanary_cli.capture.tree import kv_record

__all__ = [
    "HeldLock",
    "abort_finisher",
    "checkpointer",
    "committed_len",
    "exclude_keyword",
    "extend_end",
    "held_lock",
    "holds_mamba",
    "lazy_checkpoint_flag",
    "next_output_finishes_by_length",
    "owned_len",
    "prefix_len",
    "release_keyword",
    "releaser",
    "retract_arguments",
    "root_of",
    "row_of",
    "skipped_components",
    "skips_finishing_decode",
    "swa_boundary",
    "track_decode_boundary",
    "track_overlapped_decode",
    "tree_unlock_name",
    "turn_down_mamba",
]


def prefix_len(req: Any) -> int:
    """How many tokens of the request are its prefix (in its row, or matched in the tree)."""
    if hasattr(req, "prefix_len"):
        return int(req.prefix_len)
    return len(req.prefix_indices)


def row_of(req: Any) -> int | None:
    """The request pool row the request holds (None: none)."""
    return kv_record(req).req_pool_idx  # type: ignore[no-any-return]


def holds_mamba(req: Any) -> bool:
    """Whether a request holds a Mamba state slot (a waiting one: the copy-on-write slot its
    prefix match took); never outside the Mamba layout."""
    return getattr(kv_record(req), "mamba_pool_idx", None) is not None


def turn_down_mamba(req: Any, mamba_allocator: Any) -> None:
    """What SGLang's scheduler undoes for a request the adder turned down after its prefix
    match: the copy-on-write source and clear flag the match staged (0.5.15 on), and the
    Mamba slot it took, freed, but for a session's request (`req.session`), which keeps it
    while it waits and reuses it at its next match (a waiting request of no session holds
    none between rounds)."""
    record = kv_record(req)
    if hasattr(record, "mamba_cow_src_index"):
        record.mamba_cow_src_index = None
        record.mamba_needs_clear = False
    if holds_mamba(req) and not getattr(req, "session", None):
        mamba_allocator.free(record.mamba_pool_idx.unsqueeze(-1))
        record.mamba_pool_idx = None


def committed_len(req: Any) -> int:
    """The request's committed KV length, wherever its release keeps it (`_committed_len`)."""
    return _committed_len(req, kv_record(req))


def _committed_len(req: Any, record: Any) -> int:
    """The request's committed KV length (on its KV record, 0.5.17 on; the request before)."""
    for holder in (record, getattr(req, "kv", None), req):
        committed = getattr(holder, "kv_committed_len", None)
        if committed is not None:
            return int(committed)
    return 0


def track_decode_boundary(req: Any, pool: Any, interval: int) -> bool:
    """The extra buffer's part of a decode result, as SGLang's non-overlapped, non-speculative
    result processing does it (`_mamba_prefix_cache_update`): where the decode just committed
    a multiple of the track `interval`, the forward wrote the state into the ping-pong slot at
    `mamba_next_track_idx`; that slot becomes the latest tracked state (`mamba_last_track_idx`
    and `mamba_last_track_seqlen`; the one before stays named by `mamba_prev_track_seqlen`,
    0.5.17 on) and the next boundary writes the other (`get_mamba_ping_pong_other_idx`). No
    slot is allocated or freed here: a finish or a checkpoint later hands the latest one to
    the tree. Whether it was a boundary (False without a track buffer)."""
    record = kv_record(req)
    if getattr(record, "mamba_ping_pong_track_buffer", None) is None:
        return False
    committed = _committed_len(req, record)
    if committed <= 0 or committed % interval:
        return False
    written = record.mamba_next_track_idx
    if hasattr(record, "mamba_last_track_idx"):
        record.mamba_last_track_idx = written
    if hasattr(record, "mamba_prev_track_seqlen"):
        record.mamba_prev_track_seqlen = record.mamba_last_track_seqlen
    record.mamba_last_track_seqlen = committed
    record.mamba_next_track_idx = pool.get_mamba_ping_pong_other_idx(written)
    return True


def _slot_empty(record: Any, position: int) -> bool:
    """Whether the request's ping-pong position holds no slot (0.5.23 keeps a list saying
    so; 0.5.22 marks the buffer entry -1)."""
    empty = getattr(record, "mamba_ping_pong_empty", None)
    if empty is not None:
        return bool(empty[position])
    return int(record.mamba_ping_pong_track_buffer[position]) == -1


def lazy_checkpoint_flag(req: Any) -> str:
    """The request's field saying whether the lazy extra buffer's release caches it (False
    where a decode in flight writes its only track slot): `mamba_lazy_checkpoint` (0.5.22
    on) or `mamba_lazy_is_insert` (0.5.20 - 0.5.21)."""
    if hasattr(req, "mamba_lazy_is_insert") and not hasattr(req, "mamba_lazy_checkpoint"):
        return "mamba_lazy_is_insert"
    return "mamba_lazy_checkpoint"


def track_overlapped_decode(
    req: Any, batch: Any, row: int, pool: Any, interval: int, lazy: bool
) -> tuple[bool, int, bool]:
    """The extra buffer's part of a decode result under SGLang's overlapped loop (0.5.22 and
    0.5.23's `_handle_finish_state_updated_req` and `_mamba_prefix_cache_update`, no
    speculative decoding), for `req`, row `row` of the result's `batch` (a snapshot, with the
    masks its `prepare_for_decode` kept: `mamba_track_mask_cpu`, `mamba_track_mask_next_cpu`,
    `mamba_decode_batch_idx_cpu`), after its finish state is updated.

    The lookahead is how many decodes were prepared for `req` since (0 or 1, SGLang asserts).
    A completed boundary names the slot the forward wrote as the latest tracked state; the
    boundary to act on is the completed one's at lookahead 0, the in-flight decode's
    (`mamba_track_mask_next_cpu`) at 1, where the next decode's slot is swapped ahead
    (SGLang's lookahead checks run). With `lazy` (`extra_buffer_lazy`), the completed
    boundary alone counts: the slot the forward wrote becomes the only one, and the other,
    which `mamba_lazy_prealloc_at_boundary` handed this decode's forward, is freed
    (`mamba_lazy_post_decode_at_boundary`); a request finishing while the in-flight decode
    writes its only slot is released without a checkpoint (`req.mamba_lazy_checkpoint`;
    0.5.20 - 0.5.21: `req.mamba_lazy_is_insert`, `lazy_checkpoint_flag`).
    (whether a boundary was acted on, slots freed, whether the swap pointed the next decode's
    track slot at the latest tracked state: a boundary swapped ahead at lookahead 1 whose own
    result then came at lookahead 0 is swapped again, as SGLang does; docs/soak.md)."""
    record = kv_record(req)
    completed_mask = getattr(batch, "mamba_track_mask_cpu", None)
    if getattr(record, "mamba_ping_pong_track_buffer", None) is None or completed_mask is None:
        return False, 0, False
    completed = bool(completed_mask[row])
    lookahead = int(req.decode_batch_idx) - int(batch.mamba_decode_batch_idx_cpu[row])
    assert lookahead in (0, 1), f"mamba result lookahead={lookahead} for req {req.rid}"
    known = completed if lookahead == 0 else bool(batch.mamba_track_mask_next_cpu[row])
    committed = _committed_len(req, record)
    if completed and not lazy:
        record.mamba_last_track_idx = batch.mamba_track_buffer_indices[row]
        if hasattr(record, "mamba_prev_track_seqlen"):
            record.mamba_prev_track_seqlen = record.mamba_last_track_seqlen
        record.mamba_last_track_seqlen = committed - lookahead
    elif (
        lazy
        and req.finished()
        and lookahead == 1
        and known
        and record.mamba_next_track_idx == record.mamba_last_track_idx
        and getattr(record, "mamba_untracked_decode_batch_idx", None) != req.decode_batch_idx
    ):
        setattr(req, lazy_checkpoint_flag(req), False)
    if not (completed if lazy else known):
        return False, 0, False
    on_known = not lazy and known
    if on_known:
        token_len = len(req.origin_input_ids) + len(req.output_ids) - 1
        assert req.output_ids and committed - token_len in (0, 1), (
            f"mamba track boundary: kv_committed_len={committed} leads seq_len={token_len} "
            f"by more than one (req {req.rid})"
        )
        assert committed % interval == 0, "a known track boundary off the grid"
        track_len = committed
    else:
        track_len = committed - lookahead
        if track_len % interval:
            return False, 0, False
    written = record.mamba_next_track_idx
    if not on_known and batch.mamba_track_buffer_indices is not None:
        written = batch.mamba_track_buffer_indices[row]
    previous = record.mamba_last_track_seqlen
    if not on_known:
        record.mamba_last_track_seqlen = track_len
    if lazy:
        record.mamba_last_track_idx = written
        record.mamba_next_track_idx = written
        other = 1 - written
        if _slot_empty(record, other):
            return True, 0, False
        pool.mamba_allocator.free(record.mamba_ping_pong_track_buffer[other].unsqueeze(0))
        pool.set_mamba_ping_pong_slot(req, other, -1)
        return True, 1, False
    if not on_known:
        record.mamba_last_track_idx = written
        if hasattr(record, "mamba_prev_track_seqlen"):
            record.mamba_prev_track_seqlen = previous
    record.mamba_next_track_idx = pool.get_mamba_ping_pong_other_idx(written)
    reswapped = lookahead == 0 and record.mamba_next_track_idx == record.mamba_last_track_idx
    return True, 0, reswapped


def owned_len(req: Any) -> int:
    """The KV length `release_kv_cache` keeps of a finished request (what it owns; the row
    past it is freed as over-allocated): `owned_kv_len()` (0.5.21 on) or
    `effective_kv_committed_len()` (0.5.20), else its committed length."""
    for name in ("owned_kv_len", "effective_kv_committed_len"):
        method = getattr(req, name, None)
        if callable(method):
            return int(method())
    return _committed_len(req, kv_record(req))


def next_output_finishes_by_length(req: Any) -> bool:
    """Whether the request's next output token finishes it by length: SGLang's own question
    (`Req.next_output_finishes_by_length`, 0.5.22 on), or before it soak's reading of it (one
    more output token reaches `max_new_tokens`)."""
    asks = getattr(req, "next_output_finishes_by_length", None)
    if callable(asks):
        return bool(asks())
    return bool(len(req.output_ids) + 1 >= req.sampling_params.max_new_tokens)


def skips_finishing_decode(req_class: Any) -> bool:
    """Whether the release's overlapped loop leaves out of a decode the requests whose queued
    result finishes them by length (`_reqs_finishing_inflight`, 0.5.22 on), by the question it
    asks of each request (`Req.next_output_finishes_by_length`): 0.5.13 - 0.5.21's
    `update_running_batch` has neither, and decodes them too."""
    return callable(getattr(req_class, "next_output_finishes_by_length", None))


def extend_end(req: Any) -> int | None:
    """Where this round's extend ends (None before admission)."""
    if hasattr(req, "extend_end"):
        return req.extend_end  # type: ignore[no-any-return]
    if not hasattr(req, "extend_range"):  # 0.5.13 - 0.5.14: how far its fill ids reach
        return int(req.fill_len) or None
    extend = req.extend_range
    return None if extend is None else int(extend.end)


@dataclass(frozen=True)
class HeldLock:
    """A request's tree lock, however its release keeps it: the anchor node it was taken on,
    the receipt its release replays, whether its SWA part was released early, and the object
    that stands for this one lock (a new lock is a new object). `unlocked`: where the lock
    left nodes of its reach unlocked (0.5.17 - 0.5.19: tombstones, and the anchor of a
    component skipped whole), the node ids it says so of, by component; None where the lock
    counts every node of its reach, tombstones included, and skips whole components only
    (`receipt.skipped_lock_components`, 0.5.20 on)."""

    node: Any
    receipt: Any
    swa_released: bool
    identity: object
    unlocked: Any = None


def held_lock(req: Any) -> HeldLock | None:
    """The tree lock `req` holds (None: none), a request's or a streaming session's slot's
    (the same fields). A turn that runs on its session's record is anchored at the slot's
    stand-in node (`_VirtualNode`, which locking ignores): the lock is the slot's, and
    counted there."""
    if hasattr(req, "lock"):
        lock = req.lock
        if lock is None or _virtual(lock.node):
            return None
        return HeldLock(lock.node, lock.receipt, bool(lock.swa_released), lock)
    if _virtual(req.last_node):
        return None
    if not hasattr(req, "lock_receipt"):  # 0.5.13 - 0.5.19: the lock's fields on the request
        if req.last_node is None:
            return None
        # (a session slot before 0.5.20 keeps no early SWA release of its own: the live
        # audit carries its first turn's across, `live._expected_python`)
        released = bool(getattr(req, "swa_prefix_lock_released", False))
        if not hasattr(req, "skip_lock_node_ids"):  # 0.5.13 - 0.5.16: the skips not kept
            return HeldLock(req.last_node, req, released, req, {})
        skipped = req.skip_lock_node_ids  # a new dict with each lock
        return HeldLock(req.last_node, req, released, skipped, skipped)
    receipt = req.lock_receipt
    if receipt is None or receipt.node_id is None or req.last_node is None:
        return None
    return HeldLock(req.last_node, receipt, bool(req.swa_prefix_lock_released), receipt)


def _virtual(node: Any) -> bool:
    """Whether `node` is a streaming session's stand-in node (`_VirtualNode`)."""
    return type(node).__name__ == "_VirtualNode"


def skipped_components(lock: HeldLock) -> tuple[Any, ...]:
    """The components `lock` left untaken as a whole (a lock that says so by node: none)."""
    if lock.unlocked is not None:
        return ()
    return tuple(lock.receipt.skipped_lock_components)


def swa_boundary(receipt: Any, swa: Any) -> Any:
    """The uuid stamping the node where a lock's SWA part ends (None: the root): by component
    (`component_lock_uuids`, 0.5.21 on) or in a field of its own (`swa_uuid_for_lock`,
    0.5.20's receipt; 0.5.17 - 0.5.19's request)."""
    uuids = getattr(receipt, "component_lock_uuids", None)
    if uuids is not None:
        return uuids.get(swa)
    return receipt.swa_uuid_for_lock


def checkpointer(common: Any) -> Callable[[Any, Any, bool], None]:
    """`publish(req, tree, chunked)`: what the scheduler calls to publish an unfinished
    request's computed prefix to the tree (a stashed chunk: `chunked`)."""
    new = getattr(common, "checkpoint_kv_cache", None)
    if new is not None:
        return lambda req, tree, chunked: new(req, tree)
    old = common.maybe_cache_unfinished_req

    def publish(req: Any, tree: Any, chunked: bool) -> None:
        if chunked:
            old(req, tree, chunked=True)
        else:
            old(req, tree)

    return publish


def release_keyword(function: Callable[..., Any], tree: Any) -> str:
    """The keyword `release_kv_cache` takes for 'cache what the request computed first': by
    its signature, or where a wrapper takes any keyword (a test's, a fault's), by the tree's
    insert (`checkpoint`, 0.5.22 on; `insert_req`, 0.5.21)."""
    names = inspect.signature(function).parameters
    for keyword in ("checkpoint", "is_insert"):
        if keyword in names:
            return keyword
    return "checkpoint" if callable(getattr(type(tree), "checkpoint", None)) else "is_insert"


def releaser(common: Any, tree: Any) -> Callable[[Any, Any, bool], None]:
    """`release(req, tree, keep)`: `release_kv_cache`, the tree keeping what it can key first
    where `keep`. Looked up at each call: a fault may replace the module's function."""
    keyword = release_keyword(common.release_kv_cache, tree)
    return lambda req, tree, keep: common.release_kv_cache(req, tree, **{keyword: keep})


def tree_unlock_name(tree: Any) -> str:
    """The tree method a release calls to drop the request's lock: `unlock(req.lock)`
    (0.5.22 on), `unpin(req)` (0.5.21), `_dec_req_lock(req)` inside `cache_finished_req`
    (0.5.17 - 0.5.20), or its `dec_lock_ref(req.last_node, ...)` (0.5.13 - 0.5.16)."""
    for name in ("unlock", "unpin", "_dec_req_lock", "dec_lock_ref"):
        if callable(getattr(type(tree), name, None)):
            return name
    raise TypeError(f"{type(tree).__name__} has no lock release soak knows")


def root_of(tree: Any) -> Any:
    """What a lock on the tree's root names: the root's handle (0.5.17 on: a node id) or the
    root node itself (0.5.13 - 0.5.16, whose locks hold nodes)."""
    handle = getattr(tree, "root_node_handle", None)
    return handle() if callable(handle) else tree.root_node


def exclude_keyword(filter_batch: Callable[..., Any]) -> str:
    """The keyword `ScheduleBatch.filter_batch` takes for the requests it must drop."""
    names = [n for n in inspect.signature(filter_batch).parameters if n.endswith("_to_exclude")]
    if len(names) != 1:
        raise TypeError(f"filter_batch{inspect.signature(filter_batch)} has no one *_to_exclude")
    return names[0]


def abort_finisher(tree: Any, base_prefix_cache: Any) -> Callable[[Any], None]:
    """`finish(req)`: what the scheduler tells the tree of a request aborted before its cache
    attempt ended: `finish` with the ABORT outcome, where the tree and its base module have
    them, else `release_aborted_request` by the request's id."""
    outcomes = getattr(base_prefix_cache, "CacheRequestOutcome", None)
    if outcomes is not None and callable(getattr(type(tree), "finish", None)):
        abort = outcomes.ABORT
        return lambda req: tree.finish(req.cache_request_handle, abort)
    return lambda req: tree.release_aborted_request(req.rid)


def retract_arguments(retract_decode: Callable[..., Any], server_args: Any) -> tuple[Any, ...]:
    """What `ScheduleBatch.retract_decode` is called with: the server args where it takes
    them, nothing where it reads them from the runtime context."""
    takes = "server_args" in inspect.signature(retract_decode).parameters
    return (server_args,) if takes else ()
