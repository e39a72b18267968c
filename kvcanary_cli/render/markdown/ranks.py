"""The Markdown view of a `kvcanary.ranks/1` report: the table view's rows, for GitHub."""

from __future__ import annotations

from kvcanary_cli.render.markdown.blocks import table, text
from kvcanary_cli.render.table.ranks import RANK_COLUMNS, heading, rank_row, verdict
from kvcanary_cli.results.ranks import RanksReport
from kvcanary_cli.safe_text import printable_record

__all__ = ["ranks_markdown"]


def ranks_markdown(report: RanksReport, *, max_rows: int) -> str:
    """The heading, a row per rank (the first `max_rows`), the verdict and the notes."""
    report = printable_record(report)
    rows = [[text(v) for v in rank_row(r, report.reference)] for r in report.ranks[:max_rows]]
    parts = [
        f"## kvcanary ranks: {text(heading(report))}",
        f"**{text(verdict(report))}**",
        table(list(RANK_COLUMNS), rows, right={3, 4, 5, 6}),
    ]
    if len(report.ranks) > max_rows:
        parts.append(f"… and {len(report.ranks) - max_rows} more")
    if report.notes:
        parts.append("\n".join(f"- {text(note)}" for note in report.notes))
    return "\n\n".join(parts) + "\n"
