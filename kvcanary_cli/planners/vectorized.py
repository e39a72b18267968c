"""The vectorized torch planner: the plan step with no Python loop per token or request.

One implementation, two semantics (see `base`): REF reads `req_to_token[row, pos]` with Python
indexing and marks out-of-range reads undefined (where REF raises); GPU reads the flat index
`rp * max_seq_len + pos` like the CUDA kernel, clamps translated slots to `LUT[lut_len-1]`, and
marks only reads outside the tensor undefined. Entries are built in row chunks gathered
straight from the memory-mapped table, so only the rows of the batch are ever read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from kvcanary_cli.dump import KvDump
from kvcanary_cli.planners.base import (
    Plan,
    ProblemKind,
    ProblemRole,
    ProblemTable,
    Semantics,
    Undefined,
    failed_plan,
    gpu_launch_error,
    resolve_group,
)
from kvcanary_cli.planners.rows import (
    check_materializable,
    python_rows_resolve,
    row_problems,
    verify_geometry,
)

__all__ = ["TorchPlanner"]

_I64 = torch.int64


@dataclass(frozen=True, kw_only=True)
class _Batch:
    """Per-row geometry shared by every chunk (all int64 [bs] tensors)."""

    rpi: torch.Tensor
    prefix: torch.Tensor
    window_start: torch.Tensor
    verify_len: torch.Tensor
    offsets: torch.Tensor  # [bs + 1]


class _Reader:
    """Masked gathers from the memory-mapped tables with REF or GPU addressing."""

    def __init__(self, dump: KvDump, gpu: bool) -> None:
        self.gpu = gpu
        self.table = dump.req_to_token.reshape(-1)
        self.rows, self.cols = dump.max_reqs, dump.max_seq_len
        pool = dump.req_to_verify_expected_tokens
        self.pool = None if pool is None else pool.reshape(-1)
        self.pool_rows, self.pool_cols = (0, 0) if pool is None else pool.shape

    @staticmethod
    def _gather(flat_source: torch.Tensor, flat: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
        values = torch.zeros(flat.shape, dtype=_I64)
        if bool(ok.any()):
            values[ok] = flat_source[flat[ok]].to(_I64)
        return values

    def _address(self, rp: torch.Tensor, col: torch.Tensor, rows: int,
                 cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.gpu:
            flat = rp * cols + col
            return flat, (flat >= 0) & (flat < rows * cols)
        row = torch.where(rp < 0, rp + rows, rp)
        ok = (row >= 0) & (row < rows) & (col >= 0) & (col < cols)
        return row * cols + col, ok

    def slots(self, rp: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """req_to_token values at (rp, pos) and whether each read is defined."""
        flat, ok = self._address(rp, pos, self.rows, self.cols)
        return self._gather(self.table, flat, ok), ok

    def tokens(self, rp: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Expected-token pool values at (rp, s) and whether each read is defined."""
        assert self.pool is not None
        flat, ok = self._address(rp, s, self.pool_rows, self.pool_cols)
        return self._gather(self.pool, flat, ok), ok


