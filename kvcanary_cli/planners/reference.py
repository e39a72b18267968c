"""The scalar reference planner: a literal, one-entry-at-a-time reading of docs/semantics.md §1.2.

It is slow on purpose and obviously correct; the vectorized and Triton planners are tested
against it. Like SGLang's torch reference (REF) it reads `req_to_token` with Python indexing
(negative pool rows wrap around) and raises on the first bad read in *strict* mode; in
*collect* mode it records every problem and keeps going.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.errors import PlanTooLargeError
from kvcanary_cli.planners.base import (
    Plan,
    PlanProblem,
    ProblemKind,
    ProblemRole,
    ProblemTable,
    Semantics,
    Undefined,
    VerifyEntries,
    assemble_plan,
    reference_raise,
    row_problems,
    skipped_plan,
    upstream_error,
)
from kvcanary_cli.planners.frame import GroupFrame, group_frame

__all__ = ["SCALAR_ENTRY_LIMIT", "ReferencePlanner"]

#: Beyond this many entries the scalar loop would run for hours; use the vectorized backend.
SCALAR_ENTRY_LIMIT = 20_000_000


class _Collector:
    """Records problems; in strict mode raises upstream's error at the first raising one."""

    def __init__(self, strict: bool, frame: GroupFrame) -> None:
        self.strict = strict
        self.frame = frame
        self.items: list[PlanProblem] = []

    def add(self, problem: PlanProblem) -> None:
        if self.strict and problem.raises:
            raise upstream_error(problem, self.frame)
        self.items.append(problem)

    def table(self) -> ProblemTable:
        return ProblemTable.from_rows(self.items)


def _python_row(index: int, rows: int) -> int | None:
    """The row Python indexing reaches for `index`, or None where it raises IndexError."""
    if 0 <= index < rows:
        return index
    if -rows <= index < 0:
        return index + rows
    return None


