"""The `kvcanary.violations/1` record (violation rows, replay, diagnoses): its declaration, and
`violations_record`, the one place it is built (docs/canary.md §4 and §7).

The record keeps paths and metadata as they are (JSON is exact); the views make it printable.
Summary counts come from the report's columns (numpy, no work per row); only the rows shown get
a dict each.
"""

from __future__ import annotations

from typing import Literal, TypedDict, cast

import numpy as np

import kvcanary_cli
from kvcanary_cli.canary.constants import (
    FailReason,
    buffer_of_tag,
    canary_kind,
    group_of_tag,
    is_write,
    reason_labels,
    tag_label,
)
from kvcanary_cli.catalog import ViolationRowCause
from kvcanary_cli.render.records.common import GroupName, SpaceName, group_name
from kvcanary_cli.results.cells import SlotProvenance
from kvcanary_cli.results.violations import CAUSES, ViolationsReport, explanation_text

__all__ = [
    "VIOLATIONS_SCHEMA",
    "BufferName",
    "ExplanationRecord",
    "RowOrigin",
    "SourceRecord",
    "ViolationRowRecord",
    "ViolationsRecord",
    "violations_record",
]

VIOLATIONS_SCHEMA: Literal["kvcanary.violations/1"] = "kvcanary.violations/1"
#: Where a row was read: a dump's ring, a log line, a log message rebuilt from a message whose
#: first line was missing, or the replay.
RowOrigin = Literal["ring", "log", "log-message", "replay"]
_ORIGINS: tuple[RowOrigin, ...] = ("ring", "log", "log-message", "replay")
#: A canary buffer of a group.
BufferName = Literal["head.k", "head.v", "tail.k", "tail.v"]


class FiltersRecord(TypedDict):
    """The --group and --buffer filters."""

    group: GroupName | None
    buffer: str | None


class ViolationsSummaryRecord(TypedDict):
    """Counts over every row."""

    #: every row read or replayed
    rows: int
    #: ring, log, log-message, replay
    by_origin: dict[RowOrigin, int]
    #: by tag label (HEAD_K_FULL, ...)
    by_tag: dict[str, int]
    #: verify_position, ... (rows with that bit)
    by_reason: dict[str, int]
    #: {} without a dump
    by_cause: dict[str, int]


class RingRecord(TypedDict):
    """A dump's violation ring as decoded."""

    capacity: int
    write_index: int
    valid: int
    overflow: bool
    wrapped: bool
    stray_rows: int


class SwaDivergenceRecord(TypedDict):
    """The kv_canary_swa_divergence= samples of a log."""

    samples: int
    #: the last sample's values, by key
    last: dict[str, int]
    peak_swa_full_idx_divergence: int
    peak_swa_out_of_window_tokens: int


class LogRecord(TypedDict):
    """What the parser met in a log (docs/canary.md §6)."""

    lines: int
    structured: int
    messages: int
    rebuilt: int
    unparsed: int
    incomplete: int
    inconsistent: int
    overlong: int
    #: violations begun but not readable (cut short, garbled): exit 1
    unread_violations: int
    swa_divergence: SwaDivergenceRecord | None


class SourceRecord(TypedDict):
    """One SOURCE of the command: a dump (its ring) or a log."""

    #: as given; "-" for stdin
    path: str
    kind: Literal["dump", "log"]
    #: rows it gave, after the filters
    rows: int
    #: a dump's ring
    ring: RingRecord | None
    log: LogRecord | None
    notes: list[str]


class ReplayRecord(TypedDict):
    """One replayed verify launch."""

    group: GroupName
    buffer: str
    tag: str
    #: verify entries of the plan (0: not launched)
    entries: int
    #: checked, and skipped as slot 0
    checked: int
    slot_zero: int
    #: checked without a chain check (prev slot 0)
    chain_skipped: int
    #: left out (canary.md §5)
    outside_buffer: int
    undefined: int
    real_kv: Literal["checked", "zero", "skipped"]
    rows: int


class ReplayComparisonRecord(TypedDict):
    """Replayed rows against the rows read, as multisets of the 8 fields."""

    matched: int
    observed_only: int
    replayed_only: int


class PumpRecord(TypedDict):
    """A log message's last line."""

    total_violations: int
    ring_overflow: bool
    step_when_pumped: int


class EntryRecord(TypedDict):
    """A replayed row's failing verify entry."""

    batch_row: int
    expected_position: int
    prev_slot: int


class ReferenceRecord(TypedDict):
    """The verify cell that read the slot."""

    pool_row: int | None
    position: int | None
    batch_row: int | None


