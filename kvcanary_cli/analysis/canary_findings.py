"""Canary findings: replay the verify launches of a planned group on the dump's canary
buffers, and report each failing entry (docs/canary.md §5, docs/findings.md).

One finding per failing verify entry and failed check (`canary-chain-break`,
`canary-position-mismatch`, `canary-token-mismatch`, `canary-real-kv-mismatch`); the
buffers that fail the same entry the same way (HEAD and TAIL, K and V) are merged into it. Each
carries the rows SGLang would record and the row's explanation (`violations.explain`).
"""

from __future__ import annotations

from kvcanary_cli.analysis.model import (
    Finding,
    FindingCode,
    Role,
    Space,
)
from kvcanary_cli.analysis.provenance import LiveCells
from kvcanary_cli.analysis.violations.explain import explain_rows
from kvcanary_cli.analysis.violations.report import explanation_text
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
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.planners.base import Plan

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
    merged: dict[tuple[FindingCode, int], tuple[int, list[str], list[list[int]]]] = {}
    for i in range(len(rows)):  # one per failing entry: bounded by the plan's entries
        row = [int(v) for v in fields[i]]
        buffer = buffer_tensor_name(plan.group, buffer_of_tag(row[0]) or "?")
        for bit, code in _CODES:
            if row[7] & bit:
                first, buffers, same = merged.setdefault((code, int(rows.index[i])), (i, [], []))
                buffers.append(buffer)
                same.append(row)
    found = []
    for (code, _), (i, buffers, same) in merged.items():
        position = int(rows.expected_position[i])
        facts = why.facts(i)
        found.append(
            Finding(
                code=code,
                group=plan.group,
                slot=same[0][1],
                space=Space(plan.group.value),  # a group's canary holds its pool's slots
                batch_row=int(rows.batch_row[i]),
                pool_row=int(why.ref_row[i]),
                position=position,
                role=Role.VERIFY,
                message=f"{_what(code, same[0], position)}; {explanation_text(why, i, fields[i])}",
                details={
                    "buffers": buffers,
                    "tag": tag_label(same[0][0]),
                    "rows": same,
                    "fields": list(VIOLATION_FIELDS),
                    "prev_slot": int(rows.prev_slot[i]),
                    "explanation": facts,
                },
                canary_cause=str(facts.get("cause", "")) or None,
                prev_slot=int(rows.prev_slot[i]),
            )
        )
    return found


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
