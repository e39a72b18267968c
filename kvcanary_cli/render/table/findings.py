"""Findings in a terminal, as `check` and `provenance` show them: a table where the message has
room, one block per finding where it has not (an 80-column terminal).

Each finding says its code (in the table's column or the block's head, or the heading above it
in `check`), where its cells lie (batch rows, positions, slots), its role and its message, with
the marks of where SGLang's reference and the kernel's launch raise, a few example cells and
where the example's slot lives.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from kvcanary_cli.render.phrases.check import FindingWords, finding_words
from kvcanary_cli.render.table.common import SEVERITY_STYLE, ByWidth, cells
from kvcanary_cli.render.table.common import cell as _t
from kvcanary_cli.results.check import Finding

__all__ = ["FINDINGS_TABLE_WIDTH", "findings_view", "message_text"]

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
        ("\n", _holders_text(f), "dim"),  # where the example's slot lives
    )
    for separator, piece, style in pieces:
        if piece:
            text.append(f"{separator}{piece}", style=style)
    return text


def _holders_text(f: Finding) -> str | None:
    """Where the example's slot lives when that says more than the finding's own cells:
    `slot 77 is held at (row 8, pos 4) verify; (row 3, pos 4) verify shared; +2 more`."""
    if not f.provenance:
        return None
    prov = f.provenance[0]
    if prov.cells_total <= 1 and not prov.mapped_from:
        return None
    bits = []
    for c in prov.cells[:_HOLDERS_SHOWN]:
        flags = "".join(f" {flag}" for flag, on in (("seed", c.seed), ("shared", c.shared)) if on)
        bits.append(f"(row {c.pool_row}, pos {c.position}) {c.role}{flags}")
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
        code = (_t(f.code, SEVERITY_STYLE.get(f.severity, "")),) if with_code else ()
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
