"""Text from a dump, made safe to show: `printable` escapes every character that does not print.

What kvcanary shows was largely written by whatever crashed: metadata keys and values, tensor
names (also inside a parser's error text), the exception text the capture hook stores in `note`,
file names, log lines. A terminal acts on some of those characters (ESC starts a sequence that
can clear the screen or write the clipboard, `\\r` lets a line overwrite itself, U+202E reverses
what follows), and a Markdown or rich renderer acts on others. On the way to a terminal, to
Markdown or to an error line, every such string goes through `printable`: each character that
does not print (C0 and C1 controls, DEL, line breaks, bidi and other format characters,
separators other than the space, private-use and unassigned code points, the lone surrogates of
an undecodable file name) is written as its Python escape (`\\x1b`, `\\r`, `\\u202e`, `\\udcff`),
so nothing acts and nothing is lost. Backslashes are kept as they are, so the escape is
idempotent and any layer may apply it again. JSON keeps the raw strings: `json.dumps` escapes
them itself.

A leaf: it imports nothing from kvcanary, so every layer can use it.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from typing import Any, TypeVar, cast

__all__ = ["excerpt", "printable", "printable_record"]


def excerpt(text: str, limit: int = 40) -> str:
    """`text` quoted for a message, cut to `limit` characters with its length said: a dump's
    value may be a megabyte long, and an error line names it, not reprints it."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def printable(text: str) -> str:
    """`text` with each non-printable character written as its escape (`\\x1b`, `\\u202e`)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


#: A record: a result dataclass (`results/`), or a mapping of JSON values.
RecordT = TypeVar("RecordT")


def printable_record(record: RecordT) -> RecordT:
    """`record` (JSON-like) with `printable` applied to every string, keys included: what the
    table and Markdown views draw, so that no field can be forgotten. The result has the
    record's type: a record's own keys are kvcanary's names and print as they are, so only
    text from a dump changes (values, and the keys of its maps, such as metadata names).

    `repr` escapes exactly the characters `printable` does, with a backslash, at C speed: a
    record whose repr holds no backslash is returned as it is (the usual case), so a check
    with many findings does not pay for a walk over every cell.
    """
    if "\\" not in repr(record):
        return record
    return cast(RecordT, _printable_value(record))


def _printable_value(value: Any) -> Any:
    if isinstance(value, enum.Enum):  # kvcanary's own names
        return value
    if isinstance(value, str):
        return printable(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        clean = copy.copy(value)  # frozen: each field is set on the copy as it is made
        for item in dataclasses.fields(value):
            object.__setattr__(clean, item.name, _printable_value(getattr(value, item.name)))
        return clean
    if isinstance(value, dict):
        return {_printable_value(k): _printable_value(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_printable_value(v) for v in value)
    if isinstance(value, list):
        return [_printable_value(v) for v in value]
    return value
