"""Full-pool leaks, and the reconciliation of a dump with the counts SGLang's memory check
printed (`pool memory leak detected! [full] total=..., available=..., evictable=...,
protected=..., session_held=..., uncached=...`).

SGLang's check is a sum: `available + evictable + protected + session_held + uncached ==
total`. It says how many slots are missing, never which. A dump that records what the tree
holds (`tree_full_slots`, `tree_swa_resident_slots`) and what each running request has
allocated (`req_pool_allocated_lens`) names them: a full slot of the pool that is not free,
not the tree's and not inside a running request's allocated cells is leaked
(`FULL_PAGE_LEAKED`). The capture hook's leak trigger records SGLang's printed counts as
`sglang.check.<pool>.<count>`; `reconciliation_notes` sets them against kvcanary's own
counts of the same state and says which pages make up the difference.

Work is a few boolean arrays of the pool's size and one gather of the running rows'
allocated cells: no loop per slot.
"""

from __future__ import annotations

from typing import cast

import numpy as np

from kvcanary_cli.analysis.bookkeeping import leaked_swa_pages
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.dump.tensor import distinct
from kvcanary_cli.results.cells import CellColumns, Space
from kvcanary_cli.results.check import Finding, JsonValue

__all__ = ["full_leaks", "pool_leak_findings", "printed_counts", "reconciliation_notes"]

_PREFIX = "sglang.check."
_FIELDS = ("total", "available", "evictable", "protected", "session_held", "uncached")
#: Pages named in a message or note (the finding's cells hold them all).
_SHOWN = 8


def printed_counts(dump: KvDump, pool: str) -> dict[str, int] | None:
    """The counts SGLang printed for `pool` (`full`, `swa`) at the trigger, or None."""
    counts = {}
    for name in _FIELDS:
        text = dump.metadata.get(f"{_PREFIX}{pool}.{name}")
        if text is None or not text.strip().isdigit() or len(text.strip()) > 18:
            return None
        counts[name] = int(text.strip())
    return counts


def _recorded(dump: KvDump, name: str) -> int | None:
    scalar = dump.scalars[name]
    return None if scalar.value is None or scalar.assumed else int(scalar.value)


def _page(dump: KvDump) -> int:
    return max(1, int(dump.scalars["page_size"].value or 1))


#: Table cells gathered per step when reading the running rows (bounds the memory).
_CHUNK_CELLS = 1 << 22


def _running_slots(dump: KvDump, size: int, page: int) -> np.ndarray:
    """Which slots of `[0, size)` the running requests hold: every page one of their
    allocated cells (`req_pool_allocated_lens`) lies in, whole (SGLang allocates pages; a
    row's last page is partly unwritten). A boolean array, filled a chunk of rows at a time,
    so the memory is the pool's, whatever the lengths claim."""
    pages = -(-size // page)
    held = np.zeros(pages, dtype=bool)
    lens = dump.req_pool_allocated_lens
    table = dump.req_to_token
    if lens is None:
        return held
    width = int(table.shape[1])
    lens = np.minimum(np.asarray(lens, dtype=np.int64).reshape(-1)[: int(table.shape[0])], width)
    rows = np.flatnonzero(lens > 0)
    per_step = max(1, _CHUNK_CELLS // max(width, 1))
    for start in range(0, rows.size, per_step):
        chunk = rows[start : start + per_step]
        lengths = lens[chunk]
        cols = np.arange(int(lengths.max()), dtype=np.int64)
        inside = cols[None, :] < lengths[:, None]
        flat = (chunk[:, None] * width + cols[None, :])[inside]
        values, known = table.take_known(flat)
        values = np.asarray(values, dtype=np.int64)[np.asarray(known, dtype=bool)]
        held[values[(values >= 0) & (values < size)] // page] = True
    return np.repeat(held, page)[:size]


def full_leaks(dump: KvDump) -> tuple[np.ndarray, dict[str, int]] | None:
    """(the leaked full slots, kvcanary's counts of the pool) when the dump records the tree,
    the running requests, the full free list and the pool size; None otherwise."""
    tree, free = dump.tree_full_slots, dump.free_full_slots
    size = _recorded(dump, "num_full_slots")
    if tree is None or free is None or dump.req_pool_allocated_lens is None or size is None:
        return None
    if dump.shrunk:
        return None
    page = _page(dump)
    bound = 4 * (int(np.asarray(free).size) + int(np.asarray(tree).size)) + (1 << 22)
    if size <= page or size > bound:
        return None
    free_slots = distinct(np.asarray(free, dtype=np.int64))
    tree_slots = distinct(np.asarray(tree, dtype=np.int64))

    def inside(values: np.ndarray) -> np.ndarray:
        return values[(values >= page) & (values < size)]

    accounted = np.zeros(size, dtype=bool)
    accounted[:page] = True  # the padding page
    accounted[inside(free_slots)] = True
    accounted[inside(tree_slots)] = True
    private = _running_slots(dump, size, page)
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


def _pages_text(slots: np.ndarray, page: int) -> str:
    pages = distinct(slots // page)
    shown = ", ".join(str(int(p)) for p in pages[:_SHOWN])
    more = f" and {pages.size - _SHOWN} more" if pages.size > _SHOWN else ""
    unit = "page" if page > 1 else "slot"
    return f"{unit}{'s' if pages.size != 1 else ''} {shown}{more}"


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


def _repeated(values: np.ndarray) -> np.ndarray:
    """The distinct values listed more than once (sorted)."""
    ordered = np.sort(values.reshape(-1))
    again = ordered[1:][ordered[1:] == ordered[:-1]]
    return distinct(again)


def _difference(printed: dict[str, int]) -> int:
    accounted = sum(printed[name] for name in _FIELDS if name != "total")
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
    listed = ", ".join(f"{name}={printed[name]}" for name in _FIELDS)
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
        repeated = _repeated(np.asarray(dump.free_full_slots, dtype=np.int64))
        free_text += (
            f" ({counts['available'] + twice} entries on the free list: {twice} listed more "
            f"than once, {_pages_text(repeated, _page(dump))})"
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
