"""The Markdown view of a violations report: a GitHub issue body."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcanary_cli.canary.constants import hex64
from kvcanary_cli.render.console import plural
from kvcanary_cli.render.markdown.blocks import code as _code
from kvcanary_cli.render.markdown.blocks import table as _md_table
from kvcanary_cli.render.markdown.blocks import text as _md_text
from kvcanary_cli.render.phrases.violations import (
    REPLAY_NOTE,
    reasons_text,
    replay_comparison_line,
    slot_cells_text,
    source_detail,
)
from kvcanary_cli.safe_text import printable_record

if TYPE_CHECKING:  # the rows are numpy columns: `--help` does not import them
    from kvcanary_cli.results.violations import ViolationsReport

__all__ = ["violations_markdown"]

_REPLAY_HEADER = [
    "group",
    "buffer",
    "entries",
    "checked",
    "slot 0",
    "no chain check",
    "real KV",
    "rows",
]
_ROW_HEADER = [
    "from",
    "tag",
    "slot",
    "position",
    "token",
    "prev hash",
    "expected aux",
    "reasons",
    "diagnosis",
]


def violations_markdown(report: ViolationsReport, *, max_rows: int = 20) -> str:
    """The report as a GitHub issue body."""
    report = printable_record(report)
    total, unread = len(report.rows), report.unread_violations
    if total:
        verdict = plural(total, "row") + (f" ({unread} more unreadable)" if unread else "")
    elif unread:
        verdict = f"unreadable ({plural(unread, 'violation')} cut short or garbled)"
    else:
        verdict = "clean"
    parts = [
        f"## kvcanary violations: {verdict}",
        f"kvcanary {report.kvcanary_version} · `{report.SCHEMA}`"
        + (f" · explained against {_code(report.dump, cell=False)}" if report.dump else ""),
    ]
    if report.sources:
        parts.append(
            _md_table(
                ["source", "kind", "rows", "read"],
                [
                    [_code(s.path), str(s.kind), str(s.rows), _md_text(source_detail(s))]
                    for s in report.sources
                ],
                right={2},
            )
        )
    if report.replay:
        replay = [
            [
                _code(r.group),
                _code(r.buffer),
                *map(str, (r.entries, r.checked, r.slot_zero, r.chain_skipped)),
                r.real_kv,
                str(r.rows),
            ]
            for r in report.replay
        ]
        parts.append(_md_table(_REPLAY_HEADER, replay, right={2, 3, 4, 5, 7}))
        parts.append(f"*{_md_text(REPLAY_NOTE)}*")
    if report.comparison is not None:
        parts.append(replay_comparison_line(report.comparison))
    shown = [printable_record(row) for row in report.rows.head(max_rows)]
    if shown:
        rows = [
            [
                _md_text(r.origin if r.origin == "replay" else f"{r.origin} {r.index}"),
                _code(r.tag),
                str(r.slot_idx),
                str(r.position),
                f"{r.stored_token} / {r.expected_token}",
                _code(hex64(r.stored_chain_hash)),
                _code(hex64(r.expected_aux) if not r.is_write else r.expected_aux),
                _md_text(reasons_text(r.reasons)),
                _md_text(r.diagnosis),
            ]
            for r in shown
        ]
        parts.append(_md_table(_ROW_HEADER, rows, right={2, 3}))
    if total > len(shown):
        parts.append(f"… and {total - len(shown)} more")
    if report.slots:
        slots = [
            [p.space, str(p.slot), _md_text(p.allocator), _md_text(slot_cells_text(p))]
            for p in report.slots[: max(max_rows, 0)]
        ]
        parts.append(
            _md_table(["space", "slot", "allocator", "cells in req_to_token"], slots, right={1})
        )
    notes = [f"{s.path}: {x}" for s in report.sources for x in s.notes] + list(report.notes)
    if notes:
        parts.append("\n".join(f"- note: {_md_text(n)}" for n in notes))
    return "\n\n".join(parts) + "\n"
