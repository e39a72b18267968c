"""Chains of causes: one fault, one story (docs/findings.md, "Chains").

A fault leaves symptoms that other causes would name on their own: the reserved page freed
twice is also a double free, a mapping cleared without its free also leaks a page, a freed
slot a request still reads also keeps its LUT entry. Once the diagnosis has claimed every
cell, `link` marks such a cause as explained by the one whose fault left it (`explained_by`),
gives the parent one "also shows" line per cause it explains (codes, counts, where), and
orders the causes: the top-level ones in rank order, each followed by those it explains.
Only a cause whose every finding the parent's fault accounts for is absorbed; the rest stay
top-level, for the cells nothing else explains.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from kvcanary_cli.analysis.cells import cell_slots, distinct, span
from kvcanary_cli.analysis.provenance import live_cells
from kvcanary_cli.catalog import CauseCode, Confidence, FindingCode, cell_unit
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.results.cells import Space
from kvcanary_cli.results.check import Cause, Finding

__all__ = ["counted", "link", "numbers", "span"]

#: Causes the reserved page explains when every slot they name lies on it: what page 0 on a
#: free list leads to (listed twice, handed out, mapped from live or stale full slots).
_RESERVED_SYMPTOMS = frozenset(
    {
        CauseCode.DOUBLE_FREE,
        CauseCode.STALE_SWA_MAPPING,
        CauseCode.SWA_SHARED_OWNER,
        CauseCode.SWA_FREED_WHILE_LIVE,
        CauseCode.SWA_MAPPING_REWRITTEN,
        CauseCode.SWA_MAPPING_COLLISION,
        CauseCode.SWA_WRITE_INTO_LIVE_SLOT,
        CauseCode.PARTIAL_PAGE_FREE,
    }
)
#: Causes whose fault drops or replaces an SWA mapping without freeing the page it held: a
#: leak of no more pages than they concern is theirs (in this order of preference).
_LEAVES_LEAKS = (
    CauseCode.SWA_BOUNDARY_PAGE_CLEARED,
    CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW,
    CauseCode.SWA_FREED_WHILE_LIVE,
    CauseCode.SWA_PAGE_REISSUED,
    CauseCode.SWA_WRITE_INTO_LIVE_SLOT,
    CauseCode.SWA_MAPPING_COLLISION,
    CauseCode.SWA_SHARED_OWNER,
    CauseCode.SWA_MAPPING_REWRITTEN,
)

#: Causes whose every cell lies on the pages of another cause's fault (a cell's full or SWA
#: page among the parent's, the reserved page 0 not counted): (parent, child, why). The
#: mechanism is the parent, the state it left the child; a child that is a parent itself
#: takes its own children along. Tried in this order: a parent already explained hands its
#: children to its own parent.
_NESTED = (
    (
        CauseCode.RESERVED_SLOT_FREED,
        CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW,
        "a full page mapped into the reserved SWA page: its token at SWA slot 0 reads as unmapped",
    ),
    (
        CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW,
        CauseCode.SWA_PAGE_REISSUED,
        "the clear took part of a full page and released its SWA page whole, which was handed "
        "out again while the page's other tokens still map into it",
    ),
    (
        CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW,
        CauseCode.SWA_SHARED_OWNER,
        "the clear took part of a full page and released its SWA page whole: the page's other "
        "tokens still map into it, now another owner's",
    ),
    (
        CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW,
        CauseCode.SWA_MAPPING_COLLISION,
        "the clear took part of a full page and released its SWA page whole: the page's other "
        "tokens still map into it, now another live request's",
    ),
    (
        CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW,
        CauseCode.STALE_SWA_MAPPING,
        "the clear took part of a full page and released its SWA page whole: the page's other "
        "tokens still map into it",
    ),
    (
        CauseCode.SWA_PAGE_REISSUED,
        CauseCode.SWA_MAPPING_COLLISION,
        "the old page's entries still in a live window map into the reissued SWA page too",
    ),
    (
        CauseCode.SWA_PAGE_REISSUED,
        CauseCode.PARTIAL_PAGE_FREE,
        "the partial-page free that released the SWA page whole",
    ),
    (
        CauseCode.SWA_PAGE_REISSUED,
        CauseCode.STALE_SWA_MAPPING,
        "the old page's entries into the reissued SWA page",
    ),
    (
        CauseCode.SWA_PAGE_REISSUED,
        CauseCode.DOUBLE_FREE,
        "the reissued SWA page freed again through the old page's stale entries",
    ),
    (
        CauseCode.PARTIAL_PAGE_FREE,
        CauseCode.DOUBLE_FREE,
        "the SWA page the partial-page free released whole, freed again through the tokens "
        "it left mapped",
    ),
    (
        CauseCode.PARTIAL_PAGE_FREE,
        CauseCode.STALE_SWA_MAPPING,
        "the tokens the partial-page free left mapped",
    ),
    (
        CauseCode.PARTIAL_PAGE_FREE,
        CauseCode.SWA_SHARED_OWNER,
        "the tokens the partial-page free left mapped into an SWA page now another owner's",
    ),
    (
        CauseCode.PARTIAL_PAGE_FREE,
        CauseCode.SWA_MAPPING_COLLISION,
        "the tokens the partial-page free left mapped into an SWA page now another live request's",
    ),
    (
        CauseCode.SWA_FREED_WHILE_LIVE,
        CauseCode.DOUBLE_FREE,
        "the live SWA pages on the free list, listed twice",
    ),
    (
        CauseCode.VIRTUAL_PAGE_FREED_WHILE_BOUND,
        CauseCode.USE_AFTER_FREE,
        "the virtual ids recycled without their unbind, which their holders keep",
    ),
    (
        CauseCode.PHYSICAL_PAGE_DOUBLE_FREE,
        CauseCode.SWA_BOUNDARY_PAGE_CLEARED,
        "the page bound to physical page -1 translates to no SWA slot",
    ),
    (
        CauseCode.PHYSICAL_PAGE_DOUBLE_FREE,
        CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW,
        "the page bound to physical page -1 translates to no SWA slot",
    ),
)
#: A write into SWA slots a request holds, when the request's other live SWA pages are on the
#: free list: the free released them all, and this step's allocation took one back.
_FREED_WRITE = (
    CauseCode.SWA_FREED_WHILE_LIVE,
    CauseCode.SWA_WRITE_INTO_LIVE_SLOT,
    "the same request's live SWA pages were freed; this step's allocation handed one to the write",
)


def _plural(n: int, one: str, many: str | None = None) -> str:
    return one if n == 1 else (many or one + "s")


def _slots_phrase(space: str, values: np.ndarray) -> str:
    count = distinct(values).size
    return f"{space} {_plural(count, 'slot')} {span(values)}"


def _full_of(f: Finding) -> np.ndarray | None:
    """The full slot of each cell of a finding (its slot in the full space, else its
    `full_slot` column), None where it has none."""
    if f.cells is None:
        return None if f.slot is None or f.space is not Space.FULL else np.array([f.slot])
    if f.space is Space.FULL and f.cells.slot is not None:
        return f.cells.slot
    return f.cells.extra.get("full_slot")


def _swa_of(f: Finding) -> np.ndarray | None:
    """The SWA slot of each cell (its slot in the SWA space, else its `swa_slot` column)."""
    if f.cells is None:
        return None if f.slot is None or f.space is not Space.SWA else np.array([f.slot])
    if f.space is Space.SWA and f.cells.slot is not None:
        return f.cells.slot
    return f.cells.extra.get("swa_slot")


def numbers(f: Finding) -> str:
    """Where a finding's cells are, in numbers: `full slots 36..39 -> SWA slots 20..23;
    batch row 1 (pool row 3), positions 30..33` (empty for a row- or tensor-level one)."""
    if f.cells is None or len(f.cells) == 0:
        return ""
    bits = []
    full, swa = _full_of(f), _swa_of(f)
    if full is not None and swa is not None:
        bits.append(f"{_slots_phrase('full', full)} -> {_slots_phrase('SWA', swa)}")
    elif full is not None:
        bits.append(_slots_phrase("full", full))
    elif swa is not None:
        bits.append(_slots_phrase("SWA", swa))
    if "page" in f.cells.extra:
        pages = f.cells.extra["page"]
        bits[-1:] = [f"SWA {_plural(distinct(pages).size, 'page')} {span(pages)}"]
    rows = f.cells.batch_row
    inside = rows >= 0
    if inside.any():
        b, r = rows[inside], f.cells.pool_row[inside]
        where = (
            f"batch {_plural(distinct(b).size, 'row')} {span(b)} "
            f"(pool {_plural(distinct(r).size, 'row')} {span(r)})"
        )
        q = f.cells.position[inside]
        bits.append(f"{where}, {_plural(distinct(q).size, 'position')} {span(q)}")
    return "; ".join(bits)


def _touches_page_zero(f: Finding, page: int) -> bool:
    """Every cell names a slot of the reserved page 0 (in any of its slot columns)."""
    columns = [c for c in (_full_of(f), _swa_of(f)) if c is not None]
    if f.cells is not None and f.cells.slot is not None:
        columns.append(f.cells.slot)
    if not columns:
        return False
    hit = np.zeros(len(columns[0]), dtype=bool)
    for c in columns:
        hit |= (c >= 0) & (c < page)
    return bool(hit.all())


def _full_pages(fs: list[Finding], page: int) -> int:
    """Distinct full pages the findings' cells name (their full slots)."""
    parts = [v // page for v in (_full_of(f) for f in fs) if v is not None and v.size]
    return int(distinct(np.concatenate(parts)).size) if parts else 0


def _swa_pages(fs: list[Finding], page: int) -> int:
    parts = [v // page for v in (_swa_of(f) for f in fs) if v is not None and v.size]
    return int(distinct(np.concatenate(parts)).size) if parts else 0


def _pages_of(fs: list[Finding], page: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct full and SWA pages the findings' cells name, page 0 left out."""
    out = []
    for of in (_full_of, _swa_of):
        parts = [v // page for v in (of(f) for f in fs) if v is not None and v.size]
        pages = distinct(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
        out.append(pages[pages > 0])
    return out[0], out[1]


def _on_pages(fs: list[Finding], page: int, full: np.ndarray, swa: np.ndarray) -> bool:
    """Every cell of the findings names a full page in `full` or an SWA page in `swa`."""
    for f in fs:
        if f.cells is None or len(f.cells) == 0:
            return False
        inside = np.zeros(len(f.cells), dtype=bool)
        for of, pages in ((_full_of, full), (_swa_of, swa)):
            values = of(f)
            if values is not None and pages.size:
                inside |= np.isin(values // page, pages)
        if not inside.all():
            return False
    return True


def _holding_rows(dump: KvDump, swa_slots: np.ndarray) -> np.ndarray:
    """Pool rows whose live prefix cells (not this step's writes) map into `swa_slots`."""
    lut = dump.full_to_swa_index_mapping
    if lut is None or swa_slots.size == 0:
        return np.zeros(0, dtype=np.int64)
    cells = live_cells(dump)
    slots = cells.slot
    keys = int(lut.shape[0]) - 1
    inside = (slots > 0) & (slots < keys) & ~cells.pending
    mapped = np.zeros(slots.shape, dtype=np.int64)
    mapped[inside] = lut.take_known(slots[inside])[0]
    return distinct(cells.pool_row[inside & np.isin(mapped, swa_slots)])


def _swa_table_short(dump: KvDump, page: int, fs: list[Finding]) -> bool:
    """`swa_virtual_to_physical` sized by another id space (the SWA group's size finding
    among `fs`) and the LUT as long as it stands for: `(entries - 1) x page + 1`."""
    table = dump.page_tables.get("swa_virtual_to_physical")
    sized = any(f.code is FindingCode.PAGE_TABLE_SIZE_MISMATCH and f.group == "swa" for f in fs)
    return sized and table is not None and dump.lut_len == (int(table.size) - 1) * page + 1


def _rows_of(fs: list[Finding]) -> np.ndarray:
    parts = [f.cells.pool_row for f in fs if f.cells is not None]
    return distinct(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def _where(fs: list[Finding]) -> str:
    return "; ".join(dict.fromkeys(n for n in (numbers(f) for f in fs[:2]) if n))


def counted(explains: dict[FindingCode, int]) -> str:
    """`2 free-list-duplicate entries, 1 swa-page-leaked page`: counts in their units."""
    return ", ".join(
        f"{n} {code} {cell_unit(FindingCode(code), n)}" for code, n in explains.items()
    )


def link(dump: KvDump, findings: list[Finding], causes: list[Cause]) -> tuple[Cause, ...]:
    """The causes with their chains set (see the module's docstring), parents first."""
    page = max(1, dump.scalars["page_size"].value or 1)
    members: dict[CauseCode, list[Finding]] = {}
    for f in findings:
        if f.cause is not None:
            members.setdefault(f.cause, []).append(f)
    present = {c.code for c in causes if c.confidence is not Confidence.POSSIBLE}
    parent: dict[CauseCode, CauseCode] = {}
    why: dict[CauseCode, str] = {}

    def root(code: CauseCode) -> CauseCode:
        while code in parent:
            code = parent[code]
        return code

    def absorb(child: CauseCode, by: CauseCode, reason: str) -> None:
        if child in present and child not in parent and root(by) != child:
            parent[child] = by
            why[child] = reason

    # the reserved page first: what page 0 on a free list leads to is the reserved page's
    if CauseCode.RESERVED_SLOT_FREED in present:
        for code in _RESERVED_SYMPTOMS:
            fs = members.get(code, [])
            if fs and all(_touches_page_zero(f, page) for f in fs):
                absorb(code, CauseCode.RESERVED_SLOT_FREED, "every slot it names is on page 0")
    # a live slot put on the free list keeps its LUT entry: the free is the fault
    freed = [f for f in members.get(CauseCode.USE_AFTER_FREE, []) if f.space is Space.FULL]
    stale = members.get(CauseCode.STALE_SWA_MAPPING, [])
    if freed and stale:
        live = np.concatenate([cell_slots(f) for f in freed])
        mapped = [_full_of(f) for f in stale]
        if all(v is not None and np.isin(v, live).all() for v in mapped):
            absorb(
                CauseCode.STALE_SWA_MAPPING,
                CauseCode.USE_AFTER_FREE,
                "its full slots are live slots on the free list, still mapped because a "
                "request still holds them",
            )
    # a cause whose every cell lies on the pages of another's fault is that fault's
    for by, child, reason in _NESTED:
        fs = members.get(child, [])
        if by in present and fs and child not in parent:
            full, swa = _pages_of(members.get(by, []), page)
            if _on_pages(fs, page, full, swa):
                absorb(child, by, reason)
    by, child, reason = _FREED_WRITE
    fs = members.get(child, [])
    if by in present and fs and child not in parent:
        written = [v for v in (_swa_of(f) for f in fs) if v is not None]
        holders = _holding_rows(dump, np.concatenate(written)) if written else written
        if len(holders) and np.isin(holders, _rows_of(members.get(by, []))).all():
            absorb(child, by, reason)
    # unified memory keeps no LUT: capture reads it from the SWA side's virtual table, so a
    # LUT as short as that table is the table sized by another id space
    if CauseCode.LUT_TOO_SHORT in present and _swa_table_short(
        dump, page, members.get(CauseCode.PAGE_TABLE_CORRUPT, [])
    ):
        absorb(
            CauseCode.LUT_TOO_SHORT,
            CauseCode.PAGE_TABLE_CORRUPT,
            "the LUT is swa_virtual_to_physical read slot by slot, as short as that table",
        )
    # a mapping dropped or replaced without its free leaks the page it held
    leaks = members.get(CauseCode.SWA_LEAK, [])
    if leaks:
        leaked = _swa_pages(leaks, page)
        for code in _LEAVES_LEAKS:
            fs = members.get(code, [])
            if fs and code not in parent and leaked <= max(_full_pages(fs, page), 1):
                absorb(
                    CauseCode.SWA_LEAK,
                    code,
                    "the SWA pages its mappings held, dropped without a free",
                )
                break
    if not parent:
        return tuple(causes)
    by_code = {c.code: c for c in causes}
    out: list[Cause] = []
    for c in causes:
        if c.code in parent:
            continue
        children = [by_code[k] for k in parent if root(k) is c.code]
        children.sort(key=causes.index)
        lines = tuple(
            f"also shows {counted(k.explains)} ({k.code.value}: {why[k.code]})"
            + (f": {where}" if (where := _where(members.get(k.code, []))) else "")
            for k in children
        )
        nests = tuple(k.code for k in children)
        out.append(replace(c, also_shows=c.also_shows + lines, nests=c.nests + nests))
        out.extend(replace(k, explained_by=c.code) for k in children)
    return tuple(out)
