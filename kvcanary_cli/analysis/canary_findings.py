"""Canary findings: replay the verify launches of a planned group on the dump's canary
buffers, and report each failing entry (docs/canary.md §5, docs/findings.md).

Each failing verify entry and failed check (`CANARY_CHAIN_BREAK`, `CANARY_POSITION_MISMATCH`,
`CANARY_TOKEN_MISMATCH`, `CANARY_REAL_KV_MISMATCH`) is one cell: the buffers that fail the same
entry the same way (HEAD and TAIL, K and V) are merged into it. The cells of one code are one
finding group (the diagnosis splits it by cause), with the entry's prev slot and its row's
explanation (`violations.explain`, an index into its causes) as columns; a group of one cell
carries the rows SGLang would record and the whole explanation.
"""

from __future__ import annotations

from typing import cast

import numpy as np

from kvcanary_cli.analysis.provenance import LiveCells
from kvcanary_cli.analysis.violations.explain import explain_rows
from kvcanary_cli.canary.buffers import dump_buffers
from kvcanary_cli.canary.constants import (
    VIOLATION_FIELDS,
    FailReason,
    buffer_of_tag,
    buffer_tensor_name,
    hex64,
    tag_label,
)
from kvcanary_cli.canary.replay import replay_dump
from kvcanary_cli.canary.ring_rows import ViolationRows
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.planners.base import Plan
from kvcanary_cli.results.cells import CellColumns, Role, Space
from kvcanary_cli.results.check import Finding, JsonValue
from kvcanary_cli.results.violations import CAUSES, Explanations, explanation_text

__all__ = ["canary_findings"]

#: (fail bit, code), in the order of the codes table.
_CODES = (
    (FailReason.VERIFY_CHAIN_HASH_MISMATCH, FindingCode.CANARY_CHAIN_BREAK),
    (FailReason.VERIFY_POSITION_MISMATCH, FindingCode.CANARY_POSITION_MISMATCH),
    (FailReason.VERIFY_TOKEN_MISMATCH, FindingCode.CANARY_TOKEN_MISMATCH),
    (FailReason.VERIFY_REAL_KV_HASH_MISMATCH, FindingCode.CANARY_REAL_KV_MISMATCH),
)


def canary_findings(dump: KvDump, plan: Plan, cells: LiveCells | None = None) -> list[Finding]:
    """Findings of replaying `plan`'s group on the dump's canary buffers ([] without them)."""
    if not dump_buffers(dump, plan.group):
        return []
    replays = replay_dump(dump, {plan.group: plan})
    rows = ViolationRows.concat([r.rows for r in replays])
    if not len(rows):
        return []
    why = explain_rows(dump, rows, cells)
    fields = rows.fields
    found = []
    for bit, code in _CODES:
        failing = np.flatnonzero(fields[:, 7] & bit)
        if failing.size == 0:
            continue
        # the first row of each failing entry stands for it (rows are in launch order)
        _, first = np.unique(rows.index[failing], return_index=True)
        found.append(_group(plan, code, rows, why, failing[first], failing))
    return found


def _group(
    plan: Plan,
    code: FindingCode,
    rows: ViolationRows,
    why: Explanations,
    members: np.ndarray,
    failing: np.ndarray,
) -> Finding:
    """One finding for the failing entries `members` (each its first row) of one code."""
    fields = rows.fields
    order = np.lexsort((rows.expected_position[members], rows.batch_row[members]))
    members = members[order]
    cells = CellColumns(
        batch_row=rows.batch_row[members].astype(np.int64),
        pool_row=why.ref_row[members].astype(np.int64),
        position=rows.expected_position[members].astype(np.int64),
        slot=fields[members, 1].astype(np.int64),
        extra={
            "prev_slot": rows.prev_slot[members].astype(np.int64),
            "explanation": why.cause[members].astype(np.int64),
        },
    )
    i = int(members[0])
    cause = why.cause_at(i).value
    if members.size == 1:
        # every buffer failing this entry this way, in launch order
        same = failing[rows.index[failing] == rows.index[i]]
        recorded = [[int(v) for v in fields[k]] for k in same.tolist()]
        message = f"{_what(code, recorded[0], int(rows.expected_position[i]))}; " + (
            explanation_text(why, i, fields[i])
        )
        details: dict[str, object] = {
            "buffers": [
                buffer_tensor_name(plan.group, buffer_of_tag(row[0]) or "?") for row in recorded
            ],
            "tag": tag_label(recorded[0][0]),
            "rows": recorded,
            "fields": list(VIOLATION_FIELDS),
            "prev_slot": int(rows.prev_slot[i]),
            "explanation": why.facts(i),
        }
    else:
        names, counts = np.unique(why.cause[members], return_counts=True)
        explained = {CAUSES[int(k)].value: int(n) for k, n in zip(names, counts, strict=True)}
        listed = ", ".join(f"{n} {name}" for name, n in explained.items())
        message = f"{_GROUP_WHAT[code]} (explained: {listed})"
        details = {"explanations": explained, "fields": list(VIOLATION_FIELDS)}
    return Finding(
        code=code,
        group=plan.group,
        slot=int(fields[i, 1]),
        space=Space(plan.group.value),  # a group's canary holds its pool's slots
        batch_row=int(rows.batch_row[i]),
        pool_row=int(why.ref_row[i]),
        position=int(rows.expected_position[i]),
        role=Role.VERIFY,
        message=message,
        details=cast(dict[str, JsonValue], details),
        cells=cells,
        canary_cause=cause or None,
        prev_slot=int(rows.prev_slot[i]),
    )


#: What a group's entries saw, per code.
_GROUP_WHAT = {
    FindingCode.CANARY_CHAIN_BREAK: "stored prev hashes break the chain",
    FindingCode.CANARY_POSITION_MISMATCH: "stored positions differ from the expected ones",
    FindingCode.CANARY_TOKEN_MISMATCH: "stored tokens differ from the expected ones",
    FindingCode.CANARY_REAL_KV_MISMATCH: "stored real-KV hashes differ from the fingerprints "
    "of the slots' KV bytes",
}


def _what(code: FindingCode, row: list[int], expected_position: int) -> str:
    """What the check saw, in the terms of the record."""
    match code:
        case FindingCode.CANARY_CHAIN_BREAK:
            return f"stored prev hash {hex64(row[5])}, the chain gives {hex64(row[6])}"
        case FindingCode.CANARY_POSITION_MISMATCH:
            return f"stored position {row[2]}, expected {expected_position}"
        case FindingCode.CANARY_TOKEN_MISMATCH:
            return f"stored token {row[3]}, expected {row[4]}"
        case _:
            return "stored real-KV hash differs from the fingerprint of the slot's KV bytes"
