"""Hypothesis strategies: small random kv-canary dumps, valid and corrupt.

A strategy draws a `DumpCase` (tensors + metadata, kept tiny so that examples run in
milliseconds); `dump_from` saves it with `save_dump` and reads it back with `load_dump`, so
every planner sees exactly what the CLI would.

`valid_dumps()` stays inside the region where SGLang's reference planner and its GPU path
agree (docs/semantics.md §1.2): pool rows in range (and nonzero) for active rows,
P + E <= max_seq_len, slots in [0, num_full_slots), a LUT of length num_full_slots + 1 with a
trailing -1 and values in the SWA range or 0, windows 0..W, padding rows with arbitrary
lengths, duplicate pool rows and shared prefixes, an expected-token pool with offset 0 or 1,
capacity overflow, bs = 0, P = 0, E = 0 and occasionally negative P / E.

`corrupt_dumps()` adds what §1.6 lists as bad input: pool rows negative or >= max_reqs,
P > max_seq_len, a LUT shorter than the largest slot, negative slots, valid_lens beyond the
pool's columns, a pool with fewer rows than `req_to_token`, write_req_capacity < bs.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.dump.writer import TensorLike, save_dump

__all__ = ["CORRUPTIONS", "DumpCase", "corrupt_dumps", "dump_from", "valid_dumps"]

MAX_REQS = 8
MAX_SEQ_LEN = 24
MAX_BS = 8
MAX_FULL_SLOTS = 48

#: Every corruption `corrupt_dumps` can apply (a drawn case names the ones it applied).
CORRUPTIONS = (
    "negative-pool-row",
    "pool-row-too-large",
    "prefix-beyond-row",
    "short-lut",
    "negative-slots",
    "valid-lens-beyond-pool",
    "pool-fewer-rows",
    "write-capacity-below-bs",
)

_counter = itertools.count()


@dataclass(kw_only=True)
class DumpCase:
    """One drawn dump before saving: format-v1 tensors and metadata."""

    tensors: dict[str, np.ndarray]
    metadata: dict[str, str]
    #: what the case exercises (padding, overflow, corruptions, ...), for failure reports.
    tags: list[str] = field(default_factory=list)

    @property
    def has_lut(self) -> bool:
        """Whether the dump can be planned with --group swa."""
        return "full_to_swa_index_mapping" in self.tensors

    @property
    def groups(self) -> tuple[str, ...]:
        """Groups a planner can plan on this dump."""
        return ("full", "swa") if self.has_lut else ("full",)


def dump_from(
    tensors: Mapping[str, TensorLike], metadata: dict[str, str], directory: str | os.PathLike[str]
) -> KvDump:
    """Save `tensors` + `metadata` as a dump in `directory` (unique name) and load it back."""
    path = Path(directory) / f"case-{os.getpid()}-{next(_counter)}.safetensors"
    save_dump(path, metadata=metadata, **tensors)
    return load_dump(path)


def _verify_total(rows: list[tuple[int, int, int]], window: int) -> int:
    """Σ verify_len (§1.2) for (rp, P, E) rows under window `window`."""
    total = 0
    for rp, p, _ in rows:
        if rp == 0 or p <= 0:
            continue
        start = max(0, p - window) if window > 0 else 0
        total += p - start
    return total


@st.composite
def _lengths(draw: st.DrawFn, max_seq_len: int) -> tuple[int, int]:
    """(P, E) of an active row: P + E <= max_seq_len, zeros likely, negatives rare."""
    pick = draw(st.integers(0, 9))
    p = {0: 0, 1: -draw(st.integers(1, 3)), 2: max_seq_len}.get(pick) if pick < 3 else None
    if p is None:
        p = draw(st.integers(1, max_seq_len))
    room = max_seq_len - max(p, 0)
    pick = draw(st.integers(0, 9))
    e = {0: 0, 1: -draw(st.integers(1, 3)), 2: room}.get(pick) if pick < 3 else None
    if e is None:
        e = draw(st.integers(0, room))
    return p, e


@st.composite
def _case(draw: st.DrawFn, corrupt: bool) -> DumpCase:
    tags: list[str] = []
    max_reqs = draw(st.integers(1, MAX_REQS))
    max_seq_len = draw(st.integers(1, MAX_SEQ_LEN))
    num_full_slots = draw(st.integers(1, MAX_FULL_SLOTS))
    bs = draw(st.sampled_from(range(MAX_BS + 1)))  # uniform: bs = 0 in about 1 of 9
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    # Batch rows: active rows use pool rows 1..max_reqs-1 (duplicates allowed); padding rows
    # (pool row 0) carry arbitrary lengths, which upstream ignores.
    rows: list[tuple[int, int, int]] = []
    for _ in range(bs):
        if max_reqs > 1 and draw(st.integers(0, 3)) > 0:
            rp = draw(st.integers(1, max_reqs - 1))
            p, e = draw(_lengths(max_seq_len))
        else:
            rp = 0
            p, e = draw(st.integers(-3, 40)), draw(st.integers(-3, 40))
        rows.append((rp, p, e))

    table = rng.integers(0, num_full_slots, size=(max_reqs, max_seq_len), dtype=np.int64)
    table[0] = 0  # the padding row, as SGLang keeps it
    # Radix sharing: a request reuses another's slots at the same positions.
    if max_reqs > 2 and draw(st.booleans()):
        src, dst = draw(st.lists(st.integers(1, max_reqs - 1), min_size=2, max_size=2, unique=True))
        k = draw(st.integers(1, max_seq_len))
        table[dst, :k] = table[src, :k]
        tags.append("shared-prefix")

    has_lut = draw(st.booleans())
    window = 0
    lut: np.ndarray | None = None
    if has_lut:
        num_swa_slots = draw(st.integers(1, MAX_FULL_SLOTS))
        mapped = rng.integers(1, max(num_swa_slots, 2), size=num_full_slots + 1)
        if num_swa_slots == 1:
            mapped[:] = 0
        unmapped = rng.random(num_full_slots + 1) < draw(st.sampled_from([0.0, 0.3, 1.0]))
        lut = np.where(unmapped, 0, mapped).astype(np.int64)
        lut[-1] = -1
        window = draw(st.one_of(st.integers(0, max_seq_len + 2), st.just(-1)))
        tags.append(f"swa(W={window})")

    has_pool = draw(st.booleans())
    offset = draw(st.sampled_from([None, 0, 1]))
    pool: np.ndarray | None = None
    valid_lens: np.ndarray | None = None
    if has_pool:
        pool_rows = max_reqs + draw(st.integers(0, 2))
        pool_cols = max_seq_len + draw(st.integers(0, 2))
        pool = rng.integers(0, 32000, size=(pool_rows, pool_cols), dtype=np.int64)
        if draw(st.booleans()):  # sign extension of int32 tokens
            pool.reshape(-1)[0] = -2
            pool.reshape(-1)[-1] = 2**31 - 1
        valid_lens = np.array(
            [draw(st.one_of(st.just(p + e), st.integers(-1, pool_cols))) for _, p, e in rows],
            dtype=np.int64,
        )
        valid_lens = np.minimum(valid_lens, pool_cols)
        tags.append(f"pool(offset={offset or 0})")

    write_capacity: int | None = draw(st.one_of(st.none(), st.integers(bs, bs + 3)))

    if corrupt:
        # short-lut twice as likely: it drives the LUT sentinels and the strict message.
        chosen = draw(
            st.lists(
                st.sampled_from((*CORRUPTIONS, "short-lut")), min_size=1, max_size=3, unique=True
            )
        )
        for name in chosen:
            applied = True
            if name in ("negative-pool-row", "pool-row-too-large", "prefix-beyond-row"):
                if bs == 0:
                    applied = False
                else:
                    r = draw(st.integers(0, bs - 1))
                    rp, p, e = rows[r]
                    if name == "negative-pool-row":
                        rp = draw(st.integers(-max_reqs - 2, -1))
                    elif name == "pool-row-too-large":
                        rp = draw(st.integers(max_reqs, max_reqs + 3))
                    else:
                        rp = rp or draw(st.integers(1, max(max_reqs - 1, 1)))
                        p = draw(st.integers(max_seq_len + 1, max_seq_len + 6))
                    if p <= 0:
                        p = draw(st.integers(1, max_seq_len))
                    rows[r] = (rp, p, e)
            elif name == "short-lut":
                base = lut if lut is not None else np.arange(num_full_slots + 1, dtype=np.int64)
                if lut is None:
                    window = draw(st.integers(0, max_seq_len + 2))
                lut = base[: draw(st.integers(1, max(1, num_full_slots // 2)))].copy()
                lut[-1] = draw(st.sampled_from([-1, 0, 5]))
            elif name == "negative-slots":
                mask = rng.random(table.shape) < 0.2
                table = np.where(mask, rng.integers(-5, 0, size=table.shape), table)
            elif name == "valid-lens-beyond-pool":
                if pool is None or valid_lens is None or bs == 0:
                    applied = False
                else:
                    pool = pool[:, : draw(st.integers(1, pool.shape[1]))].copy()
                    r = draw(st.integers(0, bs - 1))
                    valid_lens[r] = pool.shape[1] + draw(st.integers(1, 4))
            elif name == "pool-fewer-rows":
                if pool is None or max_reqs < 2:
                    applied = False
                else:
                    pool = pool[: draw(st.integers(1, max_reqs - 1))].copy()
            elif name == "write-capacity-below-bs":
                if bs == 0:
                    applied = False
                else:
                    write_capacity = draw(st.integers(0, bs - 1))
            if applied:
                tags.append(name)

    if any(rp == 0 for rp, _, _ in rows):
        tags.append("padding")
    active_rps = [rp for rp, _, _ in rows if rp != 0]
    if len(active_rps) != len(set(active_rps)):
        tags.append("duplicate-pool-rows")
    metadata: dict[str, str] = {}
    tensors: dict[str, np.ndarray] = {}
    table_dtype = draw(st.sampled_from([np.int32, np.int32, np.int64]))
    batch_dtype = draw(st.sampled_from([np.int64, np.int64, np.int32]))
    tensors["req_to_token"] = table.astype(table_dtype)
    tensors["req_pool_indices"] = np.array([r[0] for r in rows], dtype=batch_dtype)
    tensors["prefix_lens"] = np.array([r[1] for r in rows], dtype=batch_dtype)
    if draw(st.booleans()) or any(r[2] != 0 for r in rows):
        tensors["extend_seq_lens"] = np.array([r[2] for r in rows], dtype=batch_dtype)
    if lut is not None:
        tensors["full_to_swa_index_mapping"] = lut
        metadata["swa_window_size"] = str(window)
        if "short-lut" not in tags:
            metadata["num_full_slots"] = str(num_full_slots)
    if pool is not None and valid_lens is not None:
        tensors["req_to_verify_expected_tokens"] = pool.astype(np.int32)
        tensors["req_to_verify_expected_tokens_valid_lens"] = valid_lens
    if offset is not None:
        metadata["kv_token_id_vs_position_offset"] = str(offset)
    if write_capacity is not None:
        metadata["write_req_capacity"] = str(write_capacity)

    # Verify capacity: absent (no overflow), exactly a group's total, one short of it
    # (overflow), or anything nearby.
    totals = {_verify_total(rows, 0), _verify_total(rows, window)}
    choices: list[int] = []
    for total in sorted(totals):
        choices += [total, total - 1] if total > 0 else [total]
    pick = draw(st.integers(0, 9))
    capacity: int | None = None  # half the cases: the default (no overflow)
    if 5 <= pick < 8:
        capacity = draw(st.sampled_from(choices))
    elif pick >= 8:
        capacity = draw(st.integers(0, max(totals) + 3))
    if capacity is not None:
        metadata["verify_capacity"] = str(capacity)
        if capacity < max(totals):
            tags.append("overflow")
    if bs == 0:
        tags.append("bs=0")
    return DumpCase(tensors=tensors, metadata=metadata, tags=tags)


def valid_dumps() -> st.SearchStrategy[DumpCase]:
    """Small dumps inside the region where REF and the GPU path agree (§1.2)."""
    return _case(corrupt=False)


def corrupt_dumps() -> st.SearchStrategy[DumpCase]:
    """Small dumps with one to three of `CORRUPTIONS` applied (§1.6)."""
    return _case(corrupt=True)
