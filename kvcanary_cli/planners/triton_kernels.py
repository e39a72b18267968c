"""Triton kernels of the GPU plan path: offsets (one program) and entries (a 1-D grid).

Only `@triton.jit` functions and the flag bits they write live here; `triton_planner` launches
them. Import this module only through `triton_runtime.load_kernels()`, which chooses compiled or
interpreted kernels (`TRITON_INTERPRET`) before `import triton` and the decorators below run.
(The kernels cannot come out of a factory function instead: the triton interpreter re-executes
a kernel's source in its module's globals, so values captured in a closure are lost.)

Reads of `req_to_token` and the expected-token pool follow the GPU path's flat addressing
(docs/semantics.md §1.5, §1.6): a cell is `base[row * stride + col]`, so a column beyond the
row reads the next row, exactly like the CUDA entries kernel. A flat index outside the tensor
is never dereferenced (the load is masked); the field is flagged undefined and holds 0.
"""
# mypy: disable-error-code="no-untyped-def, misc, name-defined"

from __future__ import annotations

import triton
import triton.language as tl

from kvcanary_cli.planners.base import ClampFlag, SeedFlag, Undefined

__all__ = ["plan_entries_kernel", "plan_offsets_kernel"]

#: The planners' flag bits as constexprs: `seed_flags` of `plan_offsets_kernel`, then
#: `clamp` and `undefined` of `plan_entries_kernel`.
SEED_UNDEFINED = tl.constexpr(int(SeedFlag.UNDEFINED))
SEED_CLAMPED = tl.constexpr(int(SeedFlag.CLAMPED))
CLAMP_SLOT = tl.constexpr(int(ClampFlag.SLOT))
CLAMP_PREV = tl.constexpr(int(ClampFlag.PREV))
UNDEFINED_SLOT = tl.constexpr(int(Undefined.SLOT))
UNDEFINED_PREV = tl.constexpr(int(Undefined.PREV))
UNDEFINED_TOKEN = tl.constexpr(int(Undefined.TOKEN))


@triton.jit
def _add(a, b):
    """Combine function of the prefix sums when `STD_SCAN` is off."""
    return a + b


@triton.jit
def _translate_slots(raw, readable, lut_ptr, lut_len, HAS_LUT: tl.constexpr):
    """T(x) of §1.2 with the GPU clamp of §1.6: x < 0 passes through, x >= lut_len reads
    `LUT[lut_len - 1]`. Returns `(translated, clamped)`; lanes with `readable` False are
    not looked up (their value is meaningless and the caller replaces it)."""
    if HAS_LUT:
        lookup = readable & (raw >= 0)
        clamped = lookup & (raw >= lut_len)
        index = tl.where(lookup, tl.minimum(raw, lut_len - 1), 0)
        mapped = tl.load(lut_ptr + index, mask=lookup, other=0).to(tl.int64)
        translated = tl.where(lookup, mapped, raw)
    else:
        clamped = readable & (raw != raw)
        translated = raw
    return translated, clamped


@triton.jit
def _gather_flat(base_ptr, flat, wanted, numel):
    """`base[flat]` as int64 where `wanted` and `0 <= flat < numel`; `(value, readable)`."""
    readable = wanted & (flat >= 0) & (flat < numel)
    value = tl.load(base_ptr + tl.where(readable, flat, 0), mask=readable, other=0)
    return value.to(tl.int64), readable


@triton.jit
def _row_of(verify_offsets_ptr, k, bs, BLOCK_BS: tl.constexpr, SEARCH_STEPS: tl.constexpr):
    """The row owning entry `k` (a scalar): the largest r <= bs with `verify_offsets[r] <= k`,
    by the same branch-free halving as the vector search."""
    row = k * 0
    for i in tl.static_range(SEARCH_STEPS):
        candidate = row + (BLOCK_BS >> (i + 1))
        probe = candidate <= bs
        start = tl.load(verify_offsets_ptr + tl.where(probe, candidate, 0))
        row = tl.where(probe & (start <= k), candidate, row)
    return row


