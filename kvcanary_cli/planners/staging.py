"""Dense kernel inputs for a shrunk dump: the rows and LUT entries a GPU plan reads.

The Triton kernels address `req_to_token` (and the expected-token pool) flat, as
`row * width + position`, and the LUT by slot, so they need dense memory. A shrunk dump keeps
only some cells. This stages the rows the batch reads, renumbered in increasing order at the
original width: a read that crosses into the next row, or falls outside the table, lands where
it does in the original, because the rows a plan crosses into are read and so staged next to
it. For the swa group it stages the LUT entries the dump kept, and renumbers the slot values of
the staged rows to match (slots past the LUT stay past it, so the GPU clamp still happens).
Cells and entries the dump did not keep read 0, as everywhere else.

Memory follows the rows the batch reads (bounded by `MAX_STAGED_CELLS`), never the original
shape; a dump whose planned tensors are whole (format 1) is not staged at all (the kernels
read the mapped tables themselves).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.tensor import StoredTensor, distinct, union
from kvcanary_cli.errors import PlanTooLargeError
from kvcanary_cli.planners.frame import GroupFrame

__all__ = ["MAX_STAGED_CELLS", "StagedInputs", "StagingTooLargeError", "stage"]


class StagingTooLargeError(PlanTooLargeError):
    """The rows a shrunk dump's batch reads are more cells than kvcanary stages dense: a
    batch of every row of a production-wide pool (2048 rows of 131,076 cells) is one.
    Triton's planner then plans with the vectorized model of the same kernels."""


#: Cells the staged rows may hold (1 GiB of int32): far above a production batch's rows.
MAX_STAGED_CELLS = 1 << 28
_I64 = np.int64


@dataclass(frozen=True, kw_only=True)
class StagedInputs:
    """Kernel inputs in staged coordinates (host arrays)."""

    #: pool row per batch row, renumbered to the staged rows.
    rpi: np.ndarray
    table: np.ndarray
    #: elements of `table` (the kernels' bound for flat reads).
    table_numel: int
    #: the staged LUT (None without a LUT in the group) and its length.
    lut: np.ndarray | None
    lut_len: int
    #: the staged expected-token pool (None without one) and its elements.
    pool: np.ndarray | None
    pool_numel: int


def _rows_read(lo: np.ndarray, hi: np.ndarray, width: int, rows: int) -> np.ndarray:
    """Rows of a `[rows, width]` table that flat ranges `[lo, hi)` touch inside it."""
    lo, hi = np.maximum(lo, 0), np.minimum(hi, rows * width)
    live = lo < hi
    first, last = lo[live] // max(width, 1), (hi[live] - 1) // max(width, 1)
    counts = last - first + 1
    if counts.size == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.repeat(first - (np.cumsum(counts) - counts), counts)
    return distinct(starts + np.arange(int(counts.sum()), dtype=np.int64))


def _table_rows(dump: KvDump, frame: GroupFrame) -> np.ndarray:
    """Rows of `req_to_token` the GPU plan reads: verify and prev cells, and seeds."""
    rp = frame.pool_rows
    prefix = dump.prefix_lens
    width = dump.max_seq_len
    active = (rp != 0) & (frame.verify_len > 0) & bool(frame.enable)
    start = np.maximum(frame.window_start - 1, 0)
    verify = _rows_read(
        (rp * width + start)[active], (rp * width + prefix)[active], width, dump.max_reqs
    )
    wanted = frame.seed_wanted
    seed = rp[: wanted.size] * width + prefix[: wanted.size] - 1
    seeds = _rows_read(seed[wanted], seed[wanted] + 1, width, dump.max_reqs)
    return union(verify, seeds)


def _pool_rows(dump: KvDump, frame: GroupFrame) -> np.ndarray:
    """Rows of the expected-token pool the GPU plan gathers tokens from."""
    pool, valid = dump.req_to_verify_expected_tokens, dump.req_to_verify_expected_tokens_valid_lens
    if pool is None or valid is None or not frame.enable:
        return np.zeros(0, dtype=np.int64)
    rows, width = int(pool.shape[0]), int(pool.shape[1])
    rp = frame.pool_rows
    off = dump.token_offset
    s_lo = np.maximum(frame.window_start + off, 0)
    s_hi = np.minimum(dump.prefix_lens + off, valid)
    active = (rp != 0) & (frame.verify_len > 0)
    return _rows_read(
        (rp * width + s_lo)[active], (rp * width + np.maximum(s_hi, s_lo))[active], width, rows
    )


