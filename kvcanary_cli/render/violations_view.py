"""Views of a `violations` report: the `kvcanary.violations/1` record, a terminal table and
Markdown, the last two drawn from the record (docs/json-schema.md, docs/canary.md §7).

The record keeps paths and metadata as they are (JSON is exact); both views make it printable
first (`safe_text.printable_record`), so a file name cannot reach the terminal as control
characters.
"""

from __future__ import annotations

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

import kvcanary_cli
from kvcanary_cli.analysis.violations.report import CAUSES, ViolationsReport, explanation_text
from kvcanary_cli.canary.constants import (
    VIOLATION_FIELDS,
    FailReason,
    buffer_of_tag,
    canary_kind,
    group_of_tag,
    hex64,
    is_write,
    reason_labels,
    tag_label,
)
from kvcanary_cli.render.markdown import code as _code
from kvcanary_cli.render.markdown import table as _md_table
from kvcanary_cli.render.markdown import text as _md_text
from kvcanary_cli.render.records import Record, plural, slot_provenance_record
from kvcanary_cli.safe_text import printable_record

__all__ = ["VIOLATIONS_SCHEMA", "violations_markdown", "violations_record", "violations_table"]

VIOLATIONS_SCHEMA = "kvcanary.violations/1"
_ORIGINS = ("ring", "log", "log-message", "replay")


def _row(report: ViolationsReport, i: int) -> Record:
    rows = report.rows
    fields = [int(v) for v in rows.fields[i]]
    tag, bits = fields[0], fields[7]
    source = int(rows.source[i])
    pumped = int(rows.total_violations[i]) >= 0
    replayed = int(rows.batch_row[i]) >= 0
    why = report.explanations
    return {
        **dict(zip(VIOLATION_FIELDS, fields, strict=True)),
        "origin": _ORIGINS[int(rows.origin[i])],
        "source": report.sources[source].path if source >= 0 else "replay",
        "index": int(rows.index[i]),
        "tag": tag_label(tag),
        "canary_kind": canary_kind(tag),
        "group": group_of_tag(tag),
        "buffer": buffer_of_tag(tag),
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
        "explanation": None if why is None else why.facts(i),
    }


def _source(report: ViolationsReport, i: int) -> Record:
    s = report.sources[i]
    log: Record | None = None
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
        "kind": s.kind,
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


def _summary(report: ViolationsReport) -> Record:
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


