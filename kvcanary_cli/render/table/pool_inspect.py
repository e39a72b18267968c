"""The terminal view of a block-pool dump's description (`kvcanary.pool-inspect/1`).

Request ids, tensor names, metadata keys and values come from the dump: the record is made
printable first and every cell is a `Text`, never read as rich markup.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvcanary_cli.render.console import fmt_bytes
from kvcanary_cli.render.phrases.inspect import shown_metadata
from kvcanary_cli.render.phrases.pool_inspect import (
    TENSOR_COLUMNS,
    group_columns,
    group_rows,
    more_requests,
    pool_lines,
    request_columns,
    request_rows,
    tensor_rows,
)
from kvcanary_cli.render.table.common import cells
from kvcanary_cli.render.table.inspect import metadata_and_notes, shrink_blocks
from kvcanary_cli.results.pool_inspect import PoolDumpDescription
from kvcanary_cli.safe_text import printable_record

__all__ = ["pool_inspect_table"]


def _table(title: str, columns: list[str], rows: list[list[str]], left: int = 1) -> Table:
    """A titled table, its first `left` columns left-aligned and the others (numbers) right."""
    table = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i < left else "right")
    for row in rows:
        table.add_row(*cells(*row))
    return table


def pool_inspect_table(d: PoolDumpDescription, *, max_rows: int) -> RenderableType:
    """The pool in lines, then groups, requests (the first `max_rows`), tensors, the shrink
    record, metadata and notes, one block each."""
    d = printable_record(d)
    head = f"{d.path}  ({fmt_bytes(d.file_bytes)}, format {d.format or 'not recorded'})"
    parts: list[RenderableType] = [Text(head, style="bold")]
    parts += [Text(f"  {line}") for line in pool_lines(d)]
    parts.append(_table("groups", group_columns(d), group_rows(d), left=2))
    parts.append(_table("requests", request_columns(d), request_rows(d, max_rows), left=2))
    more = more_requests(d, max_rows)
    if more is not None:
        parts.append(Text(f"  {more}"))
    tensors, more = tensor_rows(d, max_rows)
    parts.append(_table("tensors", TENSOR_COLUMNS, tensors, left=3))
    if more is not None:
        parts.append(Text(f"  {more}"))
    if d.shrink is not None:
        parts += shrink_blocks(d.shrink)
    parts += metadata_and_notes("metadata", *shown_metadata({}, d.metadata, max_rows), d.notes)
    return Group(*parts)
