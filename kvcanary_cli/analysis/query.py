"""Answers for `kvcanary provenance`: one slot's provenance, or one pool row's map."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from kvcanary_cli.analysis.cells import holding, in_pool_row
from kvcanary_cli.analysis.check import run_check
from kvcanary_cli.analysis.focus import (
    focused_findings,
    focused_index,
    swa_peer,
    touching_part,
)
from kvcanary_cli.analysis.provenance import (
    ProvenanceIndex,
    batch_rows_of,
    cell_role,
    clamp_target,
    clamped_sources,
    full_slots_mapping_to,
    swa_provenance,
)
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.dump.tensor import StoredTensor, distinct
from kvcanary_cli.errors import OptionError
from kvcanary_cli.option_values import INDEX, POSITIVE, SLOT, checked_integer
from kvcanary_cli.planners.base import Planner
from kvcanary_cli.planners.frame import group_frame
from kvcanary_cli.results.cells import Space
from kvcanary_cli.results.check import DumpReport, Finding
from kvcanary_cli.results.provenance import ProvenanceReport, RowCell, RowGap, RowMap, RowOccupancy
from kvcanary_cli.results.shrink import Shrunk

__all__ = ["provenance_report", "row_map", "slot_query"]

#: Cells shown around the interesting parts of a long row.
_EDGE = 16


def provenance_report(
    dump: KvDump,
    planner: Planner,
    *,
    slot: int | None,
    row: int | None,
    space: str,
    group: str | None,
    positions: tuple[int, int] | None,
    max_cells: int,
) -> ProvenanceReport:
    """`kvcanary provenance`'s answer: one slot's provenance (`slot`) or one pool row's map
    (`row`), with the findings touching it."""
    if (slot is None) == (row is None):
        raise OptionError(
            "give exactly one of --slot N or --row R (a vLLM dump: --block N)", option="slot/row"
        )
    if slot is not None:
        checked_integer(slot, "slot", SLOT)
    if row is not None:
        checked_integer(row, "row", INDEX)
    if positions is not None:
        if not isinstance(positions, tuple | list) or len(positions) != 2:
            raise OptionError("is not a (start, end) pair", option="positions")
        for end in positions:
            checked_integer(end, "positions", INDEX)
    checked_integer(max_cells, "max_cells", POSITIVE)
    if slot is not None and space == Space.FULL:
        # only the batch rows that hold (or write) the slot: its findings, not the diagnosis;
        # one scan of the table serves the findings' rows and the answer's cells
        index = focused_index(dump, slot, max_cells=max_cells)
        found = focused_findings(dump, slot, planner=planner, index=index)
        return slot_query(
            dump, found, slot, space=space, group=group, max_cells=max_cells, index=index
        )
    report = run_check(dump, planner=planner, kernel=None)
    if slot is not None:
        found = list(report.findings)
        return slot_query(dump, found, slot, space=space, group=group, max_cells=max_cells)
    assert row is not None
    return row_map(dump, report, row, group=group, positions=positions, max_cells=max_cells)


def slot_query(
    dump: KvDump,
    findings: Sequence[Finding],
    slot: int,
    *,
    space: Space | str = Space.FULL,
    group: str | None = None,
    max_cells: int = 64,
    index: ProvenanceIndex | None = None,
) -> ProvenanceReport:
    """Every cell holding `slot` (whole table), its translation, state, and its findings.

    For `space=swa` the slot is an SWA-pool slot: the full slots whose LUT entry maps to it
    are listed, with their cells. A full slot's cells come from `index` when it has scanned
    for the slot with `max_cells` (`focus.focused_index`), so the table is not scanned again.
    """
    if space not in tuple(Space):
        raise OptionError(f"unknown space {space!r} (expected full or swa)", option="space")
    space = Space(space)
    if space is Space.SWA and dump.full_to_swa_index_mapping is None:
        raise OptionError(
            "this dump has no full_to_swa_index_mapping", option="space", hint="use --space full"
        )
    frame = group_frame(dump, group or (Group.SWA if space is Space.SWA else Group.FULL))
    if space is Space.SWA:
        sources = full_slots_mapping_to(dump, [slot])[slot]
        clamped = clamped_sources(dump, findings) if slot == clamp_target(dump) else ()
        index = ProvenanceIndex(dump, (*sources, *clamped), max_cells=max_cells)
        provenance = swa_provenance(dump, index, slot, sources, frame, clamped_from=clamped)
        sources = (*sources, *clamped)
    else:
        if index is None or index.max_cells != max_cells or slot not in index.slots:
            index = ProvenanceIndex(dump, [slot], max_cells=max_cells)
        provenance = index.provenance(slot, frame)
        sources = (slot,)
    wanted = np.array([slot], dtype=np.int64)
    parts = []
    for f in findings:
        if f.slot is None:
            continue
        if f.space == space:
            parts.append(holding(f, wanted))
        elif space is Space.FULL:
            parts.append(touching_part(f, slot, swa_peer(dump, slot)))
        else:
            parts.append(holding(f, np.asarray(sources, dtype=np.int64)))
    touching = tuple(part for part in parts if part is not None)
    return ProvenanceReport(
        path=str(dump.path),
        identity=dump.identity,
        slot=provenance,
        findings=touching,
        shrunk=_shrunk(dump),
    )


def row_map(
    dump: KvDump,
    report: DumpReport,
    pool_row: int,
    *,
    group: str | None = None,
    positions: tuple[int, int] | None = None,
    max_cells: int = 256,
) -> ProvenanceReport:
    """Map of one pool row: live prefix, window, pending writes, stale tail, marked cells.

    `group` labels the roles with that group's window; by default the group the row's findings
    are in (swa if any is). Shown: every marked cell first (up to `max_cells`), then the
    edges of the live range, the window start and the row's head, in `positions` (a
    `[start, end)` range) when given. What is not shown, in the range or outside it, is
    counted in gaps, never dropped silently. Memory grows with the cells shown, not with the
    row's length (the counts read the row in bounded pieces).
    """
    if not 0 <= pool_row < dump.max_reqs:
        raise OptionError(f"pool row {pool_row} is outside [0, {dump.max_reqs})", option="row")
    touching = tuple(
        part for f in report.findings if (part := in_pool_row(f, pool_row)) is not None
    )
    group = group or (Group.SWA if any(f.group is Group.SWA for f in touching) else Group.FULL)
    frame = group_frame(dump, group)
    row = _Row(dump.req_to_token, pool_row)
    msl = row.length
    lo, hi = (0, msl) if positions is None else (max(positions[0], 0), min(positions[1], msl))
    if positions is not None and lo >= hi:
        raise OptionError(
            f"positions {positions[0]}:{positions[1]} hold no cell of a row of {msl}",
            option="positions",
        )
    marked, marks = _marks(touching, lo, hi, max_cells)
    batch_rows = tuple(batch_rows_of(dump).get(pool_row, ()))
    first = batch_rows[0] if batch_rows else None
    prefix = extend = start = None
    spans: list[tuple[int, int]] = [(0, _EDGE)]  # [a, b) ranges, most telling first
    if first is not None:
        prefix, extend = int(dump.prefix_lens[first]), int(dump.extend_seq_lens[first])
        start = int(frame.window_start[first])
        live_end = min(max(prefix, 0) + max(extend, 0), msl)
        spans += [(start - 1, start + _EDGE), (live_end - _EDGE, live_end + _EDGE), (0, live_end)]
    else:  # an idle row: its first filled cells
        spans += [(p, p + 1) for p in row.nonzero_positions(lo, hi, max_cells)]
    shown = sorted(marks)
    taken = set(shown)
    for a, b in spans:
        for pos in range(max(a, lo), min(b, hi)):
            if len(shown) >= max_cells:
                break
            if pos not in taken:
                shown.append(pos)
                taken.add(pos)
    shown.sort()
    lut = dump.full_to_swa_index_mapping
    slots = row.values(shown)
    cells = []
    for pos, slot in zip(shown, slots, strict=True):
        role, seed = cell_role(dump, frame, first, pos)
        swa = lut.element(slot) if lut is not None and 0 <= slot < lut.shape[0] else None
        cells.append(
            RowCell(
                position=pos,
                slot=int(slot),
                role=role,
                seed=seed,
                swa_slot=swa,
                marks=marks.get(pos, ()),
            )
        )
    live_end = 0 if first is None else min(max(prefix or 0, 0) + max(extend or 0, 0), msl)
    occupancy = row.occupancy(lo, max(min(live_end, hi), row.last_filled(lo, hi) + 1, lo + 1))
    edges = [-1, *shown, msl]  # positions outside --positions are gaps too
    gaps = tuple(
        RowGap(start=a + 1, end=b, filled=row.count_nonzero(a + 1, b))
        for a, b in zip(edges, edges[1:], strict=False)
        if b > a + 1
    )
    return ProvenanceReport(
        path=str(dump.path),
        identity=dump.identity,
        row=RowMap(
            pool_row=pool_row,
            batch_rows=batch_rows,
            prefix_len=prefix,
            extend_len=extend,
            window_start=start,
            group=frame.group,
            cells=tuple(cells),
            filled=row.count_nonzero(0, msl),
            max_seq_len=msl,
            gaps=gaps,
            positions=None if positions is None else (lo, hi),
            marks_not_shown=marked - len(marks),
            occupancy=occupancy,
        ),
        findings=touching,
        shrunk=_shrunk(dump),
    )


def _shrunk(dump: KvDump) -> Shrunk | None:
    """A shrunk dump's `shrunk`, its command made from the file's own name."""
    return None if dump.shrink is None else Shrunk.of(dump.shrink, dump.path.name)


def _marks(
    touching: Sequence[Finding], lo: int, hi: int, max_cells: int
) -> tuple[int, dict[int, tuple[FindingCode, ...]]]:
    """How many positions of `[lo, hi)` a finding's cell is on (every cell of every finding
    in the row, not only each finding's first), and the codes at the first `max_cells` of
    them (each code once, in finding order): the work is one sort of the row's finding
    cells, the Python objects are for the positions shown."""
    positions, owners = [], []
    for i, f in enumerate(touching):
        if f.cells is not None:
            at = f.cells.position
        elif f.position is not None:
            at = np.array([f.position], dtype=np.int64)
        else:
            continue
        at = at[(at >= lo) & (at < hi)]
        positions.append(at)
        owners.append(np.full(at.size, i, dtype=np.int64))
    if not positions:
        return 0, {}
    position, owner = np.concatenate(positions), np.concatenate(owners)
    marked = distinct(position)
    shown = marked[:max_cells]
    keep = np.isin(position, shown)
    position, owner = position[keep], owner[keep]
    order = np.lexsort((owner, position))
    marks: dict[int, list[FindingCode]] = {int(p): [] for p in shown.tolist()}
    for p, i in zip(position[order].tolist(), owner[order].tolist(), strict=True):
        marks[p].append(touching[i].code)
    return int(marked.size), {p: tuple(dict.fromkeys(codes)) for p, codes in marks.items()}


#: cells of a row examined per step when counting or searching (bounds temporaries).
_ROW_CHUNK = 1 << 20
#: the most steps a row's occupancy profile has (what a row strip is drawn from).
_OCCUPANCY_STEPS = 1024


class _Row:
    """One row of `req_to_token`, read in bounded pieces (a shrunk dump: its kept cells)."""

    def __init__(self, table: StoredTensor, pool_row: int) -> None:
        self.table = table
        self.pool_row = pool_row
        self.length = int(table.shape[1])

    def values(self, positions: list[int]) -> list[int]:
        """Slots at `positions` (0 where a shrunk dump did not keep the cell)."""
        if not positions:
            return []
        flat = np.asarray(positions, dtype=np.int64) + self.pool_row * self.length
        return [int(v) for v in self.table.take(flat).tolist()]

    def _pieces(self, start: int, end: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return self.table.row_cells(self.pool_row, start, end, chunk_cells=_ROW_CHUNK)

    def count_nonzero(self, start: int, end: int) -> int:
        """Cells of `[start, end)` holding a slot."""
        return sum(int(np.count_nonzero(values)) for _, values in self._pieces(start, end))

    def last_filled(self, start: int, end: int) -> int:
        """The last position of `[start, end)` holding a slot, or `start - 1`."""
        last = start - 1
        for positions, values in self._pieces(start, end):
            held = positions[values != 0]
            if held.size:
                last = int(held[-1])
        return last

    def occupancy(self, start: int, end: int) -> RowOccupancy:
        """How many positions of each step of `[start, end)` hold a slot: at most
        `_OCCUPANCY_STEPS` steps, one position each for a row up to that long."""
        step = -(-(end - start) // _OCCUPANCY_STEPS)
        filled = np.zeros(-(-(end - start) // step), dtype=np.int64)
        for positions, values in self._pieces(start, end):
            np.add.at(filled, (positions[values != 0] - start) // step, 1)
        return RowOccupancy(start=start, end=end, step=step, filled=tuple(filled.tolist()))

    def nonzero_positions(self, start: int, end: int, limit: int) -> list[int]:
        """The first `limit` positions of `[start, end)` holding a slot, searched in pieces."""
        found: list[int] = []
        for positions, values in self._pieces(start, end):
            if len(found) >= limit:
                break
            found.extend(positions[values != 0][: limit - len(found)].tolist())
        return found
