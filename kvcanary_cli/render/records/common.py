"""What several records share: the names of groups, spaces and roles as `Literal` types, the
JSON value type, and the finding, slot provenance, shrunk and identity pieces with the one
function that builds each.

Codes, severities and confidences are the catalog's enums themselves (`kvcanary_cli.catalog`;
a `StrEnum` member is its string in JSON). The `Literal`s that mirror an enum of the analysis
(`Group`, `Space`, `Role`) are checked against it by tests/render/test_record_types.py, so the
two cannot drift; a value is narrowed to its `Literal` in the record builders
(`render/records/`) and nowhere else, and the output tests validate every record against its
declaration. The `#:` comment above a key is its documentation: docs/json-schema.md's key
tables are generated from these declarations (tests/render/schema_doc.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath
from typing import TYPE_CHECKING, Literal, TypedDict, Union, cast

from kvcanary_cli.catalog import CauseCode, FindingCode, Severity
from kvcanary_cli.dump.shrink_record import ShrinkRecord
from kvcanary_cli.render.records.columns import IntColumn
from kvcanary_cli.results.cells import CellColumns, SlotProvenance
from kvcanary_cli.results.check import UPSTREAM_RAISE, Finding

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "SHRUNK_NOTE",
    "UPSTREAM_RAISE",
    "AllocatorState",
    "CanaryEntryRecord",
    "CellColumnsRecord",
    "CellRecord",
    "CellRole",
    "FindingRecord",
    "FindingRole",
    "GroupName",
    "JsonValue",
    "RingRowRecord",
    "ScalarOrigin",
    "ShrinkSourceRecord",
    "ShrinkSummaryRecord",
    "ShrunkRecord",
    "SpanRecord",
    "SlotProvenanceRecord",
    "SpaceName",
    "TensorCutRecord",
    "cells_record",
    "code_counts",
    "details_record",
    "finding_record",
    "findings_record",
    "group_name",
    "identity_record",
    "shrink_summary_record",
    "shrunk_record",
    "slot_provenance_record",
    "span_record",
]

#: An attention group: full attention, or the sliding window's.
GroupName = Literal["full", "swa"]
#: Which KV pool a slot indexes.
SpaceName = Literal["full", "swa"]
#: A `req_to_token` cell's role in the batch (docs/findings.md, "Roles").
CellRole = Literal["verify", "prefix", "chain-prev", "pending-write", "stale-tail", "idle-row"]
#: A finding's role: a cell role, or the plan read that met the problem.
FindingRole = Literal[
    "verify",
    "prefix",
    "chain-prev",
    "pending-write",
    "stale-tail",
    "idle-row",
    "seed",
    "expected-token",
]
#: A slot on the allocator's free list, or not (in use), or no slot of the pool at all
#: (negative, or >= the pool size); unknown where a shrunk dump did not keep it.
AllocatorState = Literal["free", "in use", "beyond the pool", "unknown (not kept)"]
#: Where a scalar's value came from, as a fact or an assumption.
ScalarOrigin = Literal["recorded", "overridden", "derived", "default", "unknown"]
#: Any JSON value (a finding's `details` are code-specific).
JsonValue = Union[None, bool, int, float, str, list["JsonValue"], dict[str, "JsonValue"]]  # noqa: UP007

#: What every report on a shrunk dump says about its provenance.
SHRUNK_NOTE = (
    "shrunk dump: provenance covers the kept cells only (cells, counts and allocator states "
    "elsewhere in the original are not in it)"
)


def group_name(group: str) -> GroupName:
    """A group as the analysis names it (`full`, `swa`); `str()` keeps a StrEnum's value."""
    return cast(GroupName, str(group))


def code_counts(counts: dict[str, int]) -> dict[FindingCode, int]:
    """A finding code -> count mapping of the analysis, keyed by the codes themselves."""
    return {FindingCode(code): n for code, n in counts.items()}


class CellRecord(TypedDict):
    """One `req_to_token` cell holding the slot."""

    pool_row: int
    position: int
    #: batch rows using this pool row; [] for an idle row
    batch_rows: list[int]
    role: CellRole
    #: P-1 of a row that writes
    seed: bool
    #: same slot, same position in another live row
    shared: bool
    #: space swa: the full slot this cell holds
    full_slot: int | None


