"""The allocator's bookkeeping around the batch: both free lists, the whole SWA LUT, and the
pools' leaks, with the counts SGLang's own memory check printed set against them.

The canary planner reads only the batch's cells; SGLang's SWA faults of 2026 lived in what
surrounds them (docs/findings.md, "Finding codes": the bookkeeping codes). In a clean state
(SGLang 0.5.23's `srt/mem_cache/allocator/swa.py`, `paged.py`):

- a free list holds each slot once, and never a slot of the reserved page 0 (the padding
  slots `0 .. page_size - 1`, in both pools), which the LUT never maps from nor to either;
- a full slot goes back on the free list only after its SWA peer is released and its LUT
  entry cleared (`free_full` expects `LUT[slot] == 0`), so a free full slot maps to 0;
- an SWA slot mapped from any full slot (live, cached, out of the window) is not free, and has
  one full owner;
- this step's writes (`out_cache_loc`) land, through the LUT, on SWA slots no other live cell of
  the window holds;
- every SWA page is free, or mapped from a full slot a running request or the tree holds
  (what the dump's `held_full_slots` lists, or its `tree_full_slots` and the running rows'
  `req_pool_allocated_lens`), a tombstoned tree slot (in `tree_full_slots`, not in
  `tree_swa_resident_slots`) holding no SWA: a page in none is leaked.

Each check is a few sorts over arrays as long as the LUT and the lists: no loop per slot. A
finding about slots (not table cells) keeps -1 in its cells' coordinate columns.

SGLang's memory check (`pool memory leak detected! [full] total=..., available=...,
evictable=..., protected=..., session_held=..., uncached=...`) is a sum: `available + evictable
+ protected + session_held + uncached == total`. It says how many slots are missing, never
which. A dump that records what the tree holds (`tree_full_slots`, `tree_swa_resident_slots`)
and what each running request has allocated (`req_pool_allocated_lens`) names them: a full slot
of the pool that is not free, not the tree's and not inside a running request's allocated cells
is leaked (`FULL_PAGE_LEAKED`), as an SWA page is above. The capture hook's leak trigger records
SGLang's printed counts as `sglang.check.<pool>.<count>`; `reconciliation_notes` sets them
against kvcanary's own counts of the same state and says which pages make up the difference.
The full pool's accounting is a few boolean arrays of the pool's size and one gather of the
running rows' allocated cells: no loop per slot either.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import cast

import numpy as np

from kvcanary_cli.analysis.cells import distinct, repeated
from kvcanary_cli.analysis.coverage import (
    FULL_FREE_LIST,
    FULL_LEAKS,
    SWA_FREE_LIST,
    SWA_LEAKS,
    SWA_LUT,
    runs,
    why_not,
)
from kvcanary_cli.analysis.findings import held_twice, reserved_pages, step_writes
from kvcanary_cli.analysis.provenance import LiveCells, SlotSet
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import CHECK_COUNTS, CHECK_COUNTS_PREFIX, Group
from kvcanary_cli.planners.base import Plan
from kvcanary_cli.results.cells import CellColumns, Role, Space
from kvcanary_cli.results.check import Finding, JsonValue

__all__ = [
    "held_findings",
    "free_list_findings",
    "full_leaks",
    "leaked_swa_pages",
    "lut_bookkeeping_findings",
    "pages_text",
    "pool_leak_findings",
    "printed_counts",
    "recorded_held_slots",
    "reconciliation_notes",
]


def _slot_cells(slots: np.ndarray, extra: dict[str, np.ndarray] | None = None) -> CellColumns:
    """Cells of a finding about slots: coordinates -1, the slots ascending."""
    order = np.argsort(slots, kind="stable")
    none = np.full(slots.size, -1, dtype=np.int64)
    return CellColumns(
        batch_row=none,
        pool_row=none,
        position=none,
        slot=slots[order].astype(np.int64),
        extra={name: values[order].astype(np.int64) for name, values in (extra or {}).items()},
    )


#: Pages a finding names in its details (a sample, with the totals).
_PAGES_SHOWN = 8


def _slot_finding(
    code: FindingCode,
    group: Group,
    space: Space,
    cells: CellColumns,
    one: str,
    many: str,
    details: dict[str, object] | None = None,
    page_size: int = 1,
) -> Finding:
    """A finding about slots: `one` describes a single slot ({slot}), `many` the group.

    With pages of several slots the allocator frees and maps whole pages, so the finding
    says which pages are wholly in it and which only in part (a page partly cleared is the
    mark of a free that handled tokens, not pages)."""
    assert cells.slot is not None
    first = int(cells.slot[0])
    facts = dict(details or {})
    message = one.format(slot=first) if len(cells) == 1 else many
    if page_size > 1:
        pages, counts = np.unique(cells.slot // page_size, return_counts=True)
        whole, partial = pages[counts >= page_size], pages[counts < page_size]
        facts.update(
            page_size=page_size,
            whole_pages=[int(x) for x in whole[:_PAGES_SHOWN]],
            whole_pages_total=int(whole.size),
            partial_pages=[int(x) for x in partial[:_PAGES_SHOWN]],
            partial_pages_total=int(partial.size),
        )
        message += (
            f" ({whole.size} whole page{'s' if whole.size != 1 else ''}, {partial.size} "
            f"in part, of {page_size} slots)"
        )
    return Finding(
        code=code,
        group=group,
        space=space,
        slot=first,
        message=message,
        details=cast(dict[str, JsonValue], facts),
        cells=cells,
    )


def _page_size(page_size: int | None) -> int:
    """The page size (1 when not recorded): slots `0 .. page_size - 1` are the padding page of
    both pools."""
    return max(1, page_size or 1)


def free_list_findings(dump: KvDump) -> list[Finding]:
    """Both free lists: a slot listed twice (a double free), the reserved page listed."""
    found: list[Finding] = []
    page = _page_size(dump.scalars["page_size"].value)  # the padding page: slots below it
    lists = (
        (Space.FULL, Group.FULL, dump.free_full_slots, "free_full_slots", FULL_FREE_LIST),
        (Space.SWA, Group.SWA, dump.free_swa_slots, "free_swa_slots", SWA_FREE_LIST),
    )
    for space, group, free, name, family in lists:
        if not runs(dump, family) or free is None or free.size == 0:
            continue
        values = np.asarray(free, dtype=np.int64).reshape(-1)
        repeat = held_twice(values)
        if repeat.any():
            ordered = np.sort(values[repeat])  # the repeated entries only: few
            twice = distinct(ordered)
            times = np.searchsorted(ordered, twice, "right") - np.searchsorted(ordered, twice)
            found.append(
                _slot_finding(
                    FindingCode.FREE_LIST_DUPLICATE,
                    group,
                    space,
                    _slot_cells(twice, {"times_listed": times}),
                    f"{space} slot {{slot}} is on {name} more than once: freed twice",
                    f"{space} slots on {name} more than once: freed twice",
                    {"free_list": name},
                    page_size=page,
                )
            )
        # the full side may reserve more than its padding page (page-interleave: shard_size)
        reserved = page * (reserved_pages(dump) if space is Space.FULL else 1)
        held = distinct(values[(values >= 0) & (values < reserved)])
        if held.size:
            what = "the padding page" if reserved == page else "a reserved page"
            found.append(
                _slot_finding(
                    FindingCode.RESERVED_SLOT_IN_USE,
                    group,
                    space,
                    _slot_cells(held),
                    f"reserved {space} slot {{slot}} ({what}) is on {name}",
                    f"reserved {space} slots ({what}) are on {name}",
                    {"free_list": name, "reserved_slots": reserved},
                    page_size=page,
                )
            )
    return found


def _lut_entries(dump: KvDump) -> tuple[np.ndarray, np.ndarray]:
    """(full slot, LUT value) of every known LUT entry but the trailing -1 sentinel."""
    lut = dump.full_to_swa_index_mapping
    assert lut is not None
    size = int(lut.shape[0])
    stop = size - 1 if lut.element(-1) == -1 else size
    if lut.complete:
        full = np.arange(stop, dtype=np.int64)
        return full, np.asarray(lut.array()[:stop], dtype=np.int64)
    full = lut.known_indices(0, stop)
    return full, np.asarray(lut.take_known(full)[0], dtype=np.int64)


def lut_bookkeeping_findings(dump: KvDump, cells: LiveCells, plan: Plan) -> list[Finding]:
    """The whole LUT against both free lists and itself, and this step's SWA writes.

    Faults the live-cell detectors already report are left to them: an SWA slot free and
    mapped from a live cell (`FREED_SLOT_IN_LIVE_RANGE`), two in-window cells on one SWA slot
    (`SWA_SLOT_COLLISION`)."""
    lut = dump.full_to_swa_index_mapping
    if not runs(dump, SWA_LUT) or lut is None or lut.size == 0:
        return []
    every_full, every_swa = _lut_entries(dump)
    page = _page_size(dump.scalars["page_size"].value)
    # only mapped entries can break these rules: check those (half the LUT or less)
    picked = np.flatnonzero(every_swa > 0)
    full, swa = every_full[picked], every_swa[picked]
    found: list[Finding] = []
    padding_mapped = full < page
    # SWA slots 1 .. page_size - 1 of the padding page (slot 0 reads as unmapped): SGLang
    # hands them out once page 0 reached its SWA free list (PR #38519 at page_size > 1)
    padding_handed = swa < page
    if padding_handed.any():
        found.append(
            _slot_finding(
                FindingCode.RESERVED_SLOT_IN_USE,
                Group.SWA,
                Space.FULL,
                _slot_cells(full[padding_handed], {"swa_slot": swa[padding_handed]}),
                "full slot {slot} maps into the SWA pool's reserved padding page: SWA page 0 "
                "was freed and handed out",
                "full slots map into the SWA pool's reserved padding page (SWA slots 1 .. "
                "page_size - 1): SWA page 0 was freed and handed out",
                {"reserved_slots": page},
                page_size=page,
            )
        )
    if padding_mapped.any():
        found.append(
            _slot_finding(
                FindingCode.RESERVED_SLOT_IN_USE,
                Group.SWA,
                Space.FULL,
                _slot_cells(full[padding_mapped], {"swa_slot": swa[padding_mapped]}),
                "page full slot {slot} (the padding page) maps to an SWA slot",
                "page full slots (the padding page) map to SWA slots",
                {"reserved_slots": page},
                page_size=page,
            )
        )
    if runs(dump, FULL_FREE_LIST) and dump.free_full_slots is not None:
        free_full = SlotSet(dump.free_full_slots)
        free_mapped = free_full.contains(full)
        if free_mapped.any():
            one, many = _still_mapped_texts(dump, swa[free_mapped], every_full, every_swa)
            found.append(
                _slot_finding(
                    FindingCode.FREE_SLOT_STILL_MAPPED,
                    Group.SWA,
                    Space.FULL,
                    _slot_cells(full[free_mapped], {"swa_slot": swa[free_mapped]}),
                    "full slot {slot} is on the free list but its LUT entry still maps it to "
                    f"an SWA slot: {one}",
                    "full slots on the free list whose LUT entries still map them to SWA "
                    f"slots: {many}",
                    page_size=page,
                )
            )
    if runs(dump, SWA_FREE_LIST) and dump.free_swa_slots is not None:
        # mapped from a full slot outside the batch's live cells (those are already reported)
        stale = SlotSet(dump.free_swa_slots).contains(swa)
        stale[stale] &= ~SlotSet(cells.slot[cells.slot > 0]).contains(full[stale])
        if stale.any():
            found.append(
                _slot_finding(
                    FindingCode.SWA_SLOT_FREE_AND_MAPPED,
                    Group.SWA,
                    Space.SWA,
                    _slot_cells(swa[stale], {"full_slot": full[stale]}),
                    "SWA slot {slot} is on the SWA free list, yet a full slot outside the batch "
                    "still maps to it: a stale mapping",
                    "SWA slots on the SWA free list that full slots outside the batch still "
                    "map to: stale mappings",
                    page_size=page,
                )
            )
    found += _out_of_lockstep(full, swa, page)
    found += _swa_leaks(dump, full, swa)
    writes = _swa_writes(dump, cells, plan, every_full, every_swa)
    # a write's own full slot sharing the SWA slot is that write's finding, not a second owner's
    written = [w.cells.extra["full_slot"] for w in writes if w.cells is not None]
    found += _shared_owners(full, swa, cells, plan, *written)
    return found + writes


def _still_mapped_texts(
    dump: KvDump, stale: np.ndarray, every_full: np.ndarray, every_swa: np.ndarray
) -> tuple[str, str]:
    """What the free of full slots whose entries still map to `stale` SWA slots did on the
    SWA side, for one slot and for a group: released the SWA slots (on the SWA free list),
    which were handed out again (another full slot off the free list maps to them), or
    skipped them (neither)."""
    free = (
        SlotSet(dump.free_swa_slots).contains(stale)
        if dump.free_swa_slots is not None
        else np.zeros(stale.shape, dtype=bool)
    )
    owners = every_swa  # the SWA slots full slots off the free list map to
    if dump.free_full_slots is not None:
        owners = every_swa[~SlotSet(dump.free_full_slots).contains(every_full)]
    reissued = ~free & np.isin(stale, owners)
    if free.all():
        return (
            "its free released the SWA slot but left the entry",
            "their frees released the SWA slots but left the entries",
        )
    if reissued.all():
        return (
            "its SWA slot was freed and handed out again, the entry left stale",
            "their SWA slots were freed and handed out again, the entries left stale",
        )
    if not (free | reissued).any():
        return "its free skipped the SWA side", "their frees skipped the SWA side"
    return (
        "its free left the entry",
        f"their frees left the entries ({int(free.sum())} of the SWA slots are free, "
        f"{int(reissued.sum())} handed out again, {int((~free & ~reissued).sum())} never "
        "freed)",
    )


def _out_of_lockstep(full: np.ndarray, swa: np.ndarray, page: int) -> list[Finding]:
    """Mapped entries that break the pages' lockstep: SGLang allocates, maps and frees full
    and SWA pages together, so a token sits at the same offset of its page in both pools and
    a full page's mapped tokens all map into one SWA page. An entry off its offset, or off the
    SWA page most of its full page's tokens map to (the lower page on a tie), was written on
    its own: a token-level rewrite no page allocation makes.

    `full` ascends (the LUT's order), so a full page's entries are one run: a min and a max
    per run find the split pages, and only their entries are sorted."""
    if page <= 1 or full.size == 0:
        return []
    full_page, swa_page = full // page, swa // page
    odd = (full % page) != (swa % page)
    starts = np.flatnonzero(np.r_[True, full_page[1:] != full_page[:-1]])
    sizes = np.diff(np.r_[starts, full.size])
    split = np.minimum.reduceat(swa_page, starts) != np.maximum.reduceat(swa_page, starts)
    if split.any():
        entry = np.flatnonzero(np.repeat(split, sizes))
        group, target = full_page[entry], swa_page[entry]
        order = np.lexsort((target, group))
        g, t = group[order], target[order]
        run = np.flatnonzero(np.r_[True, (g[1:] != g[:-1]) | (t[1:] != t[:-1])])
        run_size = np.diff(np.r_[run, g.size])
        # the most common SWA page of each split full page (the lowest on a tie): runs are
        # sorted by page within a group, so a stable sort by size keeps the lowest first
        by_size = np.lexsort((np.arange(run.size), -run_size, g[run]))
        first_of_group = np.r_[True, g[run][by_size][1:] != g[run][by_size][:-1]]
        chosen = run[by_size][first_of_group]  # one run per group, groups ascending
        odd[entry] |= target != t[chosen][np.searchsorted(g[chosen], group)]
    if not odd.any():
        return []
    return [
        _slot_finding(
            FindingCode.SWA_PAGE_OUT_OF_LOCKSTEP,
            Group.SWA,
            Space.FULL,
            _slot_cells(full[odd], {"swa_slot": swa[odd]}),
            "full slot {slot} maps to an SWA slot out of lockstep with its page (another "
            "offset, or another SWA page than the rest of its full page): a mapping written "
            "token by token",
            "full slots mapped out of lockstep with their pages (another offset, or another "
            "SWA page than the rest of their full page): mappings written token by token",
            {"page_size": page},
            page_size=page,
        )
    ]


def _recorded(dump: KvDump, name: str) -> int | None:
    """A scalar the dump records (None: absent, or only derived or assumed)."""
    scalar = dump.scalars[name]
    return None if scalar.value is None or scalar.assumed else scalar.value


def leaked_swa_pages(
    dump: KvDump, mapped: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[np.ndarray | None, str | None]:
    """The dump's leaked SWA pages (sorted), by SGLang's own memory check per page: a page
    neither on the SWA free list nor mapped from a held full slot (a request's last page holds
    unwritten slots that map to 0). `check` (`SWA_PAGE_LEAKED`) and `timeline` both count
    leaks here. `mapped` is the LUT's (full slot, SWA slot) entries with an SWA slot, when the
    caller has them. Worked out once per dump (`check` and the timeline's snapshot of the
    dump share it; the pages come back read-only).

    A held full slot is one `held_full_slots` lists, or, without that record, one of the full
    pool that is not on the full free list: SGLang counts a full slot in use exactly when it
    is not free. None, with what is missing, when the dump cannot say (reason None: no LUT,
    not an SWA dump): nothing is guessed. A shrunk dump keeps too little of the LUT and the
    free lists to tell (docs/dump-format.md, "Shrunk dumps")."""
    known = dump.derived.get("leaked_swa_pages")
    if known is None:
        known = _leaked_swa_pages(dump, mapped)
        if known[0] is not None:
            known[0].flags.writeable = False
        dump.derived["leaked_swa_pages"] = known
    return cast(tuple[np.ndarray | None, str | None], known)


def _leaked_swa_pages(
    dump: KvDump, mapped: tuple[np.ndarray, np.ndarray] | None
) -> tuple[np.ndarray | None, str | None]:
    lut = dump.full_to_swa_index_mapping
    if lut is None:
        return None, None
    why = why_not(dump, SWA_LEAKS)  # the records it needs, a whole LUT, not shrunk
    if why is not None:
        return None, why
    held, free = dump.held_full_slots, dump.free_swa_slots
    swa_slots = _recorded(dump, "num_swa_slots")
    assert free is not None and swa_slots is not None
    if mapped is None:
        every_full, every_swa = _lut_entries(dump)
        picked = np.flatnonzero(every_swa > 0)
        mapped = every_full[picked], every_swa[picked]
    full, swa = mapped
    page = _page_size(dump.scalars["page_size"].value)
    pages = swa_slots // page
    if pages <= 1 or pages > 4 * max(free.size + swa.size, 1) + (1 << 20):
        return None, f"num_swa_slots {swa_slots} is not a pool its lists could describe"
    accounted = np.zeros(pages, dtype=bool)
    accounted[0] = True  # the padding page
    free_pages = np.asarray(free, dtype=np.int64) // page
    accounted[free_pages[(free_pages >= 0) & (free_pages < pages)]] = True
    running = _running_slots(dump)
    tree = dump.tree_full_slots
    if held is None:
        held = _tree_and_running(dump, running)
    if held is not None:
        owned = SlotSet(np.asarray(held, dtype=np.int64)).contains(full)
    else:
        assert dump.free_full_slots is not None
        owned = ~SlotSet(dump.free_full_slots).contains(full) & (full >= page)
    resident = dump.tree_swa_resident_slots
    if tree is not None and resident is not None:
        # a tombstoned node keeps its full KV, not its SWA: SGLang's SWA check counts only
        # the tree's SWA-resident part (and running requests), so a page mapped only from a
        # tombstoned slot is counted nowhere
        tombstoned = SlotSet(np.asarray(tree, dtype=np.int64)).contains(full)
        tombstoned &= ~SlotSet(np.asarray(resident, dtype=np.int64)).contains(full)
        if running is not None:
            tombstoned &= ~SlotSet(running).contains(full)
        owned &= ~tombstoned
    used_pages = swa[(swa > 0) & owned] // page
    accounted[used_pages[used_pages < pages]] = True
    return np.flatnonzero(~accounted).astype(np.int64), None


def recorded_held_slots(dump: KvDump) -> np.ndarray | None:
    """The full slots the dump records as held (not sorted, not distinct): its
    `held_full_slots`, else the tree's and the running rows' (`tree_full_slots` and
    `req_pool_allocated_lens`); None when it records neither."""
    if dump.held_full_slots is not None:
        return np.asarray(dump.held_full_slots, dtype=np.int64)
    return _tree_and_running(dump, _running_slots(dump))


def _tree_and_running(dump: KvDump, running: np.ndarray | None) -> np.ndarray | None:
    tree = dump.tree_full_slots
    if tree is None or running is None:
        return None
    return np.concatenate([running, np.asarray(tree, dtype=np.int64)])


def _running_slots(dump: KvDump) -> np.ndarray | None:
    """The full slots running requests hold: each pool row up to its recorded allocated
    length (`req_pool_allocated_lens`); None without that record or with a partial table."""
    running = _running_rows(dump)
    if running is None:
        return None
    parts = [slots for _, _, slots in _running_cells(dump, *running)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _swa_leaks(dump: KvDump, full: np.ndarray, swa: np.ndarray) -> list[Finding]:
    """`SWA_PAGE_LEAKED`: the pages `leaked_swa_pages` counts, one cell per page."""
    leaked, _ = leaked_swa_pages(dump, (full, swa))
    if leaked is None or leaked.size == 0:
        return []
    page = _page_size(dump.scalars["page_size"].value)
    pages = int(dump.scalars["num_swa_slots"].value or 0) // page
    return [
        _slot_finding(
            FindingCode.SWA_PAGE_LEAKED,
            Group.SWA,
            Space.SWA,
            _slot_cells(leaked * page, {"page": leaked}),
            "SWA page at slot {slot} is neither free nor mapped from a held full slot: leaked",
            "SWA pages neither free nor mapped from a held full slot: leaked",
            {"page_size": page, "swa_pages": pages},
        )
    ]


def _in_window(cells: LiveCells, plan: Plan) -> np.ndarray:
    start = plan.frame.window_start[cells.batch_row]
    mask: np.ndarray = (~cells.pending) & (cells.position >= start)
    return mask


def _shared_owners(
    full: np.ndarray, swa: np.ndarray, cells: LiveCells, plan: Plan, *reported: np.ndarray
) -> list[Finding]:
    """SWA slots with more than one full owner anywhere in the LUT: each owner that is not an
    in-window cell (owners that all are: `SWA_SLOT_COLLISION`) nor a `reported` full slot."""
    owners = held_twice(swa)
    if not owners.any():
        return []
    s, f = swa[owners], full[owners]
    window_slots = cells.slot[_in_window(cells, plan)]
    # the owners that are not in-window cells: the stale or cached ones (owners that all sit
    # in the window are swa-slot-collision's)
    keep = ~np.isin(f, window_slots)
    for slots in reported:
        keep &= ~np.isin(f, slots)
    if not keep.any():
        return []
    return [
        _slot_finding(
            FindingCode.SWA_SLOT_SHARED_OWNER,
            Group.SWA,
            Space.SWA,
            _slot_cells(s[keep], {"full_slot": f[keep]}),
            "SWA slot {slot} has more than one full owner in the LUT (a cached or stale full "
            "slot among them): freeing either frees the other's KV",
            "SWA slots with more than one full owner in the LUT (cached or stale full slots "
            "among them): freeing one frees another's KV",
        )
    ]


def _swa_writes(
    dump: KvDump, cells: LiveCells, plan: Plan, full: np.ndarray, swa: np.ndarray
) -> list[Finding]:
    """This step's writes whose SWA target (`LUT[out_cache_loc]`) another live cell of the
    window holds."""
    writes = step_writes(dump)
    if writes is None or len(writes) == 0:
        return []
    written = writes.slot
    target = _translate(full, swa, written)
    translated = dump.swa_out_cache_loc  # what the backend really writes, when recorded
    given_count = 0
    if translated is not None:
        given = np.asarray(translated, dtype=np.int64).reshape(-1)[: written.size]
        target[: given.size] = given
        given_count = int(given.size)
    window = _in_window(cells, plan)
    held = cells.slot[window]
    held_swa = _translate(full, swa, held)
    live = held_swa > 0
    owner_full, owner_swa = held[live], held_swa[live]
    owner_row, owner_pos = cells.batch_row[window][live], cells.position[window][live]
    hit = np.flatnonzero((target > 0) & np.isin(target, owner_swa))
    if hit.size == 0:
        return []
    # a write onto its own cell's SWA slot is the step's own token, not another's
    order = np.argsort(owner_swa, kind="stable")
    at = order[np.minimum(np.searchsorted(owner_swa[order], target[hit]), order.size - 1)]
    foreign = owner_full[at] != written[hit]
    hit, at = hit[foreign], at[foreign]
    if hit.size == 0:
        return []
    rows, pools, positions = writes.batch_row[hit], writes.pool_row[hit], writes.position[hit]
    same = owner_row[at] == rows
    cells_of = CellColumns(
        batch_row=rows,
        pool_row=pools,
        position=positions,
        slot=target[hit],
        extra={"full_slot": written[hit], "out_cache_loc_index": hit.astype(np.int64)},
    )
    first = int(hit[0])
    source = f"swa_out_cache_loc[{first}]" if first < given_count else f"LUT[{written[first]}]"
    whose = (
        "the same request" if same[0] else f"another request (batch row {int(owner_row[at[0]])})"
    )
    from_given = int(np.count_nonzero(hit < given_count))
    sources = " and ".join(
        name
        for name, n in (
            ("swa_out_cache_loc", from_given),
            ("LUT[out_cache_loc]", hit.size - from_given),
        )
        if n
    )
    n_same = int(np.count_nonzero(same))
    return [
        Finding(
            code=FindingCode.SWA_WRITE_TO_LIVE_SLOT,
            group=Group.SWA,
            space=Space.SWA,
            slot=int(target[first]),
            batch_row=int(rows[0]),
            pool_row=int(pools[0]),
            position=int(positions[0]),
            role=Role.PENDING_WRITE,
            message=(
                f"out_cache_loc[{first}] writes full slot {written[first]}, whose SWA slot "
                f"{target[first]} (from {source}) {whose} holds live at position "
                f"{int(owner_pos[at[0]])} of its window"
                if hit.size == 1
                else f"writes whose SWA targets (from {sources}) live cells of the window "
                f"hold: {n_same} onto the same request's, {hit.size - n_same} onto another "
                "request's; a stale translation"
            ),
            cells=cells_of,
            full_slots=(int(written[first]),),
        )
    ]


def _translate(full: np.ndarray, swa: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """LUT[slot] for each slot through the known entries (`full` ascending), 0 where none:
    a search, never an array sized by the largest slot a dump names."""
    if full.size == 0:
        return np.zeros(slots.shape, dtype=np.int64)
    if int(full[-1]) == full.size - 1:  # every entry known (`full` is 0, 1, 2, ...): index
        inside = (slots >= 0) & (slots < full.size)
        direct: np.ndarray = np.where(inside, swa[np.where(inside, slots, 0)], 0)
        return direct
    at = np.minimum(np.searchsorted(full, slots), full.size - 1)
    found: np.ndarray = np.where(full[at] == slots, swa[at], 0)
    return found


# Full-pool leaks, and SGLang's memory check set against the dump.

#: Pages named in a message or note (the finding's cells hold them all).
_SHOWN = 8


def printed_counts(dump: KvDump, pool: str) -> dict[str, int] | None:
    """The counts SGLang printed for `pool` (`full`, `swa`) at the trigger, or None."""
    counts = {}
    for name in CHECK_COUNTS:
        text = dump.metadata.get(f"{CHECK_COUNTS_PREFIX}{pool}.{name}")
        if text is None or not text.strip().isdigit() or len(text.strip()) > 18:
            return None
        counts[name] = int(text.strip())
    return counts


def _page(dump: KvDump) -> int:
    return _page_size(dump.scalars["page_size"].value)


def _running_mask(
    dump: KvDump, running: tuple[np.ndarray, np.ndarray], size: int, page: int
) -> np.ndarray:
    """Which slots of `[0, size)` the `running` requests (`_running_rows`) hold: every page
    one of their allocated cells lies in, whole (SGLang allocates pages; a row's last page is
    partly unwritten). A boolean array, filled a chunk of rows at a time, so the memory is
    the pool's, whatever the lengths claim."""
    held = np.zeros(-(-size // page), dtype=bool)
    for _, _, slots in _running_cells(dump, *running):
        held[slots[(slots >= 0) & (slots < size)] // page] = True
    return np.repeat(held, page)[:size]


def full_leaks(dump: KvDump) -> tuple[np.ndarray, dict[str, int]] | None:
    """(the leaked full slots, kvcanary's counts of the pool) when the dump records the tree,
    the running requests, the full free list and the pool size; None otherwise."""
    if not runs(dump, FULL_LEAKS):
        return None
    tree, free = dump.tree_full_slots, dump.free_full_slots
    size = _recorded(dump, "num_full_slots")
    assert tree is not None and free is not None and size is not None
    page = _page(dump)
    bound = 4 * (int(np.asarray(free).size) + int(np.asarray(tree).size)) + (1 << 22)
    running = _running_rows(dump)  # a partial table cannot say what runs: nothing guessed
    if size <= page or size > bound or running is None:
        return None
    free_slots = distinct(np.asarray(free, dtype=np.int64))
    tree_slots = distinct(np.asarray(tree, dtype=np.int64))

    def inside(values: np.ndarray) -> np.ndarray:
        return values[(values >= page) & (values < size)]

    accounted = np.zeros(size, dtype=bool)
    accounted[:page] = True  # the padding page
    accounted[inside(free_slots)] = True
    accounted[inside(tree_slots)] = True
    private = _running_mask(dump, running, size, page)
    private[:page] = False
    private[inside(tree_slots)] = False
    accounted |= private
    leaked = np.flatnonzero(~accounted).astype(np.int64)
    listed = np.asarray(free, dtype=np.int64).reshape(-1)
    counts = {
        "total": size - page,
        "available": int(inside(free_slots).size),
        "listed_twice": int(inside(listed).size - inside(free_slots).size),
        "tree": int(inside(tree_slots).size),
        "uncached": int(private.sum()),
        "leaked": int(leaked.size),
    }
    return leaked, counts


def pages_text(pages: Sequence[int] | np.ndarray, page: int) -> str:
    """`page 2`, `pages 2, 5 and 9 more` (`slot ...` at page size 1)."""
    values = np.asarray(pages, dtype=np.int64)
    unit = "page" if page > 1 else "slot"
    shown = ", ".join(str(int(p)) for p in values[:_SHOWN])
    more = f" and {values.size - _SHOWN} more" if values.size > _SHOWN else ""
    return f"{unit}{'s' if values.size != 1 else ''} {shown}{more}"


def _pages_text(slots: np.ndarray, page: int) -> str:
    """`pages_text` of the pages that hold `slots`."""
    return pages_text(distinct(slots // page), page)


def pool_leak_findings(dump: KvDump) -> list[Finding]:
    """`FULL_PAGE_LEAKED`: full-pool slots neither free, nor the tree's, nor a running
    request's (SGLang's "pool memory leak detected!"), one cell per slot."""
    found = full_leaks(dump)
    if found is None or found[0].size == 0:
        return []
    leaked, counts = found
    page = _page(dump)
    none = np.full(leaked.size, -1, dtype=np.int64)
    cells = CellColumns(batch_row=none, pool_row=none, position=none, slot=leaked, extra={})
    first = int(leaked[0])
    what = _pages_text(leaked, page)
    message = (
        f"full slot {first} is neither free, nor held by the radix tree, nor by a running "
        "request: leaked"
        if leaked.size == 1
        else f"{leaked.size} full slots ({what}) are neither free, nor held by the radix "
        "tree, nor by a running request: leaked"
    )
    details: dict[str, object] = {"page_size": page, "kvcanary_counts": counts}
    printed = printed_counts(dump, "full")
    if printed is not None:
        details["sglang_counts"] = printed
    return [
        Finding(
            code=FindingCode.FULL_PAGE_LEAKED,
            group=Group.FULL,
            space=Space.FULL,
            message=message,
            slot=first,
            details=cast(dict[str, JsonValue], details),
            cells=cells,
        )
    ]


def held_findings(dump: KvDump) -> list[Finding]:
    """Full slots freed or handed out again while an owner no live-cell detector reads holds
    them: `FULL_SLOT_FREE_AND_HELD` (on the free list, yet in the allocated cells of a running
    request outside the batch, `req_pool_allocated_lens`, or with the tree's record a slot
    the tree holds and no running request) and `FULL_SLOT_HELD_TWICE` (a slot the tree does
    not hold in two running requests' cells, or twice in one, one outside the batch).

    A batch row's live cells are the live-cell detectors' (`FREED_SLOT_IN_LIVE_RANGE`,
    `SLOT_SHARED_ACROSS_POSITIONS`); a running request between batches holds its cells as
    much, and a slot freed under it (or under the tree) is handed to another owner by the
    next allocation, a step or more before anyone reads it again.

    The running cells are read a chunk of rows at a time (`_running_cells`), whatever the
    lengths claim: what is held at once is a chunk, the slots the tree does not hold (one
    narrow copy, to find those held twice) and the cells found."""
    free, tree = dump.free_full_slots, dump.tree_full_slots
    freed_known = runs(dump, FULL_FREE_LIST) and free is not None
    free_set = SlotSet(np.asarray(free if free is not None else [], dtype=np.int64))
    with_tree = runs(dump, FULL_LEAKS) and tree is not None
    tree_slots = distinct(np.asarray(tree if tree is not None else [], dtype=np.int64))
    tree_set = SlotSet(tree_slots)
    free_tree = (
        tree_slots[(tree_slots > 0) & free_set.contains(tree_slots)]
        if freed_known and with_tree
        else np.zeros(0, dtype=np.int64)
    )
    found: list[Finding] = []
    running = _running_rows(dump)
    batch = np.asarray(dump.req_pool_indices, dtype=np.int64).reshape(-1)
    if running is not None and not np.isin(running[0], batch).all():

        def chunks() -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
            for rows, position, slots in _running_cells(dump, *running):
                yield rows, position, slots, ~np.isin(rows, batch)

        freed: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        untracked: list[tuple[np.ndarray, np.ndarray]] = []  # (slots, outside the batch)
        running_free_tree = np.zeros(free_tree.size, dtype=bool)
        for rows, position, slots, outside in chunks():
            real = slots > 0
            if freed_known:
                hit = outside & real & free_set.contains(slots)
                freed.append((rows[hit], position[hit], slots[hit]))
            if with_tree:
                mine = real & ~tree_set.contains(slots)
                untracked.append((_narrow(slots[mine]), outside[mine]))
            if free_tree.size:  # a running row's: reported with the running cells
                running_free_tree |= np.isin(free_tree, slots)
        free_tree = free_tree[~running_free_tree]
        if freed:
            found += _held_cells(
                FindingCode.FULL_SLOT_FREE_AND_HELD,
                *_joined(freed),
                "is on the free list, yet a running request outside the batch holds it: "
                "freed while in use",
            )
        if untracked:
            held = np.concatenate([part[0] for part in untracked])
            apart = np.concatenate([part[1] for part in untracked])
            twice = held_twice(held)
            # only slots one of whose holders is outside the batch (else the live cells' own)
            involved = SlotSet(distinct(held[twice & apart].astype(np.int64)))
            del held, apart, twice, untracked
            if involved.slots.size:
                cells = [
                    (rows[hit], position[hit], slots[hit])
                    for rows, position, slots, _ in chunks()
                    for hit in [(slots > 0) & involved.contains(slots)]
                ]
                found += _held_cells(
                    FindingCode.FULL_SLOT_HELD_TWICE,
                    *_joined(cells),
                    "is held by two running requests (or twice by one), one outside the batch, "
                    "and the tree does not hold it: handed out twice",
                )
    none = np.full(free_tree.size, -1, dtype=np.int64)
    found += _held_cells(
        FindingCode.FULL_SLOT_FREE_AND_HELD,
        none,
        none,
        free_tree,
        "is on the free list, yet the radix tree holds it: freed while cached",
    )
    return found


#: Running cells read at a time (`_running_cells`), and the rows looked ahead to fill them.
_RUNNING_CHUNK_CELLS = 1 << 20
_ROWS_AHEAD = 1 << 16


def _joined(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Chunks' (pool row, position, slot) columns, each joined into one."""
    rows, positions, slots = (np.concatenate(column) for column in zip(*parts, strict=True))
    return rows, positions, slots


def _narrow(slots: np.ndarray) -> np.ndarray:
    """Positive slots in the narrowest of int32 and int64 that holds them."""
    if slots.size and int(slots.max()) < (1 << 31):
        return slots.astype(np.int32)
    return slots.astype(np.int64)


def _running_rows(dump: KvDump) -> tuple[np.ndarray, np.ndarray] | None:
    """The pool rows of running requests (`req_pool_allocated_lens` above 0) and their
    allocated lengths, clipped to the table; None without that record or a whole table."""
    lens, table = dump.req_pool_allocated_lens, dump.req_to_token
    if lens is None or not table.complete or table.ndim != 2:
        return None
    count, width = (int(n) for n in table.shape)
    lens = np.clip(np.asarray(lens, dtype=np.int64).reshape(-1)[:count], 0, width)
    rows = np.flatnonzero(lens > 0)
    return rows, lens[rows]


def _running_cells(
    dump: KvDump, rows: np.ndarray, lens: np.ndarray
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The allocated cells of `rows` (`_running_rows`), a chunk of rows at a time: each
    cell's pool row, position and slot (int64). A chunk is the rows whose grid (rows x the
    longest) fits `_RUNNING_CHUNK_CELLS`, at least one: the memory is a chunk's, whatever the
    lengths claim (the leak checks and `held_findings` read every running cell)."""
    table = dump.req_to_token
    start = 0
    while start < rows.size:
        ahead = lens[start : start + _ROWS_AHEAD]
        grid_sizes = np.arange(1, ahead.size + 1) * np.maximum.accumulate(ahead)
        fits = int(np.searchsorted(grid_sizes, _RUNNING_CHUNK_CELLS, side="right"))
        stop = start + max(1, fits)
        chunk, lengths = rows[start:stop], lens[start:stop]
        grid, _ = table.rows(chunk, int(lengths.max()))
        at_row, position = np.nonzero(np.arange(grid.shape[1])[None, :] < lengths[:, None])
        yield chunk[at_row], position, np.asarray(grid, dtype=np.int64)[at_row, position]
        start = stop


def _held_cells(
    code: FindingCode, pool_row: np.ndarray, position: np.ndarray, slots: np.ndarray, what: str
) -> list[Finding]:
    """One finding of held cells (pool row, position, slot; -1: the tree's, no cell), if any."""
    if slots.size == 0:
        return []
    first = int(slots[0])
    where = f" (pool row {int(pool_row[0])})" if pool_row[0] >= 0 else ""
    message = (
        f"full slot {first}{where} {what}"
        if slots.size == 1
        else f"{slots.size} full slots each {what}"
    )
    rows = [int(r) for r in distinct(pool_row[pool_row >= 0])[:16]]
    return [
        Finding(
            code=code,
            group=Group.FULL,
            space=Space.FULL,
            message=message,
            slot=first,
            pool_row=int(pool_row[0]) if pool_row[0] >= 0 else None,
            position=int(position[0]) if position[0] >= 0 else None,
            details=cast(dict[str, JsonValue], {"rows": rows}),
            cells=CellColumns(
                batch_row=np.full(slots.size, -1, dtype=np.int64),
                pool_row=pool_row.astype(np.int64),
                position=position.astype(np.int64),
                slot=slots.astype(np.int64),
                extra={},
            ),
        )
    ]


def _difference(printed: dict[str, int]) -> int:
    accounted = sum(printed[name] for name in CHECK_COUNTS if name != "total")
    return printed["total"] - accounted


def reconciliation_notes(dump: KvDump) -> list[str]:
    """One note per pool SGLang printed counts for: its sum against kvcanary's counts of the
    same dump, and which pages make up the difference."""
    notes = []
    printed = printed_counts(dump, "full")
    if printed is not None:
        notes.append(_full_note(dump, printed))
    printed = printed_counts(dump, "swa")
    if printed is not None:
        notes.append(_swa_note(dump, printed))
    return notes


def _printed(pool: str, printed: dict[str, int]) -> str:
    listed = ", ".join(f"{name}={printed[name]}" for name in CHECK_COUNTS)
    return f"SGLang's memory check printed [{pool}] {listed}"


def _full_note(dump: KvDump, printed: dict[str, int]) -> str:
    missing = _difference(printed)
    head = f"{_printed('full', printed)}: {missing} slots unaccounted"
    found = full_leaks(dump)
    if found is None:
        return (
            f"{head}; this dump cannot name them (record tree_full_slots, "
            "req_pool_allocated_lens, free_full_slots and num_full_slots)"
        )
    leaked, counts = found
    held = printed["evictable"] + printed["protected"]
    twice = counts["listed_twice"]
    free_text = f"{counts['available']} free"
    if twice:
        listed_twice = repeated(np.asarray(dump.free_full_slots, dtype=np.int64))
        free_text += (
            f" ({counts['available'] + twice} entries on the free list: {twice} listed more "
            f"than once, {_pages_text(listed_twice, _page(dump))})"
        )
    parts = [
        f"kvcanary counts total {counts['total']}",
        f"{free_text} (SGLang: available {printed['available']})",
        f"{counts['tree']} in the tree (SGLang: evictable + protected {held})",
        f"{counts['uncached']} held by running requests only (SGLang: uncached "
        f"{printed['uncached']})",
    ]
    if leaked.size:
        parts.append(f"{leaked.size} leaked: {_pages_text(leaked, _page(dump))}")
    else:
        parts.append("none leaked")
    # SGLang counts the free list's entries: a slot listed twice counts twice
    expected = int(leaked.size) - twice
    if expected != missing:
        tail = (
            f"SGLang's difference is {missing}, kvcanary's {expected} (leaked less listed "
            "twice): the counts that differ above say which bookkeeping disagrees with its "
            "own lists"
        )
    elif twice:
        tail = (
            "the leaked slots less the slots listed twice are exactly the difference"
            if leaked.size
            else "the slots listed twice are exactly SGLang's excess: a double free"
        )
    else:
        tail = "the leaked slots are exactly the difference"
    return f"{head}; {'; '.join(parts)}; {tail}"


def _swa_note(dump: KvDump, printed: dict[str, int]) -> str:
    missing = _difference(printed)
    head = f"{_printed('swa', printed)}: {missing} slots unaccounted"
    leaked, reason = leaked_swa_pages(dump)
    if leaked is None:
        return f"{head}; this dump cannot name them ({reason or 'no SWA pool recorded'})"
    page = _page(dump)
    free = np.zeros(0, dtype=np.int64) if dump.free_swa_slots is None else dump.free_swa_slots
    listed = np.asarray(free, dtype=np.int64).reshape(-1)
    free_count = int(distinct(listed).size)
    twice = int(listed.size) - free_count
    slots = int(leaked.size) * page
    free_text = f"{free_count} SWA slots free"
    if twice:
        free_text += f" ({listed.size} entries: {twice} listed more than once)"
    parts = [f"kvcanary counts {free_text} (SGLang: available {printed['available']})"]
    parts.append(f"{slots} leaked: {_pages_text(leaked * page, page)}" if slots else "none leaked")
    expected = slots - twice
    if expected != missing:
        tail = f"SGLang's difference is {missing}, kvcanary's {expected} slots"
    elif twice:
        tail = "the leaked slots less the slots listed twice are exactly the difference"
    else:
        tail = "the leaked pages are exactly the difference"
    return f"{head}; {'; '.join(parts)}; {tail}"
