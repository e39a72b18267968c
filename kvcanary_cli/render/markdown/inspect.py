"""The Markdown view of a `kvcanary.inspect/2` description: the table view's blocks, for GitHub."""

from __future__ import annotations

from collections.abc import Sequence

from kvcanary_cli.render.console import fmt_bytes
from kvcanary_cli.render.markdown.blocks import code, named_rows, table, text
from kvcanary_cli.render.phrases.inspect import (
    batch_facts,
    inspect_metadata,
    shown_tensors,
    tensor_role,
)
from kvcanary_cli.render.phrases.shrink import CUT_COLUMNS, cut_rows, shrink_facts
from kvcanary_cli.results.inspect import DumpDescription
from kvcanary_cli.results.shrink import ShrinkSummary
from kvcanary_cli.safe_text import printable_record

__all__ = ["inspect_markdown", "metadata_and_notes", "shrink_blocks"]


def inspect_markdown(dump: DumpDescription, *, max_rows: int) -> str:
    """Tensors, scalars, batch, shrink, identity and notes, as GitHub Markdown; of the
    tensors a reader ignores and the other metadata, the first `max_rows`."""
    dump = printable_record(dump)
    groups = ", ".join(f"{g.name} (window {g.window})" for g in dump.groups)
    tensors, more_tensors = shown_tensors(dump.tensors, lambda t: t.role is None, max_rows)
    parts = [
        f"## kvcanary inspect: {code(dump.path, cell=False)}",
        f"{fmt_bytes(dump.file_bytes)}, format {text(dump.format or 'hand-made')}",
        table(
            ["tensor", "dtype", "shape", "bytes", "role"],
            [
                [
                    code(t.name),
                    text(t.dtype),
                    "x".join(map(str, t.shape)) or "[]",
                    str(t.bytes),
                    text(tensor_role(t)),
                ]
                for t in tensors
            ],
            right={3},
        ),
        *([text(more_tensors)] if more_tensors else []),
        table(
            ["scalar", "value", "source", "option"],
            [[code(s.name), text(s.value), text(s.source), code(s.option)] for s in dump.scalars],
        ),
        table(
            ["batch", "value"],
            [["groups", text(groups)]]
            + [[key, text(value)] for key, value in batch_facts(dump.batch)],
        ),
    ]
    if dump.shrink is not None:
        parts += shrink_blocks(dump.shrink)
    identity, more = inspect_metadata(dump, max_rows)
    parts += metadata_and_notes("identity", identity, more, dump.notes)
    return "\n\n".join(parts) + "\n"


def shrink_blocks(shrink: ShrinkSummary) -> list[str]:
    """Either engine's shrink record: its facts, then what each tensor dropped."""
    facts = "\n".join(f"- {text(fact)}" for fact in shrink_facts(shrink))
    return [facts, table(CUT_COLUMNS, named_rows(cut_rows(shrink)), right={2, 3, 4})]


def metadata_and_notes(
    title: str, metadata: dict[str, str], more: str | None, notes: Sequence[str]
) -> list[str]:
    """The tail of either engine's view: the metadata shown (`title`d), the line counting the
    keys left out, then the notes."""
    parts = []
    if metadata:
        parts.append(table([title, "value"], [[code(k), text(v)] for k, v in metadata.items()]))
    if more is not None:
        parts.append(text(more))
    if notes:
        parts.append("\n".join(f"- {text(note)}" for note in notes))
    return parts
