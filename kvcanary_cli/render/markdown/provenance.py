"""The Markdown view of a `kvcanary.provenance/2` report: the slot's cells or the row's map,
and the findings touching it."""

from __future__ import annotations

from kvcanary_cli.render.console import plural
from kvcanary_cli.render.markdown.blocks import code as _code
from kvcanary_cli.render.markdown.blocks import table as _table
from kvcanary_cli.render.markdown.blocks import text as _text
from kvcanary_cli.render.markdown.common import identity_table, provenance_body, reproduce
from kvcanary_cli.render.phrases.check import finding_words
from kvcanary_cli.render.phrases.provenance import row_lines, row_notices
from kvcanary_cli.render.phrases.shrink import shrunk_lines
from kvcanary_cli.results.provenance import ProvenanceReport, RowGap, RowMap
from kvcanary_cli.safe_text import printable_record

__all__ = ["provenance_markdown"]


def _row_section(row: RowMap) -> list[str]:
    batch_rows = ", ".join(map(str, row.batch_rows)) or "none (idle)"
    facts = [
        f"batch rows: {batch_rows}",
        f"group: {_code(row.group, cell=False)}",
        f"prefix P: {_text(row.prefix_len)}, extend E: {_text(row.extend_len)}, "
        f"window start: {_text(row.window_start)}",
        f"filled positions: {row.filled} of max_seq_len {row.max_seq_len}",
    ]
    facts.extend(f"**{_text(notice)}**" for notice in row_notices(row))
    rows = [
        ["⋯", "⋯", f"*positions {c.start}..{c.end - 1} not shown ({c.filled} filled)*", "", ""]
        if isinstance(c, RowGap)
        else [
            str(c.position),
            str(c.slot),
            _text(c.role) + (" (seed)" if c.seed else ""),
            _text(c.swa_slot),
            ", ".join(_code(m) for m in c.marks) or "",
        ]
        for c in row_lines(row)
    ]
    return [
        f"### Pool row {row.pool_row}",
        "\n".join(f"- {fact}" for fact in facts),
        _table(["position", "slot", "role", "swa slot", "marks"], rows, right={0, 1, 3}),
    ]


def provenance_markdown(report: ProvenanceReport, *, max_rows: int = 256) -> str:
    """A `kvcanary.provenance/2` report as Markdown: the slot's cells or the row's map, and
    the first `max_rows` findings touching it."""
    report = printable_record(report)
    parts = [
        f"## kvcanary provenance: {_code(report.path, cell=False)}",
        identity_table(report.identity),
    ]
    if report.shrunk is not None:
        parts.append("\n".join(f"- {_text(line)}" for line in shrunk_lines(report.shrunk)))
        parts.append(reproduce(report.shrunk))
    if report.slot is not None:
        prov = report.slot
        parts.append(f"### {prov.space.upper()} slot {prov.slot}")
        parts.extend(provenance_body(prov))
    if report.row is not None:
        parts.extend(_row_section(report.row))
    findings = report.findings  # already in report order
    parts.append("### Findings touching it")
    if findings:
        parts.append(
            _table(
                [
                    "code",
                    "severity",
                    "group",
                    "cells",
                    "slots",
                    "batch rows",
                    "positions",
                    "role",
                    "message",
                ],
                [
                    [
                        _code(f.code),
                        f.severity,
                        _code(f.group),
                        str(f.count),
                        _text(words.slots),
                        _text(words.rows),
                        _text(words.positions),
                        _text(words.role),
                        _text(f.message + (f" ({e})" if (e := words.examples) else "")),
                    ]
                    for f, words in ((f, finding_words(f)) for f in findings[:max_rows])
                ],
                right={3},
            )
        )
        if len(findings) > max_rows:
            more = plural(len(findings) - max_rows, "more finding")
            parts.append(f"*… and {more} (`--max-rows`; `--format json` lists them all)*")
    else:
        parts.append("None.")
    return "\n\n".join(parts) + "\n"
