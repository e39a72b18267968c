"""Diagnosis: from symptoms (findings) to causes (what to fix), ranked most likely first.

A finding is a symptom at one cell or row; a cause explains a group of them and names the fix
(docs/findings.md, "Diagnosis"). Row-level causes claim their rows' symptoms first (corrupt
batch metadata, a recycled row read through a too-long prefix); the LUT-versus-slot question
is decided from the recorded pool size when there is one, from the other evidence when there
is not; every other symptom maps to the cause its code names. When the evidence does not
decide, the losing cause is kept as `possible` instead of being dropped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from kvcanary_cli.analysis.cells import cell_slots, distinct, pairs_among, restricted
from kvcanary_cli.analysis.model import (
    Assumption,
    Cause,
    CauseCode,
    Confidence,
    Finding,
    FindingCode,
    RequestSummary,
    Role,
    Space,
)
from kvcanary_cli.analysis.violations.report import CAUSES as EXPLANATION_CAUSES
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import SCALARS
from kvcanary_cli.planners.frame import GPU_MAX_BS

__all__ = [
    "assumptions_of",
    "diagnose",
    "request_summaries",
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
#: one code, one cause, when no row-level or LUT-level cause claims the finding first.
_BY_CODE: dict[FindingCode, CauseCode] = {
    FindingCode.FREE_LIST_DUPLICATE: CauseCode.DOUBLE_FREE,
    FindingCode.RESERVED_SLOT_IN_USE: CauseCode.RESERVED_SLOT_FREED,
    FindingCode.FREE_SLOT_STILL_MAPPED: CauseCode.STALE_SWA_MAPPING,
    FindingCode.SWA_SLOT_FREE_AND_MAPPED: CauseCode.STALE_SWA_MAPPING,
    FindingCode.SWA_SLOT_SHARED_OWNER: CauseCode.SWA_SHARED_OWNER,
    FindingCode.SWA_WRITE_TO_LIVE_SLOT: CauseCode.SWA_WRITE_INTO_LIVE_SLOT,
    FindingCode.SLOT_SHARED_WITHOUT_PREFIX: CauseCode.RADIX_PREFIX_BROKEN,
    FindingCode.SWA_PAGE_LEAKED: CauseCode.SWA_LEAK,
    FindingCode.FULL_PAGE_LEAKED: CauseCode.FULL_LEAK,
    FindingCode.NEGATIVE_SLOT: CauseCode.SLOT_INDEX_CORRUPT,
    FindingCode.FREED_SLOT_IN_LIVE_RANGE: CauseCode.USE_AFTER_FREE,
    FindingCode.SLOT_SHARED_ACROSS_POSITIONS: CauseCode.CROSS_REQUEST_ALIASING,
    FindingCode.DUPLICATE_SLOT_IN_ROW: CauseCode.SLOT_REUSED_WITHIN_REQUEST,
    FindingCode.PADDING_SLOT_IN_LIVE_RANGE: CauseCode.UNWRITTEN_CELLS,
    FindingCode.SWA_UNMAPPED_IN_WINDOW: CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW,
    FindingCode.SWA_SLOT_COLLISION: CauseCode.SWA_MAPPING_COLLISION,
    FindingCode.WRITE_TO_LIVE_SLOT: CauseCode.WRITE_INTO_LIVE_SLOT,
    FindingCode.EXPECTED_TOKEN_OUT_OF_RANGE: CauseCode.EXPECTED_TOKEN_POOL_MISMATCH,
    FindingCode.VERIFY_CAPACITY_OVERFLOW: CauseCode.VERIFY_CAPACITY_OVERFLOW,
    FindingCode.KERNEL_LIMIT_EXCEEDED: CauseCode.KERNEL_LIMIT,
    FindingCode.KERNEL_DIVERGENCE: CauseCode.PLANNER_DIVERGENCE,
    FindingCode.GPU_DTYPE_MISMATCH: CauseCode.NONCANONICAL_DTYPE,
    FindingCode.LUT_SENTINEL_MISSING: CauseCode.LUT_SENTINEL_OVERWRITTEN,
    FindingCode.SCALAR_OUT_OF_RANGE: CauseCode.SCALAR_METADATA_CORRUPT,
}
_SUMMARY: dict[CauseCode, str] = {
    CauseCode.DOUBLE_FREE: "a slot is on a free list twice: it was freed twice, and will be "
    "handed out to two owners",
    CauseCode.RESERVED_SLOT_FREED: "the reserved padding slot (page 0) is on a free list or "
    "mapped: an allocator can hand it out",
    CauseCode.STALE_SWA_MAPPING: "LUT entries outlived their frees: free full slots still map to "
    "SWA slots, or free SWA slots are still mapped",
    CauseCode.SWA_SHARED_OWNER: "one SWA slot has several full owners in the LUT: freeing a "
    "stale or cached owner frees a live request's SWA KV",
    CauseCode.SWA_WRITE_INTO_LIVE_SLOT: "this step's writes land, through the LUT, on SWA slots "
    "other requests hold in their windows",
    CauseCode.PARTIAL_PAGE_FREE: "pages freed in part: some tokens of a full page still map to "
    "an SWA page the allocator released whole, the others were cleared",
    CauseCode.SWA_FREED_WHILE_LIVE: "SWA pages on the free list while live requests still map "
    "them: the next allocation hands their KV to another request",
    CauseCode.SWA_MAPPING_REWRITTEN: "LUT entries out of their pages' lockstep: a full page's "
    "tokens map to other offsets or other SWA pages, which no page allocation does",
    CauseCode.RADIX_PREFIX_BROKEN: "rows share a slot at one position without sharing the "
    "prefix before it: a copied cell, not radix sharing",
    CauseCode.SWA_LEAK: "SWA pages that are neither free nor mapped from a held full slot: "
    "leaked (SGLang aborts with 'SWA Pool Mem Leak Detected' once enough are gone)",
    CauseCode.FULL_LEAK: "full-pool pages neither free, nor the radix tree's, nor a running "
    "request's: leaked (SGLang's 'pool memory leak detected!')",
    CauseCode.LUT_TOO_SHORT: "the SWA LUT is shorter than the full pool: valid slots fall "
    "off its end",
    CauseCode.SLOT_INDEX_CORRUPT: "slot indices that cannot be right in any pool: the "
    "producer of the slot indices is wrong",
    CauseCode.BATCH_METADATA_CORRUPT: "the batch metadata itself is wrong (pool rows, "
    "lengths): the cells read through it are symptoms",
    CauseCode.STALE_ROW_READ: "a recycled pool row read through a too-long prefix: the live "
    "range runs into the stale tail of an earlier owner",
    CauseCode.USE_AFTER_FREE: "live slots are on the allocator's free list",
    CauseCode.CROSS_REQUEST_ALIASING: "one slot is live at different positions of two requests",
    CauseCode.SLOT_REUSED_WITHIN_REQUEST: "one slot sits at two live positions of one request",
    CauseCode.UNWRITTEN_CELLS: "live prefix cells hold slot 0: never written, or zeroed",
    CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW: "SWA peers freed while their tokens are still in "
    "the window",
    CauseCode.SWA_MAPPING_COLLISION: "two live full slots map to one SWA slot",
    CauseCode.WRITE_INTO_LIVE_SLOT: "this step writes slots that other requests still hold",
    CauseCode.LUT_SENTINEL_OVERWRITTEN: "the LUT's trailing -1 is gone",
    CauseCode.EXPECTED_TOKEN_POOL_MISMATCH: "the expected-token pool is smaller than its "
    "valid lengths say",
    CauseCode.VERIFY_CAPACITY_OVERFLOW: "more verify entries than capacity: the verify launch "
    "is skipped this step",
    CauseCode.KERNEL_LIMIT: "the GPU plan path refuses this batch",
    CauseCode.NONCANONICAL_DTYPE: "tensors in dtypes the production GPU path rejects",
    CauseCode.PLANNER_DIVERGENCE: "the reference and the kernel disagree where no finding "
    "explains it",
    CauseCode.KV_OVERWRITTEN: "the KV bytes of live slots changed after the canary "
    "fingerprinted them",
    CauseCode.SCALAR_METADATA_CORRUPT: "a scalar the dump records is not one SGLang could "
    "have used",
    CauseCode.FOREIGN_CANARY_RECORD: "verified slots hold canary records of a writer the "
    "dump does not show",
}
_FIX: dict[CauseCode, str] = {
    CauseCode.DOUBLE_FREE: "find the second free of these slots (a request freed twice, a "
    "free group flushed twice, a tombstone freed after its slot was reused)",
    CauseCode.RESERVED_SLOT_FREED: "never put page 0 on a free list: find the free that passed "
    "padding slots (filter slot 0 before freeing)",
    CauseCode.STALE_SWA_MAPPING: "clear the LUT for every token of every page free_swa "
    "releases (with page_size > 1, the whole page, not only the tokens passed) before the full "
    "slots go back",
    CauseCode.SWA_SHARED_OWNER: "track the owner of each SWA slot and let only that owner free "
    "it; clear a replaced or tombstoned full slot's mapping when its SWA slot is reused",
    CauseCode.SWA_WRITE_INTO_LIVE_SLOT: "recompute the SWA write targets from the current LUT "
    "(a cached swa_out_cache_loc or translation outlived a mapping change)",
    CauseCode.PARTIAL_PAGE_FREE: "with page_size > 1, clear the LUT for every token of each "
    "page free_swa releases, not only the tokens passed (SGLang PR #27779); a later free of the "
    "stale tokens double-frees the page",
    CauseCode.SWA_FREED_WHILE_LIVE: "find the free that released a mapped SWA page: a deferred "
    "free group holding a page a recovery or replacement mapped again (SGLang PR #36135), or a "
    "free by an owner that no longer owns the page (PRs #25385, #25270)",
    CauseCode.SWA_MAPPING_REWRITTEN: "map and clear the LUT per page, full and SWA pages "
    "together; find the code that set single entries (a cached translation, a tombstone "
    "recovery, a copy of one token's mapping)",
    CauseCode.SWA_LEAK: "find the path that clears a mapping without freeing its SWA page (an "
    "eviction or tombstone that drops the LUT entry, a failed allocation that keeps the page; "
    "SGLang issue #27789 with speculative decoding and page_size > 1)",
    CauseCode.FULL_LEAK: "find the path that dropped these pages' owner without freeing them "
    "(a request released without its KV, a tree node removed without its free); the table "
    "cells that still hold them, in the provenance, say who had them last",
    CauseCode.RADIX_PREFIX_BROKEN: "find what wrote another request's slot into this row "
    "(a copy between rows, a prefix match that did not start at position 0, a fault "
    "injector); radix sharing always shares the whole prefix",
    CauseCode.LUT_TOO_SHORT: "size full_to_swa_index_mapping from the full pool (num_full_slots "
    "+ 1 entries, the last one -1) and pass the allocator's mapping itself, not a slice of it; "
    "the slots are fine",
    CauseCode.SLOT_INDEX_CORRUPT: "find what wrote these req_to_token cells (allocation, "
    "prefix-cache match, copy between rows); the LUT is not at fault",
    CauseCode.BATCH_METADATA_CORRUPT: "fix how req_pool_indices / prefix_lens / "
    "extend_seq_lens are built for the batch (ForwardBatch); ignore the cell symptoms until then",
    CauseCode.STALE_ROW_READ: "the prefix length of this request is larger than what its row "
    "holds: check prefix_lens (chunked prefill, retraction, radix match) for this request",
    CauseCode.USE_AFTER_FREE: "find who freed these slots while a request still held them "
    "(free on finish or retract, radix eviction of a locked node)",
    CauseCode.CROSS_REQUEST_ALIASING: "find how a slot of one request was copied into another "
    "at another position (prefix-cache match, row reuse without reset)",
    CauseCode.SLOT_REUSED_WITHIN_REQUEST: "the allocator handed the same slot out twice to one "
    "request, or a copy within the row went wrong",
    CauseCode.UNWRITTEN_CELLS: "find why these positions were never written (skipped "
    "allocation, zeroed row, prefix length past the written part)",
    CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW: "the out-of-window eviction freed SWA peers of "
    "tokens still inside the window: check the eviction threshold against the window",
    CauseCode.SWA_MAPPING_COLLISION: "an SWA slot was handed out twice, or a free skipped the "
    "SWA side and left a stale mapping",
    CauseCode.WRITE_INTO_LIVE_SLOT: "the allocator returned a slot still in use: check frees "
    "and the free list",
    CauseCode.LUT_SENTINEL_OVERWRITTEN: "keep the LUT's last entry at -1 (it makes a clamp "
    "land on 'no slot')",
    CauseCode.EXPECTED_TOKEN_POOL_MISMATCH: "size req_to_verify_expected_tokens to the "
    "request lengths, or fix its valid lengths",
    CauseCode.VERIFY_CAPACITY_OVERFLOW: "raise the verify capacity (ServerArgs / pool sizing)",
    CauseCode.KERNEL_LIMIT: f"keep bs at most {GPU_MAX_BS} (the GPU plan path's block size) "
    "and at most write_req_capacity",
    CauseCode.NONCANONICAL_DTYPE: "store the tensors in the dtypes the GPU path requires (or "
    "ignore: kvcanary read them anyway)",
    CauseCode.PLANNER_DIVERGENCE: "report it to kvcanary with this dump: the kernel model and "
    "the reference disagree",
    CauseCode.KV_OVERWRITTEN: "find what wrote into these slots' KV after their step (a kernel "
    "writing out of bounds, a copy or transfer into the wrong pages)",
    CauseCode.SCALAR_METADATA_CORRUPT: "check what recorded the scalar (the capture hook's "
    "server context); rerun with the real value through its option",
    CauseCode.FOREIGN_CANARY_RECORD: "trace the slots with `kvcanary provenance --slot`: they "
    "were rewritten by a sequence outside this batch (a transfer, a finished request, a "
    "misplaced page)",
}
#: The cause of a canary finding, from its explanation (docs/canary.md §7) when no symptom
#: in req_to_token or the allocator claimed it first.
_CANARY_CODES = frozenset(
    {
        FindingCode.CANARY_CHAIN_BREAK,
        FindingCode.CANARY_POSITION_MISMATCH,
        FindingCode.CANARY_TOKEN_MISMATCH,
        FindingCode.CANARY_REAL_KV_MISMATCH,
    }
)
_BY_EXPLANATION: dict[str, CauseCode] = {
    "aliasing": CauseCode.CROSS_REQUEST_ALIASING,
    "duplicate-in-row": CauseCode.SLOT_REUSED_WITHIN_REQUEST,
    "use-after-free": CauseCode.USE_AFTER_FREE,
    "stale-slot": CauseCode.USE_AFTER_FREE,
    "stale-row": CauseCode.STALE_ROW_READ,
    "kv-overwritten": CauseCode.KV_OVERWRITTEN,
}
#: The explanation of a chain break caused by the bad record before it.
_FOLLOWS = "follows-bad-record"
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
    explains: Counter[str] = field(default_factory=Counter)


_CAUSES = list(CauseCode)
_UNCLAIMED = -1


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
        entry.explains[self.findings[index].code.value] += taken
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
            values = np.flatnonzero(np.bincount(causes.astype(np.int64) + 1)) - 1
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
    _partial_page_frees(state)
    _swa_freed_while_live(state)
    possible = _lut_or_slots(state)
    for i, f in enumerate(findings):
        if f.code in _BY_CODE:
            state.claim(_BY_CODE[f.code], Confidence.CERTAIN, i)
    _pages_out_of_lockstep(state)
    _canary_records(state)
    causes = [_cause(entry, findings) for entry in state.claims.values() if entry.members]
    causes.extend(possible)
    causes.sort(key=lambda c: (-c.confidence.rank, _PRECEDENCE[c.code], -sum(c.explains.values())))
    return state.split(), tuple(causes)


def _cause(entry: _Claim, findings: list[Finding]) -> Cause:
    return Cause(
        code=entry.code,
        confidence=entry.confidence,
        summary=_SUMMARY[entry.code],
        evidence=tuple(dict.fromkeys(entry.evidence)) or _default_evidence(entry, findings),
        explains=dict(sorted(entry.explains.items(), key=lambda kv: FindingCode(kv[0]).order)),
        fix=_FIX[entry.code],
    )


def _default_evidence(entry: _Claim, findings: list[Finding]) -> tuple[str, ...]:
    """The first findings themselves, when the cause needs no argument beyond its symptoms."""
    members = list(dict.fromkeys(entry.members))
    shown = [findings[i].message for i in members[:3]]
    more = len(members) - len(shown)
    return (*shown, f"... and {more} more") if more > 0 else tuple(shown)


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
            hit = np.isin(cell_slots(f), written)
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
    rows = np.concatenate([f.cells.pool_row for f in repeats if f.cells is not None])
    slots = np.concatenate([cell_slots(f) for f in repeats])
    for i, f in enumerate(findings):
        if f.code is FindingCode.SLOT_SHARED_ACROSS_POSITIONS and f.cells is not None:
            hit = pairs_among(f.cells.pool_row, cell_slots(f), rows, slots)
            state.claim(CauseCode.SLOT_REUSED_WITHIN_REQUEST, Confidence.CERTAIN, i, hit)


def _stale_rows(state: _Diagnosis) -> None:
    """Symptoms that cover most of a row's prefix up to its last position: a stale tail.

    The row must show a symptom of its own there (a freed, unwritten or repeated slot): a row
    whose tail is only shared with other rows is consistent as far as it goes, and the
    sharing is another cause's."""
    findings = state.findings
    prefix = np.maximum(state.dump.prefix_lens, 0)
    bs = int(prefix.shape[0])
    rows, positions, codes, members = [], [], [], []
    for i, f in enumerate(findings):
        # the old owner's tail is full slots; an SWA peer freed in the window is not one
        if f.code not in _STALE_CODES or f.cells is None or f.space is not Space.FULL:
            continue
        row = f.cells.batch_row
        inside = state.free(i) & (row >= 0) & (row < bs)
        inside[inside] &= f.cells.position[inside] < prefix[row[inside]]
        if inside.any():
            rows.append(row[inside])
            positions.append(f.cells.position[inside])
            codes.append(np.full(int(inside.sum()), f.code.order, dtype=np.int64))
            members.append(i)
    if not rows:
        return
    row, position, code = np.concatenate(rows), np.concatenate(positions), np.concatenate(codes)
    # distinct positions per row: how much of the prefix the symptoms cover
    order = np.lexsort((position, row))
    r, q = row[order], position[order]
    distinct = np.ones(r.size, dtype=bool)
    distinct[1:] = (r[1:] != r[:-1]) | (q[1:] != q[:-1])
    covered = np.bincount(r[distinct], minlength=bs)
    first = np.full(bs, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, r, q)
    last = np.full(bs, -1, dtype=np.int64)
    np.maximum.at(last, r, q)
    own = np.bincount(row[code != FindingCode.SLOT_SHARED_ACROSS_POSITIONS.order], minlength=bs)
    # At least two cells, ending at the last prefix position, covering most of the run, with
    # a symptom of the row's own among them.
    stale = (covered >= 2) & (last == prefix - 1) & (2 * covered >= prefix - first) & (own > 0)
    if not stale.any():
        return
    stale_rows = np.flatnonzero(stale)
    for i in members:
        cells = findings[i].cells
        assert cells is not None
        row_of = np.clip(cells.batch_row, 0, bs - 1)
        mask = stale[row_of] & (cells.position < prefix[row_of]) & (cells.batch_row < bs)
        state.claim(CauseCode.STALE_ROW_READ, Confidence.LIKELY, i, mask & (cells.batch_row >= 0))
    state.evidence(CauseCode.STALE_ROW_READ).extend(
        _stale_row_lines(state, stale_rows, row[stale[row]], code[stale[row]], first)
    )


