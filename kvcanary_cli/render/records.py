"""The versioned machine records (`kvcanary.check/1`, `kvcanary.provenance/1`) of a report.

JSON and Markdown are both rendered from these dicts, so the two formats cannot disagree. A
record holds JSON types only and every list has a fixed order, so equal reports give equal text.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import kvcanary_cli
from kvcanary_cli.analysis.model import (
    CheckReport,
    DumpReport,
    Finding,
    FindingCode,
    GroupSummary,
    ProvenanceReport,
    RowMap,
    Severity,
    SlotProvenance,
    code_order,
)

__all__ = [
    "CHECK_SCHEMA",
    "PROVENANCE_SCHEMA",
    "CodeSection",
    "Record",
    "code_sections",
    "difference_phrase",
    "dump_verdict",
    "plural",
    "provenance_record",
    "slot_provenance_record",
    "to_record",
]

CHECK_SCHEMA = "kvcanary.check/1"
PROVENANCE_SCHEMA = "kvcanary.provenance/1"

#: a record: JSON types only.
Record = dict[str, Any]


_DIFFERENCE_VERBS = {
    FindingCode.LUT_OUT_OF_RANGE.value: "kernel clamped",
    FindingCode.SLOT_BEYOND_POOL.value: "kernel read past the pool for",
    FindingCode.ROW_OUT_OF_RANGE.value: "kernel read out of bounds for",
    FindingCode.PREFIX_BEYOND_ROW.value: "kernel read neighbouring rows for",
}


def difference_phrase(code: str, count: int) -> str:
    """How a group's explained reference/kernel difference reads in tables and Markdown."""
    entries = "1 entry" if count == 1 else f"{count} entries"
    verb = _DIFFERENCE_VERBS.get(code)
    if verb is None:
        return f"{entries} {'differs' if count == 1 else 'differ'} ({code})"
    return f"{verb} {entries} ({code})"


def _json_safe(value: object) -> Any:
    """`details` are meant to be JSON-safe; make sure (tuples → lists, odd scalars → str)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _json_safe(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return str(value)


def _provenance(prov: SlotProvenance) -> Record:
    return {
        "slot": prov.slot,
        "space": prov.space,
        "cells": [
            {
                "pool_row": c.pool_row,
                "position": c.position,
                "batch_rows": list(c.batch_rows),
                "role": c.role,
                "seed": c.seed,
                "shared": c.shared,
            }
            for c in prov.cells
        ],
        "cells_total": prov.cells_total,
        "swa_slot": prov.swa_slot,
        "translation_note": prov.translation_note,
        "mapped_from": list(prov.mapped_from),
        "allocator": prov.allocator,
        "canary": [
            {
                "buffer": r.buffer,
                "token": r.token,
                "position": r.position,
                "prev_hash": r.prev_hash,
                "real_kv_hash": r.real_kv_hash,
            }
            for r in prov.canary
        ],
        "violations": [{"index": v.index, "fields": list(v.fields)} for v in prov.violations],
    }


def slot_provenance_record(prov: SlotProvenance) -> Record:
    """One slot's provenance, as `check` and `provenance` records carry it."""
    return _provenance(prov)


def _finding(finding: Finding) -> Record:
    return {
        "code": finding.code.value,
        "severity": finding.severity.value,
        "group": finding.group,
        "slot": finding.slot,
        "space": finding.space,
        "batch_row": finding.batch_row,
        "pool_row": finding.pool_row,
        "position": finding.position,
        "role": finding.role,
        "message": finding.message,
        "details": _json_safe(finding.details),
        "provenance": None if finding.provenance is None else _provenance(finding.provenance),
    }


def _findings(findings: tuple[Finding, ...]) -> list[Record]:
    return [_finding(f) for f in sorted(findings, key=Finding.order_key)]


def _group(group: GroupSummary) -> Record:
    return {
        "group": group.group,
        "window": group.window,
        "total_verify": group.total_verify,
        "verify_capacity": group.verify_capacity,
        "enable": group.enable,
        "kernel": group.kernel,
        "explained_differences": {
            k: group.explained_differences[k]
            for k in sorted(group.explained_differences, key=lambda c: code_order(FindingCode(c)))
        },
        "unexplained_differences": group.unexplained_differences,
        "kernel_launch_error": group.kernel_launch_error,
    }


def _counts(findings: tuple[Finding, ...]) -> list[Record]:
    counter = Counter((f.code, f.group) for f in findings)
    return [
        {"code": code.value, "severity": code.severity.value, "group": group, "count": n}
        for (code, group), n in sorted(counter.items(), key=lambda item: code_order(*item[0]))
    ]