class OwnerRecord(TypedDict):
    """A cell holding the slot at the stored position."""

    pool_row: int | None
    position: int | None
    where: Literal["none", "live", "stale-tail", "idle-row"]


class ExplanationRecord(TypedDict):
    """The facts behind a row's diagnosis."""

    #: canary.md §7
    cause: ViolationRowCause
    #: the slot's pool
    space: SpaceName
    #: the verify cell that read it
    referenced_by: ReferenceRecord | None
    #: a cell holding the slot at the stored position
    owner: OwnerRecord | None
    #: the slot before the verify cell
    prev_slot: int | None
    #: null: no free list for this space in the dump
    allocator: Literal["free", "in use", "beyond the pool"] | None


class ViolationRowRecord(TypedDict):
    """One violation row: the 8 ring fields (as signed int64) and what they mean."""

    #: the 8 ring fields, kernel_kind .. fail_reason_bits, as signed int64
    kernel_kind: int
    slot_idx: int
    position: int
    stored_token: int
    expected_token: int
    stored_chain_hash: int
    expected_aux: int
    fail_reason_bits: int
    #: log-message: rebuilt from a message whose first line was missing
    origin: RowOrigin
    #: the source's path, or "replay"
    source: str
    #: ring row, 1-based log line, or verify entry
    index: int
    #: HEAD_K_FULL, ..., or unknown(N)
    tag: str
    #: per_forward_head_k_full, sweep_k_swa, ...
    canary_kind: str
    #: null for an unknown tag
    group: GroupName | None
    buffer: BufferName | None
    #: labels of the known bits, ascending
    reasons: list[str]
    is_write: bool
    #: from the message's last line (logs only)
    pump: PumpRecord | None
    #: replayed rows: the failing verify entry
    entry: EntryRecord | None
    #: the one-line explanation (with a dump)
    diagnosis: str | None
    #: the facts behind it; null without a dump
    explanation: ExplanationRecord | None


class ViolationsRecord(TypedDict):
    """`kvcanary violations --format json`."""

    schema: Literal["kvcanary.violations/1"]
    kvcanary_version: str
    #: the exit code in words: 1 (rows; or no row, but violations logged unreadable) or 0
    verdict: Literal["violations", "unreadable", "clean"]
    #: violations the logs began that gave no row (cut short, garbled; docs/canary.md §6)
    unread_violations: int
    #: the dump rows are explained against
    dump: str | None
    #: that dump's identity keys; {} without one
    identity: dict[str, str]
    filters: FiltersRecord
    summary: ViolationsSummaryRecord
    #: in command-line order
    sources: list[SourceRecord]
    #: --replay: one per buffer, in launch order
    replay: list[ReplayRecord]
    #: --replay with rows read: multisets of the 8 fields
    comparison: ReplayComparisonRecord | None
    notes: list[str]
    rows_total: int
    #: sources in order, then the replay
    rows: list[ViolationRowRecord]
    #: the rows' first 64 distinct slots; [] without a dump
    slots: list[SlotProvenance]
    #: distinct slots in the rows
    slots_total: int


def _row(report: ViolationsReport, i: int) -> ViolationRowRecord:
    rows = report.rows
    fields = [int(v) for v in rows.fields[i]]
    tag, bits = fields[0], fields[7]
    source = int(rows.source[i])
    pumped = int(rows.total_violations[i]) >= 0
    replayed = int(rows.batch_row[i]) >= 0
    why = report.explanations
    group = group_of_tag(tag)
    return {
        "kernel_kind": fields[0],
        "slot_idx": fields[1],
        "position": fields[2],
        "stored_token": fields[3],
        "expected_token": fields[4],
        "stored_chain_hash": fields[5],
        "expected_aux": fields[6],
        "fail_reason_bits": fields[7],
        "origin": _ORIGINS[int(rows.origin[i])],
        "source": report.sources[source].path if source >= 0 else "replay",
        "index": int(rows.index[i]),
        "tag": tag_label(tag),
        "canary_kind": canary_kind(tag),
        "group": None if group is None else group_name(group),
        "buffer": cast(BufferName | None, buffer_of_tag(tag)),
        "reasons": reason_labels(bits),
        "is_write": is_write(bits),
        "pump": {
            "total_violations": int(rows.total_violations[i]),
            "ring_overflow": bool(rows.ring_overflow[i] == 1),
            "step_when_pumped": int(rows.step_when_pumped[i]),
        }
        if pumped
        else None,
        "entry": {
            "batch_row": int(rows.batch_row[i]),
            "expected_position": int(rows.expected_position[i]),
            "prev_slot": int(rows.prev_slot[i]),
        }
        if replayed
        else None,
        "diagnosis": None if why is None else explanation_text(why, i, rows.fields[i]),
        # the same facts are a canary finding's `details.explanation` (JSON by design there)
        "explanation": None if why is None else cast(ExplanationRecord, why.facts(i)),
    }


