"""vLLM's block-pool bookkeeping as arrays: the dump's layout (docs/dump-format.md, "vLLM
dumps"), read from and written to a dump.

One state is one scheduler's `KVCacheManager` at one step: the pool's reference counts and
hashes, the free queue as walked both ways, the prefix-cache map, every group's request block
tables (flat: one entry per (group, request, index)), deferred frees, and the request set.
Reading checks the arrays' shapes and cross-references (bad input, exit 2); what they say
about the pool is the check's business.

A shrunk dump (`kvcanary shrink`, see `shrink`) is the same layout in the original's ids,
holding part of it: `vllm.kept_blocks` lists the blocks whose state it holds whole (their
per-block rows, every free-queue place, table and map entry naming them), `vllm.free_queue_at`
(and `..._reverse_at`) the places of the queue entries kept, and `vllm.shrunk` the original's
counts. It reads into a `VllmState` at the original's size with `shrunk` saying what is known.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvcanary_cli.dump.engine import StoredArrays
from kvcanary_cli.dump.schema import ENGINE_KEY, FORMAT_VERSION, SHRINK_KEY, parse_integer
from kvcanary_cli.errors import DumpError, MetadataError, MissingTensorError, TensorShapeError

__all__ = [
    "ENGINE",
    "CHUNKED_LOCAL",
    "FULL",
    "LAYOUT_TENSORS",
    "MAMBA",
    "RSWA",
    "SHRUNK_KEY",
    "SLIDING_WINDOW",
    "GroupSpec",
    "ShrunkPool",
    "VllmState",
    "scratch_count",
    "state_of",
]

#: The engine name in `kvcanary.engine`.
ENGINE = "vllm"
#: Group kinds: full attention keeps every block; a sliding window and chunked local
#: attention drop (null) the blocks before their window, a leading run; a Mamba group keeps
#: only its latest state blocks, and its prefix-caching ("align") mode leaves nulls between
#: them; a reference sliding window nulls the gap between a prompt and its window. Another
#: manager's kind is its class name in snake case (its tables unchecked where kvcanary does
#: not know the rule).
FULL = "full"
SLIDING_WINDOW = "sliding_window"
CHUNKED_LOCAL = "chunked_local_attention"
MAMBA = "mamba"
#: vLLM's reference sliding window (R-SWA, 0.25.0 on): every prompt block kept, and of the
#: generated tokens the last `window`; the blocks between null
RSWA = "rswa"

#: The metadata key of a shrunk dump's original counts.
SHRUNK_KEY = "vllm.shrunk"
#: Per-block tensors: a shrunk dump holds the rows of its kept blocks only.
_PER_BLOCK = ("vllm.ref_cnt", "vllm.hash_group", "vllm.hash_digest")

_I64 = np.int64
_I32 = np.int32


@dataclass(frozen=True, kw_only=True)
class GroupSpec:
    """One KV-cache group: its manager kind, block size (tokens), window (tokens: a sliding
    window's, or chunked local attention's chunk) and, for a Mamba group, the most state
    blocks its manager keeps in a live request's table at once and the scratch blocks at
    the end of that table (a speculative decoder's)."""

    kind: str
    block_size: int
    window: int | None = None
    #: a Mamba group's bound on a live request's non-null entries with no tokens in flight;
    #: its tokens in flight (`VllmState.request_num_in_flight`) allow one more per block
    #: they reach (None: not known, or another kind)
    max_states: int | None = None
    #: a Mamba group's scratch blocks per live request (vLLM's `num_speculative_blocks`, one
    #: per draft token a step verifies): the last entries of its table, after the running
    #: state (0: none, or not recorded)
    speculative_blocks: int = 0
    #: its manager keeps a block pool of its own (a host tier's: vLLM's HiSparse source
    #: group): its tables name that pool's blocks, not this one's, and are not recorded
    own_pool: bool = False

    def record(self) -> dict[str, Any]:
        """The group's `vllm.groups` object (`max_states` only where known,
        `speculative_blocks` only where there are some)."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "block_size": self.block_size,
            "window": self.window,
        }
        if self.max_states is not None:
            out["max_states"] = self.max_states
        if self.speculative_blocks:
            out["speculative_blocks"] = self.speculative_blocks
        if self.own_pool:
            out["own_pool"] = True
        return out


def _empty(dtype: type, *shape: int) -> np.ndarray:
    return np.zeros(shape or (0,), dtype=dtype)


@dataclass(frozen=True, kw_only=True, eq=False)
class ShrunkPool:
    """What a shrunk dump holds of its original: the check reads these so that what was
    dropped is neither a finding (a leak, a count mismatch) nor counted."""

    #: per block: its state is held whole (ref count, hash, queue places, holders, map keys).
    blocks: np.ndarray
    #: each kept `free_queue` entry's place from the head, and the queue's original length.
    queue_at: np.ndarray
    queue_length: int
    #: the same for the walk back (None when the dump has none).
    reverse_at: np.ndarray | None
    reverse_length: int | None
    #: the original's counts (the report's).
    referenced: int
    requests_with_blocks: int
    group_entries: tuple[int, ...]

    def metadata(self) -> str:
        """The `vllm.shrunk` value."""
        return json.dumps(
            {
                "free_queue_length": self.queue_length,
                "free_queue_reverse_length": self.reverse_length,
                "referenced": self.referenced,
                "requests_with_blocks": self.requests_with_blocks,
                "group_entries": list(self.group_entries),
            },
            sort_keys=True,
        )


@dataclass(frozen=True, kw_only=True, eq=False)
class VllmState:
    """The arrays of one vLLM block-pool dump (ids are block ids unless named otherwise)."""

    num_blocks: int
    null_block: int = 0
    #: the free queue's own counter (`num_free_blocks`).
    num_free_blocks: int
    groups: tuple[GroupSpec, ...]
    #: request ids; `request_*` and `table_request`/`deferred_request` index them.
    request_ids: tuple[str, ...]
    #: 1 for a request the scheduler has (waiting or running), 0 for one it no longer has.
    request_live: np.ndarray
    request_num_tokens: np.ndarray
    request_num_computed: np.ndarray
    #: tokens scheduled but not yet processed (vLLM's async scheduling), per request (None:
    #: not recorded: none in flight where a Mamba bound is recorded)
    request_num_in_flight: np.ndarray | None = None
    #: the stale share of those (a preempted request's steps still in flight, which read its
    #: old table; None: not recorded, the share unknown)
    request_num_stale_in_flight: np.ndarray | None = None
    #: each request's prompt tokens (a reference sliding window keeps them all; None: not
    #: recorded)
    request_num_prompt: np.ndarray | None = None
    ref_cnt: np.ndarray
    #: the queue walked head → tail by `next` links, and tail → head by `prev` links.
    free_queue: np.ndarray
    free_queue_reverse: np.ndarray | None = None
    #: the forward walk reached the tail sentinel (False: cut after `num_blocks` steps).
    queue_complete: bool = True
    #: per block: its hash's group (−1: no hash) and digest (the hash without its group id).
    hash_group: np.ndarray
    hash_digest: np.ndarray
    #: the prefix-cache map, one entry per (key, block).
    map_block: np.ndarray
    map_group: np.ndarray
    map_digest: np.ndarray
    #: keys a block is cached under besides its own hash (vLLM's partial prefix entries,
    #: `cached_block_hashes_by_block`): one entry per (block, key).
    extra_key_block: np.ndarray = field(default_factory=lambda: _empty(_I64))
    extra_key_group: np.ndarray = field(default_factory=lambda: _empty(_I64))
    extra_key_digest: np.ndarray | None = None
    #: the request block tables, one entry per (group, request, index), sorted so.
    table_group: np.ndarray
    table_request: np.ndarray
    table_index: np.ndarray
    table_block: np.ndarray
    #: blocks freed only after an in-flight step (ref held, in no table); request −1: unknown.
    deferred_block: np.ndarray = field(default_factory=lambda: _empty(_I64))
    deferred_request: np.ndarray = field(default_factory=lambda: _empty(_I32))
    #: blocks released until reuse: queued and counted free, still read by their table.
    released_block: np.ndarray = field(default_factory=lambda: _empty(_I64))
    version: str | None = None
    #: free-form provenance (step, model, note ...), kept as written.
    extra: Mapping[str, str] = field(default_factory=dict)
    #: a shrunk dump: what it holds of its original (None: the whole pool).
    shrunk: ShrunkPool | None = None

    @property
    def queue_length(self) -> int:
        """The free queue's walked length (the original's, on a shrunk dump)."""
        return self.shrunk.queue_length if self.shrunk else int(self.free_queue.size)

    def known(self) -> np.ndarray | None:
        """Per block: its state is held (None: every block's is)."""
        return None if self.shrunk is None else self.shrunk.blocks

    def walks(self) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """The free queue walked forward and, place by place from the head, walked back (None:
        not recorded), at their original lengths, each with the places held (None: all)."""
        rev = self.free_queue_reverse
        shrunk = self.shrunk
        if shrunk is None:
            return self.free_queue, None, None if rev is None else rev[::-1], None
        forward, held = _placed(self.free_queue, shrunk.queue_at, shrunk.queue_length)
        if rev is None or shrunk.reverse_at is None or shrunk.reverse_length is None:
            return forward, held, None, None
        length = shrunk.reverse_length
        back, back_held = _placed(rev, length - 1 - shrunk.reverse_at, length)
        return forward, held, back, back_held

    def extra_keys(self) -> np.ndarray:
        """The extra keys' digests, `[K, D]` (D: the blocks' digest width)."""
        if self.extra_key_digest is None:
            return np.zeros((self.extra_key_block.size, self.hash_digest.shape[1]), np.uint8)
        return self.extra_key_digest

    def contents(self) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """The dump's tensors and metadata strings (for `write_safetensors`); a shrunk state's
        per-block rows of its kept blocks only."""
        tensors: dict[str, np.ndarray] = {
            "vllm.request_live": np.asarray(self.request_live, dtype=np.uint8),
            "vllm.request_num_tokens": np.asarray(self.request_num_tokens, dtype=_I64),
            "vllm.request_num_computed": np.asarray(self.request_num_computed, dtype=_I64),
            "vllm.ref_cnt": np.asarray(self.ref_cnt, dtype=_I32),
            "vllm.free_queue": np.asarray(self.free_queue, dtype=_I64),
            "vllm.hash_group": np.asarray(self.hash_group, dtype=_I32),
            "vllm.hash_digest": np.asarray(self.hash_digest, dtype=np.uint8),
            "vllm.map_block": np.asarray(self.map_block, dtype=_I64),
            "vllm.map_group": np.asarray(self.map_group, dtype=_I32),
            "vllm.map_digest": np.asarray(self.map_digest, dtype=np.uint8),
            "vllm.table_group": np.asarray(self.table_group, dtype=_I32),
            "vllm.table_request": np.asarray(self.table_request, dtype=_I32),
            "vllm.table_index": np.asarray(self.table_index, dtype=_I32),
            "vllm.table_block": np.asarray(self.table_block, dtype=_I64),
            "vllm.deferred_block": np.asarray(self.deferred_block, dtype=_I64),
            "vllm.deferred_request": np.asarray(self.deferred_request, dtype=_I32),
            "vllm.released_block": np.asarray(self.released_block, dtype=_I64),
        }
        if self.extra_key_block.size:
            tensors["vllm.extra_key_block"] = np.asarray(self.extra_key_block, dtype=_I64)
            tensors["vllm.extra_key_group"] = np.asarray(self.extra_key_group, dtype=_I32)
            tensors["vllm.extra_key_digest"] = np.asarray(self.extra_keys(), dtype=np.uint8)
        for name, counts in (
            ("vllm.request_num_in_flight", self.request_num_in_flight),
            ("vllm.request_num_stale_in_flight", self.request_num_stale_in_flight),
            ("vllm.request_num_prompt_tokens", self.request_num_prompt),
        ):
            if counts is not None:
                tensors[name] = np.asarray(counts, dtype=_I64)
        if self.free_queue_reverse is not None:
            tensors["vllm.free_queue_reverse"] = np.asarray(self.free_queue_reverse, dtype=_I64)
        groups = [g.record() for g in self.groups]
        meta = {
            **self.extra,
            "kvcanary.format": FORMAT_VERSION,
            ENGINE_KEY: ENGINE,
            "vllm.num_blocks": str(self.num_blocks),
            "vllm.null_block": str(self.null_block),
            "vllm.num_free_blocks": str(self.num_free_blocks),
            "vllm.free_queue_complete": "1" if self.queue_complete else "0",
            "vllm.groups": json.dumps(groups),
            "vllm.request_ids": json.dumps(list(self.request_ids)),
        }
        if self.version is not None:
            meta["vllm.version"] = self.version
        if self.shrunk is not None:
            kept = np.flatnonzero(self.shrunk.blocks).astype(_I64)
            for name in _PER_BLOCK:
                tensors[name] = np.ascontiguousarray(tensors[name][kept])
            tensors["vllm.kept_blocks"] = kept
            tensors["vllm.free_queue_at"] = np.asarray(self.shrunk.queue_at, dtype=_I64)
            if self.shrunk.reverse_at is not None and "vllm.free_queue_reverse" in tensors:
                tensors["vllm.free_queue_reverse_at"] = np.asarray(
                    self.shrunk.reverse_at, dtype=_I64
                )
            meta[SHRUNK_KEY] = self.shrunk.metadata()
        return tensors, meta


def _placed(values: np.ndarray, at: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """`values` put at places `at` of an array of `length` (0 elsewhere), and where they are."""
    out = np.zeros(length, dtype=_I64)
    held = np.zeros(length, dtype=bool)
    out[at] = values
    held[at] = True
    return out, held


# --- reading --------------------------------------------------------------------------------

#: tensor -> (rank, required); digests are 2-D [n, digest bytes].
_TENSORS: dict[str, tuple[int, bool]] = {
    "vllm.request_live": (1, True),
    "vllm.request_num_tokens": (1, False),
    "vllm.request_num_computed": (1, False),
    "vllm.request_num_in_flight": (1, False),
    "vllm.request_num_stale_in_flight": (1, False),
    "vllm.request_num_prompt_tokens": (1, False),
    "vllm.ref_cnt": (1, True),
    "vllm.free_queue": (1, True),
    "vllm.free_queue_reverse": (1, False),
    "vllm.hash_group": (1, False),
    "vllm.hash_digest": (2, False),
    "vllm.map_block": (1, False),
    "vllm.map_group": (1, False),
    "vllm.map_digest": (2, False),
    "vllm.table_group": (1, True),
    "vllm.table_request": (1, True),
    "vllm.table_index": (1, True),
    "vllm.table_block": (1, True),
    "vllm.deferred_block": (1, False),
    "vllm.deferred_request": (1, False),
    "vllm.released_block": (1, False),
    "vllm.extra_key_block": (1, False),
    "vllm.extra_key_group": (1, False),
    "vllm.extra_key_digest": (2, False),
    "vllm.kept_blocks": (1, False),
    "vllm.free_queue_at": (1, False),
    "vllm.free_queue_reverse_at": (1, False),
}
#: Every tensor the layout names (a dump's other tensors are ignored).
LAYOUT_TENSORS = frozenset(_TENSORS)
_KNOWN_META = {
    "kvcanary.format",
    ENGINE_KEY,
    "vllm.num_blocks",
    "vllm.null_block",
    "vllm.num_free_blocks",
    "vllm.free_queue_complete",
    "vllm.groups",
    "vllm.request_ids",
    "vllm.version",
    SHRUNK_KEY,
    SHRINK_KEY,
}


def _meta_int(meta: Mapping[str, str], key: str, default: int | None = None) -> int:
    text = meta.get(key)
    if text is None:
        if default is None:
            raise MetadataError("missing (a vLLM dump records it)", field=key)
        return default
    value = parse_integer(text)
    if value is None or value < 0:
        raise MetadataError(f"{text[:40]!r} is not a non-negative integer", field=key)
    return value


def _meta_json(meta: Mapping[str, str], key: str) -> Any:
    try:
        return json.loads(meta.get(key, ""))
    except ValueError:
        raise MetadataError("is not JSON (a vLLM dump records it)", field=key) from None


def _count(value: object, *, low: int = 0, high: int = 2**62) -> bool:
    """An integer (not a bool) in [low, high): a group's sizes, below 2**62 so that sums and
    differences with a dump's token counts stay int64 whatever the dump says."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < high


def _positive(value: object) -> bool:
    return _count(value, low=1)


def scratch_count(value: object) -> bool:
    """A Mamba group's scratch blocks as a count, read from a dump or a live spec: 0 to
    2**31 − 1, far past any drafter's tokens a step, so that a table's length less it is an
    int64 whatever the count says."""
    return _count(value, high=2**31)


def _groups(meta: Mapping[str, str]) -> tuple[GroupSpec, ...]:
    raw = _meta_json(meta, "vllm.groups")
    if not isinstance(raw, list) or not raw:
        raise MetadataError("expected a non-empty JSON list of groups", field="vllm.groups")
    out = []
    for g in raw:
        ok = (
            isinstance(g, dict)
            and isinstance(g.get("kind"), str)
            and _positive(g.get("block_size"))
            and (g.get("window") is None or _count(g.get("window"), low=-(2**62)))
            and (_positive(g.get("max_states")) or g.get("max_states") is None)
            and scratch_count(g.get("speculative_blocks", 0))
            and isinstance(g.get("own_pool", False), bool)
        )
        if not ok:
            raise MetadataError(
                'each group is {"kind": str, "block_size": int > 0, "window": int | null, '
                '"max_states": int > 0 (optional), "speculative_blocks": int >= 0 (optional), '
                '"own_pool": bool (optional)}, each number below 2**62',
                field="vllm.groups",
            )
        out.append(
            GroupSpec(
                kind=g["kind"],
                block_size=g["block_size"],
                window=g.get("window"),
                max_states=g.get("max_states"),
                speculative_blocks=g.get("speculative_blocks", 0),
                own_pool=g.get("own_pool", False),
            )
        )
    return tuple(out)


def _request_ids(meta: Mapping[str, str]) -> tuple[str, ...]:
    raw = _meta_json(meta, "vllm.request_ids")
    if not isinstance(raw, list) or not all(isinstance(r, str) for r in raw):
        raise MetadataError("expected a JSON list of strings", field="vllm.request_ids")
    return tuple(raw)


def _shape(arrays: Mapping[str, np.ndarray], name: str, length: int, what: str) -> None:
    if name in arrays and arrays[name].shape[0] != length:
        raise TensorShapeError(
            f"has {arrays[name].shape[0]} entries, expected {length} ({what})", field=name
        )


def state_of(stored: StoredArrays) -> VllmState:
    """The state a vLLM dump holds; a `DumpError` naming the file and the tensor or key on
    bad input (whichever command read it)."""
    try:
        return _state_of(stored)
    except DumpError as exc:
        exc.path = exc.path or str(stored.path)
        exc.hint = exc.hint or _REWRITE
        raise


#: What to do about a vLLM dump whose tensors disagree: its writer wrote them together.
_REWRITE = (
    "capture the pool again; kvcanary's capture writes these tensors together, as "
    "docs/dump-format.md's 'vLLM dumps' lays them out"
)


def _state_of(stored: StoredArrays) -> VllmState:
    arrays, meta = stored.arrays, stored.metadata
    for name, (rank, required) in _TENSORS.items():
        if name not in arrays:
            if required:
                raise MissingTensorError("missing (a vLLM dump requires it)", field=name)
            continue
        if arrays[name].ndim != rank:
            raise TensorShapeError(f"is {arrays[name].ndim}-D, expected {rank}-D", field=name)
    n = _meta_int(meta, "vllm.num_blocks")
    groups = _groups(meta)
    requests = _request_ids(meta)
    r = len(requests)
    shrunk = _shrunk_pool(arrays, meta, n, len(groups))
    rows, what = (n, "one per block")
    if shrunk is not None:
        rows, what = int(shrunk.blocks.sum()), "one per block of vllm.kept_blocks"
    for name in _PER_BLOCK:
        _shape(arrays, name, rows, what)
    per_request = (
        *("live", "num_tokens", "num_computed", "num_in_flight", "num_stale_in_flight"),
        "num_prompt_tokens",
    )
    for name in (f"vllm.request_{what}" for what in per_request):
        _shape(arrays, name, r, "one per request of vllm.request_ids")
    e = arrays["vllm.table_block"].shape[0]
    for name in ("vllm.table_group", "vllm.table_request", "vllm.table_index"):
        _shape(arrays, name, e, "one per entry of vllm.table_block")
    m = arrays.get("vllm.map_block", _empty(_I64)).shape[0]
    _shape(arrays, "vllm.map_group", m, "one per entry of vllm.map_block")
    _shape(arrays, "vllm.map_digest", m, "one per entry of vllm.map_block")
    d = arrays.get("vllm.deferred_block", _empty(_I64)).shape[0]
    _shape(arrays, "vllm.deferred_request", d, "one per entry of vllm.deferred_block")
    k = arrays.get("vllm.extra_key_block", _empty(_I64)).shape[0]
    _shape(arrays, "vllm.extra_key_group", k, "one per entry of vllm.extra_key_block")
    _shape(arrays, "vllm.extra_key_digest", k, "one per entry of vllm.extra_key_block")
    width = arrays["vllm.hash_digest"].shape[1] if "vllm.hash_digest" in arrays else 0
    for name in ("vllm.map_digest", "vllm.extra_key_digest"):
        if name in arrays and arrays[name].shape[1] != width:
            raise TensorShapeError(
                f"digests are {arrays[name].shape[1]} bytes, vllm.hash_digest's {width}",
                field=name,
            )

    def ints(name: str, dtype: type, default_len: int = 0) -> np.ndarray:
        return np.asarray(arrays.get(name, _empty(dtype, default_len)), dtype=dtype)

    def optional(name: str) -> np.ndarray | None:
        return ints(name, _I64) if name in arrays else None

    tg = ints("vllm.table_group", _I64)
    tr = ints("vllm.table_request", _I64)
    ti = ints("vllm.table_index", _I64)
    tb = ints("vllm.table_block", _I64)
    if tg.size and (tg.min() < 0 or tg.max() >= len(groups)):
        raise TensorShapeError(
            f"names a group outside 0..{len(groups) - 1}", field="vllm.table_group"
        )
    if tr.size and (tr.min() < 0 or tr.max() >= r):
        raise TensorShapeError(f"names a request outside 0..{r - 1}", field="vllm.table_request")
    ascending = (tg[1:] > tg[:-1]) | (
        (tg[1:] == tg[:-1]) & ((tr[1:] > tr[:-1]) | ((tr[1:] == tr[:-1]) & (ti[1:] > ti[:-1])))
    )
    if not ascending.all():  # written in another order: sorted by (group, request, index)
        order = np.lexsort((ti, tr, tg))
        tg, tr, ti, tb = tg[order], tr[order], ti[order], tb[order]
    starts = np.ones(tg.size, dtype=bool)
    starts[1:] = (tg[1:] != tg[:-1]) | (tr[1:] != tr[:-1])
    first = np.maximum.accumulate(np.where(starts, np.arange(tg.size), 0))
    if not np.array_equal(ti, np.arange(tg.size) - first):
        raise TensorShapeError(
            "each (group, request) table's indices must count 0, 1, 2, ... without gaps or repeats",
            field="vllm.table_index",
        )
    dr = ints("vllm.deferred_request", _I64, d) if "vllm.deferred_request" in arrays else None
    if dr is None:
        dr = np.full(d, -1, dtype=_I64)
    if dr.size and (dr.min() < -1 or dr.max() >= r):
        raise TensorShapeError(
            f"names a request outside -1..{r - 1}", field="vllm.deferred_request"
        )
    null = _meta_int(meta, "vllm.null_block", 0)
    if null >= max(n, 1):
        raise MetadataError(f"{null} is outside the pool of {n} blocks", field="vllm.null_block")
    complete = meta.get("vllm.free_queue_complete", "1").strip()
    if complete not in ("0", "1"):
        raise MetadataError("expected 0 or 1", field="vllm.free_queue_complete")
    return VllmState(
        num_blocks=n,
        null_block=null,
        num_free_blocks=_meta_int(meta, "vllm.num_free_blocks"),
        groups=groups,
        request_ids=requests,
        request_live=ints("vllm.request_live", _I64) != 0,
        request_num_tokens=ints("vllm.request_num_tokens", _I64, r),
        request_num_computed=ints("vllm.request_num_computed", _I64, r),
        request_num_in_flight=optional("vllm.request_num_in_flight"),
        request_num_stale_in_flight=optional("vllm.request_num_stale_in_flight"),
        request_num_prompt=optional("vllm.request_num_prompt_tokens"),
        ref_cnt=_expanded(ints("vllm.ref_cnt", _I64), shrunk, 0),
        free_queue=ints("vllm.free_queue", _I64),
        free_queue_reverse=(
            ints("vllm.free_queue_reverse", _I64) if "vllm.free_queue_reverse" in arrays else None
        ),
        queue_complete=complete == "1",
        hash_group=_expanded(
            ints("vllm.hash_group", _I64) if "vllm.hash_group" in arrays else np.full(rows, -1),
            shrunk,
            -1,
        ),
        hash_digest=_expanded(
            np.asarray(arrays.get("vllm.hash_digest", np.zeros((rows, 0), np.uint8))), shrunk, 0
        ),
        map_block=ints("vllm.map_block", _I64),
        map_group=ints("vllm.map_group", _I64, m),
        map_digest=np.asarray(arrays.get("vllm.map_digest", np.zeros((m, width), np.uint8))),
        extra_key_block=ints("vllm.extra_key_block", _I64),
        extra_key_group=ints("vllm.extra_key_group", _I64, k),
        extra_key_digest=np.asarray(
            arrays.get("vllm.extra_key_digest", np.zeros((k, width), np.uint8))
        ),
        table_group=tg,
        table_request=tr,
        table_index=ti,
        table_block=tb,
        deferred_block=ints("vllm.deferred_block", _I64),
        deferred_request=dr,
        released_block=ints("vllm.released_block", _I64),
        version=meta.get("vllm.version"),
        extra={k: v for k, v in meta.items() if k not in _KNOWN_META},
        shrunk=shrunk,
    )


def _expanded(rows: np.ndarray, shrunk: ShrunkPool | None, fill: int) -> np.ndarray:
    """A per-block array at the pool's size: a shrunk dump's kept rows in place, `fill`
    for the blocks it dropped."""
    if shrunk is None:
        return rows
    out = np.full((shrunk.blocks.size, *rows.shape[1:]), fill, dtype=rows.dtype)
    out[shrunk.blocks] = rows
    return out


def _places(arrays: Mapping[str, np.ndarray], name: str, entries: str, length: int) -> np.ndarray:
    """Tensor `name`: the ascending places (below `length`) of the entries of `entries`."""
    if name not in arrays:
        raise MissingTensorError(f"missing (a shrunk dump with {entries} has it)", field=name)
    at = np.asarray(arrays[name], dtype=_I64)
    _shape(arrays, name, arrays[entries].shape[0], f"one per entry of {entries}")
    if at.size and (at[0] < 0 or at[-1] >= length or (np.diff(at) <= 0).any()):
        raise TensorShapeError(
            f"places must ascend, each once, inside the queue's {length} places", field=name
        )
    return at


def _shrunk_count(raw: dict[str, Any], key: str) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MetadataError(f"{key} is not a non-negative integer", field=SHRUNK_KEY)
    return value


def _shrunk_pool(
    arrays: Mapping[str, np.ndarray], meta: Mapping[str, str], n: int, groups: int
) -> ShrunkPool | None:
    """What a shrunk dump holds of its original (None: a whole dump)."""
    parts = ("vllm.free_queue_at", "vllm.free_queue_reverse_at")
    if "vllm.kept_blocks" not in arrays:
        if SHRUNK_KEY in meta or any(p in arrays for p in parts):
            raise MissingTensorError(
                "missing (a shrunk vLLM dump has it)", field="vllm.kept_blocks"
            )
        return None
    raw = _meta_json(meta, SHRUNK_KEY)
    if not isinstance(raw, dict):
        raise MetadataError("expected a JSON object", field=SHRUNK_KEY)
    entries = raw.get("group_entries")
    if not isinstance(entries, list) or len(entries) != groups:
        raise MetadataError(f"group_entries is not a list of {groups} counts", field=SHRUNK_KEY)
    counts = tuple(_shrunk_count({"group_entries": e}, "group_entries") for e in entries)
    kept = np.asarray(arrays["vllm.kept_blocks"], dtype=_I64)
    if kept.size and (kept[0] < 0 or kept[-1] >= n or (np.diff(kept) <= 0).any()):
        raise TensorShapeError(
            f"blocks must ascend, each once, inside the pool of {n}", field="vllm.kept_blocks"
        )
    blocks = np.zeros(n, dtype=bool)
    blocks[kept] = True
    length = _shrunk_count(raw, "free_queue_length")
    reverse_at: np.ndarray | None = None
    reverse_length: int | None = None
    if "vllm.free_queue_reverse" in arrays:
        reverse_length = _shrunk_count(raw, "free_queue_reverse_length")
        reverse_at = _places(arrays, parts[1], "vllm.free_queue_reverse", reverse_length)
    return ShrunkPool(
        blocks=blocks,
        queue_at=_places(arrays, parts[0], "vllm.free_queue", length),
        queue_length=length,
        reverse_at=reverse_at,
        reverse_length=reverse_length,
        referenced=_shrunk_count(raw, "referenced"),
        requests_with_blocks=_shrunk_count(raw, "requests_with_blocks"),
        group_entries=counts,
    )
