"""The `kvcanary.check/2` record: its declaration, and `check_record`, the one place it is built.

Every view of a check (JSON, Markdown, table, `--quiet`) reads this record, so no two formats
can disagree. It holds JSON types only and every list has a fixed order, so equal reports give
equal text.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal, TypedDict, cast

import kvcanary_cli
from kvcanary_cli.catalog import CauseCode, Confidence, FindingCode, Severity
from kvcanary_cli.render.records.common import (
    FindingRecord,
    GroupName,
    ScalarOrigin,
    ShrunkRecord,
    code_counts,
    findings_record,
    group_name,
    identity_record,
    shrunk_record,
)
from kvcanary_cli.results.check import (
    Cause,
    CheckReport,
    DumpReport,
    Finding,
    FirstRaise,
    GroupSummary,
    RequestSummary,
    code_order,
)

__all__ = [
    "CHECK_SCHEMA",
    "AssumptionRecord",
    "CauseRecord",
    "CheckRecord",
    "CheckSummaryRecord",
    "CodeCountRecord",
    "DumpRecord",
    "DumpVerdict",
    "FirstRaiseRecord",
    "GroupRecord",
    "KernelMode",
    "KernelName",
    "PlanValueName",
    "RequestRecord",
    "ScalarRecord",
    "SeverityCountsRecord",
    "check_record",
    "dump_verdict",
]

CHECK_SCHEMA: Literal["kvcanary.check/2"] = "kvcanary.check/2"

#: A dump's verdict: from its most severe finding, or bad-input when it could not be read.
DumpVerdict = Literal["clean", "warnings", "errors", "bad-input"]
#: The planner that stood in for the GPU path (--kernel triton | vectorized | sglang | none).
KernelName = Literal["triton", "vectorized-gpu", "sglang", "none"]
#: How the kernel ran: Triton compiled or interpreted, SGLang's torch reference or CUDA.
KernelMode = Literal["compiled", "interpreter", "reference", "cuda"]
#: A plan field of the reference/kernel comparison.
PlanValueName = Literal["verify slot", "prev slot", "expected token", "write seed"]


class SeverityCountsRecord(TypedDict):
    """Findings per severity."""

    error: int
    warning: int
    info: int


class CheckSummaryRecord(TypedDict):
    """Totals over every dump checked."""

    #: number of dumps on the command line
    dumps: int
    #: dumps with a finding at or above fail_on
    failed: int
    #: dumps that could not be read
    bad_input: int
    #: findings (groups) over all dumps
    findings: int
    #: cells (and rows, tensors) the findings stand for: the sum of their `count`
    cells: int
    #: cells per severity over all dumps
    by_severity: SeverityCountsRecord
    #: over all dumps; only codes that occur
    counts: dict[FindingCode, int]


class GroupRecord(TypedDict):
    """How one group was planned, and how the kernel compared with the reference."""

    #: the group planned
    group: GroupName
    #: W used for this group (0 for full)
    window: int
    #: verify entries requested (reference plan)
    total_verify: int
    #: capacity used (recorded, or total_verify)
    verify_capacity: int
    #: 0: the verify launch is skipped (overflow)
    enable: Literal[0, 1]
    #: the planner that stood in for the GPU path (--kernel triton | vectorized | sglang |
    #: none)
    kernel: KernelName
    #: plan values where reference and kernel differ, by the finding code explaining them
    explained_differences: dict[FindingCode, int]
    #: the same per plan field (verify slot, prev slot, expected token, write seed)
    explained_by_field: dict[FindingCode, dict[PlanValueName, int]]
    #: = the kernel-divergence findings of this group
    unexplained_differences: int
    #: the error the kernel's launch raised: production's GPU path refusing the batch, or,
    #: for --kernel sglang, SGLang's own exception text
    kernel_launch_error: str | None


class ScalarRecord(TypedDict):
    """A scalar as the check used it."""

    name: str
    value: int | None
    origin: ScalarOrigin
    #: metadata, tensor, command line, default or derived (...)
    source: str


class AssumptionRecord(TypedDict):
    """A derived scalar some findings rest on."""

    scalar: str
    value: int | None
    source: str
    #: findings that rest on the derived value
    decides: dict[FindingCode, int]
    #: what to record (or pass) to decide them
    advice: str


class CauseRecord(TypedDict):
    """A diagnosis: what went wrong upstream of a group of findings, and what to fix."""

    #: docs/findings.md, "Diagnosis"
    cause: CauseCode
    confidence: Confidence
    summary: str
    #: the facts that point to it
    evidence: list[str]
    #: findings it accounts for (their `cause`)
    explains: dict[FindingCode, int]
    fix: str
    #: the cause whose fault left these symptoms too (a chain, docs/findings.md "Chains");
    #: null for a top-level cause
    explained_by: CauseCode | None
    #: for a parent: one line per cause it explains (codes, counts, where)
    also_shows: list[str]


class FirstRaiseRecord(TypedDict):
    """Where SGLang's torch reference raises first, and the finding it marks."""

    group: GroupName
    #: upstream's exception, verbatim
    exception_type: str
    message: str
    code: FindingCode
    batch_row: int
    position: int


