"""`timeline`: what changed between dumps of one rank, and when (`kvcanary timeline`, `diff`,
and `provenance --slot` over several dumps). docs/timeline.md describes what it reports.

A dump shows a state; the faults that matter most are events between states: a slot freed
while a request still reads it, a slot handed out twice, a LUT entry rewritten under a live
cell, an SWA leak growing a page at a time. The dumps are read one at a time in step order,
and each is reduced to a `Snapshot`: its live cells (every batch row's prefix and pending
writes, in pool row order) with, per cell, whether the full allocator lists its slot as free
and where the LUT maps it, plus the dump's leaked SWA pages. A snapshot is compared with the
one before it and dropped after the next: memory is that of two dumps' live cells (and the
table pages one gather touches), however long the sequence.

Requests are pool rows. A row keeps, across the whole sequence, the length it was last seen
with and a hash of its cells up to there; a row of the next dump whose prefix covers those
cells (a request that keeps its row has written them all by its next step; a shorter prefix
is a new request, or the same one retracted and prefilled again) and whose cells start with
the same slots at the same positions is the same request (grown, or back in the batch after
dumps without it), and its cells up to that length are *continuing*; any other is a new
request.
Every other cell of the later dump is new: allocated between the dumps. An *owner* of a slot
is a live cell, told apart by (position, slot one position earlier), so radix-shared
prefixes count as one owner, as in `check` (docs/findings.md).

Events (each reported once, at the first dump that shows it; what a dump already shows in the
first dump is left to its check's findings):

- `USE_AFTER_FREE`: a live slot on the full free list (freed while its owner still holds it,
  or handed out while still listed free); a slot an owner still holds that a new owner got
  after a dump listed it free;
- `DOUBLE_ALLOCATION`: a slot a new owner got while an owner holds it and no dump listed it
  free in between;
- `PREFIX_REWRITTEN`: a written cell of a live request (its row the same request: a later
  written position unchanged) that holds another slot now, with the old slot's fate, unless
  the radix cache put its own slot there (de-duplication: `_deduplicated`). Without the
  tree's record only a rewrite whose old slot the dump proves orphaned is one; the others
  (`_undecided`: SGLang's retraction and re-prefill look the same) are a note;
- `LUT_REWRITTEN`: a continuing cell in its request's SWA window whose LUT entry maps to
  another non-zero SWA slot;
- `SWA_LEAK`: SWA pages leaked (neither free nor mapped from a held full slot) that the last
  dump accounting leaks did not have.

Everything is sorts, searches and gathers over the cells: no loop per cell, slot or row; the
per-event loops run over the events (one per kind and interval) and a dump's findings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from kvcanary_cli.analysis.bookkeeping import leaked_swa_pages, recorded_held_slots
from kvcanary_cli.analysis.cells import distinct
from kvcanary_cli.analysis.check import run_check
from kvcanary_cli.analysis.provenance import SlotSet
from kvcanary_cli.catalog import CauseCode, EventKind, FindingCode, Severity, plural
from kvcanary_cli.dump.header import (
    HeaderRead,
    SafetensorsHeader,
    read_header_and_step,
    refuse_other_engine,
)
from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.dump.tensor import union
from kvcanary_cli.errors import DumpError, FileChangedError, OptionError
from kvcanary_cli.option_values import SLOT, checked_choice, checked_integer
from kvcanary_cli.planners.base import Planner
from kvcanary_cli.results.cells import CellColumns, Space
from kvcanary_cli.results.check import DumpReport
from kvcanary_cli.results.timeline import (
    FindingHistory,
    SlotHistory,
    SlotMoment,
    SlotOwner,
    TimelineDump,
    TimelineEvent,
    TimelineInterval,
    TimelineReport,
)
from kvcanary_cli.safe_text import excerpt

__all__ = ["MAX_OWNERS", "PREFIX_FATES", "Snapshot", "snapshot", "timeline"]

PathLike = str | os.PathLike[str]
#: owners of the focus slot listed per dump (`owners_total` counts them all).
MAX_OWNERS = 32
_U = np.uint64


@dataclass(frozen=True, kw_only=True)
class _Entry:
    """A dump of the sequence before it is loaded: what its header says."""

    path: Path
    step: int | None
    rank: str | None
    #: the header, read once: the dump is loaded by it, from the file it was read from,
    #: unchanged.
    header: SafetensorsHeader


def order_dumps(
    paths: Sequence[PathLike],
    *,
    keep_order: bool,
    headers: Sequence[HeaderRead] | None = None,
) -> list[_Entry]:
    """The dumps in step order, from their headers alone; a mix of ranks, a step recorded
    twice or by only some dumps is refused (`keep_order`: steps must increase as given).
    `headers`: theirs, as this run read them already (one per path), not read again."""
    entries = []
    for i, path in enumerate(paths):
        header, step = read_header_and_step(path, None if headers is None else headers[i])
        refuse_other_engine(header.metadata, path)
        entries.append(
            _Entry(path=Path(path), step=step, rank=header.metadata.get("rank"), header=header)
        )
    ranks = {e.rank.strip() for e in entries if e.rank is not None}
    if len(ranks) > 1:
        first = next(e for e in entries if e.rank is not None)
        other = next(e for e in entries if e.rank is not None and e.rank.strip() != first.rank)
        raise DumpError(
            f"records rank {excerpt(other.rank or '')}, {first.path} rank "
            f"{excerpt(first.rank or '')}: a timeline reads one rank's dumps",
            field="rank",
            path=str(other.path),
            hint="give each rank's dumps on their own",
        )
    stepped = [e for e in entries if e.step is not None]
    if stepped and len(stepped) < len(entries):
        missing = next(e for e in entries if e.step is None)
        raise DumpError(
            f"records no step, {stepped[0].path} records step {stepped[0].step}: a timeline "
            "orders dumps by step",
            field="step",
            path=str(missing.path),
        )
    if stepped:
        ordered = entries if keep_order else sorted(entries, key=lambda e: e.step or 0)
        for before, after in zip(ordered, ordered[1:], strict=False):
            assert before.step is not None and after.step is not None
            if after.step == before.step:
                raise DumpError(
                    f"records step {after.step}, as {before.path} does: two dumps of one step",
                    field="step",
                    path=str(after.path),
                    hint="two triggers of the capture hook at one launch? give one of them",
                )
            if after.step < before.step:
                raise DumpError(
                    f"records step {after.step}, before {before.path} (step {before.step}): "
                    "give the older dump first",
                    field="step",
                    path=str(after.path),
                )
        return ordered
    return entries


@dataclass(eq=False, kw_only=True)
class Snapshot:
    """What a timeline keeps of one dump: its live cells, row by row, with the allocator's and
    the LUT's view of each, and its leaked SWA pages."""

    index: int
    step: int | None
    info: TimelineDump
    page: int
    #: pool rows the batch uses (ascending), the first batch row of each, their live lengths
    #: and where each row's cells start in the cell columns.
    rows: np.ndarray
    batch_rows: np.ndarray
    lengths: np.ndarray
    starts: np.ndarray
    #: per row: its prefix (the cells written before this step; the rest are pending writes).
    prefix: np.ndarray
    #: a speculative step (`forward_mode` a verify or draft step): only some of its pending
    #: writes are kept, where any other step writes them all.
    speculative: bool
    #: per cell (row by row, position by position): slot, position, and the owner signature's
    #: second half, the slot one position earlier (-1 at position 0).
    slot: np.ndarray
    position: np.ndarray
    prev: np.ndarray
    #: prefix sums (with a leading 0) of a hash of (slot, position) per cell: a row's cells
    #: [0, n) hash to `sums[start + n] - sums[start]`.
    sums: np.ndarray
    #: per cell: slot on the full free list, and whether the dump records that (None: no list).
    free: np.ndarray | None
    free_known: np.ndarray | None
    #: the full free list (distinct, sorted), and in a shrunk dump the slots it speaks for.
    free_list: np.ndarray | None
    free_domain: np.ndarray | None
    #: per cell: the LUT entry of its slot, and whether the dump has it (None: no LUT).
    swa: np.ndarray | None
    swa_known: np.ndarray | None
    #: the SWA window (`swa_window_size`), when recorded (and not 0).
    window: int | None
    #: leaked SWA pages (sorted), or None when the dump does not account leaks.
    leaked: np.ndarray | None
    #: the full slots the radix tree holds, and those the dump records as held by anyone
    #: (the tree, running requests: `recorded_held_slots`), distinct and sorted; None when
    #: not recorded.
    tree: np.ndarray | None = None
    held: np.ndarray | None = None
    #: the focus slot in this dump (`provenance --slot` over several dumps).
    moment: SlotMoment | None = None
    #: slots held with two owner signatures (`_multi_owner_slots`), once worked out.
    twice: np.ndarray | None = None
    _distinct: np.ndarray | None = None
    #: distinct owner signatures of the focus slot.
    focus_owners: int = 0

    @property
    def distinct_slots(self) -> np.ndarray:
        """The slots the live cells hold, distinct and sorted (one sort, kept)."""
        if self._distinct is None:
            self._distinct = distinct(self.slot)
        return self._distinct

    @property
    def row_of_cell(self) -> np.ndarray:
        """Index into `rows` of each cell."""
        return np.repeat(np.arange(self.rows.size, dtype=np.int64), self.lengths)

    def row_hash(self, cut: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Hash of each row's first `cut` cells (`cut` per row, at most its length); `rows`:
        of these rows only (indices into `rows`)."""
        starts = self.starts if rows is None else self.starts[rows]
        hashes: np.ndarray = self.sums[starts + cut] - self.sums[starts]
        return hashes

    def speaks_for(self, slots: np.ndarray) -> np.ndarray:
        """Per slot: the dump's full free list says whether it is free (it has one, and a
        shrunk dump kept the slot)."""
        if self.free_list is None:
            return np.zeros(slots.shape, dtype=bool)
        if self.free_domain is None:
            return np.ones(slots.shape, dtype=bool)
        return SlotSet(self.free_domain).contains(slots)

    def listed_free(self, slots: np.ndarray) -> np.ndarray:
        """Per slot: the full free list holds it (False where the dump has no list, or a
        shrunk dump does not speak for the slot)."""
        if self.free_list is None:
            return np.zeros(slots.shape, dtype=bool)
        listed: np.ndarray = SlotSet(self.free_list).contains(slots) & self.speaks_for(slots)
        return listed


def _ragged(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """`starts[i] + arange(lengths[i])` for every i, concatenated (one repeat, one arange)."""
    total = int(lengths.sum())
    offsets = np.cumsum(lengths) - lengths
    return np.repeat(starts - offsets, lengths) + np.arange(total, dtype=np.int64)


def _mix(slot: np.ndarray, position: np.ndarray) -> np.ndarray:
    """A 64-bit hash of (slot, position) per cell (a splitmix64 finalizer; wraps freely)."""
    x = slot.astype(_U) * _U(0x9E3779B97F4A7C15) ^ position.astype(_U) * _U(0xC2B2AE3D27D4EB4F)
    x ^= x >> _U(31)
    x *= _U(0xBF58476D1CE4E5B9)
    x ^= x >> _U(29)
    return x


def snapshot(
    dump: KvDump,
    index: int,
    step: int | None,
    *,
    focus: tuple[int, Space] | None = None,
) -> Snapshot:
    """Reduce a loaded dump to what the timeline compares (see `Snapshot`)."""
    rpi, width = dump.req_pool_indices, dump.max_seq_len
    active = np.flatnonzero((rpi > 0) & (rpi < dump.max_reqs))
    live = np.minimum(
        dump.prefix_lens.clip(0, width) + dump.extend_seq_lens.clip(0, width), width
    ).astype(np.int64)
    order = np.lexsort((active, rpi[active]))
    by_row = rpi[active][order]
    first = np.r_[True, by_row[1:] != by_row[:-1]] if by_row.size else np.zeros(0, bool)
    rows = by_row[first].astype(np.int64)
    batch_rows = active[order][first].astype(np.int64)
    lengths = live[batch_rows]
    prefix = np.minimum(dump.prefix_lens[batch_rows].clip(0, width), lengths).astype(np.int64)
    flat = _ragged(rows * width, lengths)
    slot = dump.req_to_token.take(flat)
    del flat
    offsets = np.cumsum(lengths) - lengths
    starts = offsets.astype(np.int64)
    position = np.arange(slot.size, dtype=np.int64) - np.repeat(starts, lengths)
    prev = np.empty_like(slot)
    if slot.size:
        prev[0] = -1
        prev[1:] = slot[:-1]
        prev[position == 0] = -1
    sums = np.zeros(slot.size + 1, dtype=_U)
    np.cumsum(_mix(slot, position), dtype=_U, out=sums[1:])
    free = free_known = free_list = domain = None
    if dump.free_full_slots is not None:
        free_list = distinct(dump.free_full_slots)
        free = SlotSet(free_list).contains(slot)
        domain = dump.free_domain.get("full") if dump.shrunk else None
        free_known = np.ones(slot.shape, bool) if domain is None else SlotSet(domain).contains(slot)
    swa = swa_known = None
    lut = dump.full_to_swa_index_mapping
    if lut is not None:
        size = int(lut.shape[0])
        inside = (slot >= 0) & (slot < size - 1)
        values, known = lut.take_known(np.where(inside, slot, 0))
        swa, swa_known = np.where(inside, values, 0), known & inside
    leaked, leak_note = leaked_swa_pages(dump)
    held = recorded_held_slots(dump)
    info = TimelineDump(
        index=index,
        path=str(dump.path),
        step=step,
        identity=dump.identity,
        bs=dump.bs,
        requests=int(rows.size),
        live_cells=int(slot.size),
        free_full_slots=None if dump.free_full_slots is None else int(dump.free_full_slots.size),
        leaked_swa_pages=None if leaked is None else int(leaked.size),
        leak_note=leak_note,
        finding_cells=None,
        worst=None,
        shrunk=dump.shrunk,
    )
    snap = Snapshot(
        index=index,
        step=step,
        info=info,
        page=max(dump.scalar("page_size") or 1, 1),
        rows=rows,
        batch_rows=batch_rows,
        lengths=lengths,
        starts=starts,
        prefix=prefix,
        speculative=_speculative(dump.metadata.get("forward_mode")),
        slot=slot,
        position=position,
        prev=prev,
        sums=sums,
        free=free,
        free_known=free_known,
        free_list=free_list,
        free_domain=domain,
        swa=swa,
        swa_known=swa_known,
        window=dump.scalar("swa_window_size") or None,
        leaked=leaked,
        # a shrunk dump keeps none of these records (they are leak accounting's): unrecorded
        tree=None
        if dump.tree_full_slots is None or dump.shrunk
        else distinct(dump.tree_full_slots),
        held=None if held is None or dump.shrunk else distinct(held),
    )
    if focus is not None:
        _focus(snap, dump, *focus)
    return snap


def _focus(snap: Snapshot, dump: KvDump, slot: int, space: Space) -> None:
    """The focus slot's owners, free-list state and LUT entry in this dump."""
    swa_slot = None
    if space is Space.FULL:
        hit = np.flatnonzero(snap.slot == slot)
        free: bool | None = None
        if snap.free_list is not None:
            recorded = snap.free_domain is None or bool(
                SlotSet(snap.free_domain).contains(np.array([slot]))[0]
            )
            if recorded:
                free = bool(SlotSet(snap.free_list).contains(np.array([slot]))[0])
        lut = dump.full_to_swa_index_mapping
        if lut is not None and 0 <= slot < int(lut.shape[0]) - 1:
            value, known = lut.take_known(np.array([slot], dtype=np.int64))
            swa_slot = int(value[0]) if bool(known[0]) else None
    else:
        assert snap.swa is not None and snap.swa_known is not None
        hit = np.flatnonzero(snap.swa_known & (snap.swa == slot))
        listed = dump.free_swa_slots
        free = None if listed is None else bool(np.any(listed == slot))
    rows = snap.row_of_cell[hit]
    owners = tuple(
        SlotOwner(
            pool_row=int(snap.rows[r]),
            position=int(snap.position[c]),
            batch_row=int(snap.batch_rows[r]),
            full_slot=int(snap.slot[c]),
        )
        for r, c in zip(rows[:MAX_OWNERS].tolist(), hit[:MAX_OWNERS].tolist(), strict=True)
    )
    pairs = np.stack([snap.position[hit], snap.prev[hit]], axis=1)
    snap.focus_owners = int(np.unique(pairs, axis=0).shape[0]) if hit.size else 0
    snap.moment = SlotMoment(
        dump=snap.index,
        step=snap.step,
        owners=owners,
        owners_total=int(hit.size),
        free=free,
        swa_slot=swa_slot,
        state="",
    )