#: Stale rows the evidence names one by one; the rest are counted in one line.
STALE_ROWS_SHOWN = 5


def _stale_row_lines(
    state: _Diagnosis,
    stale_rows: np.ndarray,
    row: np.ndarray,
    code: np.ndarray,
    first: np.ndarray,
) -> list[str]:
    """One line per stale batch row for the first `STALE_ROWS_SHOWN` (its tail's cells per
    code), then one line counting the others: one sort of the cells, whatever the batch."""
    prefix = np.maximum(state.dump.prefix_lens, 0)
    pool_rows = state.dump.req_pool_indices
    shown = stale_rows[:STALE_ROWS_SHOWN]
    every_code = list(FindingCode)
    # cells per (row, code) of the rows shown, counted in one pass
    named = np.isin(row, shown)
    key = row[named] * len(every_code) + code[named]
    key.sort()
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if key.size else key
    counts = np.diff(np.r_[starts, key.size])
    tallies: dict[int, Counter[str]] = {int(b): Counter() for b in shown.tolist()}
    for k, n in zip(key[starts].tolist(), counts.tolist(), strict=True):
        tallies[k // len(every_code)][every_code[k % len(every_code)].value] = int(n)
    lines = []
    for b in shown.tolist():
        p, start = int(prefix[b]), int(first[b])
        lines.append(
            f"batch row {b} (pool row {int(pool_rows[b])}): positions "
            f"{start}..{p - 1}, the last {p - start} of its prefix of {p}, hold "
            f"{_counted(tallies[b])}; the cells before them are clean"
        )
    more = int(stale_rows.size - shown.size)
    if more > 0:
        rest = int(row.size - int(np.count_nonzero(named)))
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
    tokens = (pages[:, None] * page + np.arange(page, dtype=np.int64)).reshape(-1)
    inside = (tokens >= 0) & (tokens < int(lut.shape[0]) - 1)
    values = np.zeros(tokens.shape, dtype=np.int64)
    values[inside] = lut.take_known(tokens[inside])[0]
    mapped: np.ndarray = (values > 0).reshape(pages.size, page).sum(axis=1)
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
    state.evidence(CauseCode.PARTIAL_PAGE_FREE).append(
        f"{shown}{more}; the rest of each page was cleared: a free that cleared tokens, not pages"
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
            if free.any():
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


def _pages_out_of_lockstep(state: _Diagnosis) -> None:
    """An entry out of its page's lockstep joins the cause of another finding on the same full
    slot (a stale owner, a stale write translation); alone, it is a mapping rewritten."""
    known = _SlotCauses()
    for i, f in enumerate(state.findings):
        full = _full_slots(f)
        if full is not None:
            claimed = state.cause_of[i] != _UNCLAIMED
            known.add("full", full[claimed], state.cause_of[i][claimed])
    for i, f in enumerate(state.findings):
        if f.code is not FindingCode.SWA_PAGE_OUT_OF_LOCKSTEP:
            continue
        joined = known.lookup("full", cell_slots(f))
        for value in np.unique(joined[joined != _UNCLAIMED]).tolist():
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
        for value in np.unique(joined[joined != _UNCLAIMED]).tolist():
            state.claim(_CAUSES[value], Confidence.LIKELY, i, joined == value)
        explained = _cell_explanations(f)
        for name in sorted(set(explained.tolist()) - {_FOLLOWS}):
            own = _BY_EXPLANATION.get(name, CauseCode.FOREIGN_CANARY_RECORD)
            state.claim(own, Confidence.LIKELY, i, explained == name)
        claimed = state.cause_of[i] != _UNCLAIMED
        known.add(f.space, slots[claimed], state.cause_of[i][claimed])
        if not claimed.all():
            follows.append(i)
    for i in follows:
        f = findings[i]
        joined = known.lookup(f.space, _cell_prev_slots(f))
        for value in np.unique(joined[joined != _UNCLAIMED]).tolist():
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
            summary=_SUMMARY[second],
            evidence=(
                "num_full_slots is not recorded, so the pool size cannot rule it out",
                *evidence,
            ),
            explains=dict(state.claims[first].explains),
            fix=_FIX[second],
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


def assumptions_of(dump: KvDump, findings: list[Finding]) -> list[Assumption]:
    """The derived scalars findings rest on, with what to record to decide them."""
    decides: dict[str, Counter[str]] = {}
    for f in findings:
        for name in f.assumes:
            decides.setdefault(name, Counter())[f.code.value] += f.count
    out = []
    for name, counts in decides.items():
        scalar = dump.scalars[name]
        spec = SCALARS[name]
        out.append(
            Assumption(
                scalar=name,
                value=scalar.value,
                source=scalar.source,
                decides=dict(counts),
                advice=f"record {name} ({spec.meaning}) in the dump's metadata, or pass "
                f"{spec.option}, to turn these into facts",
            )
        )
    return out


def request_summaries(dump: KvDump, findings: list[Finding]) -> list[RequestSummary]:
    """One summary per batch row with findings, in batch order (counted per cell)."""
    bs = dump.bs
    codes = list(FindingCode)
    counts = np.zeros((len(codes), bs), dtype=np.int64)
    first_bad = np.full(bs, np.iinfo(np.int64).max, dtype=np.int64)
    for f in findings:
        if f.cells is None:
            if f.batch_row is None or not 0 <= f.batch_row < bs:
                continue
            counts[f.code.order, f.batch_row] += 1
            if f.position is not None:
                first_bad[f.batch_row] = min(first_bad[f.batch_row], f.position)
            continue
        row = f.cells.batch_row
        inside = (row >= 0) & (row < bs)
        counts[f.code.order] += np.bincount(row[inside], minlength=bs)
        np.minimum.at(first_bad, row[inside], f.cells.position[inside])
    rpi, prefix, extend = dump.req_pool_indices, dump.prefix_lens, dump.extend_seq_lens
    out = []
    for batch_row in np.flatnonzero(counts.any(axis=0)).tolist():  # rows with findings
        per_code = counts[:, batch_row]
        bad = int(first_bad[batch_row])
        out.append(
            RequestSummary(
                batch_row=batch_row,
                pool_row=int(rpi[batch_row]),
                prefix_len=int(prefix[batch_row]),
                extend_len=int(extend[batch_row]),
                counts={codes[c].value: int(per_code[c]) for c in np.flatnonzero(per_code)},
                first_bad_position=None if bad == np.iinfo(np.int64).max else bad,
            )
        )
    return out
