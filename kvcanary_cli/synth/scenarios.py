"""Named scenarios: clean serving states and one corruption per bug class
(docs/semantics.md §4).

Each scenario builds a consistent state with `synth.build_dump`, then breaks exactly one
thing, the way the bug would. Its dump records the finding codes `kvcanary check` must report
(`kvcanary.expected_findings`) and those it may report as side effects
(`kvcanary.allowed_findings`), so tests and users can check the tool against the truth.

The canary scenarios (docs/canary.md §8) also stamp canary buffers, break a record the way the
bug would, and record what SGLang's verify launches would have appended: the rows go into the
dump's violation ring and, as JSON lists of 8 ints, into `kvcanary.expected_violations`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from kvcanary_cli.canary.constants import FailReason, LaunchTag, to_signed
from kvcanary_cli.canary.hashing import CHAIN_HEAD, combine_source_hashes, fold_chunks, mix3
from kvcanary_cli.dump.tensor import difference, distinct, union
from kvcanary_cli.errors import OptionError
from kvcanary_cli.option_values import checked_choice
from kvcanary_cli.synth.state import SynthDump, SynthSpec, build_dump

__all__ = ["SCENARIOS", "SIZES", "Scenario", "make_scenario", "scenario_lines"]

#: Table shapes: tiny/small for tests and examples, medium/large for the benchmark
#: (`req_to_token` of 2049 x 32772 and 4097 x 131076 int32, as in production).
SIZES: dict[str, SynthSpec] = {
    "tiny": SynthSpec(max_reqs=12, max_seq_len=48, active_rows=4, history=6),
    "small": SynthSpec(
        max_reqs=64, max_seq_len=512, active_rows=24, history=48, max_request_len=400
    ),
    "medium": SynthSpec(
        max_reqs=2049,
        max_seq_len=32772,
        active_rows=64,
        history=96,
        max_request_len=4096,
        pool_slots=1 << 20,
        padding_rows=8,
    ),
    "large": SynthSpec(
        max_reqs=4097,
        max_seq_len=131076,
        active_rows=128,
        history=192,
        max_request_len=8192,
        pool_slots=1 << 21,
        padding_rows=16,
    ),
}


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A named state: how it is built, what went wrong, and what check must say."""

    name: str
    summary: str
    spec: Mapping[str, object]
    corrupt: Callable[[SynthDump, np.random.Generator], None] | None = None
    expected: tuple[str, ...] = ()
    allowed: tuple[str, ...] = ()
    #: the cause `check` must rank first (None for clean scenarios).
    cause: str | None = None
    #: the smallest page size the fault exists at (a page freed in part needs two slots).
    min_page_size: int = 1


_Cell = tuple[int, int, int]  # (batch row, position, slot)


# --- helpers over a SynthDump --------------------------------------------------------------


def _lens(d: SynthDump) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return d.tensors["req_pool_indices"], d.tensors["prefix_lens"], d.tensors["extend_seq_lens"]


def _unshared_prefix_cells(d: SynthDump) -> list[_Cell]:
    """(batch row, position, slot) of live prefix cells whose slot no other live cell holds."""
    counts: dict[int, int] = {}
    for lr in d.live:
        for s in lr.slots[: lr.prefix_len + lr.extend_len].tolist():
            counts[s] = counts.get(s, 0) + 1
    cells = []
    for lr in d.live:
        for pos in range(lr.prefix_len):
            s = int(lr.slots[pos])
            if counts[s] == 1:
                cells.append((lr.batch_row, pos, s))
    return cells


def _pick(rng: np.random.Generator, items: list[_Cell], what: str) -> _Cell:
    if not items:
        raise RuntimeError(f"scenario needs {what}; try another seed or size")
    return items[int(rng.integers(len(items)))]


def _drop_writes(d: SynthDump, batch_row: int) -> None:
    """Remove a row's pending writes from out_cache_loc / input_ids / positions."""
    rpi, _, extend = _lens(d)
    if "out_cache_loc" not in d.tensors:
        return
    write_len = np.where((rpi != 0) & (extend > 0), extend, 0)
    start = int(write_len[:batch_row].sum())
    stop = start + int(write_len[batch_row])
    for name in ("out_cache_loc", "input_ids", "positions"):
        t = d.tensors[name]
        d.tensors[name] = np.concatenate([t[:start], t[stop:]])


def _with_slot(free: np.ndarray, slot: int) -> np.ndarray:
    """A free list with `slot` added (sorted, as the allocator's free lists are dumped)."""
    return np.sort(np.concatenate([free, np.array([slot], dtype=np.int64)]))


def _torch_randperm_head(n: int, k: int, *, seed: int) -> np.ndarray:
    """The first `k` of `torch.randperm(n, generator=torch.Generator().manual_seed(seed))`,
    without torch, so that scenario dumps stay the bytes they were when torch drew them.

    Torch's CPU generator is the 32-bit mt19937 seeded with `seed` (numpy's legacy seeding,
    `RandomState(seed)`), and its randperm is a forward Fisher-Yates shuffle swapping `i` with
    `i + random() % (n - i)`; the first `k` entries are final after `k` swaps.
    """
    k = min(k, n)
    draws = np.random.RandomState(seed).randint(
        0, 1 << 32, size=max(min(k, n - 1), 0), dtype=np.uint32
    )
    moved: dict[int, int] = {}
    head = []
    for i in range(k):
        if i < n - 1:
            j = i + int(draws[i]) % (n - i)
            moved[i], moved[j] = moved.get(j, j), moved.get(i, i)
        head.append(moved.get(i, i))
    return np.array(head, dtype=np.int64)


def _cell(d: SynthDump, batch_row: int, pos: int) -> tuple[int, int]:
    return int(d.tensors["req_pool_indices"][batch_row]), pos


# --- corruptions ----------------------------------------------------------------------------


