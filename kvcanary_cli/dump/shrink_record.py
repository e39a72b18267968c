"""The record a shrunk dump carries (`kvcanary.shrink` metadata, schema `kvcanary.shrink/1`).

It says where the small dump came from (the original's file name, size and sha256), which
command-line scalars the analysis ran with, and what was dropped, tensor by tensor (elements,
rows, bytes). The record is read from an untrusted file: every field is checked, and a
malformed one is bad input naming the key. Standard library only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from kvcanary_cli.dump.schema import SCALARS, SHRINK_KEY
from kvcanary_cli.errors import MetadataError
from kvcanary_cli.safe_text import safe_file_name

__all__ = [
    "SHRINK_SCHEMA",
    "ShrinkRecord",
    "TensorCut",
    "parse_shrink_record",
]

SHRINK_SCHEMA = "kvcanary.shrink/1"
_MAX_INT = 1 << 62
_MAX_TENSORS = 4096
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, kw_only=True)
class TensorCut:
    """What shrinking did to one tensor of the original (a record: its fields are the keys of
    a report's `shrunk.tensors`)."""

    name: str
    #: its shape in the original
    shape: tuple[int, ...]
    kept: int
    dropped: int
    dropped_bytes: int
    #: 2-D tensors: rows, and rows holding a kept element
    rows: int | None = None
    kept_rows: int | None = None


@dataclass(frozen=True, kw_only=True)
class ShrinkRecord:
    """Where a shrunk dump came from and what it dropped."""

    source_name: str
    source_bytes: int
    source_sha256: str
    kvcanary_version: str
    #: scalar overrides (format name -> value) the analysis ran with.
    overrides: dict[str, int] = field(default_factory=dict)
    tensors: tuple[TensorCut, ...] = ()

    @property
    def source_file(self) -> str:
        """The original's file name, safe to print and to paste into a shell."""
        return safe_file_name(self.source_name)

    @property
    def dropped_bytes(self) -> int:
        """Bytes of tensor data the small dump does not hold."""
        return sum(t.dropped_bytes for t in self.tensors)

    @property
    def dropped_elements(self) -> int:
        """Elements (cells, entries, bytes of buffers) the small dump does not hold."""
        return sum(t.dropped for t in self.tensors)

    def command(self, small_name: str) -> str:
        """The command that makes the small dump from the original (names made shell-safe)."""
        options = [
            f"--set {name}={value}"
            for name, value in sorted(self.overrides.items())
            if name in SCALARS
        ]
        return " ".join(
            [
                "kvcanary shrink",
                safe_file_name(self.source_name),
                *options,
                "--out",
                safe_file_name(small_name, "SMALL.safetensors"),
            ]
        )

    def _tensors(self) -> list[dict[str, Any]]:
        return [
            {
                "name": t.name,
                "shape": list(t.shape),
                "kept": t.kept,
                "dropped": t.dropped,
                "dropped_bytes": t.dropped_bytes,
                "rows": t.rows,
                "kept_rows": t.kept_rows,
            }
            for t in self.tensors
        ]

    def _source(self) -> dict[str, Any]:
        return {"name": self.source_name, "bytes": self.source_bytes, "sha256": self.source_sha256}

    def to_json(self) -> str:
        """The metadata value (keys sorted: equal records give equal bytes)."""
        record = {
            "schema": SHRINK_SCHEMA,
            "source": self._source(),
            "kvcanary_version": self.kvcanary_version,
            "overrides": dict(sorted(self.overrides.items())),
            "tensors": self._tensors(),
        }
        return json.dumps(record, sort_keys=True, separators=(",", ":"))


def _bad(what: str) -> MetadataError:
    return MetadataError(what, field=SHRINK_KEY, hint="the shrunk dump is damaged; shrink again")


def _text(value: object, what: str, limit: int = 4096) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise _bad(f"{what} is not a string of at most {limit} characters")
    return value


def _count(value: object, what: str, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_INT:
        raise _bad(f"{what} is not a non-negative integer")
    return value


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(f"{what} is not a JSON object")
    return value


def _cut(value: object) -> TensorCut:
    item = _object(value, "a tensors entry")
    shape = item.get("shape")
    if not isinstance(shape, list) or len(shape) > 64:
        raise _bad("a tensors entry's shape is not a list of at most 64 integers")
    dims = tuple(_count(d, "a shape dimension") or 0 for d in shape)
    return TensorCut(
        name=_text(item.get("name"), "a tensors entry's name", 512),
        shape=dims,
        kept=_count(item.get("kept"), "kept") or 0,
        dropped=_count(item.get("dropped"), "dropped") or 0,
        dropped_bytes=_count(item.get("dropped_bytes"), "dropped_bytes") or 0,
        rows=_count(item.get("rows"), "rows", optional=True),
        kept_rows=_count(item.get("kept_rows"), "kept_rows", optional=True),
    )


def parse_shrink_record(text: str) -> ShrinkRecord:
    """Parse and check the `kvcanary.shrink` metadata value; `MetadataError` when malformed."""
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        raise _bad("is not JSON") from None
    record = _object(raw, "the record")
    if record.get("schema") != SHRINK_SCHEMA:
        raise _bad(f"schema is {str(record.get('schema'))[:40]!r}, expected {SHRINK_SCHEMA!r}")
    source = _object(record.get("source"), "source")
    sha = _text(source.get("sha256"), "source.sha256", 64)
    if not _SHA256.fullmatch(sha):
        raise _bad("source.sha256 is not 64 lowercase hex digits")
    overrides = _object(record.get("overrides", {}), "overrides")
    checked: dict[str, int] = {}
    for name, value in overrides.items():
        if name not in SCALARS or isinstance(value, bool) or not isinstance(value, int):
            raise _bad("overrides must map scalar names to integers")
        checked[name] = value
    tensors = record.get("tensors", [])
    if not isinstance(tensors, list) or len(tensors) > _MAX_TENSORS:
        raise _bad(f"tensors is not a list of at most {_MAX_TENSORS} entries")
    return ShrinkRecord(
        source_name=_text(source.get("name"), "source.name"),
        source_bytes=_count(source.get("bytes"), "source.bytes") or 0,
        source_sha256=sha,
        kvcanary_version=_text(record.get("kvcanary_version"), "kvcanary_version", 100),
        overrides=checked,
        tensors=tuple(_cut(t) for t in tensors),
    )