def _stage_lut(lut: StoredTensor) -> tuple[np.ndarray, np.ndarray | None]:
    """The LUT the kernels read, and (for a LUT not kept whole) the kept slots in order:
    staged entry `1 + i` is slot `keys[i]`'s, entry 0 reads 0 for every slot not kept."""
    if lut.complete:
        return np.ascontiguousarray(lut.array(), dtype=_I64), None
    keys = lut.known_indices()
    values = lut.take(keys)
    tail = [] if keys.size and int(keys[-1]) == int(lut.shape[0]) - 1 else [0]
    staged = np.concatenate([np.zeros(1, dtype=np.int64), values, np.array(tail, np.int64)])
    return staged, keys


#: cells of the staged table renumbered per step: the int64 temporaries stay a few MB,
#: whatever the number of rows staged (a whole row of 131 K cells at a time or more).
_RENUMBER_CHUNK = 1 << 20


def _renumber_slots(table: np.ndarray, keys: np.ndarray, lut_len: int, staged_len: int) -> None:
    """Slot values of staged rows to staged LUT entries, in place: negative ones stay, ones
    past the LUT go past the staged LUT, kept ones to their entry, the others to entry 0.
    In bounded steps over the flat table (its temporaries are int64: 8 bytes a cell)."""
    flat = table.reshape(-1)
    last = max(keys.size - 1, 0)
    for lo in range(0, flat.size, _RENUMBER_CHUNK):
        values = flat[lo : lo + _RENUMBER_CHUNK].astype(np.int64)
        at = np.searchsorted(keys, values)
        kept = (at < keys.size) & (keys[np.minimum(at, last)] == values)
        out = np.where(values < 0, values, np.where(values >= lut_len, staged_len, 0))
        out = np.where(kept & (values >= 0) & (values < lut_len), at + 1, out)
        flat[lo : lo + _RENUMBER_CHUNK] = out.astype(table.dtype)


def stage(dump: KvDump, frame: GroupFrame) -> StagedInputs:
    """The kernel inputs of `frame`'s plan of a shrunk dump (see the module doc)."""
    if frame.unplannable is not None:  # the rows read follow the entries: bounded first
        raise PlanTooLargeError(frame.unplannable, field="prefix_lens", path=str(dump.path))
    table_rows = _table_rows(dump, frame)
    pool_rows = _pool_rows(dump, frame)
    # Row 0 stays row 0: the kernels take pool row 0 for a padding row of the batch.
    staged = union(table_rows, pool_rows, np.zeros(1, dtype=np.int64))
    pool = dump.req_to_verify_expected_tokens
    in_table = staged[staged < dump.max_reqs]
    in_pool = staged[staged < (0 if pool is None else int(pool.shape[0]))]
    cells = in_table.size * dump.max_seq_len + (0 if pool is None else in_pool.size * pool.shape[1])
    if cells > MAX_STAGED_CELLS:
        raise StagingTooLargeError(
            f"the Triton kernels need the rows this batch reads dense: {cells} cells, more "
            f"than kvcanary stages ({MAX_STAGED_CELLS})",
            field="req_to_token",
            path=str(dump.path),
            hint="use --kernel vectorized on this shrunk dump",
        )
    rp = frame.pool_rows
    rank = np.searchsorted(staged, rp)
    found = (rank < staged.size) & (staged[np.minimum(rank, max(staged.size - 1, 0))] == rp)
    # Rows not staged are not read: send them past every staged table, keep negatives.
    renumbered = np.where(found, rank, np.where(rp < 0, rp, staged.size + rp))
    table = dump.req_to_token.rows(in_table)[0]  # cells a shrunk dump did not keep read 0
    lut, lut_len = None, 0
    if frame.lut is not None:
        lut, keys = _stage_lut(frame.lut)
        lut_len = int(lut.shape[0])
        if keys is not None:
            _renumber_slots(table, keys, int(frame.lut.shape[0]), lut_len)
    staged_pool = None if pool is None else pool.rows(in_pool)[0]
    return StagedInputs(
        rpi=renumbered.astype(np.int64),
        table=table,
        table_numel=int(table.size),
        lut=lut,
        lut_len=lut_len,
        pool=staged_pool,
        pool_numel=0 if staged_pool is None else int(staged_pool.size),
    )


def seed_values(dump: KvDump, batch_rows: np.ndarray) -> np.ndarray:
    """The raw slots the GPU seeds of `batch_rows` read (`L[rp, P-1]`, flat), from the dump:
    the staged copy holds renumbered slots."""
    rp = dump.req_pool_indices[batch_rows]
    flat = rp * dump.max_seq_len + dump.prefix_lens[batch_rows] - 1
    return dump.req_to_token.take(flat)
