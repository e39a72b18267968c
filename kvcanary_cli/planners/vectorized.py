"""The vectorized planner: the plan step (docs/semantics.md §1) with no per-token loop.

One implementation, two semantics (see `base`): REF reads `req_to_token[row, pos]` with Python
indexing and marks out-of-range reads undefined (where REF raises); GPU reads the flat index
`rp * max_seq_len + pos` like the CUDA kernel, clamps translated slots to `LUT[lut_len-1]`, and
marks only reads outside the tensor undefined. Entries are built in row chunks gathered
straight from the memory-mapped table, so only the rows of the batch are ever read.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.tensor import StoredTensor
from kvcanary_cli.planners.base import (
    ColumnFill,
    Plan,
    ProblemKind,
    ProblemRole,
    ProblemTable,
    Semantics,
    Undefined,
    VerifyEntries,
    assemble_plan,
    failed_plan,
    held_narrow,
    python_rows_resolve,
    row_problems,
    skipped_plan,
)
from kvcanary_cli.planners.frame import GroupFrame, group_frame

__all__ = ["VectorizedPlanner"]

_I64 = np.int64


class _Reader:
    """Masked gathers from the memory-mapped tables with REF or GPU addressing."""

    def __init__(self, dump: KvDump, gpu: bool) -> None:
        self.gpu = gpu
        self.table = dump.req_to_token
        self.rows, self.cols = dump.max_reqs, dump.max_seq_len
        pool = dump.req_to_verify_expected_tokens
        self.pool = pool
        self.pool_rows, self.pool_cols = (0, 0) if pool is None else (pool.shape[0], pool.shape[1])

    @staticmethod
    def _gather(source: StoredTensor, flat: np.ndarray, ok: np.ndarray) -> np.ndarray:
        if bool(ok.all()):  # the common case: one gather, no masks
            return source.take(flat)
        values = np.zeros(flat.shape, dtype=_I64)
        if bool(ok.any()):
            values[ok] = source.take(flat[ok])
        return values

    def _address(
        self, rp: np.ndarray, col: np.ndarray, rows: int, cols: int
    ) -> tuple[np.ndarray, np.ndarray]:
        if self.gpu:
            flat = rp * cols + col
            return flat, (flat >= 0) & (flat < rows * cols)
        row = np.where(rp < 0, rp + rows, rp)
        ok = (row >= 0) & (row < rows) & (col >= 0) & (col < cols)
        return row * cols + col, ok

    def slots(self, rp: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """req_to_token values at (rp, pos) and whether each read is defined."""
        flat, ok = self._address(rp, pos, self.rows, self.cols)
        return self._gather(self.table, flat, ok), ok

    def tokens(self, rp: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Expected-token pool values at (rp, s) and whether each read is defined."""
        assert self.pool is not None
        flat, ok = self._address(rp, s, self.pool_rows, self.pool_cols)
        return self._gather(self.pool, flat, ok), ok


