"""A provenance answer in words, as its table and Markdown views say it: the columns of a
slot's cells, and a row map's lines and what it leaves out."""

from __future__ import annotations

from kvcanary_cli.results.provenance import RowCell, RowGap, RowMap

__all__ = ["CELL_COLUMNS", "row_lines", "row_notices"]

#: The columns of a slot's cell table in both views, for a full slot (False) and an SWA slot
#: (True), whose cells also name the full slot that maps to it.
CELL_COLUMNS: dict[bool, tuple[str, ...]] = {
    False: ("pool row", "position", "batch rows", "role", "seed", "shared"),
    True: ("pool row", "position", "full slot", "batch rows", "role", "seed", "shared"),
}


def row_lines(row: RowMap) -> list[RowCell | RowGap]:
    """The row map's cells and gaps in position order, so that every view shows where
    positions were left out."""
    items: list[tuple[int, RowCell | RowGap]] = [(c.position, c) for c in row.cells]
    items += [(g.start, g) for g in row.gaps]
    return [item for _, item in sorted(items, key=lambda pair: pair[0])]


def row_notices(row: RowMap) -> list[str]:
    """What a row map does not show, in words."""
    count, length = len(row.cells), row.max_seq_len
    notices = []
    if count < length:
        asked = row.positions
        within = "" if asked is None else f" (--positions {asked[0]}:{asked[1]})"
        notices.append(
            f"showing {count} of the pool row's {length} positions{within}; the others are "
            "in the gaps' table rows (--positions START:END and --max-rows show more)"
        )
    if row.marks_not_shown:
        notices.append(
            f"{row.marks_not_shown} marked positions do not fit --max-rows: narrow "
            "the range with --positions to see them"
        )
    return notices
