"""Answers for `kvcanary provenance`: one slot's provenance, or one pool row's map."""

from __future__ import annotations

from kvcanary_cli.analysis.model import DumpReport, Finding, ProvenanceReport, RowCell, RowMap
from kvcanary_cli.analysis.provenance import (
    ProvenanceIndex,
    batch_rows_of,
    cell_role,
    full_slots_mapping_to,
    swa_provenance,
)
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.errors import OptionError
from kvcanary_cli.planners.frame import group_frame

__all__ = ["row_map", "slot_query"]

#: Cells shown around the interesting parts of a long row.
_EDGE = 16


def slot_query(
    dump: KvDump,
    report: DumpReport,
    slot: int,
    *,
    space: str = "full",
    group: str | None = None,
    max_cells: int = 64,
) -> ProvenanceReport:
    """Every cell holding `slot` (whole table), its translation, state, and its findings.

    For `space="swa"` the slot is an SWA-pool slot: the full slots whose LUT entry maps to it
    are listed, with their cells.
    """
    if space not in ("full", "swa"):
        raise OptionError(f"unknown space {space!r} (expected full or swa)", option="--space")
    if space == "swa" and dump.full_to_swa_index_mapping is None:
        raise OptionError(
            "this dump has no full_to_swa_index_mapping", option="--space", hint="use --space full"
        )
    frame = group_frame(dump, group or ("swa" if space == "swa" else "full"))
    if space == "swa":
        sources = full_slots_mapping_to(dump, [slot])[slot]
        index = ProvenanceIndex(dump, sources, max_cells=max_cells)
        provenance = swa_provenance(dump, index, slot, sources, frame)
    else:
        index = ProvenanceIndex(dump, [slot], max_cells=max_cells)
        provenance = index.provenance(slot, frame)
        sources = (slot,)
    touching = tuple(
        f
        for f in report.findings
        if f.slot is not None
        and (
            (f.space == space and f.slot == slot)
            or (space == "full" and f.space == "swa" and slot in _full_slots(f))
            or (space == "swa" and f.space == "full" and f.slot in sources)
        )
    )
    return ProvenanceReport(
        path=str(dump.path), identity=dump.identity, slot=provenance, findings=touching
    )


def row_map(
    dump: KvDump, report: DumpReport, pool_row: int, *, group: str = "full", max_cells: int = 1024
) -> ProvenanceReport:
    """Map of one pool row: live prefix, window, pending writes, stale tail, marked cells."""
    if not 0 <= pool_row < dump.max_reqs:
        raise OptionError(f"pool row {pool_row} is outside [0, {dump.max_reqs})", option="--row")
    frame = group_frame(dump, group)
    batch_rows = tuple(batch_rows_of(dump).get(pool_row, ()))
    first = batch_rows[0] if batch_rows else None
    row = dump.req_to_token[pool_row].tolist()
    msl = len(row)
    marks: dict[int, list[str]] = {}
    touching: list[Finding] = []
    for f in report.findings:
        if f.pool_row == pool_row:
            touching.append(f)
            if f.position is not None:
                marks.setdefault(f.position, []).append(f.code.value)
    prefix = extend = start = None
    if first is not None:
        prefix = int(dump.prefix_lens[first])
        extend = int(dump.extend_seq_lens[first])
        start = int(frame.window_start[first])
        live_end = min(max(prefix, 0) + max(extend, 0), msl)
        shown = set(range(min(live_end + _EDGE, msl)))
        if len(shown) > max_cells:  # long rows: the head, the window and the tail edge
            shown = set(range(_EDGE)) | set(range(max(start - 1, 0), min(live_end + _EDGE, msl)))
    else:
        filled_positions = [p for p, s in enumerate(row) if s != 0]
        shown = set(filled_positions[:max_cells]) | set(range(min(_EDGE, msl)))
    shown |= {p for p in marks if 0 <= p < msl}
    lut = dump.full_to_swa_index_mapping
    cells = []
    for pos in sorted(shown)[:max_cells]:
        slot = int(row[pos])
        role, seed = cell_role(dump, frame, first, pos)
        swa = int(lut[slot]) if lut is not None and 0 <= slot < lut.shape[0] else None
        cells.append(
            RowCell(
                position=pos,
                slot=slot,
                role=role,
                seed=seed,
                swa_slot=swa,
                marks=tuple(dict.fromkeys(marks.get(pos, ()))),
            )
        )
    filled = sum(1 for s in row if s != 0)
    return ProvenanceReport(
        path=str(dump.path),
        identity=dump.identity,
        row=RowMap(
            pool_row=pool_row,
            batch_rows=batch_rows,
            prefix_len=prefix,
            extend_len=extend,
            window_start=start,
            group=group,
            cells=tuple(cells),
            filled=filled,
            max_seq_len=msl,
        ),
        findings=tuple(touching),
    )


def _full_slots(finding: Finding) -> list[int]:
    """The full slots an SWA-space finding names (collisions list them in details)."""
    slots = finding.details.get("full_slots", [])
    return [int(x) for x in slots] if isinstance(slots, list) else []
