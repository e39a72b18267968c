"""Diagnosis: from symptoms (findings) to causes (what to fix), ranked most likely first.

A finding is a symptom at one cell or row; a cause explains a group of them and names the fix
(docs/findings.md, "Diagnosis"). Row-level causes claim their rows' symptoms first (corrupt
batch metadata, a recycled row read through a too-long prefix); the LUT-versus-slot question
is decided from the recorded pool size when there is one, from the other evidence when there
is not; every other symptom maps to the cause its code names (`catalog.CAUSE_OF_FINDING`). When
the evidence does not decide, the losing cause is kept as `possible` instead of being dropped.
A cause's summary and fix are its catalog entry's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from kvcanary_cli.analysis.cells import (
    cell_slots,
    distinct,
    held_slots,
    pairs_among,
    pieces,
    restricted,
    span,
)
from kvcanary_cli.analysis.chains import link, numbers
from kvcanary_cli.analysis.provenance import live_cells
from kvcanary_cli.catalog import (
    CAUSE_OF_EXPLANATION,
    CAUSE_OF_FINDING,
    CAUSES,
    CauseCode,
    Confidence,
    FindingCode,
    ViolationRowCause,
)
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.tensor import fold_at
from kvcanary_cli.results.cells import FindingOwner, Role, Space
from kvcanary_cli.results.check import Cause, Finding
from kvcanary_cli.results.violations import CAUSES as EXPLANATION_CAUSES
from kvcanary_cli.safe_text import shell_path

__all__ = [
    "diagnose",
]

_BATCH_CODES = frozenset(
    {
        FindingCode.ROW_OUT_OF_RANGE,
        FindingCode.PREFIX_BEYOND_ROW,
        FindingCode.DUPLICATE_REQUEST_ROW,
        FindingCode.NEGATIVE_LENGTH,
        FindingCode.VERIFY_TOTAL_IMPLAUSIBLE,
    }
)
#: symptoms a stale tail leaves in a live prefix: slots freed since, reused elsewhere, never
#: written, or repeated within the row.
_STALE_CODES = frozenset(
    {
        FindingCode.FREED_SLOT_IN_LIVE_RANGE,
        FindingCode.SLOT_SHARED_ACROSS_POSITIONS,
        FindingCode.PADDING_SLOT_IN_LIVE_RANGE,
        FindingCode.DUPLICATE_SLOT_IN_ROW,
    }
)
#: Canary findings: their cause is their explanation's (`CAUSE_OF_EXPLANATION`, docs/canary.md
#: §7) when no symptom in req_to_token or the allocator claimed them first.
_CANARY_CODES = frozenset(
    {
        FindingCode.CANARY_CHAIN_BREAK,
        FindingCode.CANARY_POSITION_MISMATCH,
        FindingCode.CANARY_TOKEN_MISMATCH,
        FindingCode.CANARY_REAL_KV_MISMATCH,
    }
)
#: The explanation of a chain break caused by the bad record before it.
_FOLLOWS = ViolationRowCause.FOLLOWS_BAD_RECORD
#: Causes in the order a user should look at them when equally sure: root causes first.
_PRECEDENCE = {code: i for i, code in enumerate(CauseCode)}


@dataclass
class _Claim:
    """A cause being built: the findings it explains (some of their cells) and why."""

    code: CauseCode
    confidence: Confidence
    evidence: list[str]
    #: findings with cells claimed, in claim order (their messages are default evidence).
    members: list[int]
    #: finding code -> cells claimed.
    explains: Counter[FindingCode] = field(default_factory=Counter)
    #: the bug-report sentence its mechanism's own analysis built (pages, pool rows), if any.
    headline: str | None = None


_CAUSES = list(CauseCode)
_UNCLAIMED = -1


def _cause_counts(causes: np.ndarray) -> np.ndarray:
    """Cells per cause index + 1 (`_UNCLAIMED` first), counted a piece of cells at a
    time (a `bincount` widens what it counts: 80 MB for ten million cells)."""
    counts = np.zeros(len(_CAUSES) + 1, dtype=np.int64)
    for (piece,) in pieces(causes):
        counts += np.bincount(piece.astype(np.int16) + 1, minlength=counts.size)  # int8 + 1
    return counts


class _Diagnosis:
    """Cells of findings being assigned to causes; each cell goes to the first cause that
    claims it (a finding group whose cells go to several causes is split by cause)."""

    def __init__(self, dump: KvDump, findings: list[Finding]) -> None:
        self.dump = dump
        self.findings = findings
        self.claims: dict[CauseCode, _Claim] = {}
        #: per finding, the index in `_CAUSES` of each cell's cause (`_UNCLAIMED`: none yet).
        self.cause_of: list[np.ndarray] = [
            np.full(f.count, _UNCLAIMED, dtype=np.int8) for f in findings
        ]

    def claim(
        self,
        code: CauseCode,
        confidence: Confidence,
        index: int,
        cells: np.ndarray | None = None,
    ) -> None:
        """Claim the unclaimed cells of finding `index` (those `cells` selects, a mask)."""
        causes = self.cause_of[index]
        free = causes == _UNCLAIMED
        if cells is not None:
            free &= cells
        taken = int(np.count_nonzero(free))
        if not taken:
            return
        entry = self.claims.setdefault(code, _Claim(code, confidence, [], []))
        entry.members.append(index)
        entry.explains[self.findings[index].code] += taken
        causes[free] = _CAUSES.index(code)

    def free(self, index: int) -> np.ndarray:
        """Mask of the cells of finding `index` no cause has claimed yet."""
        free: np.ndarray = self.cause_of[index] == _UNCLAIMED
        return free

    def evidence(self, code: CauseCode) -> list[str]:
        """The evidence list of a claimed cause (to add to)."""
        return self.claims[code].evidence

    def unclaimed(self, code: FindingCode) -> list[int]:
        """Findings of `code` with a cell no cause has claimed."""
        return [
            i for i, f in enumerate(self.findings) if f.code is code and bool(self.free(i).any())
        ]

    def split(self) -> list[Finding]:
        """Every finding with its cause set; a group claimed by several causes is one finding
        per cause."""
        out: list[Finding] = []
        for f, causes in zip(self.findings, self.cause_of, strict=True):
            values = np.flatnonzero(_cause_counts(causes)) - 1
            for value in values.tolist():
                cause = None if value == _UNCLAIMED else _CAUSES[value]
                part = f if values.size == 1 else restricted(f, causes == value)
                out.append(replace(part, cause=cause))
        return out


def diagnose(dump: KvDump, findings: list[Finding]) -> tuple[list[Finding], tuple[Cause, ...]]:
    """Every finding with its cause set (split by cause), and the causes ranked (empty without
    findings)."""
    state = _Diagnosis(dump, findings)
    _batch_rows(state)
    _writes_into_live(state)
    _reuse_within_request(state)
    _stale_rows(state)
    _boundary_pages(state)
    _reissued_pages(state)
    _partial_page_frees(state)
    _swa_freed_while_live(state)
    possible = _lut_or_slots(state)
    for i, f in enumerate(findings):
        if f.code in CAUSE_OF_FINDING:
            state.claim(CAUSE_OF_FINDING[f.code], Confidence.CERTAIN, i)
    _pages_out_of_lockstep(state)
    _canary_records(state)
    _reserved_page(state)
    causes = [_cause(entry, findings, dump) for entry in state.claims.values() if entry.members]
    causes.extend(possible)
    causes.sort(key=lambda c: (-c.confidence.rank, _PRECEDENCE[c.code], -sum(c.explains.values())))
    split = state.split()  # a chain links two causes or more
    linked = link(dump, split, causes) if len(causes) > 1 else tuple(causes)
    return split, with_headlines(dump, split, _with_next_commands(dump, split, linked))


def _with_next_commands(
    dump: KvDump, findings: list[Finding], causes: tuple[Cause, ...]
) -> tuple[Cause, ...]:
    """Each cause with the `provenance` command of its first finding's slot (in its space),
    or of its pool row for a row-level one: who holds it, who held it last."""
    first: dict[CauseCode, Finding] = {}
    for code, found in _by_cause(findings).items():
        one = next((f for f in found if f.slot is not None or f.pool_row is not None), None)
        if one is not None:
            first[code] = one
    path = shell_path(str(dump.path))
    out = []
    for c in causes:
        f: Finding | None = first.get(c.code)
        if f is None and c.confidence is Confidence.POSSIBLE:  # the same cells as the likely
            f = next((first[k.code] for k in causes if k.code in first), None)
        if f is None:
            out.append(c)
        elif f.slot is not None:
            where = f"--slot {f.slot}" + (" --space swa" if f.space is Space.SWA else "")
            out.append(replace(c, next_command=f"kvcanary provenance {path} {where}"))
        else:
            out.append(replace(c, next_command=f"kvcanary provenance {path} --row {f.pool_row}"))
    return tuple(out)


#: Findings of one cause that another of its findings leaves behind, when every cell of the
#: side effect lies on a physical page the root's cells name (same group): (root, side
#: effect). The cause's story starts at what happened, not at what it left (docs/findings.md,
#: "Chains"). A physical page behind two virtual pages is named back by `physical_to_virtual`
#: for one of them at most, so the tables of the others disagree.
_LEFT_BEHIND = ((FindingCode.PHYSICAL_PAGE_SHARED, FindingCode.PAGE_TABLE_MISMATCH),)


def _physical_pages(f: Finding) -> np.ndarray | None:
    if f.cells is None or len(f.cells) == 0:
        return None
    return f.cells.extra.get("physical_page")


def _left_behind(found: Sequence[Finding]) -> list[bool]:
    """Per finding of one cause: whether another of them leaves it behind (`_LEFT_BEHIND`)."""
    out = []
    for f in found:
        roots = {root for root, effect in _LEFT_BEHIND if effect is f.code}
        pages = _physical_pages(f) if roots else None
        named = (
            []
            if pages is None
            else [
                p
                for r in found
                if r.code in roots and r.group == f.group and (p := _physical_pages(r)) is not None
            ]
        )
        out.append(pages is not None and any(bool(np.isin(pages, p).all()) for p in named))
    return out


def _roots_and_left(found: Sequence[Finding]) -> tuple[list[Finding], list[Finding]]:
    """One cause's findings split: those no other of them leaves behind, then those another
    leaves behind (`_left_behind`), each part in its order."""
    behind = _left_behind(found)
    roots = [f for f, b in zip(found, behind, strict=True) if not b]
    return roots, [f for f, b in zip(found, behind, strict=True) if b]


def _root_first(found: Sequence[Finding]) -> list[Finding]:
    """One cause's findings with those another of them leaves behind after the rest."""
    roots, left = _roots_and_left(found)
    return roots + left


