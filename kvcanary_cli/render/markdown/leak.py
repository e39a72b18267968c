"""The Markdown view of a `kvcanary.leak/1` report: the table view's words, for GitHub."""

from __future__ import annotations

from kvcanary_cli.render.markdown.blocks import code, text
from kvcanary_cli.render.table.leak import (
    dump_lines,
    heading,
    legend,
    message_head,
    verdict_line,
)
from kvcanary_cli.results.leak import LeakReport
from kvcanary_cli.safe_text import printable_record

__all__ = ["leak_markdown"]


def leak_markdown(report: LeakReport, *, max_rows: int) -> str:
    """The verdict, each message (the first `max_rows`) with its arithmetic, the dump's
    pools, what each count is, and the notes."""
    report = printable_record(report)
    parts = [f"## kvcanary leak: {text(heading(report))}", f"**{text(verdict_line(report))}**"]
    for index, message in enumerate(report.messages[:max_rows]):
        lines = [f"- {text(line)}" for line in message.arithmetic]
        parts.append(
            f"### {text(message_head(message, index, report.judged))}\n\n"
            + "<br>".join(code(line, cell=False) for line in message.text)
            + "\n\n"
            + "\n".join(lines)
        )
    if len(report.messages) > max_rows:
        parts.append(f"… and {len(report.messages) - max_rows} more messages")
    if report.dump is not None:
        lines = [f"- {text(line)}" for line in dump_lines(report)]
        parts.append(f"### The dump, {text(report.dump)}\n\n" + "\n".join(lines))
    counts = legend(report)
    if counts:
        parts.append(
            "<details><summary>what each count is</summary>\n\n"
            + "\n".join(f"- {text(line)}" for line in counts)
            + "\n\n</details>"
        )
    if report.notes:
        parts.append("\n".join(f"- {text(note)}" for note in report.notes))
    return "\n\n".join(parts) + "\n"