def _truncated_lut(d: SynthDump, rng: np.random.Generator) -> None:
    """`lut[:num_allocated]`: the LUT sliced to the slots handed out so far."""
    lut = d.tensors["full_to_swa_index_mapping"]
    window = int(d.metadata["swa_window_size"])
    in_window = sorted(
        {int(s) for lr in d.live for s in lr.slots[max(0, lr.prefix_len - window) : lr.prefix_len]}
    )
    if not in_window:
        raise RuntimeError("no slot in any window")
    cut = max(in_window[len(in_window) // 2], 1)
    d.tensors["full_to_swa_index_mapping"] = lut[:cut].copy()
    d.truth = {"lut_len": cut}


def _truncated_lut_unrecorded(d: SynthDump, rng: np.random.Generator) -> None:
    """A truncated LUT in a dump that does not record the pool size (a plain capture)."""
    _truncated_lut(d, rng)
    del d.metadata["num_full_slots"]


def _undersized_lut(d: SynthDump, rng: np.random.Generator) -> None:
    """A LUT allocated for a smaller pool: too short, but with its trailing -1 (not sliced)."""
    _truncated_lut(d, rng)
    cut = d.truth["lut_len"]
    short = d.tensors["full_to_swa_index_mapping"]
    d.tensors["full_to_swa_index_mapping"] = np.concatenate([short, np.array([-1], dtype=np.int64)])
    d.truth = {"lut_len": cut + 1}


def _slot_beyond_pool_with_lut(d: SynthDump, rng: np.random.Generator) -> None:
    """A corrupt slot index past the pool, in a dump whose LUT is sized right."""
    row, pos, _ = _pick(rng, _in_window_cells(d), "an in-window cell")
    rp, _ = _cell(d, row, pos)
    slot = int(d.metadata["num_full_slots"]) + 2
    d.tensors["req_to_token"][rp, pos] = slot
    d.truth = {"batch_row": row, "position": pos, "slot": slot}


def _use_after_free(d: SynthDump, rng: np.random.Generator) -> None:
    row, pos, slot = _pick(rng, _unshared_prefix_cells(d), "an unshared live slot")
    free = d.tensors["free_full_slots"]
    d.tensors["free_full_slots"] = _with_slot(free, slot)
    d.truth = {"batch_row": row, "position": pos, "slot": slot}


def _aliasing(d: SynthDump, rng: np.random.Generator) -> None:
    cells = _unshared_prefix_cells(d)
    row_a, pos_a, slot = _pick(rng, cells, "an unshared live slot")
    targets = [c for c in cells if c[0] != row_a and c[1] != pos_a]
    row_b, pos_b, _ = _pick(rng, targets, "a second request")
    rp, pos = _cell(d, row_b, pos_b)
    d.tensors["req_to_token"][rp, pos] = slot
    d.truth = {
        "slot": slot,
        "batch_row": row_b,
        "position": pos_b,
        "other_batch_row": row_a,
        "other_position": pos_a,
    }


def _stale_tail(d: SynthDump, rng: np.random.Generator) -> None:
    """A recycled row read through a prefix length that covers the old owner's tail."""
    rpi, prefix, extend = _lens(d)
    free = d.tensors["free_full_slots"]
    msl = d.tensors["req_to_token"].shape[1]
    lr = max(d.live, key=lambda r: -(r.prefix_len + r.extend_len))
    end = lr.prefix_len + lr.extend_len
    tail = min(4, msl - end)
    if tail <= 0 or free.size < tail:
        raise RuntimeError("no room for a stale tail")
    stale = free[_torch_randperm_head(free.size, tail, seed=int(rng.integers(1 << 30)))]
    d.tensors["req_to_token"][lr.pool_row, end : end + tail] = stale.astype(np.int32)
    _drop_writes(d, lr.batch_row)
    prefix[lr.batch_row] = end + tail
    extend[lr.batch_row] = 0
    d.truth = {"batch_row": lr.batch_row, "position": end, "slot": int(stale[0])}


def _unfilled(d: SynthDump, rng: np.random.Generator) -> None:
    row, pos, _ = _pick(rng, _unshared_prefix_cells(d), "a live cell")
    rp, _ = _cell(d, row, pos)
    d.tensors["req_to_token"][rp, pos] = 0
    d.truth = {"batch_row": row, "position": pos, "slot": 0}


def _in_window_cells(d: SynthDump) -> list[_Cell]:
    window = int(d.metadata["swa_window_size"])
    return [
        (lr.batch_row, pos, int(lr.slots[pos]))
        for lr in d.live
        for pos in range(max(0, lr.prefix_len - window), lr.prefix_len)
    ]


def _swa_cleared(d: SynthDump, rng: np.random.Generator) -> None:
    row, pos, slot = _pick(rng, _in_window_cells(d), "an in-window slot")
    lut = d.tensors["full_to_swa_index_mapping"]
    swa_slot = int(lut[slot])
    lut[slot] = 0
    d.truth = {"batch_row": row, "position": pos, "slot": slot}
    if "free_swa_slots" in d.tensors:  # free_swa released the peer, as the allocator would
        free = d.tensors["free_swa_slots"]
        d.tensors["free_swa_slots"] = _with_slot(free, swa_slot)


def _swa_collision(d: SynthDump, rng: np.random.Generator) -> None:
    cells = _in_window_cells(d)
    distinct = sorted({c[2] for c in cells})
    if len(distinct) < 2:
        raise RuntimeError("needs two in-window slots")
    a, b = rng.choice(len(distinct), size=2, replace=False)
    lut = d.tensors["full_to_swa_index_mapping"]
    lut[distinct[int(b)]] = lut[distinct[int(a)]]
    d.truth = {"slot": int(lut[distinct[int(a)]]), "full_slot": distinct[int(b)]}


def _overflow(d: SynthDump, rng: np.random.Generator) -> None:
    rpi, prefix, _ = _lens(d)
    total = int(np.where(rpi != 0, prefix.clip(min=0), 0).sum())
    d.metadata["verify_capacity"] = str(max(total - 1, 1))


def _row_out_of_range(d: SynthDump, rng: np.random.Generator) -> None:
    lr = d.live[int(rng.integers(len(d.live)))]
    bad = d.tensors["req_to_token"].shape[0] + 3
    d.tensors["req_pool_indices"][lr.batch_row] = bad
    d.truth = {"batch_row": lr.batch_row, "pool_row": bad}


def _prefix_past_row(d: SynthDump, rng: np.random.Generator) -> None:
    lr = d.live[int(rng.integers(len(d.live)))]
    _drop_writes(d, lr.batch_row)
    _, prefix, extend = _lens(d)
    prefix[lr.batch_row] = d.tensors["req_to_token"].shape[1] + 5
    extend[lr.batch_row] = 0
    d.truth = {"batch_row": lr.batch_row, "pool_row": lr.pool_row}


def _absurd_prefix(d: SynthDump, rng: np.random.Generator) -> None:
    """A prefix length no table could hold (2^40): the plan must not be sized by it."""
    lr = d.live[int(rng.integers(len(d.live)))]
    _drop_writes(d, lr.batch_row)
    _, prefix, extend = _lens(d)
    prefix[lr.batch_row] = 1 << 40
    extend[lr.batch_row] = 0
    d.truth = {"batch_row": lr.batch_row, "pool_row": lr.pool_row}


def _corrupt_scalar(d: SynthDump, rng: np.random.Generator) -> None:
    """A recorded verify capacity beyond int32 (where SGLang keeps plan counts)."""
    d.metadata["verify_capacity"] = str(10**30)
    d.truth = {}


def _write_into_live(d: SynthDump, rng: np.random.Generator) -> None:
    loc = d.tensors["out_cache_loc"]
    if loc.size == 0:
        raise RuntimeError("no pending writes")
    i = int(rng.integers(loc.size))
    writer = _writer_row(d, i)
    victims = [c for c in _unshared_prefix_cells(d) if c[0] != writer]
    _, _, slot = _pick(rng, victims, "a live slot of another request")
    loc[i] = slot
    # SGLang writes the step's slots into req_to_token before the forward: the pending cell
    # holds the live slot too
    rpi, prefix, extend = _lens(d)
    write_len = np.where((rpi != 0) & (extend > 0), extend, 0)
    offset = i - int(np.cumsum(write_len)[writer] - write_len[writer])
    d.tensors["req_to_token"][int(rpi[writer]), int(prefix[writer]) + offset] = slot
    d.truth = {"batch_row": writer, "slot": slot, "out_cache_loc_index": i}


def _writer_row(d: SynthDump, index: int) -> int:
    rpi, _, extend = _lens(d)
    write_len = np.where((rpi != 0) & (extend > 0), extend, 0)
    ends = np.cumsum(write_len)
    return int(np.searchsorted(ends, index, side="right"))


def _negative_slot(d: SynthDump, rng: np.random.Generator) -> None:
    row, pos, _ = _pick(rng, _unshared_prefix_cells(d), "a live cell")
    rp, _ = _cell(d, row, pos)
    d.tensors["req_to_token"][rp, pos] = -1
    d.truth = {"batch_row": row, "position": pos, "slot": -1}


def _slot_beyond_pool(d: SynthDump, rng: np.random.Generator) -> None:
    row, pos, _ = _pick(rng, _unshared_prefix_cells(d), "a live cell")
    rp, _ = _cell(d, row, pos)
    slot = int(d.metadata["num_full_slots"]) + 2
    d.tensors["req_to_token"][rp, pos] = slot
    d.truth = {"batch_row": row, "position": pos, "slot": slot}


def _duplicate_in_row(d: SynthDump, rng: np.random.Generator) -> None:
    cells = _unshared_prefix_cells(d)
    row, pos, slot = _pick(rng, cells, "an unshared live slot")
    others = [c for c in cells if c[0] == row and c[1] != pos]
    _, pos_b, _ = _pick(rng, others, "a second cell in the row")
    rp, _ = _cell(d, row, pos_b)
    d.tensors["req_to_token"][rp, pos_b] = slot
    d.truth = {"batch_row": row, "position": max(pos, pos_b), "slot": slot}


def _reuse_under_sharer(d: SynthDump, rng: np.random.Generator) -> None:
    """A request handed its own slot again at a later position while a radix sharer still
    holds the slot at its first position: the repeat looks like aliasing across requests."""
    counts: dict[int, int] = {}
    for lr in d.live:
        for s in lr.slots[: lr.prefix_len + lr.extend_len].tolist():
            counts[s] = counts.get(s, 0) + 1
    pairs = [
        (lr, pos, later)
        for lr in d.live
        for pos in range(lr.prefix_len)
        if counts[int(lr.slots[pos])] > 1
        for later in range(pos + 1, lr.prefix_len)
        if counts[int(lr.slots[later])] == 1
    ]
    if not pairs:
        raise RuntimeError("needs a radix-shared cell and a later unshared one in its row")
    lr, pos, later = pairs[int(rng.integers(len(pairs)))]
    slot = int(lr.slots[pos])
    d.tensors["req_to_token"][lr.pool_row, later] = slot
    d.truth = {"batch_row": lr.batch_row, "position": later, "slot": slot}


def _double_allocation(d: SynthDump, rng: np.random.Generator) -> None:
    """A live run of slots handed out a second time: a later request's last prefix cells are
    an earlier request's live slots (its row is consistent; the allocator is not)."""
    cells = _unshared_prefix_cells(d)
    pairs = []
    for late in d.live:
        tail = min(4, late.prefix_len)
        if tail < 2:
            continue
        for early in d.live:
            if early.batch_row >= late.batch_row:
                continue
            run = [c for c in cells if c[0] == early.batch_row]
            if len(run) >= tail:
                pairs.append((early, late, tail, run))
    if not pairs:
        raise RuntimeError("needs two requests with live prefixes")
    early, late, tail, run = pairs[int(rng.integers(len(pairs)))]
    start = int(rng.integers(len(run) - tail + 1))
    given = [c[2] for c in run[start : start + tail]]
    end = late.prefix_len
    if any(c[1] == p for c, p in zip(run[start:], range(end - tail, end), strict=False)):
        raise RuntimeError("the runs line up position for position; try another seed")
    d.tensors["req_to_token"][late.pool_row, end - tail : end] = np.asarray(given, np.int32)
    d.truth = {"batch_row": late.batch_row, "position": end - 1, "slot": given[-1]}


def _duplicate_request(d: SynthDump, rng: np.random.Generator) -> None:
    if len(d.live) < 2:
        raise RuntimeError("needs two requests")
    # The earlier batch row keeps the pool row (analysis reads a shared row through it).
    first, second = sorted(int(x) for x in rng.choice(len(d.live), size=2, replace=False))
    rpi = d.tensors["req_pool_indices"]
    rpi[second] = rpi[first]
    d.truth = {"batch_row": second, "pool_row": int(rpi[first])}


def _free_row(d: SynthDump, rng: np.random.Generator) -> int:
    free = d.tensors["free_req_rows"]
    if free.size == 0:
        raise RuntimeError("needs a free request row")
    return int(free[int(rng.integers(free.size))])


def _req_row_leaked(d: SynthDump, rng: np.random.Generator) -> None:
    """A finished request's row never given back: off the free list, held by no request."""
    row = _free_row(d, rng)
    free = d.tensors["free_req_rows"]
    d.tensors["free_req_rows"] = free[free != row]
    d.truth = {"pool_row": row}


def _req_row_freed_while_running(d: SynthDump, rng: np.random.Generator) -> None:
    """A running request's row freed (a retraction that frees and keeps running)."""
    row = d.live[int(rng.integers(len(d.live)))].pool_row
    d.tensors["free_req_rows"] = np.append(d.tensors["free_req_rows"], row)
    d.truth = {"pool_row": row}


def _tree_lock_leaked(d: SynthDump, rng: np.random.Generator) -> None:
    """A finished request's prefix left locked: a slot no live row holds is locked."""
    live = np.concatenate([lr.slots for lr in d.live]).astype(np.int64)
    size = int(d.metadata["num_full_slots"])
    page = int(d.metadata.get("page_size", "1"))
    spare = difference(np.arange(page, size, dtype=np.int64), live)
    slot = int(spare[int(rng.integers(spare.size))])
    d.tensors["tree_locked_full_slots"] = union(d.tensors["tree_locked_full_slots"], [slot])
    d.truth = {"slot": slot}


def _req_row_freed_twice(d: SynthDump, rng: np.random.Generator) -> None:
    """A finished request's row freed twice: on the free list twice."""
    row = _free_row(d, rng)
    d.tensors["free_req_rows"] = np.append(d.tensors["free_req_rows"], row)
    d.truth = {"pool_row": row}


def _token_pool_narrow(d: SynthDump, rng: np.random.Generator) -> None:
    pool = d.tensors["req_to_verify_expected_tokens"]
    longest = max(lr.prefix_len for lr in d.live)
    d.tensors["req_to_verify_expected_tokens"] = pool[:, : max(longest - 2, 1)].copy()


def _kernel_limit(d: SynthDump, rng: np.random.Generator) -> None:
    d.metadata["write_req_capacity"] = str(d.tensors["req_pool_indices"].size - 1)


def _negative_length(d: SynthDump, rng: np.random.Generator) -> None:
    lr = d.live[int(rng.integers(len(d.live)))]
    _drop_writes(d, lr.batch_row)
    d.tensors["extend_seq_lens"][lr.batch_row] = -2
    d.truth = {"batch_row": lr.batch_row}


def _int32_indices(d: SynthDump, rng: np.random.Generator) -> None:
    d.tensors["req_pool_indices"] = d.tensors["req_pool_indices"].astype(np.int32)


# --- bookkeeping around the batch (SGLang's SWA allocator faults of 2026) -------------------


def _page_size(d: SynthDump) -> int:
    return int(d.metadata.get("page_size", "1"))


def _free_page(d: SynthDump, rng: np.random.Generator, name: str) -> np.ndarray:
    """The slots of one whole page on free list `name` (page 0 never is)."""
    p = _page_size(d)
    free = d.tensors[name]
    pages = distinct(free // p)
    pages = pages[pages > 0]
    if pages.size == 0:
        raise RuntimeError(f"{name} holds no page")
    page = int(pages[int(rng.integers(pages.size))])
    return page * p + np.arange(p, dtype=np.int64)


def _double_free(d: SynthDump, rng: np.random.Generator) -> None:
    """A page freed twice: its slots are on the full free list twice."""
    slots = _free_page(d, rng, "free_full_slots")
    d.tensors["free_full_slots"] = np.concatenate([d.tensors["free_full_slots"], slots])
    d.truth = {"slot": int(slots[0])}


def _reserved_freed(d: SynthDump, rng: np.random.Generator) -> None:
    """The padding page 0 freed: slots 0 .. page_size - 1 on the full free list."""
    padding = np.arange(_page_size(d), dtype=np.int64)
    d.tensors["free_full_slots"] = np.concatenate([d.tensors["free_full_slots"], padding])
    d.truth = {"slot": 0}


def _reserved_swa_freed(d: SynthDump, rng: np.random.Generator) -> None:
    """The SWA padding page freed: SWA slots 0 .. page_size - 1 on the SWA free list (SGLang
    PR #38519: an unmapped representative's LUT entry, 0, freed as an SWA slot)."""
    padding = np.arange(_page_size(d), dtype=np.int64)
    d.tensors["free_swa_slots"] = np.concatenate([d.tensors["free_swa_slots"], padding])
    d.truth = {"slot": 0}


def _reserved_swa_handed_out(d: SynthDump, rng: np.random.Generator) -> None:
    """PR #38519 at page_size > 1, one step later: the SWA padding page, freed, was handed
    out to two held full pages outside the window, so their tokens map into SWA slots
    1 .. page_size - 1 (the first token to slot 0, which reads as unmapped); the SWA pages
    they held before went back on the free list."""
    p = _page_size(d)
    lut = d.tensors["full_to_swa_index_mapping"]
    mapped = np.flatnonzero(lut[:-1] > 0)
    mapped = mapped[mapped % p > 0]  # a token that lands past slot 0 of the padding page
    window = np.array([c[2] for c in _in_window_cells(d)], dtype=np.int64)
    pages = difference(mapped // p, np.r_[window // p, d.tensors["free_full_slots"] // p])
    if p < 2 or pages.size == 0:
        raise RuntimeError("needs pages of two slots or more and a held page off the window")
    chosen = rng.choice(pages, size=min(2, pages.size), replace=False)
    tokens = (np.sort(chosen)[:, None] * p + np.arange(p)[None, :]).reshape(-1)
    tokens = tokens[lut[tokens] > 0]
    old_pages = distinct(lut[tokens] // p)
    lut[tokens] = tokens % p
    back = (old_pages[:, None] * p + np.arange(p)[None, :]).reshape(-1)
    d.tensors["free_swa_slots"] = np.sort(np.r_[d.tensors["free_swa_slots"], back])
    first = int(tokens[tokens % p > 0][0])
    d.truth = {"slot": first % p, "full_slot": first}


def _full_page_leak(d: SynthDump, rng: np.random.Generator) -> None:
    """SGLang's "pool memory leak detected!": the dump records what the tree holds and each
    pool row's allocated length (as the capture hook's leak trigger does), and one full page
    off the free list is in neither: its owner was dropped without its free."""
    p = _page_size(d)
    size = int(d.metadata["num_full_slots"])
    free = np.asarray(d.tensors["free_full_slots"], dtype=np.int64)
    held = difference(np.arange(p, size, dtype=np.int64), free)
    pages = distinct(held // p)
    if pages.size == 0:
        raise RuntimeError("needs a held full page")
    page = int(pages[int(rng.integers(pages.size))])
    d.tensors["tree_full_slots"] = held[held // p != page]
    d.tensors["req_pool_allocated_lens"] = np.zeros(
        d.tensors["req_to_token"].shape[0], dtype=np.int64
    )
    d.truth = {"slot": page * p}


def _running_outside_batch(d: SynthDump, rng: np.random.Generator, *, rows: int) -> np.ndarray:
    """The dump records what the tree holds (every full slot off the free list) and each pool
    row's allocated length, and `rows` running requests outside the batch, in pool rows no
    batch row uses, each hold the same free page (cells 0 .. page): the page, still on the
    free list."""
    p = _page_size(d)
    table = d.tensors["req_to_token"]
    free = np.asarray(d.tensors["free_full_slots"], dtype=np.int64)
    held = difference(np.arange(p, int(d.metadata["num_full_slots"]), dtype=np.int64), free)
    pages = distinct(free // p)
    whole = [int(q) for q in pages if np.isin(q * p + np.arange(p), free).all()]
    batch = set(np.asarray(d.tensors["req_pool_indices"]).tolist())
    spare = [r for r in range(1, int(table.shape[0])) if r not in batch]
    if not whole or len(spare) < rows or table.shape[1] < p:
        raise RuntimeError("needs a whole free page and spare pool rows")
    page = whole[int(rng.integers(len(whole)))] * p + np.arange(p, dtype=np.int64)
    lens = np.zeros(int(table.shape[0]), dtype=np.int64)
    chosen = sorted(int(r) for r in rng.choice(spare, size=rows, replace=False))
    for row in chosen:
        table[row, :p] = page
        lens[row] = p
    running = np.asarray(d.tensors.get("running_req_rows", np.zeros(0)), dtype=np.int64)
    d.tensors["running_req_rows"] = np.r_[running, chosen].astype(np.int64)
    d.tensors["tree_full_slots"] = held
    d.tensors["req_pool_allocated_lens"] = lens
    if "held_full_slots" in d.tensors:
        d.tensors["held_full_slots"] = np.sort(np.r_[d.tensors["held_full_slots"], page])
    d.truth = {"slot": int(page[0]), "pool_row": chosen[0]}
    return page


def _freed_under_running_request(d: SynthDump, rng: np.random.Generator) -> None:
    """SGLang 0.5.13 - 0.5.14's SWA tombstone recovery: a node's full value freed while a
    running request between batches still holds it (its page back on the free list), a step
    before that request's next batch or the next allocation."""
    _running_outside_batch(d, rng, rows=1)


def _handed_to_two_running_requests(d: SynthDump, rng: np.random.Generator) -> None:
    """The same free, a step later: the allocator handed the freed page to a second running
    request, so two requests outside the batch hold it, and the tree does not."""
    page = _running_outside_batch(d, rng, rows=2)
    free = np.asarray(d.tensors["free_full_slots"], dtype=np.int64)
    d.tensors["free_full_slots"] = free[~np.isin(free, page)]


def _free_page_still_mapped(d: SynthDump, rng: np.random.Generator, *, whole: bool) -> None:
    """A free full page that still maps into a free SWA page: all of it (a free that skipped
    the SWA side, SGLang PRs #25385 and #25270) or its second half (PR #27779: free_swa
    cleared the LUT only for the tokens passed while the pages went back whole)."""
    full = _free_page(d, rng, "free_full_slots")
    swa = _free_page(d, rng, "free_swa_slots")
    kept = full.size if whole else max(1, full.size // 2)  # the tokens the free did not pass
    d.tensors["full_to_swa_index_mapping"][full[-kept:]] = swa[-kept:]
    d.truth = {"slot": int(full[-kept]), "swa_slot": int(swa[-kept])}


def _window_pages(d: SynthDump) -> list[int]:
    """Full pages whose every live token is an in-window cell mapped to one SWA page."""
    p = _page_size(d)
    lut = d.tensors["full_to_swa_index_mapping"]
    cells = _in_window_cells(d)
    pages = sorted({c[2] // p for c in cells})
    held = {c[2] for c in cells}
    out = []
    for page in pages:
        tokens = page * p + np.arange(p)
        mapped = tokens[lut[tokens] > 0]
        if mapped.size and all(int(t) in held for t in mapped):
            out.append(page)
    return out


def _swa_freed_while_live(d: SynthDump, rng: np.random.Generator) -> None:
    """SGLang PR #36135: tombstone recovery replaced a live page's SWA mapping with a page of a
    deferred free group; the group was flushed (the new page freed while mapped) and the page
    it replaced is mapped from nothing (leaked)."""
    p = _page_size(d)
    pages = _window_pages(d)
    if not pages:
        raise RuntimeError("needs an in-window page")
    page = pages[int(rng.integers(len(pages)))]
    tokens = page * p + np.arange(p)
    lut = d.tensors["full_to_swa_index_mapping"]
    mapped = tokens[lut[tokens] > 0]
    replacement = _free_page(d, rng, "free_swa_slots")  # stays on the free list
    lut[mapped] = replacement[mapped % p]
    d.truth = {"slot": int(replacement[int(mapped[0]) % p]), "full_slot": int(mapped[0])}


def _swa_mapping_rewritten(d: SynthDump, rng: np.random.Generator) -> None:
    """Two tokens of one full page swap their SWA entries: both pages stay owned and mapped,
    only the page lockstep (a token's offset is the same in both pools) is broken."""
    p = _page_size(d)
    lut = d.tensors["full_to_swa_index_mapping"]
    pages = [q for q in _window_pages(d) if int((lut[q * p + np.arange(p)] > 0).sum()) >= 2]
    if p < 2 or not pages:
        raise RuntimeError("needs pages of two slots or more, one with two mapped tokens")
    page = pages[int(rng.integers(len(pages)))]
    tokens = page * p + np.arange(p)
    a, b = (int(t) for t in tokens[lut[tokens] > 0][:2])
    lut[a], lut[b] = lut[b], lut[a]
    d.truth = {"slot": a, "swa_slot": int(lut[a])}


def _out_of_window_cells(d: SynthDump) -> list[_Cell]:
    """Live prefix cells before their request's window whose SWA peer was evicted (LUT 0)."""
    window = int(d.metadata["swa_window_size"])
    lut = d.tensors["full_to_swa_index_mapping"]
    return [
        (lr.batch_row, pos, int(lr.slots[pos]))
        for lr in d.live
        for pos in range(0, max(0, lr.prefix_len - window))
        if lut[int(lr.slots[pos])] == 0
    ]


def _swa_shared_owner(d: SynthDump, rng: np.random.Generator) -> None:
    """SGLang PR #27586: a tombstoned full slot's stale LUT entry points at an SWA slot a live
    request now holds in its window."""
    lut = d.tensors["full_to_swa_index_mapping"]
    row, _, stale = _pick(rng, _out_of_window_cells(d), "an evicted out-of-window cell")
    others = [c for c in _in_window_cells(d) if c[0] != row]
    _, _, owner = _pick(rng, others, "another request's in-window cell")
    lut[stale] = lut[owner]
    d.truth = {"slot": int(lut[owner]), "full_slot": stale}


def _radix_copy(d: SynthDump, rng: np.random.Generator) -> None:
    """SGLang's fault injector (`perturb/req_to_token.py`) landing on the same position: a live
    cell overwritten with another request's slot at that very position, rows unshared before."""
    table = d.tensors["req_to_token"]
    pairs = []
    for a in d.live:
        for b in d.live:
            if a.batch_row == b.batch_row:
                continue
            for pos in range(1, min(a.prefix_len, b.prefix_len)):
                before_a, before_b = table[a.pool_row, pos - 1], table[b.pool_row, pos - 1]
                if before_a != before_b and table[a.pool_row, pos] != table[b.pool_row, pos]:
                    pairs.append((a, b, pos))
    if not pairs:
        raise RuntimeError("needs two requests that differ before a common position")
    a, b, pos = pairs[int(rng.integers(len(pairs)))]
    table[a.pool_row, pos] = table[b.pool_row, pos]
    d.truth = {"batch_row": a.batch_row, "position": pos, "slot": int(table[b.pool_row, pos])}


def _swa_page_leak(d: SynthDump, rng: np.random.Generator) -> None:
    """SGLang issue #27789: an SWA page whose mapping was dropped (its tokens left the window)
    without the page going back to the SWA free list."""
    p = _page_size(d)
    window = int(d.metadata["swa_window_size"])
    lut = d.tensors["full_to_swa_index_mapping"]
    in_window = {c[2] // p for c in _in_window_cells(d)}
    pages = sorted(
        {
            int(slot) // p
            for lr in d.live
            for slot in lr.slots[: max(0, lr.prefix_len - window)]
            if lut[int(slot)] > 0 and int(slot) // p not in in_window
        }
    )
    if not pages:
        raise RuntimeError("needs a mapped page outside every window")
    page = pages[int(rng.integers(len(pages)))]
    tokens = page * p + np.arange(p)
    swa_page = int(lut[tokens[0]]) // p
    lut[tokens] = 0  # evicted from the LUT ...
    d.truth = {"slot": swa_page * p}  # ... but the SWA page never freed


def _swa_write_into_live(d: SynthDump, rng: np.random.Generator) -> None:
    """SGLang PR #25889: a cached full -> SWA translation outlived the mapping: this step's
    write lands on an SWA slot another request holds in its window."""
    loc = d.tensors["out_cache_loc"]
    if loc.size == 0:
        raise RuntimeError("no pending writes")
    i = int(rng.integers(loc.size))
    writer = _writer_row(d, i)
    others = [c for c in _in_window_cells(d) if c[0] != writer]
    _, _, owner = _pick(rng, others, "another request's in-window cell")
    lut = d.tensors["full_to_swa_index_mapping"]
    lut[int(loc[i])] = lut[owner]
    d.truth = {"batch_row": writer, "slot": int(lut[owner]), "out_cache_loc_index": i}


def _swa_boundary_page_cleared(d: SynthDump, rng: np.random.Generator) -> None:
    """SGLang PR #36457: two radix nodes share one full page at a split that is not
    page-aligned; evicting the first node's SWA (its tokens left the window) cleared the
    whole page and freed its SWA page, erasing the second node's entries still in the window."""
    p = _page_size(d)
    window = int(d.metadata["swa_window_size"])
    lut = d.tensors["full_to_swa_index_mapping"]
    pages = []
    for lr in d.live:
        start = lr.prefix_len - window
        if start <= 0 or start % p == 0:
            continue  # the window starts on a page boundary: no page straddles it
        page = int(lr.slots[start]) // p
        if (lut[page * p + np.arange(p)] > 0).all():
            pages.append((lr.batch_row, start, page))
    if p < 2 or not pages:
        raise RuntimeError("needs pages of two slots or more and a window starting mid-page")
    row, start, page = pages[int(rng.integers(len(pages)))]
    tokens = page * p + np.arange(p)
    swa_page = int(lut[tokens[0]]) // p
    lut[tokens] = 0
    back = swa_page * p + np.arange(p, dtype=np.int64)
    d.tensors["free_swa_slots"] = np.sort(np.r_[d.tensors["free_swa_slots"], back])
    d.truth = {"batch_row": row, "position": start, "slot": page * p + start % p}


def _swa_page_reissued(d: SynthDump, rng: np.random.Generator) -> None:
    """SGLang PR #27779, one step later: a free cleared the LUT for half of an out-of-window
    full page only while the SWA page went back whole; the allocator then handed that SWA page
    to a live request's in-window page, so it has two full owners, the old one stale."""
    p = _page_size(d)
    window = int(d.metadata["swa_window_size"])
    lut = d.tensors["full_to_swa_index_mapping"]
    owners = _window_pages(d)
    held_before = {
        int(lr.slots[pos]) // p for lr in d.live for pos in range(0, max(0, lr.prefix_len - window))
    }
    in_window = {c[2] // p for c in _in_window_cells(d)}
    stale = sorted(q for q in held_before - in_window if not (lut[q * p + np.arange(p)] > 0).any())
    if p < 4 or not owners or not stale:
        raise RuntimeError("needs pages of four slots or more, an in-window and an evicted page")
    owner = owners[int(rng.integers(len(owners)))]
    old = stale[int(rng.integers(len(stale)))]
    swa_page = int(lut[owner * p + np.flatnonzero(lut[owner * p + np.arange(p)] > 0)[0]]) // p
    kept = np.arange(p // 2, p, dtype=np.int64)  # the tokens the partial free did not clear
    lut[old * p + kept] = swa_page * p + kept
    d.truth = {"slot": int(swa_page * p + kept[0]), "full_slot": int(old * p + kept[0])}


def _reserved_swa_freed_twice(d: SynthDump, rng: np.random.Generator) -> None:
    """SGLang PR #38519, freed twice: unmapped representatives of two tombstoned nodes freed
    as SWA slot 0, so the SWA pool's reserved padding page is on its free list twice."""
    padding = np.arange(_page_size(d), dtype=np.int64)
    d.tensors["free_swa_slots"] = np.concatenate([d.tensors["free_swa_slots"], padding, padding])
    d.truth = {"slot": 0}


# --- canary scenarios (docs/canary.md §8) ----------------------------------------------------

#: rows of a scenario's violation ring (SGLang's default is 1024).
_RING_CAPACITY = 64
#: the forward step a canary scenario's dump records (the pump logs it one step later).
CANARY_STEP = 1234
_CHAIN = int(FailReason.VERIFY_CHAIN_HASH_MISMATCH)
_POSITION = int(FailReason.VERIFY_POSITION_MISMATCH)
_REAL_KV = int(FailReason.VERIFY_REAL_KV_HASH_MISMATCH)
_TOKEN = int(FailReason.VERIFY_TOKEN_MISMATCH)


def _buffers(d: SynthDump) -> list[tuple[str, int]]:
    """The full group's canary buffers in launch order (HEAD before TAIL, K before V)."""
    return [
        (f"canary.full.{stage}.{half}", int(LaunchTag[f"{stage.upper()}_{half.upper()}_FULL"]))
        for stage in ("head", "tail")
        for half in ("k", "v")
        if f"canary.full.{stage}.{half}" in d.tensors
    ]


def _record(d: SynthDump, buffer: str, slot: int) -> list[int]:
    raw = d.tensors[buffer][slot, :32].tobytes()
    return [int(v) for v in np.frombuffer(raw, dtype="<i8")]


def _put_record(d: SynthDump, buffer: str, slot: int, values: list[int]) -> None:
    raw = np.array(values, dtype="<i8").view(np.uint8)
    d.tensors[buffer][slot, :32] = raw


def _link(record: list[int]) -> int:
    """The chain hash a record passes on: mix3(prev_hash, token, position), signed."""
    return to_signed(mix3(record[2], record[0], record[1]))


def _expected_kv(d: SynthDump, buffer: str, slot: int) -> int | None:
    """The real_kv_hash a record must hold (None: the dump does not say, not checked)."""
    if ".head." in buffer:
        return 0
    half = buffer.rsplit(".", 1)[1]
    source = d.tensors.get(f"real_kv.full.{half}")
    if d.metadata.get("real_kv.mode") != "partial" or source is None:
        return None
    data = source[slot : slot + 1, :16]
    return to_signed(int(combine_source_hashes([fold_chunks(data)])[0]))


def _verify_row(d: SynthDump, buffer: str, tag: int, batch_row: int, pos: int) -> list[int] | None:
    """The row SGLang's verify appends for one entry of the full group, read literally."""
    rpi, _, _ = _lens(d)
    table = d.tensors["req_to_token"]
    rp = int(rpi[batch_row])
    slot = int(table[rp, pos])
    prev = int(table[rp, pos - 1]) if pos > 0 else -1
    if slot == 0:
        return None
    token, position, stored_hash, real_kv = _record(d, buffer, slot)
    bits = 0
    aux = stored_hash
    if prev != 0:
        aux = to_signed(CHAIN_HEAD) if prev < 0 else _link(_record(d, buffer, prev))
        bits |= _CHAIN if stored_hash != aux else 0
    expected = -1
    pool = d.tensors.get("req_to_verify_expected_tokens")
    if pool is not None:
        valid = int(d.tensors["req_to_verify_expected_tokens_valid_lens"][batch_row])
        s = pos + int(d.metadata["kv_token_id_vs_position_offset"])
        expected = int(pool[rp, s]) if 0 <= s < valid else -1
        bits |= _TOKEN if expected != -1 and token != expected else 0
    bits |= _POSITION if position != pos else 0
    want_kv = _expected_kv(d, buffer, slot)
    bits |= _REAL_KV if want_kv is not None and real_kv != want_kv else 0
    if not bits:
        return None
    return [tag, slot, position, token, expected, stored_hash, aux, bits]


def _record_violations(d: SynthDump, entries: list[tuple[int, int]]) -> None:
    """Verify `entries` (batch row, position) in every buffer, in launch order; store the rows
    as the dump's violation ring and as `kvcanary.expected_violations`."""
    _, prefix, _ = _lens(d)
    rows = []
    for buffer, tag in _buffers(d):
        for batch_row, pos in entries:
            if 0 <= pos < int(prefix[batch_row]):
                row = _verify_row(d, buffer, tag, batch_row, pos)
                if row is not None:
                    rows.append(row)
    ring = np.zeros((_RING_CAPACITY, 8), dtype=np.int64)
    ring[: len(rows)] = np.array(rows, dtype=np.int64).reshape(-1, 8)[:_RING_CAPACITY]
    d.tensors["violation_ring"] = ring
    d.tensors["violation_write_index"] = np.array([len(rows)], dtype=np.int32)
    d.metadata["kvcanary.expected_violations"] = json.dumps(rows, separators=(",", ":"))
    d.metadata["step"] = str(CANARY_STEP)


def _and_next(batch_row: int, pos: int) -> list[tuple[int, int]]:
    """A cell and the one after it: a broken record fails there and breaks the next link."""
    return [(batch_row, pos), (batch_row, pos + 1)]


def _inner_cells(d: SynthDump) -> list[_Cell]:
    """Unshared live prefix cells that have a successor in the prefix (p + 1 < P)."""
    prefix = {lr.batch_row: lr.prefix_len for lr in d.live}
    return [c for c in _unshared_prefix_cells(d) if c[1] + 1 < prefix[c[0]]]


def _canary_use_after_free(d: SynthDump, rng: np.random.Generator) -> None:
    """A live slot was freed, handed to another request and rewritten by it: the record at the
    slot is a stranger's, and the slot is on the free list."""
    row, pos, slot = _pick(rng, _inner_cells(d), "an unshared inner live slot")
    free = d.tensors["free_full_slots"]
    d.tensors["free_full_slots"] = _with_slot(free, slot)
    stranger = [
        int(rng.integers(0, 32000)),
        pos + 1 + int(rng.integers(1, 40)),
        int(rng.integers(-(1 << 62), 1 << 62)),
        0,
    ]
    for buffer, _ in _buffers(d):
        _put_record(d, buffer, slot, stranger)
    _record_violations(d, _and_next(row, pos))
    d.truth = {"batch_row": row, "position": pos, "slot": slot}


def _canary_aliasing(d: SynthDump, rng: np.random.Generator) -> None:
    """Another request holds a live slot at another position and wrote its own record there."""
    cells = _inner_cells(d)
    row_a, pos_a, slot = _pick(rng, cells, "an unshared inner live slot")
    rpi, _, _ = _lens(d)
    live = {lr.batch_row: lr for lr in d.live}
    token_a = int(live[row_a].tokens[pos_a])
    targets = [
        c
        for c in _unshared_prefix_cells(d)
        if c[0] != row_a and c[1] != pos_a and int(live[c[0]].tokens[c[1]]) != token_a
    ]
    row_b, pos_b, slot_b = _pick(rng, targets, "a second request")
    d.tensors["req_to_token"][int(rpi[row_b]), pos_b] = slot
    for buffer, _ in _buffers(d):  # B wrote what it would have written to its own slot
        _put_record(d, buffer, slot, _record(d, buffer, slot_b))
    _record_violations(d, _and_next(row_a, pos_a) + _and_next(row_b, pos_b))
    d.truth = {
        "slot": slot,
        "batch_row": row_a,
        "position": pos_a,
        "other_batch_row": row_b,
        "other_position": pos_b,
    }


def _canary_stale_row(d: SynthDump, rng: np.random.Generator) -> None:
    """A recycled row is read through a prefix length that covers cells its previous owner
    left; their records continue the previous owner's chain, not this request's."""
    rpi, prefix, extend = _lens(d)
    free = d.tensors["free_full_slots"]
    msl = d.tensors["req_to_token"].shape[1]
    stale_len = 3
    fits = [lr for lr in d.live if lr.prefix_len > 0 and lr.prefix_len + stale_len <= msl]
    if not fits or free.size < stale_len:
        raise RuntimeError("no room for a stale row")
    lr = fits[int(rng.integers(len(fits)))]
    stale = free[rng.choice(free.size, size=stale_len, replace=False)]
    end = lr.prefix_len
    d.tensors["req_to_token"][lr.pool_row, end : end + stale_len] = stale.astype(np.int32)
    _drop_writes(d, lr.batch_row)
    prefix[lr.batch_row] = end + stale_len
    extend[lr.batch_row] = 0
    running = int(rng.integers(-(1 << 62), 1 << 62))  # the previous owner's chain
    for i, slot in enumerate(stale.tolist()):
        record = [int(rng.integers(0, 32000)), end + i, running, 0]
        for buffer, _ in _buffers(d):
            _put_record(d, buffer, slot, record)
        running = _link(record)
    _record_violations(d, [(lr.batch_row, end + i) for i in range(stale_len)])
    d.truth = {"batch_row": lr.batch_row, "position": end, "slot": int(stale[0])}


def _canary_kv_overwritten(d: SynthDump, rng: np.random.Generator) -> None:
    """The KV bytes of a live slot changed after its TAIL record fingerprinted them."""
    row, pos, slot = _pick(rng, _unshared_prefix_cells(d), "an unshared live slot")
    d.tensors["real_kv.full.k"][slot, 0] ^= 0xA5
    _record_violations(d, [(row, pos)])
    d.truth = {"batch_row": row, "position": pos, "slot": slot}


# --- unified memory (synth.state._unified): each side's page tables and holes ---------------


def _written_pages(d: SynthDump) -> np.ndarray:
    """The virtual pages this step writes (`out_cache_loc`), bound on both sides: in every
    window, the last ones an allocation handed out."""
    p = _page_size(d)
    pages = np.unique(np.asarray(d.tensors["out_cache_loc"], dtype=np.int64) // p)
    pages = pages[d.tensors["swa_virtual_to_physical"][pages] > 0]
    if pages.size == 0:
        raise RuntimeError("needs a page this step writes")
    return pages


def _unbind(d: SynthDump, side: str, virtual: int) -> int:
    """Unbind `virtual` on `side` and return its physical page, now a hole (or, at the span's
    growing edge, given back to the gap with the holes it then reaches)."""
    v2p = d.tensors[f"{side}_virtual_to_physical"]
    p2v = d.tensors[f"{side}_physical_to_virtual"]
    physical = int(v2p[virtual])
    v2p[virtual] = p2v[physical] = -1
    _add_hole(d, side, physical)
    return physical


def _add_hole(d: SynthDump, side: str, physical: int) -> None:
    """`physical` onto `side`'s holes, sorted; holes past the live span's growing edge (the
    full side grows down, the SWA side up) are absorbed, as compaction does."""
    p2v = d.tensors[f"{side}_physical_to_virtual"]
    bound = np.flatnonzero(p2v[1:-1] >= 0) + 1
    holes = np.sort(np.r_[d.tensors[f"{side}_physical_holes"], physical]).astype(np.int64)
    if side == "full":
        holes = holes[holes > bound.min(initial=p2v.size)]
    else:
        holes = holes[holes < bound.max(initial=0)]
    d.tensors[f"{side}_physical_holes"] = holes


def _tombstone_freed_again(d: SynthDump, rng: np.random.Generator) -> None:
    """A finished request freed through `free_segment` on both sides where its older pages'
    SWA side was tombstoned already (`free_full_segment` was due): each tombstone reads -1
    in the SWA table, and the lazy free appends that -1 to the SWA hole list (sorted: at its
    front). SGLang's own span check still balances."""
    again = 1 + int(rng.integers(0, 2))
    holes = d.tensors["swa_physical_holes"]
    d.tensors["swa_physical_holes"] = np.r_[np.full(again, -1), holes].astype(np.int64)
    d.truth = {"holes": again}


def _tombstone_bound(d: SynthDump, rng: np.random.Generator) -> None:
    """The -1 of a tombstone freed again, one step later: the SWA side's next allocation
    drained its holes from the low end, took the -1 and bound it, so `bind` wrote -1 as the
    page's physical page and the page's id over `physical_to_virtual`'s -1 sentinel. The page
    (one this step writes) reads as unbound: its slots map to no SWA slot. The physical page
    it would have had stays free."""
    p = _page_size(d)
    pages = _written_pages(d)
    virtual = int(pages[int(rng.integers(pages.size))])
    _unbind(d, "swa", virtual)
    d.tensors["swa_physical_to_virtual"][-1] = virtual
    d.tensors["full_to_swa_index_mapping"][virtual * p : (virtual + 1) * p] = 0
    d.truth = {"slot": virtual * p}


def _hole_freed_twice(d: SynthDump, rng: np.random.Generator) -> None:
    """An SWA page that left the window released twice (two frees of one retired page): its
    physical page is on the SWA hole list twice, and the next allocations hand it out twice."""
    holes = d.tensors["swa_physical_holes"]
    if holes.size == 0:
        raise RuntimeError("needs an SWA hole")
    twice = int(holes[int(rng.integers(holes.size))])
    d.tensors["swa_physical_holes"] = np.sort(np.r_[holes, twice]).astype(np.int64)
    d.truth = {"physical_page": twice}


def _hole_still_bound(d: SynthDump, rng: np.random.Generator) -> None:
    """The twice-released SWA page, one step later: this step's allocation drained one copy
    and bound it to a page it writes; the other copy is still on the hole list, bound."""
    pages = _written_pages(d)
    virtual = int(pages[int(rng.integers(pages.size))])
    physical = int(d.tensors["swa_virtual_to_physical"][virtual])
    holes = d.tensors["swa_physical_holes"]
    d.tensors["swa_physical_holes"] = np.sort(np.r_[holes, physical]).astype(np.int64)
    d.truth = {"physical_page": physical, "slot": virtual * _page_size(d)}


def _cached_pages(d: SynthDump) -> np.ndarray:
    """The virtual pages only the tree holds (finished requests' cached prefixes)."""
    p = _page_size(d)
    tree = np.unique(np.asarray(d.tensors["tree_full_slots"], dtype=np.int64) // p)
    table, lens = d.tensors["req_to_token"], d.tensors["req_pool_allocated_lens"]
    running = [table[row, : int(lens[row])] for row in np.flatnonzero(lens)]
    held = distinct(np.concatenate(running).astype(np.int64) // p) if running else tree[:0]
    cached = difference(tree, held)
    if cached.size == 0:
        raise RuntimeError("needs a page only the tree holds")
    return cached


def _virtual_freed_while_bound(d: SynthDump, rng: np.random.Generator) -> None:
    """A cached tree page's virtual id recycled onto `free_virtual_ids` without
    `MultiEndedAllocator.free` (no unbind): the tree keeps it and the full side still binds
    it, so the next allocation hands it to a second owner."""
    p = _page_size(d)
    cached = _cached_pages(d)
    page = int(cached[int(rng.integers(cached.size))])
    slots = page * p + np.arange(p, dtype=np.int64)
    d.tensors["free_full_slots"] = np.r_[d.tensors["free_full_slots"], slots]
    d.truth = {"slot": page * p}


def _rebind_lost(d: SynthDump, rng: np.random.Generator) -> None:
    """Lazy compaction moved a live full-side page into a hole and rewrote
    `physical_to_virtual`, but the page's `virtual_to_physical` rebind was lost: it still
    translates to the page it left (a hole now), where its KV no longer is."""
    v2p, p2v = d.tensors["full_virtual_to_physical"], d.tensors["full_physical_to_virtual"]
    holes = d.tensors["full_physical_holes"]
    pages = _written_pages(d)
    virtual = int(pages[int(rng.integers(pages.size))])
    source, target = int(v2p[virtual]), int(holes[int(rng.integers(holes.size))])
    p2v[target], p2v[source] = virtual, -1
    d.tensors["full_physical_holes"] = np.sort(np.r_[holes[holes != target], source])
    d.truth = {"slot": virtual * _page_size(d), "physical_page": target}


def _bound_twice(d: SynthDump, rng: np.random.Generator) -> None:
    """A full-side physical page released twice, both copies drained: this step's allocation
    bound a page it writes to the physical page another live page still holds (the later
    bind wins `physical_to_virtual`); the page it would have had stays free."""
    p = _page_size(d)
    v2p, p2v = d.tensors["full_virtual_to_physical"], d.tensors["full_physical_to_virtual"]
    pages = _written_pages(d)
    virtual = int(pages[int(rng.integers(pages.size))])
    others = difference(np.flatnonzero(v2p[1:-1] > 0) + 1, [virtual])
    owner = int(others[int(rng.integers(others.size))])
    _unbind(d, "full", virtual)
    v2p[virtual] = v2p[owner]
    p2v[v2p[owner]] = virtual
    d.truth = {"slot": virtual * p, "owner_slot": owner * p}


def _unbound_under_holder(d: SynthDump, rng: np.random.Generator) -> None:
    """A live page's full-side physical page released under it (a physical reservation
    rolled back after its bind): unbound while a running request holds it, its physical page
    a hole; the request's reads translate to no KV."""
    pages = _written_pages(d)
    virtual = int(pages[int(rng.integers(pages.size))])
    _unbind(d, "full", virtual)
    d.truth = {"slot": virtual * _page_size(d)}


def _swa_table_sized_by_its_pool(d: SynthDump, rng: np.random.Generator) -> None:
    """SGLang #37560: the SWA side's `MultiEndedAllocator` built without `virtual_num_pages`,
    so its `virtual_to_physical` is sized by its own physical pages, not by the full side's
    virtual ids. The SWA pages take twice a full page's bytes (the scenario's model), so the
    table addresses half the ids. Nothing has read past it yet: ids are minted in order, and
    every page bound so far is below its end; the first id minted past it will. Capture
    reads the LUT from that table, so the LUT is as short."""
    p = _page_size(d)
    pages = int(d.tensors["swa_physical_to_virtual"].size) - 1
    full = d.tensors["full_virtual_to_physical"]
    if int((np.flatnonzero(full[1:-1] >= 0) + 1).max(initial=0)) >= pages:
        raise RuntimeError("needs every bound virtual page inside the SWA pool's pages")
    table = d.tensors["swa_virtual_to_physical"]
    d.tensors["swa_virtual_to_physical"] = np.r_[table[:pages], -1].astype(np.int64)
    lut = d.tensors["full_to_swa_index_mapping"]
    d.tensors["full_to_swa_index_mapping"] = np.r_[lut[: pages * p], -1].astype(np.int64)
    d.truth = {"virtual_pages": pages, "full_virtual_pages": int(full.size) - 1}


_SWA = {"window": 8}
_SWA_PAGED = {"window": 32, "page_size": 16, "max_seq_len": 128}
_REQ_ROWS = {"req_rows": True}
#: SGLang's unified memory: the SWA model on one buffer, virtual ids and page tables
_UNIFIED = {**_SWA, "unified": True, "req_rows": True, "tree_locks": True}
_TREE_LOCKS = {"req_rows": True, "tree_locks": True}

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="clean-decode",
            summary="decode step, radix-shared prefixes, no SWA",
            spec={"mode": "decode"},
        ),
        Scenario(
            name="clean-extend",
            summary="extend / chunked-prefill step with padding rows",
            spec={"mode": "extend", "padding_rows": 2},
        ),
        Scenario(
            name="clean-swa",
            summary="SWA model, page size 1, lazy out-of-window clearing",
            spec={"mode": "mixed", **_SWA},
        ),
        Scenario(
            name="clean-swa-paged",
            summary="SWA model, page size 16, page-aligned clearing",
            spec={"mode": "mixed", **_SWA_PAGED},
        ),
        Scenario(
            name="clean-unified",
            summary="SWA model on unified memory: virtual ids, each side's page tables, lazy "
            "compaction holes, the tree caching finished requests' pages",
            spec={"mode": "mixed", **_UNIFIED},
        ),
        Scenario(
            name="clean-eagle-draft",
            summary="EAGLE draft pool: token offset +1, token pool",
            spec={"mode": "decode", "token_offset": 1, "expected_pool": True},
        ),
        Scenario(
            name="truncated-lut",
            summary="LUT sliced to lut[:num_allocated]: REF raises, the GPU clamps",
            spec=_SWA,
            corrupt=_truncated_lut,
            expected=("lut-out-of-range", "lut-shorter-than-pool", "lut-sentinel-missing"),
            cause="lut-too-short",
        ),
        Scenario(
            name="use-after-free",
            summary="a live prefix slot is on the allocator's free list",
            spec={},
            corrupt=_use_after_free,
            expected=("freed-slot-in-live-range",),
            cause="use-after-free",
        ),
        Scenario(
            name="cross-request-aliasing",
            summary="a slot copied into another request at another position",
            spec={},
            corrupt=_aliasing,
            expected=("slot-shared-across-positions",),
            cause="cross-request-aliasing",
        ),
        Scenario(
            name="stale-tail",
            summary="recycled row read through a prefix length covering the old owner's tail",
            spec={},
            corrupt=_stale_tail,
            expected=("freed-slot-in-live-range",),
            cause="stale-row-read",
        ),
        Scenario(
            name="unfilled-cells",
            summary="a live prefix cell was never written (slot 0)",
            spec={},
            corrupt=_unfilled,
            expected=("padding-slot-in-live-range",),
            cause="unwritten-cells",
        ),
        Scenario(
            name="radix-copy",
            summary="a cell overwritten with another request's slot at the same position, the "
            "rows unshared before it (SGLang's fault injector)",
            spec={},
            corrupt=_radix_copy,
            expected=("slot-shared-without-prefix",),
            cause="radix-prefix-broken",
        ),
        Scenario(
            name="swa-page-leak",
            summary="an SWA page unmapped but never freed (SGLang issue #27789)",
            spec={**_SWA_PAGED, "evict_prob": 0.0},
            corrupt=_swa_page_leak,
            expected=("swa-page-leaked",),
            cause="swa-leak",
        ),
        Scenario(
            name="double-free",
            summary="a page freed twice: its slots are on the free list twice",
            spec=_SWA_PAGED,
            corrupt=_double_free,
            expected=("free-list-duplicate",),
            cause="double-free",
        ),
        Scenario(
            name="reserved-slot-freed",
            summary="the reserved padding page on the free list",
            spec=_SWA_PAGED,
            corrupt=_reserved_freed,
            expected=("reserved-slot-in-use",),
            cause="reserved-slot-freed",
        ),
        Scenario(
            name="full-page-leak",
            summary="a full page neither free, nor the tree's, nor a running request's "
            "(SGLang's 'pool memory leak detected!')",
            spec=_SWA_PAGED,
            corrupt=_full_page_leak,
            expected=("full-page-leaked",),
            allowed=("swa-page-leaked",),
            cause="full-leak",
        ),
        Scenario(
            name="freed-under-running-request",
            summary="a running request's page, outside the batch, back on the free list "
            "(SGLang 0.5.13 - 0.5.14's SWA tombstone recovery)",
            spec=_SWA_PAGED,
            corrupt=_freed_under_running_request,
            expected=("full-slot-free-and-held",),
            cause="use-after-free",
        ),
        Scenario(
            name="page-handed-to-two-running-requests",
            summary="a page two running requests outside the batch hold, the tree not",
            spec=_SWA_PAGED,
            corrupt=_handed_to_two_running_requests,
            expected=("full-slot-held-twice",),
            cause="cross-request-aliasing",
        ),
        Scenario(
            name="reserved-swa-page-freed",
            summary="the SWA pool's reserved padding page on the SWA free list (PR #38519)",
            spec=_SWA_PAGED,
            corrupt=_reserved_swa_freed,
            expected=("reserved-slot-in-use",),
            cause="reserved-slot-freed",
        ),
        Scenario(
            name="reserved-swa-page-handed-out",
            summary="the SWA padding page freed and handed out: full pages map into SWA "
            "slots 1 .. page_size - 1 (PR #38519 at page_size > 1)",
            spec=_SWA_PAGED,
            corrupt=_reserved_swa_handed_out,
            expected=("reserved-slot-in-use",),
            allowed=("swa-slot-shared-owner",),
            cause="reserved-slot-freed",
            min_page_size=2,
        ),
        Scenario(
            name="reserved-swa-page-freed-twice",
            summary="the SWA pool's reserved padding page on the SWA free list twice (PR #38519: "
            "unmapped representatives freed as slot 0)",
            spec=_SWA_PAGED,
            corrupt=_reserved_swa_freed_twice,
            expected=("free-list-duplicate", "reserved-slot-in-use"),
            cause="reserved-slot-freed",
        ),
        Scenario(
            name="swa-boundary-page-cleared",
            summary="a full page straddling the window's start cleared whole: its in-window "
            "entries erased with the rest (PR #36457: two nodes sharing a boundary page)",
            spec=_SWA_PAGED,
            corrupt=_swa_boundary_page_cleared,
            expected=("swa-unmapped-in-window",),
            cause="swa-boundary-page-cleared",
            min_page_size=2,
        ),
        Scenario(
            name="swa-page-reissued",
            summary="an SWA page freed whole by a partial-page free and handed out again: two "
            "full owners, the old one stale (PR #27779, one step later)",
            spec={**_SWA_PAGED, "evict_prob": 1.0},
            corrupt=_swa_page_reissued,
            expected=("swa-slot-shared-owner",),
            cause="swa-page-reissued",
            min_page_size=4,
        ),
        Scenario(
            name="stale-swa-mapping",
            summary="a free full page still maps into a free SWA page (SGLang PRs #25385, #25270)",
            spec=_SWA_PAGED,
            corrupt=functools.partial(_free_page_still_mapped, whole=True),
            expected=("free-slot-still-mapped", "swa-slot-free-and-mapped"),
            cause="stale-swa-mapping",
        ),
        Scenario(
            name="partial-page-free",
            summary="part of a free full page still maps into a free SWA page (SGLang PR #27779)",
            spec=_SWA_PAGED,
            corrupt=functools.partial(_free_page_still_mapped, whole=False),
            expected=("free-slot-still-mapped", "swa-slot-free-and-mapped"),
            cause="partial-page-free",
            min_page_size=2,
        ),
        Scenario(
            name="swa-freed-while-live",
            summary="a live page's replacement SWA page freed, the old one leaked (SGLang PR "
            "#36135)",
            spec=_SWA_PAGED,
            corrupt=_swa_freed_while_live,
            expected=("freed-slot-in-live-range", "swa-page-leaked"),
            cause="swa-freed-while-live",
        ),
        Scenario(
            name="swa-mapping-rewritten",
            summary="two tokens of a full page swap their SWA entries (pages out of lockstep)",
            spec=_SWA_PAGED,
            corrupt=_swa_mapping_rewritten,
            expected=("swa-page-out-of-lockstep",),
            cause="swa-mapping-rewritten",
            min_page_size=2,
        ),
        Scenario(
            name="swa-shared-owner",
            summary="a tombstoned slot's stale mapping onto a live SWA slot (SGLang PR #27586)",
            spec={**_SWA, "evict_prob": 1.0},
            corrupt=_swa_shared_owner,
            expected=("swa-slot-shared-owner",),
            allowed=("swa-page-out-of-lockstep",),  # the stale entry is off its page's offset
            cause="swa-shared-owner",
        ),
        Scenario(
            name="swa-write-into-live-slot",
            summary="a write lands on another request's live SWA slot (SGLang PR #25889)",
            spec=_SWA,
            corrupt=_swa_write_into_live,
            expected=("swa-write-to-live-slot",),
            # the written slot's own SWA page is orphaned; its entry is off its page's offset
            allowed=("swa-page-leaked", "swa-page-out-of-lockstep"),
            cause="swa-write-into-live-slot",
        ),
        Scenario(
            name="swa-lut-cleared-in-window",
            summary="an SWA peer freed while its token is still in the window",
            spec=_SWA,
            corrupt=_swa_cleared,
            expected=("swa-unmapped-in-window",),
            cause="swa-mapping-cleared-in-window",
        ),
        Scenario(
            name="swa-slot-collision",
            summary="two full slots in the window map to one SWA slot",
            spec=_SWA,
            corrupt=_swa_collision,
            expected=("swa-slot-collision",),
            allowed=("swa-page-leaked",),  # the overwritten mapping's SWA page is orphaned
            cause="swa-mapping-collision",
        ),
        Scenario(
            name="unified-tombstone-freed-again",
            summary="unified memory: a finished request's tombstoned SWA pages freed again, "
            "their -1 on the SWA side's hole list (free_segment where free_full_segment was due)",
            spec=_UNIFIED,
            corrupt=_tombstone_freed_again,
            expected=("physical-hole-invalid",),
            cause="physical-page-double-free",
        ),
        Scenario(
            name="unified-tombstone-bound",
            summary="unified memory, a step later: the SWA side's next allocation took that -1 "
            "off its holes and bound it, over physical_to_virtual's sentinel",
            spec=_UNIFIED,
            corrupt=_tombstone_bound,
            expected=("page-table-sentinel-overwritten",),
            # at pages of several slots, the page's older tokens in a live window
            allowed=("swa-unmapped-in-window",),
            cause="physical-page-double-free",
        ),
        Scenario(
            name="unified-hole-freed-twice",
            summary="unified memory: an SWA page that left the window released twice, on the "
            "SWA side's hole list twice",
            spec=_UNIFIED,
            corrupt=_hole_freed_twice,
            expected=("physical-hole-invalid",),
            cause="physical-page-double-free",
        ),
        Scenario(
            name="unified-hole-still-bound",
            summary="unified memory, a step later: one copy of that page drained and bound to a "
            "page this step writes, the other still on the hole list",
            spec=_UNIFIED,
            corrupt=_hole_still_bound,
            expected=("physical-hole-invalid",),
            cause="physical-page-double-free",
        ),
        Scenario(
            name="unified-virtual-freed-while-bound",
            summary="unified memory: a cached tree page's virtual id recycled onto "
            "free_virtual_ids without its unbind",
            spec=_UNIFIED,
            corrupt=_virtual_freed_while_bound,
            expected=("virtual-page-free-and-bound", "full-slot-free-and-held"),
            cause="virtual-page-freed-while-bound",
        ),
        Scenario(
            name="unified-rebind-lost",
            summary="unified memory: lazy compaction moved a live full-side page into a hole, "
            "its virtual_to_physical rebind lost",
            spec=_UNIFIED,
            corrupt=_rebind_lost,
            expected=("page-table-mismatch",),
            cause="page-table-corrupt",
        ),
        Scenario(
            name="unified-physical-bound-twice",
            summary="unified memory: a full-side physical page released twice and handed out "
            "twice: two live virtual pages bound to it",
            spec=_UNIFIED,
            corrupt=_bound_twice,
            expected=("physical-page-shared", "page-table-mismatch"),
            cause="page-table-corrupt",
        ),
        Scenario(
            name="unified-unbound-under-holder",
            summary="unified memory: a live page's full-side physical page released under its "
            "running request (a reservation rolled back after its bind)",
            spec=_UNIFIED,
            corrupt=_unbound_under_holder,
            expected=("virtual-page-unbound",),
            cause="page-table-corrupt",
        ),
        Scenario(
            name="unified-swa-table-sized-by-its-pool",
            summary="unified memory, SWA pages of twice the bytes: the SWA side's "
            "virtual_to_physical sized by its own pool, half the full side's ids (its "
            "allocator built without virtual_num_pages, SGLang #37560); the LUT read from it",
            spec={**_UNIFIED, "swa_page_scale": 2, "spare_slots": 256},
            corrupt=_swa_table_sized_by_its_pool,
            expected=("page-table-size-mismatch", "lut-shorter-than-pool"),
            cause="page-table-corrupt",
        ),
        Scenario(
            name="capacity-overflow",
            summary="verify entries exceed capacity: the verify launch is skipped (warning)",
            spec={},
            corrupt=_overflow,
            expected=("verify-capacity-overflow",),
            cause="verify-capacity-overflow",
        ),
        Scenario(
            name="row-out-of-range",
            summary="req_pool_indices points past the pool",
            spec={},
            corrupt=_row_out_of_range,
            expected=("row-out-of-range",),
            cause="batch-metadata-corrupt",
        ),
        Scenario(
            name="prefix-past-row",
            summary="prefix_lens larger than the req_to_token row",
            spec={},
            corrupt=_prefix_past_row,
            expected=("prefix-beyond-row",),
            allowed=(
                "padding-slot-in-live-range",
                "freed-slot-in-live-range",
                "slot-shared-across-positions",
                "duplicate-slot-in-row",
            ),
            cause="batch-metadata-corrupt",
        ),
        Scenario(
            name="absurd-prefix-length",
            summary="a prefix length of 2^40 on one row: reported, never allocated",
            spec={},
            corrupt=_absurd_prefix,
            expected=("prefix-beyond-row", "verify-total-implausible"),
            allowed=(
                "padding-slot-in-live-range",
                "freed-slot-in-live-range",
                "slot-shared-across-positions",
                "duplicate-slot-in-row",
            ),
            cause="batch-metadata-corrupt",
        ),
        Scenario(
            name="corrupt-scalar",
            summary="a recorded verify_capacity of 10^30: reported, planned as unrecorded",
            spec={},
            corrupt=_corrupt_scalar,
            expected=("scalar-out-of-range",),
            cause="scalar-metadata-corrupt",
        ),
        Scenario(
            name="write-into-live-slot",
            summary="out_cache_loc writes a slot another request still reads",
            spec={},
            corrupt=_write_into_live,
            expected=("write-to-live-slot",),
            allowed=(
                "slot-shared-across-positions",
                "slot-shared-without-prefix",
                "duplicate-slot-in-row",
            ),
            cause="write-into-live-slot",
        ),
        Scenario(
            name="negative-slot",
            summary="a live req_to_token cell holds -1",
            spec={},
            corrupt=_negative_slot,
            expected=("negative-slot",),
            cause="slot-index-corrupt",
        ),
        Scenario(
            name="slot-beyond-pool",
            summary="a live slot past the end of the KV pool",
            spec={},
            corrupt=_slot_beyond_pool,
            expected=("slot-beyond-pool",),
            cause="slot-index-corrupt",
        ),
        Scenario(
            name="duplicate-slot-in-row",
            summary="one slot at two positions of a row",
            spec={},
            corrupt=_duplicate_in_row,
            expected=("duplicate-slot-in-row",),
            cause="slot-reused-within-request",
        ),
        Scenario(
            name="reuse-under-radix-sharer",
            summary="a slot repeated in its row while a radix sharer holds its first position",
            spec={},
            corrupt=_reuse_under_sharer,
            expected=("duplicate-slot-in-row", "slot-shared-across-positions"),
            allowed=("slot-shared-without-prefix",),
            cause="slot-reused-within-request",
        ),
        Scenario(
            name="double-allocation",
            summary="a request's last cells are another request's live slots (handed out twice)",
            spec={},
            corrupt=_double_allocation,
            expected=("slot-shared-across-positions",),
            allowed=("slot-shared-without-prefix",),
            cause="cross-request-aliasing",
        ),
        Scenario(
            name="duplicate-request-row",
            summary="two batch rows share one pool row",
            spec={},
            corrupt=_duplicate_request,
            expected=("duplicate-request-row",),
            cause="batch-metadata-corrupt",
        ),
        Scenario(
            name="req-row-leaked",
            summary="a finished request's req_to_token row never freed",
            spec=_REQ_ROWS,
            corrupt=_req_row_leaked,
            expected=("req-row-leaked",),
            cause="req-row-leak",
        ),
        Scenario(
            name="req-row-freed-while-running",
            summary="a running request's req_to_token row on the request pool's free list",
            spec=_REQ_ROWS,
            corrupt=_req_row_freed_while_running,
            expected=("req-row-free-and-held",),
            cause="req-row-double-free",
        ),
        Scenario(
            name="req-row-freed-twice",
            summary="a req_to_token row on the request pool's free list twice",
            spec=_REQ_ROWS,
            corrupt=_req_row_freed_twice,
            expected=("req-row-handed-out-twice",),
            cause="req-row-double-free",
        ),
        Scenario(
            name="tree-lock-leaked",
            summary="a finished request's prefix left locked in the radix tree",
            spec=_TREE_LOCKS,
            corrupt=_tree_lock_leaked,
            expected=("tree-lock-leaked",),
            cause="tree-lock-leak",
        ),
        Scenario(
            name="expected-token-out-of-range",
            summary="the expected-token pool is narrower than valid_lens",
            spec={"expected_pool": True},
            corrupt=_token_pool_narrow,
            expected=("expected-token-out-of-range",),
            cause="expected-token-pool-mismatch",
        ),
        Scenario(
            name="kernel-limit-exceeded",
            summary="bs > write_req_capacity: the GPU raises",
            spec={},
            corrupt=_kernel_limit,
            expected=("kernel-limit-exceeded",),
            cause="kernel-limit",
        ),
        Scenario(
            name="negative-length",
            summary="a negative extend length (treated as 0)",
            spec={},
            corrupt=_negative_length,
            expected=("negative-length",),
            cause="batch-metadata-corrupt",
        ),
        Scenario(
            name="gpu-dtype-mismatch",
            summary="req_pool_indices saved as int32",
            spec={},
            corrupt=_int32_indices,
            expected=("gpu-dtype-mismatch",),
            cause="noncanonical-dtype",
        ),
        Scenario(
            name="truncated-lut-unrecorded",
            summary="a truncated LUT in a dump that does not record num_full_slots",
            spec=_SWA,
            corrupt=_truncated_lut_unrecorded,
            expected=("lut-out-of-range", "slot-beyond-pool", "lut-sentinel-missing"),
            cause="lut-too-short",
        ),
        Scenario(
            name="undersized-lut",
            summary="a LUT allocated for a smaller pool: too short, trailing -1 kept",
            spec=_SWA,
            corrupt=_undersized_lut,
            expected=("lut-out-of-range", "lut-shorter-than-pool"),
            cause="lut-too-short",
        ),
        Scenario(
            name="slot-beyond-pool-swa",
            summary="a corrupt slot index past the pool; the LUT is sized right",
            spec=_SWA,
            corrupt=_slot_beyond_pool_with_lut,
            expected=("slot-beyond-pool", "lut-out-of-range"),
            cause="slot-index-corrupt",
        ),
        Scenario(
            name="clean-canary",
            summary="SWA model with canary buffers (K and V, HEAD and TAIL), real KV, tokens",
            spec={
                "mode": "mixed",
                **_SWA,
                "expected_pool": True,
                "canary": True,
                "canary_v": True,
                "canary_real_kv": True,
            },
        ),
        Scenario(
            name="canary-use-after-free",
            summary="a freed slot rewritten by its next owner while a request still reads it",
            spec={"canary": True},
            corrupt=_canary_use_after_free,
            expected=(
                "freed-slot-in-live-range",
                "canary-chain-break",
                "canary-position-mismatch",
            ),
            cause="use-after-free",
        ),
        Scenario(
            name="canary-aliasing",
            summary="two requests hold one slot at two positions; the later writer's record wins",
            spec={"canary": True, "expected_pool": True},
            corrupt=_canary_aliasing,
            expected=(
                "slot-shared-across-positions",
                "canary-chain-break",
                "canary-position-mismatch",
                "canary-token-mismatch",
            ),
            cause="cross-request-aliasing",
        ),
        Scenario(
            name="canary-stale-row",
            summary="a recycled row read past its end: the old owner's records break the chain",
            spec={"canary": True},
            corrupt=_canary_stale_row,
            expected=("freed-slot-in-live-range", "canary-chain-break"),
            cause="stale-row-read",
        ),
        Scenario(
            name="canary-kv-overwritten",
            summary="the KV bytes of a live slot changed after the TAIL canary fingerprinted them",
            spec={"canary": True, "canary_real_kv": True},
            corrupt=_canary_kv_overwritten,
            expected=("canary-real-kv-mismatch",),
            cause="kv-overwritten",
        ),
    )
}


def make_scenario(
    name: str,
    *,
    seed: int = 0,
    size: str = "tiny",
    corrupt: bool = True,
    page_size: int | None = None,
) -> SynthDump:
    """Build scenario `name` at `size`; its metadata names the findings it must produce.

    `corrupt=False` gives the clean state the corruption would start from (same shape);
    `page_size` overrides the scenario's page size.
    """
    if name not in SCENARIOS:
        raise OptionError(
            f"unknown scenario {name!r}", option="scenario", hint="kvcanary synth --list shows them"
        )
    checked_choice(size, list(SIZES), "size")
    scenario = SCENARIOS[name]
    base = SIZES[size]
    spec = replace(base, **scenario.spec)  # type: ignore[arg-type]
    if page_size is not None:
        if page_size < scenario.min_page_size:
            raise OptionError(
                f"scenario {name} needs pages of {scenario.min_page_size} slots or more "
                f"(got --page-size {page_size})",
                option="page_size",
            )
        spec = replace(spec, page_size=page_size)
    if size in ("medium", "large"):
        spec = replace(spec, expected_pool=False, max_seq_len=base.max_seq_len)
    # Corruptions need material (an unshared slot, a stale tail...): try nearby seeds.
    last_error: Exception | None = None
    for attempt in range(16):
        dump = build_dump(spec, seed=seed * 101 + attempt)
        if scenario.corrupt is None or not corrupt:
            break
        try:
            scenario.corrupt(dump, np.random.default_rng(seed * 7919 + attempt))
            break
        except RuntimeError as exc:
            last_error = exc
    else:
        raise RuntimeError(f"scenario {name} could not be built: {last_error}")
    dump.metadata["note"] = f"kvcanary synth {name} seed={seed} size={size}: {scenario.summary}"
    dump.metadata["kvcanary.scenario"] = name
    if not corrupt:
        return dump
    dump.metadata["kvcanary.expected_findings"] = ",".join(scenario.expected)
    if scenario.cause is not None:
        dump.metadata["kvcanary.expected_diagnosis"] = scenario.cause
    if scenario.allowed:
        dump.metadata["kvcanary.allowed_findings"] = ",".join(scenario.allowed)
    return dump


def scenario_lines() -> list[str]:
    """One line per scenario for `synth --list`: name, summary, expected finding codes."""
    width = max(len(name) for name in SCENARIOS)
    return [
        f"{name:<{width}}  {item.summary}  [{', '.join(item.expected) or 'none (clean)'}]"
        for name, item in SCENARIOS.items()
    ]
