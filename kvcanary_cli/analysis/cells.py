"""Operations on a finding group's cells (`results.cells.CellColumns`): a part of it, its example.

Detectors keep the cells they find as arrays; a finding group of a million cells is five
arrays, and these functions select, split and re-point groups without a Python object per
cell.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace

import numpy as np

from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.dump.tensor import distinct, union  # the layers below sort the same way
from kvcanary_cli.results.check import Finding, JsonValue

__all__ = [
    "IDS_SHOWN",
    "PIECE_CELLS",
    "at_cell",
    "cell_index",
    "cell_slots",
    "distinct",
    "flat_ids",
    "id_list_finding",
    "held_slots",
    "holding",
    "in_pool_row",
    "part",
    "pieces",
    "restricted",
    "pairs_among",
    "repeated",
    "span",
    "with_example",
]


#: Cells whose pair keys `pairs_among` makes at a time (bounds its int64 temporaries).
_KEY_CHUNK = 1 << 20
#: Cells `pieces` hands over at a time.
PIECE_CELLS = 1 << 20


def pieces(mask: np.ndarray, *columns: np.ndarray) -> Iterator[tuple[np.ndarray, ...]]:
    """`mask` and `columns` (of a finding group's cells) `PIECE_CELLS` cells at a time, as
    views: what indexes, counts or compares a narrow column by the cells of a mask makes
    int64 temporaries a piece long, not as long as every cell (80 MB each for ten million)."""
    for a in range(0, mask.size, PIECE_CELLS):
        b = a + PIECE_CELLS
        yield (mask[a:b], *(column[a:b] for column in columns))


def pairs_among(
    rows: np.ndarray, slots: np.ndarray, among_rows: np.ndarray, among_slots: np.ndarray
) -> np.ndarray:
    """Mask of the (row, slot) pairs that are also among (`among_rows`, `among_slots`):
    both columns ranked together, so no product of two values a dump chooses is formed. The
    pairs' keys are made `_KEY_CHUNK` cells at a time into the narrowest dtype holding every
    key, and sorted a chunk at a time (ten million cells of one slot in a few thousand rows:
    no key, index or sorted copy of every cell)."""
    if rows.size == 0 or among_rows.size == 0:
        return np.zeros(rows.shape, dtype=bool)
    # each column's distinct values first: the sorts are of a chunk, not of two columns joined
    row_keys = union(_distinct_pieces(rows), _distinct_pieces(among_rows))
    slot_keys = union(_distinct_pieces(slots), _distinct_pieces(among_slots))
    width = np.int64(slot_keys.size)
    held = np.min_scalar_type(-int(row_keys.size * width))  # signed, holds every key

    def key(r: np.ndarray, s: np.ndarray) -> np.ndarray:
        combined: np.ndarray = (
            np.searchsorted(row_keys, r) * width + np.searchsorted(slot_keys, s)
        ).astype(held)
        return combined

    # looked up a chunk at a time among the sorted distinct keys (as `np.isin`, without its
    # int64 sort of both key arrays joined: 150 MiB for ten million cells)
    among = _distinct_of(
        key(among_rows[a : a + _KEY_CHUNK], among_slots[a : a + _KEY_CHUNK])
        for a in range(0, among_rows.size, _KEY_CHUNK)
    )
    found = np.empty(rows.shape, dtype=bool)
    last = among.size - 1
    for a in range(0, rows.size, _KEY_CHUNK):
        wanted = key(rows[a : a + _KEY_CHUNK], slots[a : a + _KEY_CHUNK])
        found[a : a + _KEY_CHUNK] = (
            among[np.minimum(np.searchsorted(among, wanted), last)] == wanted
        )
    return found


def _distinct_pieces(values: np.ndarray) -> np.ndarray:
    """`distinct(values)`, sorted a `_KEY_CHUNK` of values at a time (the sorted copies are
    a chunk's; only the chunks' distinct values are joined and sorted again)."""
    if values.size <= _KEY_CHUNK:
        return distinct(values)
    return _distinct_of(values[a : a + _KEY_CHUNK] for a in range(0, values.size, _KEY_CHUNK))


def _distinct_of(chunks: Iterable[np.ndarray]) -> np.ndarray:
    """The distinct values of every chunk together: each chunk's sorted alone, then only the
    chunks' distinct values joined and sorted again."""
    return distinct(np.concatenate([distinct(chunk) for chunk in chunks]))


def cell_slots(finding: Finding) -> np.ndarray:
    """Every cell's slot (the finding's own slot for a one-cell finding; -1 without one)."""
    if finding.cells is not None and finding.cells.slot is not None:
        return finding.cells.slot
    return np.array([-1 if finding.slot is None else finding.slot], dtype=np.int64)


def held_slots(finding: Finding) -> np.ndarray:
    """`cell_slots` as the cells hold them (a narrow dtype): to compare or count, never to
    compute with."""
    held = None if finding.cells is None else finding.cells.column("slot")
    return cell_slots(finding) if held is None else held


def cell_index(finding: Finding, batch_row: int, position: int) -> int | None:
    """Index in `cells` of the cell at (batch row, position), or None."""
    if finding.cells is None:
        return None
    hit = np.flatnonzero(
        (finding.cells.batch_row == batch_row) & (finding.cells.position == position)
    )
    return int(hit[0]) if hit.size else None


def holding(finding: Finding, slots: np.ndarray, *, via_full_slot: bool = False) -> Finding | None:
    """The part of the finding at cells holding one of `slots` (None: no such cell).

    `via_full_slot`: match an SWA-space finding's cells by the full slot reaching their
    SWA slot (the `full_slot` column; else the example's `full_slots`)."""
    slots = np.asarray(slots, dtype=np.int64)
    if via_full_slot:
        full_slot = None if finding.cells is None else finding.cells.column("full_slot")
        if full_slot is not None:  # compared as held
            return part(finding, np.isin(full_slot, slots))
        return finding if bool(np.isin(finding.full_slots, slots).any()) else None
    held = None if finding.cells is None else finding.cells.column("slot")
    if held is None:
        return finding if finding.slot is not None and finding.slot in slots.tolist() else None
    return part(finding, np.isin(held, slots))  # compared as held


def in_pool_row(finding: Finding, pool_row: int) -> Finding | None:
    """The part of the finding in `pool_row` (None: none of it)."""
    if finding.cells is None:
        return finding if finding.pool_row == pool_row else None
    return part(finding, finding.cells.pool_row == pool_row)


def part(finding: Finding, keep: np.ndarray) -> Finding | None:
    """`restricted(keep)`, or None when `keep` selects no cell."""
    return restricted(finding, keep) if bool(keep.any()) else None


def at_cell(finding: Finding, batch_row: int, position: int) -> Finding | None:
    """The finding with the cell at (batch row, position) as its example, when it has
    that cell (a row-level finding: when it is at that batch row); else None."""
    if finding.cells is None:
        return finding if finding.batch_row == batch_row else None
    index = cell_index(finding, batch_row, position)
    return None if index is None else with_example(finding, index)


def with_example(finding: Finding, index: int) -> Finding:
    """The finding with cell `index` as its example (the cell views point at)."""
    cells = finding.cells
    assert cells is not None

    def coordinate(column: np.ndarray) -> int | None:
        value = int(column[index])
        return None if value < 0 else value  # -1: a finding about slots, not table cells

    return replace(
        finding,
        slot=None if cells.slot is None else int(cells.slot[index]),
        batch_row=coordinate(cells.batch_row),
        pool_row=coordinate(cells.pool_row),
        position=coordinate(cells.position),
        gather_index=int(cells.extra["gather_index"][index])
        if "gather_index" in cells.extra
        else finding.gather_index,
    )


def restricted(finding: Finding, keep: np.ndarray) -> Finding:
    """The finding with only the cells `keep` (a mask) selects, keeping its example when
    it is among them (with its marks), else the first kept cell (marks cleared)."""
    cells = finding.cells
    assert cells is not None
    if bool(keep.all()):
        return finding
    kept = cells.take(keep)
    example = (kept.batch_row == finding.batch_row) & (kept.position == finding.position)
    if kept.slot is not None:
        example &= kept.slot == finding.slot
    if example.any():
        return replace(finding, cells=kept, provenance=(), provenance_total=0)
    moved = replace(
        finding,
        cells=kept,
        first_raise=False,
        upstream_raise=None,
        provenance=(),
        provenance_total=0,
    )
    return with_example(moved, 0)


def repeated(values: np.ndarray) -> np.ndarray:
    """The distinct values listed more than once (sorted): a free list's double frees, a row
    or slot held twice."""
    ordered = np.sort(values.reshape(-1))
    return distinct(ordered[1:][ordered[1:] == ordered[:-1]])


#: values a `span` names one by one before it counts the rest.
_SHOWN = 4


def span(values: np.ndarray | Sequence[int]) -> str:
    """`36..39`, `3, 9, 12` or `3, 9, 12, 40, ... (9)`: distinct values, a run as a range."""
    v = distinct(np.asarray(values, dtype=np.int64))
    if v.size == 0:
        return ""
    if v.size > 2 and int(v[-1]) - int(v[0]) == v.size - 1:
        return f"{v[0]}..{v[-1]}"
    shown = ", ".join(str(x) for x in v[:_SHOWN].tolist())
    return shown if v.size <= _SHOWN else f"{shown}, ... ({v.size})"


#: Ids an id-list finding names in its details (a sample, with the total).
IDS_SHOWN = 16


def flat_ids(values: np.ndarray | None) -> np.ndarray:
    """A recorded id list (Mamba or host slots) as flat int64; empty where not recorded."""
    if values is None:
        return np.zeros(0, dtype=np.int64)
    return np.asarray(values, dtype=np.int64).reshape(-1)


def id_list_finding(
    code: FindingCode, ids: np.ndarray, one: str, many: str, *, key: str, **details: JsonValue
) -> Finding:
    """A finding about a list of ids that are no cells (Mamba slots, host slots): `one` says
    a single id (`{slot}`), `many` several (`{slots}`: their span); the details carry `key`
    (a sample of `IDS_SHOWN`), `key_total` and `details`."""
    said = one.format(slot=int(ids[0])) if ids.size == 1 else many.format(slots=span(ids))
    listed: dict[str, JsonValue] = {
        key: [int(i) for i in ids[:IDS_SHOWN]],
        f"{key}_total": int(ids.size),
    }
    return Finding(code=code, group=Group.FULL, message=said, details={**listed, **details})
