"""Synthetic dumps: consistent random serving states, built the way SGLang's allocators work.

A short serving history runs on the allocator simulation of `synth.allocator` (docs/semantics.md
§2-§3): pool rows handed out LIFO and freed without clearing (stale tails), token slots from a
free list (slot or page 0 reserved), radix sharing reusing the same slots at the same positions;
pending writes sit in `[P, P+E)`, and the SWA LUT maps the recent window, older slots cleared
lazily by whole pages. Work is per request (numpy slices), never per token, so production-size
tables build quickly.

With `unified`, the SWA model runs on SGLang's unified memory instead (`layout` unified-swa):
the same history's ids are virtual, minted by the full side, and each side binds them to
physical pages of its own (`_unified`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvcanary_cli.canary.constants import RECORD_BYTES
from kvcanary_cli.canary.hashing import (
    CHAIN_HEAD,
    as_int64,
    combine_source_hashes,
    fold_chunks,
    mix3_array,
)
from kvcanary_cli.dump.files import Target
from kvcanary_cli.dump.tensor import difference, distinct, union
from kvcanary_cli.dump.writer import dump_contents, dump_writer, write_dump
from kvcanary_cli.synth.allocator import (
    FullPool,
    RowPool,
    SwaPool,
    expand,
    page_slots,
    slots_at,
)

__all__ = ["LiveRequest", "SynthDump", "SynthSpec", "build_dump"]


@dataclass(frozen=True, kw_only=True)
class SynthSpec:
    """Shape and behaviour of one synthetic state."""

    max_reqs: int = 12
    max_seq_len: int = 48
    page_size: int = 1
    #: live requests in the batch this step.
    active_rows: int = 4
    #: CUDA-graph padding rows (pool row 0) appended to the batch.
    padding_rows: int = 1
    #: requests that ran and finished before this step (they leave stale tails).
    history: int = 6
    #: 'decode' (E = 1), 'extend' (E >= 1) or 'mixed'.
    mode: str = "extend"
    #: probability that a new request shares a radix prefix with a live one.
    share_prob: float = 0.5
    #: SWA window; 0 means no SWA group (no LUT).
    window: int = 0
    #: probability that a slot outside every live window has its SWA peer cleared already.
    evict_prob: float = 0.7
    expected_pool: bool = False
    token_offset: int = 0
    free_lists: bool = True
    write_tensors: bool = True
    #: verify capacity to record; None leaves the default (no overflow).
    verify_capacity: int | None = None
    #: extra full-pool slots beyond what the simulation can need.
    spare_slots: int = 16
    #: longest request (tokens before this step); None: the row length minus headroom.
    max_request_len: int | None = None
    #: full-pool slots (size + page_size); None: enough for every row to be full.
    pool_slots: int | None = None
    #: hand full-pool pages out from a shuffled free list, as a serving engine's does after
    #: some churn (a request then holds pages from all over the pool); False: in page order.
    shuffled_free_list: bool = False
    vocab: int = 32000
    #: stamp canary buffers (HEAD and TAIL, K) with clean chains over every live prefix.
    canary: bool = False
    #: with `canary`: the V buffers too.
    canary_v: bool = False
    #: with `canary`: real-KV sources (`real_kv.<group>.<half>`, partial mode), so that TAIL
    #: records carry a fingerprint.
    canary_real_kv: bool = False
    #: record the request pool's free rows and the running requests' rows (`free_req_rows`,
    #: `running_req_rows`).
    req_rows: bool = False
    #: with `req_rows`: record the radix tree's locked slots (`tree_locked_full_slots`), each
    #: live request's prefix (what its lock covers).
    tree_locks: bool = False
    #: with `window`: SGLang's unified memory (`--enable-unified-memory`, lazy compaction)
    #: instead of the paged SWA pools: virtual ids, each side's page tables and holes.
    unified: bool = False
    #: with `unified`: an SWA page's bytes over a full page's (a model with more SWA layers
    #: than full ones); the SWA side counts that many times fewer physical pages of the buffer.
    swa_page_scale: int = 1


@dataclass(kw_only=True)
class LiveRequest:
    """Ground truth for one active batch row: what a correct dump says about it."""

    batch_row: int
    pool_row: int
    prefix_len: int
    extend_len: int
    tokens: np.ndarray
    slots: np.ndarray


@dataclass(kw_only=True)
class SynthDump:
    """A state ready to save; scenarios corrupt `tensors` in place before saving."""

    spec: SynthSpec
    seed: int
    tensors: dict[str, np.ndarray]
    metadata: dict[str, str]
    live: list[LiveRequest]
    #: where a scenario's corruption landed (batch_row, pool_row, position, slot, ...),
    #: so tests can check that findings point at the right cell.
    truth: dict[str, int] = field(default_factory=dict)

    def save(self, path: str | Path, *, overwrite: bool = True) -> Path:
        """Write the state as a format-v1 dump (`overwrite` False: refuse an existing file)."""
        contents = dump_contents(self.metadata, self.tensors)
        return write_dump(path, contents, overwrite=overwrite)

    def target(self, path: str | Path) -> Target:
        """The dump as one of several files written together (`write_all_atomically`)."""
        return Path(path), dump_writer(dump_contents(self.metadata, self.tensors))


@dataclass(kw_only=True)
class _Request:
    row: int
    tokens: np.ndarray
    pages: np.ndarray  # full-pool pages, in position order
    owned_from: int  # positions < owned_from are a radix prefix shared with another request

    def length(self) -> int:
        return int(self.tokens.shape[0])

    def slots(self, page_size: int) -> np.ndarray:
        return slots_at(self.pages, 0, self.length(), page_size)


def build_dump(spec: SynthSpec, seed: int = 0) -> SynthDump:
    """Simulate a serving history and return the state of its last forward step."""
    rng = np.random.default_rng(seed)
    p = spec.page_size
    pages_per_row = math.ceil(spec.max_seq_len / p)
    if spec.pool_slots is not None:
        num_pages = math.ceil(spec.pool_slots / p)
    else:
        num_pages = (spec.max_reqs - 1) * pages_per_row + 1 + math.ceil(spec.spare_slots / p)
    full = FullPool(num_pages, p, rng if spec.shuffled_free_list else None)
    num_full_slots = full.num_slots
    rows = RowPool(spec.max_reqs, spec.max_seq_len)
    req_to_token = rows.table
    pool_cols = spec.max_seq_len
    expected = rng.integers(0, spec.vocab, size=(spec.max_reqs, pool_cols), dtype=np.int32)
    live: list[_Request] = []
    budget = spec.max_seq_len - 2  # leave room for this step's writes
    if spec.max_request_len is not None:
        budget = min(budget, spec.max_request_len)

    def start(length: int) -> _Request:
        row = rows.take()
        shared = 0
        donor = None
        # A draft pool's record at p holds token p+1, which two sharers need not agree on:
        # stamped draft pools share nothing.
        if live and rng.random() < spec.share_prob and not (spec.canary and spec.token_offset):
            donor = live[int(rng.integers(len(live)))]
            shared = min(donor.length(), int(rng.integers(1, length + 1))) // p * p
        own_pages = full.alloc(math.ceil((length - shared) / p))
        if donor is not None and shared:
            full.hold(donor.pages[: shared // p])
            pages = np.concatenate([donor.pages[: shared // p], own_pages])
            tokens = np.concatenate(
                [donor.tokens[:shared], rng.integers(0, spec.vocab, length - shared)]
            )
        else:
            pages, tokens = own_pages, rng.integers(0, spec.vocab, length)
        request = _Request(row=row, tokens=tokens.astype(np.int64), pages=pages, owned_from=shared)
        req_to_token[row, :length] = request.slots(p)
        expected[row, :length] = request.tokens
        live.append(request)
        return request

    def finish(request: _Request) -> None:
        live.remove(request)
        full.release(request.pages)
        rows.give_back(request.row)

    for _ in range(spec.history):
        if len(live) >= spec.max_reqs - 1 or (live and rng.random() < 0.5):
            finish(live[int(rng.integers(len(live)))])
        start(int(rng.integers(1, budget + 1)))
    while len(live) > spec.active_rows:
        finish(live[int(rng.integers(len(live)))])
    while len(live) < spec.active_rows:
        start(int(rng.integers(1, budget + 1)))

    # This step: each live request writes E new tokens at [P, P+E).
    prefix = [r.length() for r in live]
    extend: list[int] = []
    for request in live:
        room = spec.max_seq_len - request.length()
        mode = spec.mode if spec.mode != "mixed" else ("decode", "extend")[int(rng.integers(2))]
        e = 1 if mode == "decode" else int(rng.integers(1, max(2, min(room, 12) + 1)))
        e = min(e, room)
        old_len = request.length()
        # Fill the partial last page first, then whole new pages.
        need_pages = math.ceil((old_len + e) / p) - math.ceil(old_len / p)
        new_pages = full.alloc(need_pages)
        request.pages = np.concatenate([request.pages, new_pages])
        request.tokens = np.concatenate([request.tokens, rng.integers(0, spec.vocab, e)])
        req_to_token[request.row, : old_len + e] = request.slots(p)
        expected[request.row, : old_len + e] = request.tokens
        extend.append(e)

    order = rng.permutation(len(live))
    batch = [live[i] for i in order]
    prefix = [prefix[i] for i in order]
    extend = [extend[i] for i in order]
    pad = spec.padding_rows
    bs = len(batch) + pad
    rpi = np.array([r.row for r in batch] + [0] * pad, dtype=np.int64)
    prefix_lens = np.array(prefix + list(rng.integers(0, 4, pad)), dtype=np.int64)
    extend_lens = np.array(extend + list(rng.integers(0, 2, pad)), dtype=np.int64)

    tensors: dict[str, np.ndarray] = {
        "req_to_token": req_to_token,
        "req_pool_indices": rpi,
        "prefix_lens": prefix_lens,
        "extend_seq_lens": extend_lens,
    }
    metadata: dict[str, str] = {
        "page_size": str(p),
        "num_full_slots": str(num_full_slots),
        "write_req_capacity": str(bs),
        "kv_token_id_vs_position_offset": str(spec.token_offset),
        "forward_mode": spec.mode,
        "model": "synthetic",
        "note": f"kvcanary synth seed={seed}",
    }
    if spec.verify_capacity is not None:
        metadata["verify_capacity"] = str(spec.verify_capacity)
    live_requests = [
        LiveRequest(
            batch_row=i,
            pool_row=r.row,
            prefix_len=prefix[i],
            extend_len=extend[i],
            tokens=r.tokens.copy(),
            slots=r.slots(p),
        )
        for i, r in enumerate(batch)
    ]
    if spec.write_tensors:
        slots = [lr.slots[lr.prefix_len :] for lr in live_requests]
        toks = [lr.tokens[lr.prefix_len :] for lr in live_requests]
        poss = [np.arange(lr.prefix_len, lr.prefix_len + lr.extend_len) for lr in live_requests]
        tensors["out_cache_loc"] = _cat(slots)
        tensors["input_ids"] = _cat(toks)
        tensors["positions"] = _cat(poss)
    if spec.free_lists:
        tensors["free_full_slots"] = full.free_slots()
    if spec.req_rows:
        tensors["free_req_rows"] = np.array(rows.free_rows(), dtype=np.int64)
        tensors["running_req_rows"] = np.array([r.row for r in live], dtype=np.int64)
    if spec.req_rows and spec.tree_locks:
        tensors["tree_locked_full_slots"] = distinct(
            _cat([lr.slots[: lr.prefix_len] for lr in live_requests]).astype(np.int64)
        )
    if spec.expected_pool:
        valid = np.array(
            [lr.prefix_len + lr.extend_len for lr in live_requests] + [0] * pad, dtype=np.int64
        )
        tensors["req_to_verify_expected_tokens"] = expected
        tensors["req_to_verify_expected_tokens_valid_lens"] = valid
    if spec.window > 0 and spec.unified:
        unified, notes = _unified(live_requests, spec, rng, full, spec.max_reqs)
        tensors.update(unified)
        metadata.update(notes)
    elif spec.window > 0:
        _add_swa(tensors, metadata, live_requests, spec, rng, num_full_slots)
    if spec.canary:
        _stamp_canary(tensors, metadata, live_requests, spec, rng, num_full_slots)
    return SynthDump(spec=spec, seed=seed, tensors=tensors, metadata=metadata, live=live_requests)


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(parts).astype(np.int64)


def _add_swa(
    tensors: dict[str, np.ndarray],
    metadata: dict[str, str],
    live: list[LiveRequest],
    spec: SynthSpec,
    rng: np.random.Generator,
    num_full_slots: int,
) -> None:
    """Map live full slots to SWA slots page by page, then clear old pages lazily (§2)."""
    p = spec.page_size
    full_pages, mapped = _swa_pages(live, spec, rng)
    swa = SwaPool(mapped.size + 1 + max(2, mapped.size // 4), num_full_slots, p, rng)
    swa.map(mapped)
    tensors["full_to_swa_index_mapping"] = swa.lut
    metadata["swa_window_size"] = str(spec.window)
    metadata["num_swa_slots"] = str(swa.num_slots)
    if spec.free_lists:
        tensors["free_swa_slots"] = swa.free_slots()
        # what SGLang's memory check counts as held: every page of a running request
        tensors["held_full_slots"] = expand(full_pages, p)


def _swa_pages(
    live: list[LiveRequest], spec: SynthSpec, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The full pages live requests hold, and those of them whose SWA side is kept: every page
    of a live window, and each older one unless cleared already (lazily, `evict_prob`)."""
    p = spec.page_size
    window_pages = math.ceil(max(spec.window, p) / p)
    full_pages: set[int] = set()
    retained: set[int] = set()
    for lr in live:
        pages = distinct(lr.slots // p)
        full_pages.update(int(x) for x in pages)
        keep_from = max(0, (lr.prefix_len // p - window_pages)) * p
        retained.update(int(x) for x in distinct(lr.slots[keep_from:] // p))
    evictable = sorted(full_pages - retained)
    evicted = {pg for pg in evictable if rng.random() < spec.evict_prob}
    held = np.array(sorted(full_pages), dtype=np.int64)
    return held, np.array(sorted(full_pages - evicted), dtype=np.int64)


def _unified(
    live: list[LiveRequest], spec: SynthSpec, rng: np.random.Generator, full: FullPool, rows: int
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors and metadata of SGLang's unified memory (`UnifiedSWATokenToKVPoolAllocator`,
    lazy compaction) as its capture records them (docs/dump-format.md, "Layouts"); `rows` is
    the request pool's size.

    The history's page ids are the full side's virtual ids (`free_virtual_ids`, first in
    first out over `1 .. N - 1`). The radix tree keeps the pages of the requests that finished
    last (taken off the free list's tail) with their SWA side tombstoned. Both sides view one
    buffer: the full side binds every held page to a physical page grown down from the top,
    the SWA side binds the pages it keeps to pages grown up from 1 (the synthetic model's
    layers give both the same bytes per page, so both count N physical pages; with
    `swa_page_scale` s an SWA page spans s full pages' bytes, and the SWA side counts N // s,
    its virtual table still addressing the full side's N ids). Inside each side's span, pages
    freed since (`physical_holes`, sorted) wait for reuse; the span's growing edge is always
    live (compaction absorbs holes there). The SWA side's table stands for the LUT, and the
    free SWA slots are not a list (`free_swa_slots` absent).
    """
    p, n, scale = spec.page_size, full.num_pages, spec.swa_page_scale
    running, kept = _swa_pages(live, spec, rng)
    free = full.free.contents()
    cached = np.sort(free[free.size - min(free.size // 8, 2 + int(rng.integers(0, 6))) :])
    bound = union(running, cached)
    full_v2p, full_p2v, full_holes = _end_side(bound, n, n, rng, top=True)
    swa_v2p, swa_p2v, swa_holes = _end_side(kept, n, n, rng, top=False)
    # the SWA span's last byte, in full pages, below the full span's first
    if (swa_v2p[kept].max(initial=-1) + 1) * scale > full_v2p[bound].min(initial=n):
        raise RuntimeError("synthetic unified buffer too small for both sides")
    swa_p2v = np.r_[swa_p2v[: n // scale], -1].astype(np.int64)
    lut = np.zeros(n * p + 1, dtype=np.int64)
    lut[-1] = -1
    lut[page_slots(kept, p)] = page_slots(swa_v2p[kept], p)
    tensors = {
        "full_to_swa_index_mapping": lut,
        "full_virtual_to_physical": full_v2p,
        "full_physical_to_virtual": full_p2v,
        "full_physical_holes": full_holes,
        "swa_virtual_to_physical": swa_v2p,
        "swa_physical_to_virtual": swa_p2v,
        "swa_physical_holes": swa_holes,
    }
    if spec.free_lists:
        tensors["free_full_slots"] = expand(difference(free, cached), p)
        # the tree: the cached pages and the live prefixes; each running row's allocation
        prefixes = [lr.slots[: lr.prefix_len] for lr in live]
        tensors["tree_full_slots"] = union(expand(cached, p), _cat(prefixes))
        lens = np.zeros(rows, dtype=np.int64)
        for lr in live:
            lens[lr.pool_row] = lr.prefix_len + lr.extend_len
        tensors["req_pool_allocated_lens"] = lens
    return tensors, {"layout": "unified-swa", "swa_window_size": str(spec.window)}


def _end_side(
    virtual: np.ndarray, num_virtual: int, num_pages: int, rng: np.random.Generator, *, top: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One end of the unified buffer binding `virtual` (ascending pages): its
    virtual->physical table (`[num_virtual + 1]`), the reverse (`[num_pages + 1]`), entry 0
    the padding sink (0 <-> 0) and each ending in its -1 sentinel, and its holes. The span
    grows from the top (the full side) or from page 1 (the SWA side), a few holes inside it,
    never at its growing edge; the live pages sit in it in churned order."""
    v2p = np.full(num_virtual + 1, -1, dtype=np.int64)
    p2v = np.full(num_pages + 1, -1, dtype=np.int64)
    v2p[0] = p2v[0] = 0
    if not virtual.size:
        return v2p, p2v, np.zeros(0, dtype=np.int64)
    holes = int(rng.integers(1, 2 + virtual.size // 4))
    span = virtual.size + holes
    pages = np.arange(num_pages - span, num_pages) if top else np.arange(1, 1 + span)
    edge = pages[0] if top else pages[-1]
    hole = np.sort(rng.choice(pages[pages != edge], size=holes, replace=False))
    used = rng.permutation(difference(pages, hole)).astype(np.int64)
    v2p[virtual] = used
    p2v[used] = virtual
    return v2p, p2v, hole.astype(np.int64)


#: bytes per token of a synthetic real-KV source (partial mode fingerprints the first 16).
_REAL_KV_BYTES = 32


def chain_hashes(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The prev_hash each position stores, per sequence (docs/canary.md §2): int64 `[n, L]`.

    `tokens` is `[n, L]` (padded); position 0 stores the chain head, position p+1 stores
    `mix3(hash_p, token_p, p)`. One step per position, all sequences at once.
    """
    n, width = tokens.shape
    hashes = np.zeros((n, width), dtype=np.uint64)
    if width:
        hashes[:, 0] = CHAIN_HEAD
    for p in range(width - 1):
        live = lengths > p + 1
        hashes[live, p + 1] = mix3_array(hashes[live, p], tokens[live, p], p)
    return as_int64(hashes)


def record_bytes(columns: list[np.ndarray]) -> np.ndarray:
    """Slot records (token, position, prev_hash, real_kv_hash) as uint8 `[n, 32]`."""
    return np.stack(columns, axis=1).astype("<i8").view(np.uint8).reshape(-1, RECORD_BYTES)


def _stamp_canary(
    tensors: dict[str, np.ndarray],
    metadata: dict[str, str],
    live: list[LiveRequest],
    spec: SynthSpec,
    rng: np.random.Generator,
    num_full_slots: int,
) -> None:
    """Canary buffers as the write kernels leave them before this step: one record per live
    prefix cell, chained per request (radix-shared cells get the same record twice)."""
    prefix = np.array([lr.prefix_len for lr in live], dtype=np.int64)
    width = int(prefix.max()) if prefix.size else 0
    tokens = np.zeros((len(live), width), dtype=np.int64)
    for i, lr in enumerate(live):  # per request, never per token
        shifted = lr.tokens[spec.token_offset : spec.token_offset + lr.prefix_len]
        tokens[i, : shifted.shape[0]] = shifted
        tokens[i, shifted.shape[0] : lr.prefix_len] = lr.tokens[shifted.shape[0] : lr.prefix_len]
    hashes = chain_hashes(tokens, prefix)
    cells = np.arange(width)[None, :] < prefix[:, None]
    slots = np.concatenate([lr.slots[: lr.prefix_len] for lr in live]) if live else prefix
    columns = [tokens[cells], np.nonzero(cells)[1].astype(np.int64), hashes[cells]]
    spaces = [("full", slots, num_full_slots)]
    lut = tensors.get("full_to_swa_index_mapping")
    if lut is not None:
        table = lut
        swa = np.where(
            (slots >= 0) & (slots < table.shape[0] - 1), table[slots.clip(0, table.shape[0] - 1)], 0
        )
        spaces.append(("swa", swa, int(metadata["num_swa_slots"])))
    halves = ("k", "v") if spec.canary_v else ("k",)
    for group, where, size in spaces:
        keep = where > 0
        for half in halves:
            fingerprint = np.zeros(int(keep.sum()), dtype=np.int64)
            if spec.canary_real_kv:
                source = rng.integers(0, 256, size=(size, _REAL_KV_BYTES), dtype=np.uint8)
                tensors[f"real_kv.{group}.{half}"] = source
                fingerprint = as_int64(
                    combine_source_hashes([fold_chunks(source[where[keep], :16])])
                )
            for stage, rkv in (("head", np.zeros_like(fingerprint)), ("tail", fingerprint)):
                buffer = np.zeros((size, RECORD_BYTES), dtype=np.uint8)
                buffer[where[keep]] = record_bytes([c[keep] for c in columns] + [rkv])
                tensors[f"canary.{group}.{stage}.{half}"] = buffer
    if spec.canary_real_kv:
        metadata["real_kv.mode"] = "partial"