class RequestRecord(TypedDict):
    """A batch row with findings."""

    batch_row: int
    pool_row: int
    prefix_len: int
    extend_len: int
    #: findings at this batch row
    counts: dict[FindingCode, int]
    first_bad_position: int | None


class CodeCountRecord(TypedDict):
    """Findings of one code, group and severity."""

    code: FindingCode
    severity: Severity
    group: GroupName
    count: int


class DumpRecord(TypedDict):
    """Everything `check` found in one dump."""

    #: the dump's path, as given (normalised)
    path: str
    #: identity keys the dump records (sglang.version, sglang.commit, model, rank, step,
    #: forward_mode, captured_at, note); {} when unreadable
    identity: dict[str, str]
    #: 0 when unreadable
    bs: int
    #: from the most severe finding
    verdict: DumpVerdict
    #: true if some finding reaches fail_on
    fails: bool
    #: the reading error, for an unreadable dump
    error: str | None
    #: --kernel triton: Triton's mode; --kernel sglang: SGLang's torch reference or its CUDA
    #: kernels; null for --kernel vectorized|none
    kernel_mode: KernelMode | None
    #: a shrunk dump (format 1.1 or 1.2): where it came from
    shrunk: ShrunkRecord | None
    #: reading notes: ignored tensors, ignored valid_lens, ...
    notes: list[str]
    #: in planning order (by default full, then swa)
    groups: list[GroupRecord]
    #: every scalar as the check used it
    scalars: list[ScalarRecord]
    #: derived scalars some findings rest on (those findings are info)
    assumptions: list[AssumptionRecord]
    #: most likely first; [] without findings
    diagnosis: list[CauseRecord]
    #: where SGLang's torch reference raises first
    first_raise: FirstRaiseRecord | None
    #: "Type: message" the capture hook stored in `note`
    recorded_exception: str | None
    #: it is the first raise above (null: none)
    recorded_exception_matches: bool | None
    #: only rows with findings
    requests: list[RequestRecord]
    #: one per (code, group, severity) that occurs: severity, then code order, then group
    counts: list[CodeCountRecord]
    #: = len(findings)
    findings_total: int
    #: every finding; never truncated
    findings: list[FindingRecord]


class CheckRecord(TypedDict):
    """`kvcanary check --format json`."""

    schema: Literal["kvcanary.check/2"]
    kvcanary_version: str
    fail_on: Severity
    #: the SGLang version installed where check ran ("unknown": importable without package
    #: metadata); null when not installed. Each dump's identity holds the version it was
    #: recorded with
    sglang_installed: str | None
    #: the exit code in words: bad-input 2, findings 1, clean 0
    verdict: Literal["clean", "findings", "bad-input"]
    summary: CheckSummaryRecord
    #: in the order given on the command line
    dumps: list[DumpRecord]


def _group(group: GroupSummary) -> GroupRecord:
    def by_code(codes: dict[str, int] | dict[str, dict[str, int]]) -> list[str]:
        return sorted(codes, key=lambda c: code_order(FindingCode(c)))

    return {
        "group": group_name(group.group),
        "window": group.window,
        "total_verify": group.total_verify,
        "verify_capacity": group.verify_capacity,
        "enable": cast(Literal[0, 1], group.enable),
        "kernel": cast(KernelName, group.kernel),
        "explained_differences": code_counts(
            {k: group.explained_differences[k] for k in by_code(group.explained_differences)}
        ),
        "explained_by_field": cast(
            dict[FindingCode, dict[PlanValueName, int]],
            {k: dict(group.explained_by_field[k]) for k in by_code(group.explained_by_field)},
        ),
        "unexplained_differences": group.unexplained_differences,
        "kernel_launch_error": group.kernel_launch_error,
    }