def _by_cause(findings: Sequence[Finding]) -> dict[CauseCode, list[Finding]]:
    """Each cause's findings in the order its story tells them: the report's, those another
    of them leaves behind last (`_root_first`)."""
    members: dict[CauseCode, list[Finding]] = {}
    for f in sorted(findings, key=Finding.order_key):
        if f.cause is not None:
            members.setdefault(f.cause, []).append(f)
    return {code: _root_first(found) for code, found in members.items()}


def _cause(entry: _Claim, findings: list[Finding], dump: KvDump) -> Cause:
    roots, left = _roots_and_left([findings[i] for i in dict.fromkeys(entry.members)])
    leading = {f.code for f in roots}
    return Cause(
        code=entry.code,
        confidence=entry.confidence,
        summary=CAUSES[entry.code].summary,
        evidence=tuple(dict.fromkeys(entry.evidence)) or _default_evidence(roots + left),
        # a code only another of its findings leaves behind is counted last
        explains=dict(
            sorted(entry.explains.items(), key=lambda kv: (kv[0] not in leading, kv[0].order))
        ),
        fix=fix_for(entry.code, dump),
        headline=entry.headline,
    )


def fix_for(code: CauseCode, dump: KvDump) -> str:
    """`code`'s fix as it applies to `dump`: no advice for pages of several slots on a dump
    that records pages of one."""
    entry = CAUSES[code]
    page = dump.scalars["page_size"]
    single = page.value == 1 and page.origin in ("recorded", "overridden")
    return entry.fix_page_size_1 if single and entry.fix_page_size_1 else entry.fix


def _default_evidence(members: list[Finding]) -> tuple[str, ...]:
    """The first findings themselves, when the cause needs no argument beyond its symptoms."""
    shown = [_with_numbers(f) for f in members[:3]]
    more = len(members) - len(shown)
    return (*shown, f"... and {more} more") if more > 0 else tuple(shown)


def _with_numbers(f: Finding) -> str:
    """A finding's message, with where its cells are when the message of an SWA group does not
    say (a group's message names what its cells share, not which they are)."""
    if f.group != "swa":
        return f.message
    where = numbers(f)
    return f"{f.message}: {where}" if where else f.message


def _positions(first: int, last: int) -> str:
    return f"position {first}" if first == last else f"positions {first}..{last}"


def _page_text(page: int, size: int) -> str:
    if size == 1:
        return f"page {page} (slot {page})"
    return f"page {page} (slots {page * size}..{page * size + size - 1})"


