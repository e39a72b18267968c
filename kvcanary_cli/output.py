"""Where a rendered view goes: standard output, or a file written the safe way; and where a
status line goes.

A file gets the view as text (tables at 120 columns, no colour, no spaces padding its lines),
written atomically, never over a command's input, a non-regular file or (without `--force`)
an existing file.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from rich.console import Console, RenderableType

from kvcanary_cli.dump.files import Target, write_all_atomically
from kvcanary_cli.dump.streams import write_standard_error, writing_to_standard_output
from kvcanary_cli.render.console import PIPED_WIDTH, emit, make_console, without_padding
from kvcanary_cli.render.image import svg_of
from kvcanary_cli.render.json import JsonText
from kvcanary_cli.safe_text import printable

__all__ = ["complain", "deliver", "tell", "to_stdout"]


def deliver(
    rendered: str | JsonText | RenderableType,
    output: str | os.PathLike[str] | None,
    *,
    force: bool = False,
    svg: str | os.PathLike[str] | None = None,
    drawn: str | JsonText | RenderableType | None = None,
    inputs: Iterable[str | os.PathLike[str]] = (),
) -> None:
    """Print `rendered`, or write it to `output` (`-` is standard output); with `svg` (`--svg
    FILE`), save `drawn` (default: `rendered`) as an image there too, by the same rules.

    Both files are checked before either is written, and written together or not at all: a
    refused image leaves no report behind (its rerun would be told the report exists). The
    report goes to its file a piece at a time, each encoded as it goes: JSON, which carries
    every cell, is never held whole, as text or as bytes."""
    to_file = not to_stdout(output)
    targets: list[Target] = []
    if to_file:
        pieces = _pieces_of(rendered)
        targets.append((Path(os.fspath(output)), lambda handle: _write(pieces, handle)))  # type: ignore[arg-type]
    if svg is not None:
        width = PIPED_WIDTH if to_file else make_console().width  # as the view was written
        drawn = rendered if drawn is None else drawn
        image = svg_of(str(drawn) if isinstance(drawn, JsonText) else drawn, width=width)
        targets.append((Path(svg), lambda handle: handle.write(image.encode("utf-8"))))
    if targets:
        write_all_atomically(targets, inputs=inputs, overwrite=force)
    if not to_file:
        with writing_to_standard_output():
            emit(rendered)


def to_stdout(output: str | os.PathLike[str] | None) -> bool:
    """Whether `--output` names standard output (unset or `-`) rather than a file."""
    return output is None or os.fspath(output) == "-"


def _pieces_of(rendered: str | JsonText | RenderableType) -> Iterable[str]:
    """The view as a file holds it (120 columns, no colour, no padding), in pieces: JSON's
    are made as they are written; a table is drawn whole first (it shows a few rows)."""
    if isinstance(rendered, JsonText):
        return rendered.pieces()
    if isinstance(rendered, str):
        text = rendered
    else:
        buffer = io.StringIO()
        console = Console(file=buffer, width=PIPED_WIDTH, color_system=None, soft_wrap=False)
        console.print(rendered)
        text = without_padding(buffer.getvalue())
    return (text[start : start + _PIECE] for start in range(0, len(text), _PIECE))


#: Characters of a text encoded and written at a time.
_PIECE = 1 << 20


def _write(pieces: Iterable[str], handle: BinaryIO) -> None:
    for piece in pieces:
        handle.write(piece.encode("utf-8"))


def tell(text: str, *, on_stderr: bool = False) -> None:
    """A status line (or a few): on standard output, or on standard error when standard output
    carries the data itself (`synth -o -`) or the line is a complaint."""
    if on_stderr:
        write_standard_error(text)
        return
    with writing_to_standard_output():
        emit(text + "\n")


def complain(line: str) -> None:
    """One line on stderr, escaped (`printable`): it may quote a file name, a tensor name, an
    option value or an exception's text, none of which may reach the terminal as control
    characters."""
    write_standard_error(printable(line))
