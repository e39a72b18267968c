"""Rich pieces several terminal views share: a layout chosen by width, plain cells (one, or a
row's at once), indented lines, identity and shrunk lines, and the styles of severities."""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from kvcanary_cli.render.phrases.shrink import shrunk_lines
from kvcanary_cli.results.shrink import Shrunk

__all__ = [
    "SEVERITY_STYLE",
    "ByWidth",
    "cell",
    "cells",
    "identity_line",
    "indented",
    "shrunk_block",
]

SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "cyan"}


class ByWidth:
    """One of two layouts of the same thing, chosen by the width the console gives it: `wide`
    from `min_width` columns up, else `narrow` (the renderers do not know the width)."""

    def __init__(self, *, wide: RenderableType, narrow: RenderableType, min_width: int) -> None:
        self.wide, self.narrow, self.min_width = wide, narrow, min_width

    def _chosen(self, options: ConsoleOptions) -> RenderableType:
        return self.wide if options.max_width >= self.min_width else self.narrow

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self._chosen(options)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self._chosen(options))


def cell(value: object, style: str = "") -> Text:
    """A table cell: the value's text (`-` for None), never read as markup."""
    return Text("-" if value is None else str(value), style=style)


def cells(*values: object, style: str = "") -> list[Text]:
    """A row's cells (`cell` each) in one style: one call per row, not one per cell."""
    return [cell(value, style) for value in values]


def indented(rows: list[tuple[str, Text]], indent: int = 2) -> Table:
    """Lines that wrap under their own start: (marker, text) rows after `indent` spaces."""
    grid = Table.grid()
    grid.add_column(width=indent, no_wrap=True)
    marked = any(marker for marker, _ in rows)  # an empty column would still take a space
    if marked:
        grid.add_column(no_wrap=True)
    grid.add_column(ratio=1)
    for marker, text in rows:
        grid.add_row("", *([Text(marker + " " if marker else "")] if marked else []), text)
    return grid


def identity_line(identity: dict[str, str], path: str | None = None) -> RenderableType:
    """The identity keys in one dim line: `sglang 0.5.1 @ abc · model ... · rank 0`."""
    bits = []
    version, commit = identity.get("sglang.version"), identity.get("sglang.commit")
    if version or commit:
        bits.append(f"sglang {version or '?'}" + (f" @ {commit}" if commit else ""))
    bits.extend(
        f"{k} {v}" for k, v in identity.items() if k not in ("sglang.version", "sglang.commit")
    )
    if path is not None:
        bits.append(path)
    return indented([("", Text(" · ".join(bits) or "no identity metadata", style="dim"))])


def shrunk_block(shrunk: Shrunk) -> RenderableType:
    """A shrunk dump's facts, in yellow."""
    return indented([("", Text(line, style="yellow")) for line in shrunk_lines(shrunk)])
