"""Views saved as pictures: `--svg FILE` records what a command shows, through rich's own
console recording, as an SVG image to attach to an issue (in colour, at the width the
terminal view has).

`output.deliver` saves the view a command delivers there too, when the command was given
`--svg FILE`.
"""

from __future__ import annotations

import io

from rich.console import Console, RenderableType
from rich.text import Text

__all__ = ["svg_of"]


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
