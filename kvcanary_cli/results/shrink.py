"""A shrunk dump in a report: where it came from and what it dropped (`ShrinkSummary`, the
`shrink` of `kvcanary.inspect/2`), and what that means for a report on it (`Shrunk`, the
`shrunk` of a check or provenance report). Both are made from the dump's `kvcanary.shrink`
record (`dump.shrink_record.ShrinkRecord`) and the small dump's file name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

from kvcanary_cli.dump.shrink_record import ShrinkRecord, TensorCut

__all__ = ["SHRUNK_NOTE", "ShrinkSource", "ShrinkSummary", "Shrunk"]

#: What every report on a shrunk dump says about its provenance.
SHRUNK_NOTE = (
    "shrunk dump: provenance covers the kept cells only (cells, counts and allocator states "
    "elsewhere in the original are not in it)"
)


@dataclass(frozen=True, kw_only=True)
class ShrinkSource:
    """The original a shrunk dump was made from."""

    #: the original's file name, as recorded
    name: str
    #: its size
    bytes: int
    #: its sha256 (64 hex digits)
    sha256: str


@dataclass(frozen=True, kw_only=True)
class ShrinkSummary:
    """Where a shrunk dump came from and what it dropped (`inspect`'s `shrink`)."""

    #: the original dump
    source: ShrinkSource
    #: the name made safe to print and paste (A-Za-z0-9._+-)
    source_file: str
    #: the kvcanary that shrank it
    kvcanary_version: str
    #: scalar options the shrink ran with
    overrides: dict[str, int]
    #: tensor bytes of the original not in the small dump
    dropped_bytes: int
    #: elements (cells, entries, buffer bytes) not in it
    dropped_elements: int
    #: per tensor cut or dropped, by name
    tensors: tuple[TensorCut, ...]
    #: the shrink command that makes this dump from the original (file names made shell-safe)
    command: str

    @classmethod
    def of(cls, shrink: ShrinkRecord, small_name: str) -> Self:
        """The summary of the dump `small_name` whose shrink record is `shrink`."""
        return cls(
            source=ShrinkSource(
                name=shrink.source_name, bytes=shrink.source_bytes, sha256=shrink.source_sha256
            ),
            source_file=shrink.source_file,
            kvcanary_version=shrink.kvcanary_version,
            overrides=dict(sorted(shrink.overrides.items())),
            dropped_bytes=shrink.dropped_bytes,
            dropped_elements=shrink.dropped_elements,
            tensors=shrink.tensors,
            command=shrink.command(small_name),
        )


@dataclass(frozen=True, kw_only=True)
class Shrunk(ShrinkSummary):
    """A report's `shrunk`: the summary, and what it means for the report."""

    #: provenance covers the kept cells only
    note: str = SHRUNK_NOTE
