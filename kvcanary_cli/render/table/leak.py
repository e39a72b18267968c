"""The terminal view of a `kvcanary.leak/1` report (SGLang's memory-check messages, their
arithmetic, and the dump's pools and rows), and the words the Markdown view shares."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from kvcanary_cli.render.console import plural
from kvcanary_cli.results.leak import COUNT_MEANINGS, LeakMessage, LeakReport
from kvcanary_cli.safe_text import printable_record

__all__ = ["dump_lines", "heading", "legend", "message_head", "leak_table", "verdict_line"]

_STYLE = {"balanced": "green", "undecided": "yellow"}


def heading(report: LeakReport) -> str:
    """`2 messages of server.log, against dump.safetensors`."""
    where = "the command line" if report.source == "LINE" else report.source
    against = "" if report.dump is None else f", against {report.dump}"
    return f"{plural(len(report.messages), 'SGLang message')} from {where}{against}"


def verdict_line(report: LeakReport) -> str:
    """The verdict, its cause and its summary."""
    cause = "" if report.cause is None else f" [{report.cause}]"
    return f"{report.verdict}{cause}: {report.summary}"


def message_head(message: LeakMessage, index: int, judged: int | None) -> str:
    """`#1 (line 12) idle-pools, set against the dump`."""
    line = "" if message.line is None else f" (line {message.line})"
    mark = ", set against the dump" if judged == index else ""
    return f"#{index + 1}{line} {message.kind}{mark}"


def dump_lines(report: LeakReport) -> list[str]:
    """The dump's pools and request-pool rows, counted, in words."""
    rows = () if report.rows is None else report.rows.explanation
    return [*(line for pool in report.pools for line in pool.explanation), *rows]


def legend(report: LeakReport) -> list[str]:
    """What each count of a pool sum is, when a message printed one."""
    if not any(m.pools for m in report.messages):
        return []
    return [f"{name}: {meaning}" for name, meaning in COUNT_MEANINGS.items()]


def leak_table(report: LeakReport, *, max_rows: int) -> RenderableType:
    """The verdict, each message (the first `max_rows`) with its arithmetic, the dump's
    pools, what each count is, and the notes."""
    report = printable_record(report)
    parts: list[RenderableType] = [Text(heading(report), style="bold")]
    style = _STYLE.get(report.verdict, "bold red")
    parts.append(Text(verdict_line(report), style=style))
    for index, message in enumerate(report.messages[:max_rows]):
        parts.append(Text(message_head(message, index, report.judged), style="bold"))
        parts.extend(Text(f"  {line}", style="dim") for line in message.text)
        parts.extend(Text(f"  - {line}") for line in message.arithmetic)
    if len(report.messages) > max_rows:
        parts.append(Text(f"… and {len(report.messages) - max_rows} more messages"))
    if report.dump is not None:
        parts.append(Text(f"the dump, {report.dump}:", style="bold"))
        parts.extend(Text(f"  - {line}") for line in dump_lines(report))
    lines = legend(report)
    if lines:
        parts.append(Text("what each count is:", style="bold"))
        parts.extend(Text(f"  {line}", style="dim") for line in lines)
    if report.notes:
        parts.append(Text("notes:", style="bold"))
        parts.extend(Text(f"  - {note}") for note in report.notes)
    return Group(*parts)
