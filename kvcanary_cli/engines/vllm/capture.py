"""A live vLLM `KVCacheManager` read into a `VllmState` (the dump `check` reads).

Read by attribute only (nothing of vLLM is imported): the pool's blocks (reference counts,
hashes), the free queue walked from each sentinel (a cycle cuts the walk at the pool's size
instead of hanging), the prefix-cache map with every key a block is cached under (its own
hash and its extra keys), each group's request tables, the scheduler's deferred frees and
its requests when given. Reading changes nothing in the manager.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from kvcanary_cli.engines.vllm.state import (
    FULL,
    MAMBA,
    SLIDING_WINDOW,
    GroupSpec,
    VllmState,
    scratch_count,
)
from kvcanary_cli.errors import EngineUnavailableError

__all__ = ["KNOWN_LAYOUTS", "VllmLayoutError", "group_specs", "snapshot"]

#: Managers that keep every block of a request (no null block in their tables).
_FULL_MANAGERS = frozenset(
    {"FullAttentionManager", "SinkFullAttentionManager", "CrossAttentionManager"}
)


def _kind(manager: Any) -> str:
    """The manager's kind: its class name less `Manager`, in snake case (an acronym one word:
    `RSWAManager` is `rswa`, `CircularBufferManager` `circular_buffer`)."""
    name = type(manager).__name__
    if name in _FULL_MANAGERS:
        return FULL
    if name == "SlidingWindowManager":
        return SLIDING_WINDOW
    base = name.removesuffix("Manager").lstrip("_")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", base).lower()


def _window(spec: Any) -> int | None:
    """The tokens a group's table must keep behind the computed ones: a sliding window,
    chunked local attention's chunk, or a reference sliding window's generated tokens (None:
    every token, or a kind without one)."""
    for name in ("sliding_window", "attention_chunk_size", "rswa_window"):
        value = getattr(spec, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _max_states(manager: Any, *, max_model_len: int | None, requests_known: bool) -> int | None:
    """The most state blocks a Mamba manager keeps in a live request's table with no tokens
    in flight, read from its spec (None: another kind, or a bound kvcanary does not know).

    Caching states by prefix ("align" mode), a request keeps the state of its last computed
    token and the previous step's (the next step copies from it) and retires the rest, plus
    the prefill checkpoint block where the spec reserves one. A release that frees states on
    the tokens already processed (vLLM's async scheduling) keeps the states of its tokens in
    flight too: one more per block they reach, which the check adds per request from its
    count (`request_num_in_flight`), so the bound needs the requests. Without prefix caching
    a request holds one block, the model's length. Speculative decoding adds a block per
    draft token a step verifies (`num_speculative_blocks`: the running state's scratch blocks,
    which the manager allocates past the states it keeps, in either mode)."""
    if _kind(manager) != MAMBA:
        return None
    spec = manager.kv_cache_spec
    drafts = _scratch_blocks(manager)
    if drafts is None:
        return None
    if getattr(spec, "mamba_cache_mode", None) == "align":
        if not requests_known:
            return None
        return 2 + int(getattr(spec, "num_prefill_checkpoint_blocks", 0) > 0) + drafts
    if max_model_len is not None and int(manager.block_size) >= max_model_len:
        return 1 + drafts
    return None


def _own_pool(manager: Any, pool: Any) -> bool:
    """The group's manager keeps a block pool other than the KV-cache manager's (vLLM's
    HiSparse source group, bound to a host pool): its tables' ids are that pool's blocks."""
    return getattr(manager, "block_pool", pool) is not pool


def _scratch_blocks(manager: Any) -> int | None:
    """A Mamba group's scratch blocks a live request's table ends with, one per draft token
    a step verifies (`num_speculative_blocks`, 0 where the release has none; None: not a
    count)."""
    drafts = getattr(manager.kv_cache_spec, "num_speculative_blocks", 0)
    return drafts if scratch_count(drafts) else None


def group_specs(
    managers: Iterable[Any],
    *,
    max_model_len: int | None = None,
    requests_known: bool = False,
    pool: Any = None,
) -> tuple[GroupSpec, ...]:
    """Each group's kind, block size and window, from its single-type manager, and a Mamba
    group's state bound (`_max_states`: `max_model_len` the manager's, `requests_known`
    whether the scheduler's requests, and so their tokens in flight, are read too) and
    scratch blocks; with `pool` (the KV-cache manager's), whether a group keeps a pool of its
    own (`_own_pool`)."""
    return tuple(
        GroupSpec(
            kind=_kind(m),
            block_size=int(m.block_size),
            window=_window(m.kv_cache_spec),
            max_states=_max_states(m, max_model_len=max_model_len, requests_known=requests_known),
            speculative_blocks=(_kind(m) == MAMBA and _scratch_blocks(m)) or 0,
            own_pool=pool is not None and _own_pool(m, pool),
        )
        for m in managers
    )


def _model_len(manager: Any) -> int | None:
    value = getattr(manager, "max_model_len", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _split_key(key: Any) -> tuple[int, bytes]:
    """A `BlockHashWithGroupId` as (group, digest), by what the key is: from 0.10.2 on bytes,
    the digest then the group id in 4 big-endian bytes; before, a named pair of the block's
    hash (its `hash_value` an integer, with the block's tokens) and the group id, whose
    digest is that integer's bytes (big-endian, 32 at least: a sha256's)."""
    if isinstance(key, (bytes, bytearray, memoryview)):
        key = bytes(key)
        return int.from_bytes(key[-4:], "big"), key[:-4]
    value = key.block_hash.hash_value
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"a block hash's value is a {type(value).__name__}, not an integer")
    width = max(32, (value.bit_length() + 7 + (value < 0)) // 8)
    return int(key.group_id), value.to_bytes(width, "big", signed=value < 0)


def _walk(start: Any, step: str, end: Any, limit: int) -> tuple[list[int], bool]:
    """Block ids from `start` along `step` links up to `end`; False when cut at `limit`."""
    out: list[int] = []
    node = start
    while node is not None and node is not end:
        if len(out) >= limit:
            return out, False
        out.append(int(node.block_id))
        node = getattr(node, step)
    return out, node is end


def _split_keys(keys: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """`_split_key` of each key: the group ids and the digests as rows of one width (a shorter
    one zero-padded). Every step of a soak reads every cached block's key: where all are
    bytes of one length (vLLM 0.10.2 on), they are split as one array, not one by one."""
    if keys and set(map(type, keys)) == {bytes} and len(width := set(map(len, keys))) == 1:
        (length,) = width
        if length >= 4:
            packed = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), length)
            groups = packed[:, -4:].copy().view(">u4").reshape(-1).astype(np.int64)
            return groups, packed[:, :-4]
    pairs = [_split_key(key) for key in keys]
    digests = np.zeros((len(pairs), max((len(d) for _, d in pairs), default=0)), dtype=np.uint8)
    for i, (_, digest) in enumerate(pairs):
        digests[i, : len(digest)] = np.frombuffer(digest, dtype=np.uint8)
    return np.array([group for group, _ in pairs], dtype=np.int64), digests


def _padded(digests: np.ndarray, width: int) -> np.ndarray:
    """`digests` as rows of `width` bytes (zero-padded on the right)."""
    out = np.zeros((len(digests), width), dtype=np.uint8)
    out[:, : digests.shape[1]] = digests
    return out


#: The layouts of the prefix-cache map `_map_entries` reads (named in a refusal).
KNOWN_LAYOUTS = "vLLM 0.10.0's to 0.34.0's"


class VllmLayoutError(EngineUnavailableError):
    """The manager is not laid out as kvcanary reads it (a vLLM release it does not know):
    one line saying what was found; exit 2 where a command meets it, a logged note in the
    assert hook."""


def _ids(value: Any) -> list[int]:
    """The block ids one map value names: a block id (0.34.0), a block, or a dict of blocks by
    id (0.33.0)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, Mapping):
        return [b for v in value.values() for b in _ids(v)]
    block_id = getattr(value, "block_id", None)
    if isinstance(block_id, int) and not isinstance(block_id, bool):
        return [block_id]
    raise VllmLayoutError(
        f"its prefix-cache map holds a {type(value).__name__} where kvcanary reads "
        f"{KNOWN_LAYOUTS} (a block, a dict of blocks, or a block id)"
    )


def _map_entries(pool: Any) -> list[tuple[bytes, int]]:
    """The prefix-cache map as (key, block id) pairs, by what the map holds: 0.33.0 maps a key
    to its block or to a dict of its blocks by id; 0.34.0 maps it to one block id, and lists
    every id of a key several blocks carry in `_dup_ids` (`_cache` keeps one of them)."""
    table = pool.cached_block_hash_to_block
    entries = getattr(table, "_cache", table)
    several = getattr(table, "_dup_ids", None) or {}
    if not isinstance(entries, Mapping) or not isinstance(several, Mapping):
        raise VllmLayoutError(
            f"its prefix-cache map is a {type(table).__name__} kvcanary cannot list "
            f"({KNOWN_LAYOUTS} are read)"
        )

    def listed(key: Any) -> list[int]:
        """The ids `_dup_ids` lists for `key` (none: it names one block)."""
        return [j for i in several.get(key, ()) for j in _ids(i)]

    out: list[tuple[bytes, int]] = []
    for key, value in entries.items():
        # most often one block (0.33.0) or one block id (0.34.0), read here at once
        block_id = value if type(value) is int else getattr(value, "block_id", None)
        if type(block_id) is int and key not in several:
            out.append((key, block_id))
            continue
        out.extend((key, i) for i in dict.fromkeys(_ids(value) + listed(key)))
    for key in several:
        if key not in entries:
            out.extend((key, i) for i in dict.fromkeys(listed(key)))
    return out


_BLOCK_ID = operator.attrgetter("block_id")


def _tables(owners: list[tuple[int, int, int]], block_ids: list[int]) -> np.ndarray:
    """Rows (group, request, index, block) of every table, sorted by group, request, index:
    `owners` names each table and its length, `block_ids` their blocks one after another."""
    shape = np.array(owners, dtype=np.int64).reshape(-1, 3)
    lengths = shape[:, 2]
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    table = np.empty((len(block_ids), 4), dtype=np.int64)
    table[:, 0] = np.repeat(shape[:, 0], lengths)
    table[:, 1] = np.repeat(shape[:, 1], lengths)
    table[:, 2] = np.arange(len(block_ids), dtype=np.int64) - starts
    table[:, 3] = block_ids
    return table[np.lexsort((table[:, 2], table[:, 1], table[:, 0]))]


def snapshot(
    manager: Any,
    *,
    requests: Mapping[str, Any] | None = None,
    deferred_frees: Iterable[Any] = (),
    version: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> VllmState:
    """`manager`'s pool and tables as a state.

    `requests`: the scheduler's requests by id (waiting and running); without them every
    request with a table counts as live (no false "dead request"). `deferred_frees`: the
    scheduler's `deferred_frees` ((fence, blocks) pairs) or plain block lists. A manager
    laid out otherwise than the releases kvcanary reads is a `VllmLayoutError` (one line)."""
    try:
        return _read(manager, requests, deferred_frees, version, extra)
    except (AttributeError, TypeError, KeyError) as exc:
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        raise VllmLayoutError(
            f"its KV-cache manager is not laid out as kvcanary reads it ({KNOWN_LAYOUTS} "
            f"are): {text}"
        ) from None


def _read(
    manager: Any,
    requests: Mapping[str, Any] | None,
    deferred_frees: Iterable[Any],
    version: str | None,
    extra: Mapping[str, str] | None,
) -> VllmState:
    pool = manager.block_pool
    managers = tuple(manager.coordinator.single_type_managers)
    blocks = pool.blocks
    n = len(blocks)
    queue = pool.free_block_queue
    forward, complete = _walk(
        queue.fake_free_list_head.next_free_block, "next_free_block", queue.fake_free_list_tail, n
    )
    backward, _ = _walk(
        queue.fake_free_list_tail.prev_free_block, "prev_free_block", queue.fake_free_list_head, n
    )
    ref_cnt = np.fromiter((b.ref_cnt for b in blocks), dtype=np.int64, count=n)
    keyed = [(b.block_id, b.block_hash) for b in blocks if b.block_hash is not None]
    hashed = np.array([block_id for block_id, _ in keyed], dtype=np.int64)
    groups, digests = _split_keys([key for _, key in keyed])
    mapped = _map_entries(pool)
    map_group, map_digests = _split_keys([key for key, _ in mapped])
    extra_block: list[int] = []
    extra_keys: list[Any] = []
    for block_id, keys in getattr(pool, "cached_block_hashes_by_block", {}).items():
        for key in keys:
            extra_block.append(int(block_id))
            extra_keys.append(key)
    extra_group, extra_digests = _split_keys(extra_keys)
    width = max(d.shape[1] for d in (digests, map_digests, extra_digests))
    hash_group = np.full(n, -1, dtype=np.int64)
    hash_group[hashed] = groups
    hash_digest = np.zeros((n, width), dtype=np.uint8)
    hash_digest[hashed] = _padded(digests, width)

    ids: dict[str, int] = {}
    live = set(requests) if requests is not None else None
    for rid in requests or ():
        ids.setdefault(rid, len(ids))
    owners: list[tuple[int, int, int]] = []  # (group, request, entries) per table
    block_ids: list[int] = []
    for g, m in enumerate(managers):
        if _own_pool(m, pool):  # (ids of another pool: not this one's blocks)
            continue
        for rid, table in m.req_to_blocks.items():
            owners.append((g, ids.setdefault(rid, len(ids)), len(table)))
            block_ids.extend(map(int, map(_BLOCK_ID, table)))
    deferred: list[int] = []
    for item in deferred_frees:
        held = item[1] if isinstance(item, tuple) else item
        deferred.extend(int(b.block_id) for b in held if not b.is_null)
    table = _tables(owners, block_ids)
    request_ids = tuple(ids)
    tokens = np.zeros(len(ids), dtype=np.int64)
    computed = np.zeros(len(ids), dtype=np.int64)
    # tokens scheduled, not yet processed (vLLM's async scheduling; 0 where `Request` has no
    # such count: its manager frees on the computed tokens), and their stale share (a
    # preempted request's steps still in flight: 0.27.0 on, else not recorded)
    in_flight = np.zeros(len(ids), dtype=np.int64)
    stale = np.zeros(len(ids), dtype=np.int64)
    stale_known = requests is not None
    prompt = np.zeros(len(ids), dtype=np.int64)
    for rid, r in ids.items():
        req = (requests or {}).get(rid)
        if req is not None:
            tokens[r] = int(req.num_tokens)
            computed[r] = int(req.num_computed_tokens)
            in_flight[r] = int(getattr(req, "num_in_flight_tokens", 0) or 0)
            share = getattr(req, "num_stale_output_tokens", None)
            stale_known = stale_known and isinstance(share, int)
            stale[r] = int(share or 0)
            prompt[r] = int(getattr(req, "num_prompt_tokens", 0) or 0)
    free_queue = np.array(forward, dtype=np.int64)
    return VllmState(
        num_blocks=n,
        null_block=int(pool.null_block.block_id),
        num_free_blocks=int(queue.num_free_blocks),
        groups=group_specs(
            managers,
            max_model_len=_model_len(manager),
            requests_known=requests is not None,
            pool=pool,
        ),
        request_ids=request_ids,
        request_live=np.array([live is None or rid in live for rid in request_ids], dtype=bool),
        request_num_tokens=tokens,
        request_num_computed=computed,
        request_num_in_flight=in_flight if requests is not None else None,
        request_num_stale_in_flight=stale if stale_known else None,
        request_num_prompt=prompt if requests is not None else None,
        ref_cnt=ref_cnt,
        free_queue=free_queue,
        free_queue_reverse=np.array(backward, dtype=np.int64),
        queue_complete=complete,
        hash_group=hash_group,
        hash_digest=hash_digest,
        map_block=np.array([block_id for _, block_id in mapped], dtype=np.int64),
        map_group=map_group,
        map_digest=_padded(map_digests, width),
        extra_key_block=np.array(extra_block, dtype=np.int64),
        extra_key_group=extra_group,
        extra_key_digest=_padded(extra_digests, width),
        table_group=table[:, 0],
        table_request=table[:, 1],
        table_index=table[:, 2],
        table_block=table[:, 3],
        deferred_block=np.array(deferred, dtype=np.int64),
        deferred_request=np.full(len(deferred), -1, dtype=np.int64),
        released_block=np.array(sorted(getattr(pool, "_reuse_watchers", {})), dtype=np.int64),
        version=version,
        extra=dict(extra or {}),
    )
