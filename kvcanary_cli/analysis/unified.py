"""The unified-memory layout's page tables (SGLang 0.5.23's `UnifiedSWATokenToKVPoolAllocator`,
`allocator/unified_sub_pool.py`'s `MultiEndedAllocator`): what the paged layout's checks cannot
see there.

`req_to_token`, the tree and the free list hold *virtual* ids, minted by the full side over
its `num_virtual_ids` pages; each side binds a virtual page to one physical page of its own
(`virtual_to_physical`, −1 unbound) and keeps the reverse (`physical_to_virtual`); entry 0 is
the padding sink (0 ↔ 0) and each table ends with a −1 sentinel. The SWA side addresses the
full side's whole id space (`virtual_num_pages`), binds only pages the full side holds, and its
virtual→physical table is the LUT capture records. In a correct state:

- per side the tables agree: `p2v[v2p[v]] == v` for every bound page, and a physical page
  named by `p2v` is bound back (a virtual page bound to two physical pages breaks it);
- no physical page is behind two virtual pages;
- a page on the virtual free list is unbound on the full side (`free` unbinds before it
  recycles the id); a page the tree or a running request holds, or one the SWA side binds, is
  bound on the full side;
- both sides' virtual tables are sized by the full side's id space, and so is the dump's
  `num_full_slots`;
- each table ends with its −1 sentinel, and each side's lazy-compaction free list
  (`physical_holes`) holds physical pages of that side (`1 .. num_pages − 1`), each once, none
  bound: a −1 there is a page released twice (its tombstone freed as a page), which SGLang's
  own span check balances, and a −1 taken off it and bound overwrites the `p2v` sentinel.

Leaks, double frees and live slots on the free list are the paged checks' (the virtual free
list is the dump's `free_full_slots`). Each check is a few array operations over the tables.
"""

from __future__ import annotations

import numpy as np

from kvcanary_cli.analysis.bookkeeping import _slot_cells, _slot_finding, recorded_held_slots
from kvcanary_cli.analysis.cells import span
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import Group, Layout
from kvcanary_cli.dump.tensor import distinct, union
from kvcanary_cli.results.cells import Space
from kvcanary_cli.results.check import Finding

__all__ = ["unified_findings"]

_SIDES = ((Group.FULL, Space.FULL), (Group.SWA, Space.SWA))


def unified_findings(dump: KvDump) -> list[Finding]:
    """Every page-table finding of a unified-layout dump (none for another layout, or a
    dump without the tables)."""
    if dump.layout != Layout.UNIFIED_SWA:
        return []
    page = max(1, dump.scalars["page_size"].value or 1)
    tables = dump.page_tables
    full = tables.get("full_virtual_to_physical")
    found = _sizes(dump, page, full, tables.get("swa_virtual_to_physical"))
    for group, space in _SIDES:
        v2p = tables.get(f"{group}_virtual_to_physical")
        p2v = tables.get(f"{group}_physical_to_virtual")
        if v2p is not None and p2v is not None and v2p.size > 1 and p2v.size > 1:
            found += _disagreements(group, space, v2p, p2v, page)
        found += _sentinels(group, v2p, p2v, page)
        holes = tables.get(f"{group}_physical_holes")
        if holes is not None and holes.size and p2v is not None and p2v.size > 1:
            found += _holes(group, np.asarray(holes, dtype=np.int64), p2v)
    if full is not None and full.size > 1:
        found += _binding(dump, page, full, tables.get("swa_virtual_to_physical"))
    return found


