"""The Markdown view of a block-pool dump's description (`kvcanary.pool-inspect/1`): the
table view's blocks, for GitHub."""

from __future__ import annotations

from kvcanary_cli.render.console import fmt_bytes
from kvcanary_cli.render.markdown.blocks import code, named_rows, table, text
from kvcanary_cli.render.markdown.inspect import metadata_and_notes, shrink_blocks
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
from kvcanary_cli.results.pool_inspect import PoolDumpDescription
from kvcanary_cli.safe_text import printable_record

__all__ = ["pool_inspect_markdown"]


def _numbers(count: int, first: int) -> set[int]:
    """The right-aligned columns: every one from `first`."""
    return set(range(first, count))


def pool_inspect_markdown(d: PoolDumpDescription, *, max_rows: int) -> str:
    """The pool, groups, requests (the first `max_rows`), tensors, shrink record, metadata
    and notes, as GitHub Markdown."""
    d = printable_record(d)
    columns = request_columns(d)
    parts = [
        f"## kvcanary inspect: {code(d.path, cell=False)}",
        f"{fmt_bytes(d.file_bytes)}, format {text(d.format or 'not recorded')}",
        "\n".join(f"- {text(line)}" for line in pool_lines(d)),
        table(
            group_columns(d),
            [[text(c) for c in row] for row in group_rows(d)],
            right=_numbers(len(group_columns(d)), 2),
        ),
        table(
            columns,
            named_rows(request_rows(d, max_rows)),
            right=_numbers(len(columns), 2),
        ),
    ]
    more = more_requests(d, max_rows)
    if more is not None:
        parts.append(text(more))
    tensors, more = tensor_rows(d, max_rows)
    parts.append(table(TENSOR_COLUMNS, named_rows(tensors), right={3}))
    if more is not None:
        parts.append(text(more))
    if d.shrink is not None:
        parts += shrink_blocks(d.shrink)
    parts += metadata_and_notes("metadata", *shown_metadata({}, d.metadata, max_rows), d.notes)
    return "\n\n".join(parts) + "\n"