#: Runtime integers are not specialised on their value (== 1, multiple of 16): batches vary,
#: and each specialisation would be one more compilation.
@triton.jit(
    do_not_specialize=[
        "bs",
        "req_to_token_stride",
        "req_to_token_numel",
        "lut_len",
        "window",
        "verify_capacity",
    ]
)
def plan_offsets_kernel(
    req_pool_indices_ptr,
    prefix_lens_ptr,
    extend_seq_lens_ptr,
    req_to_token_ptr,
    lut_ptr,
    verify_offsets_ptr,
    write_offsets_ptr,
    seeds_ptr,
    seed_raw_ptr,
    seed_flags_ptr,
    totals_ptr,
    bs,
    req_to_token_stride,
    req_to_token_numel,
    lut_len,
    window,
    verify_capacity,
    HAS_LUT: tl.constexpr,
    BLOCK_BS: tl.constexpr,
    STD_SCAN: tl.constexpr,
):
    """Verify and write offsets, capacity check and seeds: §1.2 and §1.5 (the offsets step).

    One program over `BLOCK_BS >= bs + 1` lanes, one per batch row; lane `bs` (a padding
    lane with zero lengths) receives the totals of the exclusive prefix sums. STD_SCAN uses
    `tl.cumsum`/`tl.sum`; without it the same sums go through `_add`, for an interpreter
    whose triton standard library was decorated for compilation (see `triton_runtime`).

    Outputs: `verify_offsets`/`write_offsets` int64 [bs+1]; `seeds`, `seed_raw` (the
    untranslated cell) int64 [bs]; `seed_flags` uint8 [bs] (`SEED_UNDEFINED`,
    `SEED_CLAMPED`); `totals` int64 [3] = (total_verify, verify_num_valid, enable).
    """
    lanes = tl.arange(0, BLOCK_BS)
    in_batch = lanes < bs
    rp = tl.load(req_pool_indices_ptr + lanes, mask=in_batch, other=0).to(tl.int64)
    prefix = tl.load(prefix_lens_ptr + lanes, mask=in_batch, other=0).to(tl.int64)
    extend = tl.load(extend_seq_lens_ptr + lanes, mask=in_batch, other=0).to(tl.int64)
    active = in_batch & (rp != 0)
    window_start = tl.where(window > 0, tl.maximum(prefix - window, 0), 0)
    verify_len = tl.where(active, tl.maximum(prefix - window_start, 0), 0)
    write_len = tl.where(active & (extend > 0), extend, 0)

    if STD_SCAN:
        verify_incl = tl.cumsum(verify_len, axis=0)
        write_incl = tl.cumsum(write_len, axis=0)
        total = tl.sum(verify_len, axis=0)
    else:
        verify_incl = tl.associative_scan(verify_len, 0, _add)
        write_incl = tl.associative_scan(write_len, 0, _add)
        total = tl.reduce(verify_len, 0, _add)
    head = lanes <= bs
    tl.store(verify_offsets_ptr + lanes, verify_incl - verify_len, mask=head)
    tl.store(write_offsets_ptr + lanes, write_incl - write_len, mask=head)

    overflow = total > verify_capacity
    tl.store(totals_ptr + 0, total)
    tl.store(totals_ptr + 1, tl.where(overflow, verify_capacity, total))
    tl.store(totals_ptr + 2, tl.where(overflow, 0, 1).to(tl.int64))

    has_seed = active & (extend > 0) & (prefix > 0)
    flat = rp * req_to_token_stride + prefix - 1
    raw, readable = _gather_flat(req_to_token_ptr, flat, has_seed, req_to_token_numel)
    seed, clamped = _translate_slots(raw, readable, lut_ptr, lut_len, HAS_LUT)
    seed = tl.where(has_seed, tl.where(readable, seed, 0), -1)
    flags = tl.where(has_seed & ~readable, SEED_UNDEFINED, 0) + tl.where(clamped, SEED_CLAMPED, 0)
    tl.store(seeds_ptr + lanes, seed, mask=in_batch)
    tl.store(seed_raw_ptr + lanes, raw, mask=in_batch)
    tl.store(seed_flags_ptr + lanes, flags.to(tl.uint8), mask=in_batch)


