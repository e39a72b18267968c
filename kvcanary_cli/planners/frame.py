"""The per-group frame of a plan, computed once: window, LUT, geometry, capacities, limits.

Everything about planning one group that does not depend on the *contents* of `req_to_token`
lives here (docs/semantics.md §1.2, §1.4, §1.5): which rows are active, where each row's verify
window starts, how many entries it asks for, the exclusive prefix sums, whether the verify
capacity overflows, and whether the GPU path refuses to launch at all. Every backend plans
from a `GroupFrame` and assembles its `Plan` with `base.assemble_plan`; analysis reads the same
frame instead of re-deriving any of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.dump.tensor import StoredTensor
from kvcanary_cli.errors import OptionError

__all__ = [
    "GPU_MAX_BS",
    "MAX_MATERIALIZED_ENTRIES",
    "GroupFrame",
    "LaunchLimit",
    "group_frame",
    "launch_limit",
    "window_start",
]

#: `_PLAN_BS_BLOCK_SIZE`: the GPU plan path refuses larger batches.
GPU_MAX_BS = 4096
#: Verify entries kvcanary will hold in memory (40 bytes each): production capacities are
#: about 3x the KV pool, far below this; more means corrupt lengths.
MAX_MATERIALIZED_ENTRIES = 1 << 26
#: Below this many entries a plan is always cheap enough to hold, whatever the table's size.
_SMALL_PLAN = 1 << 16
_I64 = np.int64


@dataclass(frozen=True, kw_only=True)
class LaunchLimit:
    """Why the GPU plan path refuses a batch before launching (§1.5): which limit, how far."""

    #: `_PLAN_BS_BLOCK_SIZE` or `write_req_capacity`.
    name: str
    limit: int
    bs: int

    @property
    def message(self) -> str:
        """The ValueError text production raises."""
        if self.name == "_PLAN_BS_BLOCK_SIZE":
            return (
                f"kv-canary: launch_canary_plan_kernels supports at most bs={self.limit} reqs "
                f"per launch, got bs={self.bs}. Bump _PLAN_BS_BLOCK_SIZE if real workloads need "
                "this."
            )
        return f"kv-canary: bs={self.bs} exceeds write_req_capacity={self.limit}"


def launch_limit(bs: int, write_req_capacity: int) -> LaunchLimit | None:
    """The first launch limit `bs` breaks, in the order the GPU path checks them."""
    if bs > GPU_MAX_BS:
        return LaunchLimit(name="_PLAN_BS_BLOCK_SIZE", limit=GPU_MAX_BS, bs=bs)
    if bs > write_req_capacity:
        return LaunchLimit(name="write_req_capacity", limit=write_req_capacity, bs=bs)
    return None


def window_start(prefix_lens: np.ndarray, window: int) -> np.ndarray:
    """First verified position per row: `max(0, P - W)` with a window, else 0 (§1.2)."""
    if window > 0:
        return np.asarray(np.maximum(prefix_lens - window, 0))
    return np.zeros_like(prefix_lens)


@dataclass(frozen=True, kw_only=True)
class GroupFrame:
    """One group's plan geometry (per-row tensors are int64 `[bs]`)."""

    group: Group
    #: W: 0 for the full group, `swa_window_size` (>= 0) for swa.
    window: int
    #: the SWA LUT for the swa group (sparse in a shrunk dump), None for full.
    lut: StoredTensor | None
    bs: int
    #: pool row per batch row (0 = padding).
    pool_rows: np.ndarray
    #: `max(0, P - W)` (W > 0), else 0.
    window_start: np.ndarray
    #: entries each row asks for: `P - window_start` for active rows with P > 0, else 0.
    verify_len: np.ndarray
    #: exclusive prefix sum of verify_len, `[bs + 1]`.
    verify_offsets: np.ndarray
    total_verify: int
    #: entries REF reads on overflow: each row's range up to its first read past the row
    #: (where REF raises), for active rows.
    reach_total: int
    #: the recorded capacity, or `total_verify` when the dump records none.
    verify_capacity: int
    capacity_recorded: bool
    #: length of `write_seed_slot_indices` (default bs).
    write_req_capacity: int
    #: tokens each row writes: E for active rows with E > 0, else 0.
    write_len: np.ndarray
    #: exclusive prefix sum of write_len over the first `min(bs, R)` rows, `[min(bs, R) + 1]`.
    write_offsets: np.ndarray
    #: rows whose write seed is read (`T(L[rp, P-1])`): active, E > 0, P > 0; `[min(bs, R)]`.
    seed_wanted: np.ndarray
    #: set when the GPU path refuses the batch (the reference has no such limit).
    launch: LaunchLimit | None
    #: `req_to_token`'s `[max_reqs, max_seq_len]`, for the messages of reads outside it.
    table_shape: tuple[int, int]
    #: the expected-token pool's `[rows, cols]` (None without a pool).
    pool_shape: tuple[int, int] | None

    @property
    def lut_len(self) -> int:
        """Length of the LUT (0 without one)."""
        return 0 if self.lut is None else int(self.lut.shape[0])

    @property
    def overflow(self) -> bool:
        """More entries requested than the capacity: the verify launch is skipped (§1.4)."""
        return self.total_verify > self.verify_capacity

    @property
    def enable(self) -> int:
        """1 when verify runs this step, 0 on overflow."""
        return 0 if self.overflow else 1

    @property
    def verify_num_valid(self) -> int:
        """The plan's `verify_num_valid`: the capacity on overflow, else the total."""
        return self.verify_capacity if self.overflow else self.total_verify

    @property
    def write_rows(self) -> int:
        """Rows of the write plan upstream fills: `min(bs, write_req_capacity)`."""
        return min(self.bs, self.write_req_capacity)

    @property
    def entry_limit(self) -> int:
        """The most verify entries kvcanary plans for this group.

        A sane batch reads each active row's own cells once (rows are distinct, P <= the row
        width), so it asks for at most the table's cell count; more means corrupt lengths,
        and claimed lengths must not decide how much kvcanary allocates.
        """
        rows, cols = self.table_shape
        return min(MAX_MATERIALIZED_ENTRIES, max(_SMALL_PLAN, rows * cols))

    @property
    def unplannable(self) -> str | None:
        """Why this group's entries cannot be planned (None: they can): the batch asks for
        more than `entry_limit` entries (on overflow: more than REF would read before its
        first raise). Every backend then returns `skipped_plan`."""
        asked = self.total_verify if self.enable else self.reach_total
        if asked <= self.entry_limit:
            return None
        rows, cols = self.table_shape
        return (
            f"the batch asks for {asked} verify entries in group {self.group}, "
            f"more than a req_to_token of {rows} x {cols} can supply (kvcanary plans at most "
            f"{self.entry_limit}): the lengths are corrupt, so no entry of this group was "
            "planned or checked"
        )