def _sizes(
    dump: KvDump, page: int, full: np.ndarray | None, swa: np.ndarray | None
) -> list[Finding]:
    """`PAGE_TABLE_SIZE_MISMATCH`: a table (or `num_full_slots`) sized by another id space than
    the full side's virtual pages (SGLang #37560: the SWA table sized by its own pool)."""
    if full is None:
        return []
    pages = int(full.size) - 1
    wrong: list[tuple[str, int]] = []
    if swa is not None and swa.size != full.size:
        wrong.append(("swa_virtual_to_physical", int(swa.size) - 1))
    recorded = dump.scalars["num_full_slots"]
    if (
        recorded.value is not None
        and recorded.origin == "recorded"
        and recorded.value != (pages * page)
    ):
        wrong.append(("num_full_slots", recorded.value // page))
    return [
        Finding(
            code=FindingCode.PAGE_TABLE_SIZE_MISMATCH,
            group=Group.SWA if name.startswith("swa") else Group.FULL,
            message=(
                f"{name} addresses {size} virtual pages, the full side mints {pages}: a "
                "table sized by another id space reads past its end or leaves ids unaddressed"
            ),
            details={"tensor": name, "virtual_pages": size, "full_virtual_pages": pages},
        )
        for name, size in wrong
    ]


def _disagreements(
    group: Group, space: Space, v2p: np.ndarray, p2v: np.ndarray, page: int
) -> list[Finding]:
    """`PAGE_TABLE_MISMATCH` (v2p and p2v disagree) and `PHYSICAL_PAGE_SHARED` (one physical
    page behind two virtual pages) on one side, one cell per virtual page (its first slot)."""
    found: list[Finding] = []
    virtual_pages, physical_pages = int(v2p.size) - 1, int(p2v.size) - 1
    v = np.arange(1, virtual_pages, dtype=np.int64)
    p = v2p[1:virtual_pages].astype(np.int64)
    bound = p >= 0
    v, p = v[bound], p[bound]
    inside = (p > 0) & (p < physical_pages)
    back = np.full(p.size, -2, dtype=np.int64)
    back[inside] = p2v[p[inside]]
    forward_bad = back != v
    # the reverse: a physical page naming a virtual page that is not bound back to it
    q = np.arange(1, physical_pages, dtype=np.int64)
    named = p2v[1:physical_pages].astype(np.int64)
    q, named = q[named >= 0], named[named >= 0]
    ok = (named > 0) & (named < virtual_pages)
    there = np.full(named.size, -2, dtype=np.int64)
    there[ok] = v2p[named[ok]]
    reverse_bad = there != q
    bad_v = union(v[forward_bad], named[reverse_bad & (named > 0)])
    if bad_v.size:
        phys = np.where(
            (bad_v > 0) & (bad_v < virtual_pages), v2p[np.clip(bad_v, 0, virtual_pages)], -2
        )
        found.append(
            _slot_finding(
                FindingCode.PAGE_TABLE_MISMATCH,
                group,
                Space.FULL,
                _slot_cells(bad_v * page, {"physical_page": phys}),
                f"{group} side: virtual slot {{slot}}'s page and its physical page disagree "
                "(virtual_to_physical and physical_to_virtual do not name each other)",
                f"{group} side: virtual pages whose virtual_to_physical and "
                "physical_to_virtual entries do not name each other",
                {"side": str(group), "page_size": page},
            )
        )
    shared_p = p[p > 0]
    order = np.sort(shared_p)
    twice = distinct(order[1:][order[1:] == order[:-1]])
    if twice.size:
        owners = v[(p > 0) & np.isin(p, twice)]
        # two owners or more, always: the message names them and the pages they share
        shared = (
            f"{group} side: virtual slots {span(owners * page)} share physical "
            f"page{'s' if twice.size > 1 else ''} {span(twice)} (a physical page bound to two "
            "virtual pages at once): two owners read and write the same KV"
        )
        found.append(
            _slot_finding(
                FindingCode.PHYSICAL_PAGE_SHARED,
                group,
                space,
                _slot_cells(owners * page, {"physical_page": v2p[owners]}),
                shared,
                shared,
                {
                    "side": str(group),
                    "page_size": page,
                    "physical_pages": [int(x) for x in twice[:8]],
                },
            )
        )
    return found


def _sentinels(
    group: Group, v2p: np.ndarray | None, p2v: np.ndarray | None, page: int
) -> list[Finding]:
    """`PAGE_TABLE_SENTINEL_OVERWRITTEN`: a table whose trailing −1 is gone (an id −1 used as a
    page). For `p2v` naming a virtual page, that page's first slot is the cell: a −1 taken off
    the free list and bound to it, so it reads unbound while its owner holds it."""
    found: list[Finding] = []
    for name, table in (("virtual_to_physical", v2p), ("physical_to_virtual", p2v)):
        if table is None or not table.size or int(table[-1]) == -1:
            continue
        tensor, value = f"{group}_{name}", int(table[-1])
        pages = -1 if v2p is None else int(v2p.size) - 1
        if name == "physical_to_virtual" and 0 < value < pages:
            found.append(
                _slot_finding(
                    FindingCode.PAGE_TABLE_SENTINEL_OVERWRITTEN,
                    group,
                    Space.FULL,
                    _slot_cells(np.array([value * page]), {"physical_page": np.array([-1])}),
                    f"virtual slot {{slot}}'s page is bound to physical page -1 on the {group} "
                    f"side ({tensor} ends with {value}, not its -1 sentinel): a -1 freed onto "
                    "the physical free list, then handed out; the page reads as unbound",
                    "",
                    {"tensor": tensor, "value": value, "page_size": page},
                )
            )
            continue
        bound = (
            f"virtual page {value} is bound to physical page -1"
            if name == "physical_to_virtual"
            else f"virtual page -1 is bound to physical page {value}"
        )
        found.append(
            Finding(
                code=FindingCode.PAGE_TABLE_SENTINEL_OVERWRITTEN,
                group=group,
                message=(
                    f"{tensor} ends with {value}, not its -1 sentinel: {bound} (an id -1 used "
                    "as a page)"
                ),
                details={"tensor": tensor, "value": value},
            )
        )
    return found


def _holes(group: Group, holes: np.ndarray, p2v: np.ndarray) -> list[Finding]:
    """`PHYSICAL_HOLE_INVALID`: a side's lazy-compaction free list naming no free physical
    page of the side: out of range (−1: a tombstone freed again), twice, or still bound."""
    pages = int(p2v.size) - 1  # the physical pages, less the sentinel row
    inside = (holes > 0) & (holes < pages)
    outside = distinct(holes[~inside])
    listed = np.sort(holes[inside])
    twice = distinct(listed[1:][listed[1:] == listed[:-1]])
    bound = distinct(listed[p2v[listed] >= 0])
    if not (outside.size or twice.size or bound.size):
        return []
    what = [
        f"{label} {', '.join(str(int(x)) for x in values[:8])}"
        for label, values in (
            ("out of range:", outside),
            ("listed twice:", twice),
            ("still bound:", bound),
        )
        if values.size
    ]
    return [
        Finding(
            code=FindingCode.PHYSICAL_HOLE_INVALID,
            group=group,
            message=(
                f"{group}_physical_holes names no free physical page of the {group} side ("
                + "; ".join(what)
                + "): a page freed twice (a -1 is a tombstoned page freed again); the next "
                "allocations hand it out twice or bind a virtual page to physical page -1"
            ),
            details={
                "side": str(group),
                "out_of_range": [int(x) for x in outside[:8]],
                "listed_twice": [int(x) for x in twice[:8]],
                "bound": [int(x) for x in bound[:8]],
            },
        )
    ]


def _binding(dump: KvDump, page: int, full: np.ndarray, swa: np.ndarray | None) -> list[Finding]:
    """`VIRTUAL_PAGE_FREE_AND_BOUND` (a free virtual page still bound on the full side) and
    `VIRTUAL_PAGE_UNBOUND` (a held page, or one the SWA side binds, unbound on the full
    side)."""
    found: list[Finding] = []
    pages = int(full.size) - 1

    def bound(virtual: np.ndarray) -> np.ndarray:
        inside = (virtual > 0) & (virtual < pages)
        out = np.zeros(virtual.size, dtype=bool)
        out[inside] = full[virtual[inside]] >= 0
        return out

    free = dump.free_full_slots
    if free is not None and free.size:
        listed = np.unique(np.asarray(free, dtype=np.int64) // page)
        listed = listed[(listed > 0) & (listed < pages)]
        still = listed[bound(listed)]
        if still.size:
            found.append(
                _slot_finding(
                    FindingCode.VIRTUAL_PAGE_FREE_AND_BOUND,
                    Group.FULL,
                    Space.FULL,
                    _slot_cells(still * page, {"physical_page": full[still]}),
                    "virtual slot {slot} is on the virtual free list while its page is still "
                    "bound on the full side: its owner keeps it, the next allocation takes it",
                    "virtual pages on the virtual free list while still bound on the full side: "
                    "their owners keep them, the next allocations take them",
                    {"page_size": page},
                )
            )
    held = recorded_held_slots(dump)
    if held is None and dump.tree_full_slots is not None:
        held = np.asarray(dump.tree_full_slots, dtype=np.int64)
    wanted = [] if held is None else [distinct(held // page)]
    if swa is not None and swa.size == full.size:
        wanted.append(np.flatnonzero(swa[:-1] > 0).astype(np.int64))
    if wanted:
        need = distinct(np.concatenate(wanted))
        need = need[(need > 0) & (need < pages)]
        loose = need[~bound(need)]
        if loose.size:
            found.append(
                _slot_finding(
                    FindingCode.VIRTUAL_PAGE_UNBOUND,
                    Group.FULL,
                    Space.FULL,
                    _slot_cells(loose * page),
                    "virtual slot {slot} is held (by the tree, a running request or the SWA "
                    "side) but its page is unbound on the full side: it translates to no KV",
                    "virtual pages held (by the tree, a running request or the SWA side) but "
                    "unbound on the full side: they translate to no KV",
                    {"page_size": page},
                )
            )
    return found