@triton.jit(
    do_not_specialize=[
        "entry_start",
        "entry_stop",
        "bs",
        "req_to_token_stride",
        "req_to_token_numel",
        "lut_len",
        "window",
        "pool_stride",
        "pool_numel",
        "token_offset",
    ]
)
def plan_entries_kernel(
    req_pool_indices_ptr,
    prefix_lens_ptr,
    valid_lens_ptr,
    req_to_token_ptr,
    lut_ptr,
    pool_ptr,
    verify_offsets_ptr,
    slot_out_ptr,
    prev_out_ptr,
    token_out_ptr,
    position_out_ptr,
    undefined_out_ptr,
    clamp_out_ptr,
    entry_start,
    entry_stop,
    bs,
    req_to_token_stride,
    req_to_token_numel,
    lut_len,
    window,
    pool_stride,
    pool_numel,
    token_offset,
    HAS_LUT: tl.constexpr,
    HAS_POOL: tl.constexpr,
    BLOCK_BS: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Verify entries `[entry_start, entry_stop)`, BLOCK_SIZE per program: §1.2 and §1.5
    (the entries step), with the clamp of §1.6.

    The owning row of entry k is the largest r with `verify_offsets[r] <= k`, found by a
    branch-free binary search over `verify_offsets[0..bs]` (halving steps from BLOCK_BS / 2,
    BLOCK_BS >= bs + 1): zero-length rows share their offset with the next row and are never
    selected, and `verify_offsets[bs] = total > k` bounds the answer. Rows grow with k, so the
    rows of a program's entries lie between those of its first and last entry (two scalar
    searches); the vector search takes only the steps that range needs, which is most of the
    work saved where a block spans a few rows (under the interpreter, every step costs
    BLOCK_SIZE loads).

    Outputs at index k: slot, prev and expected token (int64; -1 sentinels as §1.2; 0 where
    undefined), expected position, `undefined` (uint8 `base.Undefined` bits) and `clamp`
    (uint8 `CLAMP_SLOT`, `CLAMP_PREV`: translated slot >= lut_len was clamped).
    """
    pid = tl.program_id(0).to(tl.int64)
    k = entry_start + pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE).to(tl.int64)
    live = k < entry_stop

    k_first = entry_start + pid * BLOCK_SIZE
    k_last = tl.minimum(k_first + BLOCK_SIZE, entry_stop) - 1
    lowest = _row_of(verify_offsets_ptr, k_first, bs, BLOCK_BS, SEARCH_STEPS)
    highest = _row_of(verify_offsets_ptr, k_last, bs, BLOCK_BS, SEARCH_STEPS)
    span = highest - lowest
    row = tl.full([BLOCK_SIZE], 0, dtype=tl.int64) + lowest
    for i in tl.static_range(SEARCH_STEPS):
        # Descending powers of two up to the largest <= span: they add up to >= span.
        if (BLOCK_BS >> (i + 1)) <= span:
            candidate = row + (BLOCK_BS >> (i + 1))
            probe = live & (candidate <= highest)
            start = tl.load(verify_offsets_ptr + tl.where(probe, candidate, 0), mask=probe, other=0)
            row = tl.where(probe & (start <= k), candidate, row)

    rp = tl.load(req_pool_indices_ptr + row, mask=live, other=0).to(tl.int64)
    prefix = tl.load(prefix_lens_ptr + row, mask=live, other=0).to(tl.int64)
    first = tl.load(verify_offsets_ptr + row, mask=live, other=0)
    window_start = tl.where(window > 0, tl.maximum(prefix - window, 0), 0)
    pos = window_start + (k - first)

    flat = rp * req_to_token_stride + pos
    raw, slot_ok = _gather_flat(req_to_token_ptr, flat, live, req_to_token_numel)
    slot, slot_clamped = _translate_slots(raw, slot_ok, lut_ptr, lut_len, HAS_LUT)
    slot = tl.where(slot_ok, slot, 0)

    has_prev = live & (pos > 0)
    prev_raw, prev_ok = _gather_flat(req_to_token_ptr, flat - 1, has_prev, req_to_token_numel)
    prev, prev_clamped = _translate_slots(prev_raw, prev_ok, lut_ptr, lut_len, HAS_LUT)
    prev = tl.where(has_prev, tl.where(prev_ok, prev, 0), -1)

    undefined = tl.where(live & ~slot_ok, UNDEFINED_SLOT, 0) + tl.where(
        has_prev & ~prev_ok, UNDEFINED_PREV, 0
    )
    if HAS_POOL:
        s = pos + token_offset
        valid_len = tl.load(valid_lens_ptr + row, mask=live, other=0).to(tl.int64)
        gathers = live & (s >= 0) & (s < valid_len)
        token, token_ok = _gather_flat(pool_ptr, rp * pool_stride + s, gathers, pool_numel)
        token = tl.where(gathers, tl.where(token_ok, token, 0), -1)
        undefined += tl.where(gathers & ~token_ok, UNDEFINED_TOKEN, 0)
    else:
        token = tl.full([BLOCK_SIZE], -1, dtype=tl.int64)

    clamp = tl.where(slot_clamped, CLAMP_SLOT, 0) + tl.where(prev_clamped, CLAMP_PREV, 0)
    tl.store(slot_out_ptr + k, slot, mask=live)
    tl.store(prev_out_ptr + k, prev, mask=live)
    tl.store(token_out_ptr + k, token, mask=live)
    tl.store(position_out_ptr + k, pos, mask=live)
    tl.store(undefined_out_ptr + k, undefined.to(tl.uint8), mask=live)
    tl.store(clamp_out_ptr + k, clamp.to(tl.uint8), mask=live)