def _counts(findings: tuple[Finding, ...]) -> list[CodeCountRecord]:
    """Per (code, group, severity): a code is `info` where its findings rest on assumptions."""
    counter: Counter[tuple[FindingCode, str, Severity]] = Counter()
    for f in findings:  # a finding group counts its cells
        counter[(f.code, f.group, f.severity)] += f.count
    return [
        {
            "code": code,
            "severity": severity,
            "group": group_name(group),
            "count": n,
        }
        for (code, group, severity), n in sorted(
            counter.items(),
            key=lambda item: (*code_order(item[0][0], item[0][1]), -item[0][2].rank),
        )
    ]


def _cause(cause: Cause) -> CauseRecord:
    return {
        "cause": cause.code,
        "confidence": cause.confidence,
        "summary": cause.summary,
        "evidence": list(cause.evidence),
        "explains": code_counts(cause.explains),
        "fix": cause.fix,
        "explained_by": cause.explained_by,
        "also_shows": list(cause.also_shows),
    }


def _request(request: RequestSummary) -> RequestRecord:
    return {
        "batch_row": request.batch_row,
        "pool_row": request.pool_row,
        "prefix_len": request.prefix_len,
        "extend_len": request.extend_len,
        "counts": code_counts(request.counts),
        "first_bad_position": request.first_bad_position,
    }


def _first_raise(raised: FirstRaise | None) -> FirstRaiseRecord | None:
    if raised is None:
        return None
    return {
        "group": group_name(raised.group),
        "exception_type": raised.exception_type,
        "message": raised.message,
        "code": raised.code,
        "batch_row": raised.batch_row,
        "position": raised.position,
    }


def dump_verdict(dump: DumpReport) -> DumpVerdict:
    """`bad-input` when unreadable, else the worst severity found: errors, warnings or clean."""
    if dump.error is not None:
        return "bad-input"
    worst = dump.worst()
    if worst is Severity.ERROR:
        return "errors"
    if worst is Severity.WARNING:
        return "warnings"
    return "clean"


def _dump(dump: DumpReport, fail_on: Severity, findings: bool = True) -> DumpRecord:
    return {
        "path": dump.path,
        "identity": identity_record(dump.identity),
        "bs": dump.bs,
        "verdict": dump_verdict(dump),
        "fails": dump.fails(fail_on),
        "error": dump.error,
        "kernel_mode": cast(KernelMode | None, dump.kernel_mode),
        "shrunk": shrunk_record(dump.shrink, dump.path),
        "notes": list(dump.notes),
        "groups": [_group(g) for g in dump.groups],
        "scalars": [
            {
                "name": v.name,
                "value": v.value,
                "origin": cast(ScalarOrigin, v.origin),
                "source": v.source,
            }
            for v in dump.scalars
        ],
        "assumptions": [
            {
                "scalar": a.scalar,
                "value": a.value,
                "source": a.source,
                "decides": code_counts(a.decides),
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
        "findings": findings_record(dump.findings) if findings else [],
    }


def check_record(report: CheckReport, *, findings: bool = True) -> CheckRecord:
    """The `kvcanary.check/2` record of a check.

    `findings=False` leaves each dump's `findings` list empty (its counts, diagnosis and
    totals stay): what the verdict lines read, without a record per finding and cell.

    `verdict` mirrors the exit code: `bad-input` (2) when a dump could not be read, else
    `findings` (1) when a finding reaches `fail_on`, else `clean` (0).
    """
    every = tuple(f for d in report.dumps for f in d.findings)
    by_code: Counter[FindingCode] = Counter()
    by_severity: Counter[Severity] = Counter()
    for f in every:  # cells, not records: a group of 15 bad cells is 15
        by_code[f.code] += f.count
        by_severity[f.severity] += f.count
    verdict: Literal["clean", "findings", "bad-input"] = "clean"
    if report.bad_input:
        verdict = "bad-input"
    elif report.failed:
        verdict = "findings"
    return {
        "schema": CHECK_SCHEMA,
        "kvcanary_version": kvcanary_cli.__version__,
        "fail_on": report.fail_on,
        "sglang_installed": report.sglang_installed,
        "verdict": verdict,
        "summary": {
            "dumps": len(report.dumps),
            "failed": sum(d.fails(report.fail_on) for d in report.dumps),
            "bad_input": sum(d.error is not None for d in report.dumps),
            "findings": len(every),
            "cells": sum(f.count for f in every),
            "by_severity": {
                "error": by_severity[Severity.ERROR],
                "warning": by_severity[Severity.WARNING],
                "info": by_severity[Severity.INFO],
            },
            "counts": {c: by_code[c] for c in FindingCode if by_code[c]},
        },
        "dumps": [_dump(d, report.fail_on, findings) for d in report.dumps],
    }