@dataclass(eq=False, kw_only=True)
class _Rows:
    """Every pool row seen so far: the dump it was last seen in, its length, how many of its
    cells a request that keeps the row has surely written by its next step (`committed`: all
    of them, but a speculative step's drafts) and the hashes of its cells up to each."""

    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    last: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    length: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    hash: np.ndarray = field(default_factory=lambda: np.zeros(0, _U))
    committed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    committed_hash: np.ndarray = field(default_factory=lambda: np.zeros(0, _U))

    def lookup(self, rows: np.ndarray) -> _Seen:
        """For each row: seen before, and its last dump, lengths and hashes (-1, 0, 0, 0
        unseen)."""
        if self.rows.size == 0:
            unseen = np.zeros(rows.shape, dtype=bool)
            zeros = np.zeros(rows.shape, dtype=np.int64)
            return _Seen(unseen, zeros - 1, zeros, zeros.astype(_U), zeros, zeros.astype(_U))
        at = np.minimum(np.searchsorted(self.rows, rows), self.rows.size - 1)
        seen = self.rows[at] == rows
        return _Seen(
            seen,
            np.where(seen, self.last[at], -1),
            np.where(seen, self.length[at], 0),
            np.where(seen, self.hash[at], _U(0)),
            np.where(seen, self.committed[at], 0),
            np.where(seen, self.committed_hash[at], _U(0)),
        )

    def update(self, snap: Snapshot) -> None:
        keep = ~np.isin(self.rows, snap.rows)
        self.rows = np.concatenate([self.rows[keep], snap.rows])
        self.last = np.concatenate([self.last[keep], np.full(snap.rows.size, snap.index, np.int64)])
        self.length = np.concatenate([self.length[keep], snap.lengths])
        self.hash = np.concatenate([self.hash[keep], snap.row_hash(snap.lengths)])
        committed = snap.prefix if snap.speculative else snap.lengths
        self.committed = np.concatenate([self.committed[keep], committed])
        self.committed_hash = np.concatenate([self.committed_hash[keep], snap.row_hash(committed)])
        order = np.argsort(self.rows, kind="stable")
        self.rows, self.last = self.rows[order], self.last[order]
        self.length, self.hash = self.length[order], self.hash[order]
        self.committed = self.committed[order]
        self.committed_hash = self.committed_hash[order]


