"""Markdown building blocks shared by every Markdown view: escaped text, code spans, tables.

Text from a dump must read as itself once rendered: no link, image or HTML of its own, no
emphasis, no broken table or code span. So `text` escapes non-printable characters
(`safe_text.printable`, which also keeps a heading on its line), backslashes, `|`, `*`, `~`,
backticks, a `_` that could start or end emphasis, the `(` of a `](` (a link or an image),
`&` (an entity such as `&#x202e;` would decode) and `<` (HTML, autolinks), and keeps an
`@user` or `@org/team` from mentioning anyone: GitHub looks for mentions in the rendered text
(outside code), after entities and backslash escapes are decoded, so neither `\\@` nor `&#64;`
stops one; a word joiner (U+2060, written `&#8288;`) between `@` and the name does, and renders
as nothing (the reader sees `@user`). A `code` span's fence is longer than any run of
backticks inside it, and no mention is made in code. Bare URLs are left alone: GitHub may
still link one, but such a link shows its own target.
"""

from __future__ import annotations

import re

from kvcanary_cli.safe_text import printable

__all__ = ["clipped", "code", "named_rows", "table", "text"]

#: characters that take a backslash: inline syntax, or a table's cell separator.
_BACKSLASHED = re.compile(r"[\\|*`~]")
#: a `_` not inside a word (`lut_len` stays as it is; `_u_` cannot make emphasis).
_LOOSE_UNDERSCORE = re.compile(r"(?<![^\W_])_|_(?![^\W_])")
_BACKTICKS = re.compile(r"`+")
#: an `@` a name follows: where GitHub would mention a user or a team.
_MENTION = re.compile(r"@(?=[0-9A-Za-z])")
#: what goes between them: a word joiner, as an entity (ASCII, and `printable` leaves it be).
_NO_MENTION = "@&#8288;"


def text(value: object) -> str:
    """Text (a table cell, a list item, a heading's words), escaped for GitHub Markdown; line
    breaks of kvcanary's own text become `<br>` (a dump's were escaped before)."""
    if value is None:
        return "-"
    return "<br>".join(_escaped_line(line) for line in str(value).split("\n"))


def _escaped_line(line: str) -> str:
    shown = _BACKSLASHED.sub(lambda m: "\\" + m.group(), printable(line))
    shown = _LOOSE_UNDERSCORE.sub(r"\\_", shown)
    shown = shown.replace("](", "]\\(")
    shown = shown.replace("&", "&amp;").replace("<", "&lt;")
    return _MENTION.sub(_NO_MENTION, shown)


def clipped(value: str, limit: int | None) -> str:
    """A value from a dump cut to `limit` characters (None: whole), saying how long it was:
    a note of 70,000 characters must not crowd the findings out of a body of bounded length
    (the JSON output keeps every character)."""
    if limit is None or len(value) <= limit:
        return value
    return f"{value[:limit]}… ({len(value):,} characters in all; --format json has them)"


def code(value: object, *, cell: bool = True) -> str:
    """An inline code span; in a table `cell`, `|` is escaped (GitHub unescapes it there).

    Nothing inside a code span is markup, so only its fence needs care: one backtick more
    than the longest run inside, and a space on each side where the content has a backtick
    or starts and ends with a space (Markdown strips one on each side).
    """
    shown = printable(str(value))
    if cell:
        shown = shown.replace("|", "\\|")
    longest = max((len(run) for run in _BACKTICKS.findall(shown)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if longest or (shown.startswith(" ") and shown.endswith(" ")) else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def named_rows(rows: list[list[str]]) -> list[list[str]]:
    """Table cells of rows that start with a name (a tensor's, a request's): the name as
    code, the rest as text."""
    return [[code(row[0]), *(text(c) for c in row[1:])] for row in rows]


def table(header: list[str], rows: list[list[str]], *, right: set[int] | None = None) -> str:
    """A GitHub table of already-escaped cells; columns in `right` are right-aligned."""
    right = right or set()
    align = ["---:" if i in right else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines)
