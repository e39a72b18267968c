"""Results of `kvcanary inspect`: what a dump holds.

`DumpDescription` is the `kvcanary.inspect/2` record (`results.record.to_record`): each field
is a key, its `#:` comment the key's documentation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from kvcanary_cli.dump.schema import Group
from kvcanary_cli.results.check import ScalarOrigin
from kvcanary_cli.results.shrink import ShrinkSummary

__all__ = [
    "BatchDescription",
    "DumpDescription",
    "GroupDescription",
    "ScalarDescription",
    "ScalarSource",
    "TensorDescription",
]

#: Where a scalar's value was read (`inspect` takes no overrides: never command line there).
ScalarSource = Literal["metadata", "tensor", "command line", "default", "derived (lut_len - 1)"]


@dataclass(frozen=True, kw_only=True)
class TensorDescription:
    """One tensor of the file."""

    name: str
    #: int32, int64, uint8, ...
    dtype: str
    shape: tuple[int, ...]
    bytes: int
    #: what the format says it is; "scalar" for a scalar tensor; null when ignored
    role: str | None
    #: a sparse tensor of a shrunk dump: elements stored (`shape` is then the original's); null
    #: otherwise
    kept: int | None


@dataclass(frozen=True, kw_only=True)
class ScalarDescription:
    """One scalar key of the format."""

    name: str
    #: null: not recorded and no default applies here
    value: int | None
    source: ScalarSource
    origin: ScalarOrigin
    #: how the command line overrides it (--set NAME=N)
    option: str
    #: what it is, as `--help` says
    meaning: str


@dataclass(frozen=True, kw_only=True)
class GroupDescription:
    """An attention group of the dump."""

    name: Group
    window: int


@dataclass(frozen=True, kw_only=True)
class BatchDescription:
    """The batch in numbers."""

    bs: int
    active_rows: int
    padding_rows: int
    #: over active rows, negatives as 0
    total_prefix_tokens: int
    total_extend_tokens: int
    max_reqs: int
    max_seq_len: int
    lut_len: int | None


@dataclass(frozen=True, kw_only=True)
class DumpDescription:
    """`kvcanary inspect --format json`: tensors, scalars with their source, groups, batch,
    identity, notes."""

    SCHEMA: ClassVar[str] = "kvcanary.inspect/2"

    path: str
    file_bytes: int
    #: the kvcanary.format metadata value
    format: str | None
    #: in the order of the file's header
    tensors: tuple[TensorDescription, ...]
    #: every scalar key, in the order of dump-format.md
    scalars: tuple[ScalarDescription, ...]
    groups: tuple[GroupDescription, ...]
    batch: BatchDescription
    #: the identity keys, as in check's "identity"
    identity: dict[str, str]
    #: as in check: the SGLang installed here
    sglang_installed: str | None
    #: metadata that is neither a scalar nor an identity key
    other_metadata: dict[str, str]
    #: a shrunk dump's record, as check's "shrunk" without its note
    shrink: ShrinkSummary | None
    #: reading notes, and dtypes the GPU path would refuse
    notes: tuple[str, ...]