class CanaryEntryRecord(TypedDict):
    """The slot's record in one canary buffer."""

    #: the canary tensor, canary.<group>.<head|tail>.<k|v>
    buffer: str
    token: int
    position: int
    prev_hash: int
    real_kv_hash: int


class RingRowRecord(TypedDict):
    """A violation-ring row whose slot field is this slot."""

    #: the ring row
    index: int
    #: its 8 fields (docs/canary.md §4)
    fields: list[int]


class SlotProvenanceRecord(TypedDict):
    """Where one slot lives: every cell holding it, its translation, allocator and canary."""

    slot: int
    space: SpaceName
    #: live cells first, then stale tails of batch rows, then idle rows; at most 16 in check,
    #: 256 or --max-rows if more in provenance
    cells: list[CellRecord]
    #: count over the whole table, not only those listed
    cells_total: int
    #: LUT[slot], for a full slot inside the LUT
    swa_slot: int | None
    #: set when swa_slot is missing or 0, saying why
    translation_note: str | None
    #: space swa: full slots f with LUT[f] == slot (the last index too when it is not the -1)
    mapped_from: list[int]
    #: space swa, for LUT[lut_len - 1] of a LUT without its -1: the slots >= lut_len the GPU
    #: clamps here
    clamped_from: list[int]
    #: null: no free list for this space in the dump; unknown: a shrunk dump that did not keep
    #: the slot
    allocator: AllocatorState | None
    #: a shrunk dump: the kept records
    canary: list[CanaryEntryRecord]
    #: the slot's first 16 ring rows, oldest first
    violations: list[RingRowRecord]
    #: all of the slot's valid ring rows
    violations_total: int


class CellColumnsRecord(TypedDict):
    """Every cell of a finding group as parallel columns: entry i of each list is cell i, in
    report order (batch row, then position). Complete: nothing is dropped. In the record each
    column is an `IntColumn` over the analysis' array (JSON writes it as a list; a view reads
    the entries it shows)."""

    #: -1 in the three coordinate columns: a finding about slots (a free-list entry, a LUT
    #: entry), not table cells
    batch_row: Sequence[int]
    pool_row: Sequence[int]
    position: Sequence[int]
    #: the slot of each cell (an SWA slot for space swa); null for a finding about a cell's
    #: expected-token gather (its `gather_index` column says where the gather went)
    slot: Sequence[int] | None
    #: the code's own per-cell columns (docs/json-schema.md, "Finding"): full_slot
    #: (swa-slot-collision and freed-slot-in-live-range of space swa), owner_position
    #: (slot-shared-across-positions), out_cache_loc_index (write-to-live-slot), gather_index
    #: (expected-token-out-of-range); {} for the other codes
    extra: dict[str, Sequence[int]]


class SpanRecord(TypedDict):
    """Where a finding group's cells lie: [first, last] ranges and distinct counts."""

    #: distinct batch rows holding its cells (0 for a finding about slots, not cells)
    rows: int
    #: [smallest, largest] batch row; null for a finding about slots (a free list, the LUT),
    #: whose cell columns hold -1
    batch_rows: list[int] | None
    #: [smallest, largest] position; null as batch_rows
    positions: list[int] | None
    #: [smallest, largest] slot; null without slots
    slots: list[int] | None
    #: distinct slots among its cells (0 without slots)
    distinct_slots: int