@dataclass(frozen=True)
class _Seen:
    """What `_Rows.lookup` knows of each row of a dump (per row, in its `rows` order)."""

    seen: np.ndarray
    last: np.ndarray
    length: np.ndarray
    hash: np.ndarray
    committed: np.ndarray
    committed_hash: np.ndarray


def _first_per(keys: np.ndarray) -> np.ndarray:
    """Mask of the first element of each run of equal, adjacent keys."""
    mask = np.ones(keys.shape, dtype=bool)
    np.not_equal(keys[1:], keys[:-1], out=mask[1:])
    return mask


def _columns(
    snap: Snapshot, cells: np.ndarray, extra: dict[str, np.ndarray] | None = None
) -> CellColumns:
    rows = snap.row_of_cell[cells]
    return CellColumns(
        batch_row=snap.batch_rows[rows],
        pool_row=snap.rows[rows],
        position=snap.position[cells],
        slot=snap.slot[cells],
        extra=extra or {},
    )


def _them(count: int) -> str:
    """The pronoun of `count` slots: `it` or `them`."""
    return "it" if count == 1 else "them"


def _hold(count: int) -> str:
    """The verb of `count` cells: `holds` or `hold`."""
    return "holds" if count == 1 else "hold"


def _steps(after: int | None, at: int | None) -> str:
    if at is None:
        return "between the dumps"
    return f"in steps ({'?' if after is None else after}, {at}]"


