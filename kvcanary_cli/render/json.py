"""The JSON view of any record: deterministic text (sorted keys, indent 2, trailing newline).

JSON keeps a record's strings exact (`json.dumps` escapes control characters itself), so this
view, unlike the others, does not make the record printable first. A long list of integers (a
finding group's cell columns) is written on one line: a million cells are a few megabytes, not
a million indented lines.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping

from kvcanary_cli.results.columns import IntColumn

__all__ = ["INLINE_AFTER", "to_json"]

#: Lists of integers longer than this are written on one line.
INLINE_AFTER = 16
#: What a compact JSON list of integers is made of (a float, bool or null adds more).
_INTEGER_TEXT = str.maketrans("", "", "0123456789,-")


def to_json(record: Mapping[str, object]) -> str:
    """Deterministic JSON (sorted keys) so outputs diff cleanly and goldens stay stable."""
    inline: list[str] = []
    # A marker no record string can hold (a fresh random token per call) stands in for each
    # long integer list while the rest is indented, then is replaced by the list's text.
    token = f"kvcanary-inline-{secrets.token_hex(16)}-"

    def fold(value: object) -> object:
        if isinstance(value, Mapping):
            return {key: fold(item) for key, item in value.items()}
        if isinstance(value, IntColumn):
            if len(value) <= INLINE_AFTER:
                return value.tolist()
            inline.append(value.json_text())
            return f"{token}{len(inline) - 1}"
        if isinstance(value, list | tuple):
            if len(value) > INLINE_AFTER and all(type(item) is int for item in value):
                inline.append(json.dumps(value, separators=(",", ":")))
                return f"{token}{len(inline) - 1}"
            return [fold(item) for item in value]
        return value

    text = json.dumps(fold(record), indent=2, sort_keys=True) + "\n"
    if not inline:
        return text
    pieces = text.split(f'"{token}')
    out = [pieces[0]]
    for piece in pieces[1:]:
        number, rest = piece.split('"', 1)
        out.append(inline[int(number)])
        out.append(rest)
    return "".join(out)
