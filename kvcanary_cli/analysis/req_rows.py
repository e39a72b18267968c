"""The request pool's rows: every pool row of `req_to_token` but the padding row 0 is free
(`free_req_rows`, SGLang's `ReqToTokenPool.free_slots`) or held by exactly one running request
(`running_req_rows`), never both, and never listed twice.

SGLang's own `_check_req_pool` compares counts, at idle only; with both records a dump names
the rows, busy or idle. A row in the batch (`req_pool_indices`) is held too, so a dump that
records only the free list still shows a batch row that is free. A record the dump lacks is
not guessed: without `running_req_rows` no row is called leaked. A few sorts over lists as
long as the pool has rows; a shrunk dump keeps both lists whole, and the table's shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from kvcanary_cli.analysis.cells import repeated
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.dump.tensor import common, union
from kvcanary_cli.results.check import Finding, JsonValue

__all__ = ["RowCensus", "held_rows", "pool_rows", "req_row_findings", "row_census"]

#: Rows a finding names in its details (a sample, with the total).
_ROWS_SHOWN = 16


def pool_rows(values: np.ndarray | None, rows: int) -> np.ndarray:
    """The entries of a row list that name a pool row (0 < row < `rows`: the padding row 0
    and values outside the table name none), flat int64; empty for a list not recorded."""
    if values is None:
        return np.zeros(0, dtype=np.int64)
    flat = np.asarray(values, dtype=np.int64).reshape(-1)
    return flat[(flat > 0) & (flat < rows)]


def held_rows(dump: KvDump) -> np.ndarray:
    """The pool rows running requests hold: `running_req_rows` and the batch's rows,
    distinct and sorted."""
    rows = int(dump.req_to_token.shape[0])
    running = pool_rows(dump.running_req_rows, rows)
    return union(running, pool_rows(dump.req_pool_indices, rows))


def _finding(code: FindingCode, rows: np.ndarray, one: str, many: str) -> Finding:
    first = int(rows[0])
    return Finding(
        code=code,
        group=Group.FULL,
        pool_row=first,
        message=one.format(row=first) if rows.size == 1 else many.format(n=rows.size),
        details=cast(
            dict[str, JsonValue],
            {"rows": [int(r) for r in rows[:_ROWS_SHOWN]], "rows_total": int(rows.size)},
        ),
    )


@dataclass(frozen=True)
class RowCensus:
    """The request pool's rows by what holds them, as the dump records them (sorted pool rows;
    `listed` keeps the free list's repeats): what `req_row_findings` and `leak` both read."""

    #: the table's rows, its padding row 0 among them
    rows: int
    #: the free list's entries that name a pool row (`free_req_rows`), repeats kept
    listed: np.ndarray
    #: rows running requests, sessions and the batch hold (`held_rows`)
    held: np.ndarray
    #: rows on the free list and held
    free_and_held: np.ndarray
    #: rows listed free twice, or held by two running requests
    twice: np.ndarray
    #: rows neither free nor held; None without both records (no row is called leaked)
    leaked: np.ndarray | None


def row_census(dump: KvDump) -> RowCensus | None:
    """The census of the dump's request pool rows; None where it records neither list."""
    free, running = dump.free_req_rows, dump.running_req_rows
    if free is None and running is None:
        return None
    rows = int(dump.req_to_token.shape[0])
    listed, running_rows = pool_rows(free, rows), pool_rows(running, rows)
    held = held_rows(dump)
    leaked = None
    if free is not None and running is not None:
        accounted = np.zeros(rows, dtype=bool)
        accounted[:1] = True  # the padding row (a table may have none)
        accounted[listed] = True
        accounted[held] = True
        leaked = np.flatnonzero(~accounted).astype(np.int64)
    return RowCensus(
        rows=rows,
        listed=listed,
        held=held,
        free_and_held=common(listed, held),
        twice=union(repeated(listed), repeated(running_rows)),
        leaked=leaked,
    )


def req_row_findings(dump: KvDump) -> list[Finding]:
    """Rows free and held, listed or held twice, and (with both records) leaked."""
    census = row_census(dump)
    if census is None:
        return []
    found: list[Finding] = []
    if census.free_and_held.size:
        found.append(
            _finding(
                FindingCode.REQ_ROW_FREE_AND_HELD,
                census.free_and_held,
                "pool row {row} is on the request pool's free list, yet a running request "
                "holds it: freed while in use",
                "{n} pool rows are on the request pool's free list, yet running requests "
                "hold them: freed while in use",
            )
        )
    if census.twice.size:
        found.append(
            _finding(
                FindingCode.REQ_ROW_HANDED_OUT_TWICE,
                census.twice,
                "pool row {row} is listed free twice or held by two running requests: freed twice",
                "{n} pool rows are listed free twice or held by two running requests: freed twice",
            )
        )
    if census.leaked is not None and census.leaked.size:
        found.append(
            _finding(
                FindingCode.REQ_ROW_LEAKED,
                census.leaked,
                "pool row {row} is neither free nor held by a running request: leaked",
                "{n} pool rows are neither free nor held by a running request: leaked",
            )
        )
    return found
