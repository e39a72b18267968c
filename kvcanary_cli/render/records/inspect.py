"""The `kvcanary.inspect/2` record (what a dump holds): its declaration, and `inspect_record`,
the one place it is built from `results.inspect.DumpDescription`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypedDict, cast

from kvcanary_cli.render.records.common import GroupName, group_name, identity_record
from kvcanary_cli.results.check import ScalarOrigin
from kvcanary_cli.results.shrink import ShrinkSummary

if TYPE_CHECKING:  # describe reads dumps with numpy: `kvcanary --help` does not import it
    from kvcanary_cli.results.inspect import DumpDescription

__all__ = ["INSPECT_SCHEMA", "InspectRecord", "ScalarSource", "inspect_record"]

INSPECT_SCHEMA: Literal["kvcanary.inspect/2"] = "kvcanary.inspect/2"

#: Where a scalar's value was read (`inspect` takes no overrides: never command line there).
ScalarSource = Literal["metadata", "tensor", "command line", "default", "derived (lut_len - 1)"]


class TensorRecord(TypedDict):
    """One tensor of the file."""

    name: str
    #: int32, int64, uint8, ...
    dtype: str
    shape: list[int]
    bytes: int
    #: what the format says it is; "scalar" for a scalar tensor; null when ignored
    role: str | None
    #: a sparse tensor of a shrunk dump: elements stored (`shape` is then the original's); null
    #: otherwise
    kept: int | None


class InspectScalarRecord(TypedDict):
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


class InspectGroupRecord(TypedDict):
    """An attention group of the dump."""

    name: GroupName
    window: int


class BatchRecord(TypedDict):
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


class InspectRecord(TypedDict):
    """`kvcanary inspect --format json`."""

    schema: Literal["kvcanary.inspect/2"]
    path: str
    file_bytes: int
    #: the kvcanary.format metadata value
    format: str | None
    #: in the order of the file's header
    tensors: list[TensorRecord]
    #: every scalar key, in the order of dump-format.md
    scalars: list[InspectScalarRecord]
    groups: list[InspectGroupRecord]
    batch: BatchRecord
    #: the identity keys, as in check's "identity"
    identity: dict[str, str]
    #: as in check: the SGLang installed here
    sglang_installed: str | None
    #: metadata that is neither a scalar nor an identity key
    other_metadata: dict[str, str]
    #: a shrunk dump's record, as check's "shrunk" without its note
    shrink: ShrinkSummary | None
    #: reading notes, and dtypes the GPU path would refuse
    notes: list[str]


def inspect_record(description: DumpDescription) -> InspectRecord:
    """The `kvcanary.inspect/2` record of a dump's description."""
    batch = description.batch
    return {
        "schema": INSPECT_SCHEMA,
        "path": description.path,
        "file_bytes": description.file_bytes,
        "format": description.format,
        "tensors": [
            {
                "name": t.name,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "bytes": t.nbytes,
                "role": t.role,
                "kept": t.kept,
            }
            for t in description.tensors
        ],
        "scalars": [
            {
                "name": s.name,
                "value": s.value,
                "source": cast(ScalarSource, s.source),
                "origin": cast(ScalarOrigin, s.origin),
                "option": s.option,
                "meaning": s.meaning,
            }
            for s in description.scalars
        ],
        "groups": [{"name": group_name(g), "window": w} for g, w in description.groups],
        "batch": {
            "bs": batch.bs,
            "active_rows": batch.active_rows,
            "padding_rows": batch.padding_rows,
            "total_prefix_tokens": batch.total_prefix_tokens,
            "total_extend_tokens": batch.total_extend_tokens,
            "max_reqs": batch.max_reqs,
            "max_seq_len": batch.max_seq_len,
            "lut_len": batch.lut_len,
        },
        "identity": identity_record(description.identity),
        "shrink": None
        if description.shrink is None
        else ShrinkSummary.of(description.shrink, description.file_name),
        "sglang_installed": description.sglang_installed,
        "other_metadata": dict(description.other_metadata),
        "notes": list(description.notes),
    }
