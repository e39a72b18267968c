"""The `kvcanary.provenance/2` record (one slot's provenance, or one pool row's map): its
declaration, and `provenance_record`, the one place it is built."""

from __future__ import annotations

from pathlib import PurePath
from typing import Literal, TypedDict, cast

import kvcanary_cli
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.render.records.common import GroupName, group_name, identity_record
from kvcanary_cli.results.cells import CellRole, SlotProvenance
from kvcanary_cli.results.check import Finding
from kvcanary_cli.results.provenance import ProvenanceReport, RowMap
from kvcanary_cli.results.shrink import Shrunk

__all__ = [
    "PROVENANCE_SCHEMA",
    "GapRecord",
    "OccupancyRecord",
    "ProvenanceRecord",
    "RowCellRecord",
    "RowMapRecord",
    "provenance_record",
]

PROVENANCE_SCHEMA: Literal["kvcanary.provenance/2"] = "kvcanary.provenance/2"


class RowCellRecord(TypedDict):
    """One shown position of a pool row."""

    position: int
    slot: int
    role: CellRole
    seed: bool
    #: LUT[slot] when in range
    swa_slot: int | None
    #: codes of the findings with a cell here (each cell of a group, not only its example)
    marks: list[FindingCode]


class GapRecord(TypedDict):
    """Positions [start, end) not shown: between shown cells, or outside --positions."""

    #: positions [start, end) not shown: between shown cells, or outside --positions
    start: int
    end: int
    #: how many of them hold a slot
    filled: int


class OccupancyRecord(TypedDict):
    """How full a row is along the range mapped, in steps: what its strip is drawn from."""

    #: positions [start, end): the range mapped, up to its last filled position or live end
    start: int
    end: int
    #: positions per step (1 for a row of up to 1024 positions)
    step: int
    #: per step, its positions holding a slot
    filled: list[int]


class RowMapRecord(TypedDict):
    """A pool row as the batch sees it."""

    pool_row: int
    #: [] when no batch row uses it
    batch_rows: list[int]
    #: null when no batch row uses it
    prefix_len: int | None
    extend_len: int | None
    window_start: int | None
    #: whose window labels the roles (default: swa when the row has swa findings, else full)
    group: GroupName
    #: positions of the row holding a non-zero slot
    filled: int
    max_seq_len: int
    #: shown positions, by position: every marked cell first (up to --max-rows), then the live
    #: range's edges, the window start and the row's head
    cells: list[RowCellRecord]
    gaps: list[GapRecord]
    #: the range asked for (--positions), [start, end), else null
    positions: list[int] | None
    #: marked cells in the range beyond --max-rows
    marks_not_shown: int
    #: how full the row is along the range mapped
    occupancy: OccupancyRecord | None


class ProvenanceRecord(TypedDict):
    """`kvcanary provenance --format json`."""

    schema: Literal["kvcanary.provenance/2"]
    kvcanary_version: str
    path: str
    identity: dict[str, str]
    #: as in check: set for a shrunk dump
    shrunk: Shrunk | None
    #: --slot
    slot: SlotProvenance | None
    #: --row
    row: RowMapRecord | None
    #: the findings touching the slot or the row
    findings: list[Finding]


def _row(row: RowMap) -> RowMapRecord:
    return {
        "pool_row": row.pool_row,
        "batch_rows": list(row.batch_rows),
        "prefix_len": row.prefix_len,
        "extend_len": row.extend_len,
        "window_start": row.window_start,
        "group": group_name(row.group),
        "filled": row.filled,
        "max_seq_len": row.max_seq_len,
        "cells": [
            {
                "position": c.position,
                "slot": c.slot,
                "role": cast(CellRole, c.role),
                "seed": c.seed,
                "swa_slot": c.swa_slot,
                "marks": [
                    code
                    for code in sorted((FindingCode(m) for m in c.marks), key=lambda m: m.order)
                ],
            }
            for c in sorted(row.cells, key=lambda c: c.position)
        ],
        "gaps": [{"start": g.start, "end": g.end, "filled": g.filled} for g in row.gaps],
        "positions": None if row.window is None else list(row.window),
        "marks_not_shown": row.marks_not_shown,
        "occupancy": None
        if row.occupancy is None
        else {
            "start": row.occupancy.start,
            "end": row.occupancy.end,
            "step": row.occupancy.step,
            "filled": list(row.occupancy.filled),
        },
    }


def provenance_record(report: ProvenanceReport) -> ProvenanceRecord:
    """The `kvcanary.provenance/2` record: one slot's provenance or one pool row's map."""
    return {
        "schema": PROVENANCE_SCHEMA,
        "kvcanary_version": kvcanary_cli.__version__,
        "path": report.path,
        "identity": identity_record(report.identity),
        "shrunk": None
        if report.shrink is None
        else Shrunk.of(report.shrink, PurePath(report.path).name),
        "slot": report.slot,
        "row": None if report.row is None else _row(report.row),
        "findings": sorted(report.findings, key=Finding.order_key),
    }
