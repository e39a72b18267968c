"""The versioned machine records (`kvcanary.check/1`, `kvcanary.provenance/1`) of a report.

JSON and Markdown are both rendered from these dicts, so the two formats cannot disagree. A
record holds JSON types only and every list has a fixed order, so equal reports give equal text.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

import kvcanary_cli
from kvcanary_cli.analysis.model import (
    Cause,
    CheckReport,
    DumpReport,
    Finding,
    FindingCode,
    FirstRaise,
    GroupSummary,
    ProvenanceReport,
    RequestSummary,
    RowMap,
    Severity,
    ShrinkRecord,
    SlotProvenance,
    code_order,
)

__all__ = [
    "CHECK_SCHEMA",
    "PROVENANCE_SCHEMA",
    "CauseSection",
    "CodeSection",
    "Record",
    "cause_sections",
    "cell_columns",
    "DIFFERENCES_NOTE",
    "difference_phrase",
    "differences_lines",
    "dump_verdict",
    "failing_phrase",
    "plural",
    "position_text",
    "provenance_record",
    "row_lines",
    "row_notices",
    "shrunk_lines",
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


def cell_columns(swa: bool) -> tuple[str, ...]:
    """The columns of a slot's cell table, in both views (an SWA slot's cells also name the
    full slot that maps to it)."""
    return (
        "pool row",
        "position",
        *(("full slot",) if swa else ()),
        "batch rows",
        "role",
        "seed",
        "shared",
    )


#: How to read a groups table: what "verify entries", differences and findings count.
DIFFERENCES_NOTE = (
    "verify entries: what the reference plan requests; differences: plan values where the "
    "kernel and the reference disagree (a cell read as a verify slot and as a chain "
    "predecessor counts twice); findings: cells and rows"
)


def differences_lines(group: Record) -> list[str]:
    """A group's reference/kernel comparison in words, one line per kind of difference."""
    if group["kernel"] == "none":
        return ["not compared (--kernel none)"]
    by_field = group["explained_by_field"]
    lines = [
        difference_phrase(code, by_field.get(code) or {"plan value": n})
        for code, n in group["explained_differences"].items()
    ]
    if group["unexplained_differences"]:
        lines.append(f"{group['unexplained_differences']} unexplained (kernel-divergence)")
    if group["kernel_launch_error"]:
        lines.append(f"launch raises: {group['kernel_launch_error']}")
    return lines or ["none"]


def difference_phrase(code: str, by_field: dict[str, int]) -> str:
    """How a group's explained reference/kernel differences read in tables and Markdown:
    what the kernel did, to how many plan values of each field, and why."""
    values = ", ".join(plural(n, what) for what, n in by_field.items())
    verb = _DIFFERENCE_VERBS.get(code)
    if verb is None:
        return f"{values} differ ({code})"
    return f"{verb} {values} ({code})"


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
                "full_slot": c.full_slot,
            }
            for c in prov.cells
        ],
        "cells_total": prov.cells_total,
        "swa_slot": prov.swa_slot,
        "translation_note": prov.translation_note,
        "mapped_from": list(prov.mapped_from),
        "clamped_from": list(prov.clamped_from),
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
        "violations_total": prov.violations_total,
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
        "cells": finding.cells,
        "spread": finding.spread,
        "role": finding.role,
        "message": finding.message,
        "details": _json_safe(finding.details),
        "provenance": None if finding.provenance is None else _provenance(finding.provenance),
        "assumes": list(finding.assumes),
        "cause": None if finding.cause is None else finding.cause.value,
        "first_raise": finding.first_raise,
    }


def position_text(f: Record) -> str | None:
    """A finding record's position for people: `a..b` for a run of cells."""
    if f["position"] is None:
        return None
    cells = int(f.get("cells", 1))
    if f.get("spread"):
        return f"{f['position']} (+{cells - 1} cells)"
    return str(f["position"]) if cells == 1 else f"{f['position']}..{f['position'] + cells - 1}"


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
        "explained_by_field": {
            k: dict(group.explained_by_field[k])
            for k in sorted(group.explained_by_field, key=lambda c: code_order(FindingCode(c)))
        },
        "unexplained_differences": group.unexplained_differences,
        "kernel_launch_error": group.kernel_launch_error,
    }


