"""Per-row plan geometry and row-level problems, shared by the torch and Triton backends.

Row-level problems (a bad pool row, a prefix past the row, an expected-token gather outside the
pool) are kvcanary's annotations, not plan outputs: both backends derive them on the host from
per-row numbers, with one implementation, so they cannot drift apart.
"""

from __future__ import annotations

import torch

from kvcanary_cli.dump import KvDump
from kvcanary_cli.errors import PlanTooLargeError
from kvcanary_cli.planners.base import ProblemKind, ProblemRole, ProblemTable

__all__ = [
    "MAX_MATERIALIZED_ENTRIES",
    "check_materializable",
    "python_rows_resolve",
    "row_problems",
    "verify_geometry",
]

#: Verify entries kvcanary will hold in memory (40 bytes each): production capacities are
#: about 3x the KV pool, far below this; more means corrupt lengths.
MAX_MATERIALIZED_ENTRIES = 1 << 26
_I64 = torch.int64


def verify_geometry(dump: KvDump, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(window_start, verify_len) per batch row, int64 [bs] (semantics §1.2)."""
    prefix = dump.prefix_lens
    start = (prefix - window).clamp(min=0) if window > 0 else torch.zeros_like(prefix)
    verify_len = torch.where(dump.req_pool_indices != 0, (prefix - start).clamp(min=0), 0)
    return start, verify_len


def check_materializable(total: int) -> None:
    """Refuse to hold more verify entries than any real plan has (corrupt lengths)."""
    if total > MAX_MATERIALIZED_ENTRIES:
        raise PlanTooLargeError(
            f"the batch asks for {total} verify entries, more than kvcanary holds in memory "
            f"({MAX_MATERIALIZED_ENTRIES})", tensor="prefix_lens",
            hint="the lengths look corrupt; or pass --verify-capacity to plan an overflow",
        )


def python_rows_resolve(rpi: torch.Tensor, rows: int) -> torch.Tensor:
    """Where Python indexing reaches a row (REF: negative indices wrap, others raise)."""
    row = torch.where(rpi < 0, rpi + rows, rpi)
    return (row >= 0) & (row < rows)


def row_problems(dump: KvDump, window: int, offsets: torch.Tensor, *, gpu: bool) -> ProblemTable:
    """Once-per-row problems, each at the first entry it affects.

    `offsets` is the exclusive prefix sum of verify_len ([bs+1]). REF problems raise where
    SGLang's reference raises (negative pool rows wrap silently); GPU problems never raise.
    """
    rpi, prefix = dump.req_pool_indices, dump.prefix_lens
    ws, _ = verify_geometry(dump, window)
    has = (offsets[1:] - offsets[:-1]) > 0
    in_range = (rpi >= 0) & (rpi < dump.max_reqs)
    resolves = in_range if gpu else python_rows_resolve(rpi, dump.max_reqs)
    tables: list[ProblemTable] = []

    def add(kind: ProblemKind, role: ProblemRole, mask: torch.Tensor, position: torch.Tensor,
            value: torch.Tensor, raises: torch.Tensor | bool) -> None:
        idx = torch.nonzero(mask).reshape(-1)
        if idx.numel() == 0:
            return
        table = ProblemTable.build(
            kind, role, batch_row=idx.numpy(), pool_row=rpi[idx].numpy(),
            position=position[idx].numpy(), value=value[idx].numpy(),
            entry=(offsets[idx] + position[idx] - ws[idx]).numpy(), raises=False)
        if not gpu:
            table.raises[:] = raises if isinstance(raises, bool) else raises[idx].numpy()
        tables.append(table)

    add(ProblemKind.ROW_OUT_OF_RANGE, ProblemRole.VERIFY, has & ~in_range, ws, rpi, ~resolves)
    beyond = torch.maximum(ws, torch.full_like(ws, dump.max_seq_len))
    add(ProblemKind.POSITION_BEYOND_ROW, ProblemRole.VERIFY,
        has & resolves & (prefix > dump.max_seq_len), beyond, beyond, True)
    pool = dump.req_to_verify_expected_tokens
    valid = dump.req_to_verify_expected_tokens_valid_lens
    if pool is not None and valid is not None:
        off = dump.token_offset
        rows, cols = int(pool.shape[0]), int(pool.shape[1])
        s_lo = (ws + off).clamp(min=0)  # first gathered token index
        s_hi = torch.minimum(prefix + off, valid)  # one past the last
        gathers = has & (s_lo < s_hi)
        pool_ok = ((rpi >= 0) & (rpi < rows)) if gpu else python_rows_resolve(rpi, rows)
        add(ProblemKind.EXPECTED_TOKEN_OUT_OF_RANGE, ProblemRole.EXPECTED_TOKEN,
            gathers & ~pool_ok, s_lo - off, rpi, True)
        first_bad = torch.maximum(s_lo, torch.full_like(s_lo, cols))
        add(ProblemKind.EXPECTED_TOKEN_OUT_OF_RANGE, ProblemRole.EXPECTED_TOKEN,
            gathers & pool_ok & (s_hi > cols), first_bad - off, first_bad, True)
    return ProblemTable.concat(tables)
