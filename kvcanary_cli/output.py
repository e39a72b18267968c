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

from rich.console import Console, RenderableType

from kvcanary_cli.dump.files import write_atomically
from kvcanary_cli.dump.streams import write_standard_error, writing_to_standard_output
from kvcanary_cli.render.console import PIPED_WIDTH, emit, make_console, without_padding
from kvcanary_cli.render.image import SVG_TARGET, svg_of

__all__ = ["deliver", "tell"]


def deliver(
    rendered: str | RenderableType,
    output: str | os.PathLike[str] | None,
    *,
    force: bool = False,
    inputs: Iterable[str | os.PathLike[str]] = (),
) -> None:
    """Print `rendered`, or write it to `output` (`-` is standard output); with `--svg FILE`
    (`SVG_TARGET`), save it as an image there too, by the same rules as `output`."""
    inputs = list(inputs)
    if output is None or str(output) == "-":
        with writing_to_standard_output():
            emit(rendered)
    else:
        _write_text(rendered, Path(output), force=force, inputs=inputs)
    target = SVG_TARGET.get()
    if target is not None:
        written = [] if output is None or str(output) == "-" else [output]
        width = PIPED_WIDTH if written else make_console().width  # as the view was written
        image = svg_of(rendered, width=width).encode("utf-8")
        write_atomically(
            Path(target),
            lambda handle: handle.write(image),
            inputs=[*inputs, *written],
            overwrite=force,
        )


def _write_text(
    rendered: str | RenderableType,
    output: Path,
    *,
    force: bool,
    inputs: list[str | os.PathLike[str]],
) -> None:
    if isinstance(rendered, str):
        text = rendered
    else:
        buffer = io.StringIO()
        Console(file=buffer, width=PIPED_WIDTH, color_system=None, soft_wrap=False).print(rendered)
        text = without_padding(buffer.getvalue())
    data = text.encode("utf-8")
    write_atomically(output, lambda handle: handle.write(data), inputs=inputs, overwrite=force)


def tell(text: str, *, on_stderr: bool = False) -> None:
    """A status line (or a few): on standard output, or on standard error when standard output
    carries the data itself (`synth -o -`) or the line is a complaint."""
    if on_stderr:
        write_standard_error(text)
        return
    with writing_to_standard_output():
        emit(text + "\n")
