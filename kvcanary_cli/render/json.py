"""The JSON view of any record: deterministic text (sorted keys, indent 2, trailing newline),
made a piece at a time.

JSON keeps a record's strings exact (`json.dumps` escapes control characters itself), so this
view, unlike the others, does not make the record printable first. A long list of integers (a
finding group's cell columns) is written on one line: a million cells are a few megabytes, not
a million indented lines.

JSON carries every cell, so its text grows with them (335 MB for ten million): `JsonText`
holds the record, not the text, and gives the text in pieces (`pieces`), which `output.deliver`
and `emit` write as they come; a column is converted a slice at a time. Joined whole
(`str(view)`, `to_json`), it is the same text.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Mapping

from kvcanary_cli.results.columns import JSON_SLICE, IntColumn, int_items

__all__ = ["INLINE_AFTER", "JsonText", "json_pieces", "to_json"]

#: Lists of integers longer than this are written on one line.
INLINE_AFTER = 16
#: Characters `JsonText.pieces` gathers before it gives them (the encoder's own pieces are a
#: key or a bracket each: a write per piece would cost more than the text).
_BATCH = 1 << 16


class JsonText:
    """A record's JSON view, made as it is written: `pieces()`, or `str(view)` whole."""

    __slots__ = ("record",)

    def __init__(self, record: Mapping[str, object]) -> None:
        self.record = record

    def pieces(self) -> Iterator[str]:
        """The text in pieces of about 64 KiB (the last one shorter)."""
        batch: list[str] = []
        size = 0
        for piece in json_pieces(self.record):
            batch.append(piece)
            size += len(piece)
            if size >= _BATCH:
                yield "".join(batch)
                batch.clear()
                size = 0
        if batch:
            yield "".join(batch)

    def __str__(self) -> str:
        return "".join(json_pieces(self.record))

    def __repr__(self) -> str:
        return f"JsonText(<{self.record.get('schema', 'a record')}>)"


def to_json(record: Mapping[str, object]) -> str:
    """Deterministic JSON (sorted keys) so outputs diff cleanly and goldens stay stable."""
    return "".join(json_pieces(record))


def json_pieces(record: Mapping[str, object]) -> Iterator[str]:
    """`to_json`'s text in pieces: the encoder's, and each long integer list's slices."""
    inline: list[IntColumn | list[int]] = []
    # A marker no record string can hold (a fresh random token per call) stands in for each
    # long integer list while the rest is indented, then is replaced by the list's text.
    token = f"kvcanary-inline-{secrets.token_hex(16)}-"
    marker = f'"{token}'

    def fold(value: object) -> object:
        if isinstance(value, Mapping):
            return {key: fold(item) for key, item in value.items()}
        if isinstance(value, IntColumn):
            if len(value) <= INLINE_AFTER:
                return value.tolist()
            inline.append(value)
            return f"{token}{len(inline) - 1}"
        if isinstance(value, list | tuple):
            if len(value) > INLINE_AFTER and all(type(item) is int for item in value):
                inline.append(value)  # type: ignore[arg-type]
                return f"{token}{len(inline) - 1}"
            return [fold(item) for item in value]
        return value

    encoder = json.JSONEncoder(indent=2, sort_keys=True)
    for chunk in encoder.iterencode(fold(record)):
        if token not in chunk:  # a marker, a string, is always whole in one chunk
            yield chunk
            continue
        pieces = chunk.split(marker)
        yield pieces[0]
        for piece in pieces[1:]:
            number, rest = piece.split('"', 1)
            yield from _one_line(inline[int(number)])
            yield rest
    yield "\n"


def _one_line(values: IntColumn | list[int]) -> Iterator[str]:
    """A long integer list as compact JSON, `[1,2,3]`, converted a slice at a time."""
    if isinstance(values, IntColumn):
        yield from values.json_pieces()
        return
    yield "["
    for start in range(0, len(values), JSON_SLICE):
        text = int_items(list(values[start : start + JSON_SLICE]))  # a tuple's slice too
        yield text if start == 0 else "," + text
    yield "]"