class _Translator:
    """Slot translation through the SWA LUT (identity without one)."""

    def __init__(self, lut: StoredTensor | None, gpu: bool) -> None:
        self.lut = lut
        self.gpu = gpu

    def __call__(
        self, raw: np.ndarray, ok: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(translated value, still defined, was >= lut_len) for raw slots read with `ok`."""
        if self.lut is None:
            return raw, ok, np.zeros_like(ok)
        lut_len = int(self.lut.shape[0])
        big = ok & (raw >= lut_len)
        value = np.where(raw < 0, raw, self.lut.take(np.clip(raw, 0, lut_len - 1)))
        defined = ok if self.gpu else ok & ~big
        return np.where(defined, value, 0), defined, big


class VectorizedPlanner:
    """Vectorized planner; `semantics` picks REF or GPU behaviour on bad input."""

    mode = None

    def __init__(
        self, *, semantics: Semantics = Semantics.REFERENCE, chunk_entries: int = 1 << 17
    ) -> None:
        self.semantics = semantics
        self.name = "vectorized" if semantics is Semantics.REFERENCE else "vectorized-gpu"
        self.chunk_entries = chunk_entries

    def plan(self, dump: KvDump, group: str, *, keep_entries: bool = True) -> Plan:
        """Plan `group` of `dump`. `keep_entries=False`: every entry is planned (its problems
        are the same) but none is kept (`Plan.entries_dropped`), for a check that reads none."""
        gpu = self.semantics is Semantics.GPU
        frame = group_frame(dump, group)
        if gpu and frame.launch is not None:
            return failed_plan(frame, backend=self.name)
        if frame.unplannable:
            row_level = row_problems(dump, frame, gpu=gpu)
            return skipped_plan(
                frame, backend=self.name, semantics=self.semantics, problems=row_level
            )
        reader = _Reader(dump, gpu)
        translate = _Translator(frame.lut, gpu)
        problems = [row_problems(dump, frame, gpu=gpu)]
        if frame.enable:
            lens = frame.verify_len
        elif not gpu:  # REF still reads every entry (and may raise) on overflow
            lens = _scan_lens(dump, frame)
        else:
            lens = np.zeros_like(frame.verify_len)
        # Each chunk's entries are held narrow as they come (`held_narrow`), in place in
        # their columns (`ColumnFill`): a batch of ten million entries never holds them as
        # int64 columns, only a chunk's worth at a time, nor its narrow columns twice.
        keep = bool(frame.enable) and keep_entries
        total = int(lens.sum()) if keep else 0
        columns = [ColumnFill(total) for _ in range(5)]
        for r0, r1 in _row_chunks(lens, self.chunk_entries):
            part = self._entries(dump, frame, reader, translate, lens, r0, r1, problems)
            if not keep:
                continue  # planned for its problems only
            for column, values in zip(columns, part, strict=True):
                column.put(held_narrow(values))
            del part
        entries = VerifyEntries.empty()
        if total:
            slot, token, position, prev, undefined = (c.column() for c in columns)
            entries = VerifyEntries(
                slot=slot,
                expected_token=token,
                position=position,
                prev_slot=prev,
                undefined=undefined,
            )
        seeds, seed_undefined = _seeds(dump, frame, reader, translate, gpu, problems)
        return assemble_plan(
            frame,
            backend=self.name,
            semantics=self.semantics,
            entries=entries,
            seeds=seeds,
            seed_undefined=seed_undefined,
            problems=ProblemTable.concat(problems),
            entries_dropped=bool(frame.enable) and not keep_entries,
        )

    def _entries(
        self,
        dump: KvDump,
        frame: GroupFrame,
        reader: _Reader,
        translate: _Translator,
        lens: np.ndarray,
        r0: int,
        r1: int,
        problems: list[ProblemTable],
    ) -> tuple[np.ndarray, ...]:
        """Entries of rows [r0, r1), truncated per row to `lens`; LUT problems appended."""
        chunk_lens = lens[r0:r1]
        rows = np.repeat(np.arange(r0, r1, dtype=_I64), chunk_lens)
        starts = np.cumsum(chunk_lens) - chunk_lens
        j = np.arange(rows.shape[0], dtype=_I64) - np.repeat(starts, chunk_lens)
        pos = frame.window_start[rows] + j
        entry = frame.verify_offsets[rows] + j
        rp = frame.pool_rows[rows]
        slot_raw, slot_ok = reader.slots(rp, pos)
        slot, slot_def, slot_big = translate(slot_raw, slot_ok)
        has_prev = pos > 0
        # The predecessor of entry k is entry k - 1's cell, read the same way, except at the
        # first entry of a row: shift the reads, and gather only those first cells.
        prev_raw, prev, prev_def, prev_big = (
            _shifted(column) for column in (slot_raw, slot, slot_def, slot_big)
        )
        first = np.flatnonzero((j == 0) & has_prev)
        if first.size:
            raw, ok = reader.slots(rp[first], pos[first] - 1)
            value, defined, big = translate(raw, ok)
            prev_raw[first], prev[first], prev_def[first], prev_big[first] = (
                raw,
                value,
                defined,
                big,
            )
        prev_big &= has_prev
        prev = np.where(has_prev, prev, -1)
        prev_def = prev_def | ~has_prev
        undefined = (~slot_def).astype(np.uint8) * np.uint8(Undefined.SLOT)
        undefined |= (~prev_def).astype(np.uint8) * np.uint8(Undefined.PREV)
        tokens = np.full_like(pos, -1)
        valid = dump.req_to_verify_expected_tokens_valid_lens
        if reader.pool is not None and valid is not None:
            s = pos + dump.token_offset
            gathering = (s >= 0) & (s < valid[rows])
            values, ok = reader.tokens(rp, s)
            ok &= gathering
            tokens = np.where(gathering, np.where(ok, values, 0), -1)
            undefined |= (gathering & ~ok).astype(np.uint8) * np.uint8(Undefined.TOKEN)
        raises = not translate.gpu
        for big, role, cell in (
            (slot_big, ProblemRole.VERIFY, pos),
            (prev_big, ProblemRole.CHAIN_PREV, pos - 1),
        ):
            if bool(big.any()):
                problems.append(
                    ProblemTable.build(
                        ProblemKind.LUT_OUT_OF_RANGE,
                        role,
                        batch_row=rows[big],
                        pool_row=rp[big],
                        position=cell[big],
                        value=(slot_raw if role is ProblemRole.VERIFY else prev_raw)[big],
                        entry=entry[big],
                        raises=raises,
                    )
                )
        return slot, tokens, pos, prev, undefined


def _shifted(column: np.ndarray) -> np.ndarray:
    """`column` moved one entry later (entry k holds entry k - 1's value; entry 0 a zero)."""
    out = np.zeros_like(column)
    out[1:] = column[:-1]
    return out


def _scan_lens(dump: KvDump, frame: GroupFrame) -> np.ndarray:
    """Entries per row that can still meet a LUT problem: reads stop at the row's end."""
    msl = dump.max_seq_len
    prefix = dump.prefix_lens
    reach = np.minimum(prefix, msl + 1)
    lens = np.maximum(reach - frame.window_start, 0)
    resolves = python_rows_resolve(frame.pool_rows, dump.max_reqs)
    return np.where(resolves, np.minimum(lens, frame.verify_len), 0)


def _row_chunks(lens: np.ndarray, limit: int) -> Iterator[tuple[int, int]]:
    """Consecutive row ranges holding at most `limit` entries (or one longer row)."""
    bs = int(lens.shape[0])
    ends = np.cumsum(lens)
    r0 = 0
    while r0 < bs:
        base = int(ends[r0 - 1]) if r0 else 0
        r1 = int(np.searchsorted(ends, base + limit, side="right"))
        r1 = max(r1, r0 + 1)
        if int(ends[r1 - 1]) > base:
            yield r0, r1
        r0 = r1


def _seeds(
    dump: KvDump,
    frame: GroupFrame,
    reader: _Reader,
    translate: _Translator,
    gpu: bool,
    problems: list[ProblemTable],
) -> tuple[np.ndarray, np.ndarray]:
    """Chain seeds `T(L[rp, P-1])` for rows that write after a prefix, else -1."""
    rows = frame.write_rows
    rp, prefix = frame.pool_rows[:rows], dump.prefix_lens[:rows]
    needs = frame.seed_wanted
    if gpu:
        pos = prefix - 1
    else:  # REF clamps the seed position (unreachable for valid rows; see §1.6)
        pos = np.minimum(prefix - 1, max(dump.max_seq_len - 1, 0))
    raw, ok = reader.slots(rp, pos)
    value, defined, big = translate(raw, ok & needs)
    if bool(big.any()):
        idx = np.flatnonzero(big)
        problems.append(
            ProblemTable.build(
                ProblemKind.LUT_OUT_OF_RANGE,
                ProblemRole.SEED,
                batch_row=idx,
                pool_row=rp[idx],
                position=pos[idx],
                value=raw[idx],
                entry=-1,
                raises=not gpu,
            )
        )
    return np.where(needs, value, -1), needs & ~defined
