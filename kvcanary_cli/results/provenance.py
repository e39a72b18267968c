"""Results of `kvcanary provenance`: one slot's cells, or one pool row's map.

`ProvenanceReport` is the `kvcanary.provenance/2` record (`results.record.to_record`): each
field is a key (its `#:` comment the key's documentation), a derived key is a `@recorded`
property.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.results.cells import CellRole, SlotProvenance
from kvcanary_cli.results.check import Finding
from kvcanary_cli.results.record import recorded
from kvcanary_cli.results.shrink import Shrunk

__all__ = ["ProvenanceReport", "RowCell", "RowGap", "RowMap", "RowOccupancy"]


@dataclass(frozen=True, kw_only=True)
class RowCell:
    """One shown position of a pool row."""

    position: int
    slot: int
    role: CellRole
    seed: bool = False
    #: LUT[slot] when in range
    swa_slot: int | None = None
    #: codes of the findings with a cell here (each cell of a group, not only its example)
    marks: tuple[FindingCode, ...] = ()

    def __post_init__(self) -> None:  # the codes table's order, whatever order they came in
        codes = sorted((FindingCode(m) for m in self.marks), key=lambda m: m.order)
        object.__setattr__(self, "marks", tuple(codes))


@dataclass(frozen=True, kw_only=True)
class RowGap:
    """Positions [start, end) not shown: between shown cells, or outside --positions."""

    #: positions [start, end) not shown: between shown cells, or outside --positions
    start: int
    end: int
    #: how many of them hold a slot
    filled: int


@dataclass(frozen=True, kw_only=True)
class RowOccupancy:
    """How full a row is along the range mapped, in steps: what its strip is drawn from."""

    #: positions [start, end): the range mapped, up to its last filled position or live end
    start: int
    end: int
    #: positions per step (1 for a row of up to 1024 positions)
    step: int
    #: per step, its positions holding a slot
    filled: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class RowMap:
    """A pool row as the batch sees it: live prefix, window, pending writes, stale tail."""

    pool_row: int
    #: [] when no batch row uses it
    batch_rows: tuple[int, ...]
    #: null when no batch row uses it
    prefix_len: int | None
    extend_len: int | None
    window_start: int | None
    #: whose window labels the roles (default: swa when the row has swa findings, else full)
    group: Group
    #: positions of the row holding a non-zero slot
    filled: int
    max_seq_len: int
    #: shown positions, by position: every marked cell first (up to --max-rows), then the
    #: live range's edges, the window start and the row's head
    cells: tuple[RowCell, ...]
    gaps: tuple[RowGap, ...] = ()
    #: the range asked for (--positions), [start, end), else null
    positions: tuple[int, int] | None = None
    #: marked cells in the range beyond --max-rows
    marks_not_shown: int = 0
    #: how full the row is along the range mapped
    occupancy: RowOccupancy | None = None

    def __post_init__(self) -> None:  # by position, whatever order they were picked in
        object.__setattr__(self, "cells", tuple(sorted(self.cells, key=lambda c: c.position)))


@dataclass(frozen=True, kw_only=True)
class ProvenanceReport:
    """`kvcanary provenance --format json`: one slot's cells, or one pool row's map, and the
    findings touching it."""

    SCHEMA: ClassVar[str] = "kvcanary.provenance/2"

    path: str
    identity: dict[str, str]
    #: as in check: set for a shrunk dump
    shrunk: Shrunk | None = None
    #: --slot
    slot: SlotProvenance | None = None
    #: --row
    row: RowMap | None = None
    #: the findings touching the slot or the row
    findings: tuple[Finding, ...] = ()

    def __post_init__(self) -> None:  # report order, whatever order they were gathered in
        object.__setattr__(self, "findings", tuple(sorted(self.findings, key=Finding.order_key)))

    @recorded
    def kvcanary_version(self) -> str:
        """The kvcanary that answered."""
        import kvcanary_cli

        return kvcanary_cli.__version__
