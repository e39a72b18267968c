"""`request_summaries`: one summary per batch row with findings, the request as the batch
describes it and its finding counts (the `requests` of a `DumpReport`)."""

from __future__ import annotations

import numpy as np

from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.results.check import Finding, RequestSummary

__all__ = ["request_summaries"]


def request_summaries(dump: KvDump, findings: list[Finding]) -> list[RequestSummary]:
    """One summary per batch row with findings, in batch order (counted per cell)."""
    bs = dump.bs
    codes = list(FindingCode)
    counts = np.zeros((len(codes), bs), dtype=np.int64)
    first_bad = np.full(bs, np.iinfo(np.int64).max, dtype=np.int64)
    for f in findings:
        if f.cells is None:
            if f.batch_row is None or not 0 <= f.batch_row < bs:
                continue
            counts[f.code.order, f.batch_row] += 1
            if f.position is not None:
                first_bad[f.batch_row] = min(first_bad[f.batch_row], f.position)
            continue
        # counted and compared only: the columns as held
        row, position = f.cells.column("batch_row"), f.cells.column("position")
        assert row is not None and position is not None
        inside = (row >= 0) & (row < bs)
        counts[f.code.order] += np.bincount(row[inside], minlength=bs)
        np.minimum.at(first_bad, row[inside], position[inside])
    rpi, prefix, extend = dump.req_pool_indices, dump.prefix_lens, dump.extend_seq_lens
    out = []
    for batch_row in np.flatnonzero(counts.any(axis=0)).tolist():  # rows with findings
        per_code = counts[:, batch_row]
        bad = int(first_bad[batch_row])
        out.append(
            RequestSummary(
                batch_row=batch_row,
                pool_row=int(rpi[batch_row]),
                prefix_len=int(prefix[batch_row]),
                extend_len=int(extend[batch_row]),
                counts={codes[c]: int(per_code[c]) for c in np.flatnonzero(per_code)},
                first_bad_position=None if bad == np.iinfo(np.int64).max else bad,
            )
        )
    return out
