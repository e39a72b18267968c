"""Views saved as pictures: `--svg FILE` records what a command shows, through rich's own
console recording, as an SVG image to attach to an issue (in colour, at the width the
terminal view has).

The command line sets `SVG_TARGET` for the command it runs; `output.deliver` saves each view
it delivers there too.
"""

from __future__ import annotations

import io
from contextvars import ContextVar

from rich.console import Console, RenderableType
from rich.text import Text

__all__ = ["SVG_TARGET", "svg_of"]

#: `--svg FILE` of the running command: where the view it delivers is also saved as an SVG.
SVG_TARGET: ContextVar[str | None] = ContextVar("kvcanary_svg_target", default=None)


def svg_of(rendered: str | RenderableType, *, width: int, title: str = "kvcanary") -> str:
    """`rendered` drawn as an SVG image `width` columns wide, in colour: a string (JSON,
    Markdown) as plain text, never read as markup."""
    console = Console(
        file=io.StringIO(),
        record=True,
        width=width,
        force_terminal=True,
        color_system="truecolor",
        no_color=False,
        highlight=False,
        soft_wrap=False,
    )
    console.print(Text(rendered) if isinstance(rendered, str) else rendered)
    return console.export_svg(title=title)