def dump_verdict(dump: DumpReport) -> str:
    """`bad-input` when unreadable, else the worst severity found: errors, warnings or clean."""
    if dump.error is not None:
        return "bad-input"
    worst = dump.worst()
    if worst is Severity.ERROR:
        return "errors"
    if worst is Severity.WARNING:
        return "warnings"
    return "clean"


def _identity(identity: dict[str, str]) -> Record:
    """Identity keys in the dump's order (the format's identity keys first)."""
    return {k: str(v) for k, v in identity.items()}


def _dump(dump: DumpReport, fail_on: Severity, max_findings: int | None) -> Record:
    findings = _findings(dump.findings)
    if max_findings is not None:
        findings = findings[: max(max_findings, 0)]
    return {
        "path": dump.path,
        "identity": _identity(dump.identity),
        "bs": dump.bs,
        "verdict": dump_verdict(dump),
        "fails": dump.fails(fail_on),
        "error": dump.error,
        "kernel_mode": dump.kernel_mode,
        "notes": list(dump.notes),
        "groups": [_group(g) for g in dump.groups],
        "counts": _counts(dump.findings),
        "findings_total": len(dump.findings),
        "findings": findings,
    }


def to_record(report: CheckReport, *, max_findings: int | None = None) -> Record:
    """The `kvcanary.check/1` record of a check.

    `verdict` mirrors the exit code: `bad-input` (2) when a dump could not be read, else
    `findings` (1) when a finding reaches `fail_on`, else `clean` (0). `max_findings` caps each
    dump's `findings` list (None: all of them); `counts` and `findings_total` always count all.
    """
    every = tuple(f for d in report.dumps for f in d.findings)
    by_code = Counter(f.code.value for f in every)
    by_severity = Counter(f.severity.value for f in every)
    if report.bad_input:
        verdict = "bad-input"
    elif report.failed:
        verdict = "findings"
    else:
        verdict = "clean"
    return {
        "schema": CHECK_SCHEMA,
        "kvcanary_version": kvcanary_cli.__version__,
        "fail_on": report.fail_on.value,
        "verdict": verdict,
        "summary": {
            "dumps": len(report.dumps),
            "failed": sum(d.fails(report.fail_on) for d in report.dumps),
            "bad_input": sum(d.error is not None for d in report.dumps),
            "findings": len(every),
            "by_severity": {s.value: by_severity[s.value] for s in Severity},
            "counts": {c.value: by_code[c.value] for c in FindingCode if by_code[c.value]},
        },
        "dumps": [_dump(d, report.fail_on, max_findings) for d in report.dumps],
    }


def _row(row: RowMap) -> Record:
    return {
        "pool_row": row.pool_row,
        "batch_rows": list(row.batch_rows),
        "prefix_len": row.prefix_len,
        "extend_len": row.extend_len,
        "window_start": row.window_start,
        "group": row.group,
        "filled": row.filled,
        "max_seq_len": row.max_seq_len,
        "cells": [
            {
                "position": c.position,
                "slot": c.slot,
                "role": c.role,
                "seed": c.seed,
                "swa_slot": c.swa_slot,
                "marks": sorted(c.marks, key=lambda m: FindingCode(m).order),
            }
            for c in sorted(row.cells, key=lambda c: c.position)
        ],
    }


def provenance_record(report: ProvenanceReport) -> Record:
    """The `kvcanary.provenance/1` record: one slot's provenance or one pool row's map."""
    return {
        "schema": PROVENANCE_SCHEMA,
        "kvcanary_version": kvcanary_cli.__version__,
        "path": report.path,
        "identity": _identity(report.identity),
        "slot": None if report.slot is None else _provenance(report.slot),
        "row": None if report.row is None else _row(report.row),
        "findings": _findings(report.findings),
    }


def plural(count: int, word: str) -> str:
    """`1 finding`, `2 findings`."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


@dataclass(frozen=True)
class CodeSection:
    """One code's block in a dump's view: its total and the findings shown."""

    code: str
    severity: str
    total: int
    shown: list[Record]


def code_sections(dump: Record, max_rows: int) -> list[CodeSection]:
    """Per code (in report order), the total over groups and the first `max_rows` findings.

    The table and Markdown views both draw their per-code blocks from this.
    """
    totals: dict[str, int] = {}
    severity: dict[str, str] = {}
    for c in dump["counts"]:
        totals[c["code"]] = totals.get(c["code"], 0) + c["count"]
        severity[c["code"]] = c["severity"]
    by_code: dict[str, list[Record]] = {}
    for f in dump["findings"]:  # already in report order
        by_code.setdefault(f["code"], []).append(f)
    return [
        CodeSection(
            code=code,
            severity=severity[code],
            total=total,
            shown=by_code.get(code, [])[: max(max_rows, 0)],
        )
        for code, total in totals.items()
    ]
