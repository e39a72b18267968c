"""The terminal view of a `kvcanary.ranks/1` report (one step's ranks compared), and the
words the Markdown view shares: the heading, a row per rank, the verdict."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvcanary_cli.render.console import plural
from kvcanary_cli.render.table.common import cells
from kvcanary_cli.results.ranks import Divergence, RankDump, RanksReport
from kvcanary_cli.safe_text import printable_record

__all__ = ["RANK_COLUMNS", "heading", "rank_row", "ranks_table", "verdict"]

RANK_COLUMNS = ("rank", "verdict", "what", "batch row", "pool row", "position", "page", "path")
_NUMBERS = {"batch row", "pool row", "position", "page"}


def heading(report: RanksReport) -> str:
    """`3 dumps of step 7 (model m), compared with rank 0` (`3 dumps (no step recorded, model
    m)` when they record no step)."""
    model = "" if report.model is None else f"model {report.model}"
    if report.step is None:
        what = f" ({', '.join(filter(None, ['no step recorded', model]))})"
    else:
        what = f" of step {report.step}" + (f" ({model})" if model else "")
    return f"{plural(len(report.ranks), 'dump')}{what}, compared with rank {report.reference}"


def rank_row(rank: RankDump, reference: str) -> list[object]:
    """A rank's cells, as `RANK_COLUMNS` name them: what was compared, or where it diverges."""
    d: Divergence | None = rank.divergence
    if d is None:
        verdict = "reference" if rank.rank == reference else "identical"
        return [rank.rank, verdict, ", ".join(rank.compared) or "-", *[None] * 4, rank.path]
    where = [d.batch_row, d.pool_row, d.position, d.page]
    return [rank.rank, "divergent", f"{d.kind}: {d.field}", *where, rank.path]


def verdict(report: RanksReport) -> str:
    """The first divergence in words, or that every rank holds the reference's bookkeeping."""
    first = report.first_divergence
    if first is None or first.divergence is None:
        return f"identical: every rank holds rank {report.reference}'s bookkeeping"
    return f"divergent: rank {first.rank}: {first.divergence.message}"


def ranks_table(report: RanksReport, *, max_rows: int) -> RenderableType:
    """The heading, a row per rank (the first `max_rows`), the verdict and the notes."""
    report = printable_record(report)
    table = Table(title=Text(heading(report)), title_justify="left")  # never markup
    for column in RANK_COLUMNS:
        table.add_column(column, justify="right" if column in _NUMBERS else "left")
    for rank in report.ranks[:max_rows]:
        style = "red" if rank.divergence is not None else ""
        table.add_row(*cells(*rank_row(rank, report.reference), style=style))
    parts: list[RenderableType] = [table]
    if len(report.ranks) > max_rows:
        parts.append(Text(f"… and {len(report.ranks) - max_rows} more"))
    cells_compared = max((r.table_cells for r in report.ranks), default=0)
    parts.append(Text(f"req_to_token cells compared per rank: {cells_compared}", style="dim"))
    style = "green" if report.verdict == "identical" else "bold red"
    parts.append(Text(verdict(report), style=style))
    if report.notes:
        parts.append(Text("notes:", style="bold"))
        parts.extend(Text(f"  - {note}") for note in report.notes)
    return Group(*parts)
