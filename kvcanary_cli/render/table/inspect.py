"""The terminal view of a `kvcanary.inspect/2` description (what a dump holds).

Almost everything here comes from the dump itself (tensor names, metadata keys and values,
notes): every table cell is a `Text`, so a name like `[/x]` or `[link=...]` is shown as it is,
never read as rich markup.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvcanary_cli.render.console import fmt_bytes
from kvcanary_cli.render.phrases.inspect import (
    batch_facts,
    inspect_metadata,
    shown_tensors,
    tensor_role,
)
from kvcanary_cli.render.phrases.shrink import CUT_COLUMNS, cut_rows, shrink_facts
from kvcanary_cli.render.table.common import cells
from kvcanary_cli.results.inspect import DumpDescription
from kvcanary_cli.results.shrink import ShrinkSummary
from kvcanary_cli.safe_text import printable_record

__all__ = ["inspect_table", "metadata_and_notes", "shrink_blocks"]


def inspect_table(dump: DumpDescription, *, max_rows: int) -> RenderableType:
    """Tensors, shrink, scalars, batch summary, identity and notes, one block each; of the
    tensors a reader ignores and the other metadata, the first `max_rows`."""
    dump = printable_record(dump)
    parts: list[RenderableType] = [
        Text(
            f"{dump.path}  ({fmt_bytes(dump.file_bytes)}, format {dump.format or 'hand-made'})",
            style="bold",
        )
    ]
    tensors = Table(title="tensors", title_justify="left")
    for col in ("name", "dtype", "shape", "bytes", "role"):
        tensors.add_column(col, justify="right" if col == "bytes" else "left")
    shown, more = shown_tensors(dump.tensors, lambda t: t.role is None, max_rows)
    for t in shown:
        shape = "x".join(map(str, t.shape)) or "[]"
        tensors.add_row(*cells(t.name, t.dtype, shape, fmt_bytes(t.bytes), tensor_role(t)))
    parts.append(tensors)
    if more is not None:
        parts.append(Text(f"  {more}"))
    if dump.shrink is not None:
        parts += shrink_blocks(dump.shrink)
    scalars = Table(title="scalars", title_justify="left")
    for col in ("name", "value", "origin", "source", "option"):
        scalars.add_column(col)
    for s in dump.scalars:
        scalars.add_row(*cells(s.name, s.value, s.origin, s.source, s.option))
    parts.append(scalars)
    groups = ", ".join(f"{g.name} (window {g.window})" for g in dump.groups)
    summary = Table(title="batch", title_justify="left", show_header=False)
    summary.add_column("key")
    summary.add_column("value")
    summary.add_row(*cells("groups", groups))
    for key, value in batch_facts(dump.batch):
        summary.add_row(*cells(key, value))
    parts.append(summary)
    identity, more = inspect_metadata(dump, max_rows)
    parts += metadata_and_notes("identity", identity, more, dump.notes)
    return Group(*parts)


def shrink_blocks(shrink: ShrinkSummary) -> list[RenderableType]:
    """Either engine's shrink record: its facts, then what each tensor dropped."""
    parts: list[RenderableType] = [Text("shrunk", style="bold")]
    parts += [Text(f"  {fact}", style="yellow") for fact in shrink_facts(shrink)]
    cut = Table(title="dropped", title_justify="left")
    for col in CUT_COLUMNS:
        cut.add_column(col, justify="left" if col in ("tensor", "original shape") else "right")
    for row in cut_rows(shrink):
        cut.add_row(*cells(*row))
    parts.append(cut)
    return parts


def metadata_and_notes(
    title: str, metadata: dict[str, str], more: str | None, notes: Sequence[str]
) -> list[RenderableType]:
    """The tail of either engine's view: the metadata shown (`title`d), the line counting the
    keys left out, then the notes."""
    parts: list[RenderableType] = []
    if metadata:
        meta = Table(title=title, title_justify="left", show_header=False)
        meta.add_column("key")
        meta.add_column("value")
        for key, value in metadata.items():
            meta.add_row(*cells(key, value))
        parts.append(meta)
    if more is not None:
        parts.append(Text(f"  {more}"))
    if notes:
        parts.append(Text("notes:", style="bold"))
        parts.extend(Text(f"  - {note}") for note in notes)
    return parts
