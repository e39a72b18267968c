"""The Markdown view of a `kvcanary.violations/1` record: a GitHub issue body."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcanary_cli.canary.constants import hex64
from kvcanary_cli.render.markdown.blocks import code as _code
from kvcanary_cli.render.markdown.blocks import table as _md_table
from kvcanary_cli.render.markdown.blocks import text as _md_text
from kvcanary_cli.render.phrases.violations import (
    REPLAY_NOTE,
    replay_comparison_line,
    slot_cells_text,
    source_detail,
)
from kvcanary_cli.render.shared import plural
from kvcanary_cli.safe_text import printable_record

if TYPE_CHECKING:  # the record's module builds it with numpy
    from kvcanary_cli.render.records.violations import ViolationsRecord

__all__ = ["violations_markdown"]


def violations_markdown(record: ViolationsRecord, *, max_rows: int = 20) -> str:
    """The record as a GitHub issue body."""
    record = printable_record(record)
    total, unread = record["rows_total"], record["unread_violations"]
    if total:
        verdict = plural(total, "row") + (f" ({unread} more unreadable)" if unread else "")
    elif unread:
        verdict = f"unreadable ({plural(unread, 'violation')} cut short or garbled)"
    else:
        verdict = "clean"
    parts = [
        f"## kvcanary violations: {verdict}",
        f"kvcanary {record['kvcanary_version']} · `{record['schema']}`"
        + (f" · explained against {_code(record['dump'], cell=False)}" if record["dump"] else ""),
    ]
    if record["sources"]:
        parts.append(
            _md_table(
                ["source", "kind", "rows", "read"],
                [
                    [_code(s["path"]), s["kind"], str(s["rows"]), _md_text(source_detail(s))]
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
        parts.append(f"*{_md_text(REPLAY_NOTE)}*")
    if record["comparison"] is not None:
        parts.append(replay_comparison_line(record["comparison"]))
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
                    [
                        p.space,
                        str(p.slot),
                        _md_text(p.allocator),
                        _md_text(slot_cells_text(p)),
                    ]
                    for p in record["slots"][: max(max_rows, 0)]
                ],
                right={1},
            )
        )
    notes = [f"{s['path']}: {x}" for s in record["sources"] for x in s["notes"]] + record["notes"]
    if notes:
        parts.append("\n".join(f"- note: {_md_text(n)}" for n in notes))
    return "\n\n".join(parts) + "\n"