def _counts(findings: tuple[Finding, ...]) -> list[Record]:
    """Per (code, group, severity): a code is `info` where its findings rest on assumptions."""
    counter: Counter[tuple[FindingCode, str, Severity]] = Counter()
    for f in findings:  # a run record counts its cells
        counter[(f.code, f.group, f.severity)] += f.cells
    return [
        {"code": code.value, "severity": severity.value, "group": group, "count": n}
        for (code, group, severity), n in sorted(
            counter.items(),
            key=lambda item: (*code_order(item[0][0], item[0][1]), -item[0][2].rank),
        )
    ]


def _cause(cause: Cause) -> Record:
    return {
        "cause": cause.code.value,
        "confidence": cause.confidence.value,
        "summary": cause.summary,
        "evidence": list(cause.evidence),
        "explains": dict(cause.explains),
        "fix": cause.fix,
    }


def _request(request: RequestSummary) -> Record:
    return {
        "batch_row": request.batch_row,
        "pool_row": request.pool_row,
        "prefix_len": request.prefix_len,
        "extend_len": request.extend_len,
        "counts": dict(request.counts),
        "first_bad_position": request.first_bad_position,
    }


def _first_raise(raised: FirstRaise | None) -> Record | None:
    if raised is None:
        return None
    return {
        "group": raised.group,
        "exception_type": raised.exception_type,
        "message": raised.message,
        "code": raised.code.value,
        "batch_row": raised.batch_row,
        "position": raised.position,
    }


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


#: What every report on a shrunk dump says about its provenance.
SHRUNK_NOTE = (
    "shrunk dump: provenance covers the kept cells only (cells, counts and allocator states "
    "elsewhere in the original are not in it)"
)


def _shrunk(shrink: ShrinkRecord | None, path: str) -> Record | None:
    """The `shrunk` object of a record: the source, what was dropped, the command that made
    it (None for a dump that was not shrunk)."""
    if shrink is None:
        return None
    return {**shrink.as_record(PurePath(path).name), "note": SHRUNK_NOTE}


def shrunk_lines(shrunk: Record) -> list[str]:
    """A shrunk dump's facts in words: where it came from, what it dropped, how to redo it."""
    source = shrunk["source"]
    return [
        f"shrunk from {shrunk['source_file']} ({source['bytes']:,} bytes, sha256 "
        f"{source['sha256'][:16]}…): {shrunk['dropped_bytes']:,} bytes of tensor data "
        "dropped",
        SHRUNK_NOTE,
    ]


def _identity(identity: dict[str, str]) -> Record:
    """Identity keys in the dump's order (the format's identity keys first)."""
    return {k: str(v) for k, v in identity.items()}


def _dump(dump: DumpReport, fail_on: Severity) -> Record:
    findings = _findings(dump.findings)
    return {
        "path": dump.path,
        "identity": _identity(dump.identity),
        "bs": dump.bs,
        "verdict": dump_verdict(dump),
        "fails": dump.fails(fail_on),
        "error": dump.error,
        "kernel_mode": dump.kernel_mode,
        "shrunk": _shrunk(dump.shrink, dump.path),
        "notes": list(dump.notes),
        "groups": [_group(g) for g in dump.groups],
        "scalars": [
            {"name": v.name, "value": v.value, "origin": v.origin, "source": v.source}
            for v in dump.scalars
        ],
        "assumptions": [
            {
                "scalar": a.scalar,
                "value": a.value,
                "source": a.source,
                "decides": dict(a.decides),
                "advice": a.advice,
            }
            for a in dump.assumptions
        ],
        "diagnosis": [_cause(c) for c in dump.diagnosis],
        "first_raise": _first_raise(dump.first_raise),
        "recorded_exception": dump.recorded_exception,
        "recorded_exception_matches": dump.recorded_exception_matches,
        "requests": [_request(r) for r in dump.requests],
        "counts": _counts(dump.findings),
        "findings_total": len(dump.findings),
        "findings": findings,
    }


def to_record(report: CheckReport) -> Record:
    """The `kvcanary.check/1` record of a check.

    `verdict` mirrors the exit code: `bad-input` (2) when a dump could not be read, else
    `findings` (1) when a finding reaches `fail_on`, else `clean` (0).
    """
    every = tuple(f for d in report.dumps for f in d.findings)
    by_code: Counter[str] = Counter()
    by_severity: Counter[str] = Counter()
    for f in every:  # cells, not records: a run of 15 bad cells is 15
        by_code[f.code.value] += f.cells
        by_severity[f.severity.value] += f.cells
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
        "sglang_installed": report.sglang_installed,
        "verdict": verdict,
        "summary": {
            "dumps": len(report.dumps),
            "failed": sum(d.fails(report.fail_on) for d in report.dumps),
            "bad_input": sum(d.error is not None for d in report.dumps),
            "findings": len(every),
            "by_severity": {s.value: by_severity[s.value] for s in Severity},
            "counts": {c.value: by_code[c.value] for c in FindingCode if by_code[c.value]},
        },
        "dumps": [_dump(d, report.fail_on) for d in report.dumps],
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
        "gaps": [{"start": g.start, "end": g.end, "filled": g.filled} for g in row.gaps],
        "positions": None if row.window is None else list(row.window),
        "marks_not_shown": row.marks_not_shown,
    }


