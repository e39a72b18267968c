"""Rich pieces several terminal views share: a layout chosen by width, plain cells (one, or a
row's at once), indented lines, identity and shrunk lines, the styles of severities, and the
findings as `check` and `provenance` show them.

The findings: a table where the message has room, one block per finding where it has not (an
80-column terminal). Each finding says its code (in the table's column or the block's head,
or the heading above it in `check`), where its cells lie (batch rows, positions, slots), its
role and its message, with the marks of where SGLang's reference and the kernel's launch
raise, a few example cells and where the example's slot lives.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from kvcanary_cli.render.phrases.check import FindingWords, finding_words
from kvcanary_cli.render.phrases.shrink import shrunk_lines
from kvcanary_cli.results.check import Finding
from kvcanary_cli.results.shrink import Shrunk

__all__ = [
    "FINDINGS_TABLE_WIDTH",
    "SEVERITY_STYLE",
    "ByWidth",
    "cell",
    "cells",
    "findings_view",
    "identity_line",
    "indented",
    "message_text",
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


#: the narrowest console that gets the findings table: below it, each finding is a block
#: whose message wraps across the whole width (an 80-column terminal).
FINDINGS_TABLE_WIDTH = 100

#: cells of the example slot's provenance shown before "+N more".
_HOLDERS_SHOWN = 3


def message_text(f: Finding, words: FindingWords) -> Text:
    """The message, flagged where SGLang's reference raises and where it rests on assumptions,
    then a few of the group's cells and where the example's slot lives."""
    text = Text(f.message)
    assumes = f"(assumes {', '.join(f.assumes)}: not recorded)" if f.assumes else None
    pieces = (
        (" ", words.raise_mark, "bold"),
        (" ", words.launch_mark, "bold"),
        (" ", assumes, "yellow"),
        ("\n", words.examples, "dim"),  # a group: a few of its cells
        ("\n", words.owners, ""),  # who holds (or last held) its slots
        ("\n", _holders_text(f), "dim"),  # where the example's slot lives
    )
    for separator, piece, style in pieces:
        if piece:
            text.append(f"{separator}{piece}", style=style)
    return text


def _holders_text(f: Finding) -> str | None:
    """Where the example's slot lives when that says more than the finding's own cells:
    `slot 77 is held at (pool row 8, pos 4) verify; (pool row 3, pos 4) verify shared; +2
    more`."""
    if not f.provenance:
        return None
    prov = f.provenance[0]
    if prov.cells_total <= 1 and not prov.mapped_from:
        return None
    bits = []
    for c in prov.cells[:_HOLDERS_SHOWN]:
        flags = "".join(f" {flag}" for flag, on in (("seed", c.seed), ("shared", c.shared)) if on)
        bits.append(f"(pool row {c.pool_row}, pos {c.position}) {c.role}{flags}")
    more = prov.cells_total - min(len(prov.cells), _HOLDERS_SHOWN)
    if more > 0:
        bits.append(f"+{more} more")
    space = "swa slot" if prov.space == "swa" else "slot"
    return f"{space} {prov.slot} is held at " + ("; ".join(bits) or "no cell")


#: A finding with its phrases (`phrases.check.finding_words`), worked out once for both
#: layouts.
_Worded = list[tuple[Finding, FindingWords]]


def _findings_table(findings: _Worded, with_code: bool) -> Table:
    """One row per finding group: how many cells, where they lie, and what they are."""
    table = Table()
    if with_code:
        table.add_column("code", no_wrap=True)
    for name in ("group", "cells", "where", "role"):
        table.add_column(name, justify="right" if name == "cells" else "left")
    table.add_column("message", ratio=1)
    for f, words in findings:
        code = (cell(f.code, SEVERITY_STYLE.get(f.severity, "")),) if with_code else ()
        table.add_row(
            *code,
            *cells(f.group, f.count, "\n".join(words.where) or "-", words.role),
            message_text(f, words),
        )
    return table


def _finding_blocks(findings: _Worded, with_code: bool) -> Table:
    """One block per finding: a head line (code, group, cells, role), where its cells lie,
    then the message wrapping under them across the whole width."""
    grid = Table.grid()
    grid.add_column(width=2, no_wrap=True)
    grid.add_column(ratio=1)
    for f, words in findings:
        head = Text()
        if with_code:
            head.append(f"{f.code} ({f.severity}) · ", SEVERITY_STYLE.get(f.severity, ""))
        role = words.role
        head.append(" · ".join([f.group, words.cells, *([role] if role else [])]))
        grid.add_row(Text("•"), head)
        where = " · ".join(words.where)
        if where:
            grid.add_row(Text(""), Text(where))
        grid.add_row(Text(""), message_text(f, words))
    return grid


def findings_view(findings: Sequence[Finding], *, with_code: bool = False) -> RenderableType:
    """Findings as a table from `FINDINGS_TABLE_WIDTH` columns up, else one block each;
    `with_code`: each names its code (`check` names it in the heading above instead)."""
    worded = [(f, finding_words(f)) for f in findings]
    return ByWidth(
        wide=_findings_table(worded, with_code),
        narrow=_finding_blocks(worded, with_code),
        min_width=FINDINGS_TABLE_WIDTH,
    )
