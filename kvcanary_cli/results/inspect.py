"""Results of `kvcanary inspect`: what a dump holds (a `DumpDescription`).

Frozen and typed; render turns it into the `kvcanary.inspect/2` record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvcanary_cli.dump.shrink_record import ShrinkRecord

__all__ = ["BatchDescription", "DumpDescription", "ScalarDescription", "TensorDescription"]


@dataclass(frozen=True, kw_only=True)
class TensorDescription:
    """One tensor of the file, in header order."""

    name: str
    #: the dtype's name (`int32`, `int64`, `uint8`, ...).
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    #: what the format says it is; None when ignored.
    role: str | None
    #: elements stored, for a sparse tensor of a shrunk dump (`shape` is the original's).
    kept: int | None


@dataclass(frozen=True, kw_only=True)
class ScalarDescription:
    """A scalar as resolved, where it came from, and the option that overrides it."""

    name: str
    value: int | None
    source: str
    origin: str
    option: str
    meaning: str


@dataclass(frozen=True, kw_only=True)
class BatchDescription:
    """The batch in numbers (lengths over active rows, negatives counted as 0)."""

    bs: int
    active_rows: int
    padding_rows: int
    total_prefix_tokens: int
    total_extend_tokens: int
    max_reqs: int
    max_seq_len: int
    lut_len: int | None


@dataclass(frozen=True, kw_only=True)
class DumpDescription:
    """What a dump holds: tensors, scalars with their source, groups, batch, identity, notes."""

    SCHEMA: ClassVar[str] = "kvcanary.inspect/2"

    path: str
    #: the file's name, for the command that remakes a shrunk dump.
    file_name: str
    file_bytes: int
    #: the `kvcanary.format` metadata value.
    format: str | None
    tensors: tuple[TensorDescription, ...]
    scalars: tuple[ScalarDescription, ...]
    #: (group, window) in planning order.
    groups: tuple[tuple[str, int], ...]
    batch: BatchDescription
    identity: dict[str, str]
    shrink: ShrinkRecord | None
    #: the SGLang version installed here (None: not installed).
    sglang_installed: str | None
    #: metadata that is neither a scalar nor an identity key, by key.
    other_metadata: dict[str, str]
    #: reading notes, and dtypes the GPU path would refuse.
    notes: tuple[str, ...]