class _Translator:
    """Slot translation through the SWA LUT (identity without one)."""

    def __init__(self, lut: torch.Tensor | None, gpu: bool) -> None:
        self.lut = lut
        self.gpu = gpu

    def __call__(
        self, raw: torch.Tensor, ok: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(translated value, still defined, was >= lut_len) for raw slots read with `ok`."""
        if self.lut is None:
            return raw, ok, torch.zeros_like(ok)
        lut_len = int(self.lut.shape[0])
        big = ok & (raw >= lut_len)
        value = torch.where(raw < 0, raw, self.lut[raw.clamp(0, lut_len - 1)])
        defined = ok if self.gpu else ok & ~big
        return torch.where(defined, value, 0), defined, big


class TorchPlanner:
    """Vectorized planner; `semantics` picks REF or GPU behaviour on bad input."""

    def __init__(
        self, *, semantics: Semantics = Semantics.REFERENCE, chunk_entries: int = 1 << 22
    ) -> None:
        self.semantics = semantics
        self.name = "torch" if semantics is Semantics.REFERENCE else "torch-gpu"
        self.chunk_entries = chunk_entries

    def plan(self, dump: KvDump, group: str) -> Plan:
        """Plan `group` of `dump`."""
        gpu = self.semantics is Semantics.GPU
        window, lut = resolve_group(dump, group)
        batch = _geometry(dump, window)
        bs = dump.bs
        total = int(batch.offsets[-1])
        capacity = dump.scalar("verify_capacity")
        capacity = total if capacity is None else capacity
        write_capacity = dump.write_req_capacity
        if gpu and (error := gpu_launch_error(bs, write_capacity)):
            return failed_plan(backend=self.name, group=group, window=window,
                               translated=lut is not None, bs=bs, verify_capacity=capacity,
                               write_req_capacity=write_capacity, launch_error=error)
        enable = 0 if total > capacity else 1
        if enable:
            check_materializable(total)
        reader = _Reader(dump, gpu)
        translate = _Translator(lut, gpu)
        problems = [row_problems(dump, window, batch.offsets, gpu=gpu)]
        if enable:
            lens = batch.verify_len
        elif not gpu:  # REF still reads every entry (and may raise) on overflow
            lens = _scan_lens(dump, batch)
        else:
            lens = torch.zeros_like(batch.verify_len)
        parts = [
            self._entries(dump, batch, reader, translate, lens, r0, r1, problems)
            for r0, r1 in _row_chunks(lens, self.chunk_entries)
        ]
        if enable and parts:
            columns = [torch.cat(col) for col in zip(*parts, strict=True)]
        else:
            empty = torch.zeros(0, dtype=_I64)
            columns = [empty, empty, empty, empty, torch.zeros(0, dtype=torch.uint8)]
        seeds, seed_undefined = _seeds(dump, batch, reader, translate, gpu, problems)
        rows = min(bs, write_capacity)
        active = batch.rpi != 0
        write_len = torch.where(active & (dump.extend_seq_lens > 0), dump.extend_seq_lens, 0)
        write_offsets = torch.cat([torch.zeros(1, dtype=_I64), write_len[:rows].cumsum(0)])
        return Plan(
            backend=self.name, semantics=self.semantics, group=group, window=window,
            translated=lut is not None, bs=bs, verify_capacity=capacity,
            write_req_capacity=write_capacity, total_verify=total,
            verify_num_valid=total if enable else capacity, enable=enable,
            verify_offsets=batch.offsets, verify_slot_indices=columns[0],
            verify_expected_tokens=columns[1], verify_expected_positions=columns[2],
            verify_prev_slot_indices=columns[3], verify_undefined=columns[4],
            write_offsets=write_offsets, write_seed_slot_indices=seeds,
            seed_undefined=seed_undefined, write_num_valid_reqs=bs,
            problems=ProblemTable.concat(problems),
        )

    def _entries(
        self, dump: KvDump, batch: _Batch, reader: _Reader, translate: _Translator,
        lens: torch.Tensor, r0: int, r1: int, problems: list[ProblemTable],
    ) -> tuple[torch.Tensor, ...]:
        """Entries of rows [r0, r1), truncated per row to `lens`; LUT problems appended."""
        chunk_lens = lens[r0:r1]
        rows = torch.repeat_interleave(torch.arange(r0, r1, dtype=_I64), chunk_lens)
        starts = torch.cumsum(chunk_lens, 0) - chunk_lens
        j = torch.arange(rows.shape[0], dtype=_I64) - torch.repeat_interleave(starts, chunk_lens)
        pos = batch.window_start[rows] + j
        entry = batch.offsets[rows] + j
        rp = batch.rpi[rows]
        slot_raw, slot_ok = reader.slots(rp, pos)
        slot, slot_def, slot_big = translate(slot_raw, slot_ok)
        has_prev = pos > 0
        prev_raw, prev_ok = reader.slots(rp, pos - 1)
        prev, prev_def, prev_big = translate(prev_raw, prev_ok & has_prev)
        prev = torch.where(has_prev, prev, -1)
        prev_def = prev_def | ~has_prev
        undefined = (~slot_def).to(torch.uint8) * int(Undefined.SLOT)
        undefined |= (~prev_def).to(torch.uint8) * int(Undefined.PREV)
        tokens = torch.full_like(pos, -1)
        valid = dump.req_to_verify_expected_tokens_valid_lens
        if reader.pool is not None and valid is not None:
            s = pos + dump.token_offset
            gathering = (s >= 0) & (s < valid[rows])
            values, ok = reader.tokens(rp, s)
            ok &= gathering
            tokens = torch.where(gathering, torch.where(ok, values, 0), -1)
            undefined |= (gathering & ~ok).to(torch.uint8) * int(Undefined.TOKEN)
        raises = not translate.gpu
        for big, role, cell in ((slot_big, ProblemRole.VERIFY, pos),
                                (prev_big, ProblemRole.CHAIN_PREV, pos - 1)):
            if bool(big.any()):
                problems.append(ProblemTable.build(
                    ProblemKind.LUT_OUT_OF_RANGE, role, batch_row=rows[big].numpy(),
                    pool_row=rp[big].numpy(), position=cell[big].numpy(),
                    value=(slot_raw if role is ProblemRole.VERIFY else prev_raw)[big].numpy(),
                    entry=entry[big].numpy(), raises=raises))
        return slot, tokens, pos, prev, undefined


def _geometry(dump: KvDump, window: int) -> _Batch:
    window_start, verify_len = verify_geometry(dump, window)
    offsets = torch.cat([torch.zeros(1, dtype=_I64), verify_len.cumsum(0)])
    return _Batch(rpi=dump.req_pool_indices, prefix=dump.prefix_lens, window_start=window_start,
                  verify_len=verify_len, offsets=offsets)


def _scan_lens(dump: KvDump, batch: _Batch) -> torch.Tensor:
    """Entries per row that can still meet a LUT problem: reads stop at the row's end."""
    msl = dump.max_seq_len
    reach = torch.minimum(batch.prefix, torch.full_like(batch.prefix, msl + 1))
    lens = (reach - batch.window_start).clamp(min=0)
    resolves = python_rows_resolve(batch.rpi, dump.max_reqs)
    return torch.where(resolves, torch.minimum(lens, batch.verify_len), 0)


def _row_chunks(lens: torch.Tensor, limit: int) -> Iterator[tuple[int, int]]:
    """Consecutive row ranges holding at most `limit` entries (or one longer row)."""
    bs = int(lens.shape[0])
    ends = lens.cumsum(0).numpy()
    r0 = 0
    while r0 < bs:
        base = int(ends[r0 - 1]) if r0 else 0
        r1 = int(np.searchsorted(ends, base + limit, side="right"))
        r1 = max(r1, r0 + 1)
        if int(ends[r1 - 1]) > base:
            yield r0, r1
        r0 = r1


def _seeds(
    dump: KvDump, batch: _Batch, reader: _Reader, translate: _Translator, gpu: bool,
    problems: list[ProblemTable],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chain seeds `T(L[rp, P-1])` for rows that write after a prefix, else -1."""
    rows = min(dump.bs, dump.write_req_capacity)
    rp, prefix = batch.rpi[:rows], batch.prefix[:rows]
    needs = (rp != 0) & (dump.extend_seq_lens[:rows] > 0) & (prefix > 0)
    if gpu:
        pos = prefix - 1
    else:  # REF clamps the seed position (unreachable for valid rows; see §1.8)
        pos = torch.minimum(prefix - 1, torch.full_like(prefix, max(dump.max_seq_len - 1, 0)))
    raw, ok = reader.slots(rp, pos)
    value, defined, big = translate(raw, ok & needs)
    if bool(big.any()):
        idx = torch.nonzero(big).reshape(-1)
        problems.append(ProblemTable.build(
            ProblemKind.LUT_OUT_OF_RANGE, ProblemRole.SEED, batch_row=idx.numpy(),
            pool_row=rp[idx].numpy(), position=pos[idx].numpy(), value=raw[idx].numpy(),
            entry=-1, raises=not gpu))
    return torch.where(needs, value, -1), needs & ~defined
