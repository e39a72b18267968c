"""Markdown building blocks shared by every Markdown view: escaped text, code spans, tables.

Table cells escape `|`, `<`, `*`, backslashes, backticks and line breaks, so text from a dump
cannot break a table or inject markup.
"""

from __future__ import annotations

__all__ = ["code", "table", "text"]


def text(value: object) -> str:
    """A table cell's text, escaped for GitHub-flavoured Markdown."""
    if value is None:
        return "-"
    shown = str(value)
    for char in ("\\", "|", "*", "`"):
        shown = shown.replace(char, "\\" + char)
    shown = shown.replace("<", "&lt;")
    return "<br>".join(shown.splitlines()) if "\n" in shown or "\r" in shown else shown


def code(value: object, *, cell: bool = True) -> str:
    """An inline code span; in a table `cell`, `|` is escaped (GitHub unescapes it there)."""
    shown = str(value).replace("\n", " ")
    if cell:
        shown = shown.replace("|", "\\|")
    fence = "``" if "`" in shown else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def table(header: list[str], rows: list[list[str]], *, right: set[int] | None = None) -> str:
    """A GitHub table of already-escaped cells; columns in `right` are right-aligned."""
    right = right or set()
    align = ["---:" if i in right else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines)
