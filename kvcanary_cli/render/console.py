"""Consoles, output formats and the few words every view says alike (a count with its noun,
a cell's value, a byte count), shared by every renderer; what a view says about its own
command lives in `render.phrases`, one module per topic.

Colour follows the terminal: none when piped or when `NO_COLOR` is set (rich honours it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import IO

from rich.console import Console, RenderableType
from rich.text import Text

from kvcanary_cli.catalog import plural
from kvcanary_cli.render.json import JsonText
from kvcanary_cli.safe_text import printable

__all__ = [
    "MIN_WIDTH",
    "PIPED_WIDTH",
    "OutputFormat",
    "emit",
    "fmt_bytes",
    "make_console",
    "plural",
    "progress",
    "shown",
    "without_padding",
]


class OutputFormat(StrEnum):
    """The `--format` choices."""

    TABLE = "table"
    JSON = "json"
    MARKDOWN = "markdown"


#: Width when the output is not a terminal (piped into a file or a pager); COLUMNS wins.
PIPED_WIDTH = 120
#: Narrower widths (COLUMNS=0 printed nothing at all, COLUMNS=1 a character a line) are read
#: as this one: a terminal that narrow wraps the lines, which still read.
MIN_WIDTH = 40


def make_console(file: IO[str] | None = None, *, width: int | None = None) -> Console:
    """A console for tables: rich decides colour from the terminal and NO_COLOR.

    Piped output gets `PIPED_WIDTH` columns rather than rich's 80, so finding tables stay
    readable in CI logs and files; no output is narrower than `MIN_WIDTH`.
    """
    console = Console(file=file, width=width, soft_wrap=False, highlight=False)
    if width is None and not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPED_WIDTH
    console.width = max(console.width, MIN_WIDTH)
    return console


def emit(rendered: RenderableType | JsonText, console: Console | None = None) -> None:
    """Write a rendered view (to stdout by default): strings (Markdown) verbatim, JSON verbatim
    a piece at a time (never whole: it carries every cell), renderables through rich.

    A string must not go through `console.print`, which would parse `[...]` as markup,
    highlight and wrap it.
    """
    console = console or make_console()
    if isinstance(rendered, JsonText):
        for piece in rendered.pieces():
            console.file.write(piece)
    elif isinstance(rendered, str):
        console.file.write(rendered)
    elif console.is_terminal:
        console.print(rendered)
    else:  # a pipe or a file: no line padded to the width with spaces
        with console.capture() as captured:
            console.print(rendered)
        console.file.write(without_padding(captured.get()))
    console.file.flush()


def without_padding(text: str) -> str:
    """`text` without the spaces rich pads lines with (to the width of a table or a wrapped
    paragraph): what a terminal shows, but noise in a file, a diff or a pasted report."""
    return "\n".join(line.rstrip(" ") for line in text.split("\n"))


@contextmanager
def progress(message: str, total: int) -> Iterator[Callable[[int, int], None] | None]:
    """A spinner (one item) or a progress bar (several) on stderr, only on a terminal.

    Yields the callback to report `(done, total)` with, or None when nothing is shown.
    """
    if sys.stderr is None or not sys.stderr.isatty():  # None: closed (`2>&-`)
        yield None
        return
    from rich.progress import Progress

    stderr = Console(stderr=True)
    stderr.width = max(stderr.width, MIN_WIDTH)
    if total <= 1:  # a Text: the message names a file, never to be read as markup
        with stderr.status(Text(printable(message))):
            yield None
        return
    with Progress(console=stderr, transient=True) as bar:
        task = bar.add_task("checking dumps", total=total)
        yield lambda done, _total: bar.update(task, completed=done)


def shown(value: object) -> str:
    """A value as a cell shows it: `-` for None."""
    return "-" if value is None else str(value)


def fmt_bytes(count: int) -> str:
    """A byte count for people: `512 B`, `1.5 KiB`, ..., up to GiB."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(count)
