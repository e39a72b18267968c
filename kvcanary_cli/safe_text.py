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
import re
import shlex
from typing import Any, TypeVar, cast

__all__ = ["excerpt", "printable", "printable_record", "safe_file_name", "shell_path"]


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


_MAX_NAME = 200
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


def safe_file_name(name: str, default: str = "DUMP.safetensors") -> str:
    """A file name that pastes into a shell as one word: the last path component, characters
    outside `A-Za-z0-9._+-` replaced by `_`, cut short, never starting with `-`."""
    base = re.split(r"[/\\]", name)[-1][:_MAX_NAME]
    cleaned = _UNSAFE.sub("_", base)
    if not cleaned or cleaned in (".", ".."):
        return default
    return f"./{cleaned}" if cleaned.startswith("-") else cleaned


#: a path that pastes into a shell as it is: no character a shell or a terminal acts on
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._+/-]+")


def shell_path(path: str, default: str = "DUMP.safetensors") -> str:
    """A dump's path as one shell word for a command to paste: as given when plain, quoted
    when it holds only printable characters (`./` first where it would read as an option),
    else its `safe_file_name` (a control character in a file name is not printed)."""
    guarded = f"./{path}" if path.startswith("-") else path
    if _PLAIN_PATH.fullmatch(guarded):
        return guarded
    if path and printable(path) == path and path.isprintable():
        return shlex.quote(guarded)
    return safe_file_name(path, default)