class ReferencePlanner:
    """REF semantics, scalar. `strict=True` raises `UpstreamPlanError` where REF raises."""

    name = "reference"
    semantics = Semantics.REFERENCE
    mode = None

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict

    def plan(self, dump: KvDump, group: str) -> Plan:
        """Plan `group` of `dump` one entry at a time."""
        frame = group_frame(dump, group)
        if frame.unplannable:
            row_level = row_problems(dump, frame, gpu=False)
            plan = skipped_plan(
                frame, backend=self.name, semantics=self.semantics, problems=row_level
            )
            first = reference_raise(plan) if self.strict else None
            if first is not None:
                raise first.error
            return plan
        lut = None if frame.lut is None else frame.lut.sequence()
        lut_len = 0 if lut is None else len(lut)
        rpi = dump.req_pool_indices.tolist()
        prefix = dump.prefix_lens.tolist()
        max_reqs, max_seq_len = dump.max_reqs, dump.max_seq_len
        pool = dump.req_to_verify_expected_tokens
        valid = dump.req_to_verify_expected_tokens_valid_lens
        valid_lens = None if valid is None else valid.tolist()
        pool_rows, pool_cols = (0, 0) if pool is None else (pool.shape[0], pool.shape[1])
        offset = dump.token_offset
        bs = len(rpi)
        problems = _Collector(self.strict, frame)
        row_cache: dict[int, Sequence[int]] = {}
        pool_cache: dict[int, Sequence[int]] = {}

        def table_row(row: int) -> Sequence[int]:
            if row not in row_cache:
                row_cache[row] = dump.req_to_token.row_sequence(row)
            return row_cache[row]

        def pool_row_values(row: int) -> Sequence[int]:
            assert pool is not None
            if row not in pool_cache:
                pool_cache[row] = pool.row_sequence(row)
            return pool_cache[row]

        def flag(
            kind: ProblemKind,
            role: ProblemRole,
            r: int,
            pos: int,
            value: int,
            k: int,
            *,
            raises: bool = True,
        ) -> None:
            """Record a bad read of batch row `r` at `pos` (entry `k`)."""
            problems.add(
                PlanProblem(
                    kind=kind,
                    role=role,
                    batch_row=r,
                    pool_row=rpi[r],
                    position=pos,
                    value=value,
                    entry=k,
                    raises=raises,
                )
            )

        def translate(raw: int, role: ProblemRole, r: int, pos: int, k: int) -> int | None:
            if lut is None or raw < 0:
                return raw
            if raw >= lut_len:
                flag(ProblemKind.LUT_OUT_OF_RANGE, role, r, pos, raw, k)
                return None
            return int(lut[raw])

        # REF sums the verify lengths first, to decide overflow.
        starts = frame.window_start.tolist()
        lens = frame.verify_len.tolist()
        total = frame.total_verify
        overflow = frame.overflow
        if total > SCALAR_ENTRY_LIMIT:
            raise PlanTooLargeError(
                f"the batch asks for {total} verify entries; the scalar reference stops at "
                f"{SCALAR_ENTRY_LIMIT}",
                field="prefix_lens",
                path=str(dump.path),
                hint="use --backend vectorized",
            )
        slots: list[int] = []
        prevs: list[int] = []
        tokens: list[int] = []
        positions: list[int] = []
        undefined: list[int] = []
        k = 0
        for r in range(bs):
            rp, ws, n = rpi[r], starts[r], lens[r]
            row = _python_row(rp, max_reqs)
            pool_row = _python_row(rp, pool_rows) if pool is not None else None
            if n > 0 and (row is None or rp < 0):
                flag(
                    ProblemKind.ROW_OUT_OF_RANGE,
                    ProblemRole.VERIFY,
                    r,
                    ws,
                    rp,
                    k,
                    raises=row is None,
                )
            beyond_reported = token_reported = False
            for j in range(n):
                pos = ws + j
                bits = 0
                slot: int | None = None
                if row is None:
                    bits |= Undefined.SLOT
                elif pos >= max_seq_len:
                    if not beyond_reported:
                        beyond_reported = True
                        flag(ProblemKind.PREFIX_BEYOND_ROW, ProblemRole.VERIFY, r, pos, pos, k)
                    bits |= Undefined.SLOT
                else:
                    slot = translate(table_row(row)[pos], ProblemRole.VERIFY, r, pos, k)
                    if slot is None:
                        bits |= Undefined.SLOT
                prev: int | None = -1
                if pos > 0:
                    if row is None or pos - 1 >= max_seq_len:
                        prev = None
                    else:
                        prev = translate(
                            table_row(row)[pos - 1], ProblemRole.CHAIN_PREV, r, pos - 1, k
                        )
                    if prev is None:
                        bits |= Undefined.PREV
                token: int | None = -1
                if pool is not None and valid_lens is not None:
                    s = pos + offset
                    if 0 <= s < valid_lens[r]:
                        token = None
                        if pool_row is None or s >= pool_cols:
                            if not token_reported:
                                token_reported = True
                                bad = rp if pool_row is None else s
                                flag(
                                    ProblemKind.EXPECTED_TOKEN_OUT_OF_RANGE,
                                    ProblemRole.EXPECTED_TOKEN,
                                    r,
                                    pos,
                                    bad,
                                    k,
                                )
                            bits |= Undefined.TOKEN
                        else:
                            token = pool_row_values(pool_row)[s]
                if not overflow:
                    slots.append(0 if slot is None else slot)
                    prevs.append(0 if prev is None else prev)
                    tokens.append(0 if token is None else token)
                    positions.append(pos)
                    undefined.append(bits)
                k += 1

        # Seeds after every entry (REF order: entries, write offsets, seeds, num_valid/enable).
        seeds: list[int] = []
        seed_undefined: list[bool] = []
        for r, wanted in enumerate(frame.seed_wanted.tolist()):
            seed: int | None = -1
            if wanted:
                pos = min(prefix[r] - 1, max(max_seq_len - 1, 0))
                row = _python_row(rpi[r], max_reqs)
                if row is None or pos >= max_seq_len:
                    seed = None  # IndexError; the verify loop over this row raised first
                else:
                    seed = translate(table_row(row)[pos], ProblemRole.SEED, r, pos, -1)
            seeds.append(0 if seed is None else seed)
            seed_undefined.append(seed is None)

        def i64(values: list[int]) -> np.ndarray:
            return np.array(values, dtype=np.int64)

        entries = VerifyEntries(
            slot=i64(slots),
            expected_token=i64(tokens),
            position=i64(positions),
            prev_slot=i64(prevs),
            undefined=np.array(undefined, dtype=np.uint8),
        )
        return assemble_plan(
            frame,
            backend=self.name,
            semantics=self.semantics,
            entries=entries,
            seeds=i64(seeds),
            seed_undefined=np.array(seed_undefined, dtype=bool),
            problems=problems.table(),
        )