class FindingRecord(TypedDict):
    """One finding group: cells sharing a code, cause, group and role (or one row or
    tensor), with where they came from."""

    code: FindingCode
    severity: Severity
    group: GroupName
    #: the example cell's slot (where SGLang's reference raises, when the group holds that
    #: cell; else its first cell); null for row-, batch- and tensor-level findings
    slot: int | None
    #: which pool the slot belongs to
    space: SpaceName
    #: the example cell's batch row (a row-level finding: its row)
    batch_row: int | None
    #: the example cell's pool row
    pool_row: int | None
    #: the example cell's position
    position: int | None
    #: cells the finding stands for (1 for a row-, batch- or tensor-level finding)
    count: int
    #: the role of every cell of the group, or the plan read that met the problem (seed,
    #: expected-token)
    role: FindingRole | None
    #: for one cell: what it is; for more: what they share
    message: str
    #: code-specific facts (below), JSON values only
    details: dict[str, JsonValue]
    #: every cell, as columns; null for row-, batch- and tensor-level findings
    cells: CellColumnsRecord | None
    #: where the cells lie; null when `cells` is
    span: SpanRecord | None
    #: provenance of the group's first distinct slots (the example's first)
    provenance: list[SlotProvenanceRecord]
    #: distinct slots the group has (provenance lists the first few)
    provenance_total: int
    #: derived scalars it rests on (then severity info)
    assumes: list[str]
    #: the diagnosis cause it is grouped under
    cause: CauseCode | None
    #: SGLang's torch reference raises first at the example cell
    first_raise: bool


class ShrinkSourceRecord(TypedDict):
    """The original a shrunk dump was made from."""

    #: the original's file name, as recorded
    name: str
    #: its size
    bytes: int
    #: its sha256 (64 hex digits)
    sha256: str


class TensorCutRecord(TypedDict):
    """What shrinking did to one tensor of the original."""

    name: str
    #: its shape in the original
    shape: list[int]
    kept: int
    dropped: int
    dropped_bytes: int
    #: 2-D tensors: rows, and rows holding a kept element
    rows: int | None
    kept_rows: int | None


class ShrinkSummaryRecord(TypedDict):
    """Where a shrunk dump came from and what it dropped (`inspect`'s `shrink`)."""

    #: the original dump
    source: ShrinkSourceRecord
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
    tensors: list[TensorCutRecord]
    #: the shrink command that makes this dump from the original (file names made shell-safe)
    command: str


class ShrunkRecord(ShrinkSummaryRecord):
    """A report's `shrunk`: the summary, and what it means for the report."""

    #: provenance covers the kept cells only
    note: str


def _json_safe(value: object) -> JsonValue:
    """`details` are meant to be JSON-safe; make sure (tuples → lists, odd scalars → str)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _json_safe(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return str(value)


def details_record(details: dict[str, object]) -> dict[str, JsonValue]:
    """A finding's `details` as the record carries them: JSON values, keys sorted."""
    return {str(k): _json_safe(details[k]) for k in sorted(details, key=str)}


def slot_provenance_record(prov: SlotProvenance) -> SlotProvenanceRecord:
    """One slot's provenance, as `check`, `provenance` and `violations` records carry it."""
    return {
        "slot": prov.slot,
        "space": cast(SpaceName, str(prov.space)),
        "cells": [
            {
                "pool_row": c.pool_row,
                "position": c.position,
                "batch_rows": list(c.batch_rows),
                "role": cast(CellRole, str(c.role)),
                "seed": c.seed,
                "shared": c.shared,
                "full_slot": c.full_slot,
            }
            for c in prov.cells
        ],
        "cells_total": prov.cells_total,
        "swa_slot": prov.swa_slot,
        "translation_note": prov.translation_note,
        "mapped_from": list(prov.mapped_from),
        "clamped_from": list(prov.clamped_from),
        "allocator": cast(AllocatorState | None, prov.allocator),
        "canary": [
            {
                "buffer": r.buffer,
                "token": r.token,
                "position": r.position,
                "prev_hash": r.prev_hash,
                "real_kv_hash": r.real_kv_hash,
            }
            for r in prov.canary
        ],
        "violations": [{"index": v.index, "fields": list(v.fields)} for v in prov.violations],
        "violations_total": prov.violations_total,
    }