def row_lines(row: Record) -> list[Record]:
    """The row map's cells and gaps in position order: `{"cell": ...}` or `{"gap": ...}` items,
    so that every view shows where positions were left out."""
    items = [(c["position"], {"cell": c}) for c in row["cells"]]
    items += [(g["start"], {"gap": g}) for g in row["gaps"]]
    return [item for _, item in sorted(items, key=lambda pair: pair[0])]


def row_notices(row: Record) -> list[str]:
    """What a row map does not show, in words."""
    shown = len(row["cells"])
    lo, hi = row["positions"] or (0, row["max_seq_len"])
    notices = []
    if shown < hi - lo:
        notices.append(
            f"showing {shown} of {hi - lo} positions {lo}..{hi - 1}; the others are "
            "in the gap rows (--positions START:END and --max-rows show more)"
        )
    if row["marks_not_shown"]:
        notices.append(
            f"{row['marks_not_shown']} marked positions do not fit --max-rows: narrow "
            "the range with --positions to see them"
        )
    return notices


def provenance_record(report: ProvenanceReport) -> Record:
    """The `kvcanary.provenance/1` record: one slot's provenance or one pool row's map."""
    return {
        "schema": PROVENANCE_SCHEMA,
        "kvcanary_version": kvcanary_cli.__version__,
        "path": report.path,
        "identity": _identity(report.identity),
        "shrunk": _shrunk(report.shrink, report.path),
        "slot": None if report.slot is None else _provenance(report.slot),
        "row": None if report.row is None else _row(report.row),
        "findings": _findings(report.findings),
    }


def failing_phrase(summary: Record, fail_on: str) -> str:
    """`the dump fails --fail-on error` / `2 of 3 dumps fail ...`, with the unreadable count."""
    failed, dumps, bad = summary["failed"], summary["dumps"], summary["bad_input"]
    if dumps == 1:
        verdict = "is unreadable" if bad else ("fails" if failed else "passes")
        return f"the dump {verdict}" + ("" if bad else f" at --fail-on {fail_on}")
    unreadable = f"; {bad} unreadable" if bad else ""
    verb = "fails" if failed == 1 else "fail"
    return f"{failed} of {dumps} dumps {verb} at --fail-on {fail_on}{unreadable}"


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


@dataclass(frozen=True)
class CauseSection:
    """One cause's block: the diagnosis entry and its symptoms, code by code."""

    #: the `diagnosis` entry; None for findings no cause explains.
    cause: Record | None
    sections: list[CodeSection]


def _code_sections(
    findings: list[Record], totals: Counter[tuple[str, str]], max_rows: int
) -> list[CodeSection]:
    by_code: dict[tuple[str, str], list[Record]] = {}
    for f in findings:  # already in report order
        by_code.setdefault((f["code"], f["severity"]), []).append(f)
    return [
        CodeSection(
            code=code,
            severity=severity,
            total=total,
            shown=by_code.get((code, severity), [])[: max(max_rows, 0)],
        )
        for (code, severity), total in totals.items()
    ]


def cause_sections(dump: Record, max_rows: int) -> list[CauseSection]:
    """Per cause (diagnosis order), its findings per code: the total and the first `max_rows`.

    The table and Markdown views both draw their finding blocks from this, so symptoms are
    always shown under their cause.
    """
    totals: dict[str | None, Counter[tuple[str, str]]] = {}
    for f in dump["findings"]:
        totals.setdefault(f["cause"], Counter())[(f["code"], f["severity"])] += 1
    out = []
    for cause in dump["diagnosis"]:
        if cause["cause"] in totals:
            members = [f for f in dump["findings"] if f["cause"] == cause["cause"]]
            out.append(
                CauseSection(
                    cause=cause,
                    sections=_code_sections(members, totals.pop(cause["cause"]), max_rows),
                )
            )
    for rest in totals.values():
        members = [f for f in dump["findings"] if f["cause"] is None]
        out.append(CauseSection(cause=None, sections=_code_sections(members, rest, max_rows)))
    return out