@dataclass(eq=False, kw_only=True)
class _Tracker:
    """The sequence so far: the previous snapshot, every row's last state, what has been
    reported, and the results."""

    focus: tuple[int, Space] | None
    prev: Snapshot | None = None
    steps: list[int | None] = field(default_factory=list)
    registry: _Rows = field(default_factory=_Rows)
    #: slots seen live and free, slots seen with two owners, SWA pages seen leaked.
    freed_live: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    two_owners: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    leak_seen: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: the last dump that accounts leaks: its index, step and leaked pages.
    leak_base: tuple[int, int | None, np.ndarray] | None = None
    #: the leak event's first interval (from, its step, pages leaked there, to, its step,
    #: new pages), every page it has reported, and where it sits in `events`.
    leak_first: tuple[int, int | None, int, int, int | None, int] | None = None
    leak_pages: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    leak_at: int | None = None
    dumps: list[TimelineDump] = field(default_factory=list)
    intervals: list[TimelineInterval] = field(default_factory=list)
    events: list[TimelineEvent] = field(default_factory=list)
    history: dict[tuple[FindingCode, Group, CauseCode | None, Space], dict[str, object]] = field(
        default_factory=dict
    )
    moments: list[SlotMoment] = field(default_factory=list)
    #: rewritten cells a dump without the tree's record cannot decide (`_undecided`): per
    #: interval (from, to, cells); a note, not an event.
    undecided: list[tuple[int, int, int]] = field(default_factory=list)

    def add(self, snap: Snapshot, report: DumpReport | None) -> None:
        """Compare a dump with the one before, then keep it as the one before."""
        self.steps.append(snap.step)
        new_events: list[TimelineEvent] = []
        reused_rows: np.ndarray = np.zeros(0, np.int64)
        if self.prev is not None:
            interval, new_events = self._compare(self.prev, snap)
            self.intervals.append(interval)
            reused_rows = np.concatenate(
                [np.asarray(interval.reused, np.int64), np.asarray(interval.born, np.int64)]
            )
        self._remember(snap)
        info = snap.info
        if report is not None:
            new_events = [_linked(e, report) for e in new_events]
            self._record_findings(snap.index, report)
            worst = report.worst()
            info = replace(info, finding_cells=sum(f.count for f in report.findings), worst=worst)
        for event in new_events:
            if event.kind is not EventKind.SWA_LEAK:
                self.events.append(event)
            elif self.leak_at is None:
                self.leak_at = len(self.events)
                self.events.append(event)
            else:  # the leak grew: the event keeps its date, its findings and its cause
                first = self.events[self.leak_at]
                self.events[self.leak_at] = replace(
                    event, findings=first.findings, cause=first.cause
                )
        self.dumps.append(info)
        if snap.moment is not None:
            self._moment(snap, reused_rows)
        self.registry.update(snap)
        self.prev = snap

    def _remember(self, snap: Snapshot) -> None:
        """What this dump shows that later dumps must not report again."""
        if snap.free is not None:
            assert snap.free_known is not None
            held_free = snap.slot[snap.free & snap.free_known & (snap.slot > 0)]
            self.freed_live = union(self.freed_live, held_free)
        self.two_owners = union(self.two_owners, _multi_owner_slots(snap))
        if snap.leaked is not None:
            self.leak_seen = union(self.leak_seen, snap.leaked)
            self.leak_base = (snap.index, snap.step, snap.leaked)

    # --- one interval ----------------------------------------------------------------------

    def _compare(self, a: Snapshot, b: Snapshot) -> tuple[TimelineInterval, list[TimelineEvent]]:
        known = self.registry.lookup(b.rows)
        seen, last, last_len = known.seen, known.last, known.length
        in_a = SlotSet(a.rows).contains(b.rows)
        row_of_cell = b.row_of_cell
        written, same = _continuing(a, b, known, in_a)
        # a live request whose written cells changed keeps its row: the same request, the
        # changed cells new (allocated between the dumps), and an event unless the radix
        # cache put its own slots there
        rewritten, old_cell, changed = _rewritten_cells(a, b, ~same & in_a, written)
        intact = np.repeat(same, b.lengths)
        same |= np.bincount(row_of_cell[rewritten], minlength=b.rows.size) > 0
        cont = b.position < np.repeat(np.where(same, written, 0), b.lengths)
        cont[changed] = False
        broken = ~_deduplicated(a, b, rewritten, old_cell)
        undecided = broken & _undecided(b, a.slot[old_cell])
        if undecided.any():
            self.undecided.append((a.index, b.index, int(np.count_nonzero(undecided))))
        broken &= ~undecided
        # continuing cells of rows in `a`: the same cell there
        mapped = cont & np.repeat(in_a & same, b.lengths)
        a_cell = np.zeros(b.slot.shape, dtype=np.int64)
        if a.rows.size:
            a_row = np.minimum(np.searchsorted(a.rows, b.rows), a.rows.size - 1)
            a_cell = np.where(mapped, a.starts[a_row][row_of_cell] + b.position, 0)
        events: list[TimelineEvent] = []
        events += self._freed_while_held(a, b, cont, last[row_of_cell])
        owner_events, event_slots = self._two_owners(a, b, cont, mapped, a_cell)
        event_slots = distinct(event_slots)
        events += owner_events
        events += self._prefix_rewritten(a, b, rewritten[broken], old_cell[broken])
        # a row the radix cache rewrote may also be a request retracted and prefilled again
        # between the dumps (its old pages back, with new SWA): its mappings tell nothing
        events += self._lut_rewritten(a, b, mapped & intact, a_cell)
        leak_new, leak_event = self._leak(b)
        if leak_event is not None:
            events.append(leak_event)
        a_same = SlotSet(b.rows[same]).contains(a.rows)
        from_free, unseen, changes = self._allocations(a, b, cont, a_same, event_slots)
        delta, per_step = _leak_change(a, b)
        interval = TimelineInterval(
            from_dump=a.index,
            to_dump=b.index,
            after_step=a.step,
            at_step=b.step,
            born=tuple(b.rows[~seen].tolist()),
            grew=tuple(b.rows[same & in_a & (b.lengths > last_len)].tolist()),
            finished=tuple(a.rows[~SlotSet(b.rows).contains(a.rows)].tolist()),
            reused=tuple(b.rows[seen & ~same].tolist()),
            resumed=tuple(b.rows[same & ~in_a].tolist()),
            unchanged=int(np.count_nonzero(same & in_a & (b.lengths <= last_len))),
            tokens_added=int(np.maximum(b.lengths - last_len, 0)[same & in_a].sum()),
            allocated_from_free=from_free,
            allocated_unseen=unseen,
            owner_changes=changes,
            leak_new=tuple(leak_new.tolist()),
            leak_delta=delta,
            leak_per_step=per_step,
        )
        return interval, events

    def _freed_while_held(
        self, a: Snapshot, b: Snapshot, cont: np.ndarray, last: np.ndarray
    ) -> list[TimelineEvent]:
        """Live cells whose slot the full free list holds, not seen so before."""
        if b.free is None or b.free_known is None:
            return []
        hit = np.flatnonzero(b.free & b.free_known & (b.slot > 0))
        hit = hit[~SlotSet(self.freed_live).contains(b.slot[hit])]
        if hit.size == 0:
            return []
        hit = hit[np.argsort(b.slot[hit], kind="stable")]
        hit = hit[_first_per(b.slot[hit])]
        # a continuing cell's owner held the slot since the row's last dump; a new cell was
        # handed out since the dump before
        start = np.where(cont[hit], last[hit], a.index)
        found = []
        for since in distinct(start).tolist():
            cells = hit[start == since]
            held = int(np.count_nonzero(cont[cells]))
            after = self.steps[since]
            how = [f"{held} held since dump {since}"] if held else []
            if cells.size > held:
                how.append(f"{cells.size - held} handed out since, still listed free")
            what = (
                f"{plural(cells.size, 'slot')} on the full free list while a request still "
                f"holds {_them(cells.size)} ({', '.join(how)}): freed {_steps(after, b.step)}"
            )
            found.append(self._event(EventKind.USE_AFTER_FREE, Space.FULL, since, b, cells, what))
        return found

    def _two_owners(
        self, a: Snapshot, b: Snapshot, cont: np.ndarray, mapped: np.ndarray, a_cell: np.ndarray
    ) -> tuple[list[TimelineEvent], np.ndarray]:
        """Slots that got a second owner since the dump before, while the first still holds
        them: a use after free when a dump listed the slot free in between, else a double
        allocation. Returns the events and the slots."""
        slots = _multi_owner_slots(b)
        slots = slots[~SlotSet(self.two_owners).contains(slots)]
        if slots.size == 0:
            return [], slots
        cells = np.flatnonzero(SlotSet(slots).contains(b.slot))
        # holder: a continuing cell first; other: a new cell with another signature
        order = np.lexsort((b.position[cells], cont[cells].astype(np.int8) * -1, b.slot[cells]))
        cells = cells[order]
        first = _first_per(b.slot[cells])
        holder = cells[first]
        which = np.cumsum(first) - 1
        differs = (b.position[cells] != b.position[holder][which]) | (
            b.prev[cells] != b.prev[holder][which]
        )
        candidates = cells[differs]
        order = np.lexsort((b.position[candidates], cont[candidates], b.slot[candidates]))
        candidates = candidates[order]
        other = candidates[_first_per(b.slot[candidates])]
        # a slot is new to two owners only if one of them was handed out since the dump before
        fresh = ~cont[holder] | ~cont[other]
        holder, other = holder[fresh], other[fresh]
        if holder.size == 0:
            return [], np.zeros(0, np.int64)
        was_free = SlotSet(self.freed_live).contains(b.slot[holder])
        if a.free is not None and a.free_known is not None and a.slot.size:
            listed = mapped[holder] & a.free[a_cell[holder]] & a.free_known[a_cell[holder]]
            was_free |= listed
        found = []
        for kind, pick in (
            (EventKind.USE_AFTER_FREE, was_free & cont[holder]),
            (EventKind.DOUBLE_ALLOCATION, ~(was_free & cont[holder])),
        ):
            if not pick.any():
                continue
            extra = {
                "other_pool_row": b.rows[b.row_of_cell[other[pick]]],
                "other_position": b.position[other[pick]],
            }
            count = int(np.count_nonzero(pick))
            if kind is EventKind.USE_AFTER_FREE:
                what = (
                    f"{plural(count, 'freed slot')} handed out again while their owner still "
                    f"holds {_them(count)}: {_steps(a.step, b.step)}"
                )
            else:
                what = (
                    f"{plural(count, 'slot')} handed out again while their owner still holds "
                    f"{_them(count)}, with no dump listing {_them(count)} free in between: "
                    f"{_steps(a.step, b.step)}"
                )
            found.append(self._event(kind, Space.FULL, a.index, b, holder[pick], what, extra))
        return found, b.slot[holder]

    def _prefix_rewritten(
        self, a: Snapshot, b: Snapshot, cells: np.ndarray, old_cells: np.ndarray
    ) -> list[TimelineEvent]:
        """Written cells of live requests that hold another slot now, with the old slot and
        what became of it (`PREFIX_FATES`)."""
        if cells.size == 0:
            return []
        old = a.slot[old_cells]
        fate = np.full(old.shape, FATE_UNKNOWN, dtype=np.int64)
        if b.free_list is not None:
            listed = SlotSet(b.free_list).contains(old)
            if b.free_domain is not None:  # a shrunk dump speaks for the slots it kept
                listed &= SlotSet(b.free_domain).contains(old)
            fate[:] = np.where(listed, FATE_FREE, FATE_ORPHANED)
            if b.free_domain is not None:
                fate[~SlotSet(b.free_domain).contains(old)] = FATE_UNKNOWN
        fate[SlotSet(b.distinct_slots).contains(old)] = FATE_HELD
        counts = [
            f"{int(np.count_nonzero(fate == code))} {word}"
            for code, word in PREFIX_FATES.items()
            if np.any(fate == code)
        ]
        what = (
            f"{plural(cells.size, 'written cell')} of live requests {_hold(cells.size)} another "
            "slot than in the dump "
            f"before (old slots: {', '.join(counts)}): rewritten {_steps(a.step, b.step)}; "
            "a live request's written cells never change while it keeps its pool row"
        )
        extra = {"old_slot": old, "old_slot_fate": fate}
        return [self._event(EventKind.PREFIX_REWRITTEN, Space.FULL, a.index, b, cells, what, extra)]

    def _lut_rewritten(
        self, a: Snapshot, b: Snapshot, mapped: np.ndarray, a_cell: np.ndarray
    ) -> list[TimelineEvent]:
        """Continuing cells in their request's window whose LUT entry moved from one SWA
        slot to another. Behind the window a request reads no SWA: its cached cells there
        are the tree's, whose SWA side is freed (a tombstone) and may come back with other
        slots when another request caches the same tokens."""
        if a.swa is None or b.swa is None or a.swa_known is None or b.swa_known is None:
            return []
        if a.slot.size == 0:
            return []
        before = np.where(mapped, a.swa[a_cell], 0)
        known = mapped & a.swa_known[a_cell] & b.swa_known
        if b.window is not None:  # the first query of b's step reads back to here
            known &= b.position >= np.repeat(b.prefix, b.lengths) - b.window
        moved = np.flatnonzero(known & (before > 0) & (b.swa > 0) & (b.swa != before))
        if moved.size == 0:
            return []
        moved = moved[np.argsort(b.slot[moved], kind="stable")]
        moved = moved[_first_per(b.slot[moved])]
        what = (
            f"{moved.size} LUT entr{'y' if moved.size == 1 else 'ies'} of live cells now map to "
            f"another SWA slot: rewritten {_steps(a.step, b.step)}"
        )
        extra = {"swa_before": before[moved], "swa_after": b.swa[moved]}
        return [self._event(EventKind.LUT_REWRITTEN, Space.FULL, a.index, b, moved, what, extra)]

    def _leak(self, b: Snapshot) -> tuple[np.ndarray, TimelineEvent | None]:
        """SWA pages leaked that the last dump accounting leaks did not have, and the leak
        event: one for the whole sequence, dated by its first pages, grown by the later ones."""
        base = self.leak_base
        if b.leaked is None or base is None:
            return np.zeros(0, np.int64), None
        new = b.leaked[~SlotSet(self.leak_seen).contains(b.leaked)]
        if new.size == 0:
            return new, None
        if self.leak_first is None:
            self.leak_first = (base[0], base[1], int(base[2].size), b.index, b.step, new.size)
        self.leak_pages = union(self.leak_pages, new)
        since, after, before, to, at, first = self.leak_first
        what = (
            f"{plural(first, 'SWA page')} neither free nor mapped from a held full slot: leaked "
            f"{_steps(after, at)}"
        )
        if after is not None and b.step is not None and b.step > after:
            rate = (b.leaked.size - before) / (b.step - after)
            unit = "page" if abs(rate) == 1 else "pages"  # 0.5 pages, 1 page, 2 pages
            what += f"; {b.leaked.size} leaked at step {b.step}, {rate:+.3g} {unit} per step"
        pages = self.leak_pages
        empty = np.full(pages.size, -1, dtype=np.int64)
        slots = pages * b.page
        cells = CellColumns(
            batch_row=empty, pool_row=empty, position=empty, slot=slots, extra={"page": pages}
        )
        event = TimelineEvent(
            kind=EventKind.SWA_LEAK,
            cause=EventKind.SWA_LEAK.default_cause,
            space=Space.SWA,
            from_dump=since,
            to_dump=to,
            after_step=after,
            at_step=at,
            cells=cells,
            pages=tuple(pages.tolist()),
            findings=(),
            message=what,
        )
        return new, event

    def _allocations(
        self, a: Snapshot, b: Snapshot, cont: np.ndarray, a_same: np.ndarray, skip: np.ndarray
    ) -> tuple[int, int, CellColumns]:
        """Slots newly held: from `a`'s free list, unseen in `a`, or taken over from an owner
        that `a` had and `b` no longer has (the owner changes)."""
        new = np.flatnonzero(~cont & (b.slot > 0))
        new = new[np.argsort(b.slot[new], kind="stable")]
        new = new[_first_per(b.slot[new])]
        was_held = SlotSet(a.distinct_slots).contains(b.slot[new])
        listed = (
            np.zeros(new.size, bool)
            if a.free_list is None
            else SlotSet(a.free_list).contains(b.slot[new])
        )
        # an owner change: the slot's owners in `a` are gone, and no continuing cell holds it
        gone = ~np.repeat(a_same, a.lengths)
        taken = new[was_held & ~SlotSet(skip).contains(b.slot[new])]
        gone_cells = np.flatnonzero(gone & SlotSet(b.slot[taken]).contains(a.slot))
        gone_cells = gone_cells[np.argsort(a.slot[gone_cells], kind="stable")]
        gone_cells = gone_cells[_first_per(a.slot[gone_cells])]
        changed = taken[SlotSet(a.slot[gone_cells]).contains(b.slot[taken])]
        still = SlotSet(b.slot[changed]).contains(b.slot) & cont
        changed = changed[~SlotSet(b.slot[still]).contains(b.slot[changed])]
        old = gone_cells[np.searchsorted(a.slot[gone_cells], b.slot[changed])]
        a_rows = a.row_of_cell
        changes = _columns(
            b,
            changed,
            {"old_pool_row": a.rows[a_rows[old]], "old_position": a.position[old]},
        )
        from_free = int(np.count_nonzero(~was_held & listed))
        return from_free, int(np.count_nonzero(~was_held & ~listed)), changes

    def _event(
        self,
        kind: EventKind,
        space: Space,
        since: int,
        b: Snapshot,
        cells: np.ndarray,
        message: str,
        extra: dict[str, np.ndarray] | None = None,
    ) -> TimelineEvent:
        slots = b.slot[cells]
        columns = _columns(b, cells, {**(extra or {}), "page": slots // b.page})
        return TimelineEvent(
            kind=kind,
            cause=kind.default_cause,
            space=space,
            from_dump=since,
            to_dump=b.index,
            after_step=self.steps[since],
            at_step=b.step,
            cells=columns,
            pages=tuple(distinct(slots // b.page).tolist()),
            findings=(),
            message=message,
        )

    # --- the slot history and the findings -------------------------------------------------

    def _moment(self, snap: Snapshot, reused_rows: np.ndarray) -> None:
        moment = snap.moment
        assert moment is not None
        before = self.moments[-1] if self.moments else None
        owners = {(o.pool_row, o.position) for o in moment.owners}
        if moment.owners_total and moment.free:
            state = "held and free"
        elif snap.focus_owners > 1:
            state = "held twice"
        elif moment.owners_total:
            if before is None:
                state = "held"
            elif not before.owners_total:
                state = "allocated from the free list" if before.free else "allocated"
            elif owners == {(o.pool_row, o.position) for o in before.owners} and not any(
                o.pool_row in set(reused_rows.tolist()) for o in moment.owners
            ):
                state = "held"
            else:
                state = "new owner (no dump shows it free in between)"
        else:
            state = "free" if moment.free else "not in the batch"
        self.moments.append(replace(moment, state=state))

    def _record_findings(self, index: int, report: DumpReport) -> None:
        for finding in report.findings:
            key = (finding.code, finding.group, finding.cause, finding.space)
            entry = self.history.setdefault(
                key,
                {"first": index, "cells": {}, "slot": finding.slot, "severity": finding.severity},
            )
            cells = entry["cells"]
            assert isinstance(cells, dict)
            cells[index] = cells.get(index, 0) + finding.count

    def _undecided_note(self) -> str:
        """What the dumps without the tree's record could not decide, and what would."""
        first, to, _ = self.undecided[0]
        cells = sum(count for _, _, count in self.undecided)
        where = f"first between dumps {first} and {to}, {_steps(self.steps[first], self.steps[to])}"
        if len(self.undecided) > 1:
            where += f"; {len(self.undecided)} intervals in all"
        return (
            f"{plural(cells, 'written cell')} of live requests {_hold(cells)} another slot than "
            "in the dump "
            f"before ({where}), where the later dump records no radix tree (`tree_full_slots`) "
            "and its own bookkeeping does not show the old slot orphaned: not reported as "
            "prefix-rewritten, since such dumps cannot tell a rewrite from SGLang's own moves "
            "(a request retracted and prefilled again between the dumps, the old slots kept "
            "or freed by the tree). Dumps that record the tree decide it (the capture hook "
            "records it when it finds SGLang's radix cache); closer snapshots make it rarer"
        )

    def report(self, rank: str | None, *, checked: bool, notes: list[str]) -> TimelineReport:
        """The results, once every dump has been added."""
        count = len(self.dumps)
        findings = []
        for (code, group, cause, space), entry in self.history.items():
            cells = entry["cells"]
            first = entry["first"]
            severity = entry["severity"]
            slot = entry["slot"]
            assert isinstance(cells, dict) and isinstance(first, int)
            assert isinstance(severity, Severity) and (slot is None or isinstance(slot, int))
            findings.append(
                FindingHistory(
                    code=code,
                    group=group,
                    cause=cause,
                    severity=severity,
                    space=space,
                    first_dump=first,
                    first_step=self.steps[first],
                    cells=tuple(int(cells.get(i, 0)) for i in range(count)),
                    example_slot=slot,
                )
            )
        findings.sort(key=lambda f: (f.first_dump, -f.severity.rank, f.code.order, f.group))
        kinds = list(EventKind)
        events = sorted(
            self.events,
            key=lambda e: (e.to_dump, kinds.index(e.kind), e.from_dump, e.pages[:1]),
        )
        slot = None
        if self.focus is not None:
            events = [e for e in events if _touches(e, *self.focus)]
            slot = SlotHistory(slot=self.focus[0], space=self.focus[1], moments=tuple(self.moments))
        elif self.undecided:
            notes = [*notes, self._undecided_note()]
        return TimelineReport(
            rank=rank,
            dumps=tuple(self.dumps),
            intervals=tuple(self.intervals),
            events=tuple(events),
            findings=tuple(findings),
            checked=checked,
            slot=slot,
            notes=tuple(notes),
        )


#: What became of a rewritten cell's old slot (`old_slot_fate` of a `PREFIX_REWRITTEN` event):
#: held by a live cell of the later dump (another request, or this one elsewhere), on its
#: full free list, neither (orphaned: leaked, or kept by the radix cache), or unknown (the
#: dump records no free list, or a shrunk dump does not speak for the slot).
FATE_ORPHANED, FATE_FREE, FATE_HELD, FATE_UNKNOWN = 0, 1, 2, -1
PREFIX_FATES = {
    FATE_ORPHANED: "orphaned (neither free nor held)",
    FATE_FREE: "free",
    FATE_HELD: "held by a live cell",
    FATE_UNKNOWN: "not held (no free list to tell free from orphaned)",
}


def _speculative(mode: str | None) -> bool:
    """A forward mode whose pending writes are drafts (SGLang's `target_verify`,
    `draft_extend`...): the next step keeps only the accepted ones."""
    text = (mode or "").lower()
    return "verify" in text or "draft" in text


def _continuing(
    a: Snapshot, b: Snapshot, known: _Seen, in_a: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row of `b`: how many of its first cells are those the row's last request had
    (`written`), and whether they still are (`same`: the same request, grown or not).

    A request that keeps its row has written, by its next step, every cell it had (after a
    speculative step, the accepted drafts: the cells compared end at the prefix), so its
    prefix there covers them. A shorter prefix is a new occupancy: another request, or the
    same one retracted and prefilled again in its row (its old cells freed or cached, its
    pending writes new, even where the free list handed back the same slots)."""
    continuing = known.seen & (b.prefix >= known.committed)
    written = np.where(continuing, np.minimum(known.length, b.prefix), 0)
    expected = known.hash.copy()
    partial = np.flatnonzero(continuing & (written < known.length))
    if partial.size:  # drafts not all kept: hashed up to the prefix, from `a` if it has it
        here = partial[in_a[partial]]
        expected[here] = a.row_hash(written[here], np.searchsorted(a.rows, b.rows[here]))
        away = partial[~in_a[partial]]
        written[away] = known.committed[away]
        expected[away] = known.committed_hash[away]
    same = continuing & (b.row_hash(written) == expected)
    return written, same


def _rewritten_cells(
    a: Snapshot, b: Snapshot, candidate: np.ndarray, written: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cells of `b` (and their cells in `a`) among a row's first `written` (`_continuing`)
    that hold another slot in `b`, for the rows `candidate` marks (in both dumps, `a` the
    row's last, its cells not a prefix of `b`'s); and every cell of those rows that differs.

    A request that keeps its row only grows; a new request in the row (a reused row) shares
    at most a cached prefix from position 0 and differs from there on. So a written cell
    differs and the row is still the same request when a later written position holds the
    same slot as in `a`: the rewritten cells are those before the row's last unchanged
    position. (A new request can look so too, where the radix cache had replaced some of
    the old request's cells when it cached them: its cells after that position differ, and
    only unchanged cells continue.) Sorts and gathers over the candidate rows' cells, no
    loop."""
    none = np.zeros(0, dtype=np.int64)
    rows = np.flatnonzero(candidate & (written > 0))
    if rows.size == 0 or a.rows.size == 0:
        return none, none, none
    a_row = np.searchsorted(a.rows, b.rows[rows])
    written = written[rows]
    cells = _ragged(b.starts[rows], written)
    old = _ragged(a.starts[a_row], written)
    group = np.repeat(np.arange(rows.size, dtype=np.int64), written)
    position = b.position[cells]
    differs = b.slot[cells] != a.slot[old]
    kept = np.where(differs, -1, position)
    heads = np.cumsum(written) - written
    last_kept = np.maximum.reduceat(kept, heads)
    hit = differs & (position < last_kept[group]) & (a.slot[old] > 0)
    return cells[hit], old[hit], cells[differs]


def _deduplicated(a: Snapshot, b: Snapshot, cells: np.ndarray, old_cells: np.ndarray) -> np.ndarray:
    """Which rewritten cells are the radix cache's de-duplication: SGLang's tree, caching a
    running request's tokens, writes its own slots for the positions it already held over
    the request's cells and frees the request's copies (UnifiedRadixCache, through
    `mem_cache.common`'s checkpoint and insert path).

    Such a cell's new slot is the tree's and not listed free: `b`'s record of the tree holds
    it. Without that record, the cached prefix shows another way: another live request holds
    the slot at the same position after the same slot (one owner, as `check` reads it), or
    the slot was in use already in `a` (its free list speaks for the slot and does not list
    it), where a slot fresh from the free list was not. Its old slot is accounted for: listed
    free, in a page a live cell holds (allocated again: pages are handed out whole), or held
    as `b` records it (the tree's, a running request's). Anything else (a slot fresh from the
    free list, an old slot orphaned, no way to tell) stays a rewrite."""
    if cells.size == 0:
        return np.zeros(0, dtype=bool)
    new, old = b.slot[cells], a.slot[old_cells]
    accounted = _accounted(b, old)
    if b.tree is not None:
        cached = SlotSet(b.tree).contains(new)
    else:
        cached = _shared(b, cells) | (a.speaks_for(new) & ~a.listed_free(new))
    deduplicated: np.ndarray = cached & ~b.listed_free(new) & accounted
    return deduplicated


def _accounted(b: Snapshot, old: np.ndarray) -> np.ndarray:
    """Per old slot of a rewritten cell: `b` accounts for it (listed free, in a page a live
    cell holds, or held as `b` records it: `held_full_slots`, the tree's record)."""
    accounted: np.ndarray = b.listed_free(old)
    accounted |= SlotSet(distinct(b.slot // b.page)).contains(old // b.page)
    for held in (b.held, b.tree):
        if held is not None:
            accounted |= SlotSet(held).contains(old)
    return accounted


def _undecided(b: Snapshot, old: np.ndarray) -> np.ndarray:
    """Which rewritten cells (not de-duplicated, old slots `old`) `b` cannot tell from SGLang's
    own moves: without the tree's record, a request retracted and prefilled again between
    sparse dumps, whose old slots the tree keeps or freed and whose new ones the tree took
    over, looks rewritten (issue 43). Such a cell is decided only when its old slot is proved
    orphaned by `b`'s own bookkeeping: its free list speaks for the slot and does not list
    it, and its record of what is held (`held_full_slots`) does not hold it."""
    if b.tree is not None:
        return np.zeros(old.shape, dtype=bool)
    if b.held is None:
        return np.ones(old.shape, dtype=bool)
    undecided: np.ndarray = ~b.speaks_for(old) | _accounted(b, old)
    return undecided


def _shared(b: Snapshot, cells: np.ndarray) -> np.ndarray:
    """Per cell of `b`: another live cell holds its slot at the same position after the same
    slot (radix sharing); one sort over the cells holding those slots."""
    holders = np.flatnonzero(SlotSet(distinct(b.slot[cells])).contains(b.slot))
    keys = np.stack([b.slot[holders], b.position[holders], b.prev[holders]], axis=1)
    _, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    twice = counts[inverse.reshape(-1)] > 1  # one row holds a position once: another row
    shared: np.ndarray = SlotSet(distinct(holders[twice])).contains(cells)
    return shared


def _multi_owner_slots(snap: Snapshot) -> np.ndarray:
    """Slots (> 0) that live cells hold with two or more owner signatures (sorted; worked out
    once per snapshot): among the cells of slots held more than once, one sort by slot, and a
    slot is held twice when one of its cells differs from the first in position or slot
    before."""
    if snap.twice is not None:
        return snap.twice
    ordered = np.sort(snap.slot[snap.slot > 0])
    repeated = ordered[1:][ordered[1:] == ordered[:-1]] if ordered.size > 1 else ordered[:0]
    cells = np.flatnonzero(SlotSet(distinct(repeated)).contains(snap.slot) & (snap.slot > 0))
    del ordered
    cells = cells[np.argsort(snap.slot[cells], kind="stable")]
    first = _first_per(snap.slot[cells])
    head = cells[first][np.cumsum(first) - 1]
    differs = (snap.position[cells] != snap.position[head]) | (snap.prev[cells] != snap.prev[head])
    snap.twice = distinct(snap.slot[cells[differs]])
    return snap.twice


def _touches(event: TimelineEvent, slot: int, space: Space) -> bool:
    """The event names the slot: as one of its slots, or (an SWA slot) as a LUT entry's old or
    new value."""
    cells = event.cells
    named = [cells.slot] if event.space is space and cells.slot is not None else []
    if space is Space.SWA:
        named += [cells.extra[k] for k in ("swa_before", "swa_after") if k in cells.extra]
    return any(bool(np.any(values == slot)) for values in named)


def _leak_change(a: Snapshot, b: Snapshot) -> tuple[int | None, float | None]:
    """How many more pages `b` leaks than `a`, in all and per step (None: not accounted)."""
    if a.leaked is None or b.leaked is None:
        return None, None
    delta = int(b.leaked.size - a.leaked.size)
    per_step = None
    if a.step is not None and b.step is not None and b.step > a.step:
        per_step = delta / (b.step - a.step)
    return delta, per_step


def _linked(event: TimelineEvent, report: DumpReport) -> TimelineEvent:
    """The event with the codes of its dump's findings that touch its slots, and the cause the
    first of them belongs to (else the kind's own)."""
    slots = event.cells.slot
    if slots is None or slots.size == 0:
        return event
    codes: list[FindingCode] = []
    cause = None
    for finding in report.findings:
        cells = finding.cells
        if finding.space is not event.space or cells is None or cells.slot is None:
            continue
        if not np.isin(slots, cells.slot).any():
            continue
        if finding.code not in codes:
            codes.append(finding.code)
        if cause is None and finding.cause is not None:
            cause = finding.cause
    return replace(event, findings=tuple(codes), cause=cause or event.cause)


def _load(entry: _Entry, overrides: Mapping[str, int | str | None] | None) -> KvDump:
    """The dump, read by the header that put it in step order (not read again); refused when
    the file is no longer the one that header was read from, unchanged (replaced or rewritten
    since): it would be read under another step."""
    try:
        return load_dump(entry.path, overrides=overrides, header=entry.header)
    except FileChangedError:
        step = "no step" if entry.step is None else f"step {entry.step}"
        raise DumpError(
            f"changed while the timeline read the sequence (ordered as {step}, then replaced "
            "or rewritten)",
            path=str(entry.path),
            hint="copy the dumps somewhere the capture hook does not write, and read the copies",
        ) from None


def timeline(
    paths: Sequence[PathLike],
    *,
    planner: Planner | None,
    keep_order: bool = False,
    focus: tuple[int, Space] | None = None,
    overrides: Mapping[str, int | str | None] | None = None,
    headers: Sequence[HeaderRead] | None = None,
) -> TimelineReport:
    """Read `paths` (one rank's dumps) in step order, one at a time, and report what changed
    between each and the next. With a `planner`, each dump is also checked (as `check --kernel
    none`), to date its findings and tie each event to the cause of its dump's findings; with
    `focus` (slot, space), the slot's owners in every dump. `keep_order`: the dumps are given
    oldest first (`diff`). `headers`: the dumps' headers as the run read them already (one
    per path); each dump's header is read once, here or there."""
    entries = order_dumps(paths, keep_order=keep_order, headers=headers)
    tracker = _Tracker(focus=focus)
    shape: tuple[tuple[int, ...], int, Path] | None = None
    shrunk = leak_notes = 0
    notes: list[str] = []
    for index, entry in enumerate(entries):
        dump = _load(entry, overrides)
        pools = (tuple(dump.req_to_token.shape), dump.scalar("page_size") or 1)
        if shape is None:
            shape = (*pools, entry.path)
        elif pools != shape[:2]:
            what = "req_to_token" if pools[0] != shape[0] else "page_size"
            mine = list(pools[0]) if what == "req_to_token" else pools[1]
            theirs = list(shape[0]) if what == "req_to_token" else shape[1]
            raise DumpError(
                f"is {mine}, {shape[2]}'s is {theirs}: a timeline reads one rank's pools",
                field=what,
                path=str(entry.path),
            )
        if focus is not None and focus[1] is Space.SWA and dump.full_to_swa_index_mapping is None:
            raise OptionError(
                f"{entry.path} has no LUT: an SWA slot has no owners there", option="space"
            )
        report = None if planner is None else run_check(dump, planner=planner, kernel=None)
        snap = snapshot(dump, index, entry.step, focus=focus)
        shrunk += dump.shrunk
        del dump
        if snap.info.leak_note is not None:
            leak_notes += 1
            if leak_notes == 1:
                notes.append(f"SWA leaks not accounted in {entry.path}: {snap.info.leak_note}")
        tracker.add(snap, report)
        del report, snap
    if leak_notes > 1:
        notes.append(f"SWA leaks not accounted in {leak_notes} dumps in all")
    if shrunk:
        notes.append(
            f"{plural(shrunk, 'shrunk dump')}: compared on the cells "
            f"{'it' if shrunk == 1 else 'they'} kept (every live cell), free lists on the slots "
            f"{'it speaks' if shrunk == 1 else 'they speak'} for"
        )
    if entries[0].step is None:
        notes.append("no dump records its step: read in the order given")
    ranks = {e.rank for e in entries}
    rank = entries[0].rank if len(ranks) == 1 else None
    if entries[0].rank is None or len(ranks) > 1:
        notes.append("not every dump records its rank")
    return tracker.report(rank, checked=planner is not None, notes=notes)


def slot_history(
    paths: Sequence[PathLike],
    *,
    slot: int | None,
    row: int | None,
    space: str,
    overrides: Mapping[str, int | str | None] | None = None,
) -> TimelineReport:
    """`provenance --slot N DUMP DUMP...`: the timeline of one rank's dumps focused on one slot
    (its owners, allocator state and LUT entry in each); a row map is of one dump."""
    if slot is None or row is not None:
        raise OptionError(
            "over several dumps, give --slot N (--row maps one dump's row)", option="slot/row"
        )
    checked_integer(slot, "slot", SLOT)
    focus = (slot, Space(checked_choice(space, [s.value for s in Space], "space")))
    return timeline(paths, planner=None, focus=focus, overrides=overrides)