def cells_record(cells: CellColumns | None) -> CellColumnsRecord | None:
    """A finding group's cells as columns (None for a row- or tensor-level finding): each an
    `IntColumn` over the group's array, so building the record converts no cell."""
    if cells is None:
        return None

    def column(name: str) -> IntColumn | None:
        held = cells.column(name)  # as held (a narrow dtype): its ints are the same
        return None if held is None else IntColumn(held)

    batch_row, pool_row, position = column("batch_row"), column("pool_row"), column("position")
    assert batch_row is not None and pool_row is not None and position is not None
    extra = {name: column(name) for name in sorted(cells.extra)}
    return {
        "batch_row": batch_row,
        "pool_row": pool_row,
        "position": position,
        "slot": column("slot"),
        "extra": {name: values for name, values in extra.items() if values is not None},
    }


def span_record(cells: CellColumns | None) -> SpanRecord | None:
    """Ranges and distinct counts of a finding group's cells (None without cells)."""
    if cells is None or not len(cells):
        return None

    def bounds(values: np.ndarray) -> list[int]:
        return [int(values.min()), int(values.max())]

    # the columns as held (a narrow dtype): bounds and counts are the same
    slots, position = cells.column("slot"), cells.column("position")
    batch_row = cells.column("batch_row")
    assert position is not None and batch_row is not None
    in_table = bool((position >= 0).any())
    return {
        "rows": cells.distinct_count("batch_row") if in_table else 0,
        "batch_rows": bounds(batch_row) if in_table else None,
        "positions": bounds(position) if in_table else None,
        "slots": None if slots is None else bounds(slots),
        "distinct_slots": cells.distinct_count("slot"),
    }


def finding_record(finding: Finding) -> FindingRecord:
    """One finding (group) as every record carries it."""
    return {
        "code": finding.code,
        "severity": finding.severity,
        "group": group_name(finding.group),
        "slot": finding.slot,
        "space": cast(SpaceName, str(finding.space)),
        "batch_row": finding.batch_row,
        "pool_row": finding.pool_row,
        "position": finding.position,
        "count": finding.count,
        "role": None if finding.role is None else cast(FindingRole, str(finding.role)),
        "message": finding.message,
        "details": details_record(
            finding.details
            if finding.upstream_raise is None
            else {**finding.details, UPSTREAM_RAISE: finding.upstream_raise}
        ),
        "cells": cells_record(finding.cells),
        "span": span_record(finding.cells),
        "provenance": [slot_provenance_record(p) for p in finding.provenance],
        "provenance_total": finding.provenance_total,
        "assumes": list(finding.assumes),
        "cause": None if finding.cause is None else finding.cause,
        "first_raise": finding.first_raise,
    }


def findings_record(findings: tuple[Finding, ...]) -> list[FindingRecord]:
    """Findings in report order (docs/json-schema.md, "Order")."""
    return [finding_record(f) for f in sorted(findings, key=Finding.order_key)]


def shrink_summary_record(shrink: ShrinkRecord, small_name: str) -> ShrinkSummaryRecord:
    """The source, what was dropped in total and per tensor, and the command that makes
    `small_name` from the source."""
    return {
        "source": {
            "name": shrink.source_name,
            "bytes": shrink.source_bytes,
            "sha256": shrink.source_sha256,
        },
        "source_file": shrink.source_file,
        "kvcanary_version": shrink.kvcanary_version,
        "overrides": dict(sorted(shrink.overrides.items())),
        "dropped_bytes": shrink.dropped_bytes,
        "dropped_elements": shrink.dropped_elements,
        "tensors": [
            {
                "name": t.name,
                "shape": list(t.shape),
                "kept": t.kept,
                "dropped": t.dropped,
                "dropped_bytes": t.dropped_bytes,
                "rows": t.rows,
                "kept_rows": t.kept_rows,
            }
            for t in shrink.tensors
        ],
        "command": shrink.command(small_name),
    }


def shrunk_record(shrink: ShrinkRecord | None, path: str) -> ShrunkRecord | None:
    """The `shrunk` object of a report on the dump at `path` (None: not a shrunk dump)."""
    if shrink is None:
        return None
    return {**shrink_summary_record(shrink, PurePath(path).name), "note": SHRUNK_NOTE}


def identity_record(identity: dict[str, str]) -> dict[str, str]:
    """Identity keys in the dump's order (the format's identity keys first)."""
    return {k: str(v) for k, v in identity.items()}
