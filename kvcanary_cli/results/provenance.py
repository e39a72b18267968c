"""Results of `kvcanary provenance`: one slot's cells, or one pool row's map."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvcanary_cli.dump.schema import Group
from kvcanary_cli.dump.shrink_record import ShrinkRecord
from kvcanary_cli.results.cells import Role, SlotProvenance
from kvcanary_cli.results.check import Finding

__all__ = ["ProvenanceReport", "RowCell", "RowGap", "RowMap", "RowOccupancy"]


@dataclass(frozen=True, kw_only=True)
class RowCell:
    """One position of a pool row, for `provenance --row`."""

    position: int
    slot: int
    #: verify, prefix, chain-prev, pending-write, stale-tail or idle-row.
    role: Role
    seed: bool = False
    #: LUT[slot] when the dump has a LUT and the slot is in range.
    swa_slot: int | None = None
    #: codes of the findings that point at this cell.
    marks: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class RowMap:
    """A pool row as the batch sees it: live prefix, window, pending writes, stale tail."""

    pool_row: int
    batch_rows: tuple[int, ...]
    prefix_len: int | None
    extend_len: int | None
    window_start: int | None
    group: Group
    #: positions shown, in order (the live range's edges, a few stale cells, marked cells).
    cells: tuple[RowCell, ...]
    #: positions of the row holding a non-zero slot (shown or not).
    filled: int
    max_seq_len: int
    #: the runs of positions between shown cells that are not shown.
    gaps: tuple[RowGap, ...] = ()
    #: the position range asked for (`--positions`), else None (the whole row).
    window: tuple[int, int] | None = None
    #: marked positions (cells with findings) in the range that did not fit `max_cells`.
    marks_not_shown: int = 0
    #: how full the row is along the range shown, for a picture of it (a row strip).
    occupancy: RowOccupancy | None = None


@dataclass(frozen=True, kw_only=True)
class RowOccupancy:
    """Positions `[start, end)` of a row in steps of `step` positions, and how many of each
    step hold a slot: the range mapped, up to its last filled position or live end."""

    start: int
    end: int
    step: int
    #: per step, its positions holding a non-zero slot.
    filled: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class RowGap:
    """Positions `[start, end)` of a row map that are not shown, and how many hold a slot."""

    start: int
    end: int
    filled: int


@dataclass(frozen=True, kw_only=True)
class ProvenanceReport:
    """Answer of `kvcanary provenance`: one slot's cells, or one pool row's map."""

    SCHEMA: ClassVar[str] = "kvcanary.provenance/2"

    path: str
    identity: dict[str, str]
    slot: SlotProvenance | None = None
    row: RowMap | None = None
    #: findings that touch the slot (or the row).
    findings: tuple[Finding, ...] = ()
    #: set for a shrunk dump (its provenance covers the kept cells only).
    shrink: ShrinkRecord | None = None
