"""What a SOURCE of `kvcanary violations` is: a dump or a log (docs/canary.md §7).

A dump is a safetensors file: an 8-byte little-endian header length, then a JSON object. A
name ending in `.safetensors` is always taken for a dump, so a damaged one is reported as a
damaged dump. Anything else is a text log, read streaming; `-` is stdin (always a log).
Binary data that is no dump is refused by the log reader.
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path

from kvcanary_cli.dump.header import MAX_HEADER_BYTES
from kvcanary_cli.dump.streams import STANDARD_INPUT_NAME, standard_input_is_closed
from kvcanary_cli.errors import PathError, os_refusal

__all__ = ["SourceKind", "source_kind"]


class SourceKind(StrEnum):
    """A dump or a log."""

    DUMP = "dump"
    LOG = "log"


def source_kind(path: str) -> SourceKind:
    """Classify `path` by its first bytes; a `PathError` when it cannot be read at all."""
    if path == "-":
        if standard_input_is_closed():
            raise PathError(
                "is closed", path=STANDARD_INPUT_NAME, hint="pipe a log into it, or name the log"
            )
        return SourceKind.LOG
    target = Path(path)
    if not target.exists():
        raise PathError("no such file", path=path)
    if target.is_dir():
        raise PathError("is a directory, not a dump or a server log", path=path)
    if not target.is_file():
        raise PathError("is not a regular file", path=path)
    if target.suffix == ".safetensors":
        return SourceKind.DUMP
    try:
        with open(target, "rb") as handle:
            head = handle.read(9)
            size = os.fstat(handle.fileno()).st_size
    except OSError as exc:
        raise PathError(os_refusal(exc, "a dump or a server log"), path=path) from None
    if len(head) == 9 and head[8:9] == b"{":
        length = int.from_bytes(head[:8], "little")
        if 2 <= length <= min(MAX_HEADER_BYTES, size - 8):  # the dump reader's ceiling
            return SourceKind.DUMP
    return SourceKind.LOG