def _boundary_pages(state: _Diagnosis) -> None:
    """In-window cells unmapped because their full page was cleared whole while it straddles
    the window's start (its first token is before the row's window): a clear meant for the
    tokens that left the window took the page, so the in-window tokens of the node sharing
    it lost their SWA KV (SGLang PR #36457). Only with pages of several slots."""
    dump = state.dump
    page = max(1, dump.scalars["page_size"].value or 1)
    window = dump.scalars["swa_window_size"].value or 0
    if page <= 1 or window <= 0 or dump.full_to_swa_index_mapping is None:
        return
    prefix = np.maximum(dump.prefix_lens, 0)
    bs = int(prefix.shape[0])
    start = np.maximum(prefix - window, 0)
    unmapped = [
        i
        for i, f in enumerate(state.findings)
        if f.code is FindingCode.SWA_UNMAPPED_IN_WINDOW and f.cells is not None
    ]
    boundary: list[np.ndarray] = []
    for i in unmapped:
        cells = state.findings[i].cells
        assert cells is not None
        slots, row, pos = cell_slots(state.findings[i]), cells.batch_row, cells.position
        inside = state.free(i) & (row >= 0) & (row < bs)
        row_of = np.clip(row, 0, max(bs - 1, 0))
        first = pos - slots % page  # where the page starts in the row
        straddles = inside & (slots % page == pos % page) & (first < start[row_of])
        boundary.append(slots[straddles] // page)
    pages = distinct(np.concatenate(boundary)) if boundary else np.zeros(0, dtype=np.int64)
    cleared = pages[_lut_page_mapped(state, pages) == 0]
    if cleared.size == 0:
        return
    hits: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    for i in unmapped:  # every in-window cell of a cleared boundary page (sharers' too)
        f = state.findings[i]
        assert f.cells is not None
        slots, row, pos = cell_slots(f), f.cells.batch_row, f.cells.position
        hit = state.free(i) & np.isin(slots // page, cleared)
        if hit.any():
            state.claim(CauseCode.SWA_BOUNDARY_PAGE_CLEARED, Confidence.CERTAIN, i, hit)
            hits.append((slots[hit] // page, row[hit], f.cells.pool_row[hit], pos[hit]))
    if not hits:
        return
    q, b, r, p = (np.concatenate(part) for part in zip(*hits, strict=True))
    pages = distinct(q)
    lines: list[str] = []
    more = f" (and {pages.size - 3} more pages)" if pages.size > 3 else ""
    for one in pages[:3].tolist():
        at = q == one
        rows = distinct(b[at])
        heads = {int(x): int(p[at & (b == x)].min()) // page * page for x in rows.tolist()}
        # the row whose window starts inside the page (the first node's tokens left it)
        row0 = next((x for x, h in heads.items() if h < int(start[x])), int(rows[0]))
        head, ws = heads[row0], int(start[row0])
        end = min(head + page, int(prefix[row0])) - 1
        pool0 = int(r[at & (b == row0)][0])
        others = (
            f"; {rows.size - 1} other batch row{'s' if rows.size > 2 else ''} hold"
            f"{'' if rows.size > 2 else 's'} it too"
            if rows.size > 1
            else ""
        )
        if not lines:  # the first page heads the cause
            still = _positions(ws, end)
            sharers = (
                f" and {rows.size - 1} other batch row{'s' if rows.size > 2 else ''}"
                if rows.size > 1
                else ""
            )
            state.claims[CauseCode.SWA_BOUNDARY_PAGE_CLEARED].headline = (
                f"full {_page_text(one, page)}, held by batch row {row0} (pool row {pool0}, "
                f"positions {head}..{end}){sharers}, was cleared whole while {still} "
                f"{'is' if ws == end else 'are'} still in the window (it starts at {ws})"
                f"{more}: a page two nodes share at a split that is not page-aligned, or an "
                "eviction that ran one page past the window's start; the tree (whether the "
                "page's tokens sit in two nodes) or a snapshot one step earlier tells them apart"
            )
        lines.append(
            f"full {_page_text(one, page)}: every entry 0; batch row {row0} (pool row "
            f"{pool0}) holds it at positions {head}..{end} and its window starts at {ws}: "
            f"{_positions(head, ws - 1)} left the window, {_positions(ws, end)} still in it "
            f"lost {'its' if ws == end else 'their'} SWA entries{others}"
        )
    lines.append(
        f"a clear of the whole page for the tokens before the window erased the entries of "
        f"those inside it{more}: a page two nodes share at a split that is not page-aligned, "
        "or an eviction that ran one page past the window's start; the tree (whether the "
        "page's tokens sit in two nodes) or a snapshot one step earlier tells them apart"
    )
    state.evidence(CauseCode.SWA_BOUNDARY_PAGE_CLEARED).extend(lines)


def _reissued_pages(state: _Diagnosis) -> None:
    """Second owners of an SWA slot that are the remains of a page mapping: a full page that
    keeps two or more entries into the SWA page at their own offsets while its other entries
    are 0. A partial-page free released the SWA page whole, and the allocator handed it out
    again (SGLang PR #27779, one step later). Only with pages of four slots or more."""
    dump = state.dump
    page = max(1, dump.scalars["page_size"].value or 1)
    lut = dump.full_to_swa_index_mapping
    if page < 4 or lut is None:
        return
    found: list[tuple[np.ndarray, np.ndarray]] = []
    for i, f in enumerate(state.findings):
        if f.code is not FindingCode.SWA_SLOT_SHARED_OWNER or f.cells is None:
            continue
        full, swa = f.cells.extra.get("full_slot"), cell_slots(f)
        if full is None:
            continue
        # page 0 handed out is the reserved page's (its first slot reads as unmapped)
        in_step = state.free(i) & (full % page == swa % page) & (swa >= page)
        if not in_step.any():
            continue
        pages = distinct(full[in_step] // page)
        kept = _lut_page_mapped(state, pages)
        partial = pages[(kept >= 2) & (kept < page)]
        hit = in_step & np.isin(full // page, partial)
        if hit.any():
            state.claim(CauseCode.SWA_PAGE_REISSUED, Confidence.CERTAIN, i, hit)
            found.append((full[hit], swa[hit]))
    if not found:
        return
    full = np.concatenate([x[0] for x in found])
    swa = np.concatenate([x[1] for x in found])
    lines: list[str] = []
    for swa_page in distinct(swa // page)[:3].tolist():
        old = int(full[swa // page == swa_page][0]) // page
        keeps = int(_lut_page_mapped(state, np.array([old]))[0])
        line = (
            f"SWA {_page_text(swa_page, page)}: full {_page_text(old, page)} keeps {keeps} of "
            f"its {page} entries into it, the other {page - keeps} cleared (a partial-page free "
            "released the SWA page whole)"
        )
        owners = _new_owners(state, swa_page, page, old)
        if owners:
            line += f"; {owners}: the page was handed out again, and the old entries are stale"
        if not lines:  # the first SWA page heads the cause
            reissued = int(distinct(swa // page).size)
            more = (
                f" (and {reissued - 1} more SWA page{'s' if reissued > 2 else ''})"
                if reissued > 1
                else ""
            )
            state.claims[CauseCode.SWA_PAGE_REISSUED].headline = (
                f"SWA {_page_text(swa_page, page)} was released whole by a partial-page free "
                f"of full {_page_text(old, page)} and reissued{more}: "
                + (f"{owners}, " if owners else "another full page maps into it, ")
                + f"while the old page keeps {keeps} of its {page} entries into it (stale: "
                "their free would free the new owner's KV)"
            )
        lines.append(line)
    state.evidence(CauseCode.SWA_PAGE_REISSUED).extend(lines)


def _new_owners(state: _Diagnosis, swa_page: int, page: int, old: int) -> str:
    """`full page 14 (slots 56..59), held by batch row 1 (pool row 3) at positions 8..11`: the
    other full pages mapping into an SWA page, and the live cells holding them."""
    lut = state.dump.full_to_swa_index_mapping
    if lut is None or not lut.complete:
        return ""
    values = np.asarray(lut.array()[:-1], dtype=np.int64)
    into = np.flatnonzero((values // page == swa_page) & (values > 0))
    pages = distinct(into // page)
    pages = pages[pages != old]
    if pages.size == 0:
        return ""
    new = int(pages[0])
    text = f"full {_page_text(new, page)} maps into it too"
    cells = live_cells(state.dump)
    on = (cells.slot // page == new) & (cells.slot > 0)
    if on.any():
        b, r, q = cells.batch_row[on], cells.pool_row[on], cells.position[on]
        text += (
            f", held by batch row {int(b[0])} (pool row {int(r[0])}) at positions "
            f"{span(q[b == b[0]])}"
        )
    return text


def _reserved_page(state: _Diagnosis) -> None:
    """The reserved page's own argument: which free list holds page 0 and how many times
    (twice or more: freed twice, as unmapped tokens whose LUT entry reads 0 are), and which
    full slots map into it (handed out)."""
    if CauseCode.RESERVED_SLOT_FREED not in state.claims:
        return
    dump = state.dump
    page = max(1, dump.scalars["page_size"].value or 1)
    lines: list[str] = []
    heads: list[str] = []
    for space, name, free in (
        ("full", "free_full_slots", dump.free_full_slots),
        ("SWA", "free_swa_slots", dump.free_swa_slots),
    ):
        if free is None or free.size == 0:
            continue
        values = np.asarray(free, dtype=np.int64).reshape(-1)
        reserved = values[(values >= 0) & (values < page)]
        if reserved.size == 0:
            continue
        # counted per distinct slot: bounded by the free list, not by the claimed page size
        times = int(np.unique(reserved, return_counts=True)[1].max())
        line = f"the reserved {space} {_page_text(0, page)} is on {name}"
        if not heads:  # the first free list heads the cause
            twice = "twice" if times == 2 else f"{times} times"
            heads.append(
                f"{line} {twice}: it was freed {twice} (a free of tokens whose LUT entry "
                "already reads 0 frees slot 0)"
                if times >= 2
                else f"{line}: it was freed, and an allocation can hand it out"
            )
        if times >= 2:
            line += (
                f" {times} times: freed {times} times (freeing an unmapped token frees "
                "slot 0, the value its LUT entry reads)"
            )
        else:
            line += ": freed, so an allocation can hand it out"
        lines.append(line)
    for f in state.findings:
        if f.code is FindingCode.RESERVED_SLOT_IN_USE and f.space is Space.FULL and f.cells:
            lines.append(_with_numbers(replace(f, group=f.group, message=f.message)))
            swa = f.cells.extra.get("swa_slot")
            if swa is not None and len(heads) < 2:
                owners = [o for o in f.owners if o.pool_row is not None]
                held = f", {_owners_clause(owners, one_slot=False)}," if owners else ""
                heads.append(
                    f"the reserved SWA {_page_text(0, page)} was handed out: full slots "
                    f"{span(cell_slots(f))}{held} map into SWA slots {span(swa)}"
                )
    if heads:
        state.claims[CauseCode.RESERVED_SLOT_FREED].headline = "; ".join(heads)
    state.evidence(CauseCode.RESERVED_SLOT_FREED).extend(lines)


def _batch_rows(state: _Diagnosis) -> None:
    """Corrupt batch metadata claims its own findings and every symptom in its rows."""
    rows = {
        f.batch_row for f in state.findings if f.code in _BATCH_CODES and f.batch_row is not None
    }
    if not rows:
        return
    bad = np.array(sorted(rows), dtype=np.int64)
    for i, f in enumerate(state.findings):
        if f.code in _BATCH_CODES or (f.cells is None and f.batch_row in rows):
            state.claim(CauseCode.BATCH_METADATA_CORRUPT, Confidence.CERTAIN, i)
        elif f.cells is not None:
            state.claim(
                CauseCode.BATCH_METADATA_CORRUPT,
                Confidence.CERTAIN,
                i,
                np.isin(f.cells.batch_row, bad),
            )
    state.evidence(CauseCode.BATCH_METADATA_CORRUPT).extend(
        f.message for f in state.findings if f.code in _BATCH_CODES
    )


#: codes of a slot held twice: when this step's write made the second holder, the write is
#: the cause (the allocator handed out a live slot), not aliasing or a copy.
_HELD_TWICE_CODES = frozenset(
    {
        FindingCode.SLOT_SHARED_ACROSS_POSITIONS,
        FindingCode.SLOT_SHARED_WITHOUT_PREFIX,
        FindingCode.DUPLICATE_SLOT_IN_ROW,
    }
)


def _writes_into_live(state: _Diagnosis) -> None:
    """A slot this step writes while another cell holds it live is one fault, the write: the
    aliasing or repetition it leaves in `req_to_token` (the pending cell now holds the slot
    too) goes to the same cause."""
    findings = state.findings
    parts = [cell_slots(f) for f in findings if f.code is FindingCode.WRITE_TO_LIVE_SLOT]
    if not parts:
        return
    written = distinct(np.concatenate(parts))
    for i, f in enumerate(findings):
        if f.code in _HELD_TWICE_CODES:
            hit = np.isin(held_slots(f), written)
            state.claim(CauseCode.WRITE_INTO_LIVE_SLOT, Confidence.CERTAIN, i, hit)


def _reuse_within_request(state: _Diagnosis) -> None:
    """An aliased cell whose row holds its slot twice is the row's own repeat: when the other
    holders share the slot's first position with it (radix sharers of the original cell), the
    repeat is the fault, not a copy across requests."""
    findings = state.findings
    repeats = [
        f for f in findings if f.code is FindingCode.DUPLICATE_SLOT_IN_ROW and f.cells is not None
    ]
    if not repeats:
        return
    # compared only (`pairs_among` ranks them): the columns as held
    rows = np.concatenate([_held(f, "pool_row") for f in repeats])
    slots = np.concatenate([held_slots(f) for f in repeats])
    for i, f in enumerate(findings):
        if f.code is FindingCode.SLOT_SHARED_ACROSS_POSITIONS and f.cells is not None:
            hit = pairs_among(_held(f, "pool_row"), held_slots(f), rows, slots)
            state.claim(CauseCode.SLOT_REUSED_WITHIN_REQUEST, Confidence.CERTAIN, i, hit)


def _stale_rows(state: _Diagnosis) -> None:
    """Symptoms that cover most of a row's prefix up to its last position: a stale tail.

    The row must show a symptom of its own there (a freed, unwritten or repeated slot): a row
    whose tail is only shared with other rows is consistent as far as it goes, and the
    sharing is another cause's. Each finding's cells are read in place (no joined copy of
    every symptom cell): what is held across findings is per batch row, or a mark per
    (row, position) pair."""
    findings = state.findings
    prefix = np.maximum(state.dump.prefix_lens, 0)
    bs = int(prefix.shape[0])
    members: list[tuple[int, np.ndarray]] = []  # (finding, its symptom cells: a mask)
    for i, f in enumerate(findings):
        # the old owner's tail is full slots; an SWA peer freed in the window is not one
        if f.code not in _STALE_CODES or f.cells is None or f.space is not Space.FULL:
            continue
        # compared, counted and used as indices only: the columns as held
        row, at = _held(f, "batch_row"), _held(f, "position")
        inside = state.free(i) & (row >= 0) & (row < bs)
        _before_prefix(inside, row, at, prefix)
        del row, at
        if inside.any():
            members.append((i, inside))
    if not members:
        return
    first = np.full(bs, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(bs, -1, dtype=np.int64)
    own = np.zeros(bs, dtype=np.int64)
    for i, inside in members:
        counts = findings[i].code is not FindingCode.SLOT_SHARED_ACROSS_POSITIONS
        _extents(findings[i], inside, first, last, own if counts else None)
    # distinct positions per row: how much of the prefix the symptoms cover
    covered = _covered(findings, members, bs, int(last.max()) + 1)
    # At least two cells, ending at the last prefix position, covering most of the run, with
    # a symptom of the row's own among them.
    stale = (covered >= 2) & (last == prefix - 1) & (2 * covered >= prefix - first) & (own > 0)
    if not stale.any():
        return
    stale_rows = np.flatnonzero(stale)
    for i, inside in members:
        # no cause claimed a cell since `inside` was taken: the free symptom cells of stale rows
        claimed = _in_rows(findings[i], inside, stale)
        state.claim(CauseCode.STALE_ROW_READ, Confidence.LIKELY, i, claimed)
        del claimed
    state.evidence(CauseCode.STALE_ROW_READ).extend(
        _stale_row_lines(state, stale_rows, members, first)
    )


def _before_prefix(inside: np.ndarray, row: np.ndarray, at: np.ndarray, prefix: np.ndarray) -> None:
    """Drop from `inside` (in place) the cells at or past their batch row's prefix."""
    for part, rows, ats in pieces(inside, row, at):  # `part` is a view of `inside`
        part[part] &= ats[part] < prefix[rows[part]]


def _extents(
    finding: Finding,
    inside: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    own: np.ndarray | None,
) -> None:
    """Fold the cells of `finding` that `inside` selects into each batch row's first and last
    position, and into its count of cells (`own`, unless None)."""
    held_row, held_at = _held(finding, "batch_row"), _held(finding, "position")
    for part, rows, ats in pieces(inside, held_row, held_at):
        row, at = rows[part], ats[part]
        fold_at(np.minimum, first, row, at)
        fold_at(np.maximum, last, row, at)
        if own is not None:
            own += np.bincount(row, minlength=own.size)


def _in_rows(finding: Finding, inside: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The cells of `finding` that `inside` selects whose batch row `rows` (a mask) holds."""
    selected = inside.copy()
    for part, held_rows in pieces(selected, _held(finding, "batch_row")):
        part[part] = rows[held_rows[part]]
    return selected


def _covered(
    findings: list[Finding], members: list[tuple[int, np.ndarray]], bs: int, width: int
) -> np.ndarray:
    """Per batch row, the distinct positions among the members' symptom cells: a mark per
    (row, position) pair where there are no more pairs than eight per cell, else the cells'
    pairs as one sorted key each."""
    cells = sum(int(np.count_nonzero(inside)) for _, inside in members)

    def keys(i: int, inside: np.ndarray) -> Iterator[np.ndarray]:
        """The (row, position) keys of a member's symptom cells, a piece of cells at a time
        (no index of every symptom cell)."""
        row, at = _held(findings[i], "batch_row"), _held(findings[i], "position")
        for part, rows, ats in pieces(inside, row, at):
            index = np.flatnonzero(part)
            yield rows[index].astype(np.int64) * width + ats[index]

    if bs * width <= 8 * cells:
        seen = np.zeros(bs * width, dtype=bool)
        for i, inside in members:
            for key in keys(i, inside):
                seen[key] = True
        covered: np.ndarray = np.count_nonzero(seen.reshape(bs, width), axis=1)
        return covered
    every = np.empty(cells, dtype=np.int64)
    done = 0
    for i, inside in members:
        for key in keys(i, inside):
            every[done : done + key.size] = key
            done += key.size
    every.sort()
    distinct = np.ones(every.size, dtype=bool)
    distinct[1:] = every[1:] != every[:-1]
    covered = np.bincount(every[distinct] // width, minlength=bs)
    return covered


#: Stale rows the evidence names one by one; the rest are counted in one line.
STALE_ROWS_SHOWN = 5


def _held(finding: Finding, name: str) -> np.ndarray:
    """A column of a finding group's cells as held (a narrow dtype): to compare, count or
    index with, never to compute with."""
    assert finding.cells is not None
    held = finding.cells.column(name)
    assert held is not None
    return held


def _tally(
    finding: Finding, inside: np.ndarray, shown: np.ndarray, per_row: np.ndarray, named: np.ndarray
) -> None:
    """Count the cells of `finding` that `inside` selects per batch row (`per_row`), and per
    batch row of `shown` (`named`, in place: a column of the caller's table)."""
    for part, rows in pieces(inside, _held(finding, "batch_row")):
        row = rows[part]
        per_row += np.bincount(row, minlength=per_row.size)
        at = np.searchsorted(shown, row[np.isin(row, shown)])
        named += np.bincount(at, minlength=shown.size)


def _stale_row_lines(
    state: _Diagnosis,
    stale_rows: np.ndarray,
    members: list[tuple[int, np.ndarray]],
    first: np.ndarray,
) -> list[str]:
    """One line per stale batch row for the first `STALE_ROWS_SHOWN` (its tail's cells per
    code), then one line counting the others' symptom cells: counted a finding at a time."""
    prefix = np.maximum(state.dump.prefix_lens, 0)
    pool_rows = state.dump.req_pool_indices
    bs = int(prefix.shape[0])
    shown = stale_rows[:STALE_ROWS_SHOWN]
    every_code = list(FindingCode)
    # cells per (row shown, code), and symptom cells per row
    per_code = np.zeros((shown.size, len(every_code)), dtype=np.int64)
    per_row = np.zeros(bs, dtype=np.int64)
    for i, inside in members:
        _tally(state.findings[i], inside, shown, per_row, per_code[:, state.findings[i].code.order])
    lines = []
    for k, b in enumerate(shown.tolist()):
        tally = Counter(
            {
                code.value: int(per_code[k, code.order])
                for code in every_code
                if per_code[k, code.order]
            }
        )
        p, start = int(prefix[b]), int(first[b])
        lines.append(
            f"batch row {b} (pool row {int(pool_rows[b])}): positions "
            f"{start}..{p - 1}, the last {p - start} of its prefix of {p}, hold "
            f"{_counted(tally)}; the cells before them are clean"
        )
    more = int(stale_rows.size - shown.size)
    if more > 0:
        rest = int(per_row[stale_rows].sum() - per_code.sum())
        lines.append(
            f"... and {more} more batch row{'s' if more != 1 else ''} with a stale tail "
            f"({rest} cell{'s' if rest != 1 else ''}; every one is in the findings)"
        )
    return lines


#: codes whose cells name a full slot mapped to an SWA slot: the cell's slot (full space) or
#: its `full_slot` column (SWA space).
_MAPPED_FULL_SLOT_CODES = frozenset(
    {
        FindingCode.FREE_SLOT_STILL_MAPPED,
        FindingCode.SWA_SLOT_FREE_AND_MAPPED,
        FindingCode.SWA_SLOT_SHARED_OWNER,
        FindingCode.SWA_WRITE_TO_LIVE_SLOT,
        FindingCode.SWA_SLOT_COLLISION,
        FindingCode.FREED_SLOT_IN_LIVE_RANGE,
    }
)


def _full_slots(finding: Finding) -> np.ndarray | None:
    """The full slot of each cell of a finding about a mapping (None: not such a finding)."""
    if finding.code not in _MAPPED_FULL_SLOT_CODES or finding.cells is None:
        return None
    if finding.space is Space.FULL:
        return cell_slots(finding)
    return finding.cells.extra.get("full_slot")


def _lut_page_mapped(state: _Diagnosis, pages: np.ndarray) -> np.ndarray:
    """How many tokens of each full page (`pages`, distinct) the LUT maps (value > 0)."""
    lut = state.dump.full_to_swa_index_mapping
    page = max(1, state.dump.scalars["page_size"].value or 1)
    if lut is None or pages.size == 0:
        return np.zeros(pages.shape, dtype=np.int64)
    keys = int(lut.shape[0]) - 1  # the sentinel is no key
    # a page's offsets past the LUT's keys map nothing: the width is bounded by the LUT's
    # real length, not by the page size the dump claims
    width = max(1, min(page, keys))
    tokens = (pages[:, None] * page + np.arange(width, dtype=np.int64)).reshape(-1)
    inside = (tokens >= 0) & (tokens < keys)
    values = np.zeros(tokens.shape, dtype=np.int64)
    values[inside] = lut.take_known(tokens[inside])[0]
    mapped: np.ndarray = (values > 0).reshape(pages.size, width).sum(axis=1)
    return mapped


def _partial_page_frees(state: _Diagnosis) -> None:
    """A free or stale mapping on a full page whose other tokens' entries were cleared: the
    free cleared the LUT only for the tokens it was given while the allocator released whole
    pages (SGLang PR #27779). Only with pages of several slots."""
    page = max(1, state.dump.scalars["page_size"].value or 1)
    if page <= 1 or state.dump.full_to_swa_index_mapping is None:
        return
    members = []
    for i, f in enumerate(state.findings):
        full = _full_slots(f)
        # a free full page, a stale owner outside the batch, an out-of-window live cell: pages
        # whose unmapped tokens were cleared (a live request's last page is unmapped past its
        # end without any free)
        if full is not None and (
            f.code in (FindingCode.FREE_SLOT_STILL_MAPPED, FindingCode.SWA_SLOT_FREE_AND_MAPPED)
            or (
                f.code is FindingCode.FREED_SLOT_IN_LIVE_RANGE
                and f.space is Space.SWA
                and f.role is Role.PREFIX
            )
        ):
            members.append((i, full // page))
    if not members:
        return
    pages = distinct(np.concatenate([m[1] for m in members]))
    mapped = _lut_page_mapped(state, pages)
    cut = mapped < page
    partial, mapped = pages[cut], mapped[cut]
    for i, of in members:
        hit = np.isin(of, partial)
        if hit.any():
            state.claim(CauseCode.PARTIAL_PAGE_FREE, Confidence.CERTAIN, i, hit)
    if CauseCode.PARTIAL_PAGE_FREE not in state.claims:  # none, or every cell claimed before
        return
    shown = ", ".join(
        f"full page {int(q)} (slots {int(q) * page}..{int(q) * page + page - 1}): {int(m)} of "
        f"{page} tokens still mapped"
        for q, m in zip(partial[:3], mapped[:3], strict=True)
    )
    more = f", and {partial.size - 3} more pages" if partial.size > 3 else ""
    state.claims[CauseCode.PARTIAL_PAGE_FREE].headline = _partial_headline(
        state, int(partial[0]), int(mapped[0]), int(partial.size)
    )
    state.evidence(CauseCode.PARTIAL_PAGE_FREE).append(
        f"{shown}{more}; the rest of each page was cleared: a free that cleared tokens, not pages"
    )


def _partial_headline(state: _Diagnosis, full: int, mapped: int, pages: int) -> str:
    """`full page 313 (slots 1252..1255), on the free list: 2 of its 4 tokens still map into
    SWA page 34 (...), which is on the SWA free list; ...`: the first page freed in part."""
    dump = state.dump
    page = max(1, dump.scalars["page_size"].value or 1)
    lut = dump.full_to_swa_index_mapping
    first = full * page
    values = np.zeros(0, dtype=np.int64)
    if lut is not None:  # the page's tokens the LUT has keys for (never the claimed page size)
        keys = np.arange(max(first, 0), min(first + page, int(lut.shape[0]) - 1), dtype=np.int64)
        values = np.asarray(lut.take_known(keys)[0], dtype=np.int64)
    swa_pages = distinct(values[values > 0] // page)
    where = ""
    free_full = dump.free_full_slots
    if free_full is not None and ((free_full >= first) & (free_full < first + page)).any():
        where = ", on the free list,"
    into, released = "an SWA page", "released the SWA page"
    if swa_pages.size:
        swa_page = int(swa_pages[0])
        free = dump.free_swa_slots
        into = f"SWA {_page_text(swa_page, page)}"
        if free is not None and bool(np.isin(swa_page * page, free)):
            into += ", which is on the SWA free list"
            released = "released the SWA page whole"
    more = f" (and {pages - 1} more full page{'s' if pages > 2 else ''})" if pages > 1 else ""
    stale = f"{mapped} stale token{'s' if mapped != 1 else ''}"
    return (
        f"full {_page_text(full, page)}{where} had {page - mapped} of its {page} LUT entries "
        f"cleared while {mapped} of its {page} still map{'s' if mapped == 1 else ''} into "
        f"{into}{more}: a free cleared "
        f"the tokens it was given, not the page, and {released}; a later free of the {stale} "
        "frees that SWA page again"
    )


def _swa_freed_while_live(state: _Diagnosis) -> None:
    """Live full slots whose SWA slots are on the SWA free list: the SWA page went back while a
    request still maps it. With leaked SWA pages beside it, that is a mapping replaced
    without freeing the old page, and the new one freed (SGLang PR #36135)."""
    findings = state.findings
    page = max(1, state.dump.scalars["page_size"].value or 1)
    swa_slots = []
    for i, f in enumerate(findings):
        if f.code is FindingCode.FREED_SLOT_IN_LIVE_RANGE and f.space is Space.SWA:
            free = state.free(i)
            if not free.any():
                continue
            if f.role is Role.PREFIX:  # outside the window: its SWA side rightly went back
                _window_free_not_cleared(state, i, free)
                continue
            swa_slots.append(cell_slots(f)[free])
            state.claim(CauseCode.SWA_FREED_WHILE_LIVE, Confidence.CERTAIN, i, free)
    if not swa_slots:
        return
    pages = distinct(np.concatenate(swa_slots) // page)
    unit = "page" if page > 1 else "slot"
    leaked = sum(f.count for f in findings if f.code is FindingCode.SWA_PAGE_LEAKED)
    line = (
        f"{pages.size} SWA {unit}{'s' if pages.size != 1 else ''} on the SWA free list "
        f"{'are' if pages.size != 1 else 'is'} mapped from live cells"
    )
    if leaked:
        line += (
            f", and {leaked} SWA page{'s are' if leaked != 1 else ' is'} leaked: the mark of "
            "a mapping replaced without freeing the page it replaced, the new page then freed "
            "with a deferred group"
        )
    state.evidence(CauseCode.SWA_FREED_WHILE_LIVE).append(line)


def _window_free_not_cleared(state: _Diagnosis, i: int, free: np.ndarray) -> None:
    """Live cells outside the SWA window mapping SWA slots on the SWA free list: a window free
    released their SWA side, as it should, and left their LUT entries (SGLang's free_swa
    clears them): stale mappings, whose next free frees another owner's SWA KV. Inside the
    window the same end state is an SWA page freed while live (`_swa_freed_while_live`)."""
    f = state.findings[i]
    state.claim(CauseCode.STALE_SWA_MAPPING, Confidence.CERTAIN, i, free)
    cells = f.cells
    full = None if cells is None else cells.column("full_slot")
    swa = cell_slots(f)[free]
    mapped = "" if full is None else f": full slots {span(full[free])} -> SWA slots {span(swa)}"
    state.evidence(CauseCode.STALE_SWA_MAPPING).append(
        f"live cells outside the window (before their batch rows' window start) map to SWA "
        f"slots on the SWA free list{mapped}: a window free released the SWA side and its LUT "
        "entries were not cleared (stale mappings; inside the window the same state would be "
        "an SWA page freed while live)"
    )


def _pages_out_of_lockstep(state: _Diagnosis) -> None:
    """An entry out of its page's lockstep joins the cause of another finding on the same full
    slot (a stale owner, a stale write translation) or on the same SWA slot (the other holder
    of a collision); alone, it is a mapping rewritten."""
    known = _SlotCauses()
    for i, f in enumerate(state.findings):
        full = _full_slots(f)
        if full is not None:
            claimed = state.cause_of[i] != _UNCLAIMED
            known.add("full", full[claimed], state.cause_of[i][claimed])
            if f.space is Space.SWA:
                known.add("swa", cell_slots(f)[claimed], state.cause_of[i][claimed])
    for i, f in enumerate(state.findings):
        if f.code is not FindingCode.SWA_PAGE_OUT_OF_LOCKSTEP:
            continue
        joined = known.lookup("full", cell_slots(f))
        if f.cells is not None and "swa_slot" in f.cells.extra:
            by_swa = known.lookup("swa", f.cells.extra["swa_slot"])
            joined = np.where(joined == _UNCLAIMED, by_swa, joined)
        for value in distinct(joined[joined != _UNCLAIMED]).tolist():
            state.claim(_CAUSES[value], Confidence.CERTAIN, i, joined == value)
        state.claim(CauseCode.SWA_MAPPING_REWRITTEN, Confidence.CERTAIN, i)


class _SlotCauses:
    """Per (space, slot): the cause its first claimed cell went to, as sorted arrays (the
    first claim wins, as findings are visited in order)."""

    def __init__(self) -> None:
        self._parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._tables: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def add(self, space: str, slots: np.ndarray, causes: np.ndarray) -> None:
        self._parts.setdefault(space, []).append((slots, causes))
        self._tables.pop(space, None)

    def lookup(self, space: str, slots: np.ndarray) -> np.ndarray:
        """The cause index of each slot (`_UNCLAIMED` where none is known)."""
        if space not in self._tables:
            parts = self._parts.get(space, [])
            every = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
            causes = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int8)
            known, first = np.unique(every, return_index=True)  # the first claim of each slot
            self._tables[space] = (known, causes[first])
        known, causes = self._tables[space]
        out = np.full(slots.shape, _UNCLAIMED, dtype=np.int8)
        if known.size:
            at = np.minimum(np.searchsorted(known, slots), known.size - 1)
            hit = known[at] == slots
            out[hit] = causes[at[hit]]
        return out


def _canary_records(state: _Diagnosis) -> None:
    """Canary cells join the cause of their slot's other symptoms when it has one (the same
    slot in the same space), else the cause their explanation names; a chain break that
    follows a bad record joins that record's cause."""
    findings = state.findings
    canary = [
        i for i, f in enumerate(findings) if f.code in _CANARY_CODES and bool(state.free(i).any())
    ]
    if not canary:
        return
    known = _SlotCauses()
    for i, f in enumerate(findings):
        if f.code in _CANARY_CODES or f.slot is None:
            continue
        claimed = state.cause_of[i] != _UNCLAIMED
        known.add(f.space, cell_slots(f)[claimed], state.cause_of[i][claimed])
    follows: list[int] = []
    for i in canary:
        f = findings[i]
        slots = cell_slots(f)
        joined = known.lookup(f.space, slots)
        for value in distinct(joined[joined != _UNCLAIMED]).tolist():
            state.claim(_CAUSES[value], Confidence.LIKELY, i, joined == value)
        explained = _cell_explanations(f)
        for name in sorted(set(explained.tolist()) - {_FOLLOWS}):
            own = CAUSE_OF_EXPLANATION.get(name, CauseCode.FOREIGN_CANARY_RECORD)
            state.claim(own, Confidence.LIKELY, i, explained == name)
        claimed = state.cause_of[i] != _UNCLAIMED
        known.add(f.space, slots[claimed], state.cause_of[i][claimed])
        if not claimed.all():
            follows.append(i)
    for i in follows:
        f = findings[i]
        joined = known.lookup(f.space, _cell_prev_slots(f))
        for value in distinct(joined[joined != _UNCLAIMED]).tolist():
            state.claim(_CAUSES[value], Confidence.LIKELY, i, joined == value)
        state.claim(CauseCode.FOREIGN_CANARY_RECORD, Confidence.LIKELY, i)


def _cell_explanations(finding: Finding) -> np.ndarray:
    """Each cell's explanation (a violation cause's name) of a canary finding."""
    if finding.cells is not None and "explanation" in finding.cells.extra:
        names = np.array([c.value for c in EXPLANATION_CAUSES], dtype=object)
        explained: np.ndarray = names[finding.cells.extra["explanation"]]
        return explained
    return np.array([finding.canary_cause or ""], dtype=object)


def _cell_prev_slots(finding: Finding) -> np.ndarray:
    """Each cell's prev slot (a canary finding's `prev_slot` column; -1 without one)."""
    if finding.cells is not None and "prev_slot" in finding.cells.extra:
        return finding.cells.extra["prev_slot"]
    return np.array([-1 if finding.prev_slot is None else finding.prev_slot], dtype=np.int64)


def _counted(codes: Counter[str]) -> str:
    """`4 freed-slot-in-live-range cells`: counts of cells per code, named as cells."""
    return ", ".join(f"{n} {code} cell{'s' if n != 1 else ''}" for code, n in codes.most_common())


def _lut_or_slots(state: _Diagnosis) -> list[Cause]:
    """Slots >= lut_len: a LUT too short for valid slots, or slots no pool can hold.

    With a recorded pool size the answer is per slot. Without one, the other evidence decides
    (the allocator's free list, how many distinct slots, how far past the LUT they go), and the
    other answer is kept as `possible`.
    """
    dump, findings = state.dump, state.findings
    lut = dump.full_to_swa_index_mapping
    pool = dump.scalars["num_full_slots"]
    lut_len = 0 if lut is None else int(lut.shape[0])
    out_of_range = state.unclaimed(FindingCode.LUT_OUT_OF_RANGE)
    beyond = state.unclaimed(FindingCode.SLOT_BEYOND_POOL)
    shorter = state.unclaimed(FindingCode.LUT_SHORTER_THAN_POOL)
    sentinel = state.unclaimed(FindingCode.LUT_SENTINEL_MISSING)

    if pool.value is not None and not pool.assumed:
        size = pool.value
        corrupt = False
        for i in beyond:
            state.claim(CauseCode.SLOT_INDEX_CORRUPT, Confidence.CERTAIN, i)
            corrupt = True
        short: list[np.ndarray] = []
        for i in out_of_range:
            slots, free = cell_slots(findings[i]), state.free(i)
            too_big = free & (slots >= size)
            if too_big.any():
                state.claim(CauseCode.SLOT_INDEX_CORRUPT, Confidence.CERTAIN, i, too_big)
                corrupt = True
            short.append(slots[free & (slots >= 0) & (slots < size)])
        if corrupt:
            state.evidence(CauseCode.SLOT_INDEX_CORRUPT).append(
                f"live slots >= num_full_slots {size} ({pool.source}): beyond the pool, "
                "so beyond a correctly sized LUT too"
            )
        valid = distinct(np.concatenate(short)) if short else np.zeros(0, dtype=np.int64)
        if valid.size or shorter:
            for i in out_of_range:
                slots = cell_slots(findings[i])
                state.claim(
                    CauseCode.LUT_TOO_SHORT, Confidence.CERTAIN, i, (slots >= 0) & (slots < size)
                )
            for i in [*shorter, *(sentinel if shorter else [])]:
                state.claim(CauseCode.LUT_TOO_SHORT, Confidence.CERTAIN, i)
            state.evidence(CauseCode.LUT_TOO_SHORT).extend(
                _lut_evidence(dump, lut_len, size, pool.source, valid)
            )
        return []
    if not out_of_range and not beyond:
        return []
    parts = [cell_slots(findings[i])[state.free(i)] for i in (*out_of_range, *beyond)]
    slots = distinct(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
    evidence, lut_likely = _unrecorded_pool_evidence(dump, lut_len, slots[slots >= 0])
    first, second = (
        (CauseCode.LUT_TOO_SHORT, CauseCode.SLOT_INDEX_CORRUPT)
        if lut_likely
        else (CauseCode.SLOT_INDEX_CORRUPT, CauseCode.LUT_TOO_SHORT)
    )
    for i in (*out_of_range, *beyond, *sentinel):
        state.claim(first, Confidence.LIKELY, i)
    state.evidence(first).extend(evidence)
    return [
        Cause(
            code=second,
            confidence=Confidence.POSSIBLE,
            summary=CAUSES[second].summary,
            evidence=(
                "num_full_slots is not recorded, so the pool size cannot rule it out",
                *evidence,
            ),
            explains=dict(state.claims[first].explains),
            fix=fix_for(second, dump),
        )
    ]


def _lut_evidence(
    dump: KvDump, lut_len: int, pool_size: int, source: str, valid: np.ndarray
) -> list[str]:
    """Why the LUT is too short; `valid` are the distinct slots it cannot translate (sorted)."""
    lut = dump.full_to_swa_index_mapping
    assert lut is not None
    evidence = [
        f"lut_len {lut_len}",
        f"num_full_slots {pool_size} ({source}): a production LUT has {pool_size + 1} entries",
    ]
    if valid.size:
        evidence.append(
            f"{valid.size} distinct live slots in {valid[0]}..{valid[-1]}: >= "
            f"lut_len, < num_full_slots, so valid slots the LUT cannot translate"
        )
    last = lut.element(-1)
    evidence.append(
        "the LUT ends in -1: allocated too small, not sliced"
        if last == -1
        else f"the LUT ends in {last}, not -1: sliced (lut[:{lut_len}])"
    )
    return evidence


def _unrecorded_pool_evidence(
    dump: KvDump, lut_len: int, slots: np.ndarray
) -> tuple[list[str], bool]:
    """Evidence about a LUT that may be short, when the pool size is not recorded (`slots`:
    the distinct live slots past it, sorted)."""
    evidence = [
        f"lut_len {lut_len}",
        f"num_full_slots not recorded (derived as lut_len - 1 = "
        f"{lut_len - 1}); record it to decide",
    ]
    if not slots.size:
        return evidence, True
    evidence.append(f"{slots.size} distinct live slots >= lut_len - 1, in {slots[0]}..{slots[-1]}")
    lut = dump.full_to_swa_index_mapping
    if lut is not None and lut.element(-1) != -1:
        evidence.append(f"the LUT ends in {lut.element(-1)}, not -1: it was sliced")
        return evidence, True
    free = dump.free_full_slots
    if free is not None and free.size:
        top = int(free.max())
        if top >= lut_len - 1:
            evidence.append(
                f"the allocator's free list holds slots up to {top}: the pool is "
                "larger than the LUT"
            )
            return evidence, True
    table_top = int(slots[-1])
    # Slots an allocator hands out are dense: a few past the LUT's end are a short LUT; a lone
    # slot far beyond everything else is a corrupt index.
    likely_lut = slots.size >= 2 and table_top < 2 * max(lut_len, 1)
    evidence.append(
        "several slots just past the LUT's end, as an allocator hands them out"
        if likely_lut
        else "few slots, far past the LUT's end"
    )
    return evidence, likely_lut


# -- a cause's headline: one bug-report sentence from the dump's own facts (its slots, who
# holds or last held them, the step that went wrong: `catalog.CauseEntry.step`), built from the
# findings' spans and the owners the check attached, so it costs nothing per cell.


#: Owners a headline names before it counts the rest.
_OWNERS_NAMED = 2


def with_headlines(
    dump: KvDump, findings: Sequence[Finding], causes: Sequence[Cause]
) -> tuple[Cause, ...]:
    """Each cause with its headline: the one its mechanism's analysis built, else one from
    its findings (its own builder, or its catalog step after its slots and owners, or its
    first finding's message where that names the slot or pool row); a parent's headline then
    says in a clause what each cause it nests adds. The others as they are (their summary
    heads them)."""
    members = _by_cause(findings)
    out = []
    for c in causes:
        found = members.get(c.code, [])
        out.append(replace(c, headline=c.headline or _headline(dump, c.code, found)))
    page = max(1, dump.scalars["page_size"].value or 1)
    for n, c in enumerate(out):
        clauses = [_shows_as(k, members.get(k, []), page) for k in c.nests]
        if c.headline and clauses:
            out[n] = replace(
                c, headline=f"{c.headline}; this also shows as {', and as '.join(clauses)}"
            )
    return tuple(out)


def _headline(dump: KvDump, code: CauseCode, found: list[Finding]) -> str | None:
    if not found:
        return None
    build = _BUILDERS.get(code)
    if build is not None:
        return build(dump, found)
    slots = [f for f in found if f.slot is not None]
    step = CAUSES[code].step
    if step is not None and slots:
        return _sentence(slots, step)
    if code in _MESSAGE_HEADED:
        return _message_headline(found)
    return None


#: Causes whose first finding's message is the bug report (it names the pool row or the
#: slot and what is wrong with it): the owner and the count of the others follow it.
_MESSAGE_HEADED = frozenset(
    {
        CauseCode.REQ_ROW_LEAK,
        CauseCode.REQ_ROW_DOUBLE_FREE,
        CauseCode.MAMBA_SLOT_FREED_WHILE_HELD,
        CauseCode.MAMBA_SLOT_DOUBLE_FREE,
        CauseCode.MAMBA_RESERVED_SLOT_HANDED_OUT,
        CauseCode.MAMBA_ROW_MAP_STALE,
        CauseCode.MAMBA_SLOT_LEAK,
        CauseCode.MAMBA_SLOT_ID_CORRUPT,
        CauseCode.HOST_SLOT_FREED_WHILE_HELD,
        CauseCode.HOST_SLOT_DOUBLE_FREE,
        CauseCode.HOST_SLOT_INDEX_CORRUPT,
        CauseCode.HOST_SLOT_LEAK,
        CauseCode.VIRTUAL_PAGE_FREED_WHILE_BOUND,
        CauseCode.PHYSICAL_PAGE_DOUBLE_FREE,
        CauseCode.PAGE_TABLE_CORRUPT,
        CauseCode.LUT_SENTINEL_OVERWRITTEN,
    }
)


def _message_headline(found: list[Finding]) -> str:
    first = found[0]
    text = _with_numbers(first)
    owners = [o for o in first.owners if o.pool_row is not None]
    if owners:
        text += f"; {_owners_clause(owners, one_slot=len({o.slot for o in owners}) == 1)}"
    more = len(found) - 1
    if more:
        text += f" (and {more} more finding{'s' if more > 1 else ''})"
    return text


def _more(n: int, what: str) -> str:
    return f" (and {n} more {what}{'s' if n > 1 else ''})" if n > 0 else ""


def _cells(f: Finding) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each cell's slot, batch row, pool row and position (-1 where it has none)."""
    if f.cells is not None and len(f.cells):
        return (
            cell_slots(f).astype(np.int64),
            np.asarray(f.cells.batch_row, dtype=np.int64),
            np.asarray(f.cells.pool_row, dtype=np.int64),
            np.asarray(f.cells.position, dtype=np.int64),
        )
    one = [-1 if v is None else v for v in (f.slot, f.batch_row, f.pool_row, f.position)]
    a, b, c, d = (np.array([v], dtype=np.int64) for v in one)
    return a, b, c, d


def _cell_owner(f: Finding) -> str:
    """`batch row 2 (pool row 10, position 17)`: the finding's first cell."""
    if f.cells is not None and len(f.cells):
        b, r, q = (int(f.cells.batch_row[0]), int(f.cells.pool_row[0]), int(f.cells.position[0]))
    else:
        b, r, q = (-1 if v is None else v for v in (f.batch_row, f.pool_row, f.position))
    if b >= 0:
        return f"batch row {b} (pool row {r}, position {q})"
    return f"pool row {r} (position {q})" if r >= 0 else ""


def _holder(f: Finding, one_slot: bool = True) -> str:
    """The finding's slot's current or last owner, as `_owner` says it ("" without one)."""
    owners = [o for o in f.owners if o.pool_row is not None]
    return _owner(owners[0], _where(owners[0], one_slot)) if owners else ""


def _cleared_in_window(dump: KvDump, found: list[Finding]) -> str:
    head = _sentence(
        found,
        ("lost its SWA entry inside the window", "lost their SWA entries inside the window"),
    )
    one = sum(len(cell_slots(f)) for f in found) == 1
    it = "it" if one else "them"
    return (
        f"{head}: an eviction of the tokens that left the window ran past the window's "
        "start, or a tree eviction of an in-window node whose SWA lock did not cover the "
        f"whole window; a timeline (the step that cleared {it}) or the tree "
        f"(tree_swa_resident_slots: which node lost {it}) tells them apart"
    )


def _collision(dump: KvDump, found: list[Finding]) -> str:
    collisions = [g for g in found if g.code is FindingCode.SWA_SLOT_COLLISION] or found
    f = collisions[0]
    mine = None if f.cells is None else f.cells.extra.get("full_slot")
    named = [o.full_slot for o in f.owners[:1]] + ([int(mine[0])] if mine is not None else [])
    slots = list(dict.fromkeys(x for x in named if x is not None))
    holders = list(dict.fromkeys(h for h in (_holder(f), _cell_owner(f)) if h))
    held = f", held by {' and '.join(holders)}," if holders else ""
    names = (
        f"full slots {' and '.join(str(x) for x in slots)}" if len(slots) > 1 else "two full slots"
    )
    text = (
        f"{names}{held} both map to SWA slot {f.slot} in their windows"
        f"{_more(len(collisions) - 1, 'SWA slot')}: the SWA slot was handed out twice, or one "
        f"mapping is stale (a free released SWA slot {f.slot} and kept the entry); a "
        f"timeline (which mapping came last, and whether SWA slot {f.slot} went through the "
        "free list between them) tells them apart"
    )
    moved = [g for g in found if g.code is FindingCode.SWA_PAGE_OUT_OF_LOCKSTEP]
    if moved:  # a mapping written token by token: the entry that moved, not the allocator
        text += (
            f"; full slot{'s' if len(cell_slots(moved[0])) > 1 else ''} "
            f"{span(cell_slots(moved[0]))} map{'' if len(cell_slots(moved[0])) > 1 else 's'} "
            "out of its page's lockstep, as an entry rewritten on its own does"
        )
    return text


def _write_target(f: Finding) -> str:
    """`out_cache_loc[16] (batch row 2, pool row 10, position 17)`."""
    index = None if f.cells is None else f.cells.extra.get("out_cache_loc_index")
    at = f"out_cache_loc[{int(index[0])}]" if index is not None and len(index) else "a write"
    writer = _cell_owner(f)
    return f"{at} of {writer}" if writer else at


def _swa_write(dump: KvDump, found: list[Finding]) -> str:
    writes = [f for f in found if f.code is FindingCode.SWA_WRITE_TO_LIVE_SLOT]
    f = writes[0] if writes else found[0]
    full = None if f.cells is None else f.cells.extra.get("full_slot")
    through = (
        f"full slot {int(full[0])}, whose SWA slot {f.slot}"
        if full is not None
        else (f"SWA slot {f.slot}")
    )
    holder = _holder(f)
    held = f"{holder} holds live in its window" if holder else "a live cell of a window holds"
    text = (
        f"this step's {_write_target(f)} writes {through} {held}{_more(len(writes) - 1, 'write')}: "
    )
    if any(g.code is FindingCode.SWA_PAGE_OUT_OF_LOCKSTEP for g in found):
        return text + (
            "its LUT entry is out of its page's lockstep (a mapping rewritten token by token), "
            "so the write lands on another holder's SWA KV"
        )
    return text + (
        "a cached write target or translation outlived a mapping change, or the allocator "
        "handed out a live SWA slot; a timeline tells them apart"
    )


def _full_write(dump: KvDump, found: list[Finding]) -> str:
    writes = [f for f in found if f.code is FindingCode.WRITE_TO_LIVE_SLOT]
    f = writes[0] if writes else found[0]
    holder = _holder(f)
    held = f", which {holder} still holds" if holder else ", which a live cell still holds"
    return (
        f"this step's {_write_target(f)} writes full slot {f.slot}{held}"
        f"{_more(len(writes) - 1, 'write')}: the allocator handed out a live slot (freed "
        "while held, or freed twice)"
    )


def _rewritten(dump: KvDump, found: list[Finding]) -> str:
    page = max(1, dump.scalars["page_size"].value or 1)
    f = found[0]
    slots, _, _, _ = _cells(f)
    swa = None if f.cells is None else f.cells.extra.get("swa_slot")
    into = f" map to SWA slots {span(swa)}" if swa is not None else " map to other SWA slots"
    owners = [o for o in f.owners if o.pool_row is not None]
    held = f", {_owners_clause(owners, one_slot=False)}," if owners else ""
    pages = distinct(slots // page)
    return (
        f"full slots {span(slots)} of full page {span(pages)}{held}{into} out of lockstep "
        f"with the rest of their page{_more(len(found) - 1, 'finding')}: their LUT entries "
        "were written token by token (a cached translation, a tombstone recovery, a copy of "
        "one token's mapping)"
    )


def _unwritten(dump: KvDump, found: list[Finding]) -> str:
    parts = [_cells(f) for f in found]
    b = np.concatenate([p[1] for p in parts])
    r = np.concatenate([p[2] for p in parts])
    q = np.concatenate([p[3] for p in parts])
    first = int(b[0])
    at = b == first
    where = distinct(q[at])
    one = where.size == 1
    return (
        f"batch row {first} (pool row {int(r[at][0])}) reads slot 0 at "
        f"position{'' if one else 's'} {span(where)} of its live prefix"
        f"{_more(distinct(b).size - 1, 'batch row')}: "
        f"{'that cell was' if one else 'those cells were'} never written, or zeroed"
    )


def _copied(dump: KvDump, found: list[Finding]) -> str:
    f = found[0]  # its message names the slot, the position and the pool rows holding it
    return (
        f"full {f.message}{_more(len(found) - 1, 'finding')} (a copy between pool rows, or a "
        "prefix-cache match that did not start at position 0)"
    )


def _leaked_where(dump: KvDump, found: list[Finding], space: str) -> tuple[str, bool]:
    """Where a leak's cells are, in `space`'s words (`SWA page 3 (slots 12..15)`, `full slots
    4..9`): slots at page size 1, pages above it; and whether that is one page (or slot)."""
    page = max(1, dump.scalars["page_size"].value or 1)
    slots = distinct(np.concatenate([_cells(f)[0] for f in found]))
    pages = distinct(slots // page)
    if page == 1:
        where = f"{space} slot {slots[0]}" if slots.size == 1 else f"{space} slots {span(slots)}"
    elif pages.size == 1:
        where = f"{space} {_page_text(int(pages[0]), page)}"
    else:
        where = f"{space} pages {span(pages)}"
    return where, (pages.size if page > 1 else slots.size) == 1


def _swa_leak(dump: KvDump, found: list[Finding]) -> str:
    where, one = _leaked_where(dump, found, "SWA")
    return (
        f"{where} {'is' if one else 'are'} neither free nor mapped from a held full slot: "
        f"{'its mapping was' if one else 'their mappings were'} dropped without a free (leaked)"
    )


def _full_leak(dump: KvDump, found: list[Finding]) -> str:
    where, one = _leaked_where(dump, found, "full")
    text = (
        f"{where} {'is' if one else 'are'} neither free, nor the radix tree's, nor a running "
        "request's: leaked"
    )
    holder = _holder(found[0])
    if holder:
        text += f"; req_to_token still names {'it' if one else 'them'} at {holder}"
    return text


def _lock_leak(dump: KvDump, found: list[Finding]) -> str:
    f = found[0]  # its message names the slot, or counts the slots
    text = f"full {f.message}" if f.message.startswith("slot ") else f.message
    if not f.message.startswith("slot ") and f.slot is not None:
        text += f" (the first: full slot {f.slot})"
    return (
        f"{text}; the finish, abort or retraction that dropped its request skipped the unlock "
        "(dec_lock_ref)"
    )


def _aliasing(dump: KvDump, found: list[Finding]) -> str:
    step = CAUSES[CauseCode.CROSS_REQUEST_ALIASING].step
    assert step is not None
    slots_of = [f for f in found if f.slot is not None]
    head = _sentence(slots_of or found, step)
    parts = [held_slots(f) for f in found if f.code is FindingCode.SLOT_SHARED_ACROSS_POSITIONS]
    slots = (
        distinct(np.concatenate(parts).astype(np.int64))
        if parts
        else distinct(np.array([f.slot for f in slots_of], dtype=np.int64))
    )
    evicted = (
        "a radix eviction of a node a running request still locks (its slots freed, then "
        "handed to the other request)"
    )
    copied = "a slot copied into the other request (a prefix-cache match, a pool row reused "
    copied += "without reset)"
    locked_list = dump.tree_locked_full_slots
    it = "it" if slots.size == 1 else "them"
    if locked_list is None:
        return (
            f"{head}: {evicted}, or {copied}; tree_locked_full_slots (not in this dump: a "
            "running request's slot the tree no longer locks was evicted) or a timeline "
            "(through the free list: evicted; never: copied) tells them apart"
        )
    locked = np.isin(slots, np.asarray(locked_list, dtype=np.int64))
    if locked.all():
        return (
            f"{head}; tree_locked_full_slots lists {it}: a locked node still holds "
            f"{it}, so no eviction freed {it}: {copied} is left, which a timeline confirms "
            "(a copy never goes through the free list)"
        )
    which = "" if not locked.any() else f" {span(slots[~locked])} (it lists {span(slots[locked])})"
    return (
        f"{head}; tree_locked_full_slots does not list {it}{which}: no locked node holds "
        f"{it} at capture, as after {evicted}; {copied} leaves the same cells if the tree "
        "never held the slot, and a timeline decides (through the free list: evicted; never: "
        "copied)"
    )


def _lut_short(dump: KvDump, found: list[Finding]) -> str:
    lut = dump.full_to_swa_index_mapping
    lut_len = 0 if lut is None else int(lut.shape[0])
    pool = dump.scalars["num_full_slots"]
    cells = [f for f in found if f.slot is not None and f.slot >= 0]
    slots = (
        distinct(np.concatenate([cell_slots(f) for f in cells]).astype(np.int64))
        if cells
        else np.zeros(0, dtype=np.int64)
    )
    slots = slots[slots >= 0]
    past = ""
    if slots.size:
        where = _cell_owner(cells[0])
        held = f", the first held by {where}," if where else ""
        # counted, not listed: `span` lives with the chains, a module a lone cause never enters
        lo, hi = int(slots[0]), int(slots[-1])
        past = (
            f"; live full slot {lo}{held} lies past its end"
            if slots.size == 1
            else f"; {slots.size} live full slots in {lo}..{hi}{held} lie past its end"
        )
    last = None if lut is None or not lut_len else lut.element(-1)
    ends = (
        ""
        if last is None
        else ": allocated too small, not sliced"
        if last == -1
        else f": sliced (it ends in {last}, not -1)"
    )
    if pool.value is None or pool.assumed:
        return (
            f"full_to_swa_index_mapping has {lut_len} entries{past}: a LUT too short for the "
            "pool, or corrupt slot indices no pool holds; record num_full_slots to decide"
        )
    return (
        f"full_to_swa_index_mapping has {lut_len} entries for a full pool of {pool.value} "
        f"slots (it needs {pool.value + 1}){ends}{past}"
    )


def _slot_corrupt(dump: KvDump, found: list[Finding]) -> str:
    cells = [f for f in found if f.slot is not None]
    f = cells[0] if cells else found[0]
    pool = dump.scalars["num_full_slots"].value
    slot = -1 if f.slot is None else f.slot
    why = (
        "negative"
        if slot < 0
        else f"beyond the full pool of {pool} slots"
        if pool is not None
        else "beyond the full pool"
    )
    parts = [cell_slots(g).astype(np.int64) for g in cells]
    bad = distinct(np.concatenate(parts)) if parts else np.zeros(1, dtype=np.int64)
    b, r, q = f.batch_row, f.pool_row, f.position
    where = f"batch row {b} (pool row {r}) holds" if b is not None else "a live cell holds"
    at = f" at position {q}" if q is not None else ""
    return (
        f"{where} slot {slot}{at}, {why}{_more(int(bad.size) - 1, 'slot')}: the producer of "
        "req_to_token's cells (allocation, prefix-cache match, copy between pool rows) wrote "
        "an index no pool holds"
    )


def _batch_corrupt(dump: KvDump, found: list[Finding]) -> str:
    bad = [f for f in found if f.code in _BATCH_CODES] or found
    f = bad[0]
    if f.batch_row is not None and f.batch_row >= 0:
        pool = int(dump.req_pool_indices[f.batch_row])
        head = f"batch row {f.batch_row} (pool row {pool}): "
    else:
        head = ""
    return (
        f"{head}{f.message}{_more(len(bad) - 1, 'batch finding')}; the batch metadata is "
        "wrong, and the cells read through it are symptoms"
    )


_BUILDERS = {
    CauseCode.LUT_TOO_SHORT: _lut_short,
    CauseCode.SLOT_INDEX_CORRUPT: _slot_corrupt,
    CauseCode.BATCH_METADATA_CORRUPT: _batch_corrupt,
    CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW: _cleared_in_window,
    CauseCode.SWA_MAPPING_COLLISION: _collision,
    CauseCode.SWA_WRITE_INTO_LIVE_SLOT: _swa_write,
    CauseCode.WRITE_INTO_LIVE_SLOT: _full_write,
    CauseCode.SWA_MAPPING_REWRITTEN: _rewritten,
    CauseCode.UNWRITTEN_CELLS: _unwritten,
    CauseCode.RADIX_PREFIX_BROKEN: _copied,
    CauseCode.SWA_LEAK: _swa_leak,
    CauseCode.FULL_LEAK: _full_leak,
    CauseCode.TREE_LOCK_LEAK: _lock_leak,
    CauseCode.CROSS_REQUEST_ALIASING: _aliasing,
}

#: What a nested cause adds, as its parent's headline says it (`this also shows as ...`).
_SHOWN_AS = {
    CauseCode.DOUBLE_FREE: "a double free",
    CauseCode.STALE_SWA_MAPPING: "stale LUT entries",
    CauseCode.SWA_SHARED_OWNER: "a second full owner",
    CauseCode.SWA_FREED_WHILE_LIVE: "an SWA page freed while live",
    CauseCode.SWA_MAPPING_REWRITTEN: "entries out of their page's lockstep",
    CauseCode.SWA_MAPPING_COLLISION: "a mapping collision",
    CauseCode.SWA_WRITE_INTO_LIVE_SLOT: "a write into a live SWA slot",
    CauseCode.PARTIAL_PAGE_FREE: "a partial-page free",
    CauseCode.SWA_PAGE_REISSUED: "a reissued SWA page",
    CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW: "entries cleared in the window",
    CauseCode.SWA_LEAK: "a leak",
    CauseCode.LUT_TOO_SHORT: "a LUT shorter than the pool",
}


def _shows_as(code: CauseCode, found: list[Finding], page: int) -> str:
    """`a double free of SWA slots 0..3`: a nested cause in a clause (where its first
    finding's slots lie, as pages where it counts pages)."""
    what = _SHOWN_AS.get(code, code.value.replace("-", " "))
    with_slots = [f for f in found if f.slot is not None]
    if not with_slots:
        return what
    f = with_slots[0]
    name = "SWA" if f.space is Space.SWA else "full"
    slots = distinct(cell_slots(f).astype(np.int64))
    if f.code in (FindingCode.SWA_PAGE_LEAKED, FindingCode.FULL_PAGE_LEAKED) and page > 1:
        pages = distinct(slots // page)
        where = (
            f"{name} {_page_text(int(pages[0]), page)}"
            if pages.size == 1
            else f"{name} pages {span(pages)}"
        )
    else:
        where = f"{name} slot{'s' if slots.size > 1 else ''} {span(slots)}"
    return f"{what} of {where}"


def _sentence(found: list[Finding], step: tuple[str, str]) -> str:
    space = found[0].space
    same = [f for f in found if f.space == space]
    spans = [s for f in same if (s := f.span) is not None and s.slots is not None]
    name = "SWA" if space is Space.SWA else "full"
    if spans:
        lo = min(s.slots[0] for s in spans if s.slots)
        hi = max(s.slots[1] for s in spans if s.slots)
        count = spans[0].distinct_slots if len(spans) == 1 else hi - lo + 1
    else:
        lo = hi = int(same[0].slot or 0)
        count = 1
    if count == 1 and lo == hi:
        slots = f"{name} slot {lo}"
    elif hi - lo + 1 == count or len(spans) > 1:
        slots = f"{name} slots {lo}..{hi}"
    else:
        slots = f"{name} slots {lo}..{hi} ({count} of them)"
    verb = step[0] if count == 1 and lo == hi else step[1]
    owners = [o for f in same for o in f.owners if o.pool_row is not None]
    if not owners:
        held = "it" if count == 1 and lo == hi else "them"
        return f"{slots} {verb}; no pool row holds {held}"
    return f"{slots}, {_owners_clause(owners, one_slot=count == 1 and lo == hi)}, {verb}"


def _owners_clause(owners: list[FindingOwner], *, one_slot: bool) -> str:
    """`last held by idle pool row 5 (position 68)`, `held by batch row 3 (pool row 9,
    running) and pool row 5 (finished)`: each pool row once, the first few named."""
    by_row: dict[tuple[int | None, str | None], FindingOwner] = {}
    for o in owners:
        by_row.setdefault((o.pool_row, o.state), o)
    where = _where if len(by_row) == 1 else _nowhere
    named = [_owner(o, where(o, one_slot)) for o in list(by_row.values())[:_OWNERS_NAMED]]
    more = len(by_row) - len(named)
    if more > 0:
        named.append(f"{more} more pool row{'s' if more > 1 else ''}")
    current = all(o.state in ("running", "held") for o in by_row.values())
    last = all(o.state not in ("running", "held") for o in by_row.values())
    label = "held by" if current else "last held by" if last else "held or last held by"
    return f"{label} {' and '.join(named)}"


def _where(o: FindingOwner, one_slot: bool) -> str:
    return f"position {o.position}" if one_slot else f"slot {o.slot} at position {o.position}"


def _nowhere(o: FindingOwner, one_slot: bool) -> str:
    return ""


def _owner(o: FindingOwner, at: str) -> str:
    """`batch row 3 (pool row 9, position 12, running)`, `idle pool row 5 (position 68)`."""
    at = f"{at}, " if at else ""
    match o.state:
        case "running":
            return f"batch row {o.batch_row} (pool row {o.pool_row}, {at}running)"
        case "held":
            return f"pool row {o.pool_row} ({at}running, not in this batch)"
        case "finished":
            return f"pool row {o.pool_row} ({at}finished)"
        case "stale-tail":
            return f"pool row {o.pool_row} ({at}a finished request's stale tail)"
    return f"idle pool row {o.pool_row}" + (f" ({at[:-2]})" if at else "")
