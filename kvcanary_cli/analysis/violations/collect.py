"""`violations_report`: the library entry point behind `kvcanary violations`
(docs/canary.md §7).

Reads every SOURCE (a dump's violation ring, or a log's violation messages), optionally
replays the dump's verify launches, compares replayed rows with observed ones as multisets,
and, with a dump, explains every row and attaches the provenance of the rows' slots.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal, cast

import numpy as np

from kvcanary_cli.analysis.provenance import (
    ProvenanceIndex,
    full_slots_mapping_to,
    swa_provenance,
)
from kvcanary_cli.analysis.violations.explain import explain_rows
from kvcanary_cli.canary.buffers import dump_buffers
from kvcanary_cli.canary.constants import BUFFERS, LaunchTag, tag_label
from kvcanary_cli.canary.logs import SWA_DIVERGENCE_KEYS, LogScan, scan_log_path
from kvcanary_cli.canary.replay import replay_dump
from kvcanary_cli.canary.ring import decode_ring
from kvcanary_cli.canary.ring_rows import RowOrigin, ViolationRows, multiset_difference
from kvcanary_cli.canary.sources import SourceKind, source_kind
from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.errors import OptionError
from kvcanary_cli.option_values import BUFFER_CHOICES, checked_choice
from kvcanary_cli.planners.base import Semantics
from kvcanary_cli.planners.frame import group_frame
from kvcanary_cli.planners.vectorized import VectorizedPlanner
from kvcanary_cli.results.cells import SlotProvenance
from kvcanary_cli.results.violations import (
    ExplainedRows,
    Filters,
    LogSummary,
    ReplayComparison,
    ReplaySummary,
    RingSummary,
    SourceSummary,
    SwaSummary,
    ViolationsReport,
)
from kvcanary_cli.safe_text import printable

__all__ = ["REPLAY_SOURCE", "violations_report"]

#: the `source` index of replayed rows.
REPLAY_SOURCE = -1
#: distinct slots whose provenance a report carries.
MAX_SLOTS = 64


def violations_report(
    sources: Sequence[str],
    *,
    dump: str | os.PathLike[str] | None = None,
    replay: bool = False,
    group: str | None = None,
    buffer: str | None = None,
    overrides: Mapping[str, int | str | None] | None = None,
    max_slots: int = MAX_SLOTS,
) -> ViolationsReport:
    """Decode, replay, compare and explain (see the module doc).

    `dump` is the dump to join with when no SOURCE is one; `group` (`full`, `swa`) and
    `buffer` (`head.k`, ...) restrict the rows and the replay.
    """
    if group is not None:
        checked_choice(group, [g.value for g in Group], "group")
    if buffer is not None:
        checked_choice(buffer, BUFFER_CHOICES, "buffer")
    kinds = [source_kind(path) for path in sources]
    loaded = _the_dump(sources, kinds, dump, overrides)
    summaries: list[SourceSummary] = []
    observed: list[ViolationRows] = []
    read: dict[object, int] = {}
    for index, (path, kind) in enumerate(zip(sources, kinds, strict=True)):
        first = index if path == "-" else read.setdefault(_file_key(path), index)
        if first != index:  # one file named twice: its rows are one set of observations
            again = f"the same file as SOURCE {first + 1} ({printable(sources[first])}): read once"
            summaries.append(SourceSummary(path=path, kind=kind, rows=0, notes=(again,)))
            continue
        if kind is SourceKind.DUMP:
            summary, rows = _ring_source(path, loaded, index)
        else:
            summary, rows = _log_source(scan_log_path(path), index)
        rows = _filtered(rows, group, buffer)
        summaries.append(replace(summary, rows=len(rows)))
        observed.append(rows)
    seen = ViolationRows.concat(observed)
    notes: list[str] = []
    replays: list[ReplaySummary] = []
    replayed = ViolationRows.empty()
    if replay:
        if loaded is None:
            raise OptionError("needs a dump: give one as a SOURCE or with --dump", option="replay")
        replayed, replays, replay_notes = _replay(loaded, group, buffer)
        notes.extend(replay_notes)
    comparison = None
    if replay and len(seen):
        matched, only_seen, only_replayed = multiset_difference(seen.fields, replayed.fields)
        comparison = ReplayComparison(
            matched=matched, observed_only=only_seen.size, replayed_only=only_replayed.size
        )
    rows = ViolationRows.concat([seen, replayed])
    paths = tuple(s.path for s in summaries)
    slots: tuple[SlotProvenance, ...] = ()
    total = 0
    if loaded is not None:
        slots, total = _slot_provenance(loaded, rows, max_slots)
        if loaded.shrink is not None:
            notes.append(
                f"{printable(loaded.path.name)} is shrunk from {loaded.shrink.source_file}: "
                "explanations, provenance and replay cover the kept cells and records only"
            )
    return ViolationsReport(
        dump=None if loaded is None else str(loaded.path),
        identity={} if loaded is None else dict(loaded.identity),
        filters=Filters(group=None if group is None else Group(group), buffer=buffer),
        sources=tuple(summaries),
        replay=tuple(replays),
        comparison=comparison,
        notes=tuple(notes),
        rows=ExplainedRows(
            rows,
            paths=paths,
            explanations=None if loaded is None else explain_rows(loaded, rows),
        ),
        slots=slots,
        slots_total=total,
    )


def _file_key(path: str) -> object:
    """What tells two named files apart: the file itself (device and inode), however the
    path is spelled or linked; the resolved path where it cannot be read (source_kind has
    refused those already)."""
    try:
        info = os.stat(path)
    except OSError:
        return str(Path(path).resolve())
    return (info.st_dev, info.st_ino)


def _the_dump(
    sources: Sequence[str],
    kinds: Sequence[SourceKind],
    dump: str | os.PathLike[str] | None,
    overrides: Mapping[str, int | str | None] | None,
) -> KvDump | None:
    """The one dump rows are joined with: --dump, or the dump among the sources."""
    paths = [p for p, k in zip(sources, kinds, strict=True) if k is SourceKind.DUMP]
    if dump is not None:
        paths.append(os.fspath(dump))
    distinct = {_file_key(p): p for p in paths}
    if len(distinct) > 1:
        raise OptionError(
            f"give at most one dump ({len(distinct)} given): rows are explained against one "
            "forward step",
            option="sources/dump",
            hint="run the command once per dump",
        )
    if not distinct:
        return None
    return load_dump(next(iter(distinct.values())), overrides=overrides)


def _ring_source(path: str, dump: KvDump | None, index: int) -> tuple[SourceSummary, ViolationRows]:
    assert dump is not None
    notes: list[str] = []
    if dump.violation_ring is None or dump.violation_write_index is None:
        notes.append("no violation_ring in this dump")
        return SourceSummary(path=path, kind=SourceKind.DUMP, rows=0, notes=tuple(notes)), (
            ViolationRows.empty()
        )
    state = decode_ring(dump.violation_ring, dump.violation_write_index)
    if state.wrapped:
        notes.append(
            f"violation_write_index is {state.write_index}: the int32 counter wrapped, so the "
            "ring is read as full"
        )
    elif state.overflow:
        notes.append(
            f"{state.write_index - state.capacity} violations were counted but not kept "
            "(the ring keeps the first ones)"
        )
    if state.stray_rows:
        notes.append(f"{state.stray_rows} ring rows past the write index are not zero (ignored)")
    ring = RingSummary(
        capacity=state.capacity,
        write_index=state.write_index,
        valid=state.valid,
        overflow=state.overflow,
        wrapped=state.wrapped,
        stray_rows=state.stray_rows,
    )
    rows = ViolationRows.build(state.rows, origin=RowOrigin.RING, source=index)
    return SourceSummary(
        path=path, kind=SourceKind.DUMP, rows=0, ring=ring, notes=tuple(notes)
    ), rows


def _log_source(scan: LogScan, index: int) -> tuple[SourceSummary, ViolationRows]:
    swa = None
    samples = scan.swa_divergence
    if samples is not None and len(samples):
        swa = SwaSummary(
            samples=len(samples),
            last={k: int(v) for k, v in zip(SWA_DIVERGENCE_KEYS, samples.samples[-1], strict=True)},
            peak_swa_full_idx_divergence=int(samples.samples[:, 3].max()),
            peak_swa_out_of_window_tokens=int(samples.samples[:, 4].max()),
        )
    log = LogSummary(
        lines=scan.lines,
        structured=scan.structured,
        messages=scan.messages,
        rebuilt=scan.rebuilt,
        unparsed=scan.unparsed,
        incomplete=scan.incomplete,
        inconsistent=scan.inconsistent,
        overlong=scan.overlong,
        swa_divergence=swa,
        unread_violations=scan.unread,
    )
    summary = SourceSummary(path=scan.name, kind=SourceKind.LOG, rows=0, log=log, notes=scan.notes)
    return summary, scan.rows.with_source(index)


def _filtered(rows: ViolationRows, group: str | None, buffer: str | None) -> ViolationRows:
    mask = np.ones(len(rows), dtype=bool)
    if group is not None:
        mask &= rows.group_mask(group)
    if buffer is not None:
        mask &= rows.buffer_mask(buffer)
    return rows if mask.all() else rows.select(mask)


def _replay(
    dump: KvDump, group: str | None, buffer: str | None
) -> tuple[ViolationRows, list[ReplaySummary], list[str]]:
    """Plan with the production (GPU) semantics and replay every canary buffer."""
    groups = [group] if group is not None else list(dump.groups)
    planner = VectorizedPlanner(semantics=Semantics.GPU)
    plans = {}
    notes = []
    for name in groups:
        group_frame(dump, name)  # refuses --group swa without a LUT
        if not dump_buffers(dump, name):
            notes.append(f"no canary buffers of group {name} in the dump: nothing to replay")
            continue
        plan = planner.plan(dump, name)
        plans[plan.group] = plan
    done = replay_dump(dump, plans, buffers=[buffer] if buffer is not None else BUFFERS)
    summaries = [
        ReplaySummary(
            group=Group(r.group),
            buffer=r.buffer,
            tag=tag_label(r.tag),
            entries=r.entries,
            checked=r.checked,
            slot_zero=r.slot_zero,
            chain_skipped=r.chain_skipped,
            outside_buffer=r.outside_buffer,
            undefined=r.undefined,
            real_kv=cast(Literal["checked", "zero", "skipped"], r.real_kv),
            rows=len(r.rows),
        )
        for r in done
    ]
    for r in done:
        notes.extend(r.notes)
    rows = ViolationRows.concat([r.rows.with_source(REPLAY_SOURCE) for r in done])
    return rows, summaries, notes


def _slot_provenance(
    dump: KvDump, rows: ViolationRows, limit: int
) -> tuple[tuple[SlotProvenance, ...], int]:
    """Provenance of the rows' distinct (space, slot), first seen first, at most `limit`."""
    tag = rows.tag
    space = np.where(tag >= int(LaunchTag.HEAD_K_SWA), 1, 0)
    known = (tag >= 0) & (tag < len(LaunchTag))
    if dump.full_to_swa_index_mapping is None:
        known &= space == 0
    pairs = np.stack([space[known], rows.slot[known]], axis=1)
    if pairs.shape[0] == 0:
        return (), 0
    distinct, first = np.unique(pairs, axis=0, return_index=True)
    ordered = distinct[np.argsort(first, kind="stable")][:limit]
    wanted = [(int(a), int(b)) for a, b in ordered]
    swa_slots = [slot for s, slot in wanted if s == 1]
    sources = full_slots_mapping_to(dump, swa_slots)
    full = {slot for s, slot in wanted if s == 0}
    for mapped in sources.values():
        full.update(mapped)
    index = ProvenanceIndex(dump, full, max_cells=16)
    frames = {"full": group_frame(dump, "full")}
    if swa_slots:
        frames["swa"] = group_frame(dump, "swa")
    found = tuple(
        swa_provenance(dump, index, slot, sources[slot], frames["swa"])
        if s == 1
        else index.provenance(slot, frames["full"])
        for s, slot in wanted
    )
    return found, int(distinct.shape[0])