def _exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    out = np.zeros(values.shape[0] + 1, dtype=_I64)
    np.cumsum(values, out=out[1:])
    return out


def group_frame(dump: KvDump, group: str) -> GroupFrame:
    """The frame of `group`; an `OptionError` if the dump cannot plan it."""
    if group == Group.FULL:
        window, lut = 0, None
    elif group == Group.SWA:
        lut = dump.full_to_swa_index_mapping
        if lut is None:
            raise OptionError(
                "group swa needs full_to_swa_index_mapping, which this dump lacks",
                option="group",
                hint="use --group full",
            )
        window = dump.window("swa")
    else:
        raise OptionError(f"unknown group {group!r} (expected full or swa)", option="group")
    rpi, prefix, extend = dump.req_pool_indices, dump.prefix_lens, dump.extend_seq_lens
    pool = dump.req_to_verify_expected_tokens
    active = rpi != 0
    start = window_start(prefix, window)
    verify_len = np.where(active, np.maximum(prefix - start, 0), 0)
    # Exact (Python ints): claimed lengths near 2^63 would overflow an int64 sum.
    total = sum(verify_len.tolist())
    msl = dump.max_seq_len
    reach = np.maximum(np.minimum(prefix, msl + 1) - start, 0)
    reach_total = sum(np.where(active, np.minimum(reach, verify_len), 0).tolist())
    recorded = dump.scalar("verify_capacity")
    write_capacity = dump.write_req_capacity
    rows = min(dump.bs, write_capacity)
    write_len = np.where(active & (extend > 0), extend, 0)
    return GroupFrame(
        group=Group(group),
        window=window,
        lut=lut,
        bs=dump.bs,
        pool_rows=rpi,
        window_start=start,
        verify_len=verify_len,
        # Only used when planned (total <= entry_limit); the cap keeps the sum from
        # overflowing when it is not.
        verify_offsets=_exclusive_cumsum(np.minimum(verify_len, MAX_MATERIALIZED_ENTRIES + 1)),
        total_verify=total,
        reach_total=reach_total,
        verify_capacity=total if recorded is None else recorded,
        capacity_recorded=recorded is not None,
        write_req_capacity=write_capacity,
        write_len=write_len,
        write_offsets=_exclusive_cumsum(write_len[:rows]),
        seed_wanted=(active & (extend > 0) & (prefix > 0))[:rows],
        launch=launch_limit(dump.bs, write_capacity),
        table_shape=(dump.max_reqs, dump.max_seq_len),
        pool_shape=None if pool is None else (int(pool.shape[0]), int(pool.shape[1])),
    )
