"""Row-level problems, shared by the vectorized and Triton backends.

Row-level problems (a bad pool row, a prefix past the row, an expected-token gather outside the
pool) are kvcanary's annotations, not plan outputs: both backends derive them on the host from
the group's frame, with one implementation, so they cannot drift apart.
"""

from __future__ import annotations

import numpy as np

from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.planners.base import ProblemKind, ProblemRole, ProblemTable
from kvcanary_cli.planners.frame import GroupFrame

__all__ = ["python_rows_resolve", "row_problems"]


def python_rows_resolve(rpi: np.ndarray, rows: int) -> np.ndarray:
    """Where Python indexing reaches a row (REF: negative indices wrap, others raise)."""
    row = np.where(rpi < 0, rpi + rows, rpi)
    return (row >= 0) & (row < rows)


def row_problems(dump: KvDump, frame: GroupFrame, *, gpu: bool) -> ProblemTable:
    """Once-per-row problems, each at the first entry it affects.

    REF problems raise where SGLang's reference raises (negative pool rows wrap silently);
    GPU problems never raise.
    """
    rpi, prefix = dump.req_pool_indices, dump.prefix_lens
    ws, offsets = frame.window_start, frame.verify_offsets
    has = frame.verify_len > 0
    in_range = (rpi >= 0) & (rpi < dump.max_reqs)
    resolves = in_range if gpu else python_rows_resolve(rpi, dump.max_reqs)
    tables: list[ProblemTable] = []

    def add(
        kind: ProblemKind,
        role: ProblemRole,
        mask: np.ndarray,
        position: np.ndarray,
        value: np.ndarray,
        raises: np.ndarray | bool,
    ) -> None:
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            return
        table = ProblemTable.build(
            kind,
            role,
            batch_row=idx,
            pool_row=rpi[idx],
            position=position[idx],
            value=value[idx],
            entry=offsets[idx] + position[idx] - ws[idx],
            raises=False,
        )
        if not gpu:
            table.raises[:] = raises if isinstance(raises, bool) else raises[idx]
        tables.append(table)

    add(ProblemKind.ROW_OUT_OF_RANGE, ProblemRole.VERIFY, has & ~in_range, ws, rpi, ~resolves)
    beyond = np.maximum(ws, dump.max_seq_len)
    add(
        ProblemKind.PREFIX_BEYOND_ROW,
        ProblemRole.VERIFY,
        has & resolves & (prefix > dump.max_seq_len),
        beyond,
        beyond,
        True,
    )
    pool = dump.req_to_verify_expected_tokens
    valid = dump.req_to_verify_expected_tokens_valid_lens
    if pool is not None and valid is not None:
        off = dump.token_offset
        rows, cols = int(pool.shape[0]), int(pool.shape[1])
        s_lo = np.maximum(ws + off, 0)  # first gathered token index
        s_hi = np.minimum(prefix + off, valid)  # one past the last
        gathers = has & (s_lo < s_hi)
        pool_ok = ((rpi >= 0) & (rpi < rows)) if gpu else python_rows_resolve(rpi, rows)
        add(
            ProblemKind.EXPECTED_TOKEN_OUT_OF_RANGE,
            ProblemRole.EXPECTED_TOKEN,
            gathers & ~pool_ok,
            s_lo - off,
            rpi,
            True,
        )
        first_bad = np.maximum(s_lo, cols)
        add(
            ProblemKind.EXPECTED_TOKEN_OUT_OF_RANGE,
            ProblemRole.EXPECTED_TOKEN,
            gathers & pool_ok & (s_hi > cols),
            first_bad - off,
            first_bad,
            True,
        )
    return ProblemTable.concat(tables)