def violations_record(report: ViolationsReport, *, max_rows: int | None = None) -> Record:
    """The `kvcanary.violations/1` record; `max_rows` caps `rows` (None: every row)."""
    total = len(report.rows)
    shown = total if max_rows is None else min(total, max(max_rows, 0))
    return {
        "schema": VIOLATIONS_SCHEMA,
        "kvcanary_version": kvcanary_cli.__version__,
        "verdict": "violations" if total else "clean",
        "dump": report.dump,
        "identity": dict(report.identity),
        "filters": {"group": report.group, "buffer": report.buffer},
        "summary": _summary(report),
        "sources": [_source(report, i) for i in range(len(report.sources))],
        "replay": [
            {
                "group": r.group,
                "buffer": r.buffer,
                "tag": tag_label(r.tag),
                "entries": r.entries,
                "checked": r.checked,
                "slot_zero": r.slot_zero,
                "chain_skipped": r.chain_skipped,
                "outside_buffer": r.outside_buffer,
                "undefined": r.undefined,
                "real_kv": r.real_kv,
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
        "slots": [slot_provenance_record(p) for p in report.slots],
        "slots_total": report.slots_total,
    }


# --- terminal ---------------------------------------------------------------------------


def _t(value: object, style: str = "") -> Text:
    return Text("-" if value is None else str(value), style=style)


def _source_detail(source: Record) -> str:
    if source["ring"] is not None:
        ring = source["ring"]
        detail = (
            f"ring: {ring['valid']} of {ring['capacity']} rows valid, write index "
            f"{ring['write_index']}"
        )
        return detail + (" (overflow)" if ring["overflow"] else "")
    if source["log"] is not None:
        log = source["log"]
        detail = (
            f"{plural(log['lines'], 'line')}: {plural(log['structured'], 'violation line')}, "
            f"{plural(log['messages'], 'full message')}, {log['unparsed']} unparsed"
        )
        if log["swa_divergence"] is not None:
            swa = log["swa_divergence"]
            detail += (
                f"; {plural(swa['samples'], 'SWA divergence sample')} (peak index divergence "
                f"{swa['peak_swa_full_idx_divergence']}, out of window "
                f"{swa['peak_swa_out_of_window_tokens']})"
            )
        return detail
    return "no violation ring"


def _reasons(row: Record) -> str:
    """Reason labels, shortened for a table (`verify_` dropped, `write_` kept)."""
    return ", ".join(label.removeprefix("verify_") for label in row["reasons"]) or "none"


def _cells(prov: Record) -> str:
    """A slot's first cells, condensed: `(row 9, pos 13) verify; +2 more`."""
    cells = [f"(row {c['pool_row']}, pos {c['position']}) {c['role']}" for c in prov["cells"][:3]]
    more = prov["cells_total"] - len(cells)
    if more > 0:
        cells.append(f"+{more} more")
    return "; ".join(cells) or "none"


def _slots_table(slots: list[Record]) -> Table:
    table = Table(title="slots", title_justify="left")
    for name in ("space", "slot", "allocator", "cells in req_to_token"):
        table.add_column(name, justify="right" if name == "slot" else "left")
    for prov in slots:
        table.add_row(
            _t(prov["space"]),
            _t(prov["slot"]),
            _t(prov["allocator"] or "unknown"),
            _t(_cells(prov)),
        )
    return table


def _row_table(rows: list[Record]) -> Table:
    table = Table(title="violation rows", title_justify="left")
    table.add_column("from")
    table.add_column("tag")
    table.add_column("slot", justify="right")
    table.add_column("pos", justify="right")
    table.add_column("token", justify="right")
    table.add_column("reasons")
    table.add_column("diagnosis")
    for r in rows:
        origin = "replay" if r["origin"] == "replay" else f"{r['origin']} {r['index']}"
        token = f"{r['stored_token']}"
        if r["expected_token"] != -1:
            token += f" / {r['expected_token']}"
        table.add_row(
            _t(origin),
            _t(r["tag"]),
            _t(r["slot_idx"]),
            _t(r["position"]),
            _t(token),
            _t(_reasons(r)),
            _t(r["diagnosis"] or f"prev hash {hex64(r['stored_chain_hash'])}"),
        )
    return table


def _replay_table(replay: list[Record]) -> Table:
    table = Table(title="replay", title_justify="left")
    for name in ("group", "buffer", "entries", "checked", "slot 0", "no chain check", "real KV"):
        table.add_column(
            name, justify="left" if name in ("group", "buffer", "real KV") else "right"
        )
    table.add_column("rows", justify="right")
    for r in replay:
        table.add_row(
            _t(r["group"]),
            _t(r["buffer"]),
            _t(r["entries"]),
            _t(r["checked"]),
            _t(r["slot_zero"]),
            _t(r["chain_skipped"]),
            _t(r["real_kv"]),
            _t(r["rows"]),
        )
    return table


def _comparison_line(comparison: Record) -> str:
    return (
        f"replay vs observed rows (as multisets): {comparison['matched']} matched, "
        f"{comparison['observed_only']} only observed, {comparison['replayed_only']} only replayed"
    )


def violations_table(record: Record, *, max_rows: int = 20) -> RenderableType:
    """Sources, replay, the first `max_rows` rows with their diagnosis, and notes."""
    record = printable_record(record)
    total = record["rows_total"]
    head = Text(
        f"VIOLATIONS: {plural(total, 'row')}" if total else "CLEAN: no violation rows",
        style="bold red" if total else "bold green",
    )
    by_origin = record["summary"]["by_origin"]
    if by_origin:
        head.append("  (" + ", ".join(f"{k} {v}" for k, v in by_origin.items()) + ")")
    parts: list[RenderableType] = [head]
    if record["dump"] is not None:
        parts.append(Text(f"  explained against {record['dump']}", style="dim"))
    sources = Table(title="sources", title_justify="left")
    for name in ("source", "kind", "rows", "read"):
        sources.add_column(name, justify="right" if name == "rows" else "left")
    for s in record["sources"]:
        sources.add_row(_t(s["path"]), _t(s["kind"]), _t(s["rows"]), _t(_source_detail(s)))
    if record["sources"]:
        parts.append(sources)
    if record["replay"]:
        parts.append(_replay_table(record["replay"]))
    if record["comparison"] is not None:
        parts.append(Text(_comparison_line(record["comparison"])))
    shown = record["rows"][: max(max_rows, 0)]
    if shown:
        parts.append(_row_table(shown))
    if total > len(shown):
        parts.append(Text(f"… and {total - len(shown)} more (--max-rows)"))
    if record["slots"]:
        parts.append(_slots_table(record["slots"][: max(max_rows, 0)]))
    notes = [n for s in record["sources"] for n in (f"{s['path']}: {x}" for x in s["notes"])]
    parts.extend(Text(f"  note: {note}", style="dim") for note in notes + record["notes"])
    return Group(*parts)


# --- Markdown ---------------------------------------------------------------------------


def violations_markdown(record: Record, *, max_rows: int = 20) -> str:
    """The record as a GitHub issue body."""
    record = printable_record(record)
    total = record["rows_total"]
    parts = [
        f"## kvcanary violations: {plural(total, 'row') if total else 'clean'}",
        f"kvcanary {record['kvcanary_version']} · `{record['schema']}`"
        + (f" · explained against {_code(record['dump'], cell=False)}" if record["dump"] else ""),
    ]
    if record["sources"]:
        parts.append(
            _md_table(
                ["source", "kind", "rows", "read"],
                [
                    [_code(s["path"]), s["kind"], str(s["rows"]), _md_text(_source_detail(s))]
                    for s in record["sources"]
                ],
                right={2},
            )
        )
    if record["replay"]:
        parts.append(
            _md_table(
                [
                    "group",
                    "buffer",
                    "entries",
                    "checked",
                    "slot 0",
                    "no chain check",
                    "real KV",
                    "rows",
                ],
                [
                    [
                        _code(r["group"]),
                        _code(r["buffer"]),
                        str(r["entries"]),
                        str(r["checked"]),
                        str(r["slot_zero"]),
                        str(r["chain_skipped"]),
                        r["real_kv"],
                        str(r["rows"]),
                    ]
                    for r in record["replay"]
                ],
                right={2, 3, 4, 5, 7},
            )
        )
    if record["comparison"] is not None:
        parts.append(_comparison_line(record["comparison"]))
    shown = record["rows"][: max(max_rows, 0)]
    if shown:
        parts.append(
            _md_table(
                [
                    "from",
                    "tag",
                    "slot",
                    "position",
                    "token",
                    "prev hash",
                    "expected aux",
                    "reasons",
                    "diagnosis",
                ],
                [
                    [
                        _md_text(
                            r["origin"]
                            if r["origin"] == "replay"
                            else f"{r['origin']} {r['index']}"
                        ),
                        _code(r["tag"]),
                        str(r["slot_idx"]),
                        str(r["position"]),
                        f"{r['stored_token']} / {r['expected_token']}",
                        _code(hex64(r["stored_chain_hash"])),
                        _code(hex64(r["expected_aux"]) if not r["is_write"] else r["expected_aux"]),
                        _md_text(" ".join(r["reasons"]) or "none"),
                        _md_text(r["diagnosis"]),
                    ]
                    for r in shown
                ],
                right={2, 3},
            )
        )
    if total > len(shown):
        parts.append(f"… and {total - len(shown)} more")
    if record["slots"]:
        parts.append(
            _md_table(
                ["space", "slot", "allocator", "cells in req_to_token"],
                [
                    [p["space"], str(p["slot"]), _md_text(p["allocator"]), _md_text(_cells(p))]
                    for p in record["slots"][: max(max_rows, 0)]
                ],
                right={1},
            )
        )
    notes = [f"{s['path']}: {x}" for s in record["sources"] for x in s["notes"]] + record["notes"]
    if notes:
        parts.append("\n".join(f"- note: {_md_text(n)}" for n in notes))
    return "\n\n".join(parts) + "\n"