def _source(report: ViolationsReport, i: int) -> SourceRecord:
    s = report.sources[i]
    log: LogRecord | None = None
    if s.log is not None:
        swa = s.log.swa_divergence
        log = {
            "lines": s.log.lines,
            "structured": s.log.structured,
            "messages": s.log.messages,
            "rebuilt": s.log.rebuilt,
            "unparsed": s.log.unparsed,
            "incomplete": s.log.incomplete,
            "inconsistent": s.log.inconsistent,
            "overlong": s.log.overlong,
            "unread_violations": s.log.unread,
            "swa_divergence": None
            if swa is None
            else {
                "samples": swa.samples,
                "last": swa.last,
                "peak_swa_full_idx_divergence": swa.peak_swa_full_idx_divergence,
                "peak_swa_out_of_window_tokens": swa.peak_swa_out_of_window_tokens,
            },
        }
    ring = s.ring
    return {
        "path": s.path,
        "kind": cast(Literal["dump", "log"], s.kind),
        "rows": s.rows,
        "ring": None
        if ring is None
        else {
            "capacity": ring.capacity,
            "write_index": ring.write_index,
            "valid": ring.valid,
            "overflow": ring.overflow,
            "wrapped": ring.wrapped,
            "stray_rows": ring.stray_rows,
        },
        "log": log,
        "notes": list(s.notes),
    }


def _summary(report: ViolationsReport) -> ViolationsSummaryRecord:
    """Counts over every row, from the columns (no per-row work)."""
    rows = report.rows
    tags, tag_counts = np.unique(rows.tag, return_counts=True)
    origins = np.bincount(rows.origin, minlength=len(_ORIGINS))
    by_reason = {
        label: int(np.count_nonzero(rows.bits & int(bit)))
        for bit, label in ((b, reason_labels(int(b))[0]) for b in FailReason)
        if np.any(rows.bits & int(bit))
    }
    by_cause: dict[str, int] = {}
    if report.explanations is not None:
        counts = np.bincount(report.explanations.cause, minlength=len(CAUSES))
        by_cause = {CAUSES[i].value: int(n) for i, n in enumerate(counts) if n}
    return {
        "rows": len(rows),
        "by_origin": {name: int(n) for name, n in zip(_ORIGINS, origins, strict=False) if n},
        "by_tag": dict(
            sorted((tag_label(int(t)), int(n)) for t, n in zip(tags, tag_counts, strict=True))
        ),
        "by_reason": dict(sorted(by_reason.items())),
        "by_cause": dict(sorted(by_cause.items())),
    }


def violations_record(report: ViolationsReport, *, max_rows: int | None = None) -> ViolationsRecord:
    """The `kvcanary.violations/1` record; `max_rows` caps `rows` (None: every row)."""
    total = len(report.rows)
    shown = total if max_rows is None else min(total, max(max_rows, 0))
    return {
        "schema": VIOLATIONS_SCHEMA,
        "kvcanary_version": kvcanary_cli.__version__,
        "verdict": "violations" if total else "unreadable" if report.unread else "clean",
        "unread_violations": report.unread,
        "dump": report.dump,
        "identity": dict(report.identity),
        "filters": {
            "group": None if report.group is None else group_name(report.group),
            "buffer": report.buffer,
        },
        "summary": _summary(report),
        "sources": [_source(report, i) for i in range(len(report.sources))],
        "replay": [
            {
                "group": group_name(r.group),
                "buffer": r.buffer,
                "tag": tag_label(r.tag),
                "entries": r.entries,
                "checked": r.checked,
                "slot_zero": r.slot_zero,
                "chain_skipped": r.chain_skipped,
                "outside_buffer": r.outside_buffer,
                "undefined": r.undefined,
                "real_kv": cast(Literal["checked", "zero", "skipped"], r.real_kv),
                "rows": r.rows,
            }
            for r in report.replay
        ],
        "comparison": None
        if report.comparison is None
        else {
            "matched": report.comparison.matched,
            "observed_only": report.comparison.observed_only,
            "replayed_only": report.comparison.replayed_only,
        },
        "notes": list(report.notes),
        "rows_total": total,
        "rows": [_row(report, i) for i in range(shown)],
        "slots": list(report.slots),
        "slots_total": report.slots_total,
    }
