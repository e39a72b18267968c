"""The catalog: every code kvcanary reports, declared once, with what the reports and the docs
say about it.

Four kinds of code: finding codes (a symptom at a cell, row or tensor, docs/findings.md), causes
(what to fix, the diagnosis's answer), timeline events (a change between two dumps,
docs/timeline.md) and violation-row causes (what a canary violation row most likely means,
docs/canary.md §7). Each is a `StrEnum` (a member serialises as its string), and each member
has exactly one entry in its table (`FINDINGS`, `CAUSES`, `EVENTS`, `VIOLATION_CAUSES`): its
severity, its texts (the diagnosis's summary and fix, the docs' table cells) and the mappings
between kinds (the finding codes a cause explains by default, the violation explanations that
name it, the cause an event belongs to). Every other module names a code by its member, never
by its string; the docs' code tables are generated from these entries
(`python -m tests.docs_tables`).

Member order is meaningful: `FindingCode` is the order of reports (within a severity) and of
the codes table; `CauseCode` is the diagnosis's precedence among equally sure causes.

Adding a bug class: its entries here (a finding code and, when it is a new fault, a cause),
the detector that reports it (or the diagnosis rule that claims it), and the scenario that
plants it (`synth/scenarios.py`); then `python -m tests.docs_tables` and `python -m
tests.render.schema_doc` rewrite the docs' tables and value lists. Nothing else names it:
tests/test_catalog.py fails when a module outside the catalog and the scenarios spells a
code's string.

Standard library only: every layer of the package may import it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import TypeVar

__all__ = [
    "CAUSES",
    "CAUSE_OF_EXPLANATION",
    "CAUSE_OF_FINDING",
    "EVENTS",
    "FINDINGS",
    "VIOLATION_CAUSES",
    "CauseCode",
    "CauseEntry",
    "Confidence",
    "EventEntry",
    "EventKind",
    "FindingCode",
    "FindingEntry",
    "POOL_CAUSES",
    "POOL_CAUSE_OF",
    "POOL_FINDINGS",
    "PoolCause",
    "PoolCauseEntry",
    "PoolCode",
    "PoolFindingEntry",
    "Severity",
    "ViolationCauseEntry",
    "ViolationRowCause",
    "cell_unit",
    "plural",
]


class _Scale(StrEnum):
    """A scale declared from its top down: an earlier member ranks higher."""

    @property
    def rank(self) -> int:
        """Higher is worse (a severity, for `--fail-on`) or surer (a confidence)."""
        members = list(type(self))
        return len(members) - 1 - members.index(self)


class Severity(_Scale):
    """error: the canary or the KV cache is wrong or unsafe; warning: blind or skipped."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Confidence(_Scale):
    """How sure the diagnosis is of a cause."""

    CERTAIN = "certain"
    LIKELY = "likely"
    POSSIBLE = "possible"


class FindingCode(StrEnum):
    """Stable finding identifiers (renaming one breaks the JSON schema)."""

    LUT_OUT_OF_RANGE = "lut-out-of-range"
    LUT_SHORTER_THAN_POOL = "lut-shorter-than-pool"
    SLOT_BEYOND_POOL = "slot-beyond-pool"
    NEGATIVE_SLOT = "negative-slot"
    PADDING_SLOT_IN_LIVE_RANGE = "padding-slot-in-live-range"
    SWA_UNMAPPED_IN_WINDOW = "swa-unmapped-in-window"
    DUPLICATE_SLOT_IN_ROW = "duplicate-slot-in-row"
    SLOT_SHARED_ACROSS_POSITIONS = "slot-shared-across-positions"
    SLOT_SHARED_WITHOUT_PREFIX = "slot-shared-without-prefix"
    SWA_SLOT_COLLISION = "swa-slot-collision"
    FREED_SLOT_IN_LIVE_RANGE = "freed-slot-in-live-range"
    WRITE_TO_LIVE_SLOT = "write-to-live-slot"
    SWA_WRITE_TO_LIVE_SLOT = "swa-write-to-live-slot"
    FREE_SLOT_STILL_MAPPED = "free-slot-still-mapped"
    SWA_SLOT_FREE_AND_MAPPED = "swa-slot-free-and-mapped"
    SWA_SLOT_SHARED_OWNER = "swa-slot-shared-owner"
    SWA_PAGE_OUT_OF_LOCKSTEP = "swa-page-out-of-lockstep"
    FREE_LIST_DUPLICATE = "free-list-duplicate"
    RESERVED_SLOT_IN_USE = "reserved-slot-in-use"
    SWA_PAGE_LEAKED = "swa-page-leaked"
    FULL_PAGE_LEAKED = "full-page-leaked"
    FULL_SLOT_FREE_AND_HELD = "full-slot-free-and-held"
    FULL_SLOT_HELD_TWICE = "full-slot-held-twice"
    ROW_OUT_OF_RANGE = "row-out-of-range"
    PREFIX_BEYOND_ROW = "prefix-beyond-row"
    DUPLICATE_REQUEST_ROW = "duplicate-request-row"
    REQ_ROW_FREE_AND_HELD = "req-row-free-and-held"
    REQ_ROW_HANDED_OUT_TWICE = "req-row-handed-out-twice"
    REQ_ROW_LEAKED = "req-row-leaked"
    TREE_LOCK_LEAKED = "tree-lock-leaked"
    VIRTUAL_PAGE_FREE_AND_BOUND = "virtual-page-free-and-bound"
    VIRTUAL_PAGE_UNBOUND = "virtual-page-unbound"
    PAGE_TABLE_MISMATCH = "page-table-mismatch"
    PHYSICAL_PAGE_SHARED = "physical-page-shared"
    PAGE_TABLE_SIZE_MISMATCH = "page-table-size-mismatch"
    PHYSICAL_HOLE_INVALID = "physical-hole-invalid"
    PAGE_TABLE_SENTINEL_OVERWRITTEN = "page-table-sentinel-overwritten"
    MAMBA_SLOT_FREE_AND_HELD = "mamba-slot-free-and-held"
    MAMBA_SLOT_OWNED_TWICE = "mamba-slot-owned-twice"
    MAMBA_SLOT_FREED_TWICE = "mamba-slot-freed-twice"
    MAMBA_RESERVED_SLOT_IN_USE = "mamba-reserved-slot-in-use"
    MAMBA_ROW_MAP_MISMATCH = "mamba-row-map-mismatch"
    MAMBA_SLOT_LEAKED = "mamba-slot-leaked"
    MAMBA_SLOT_BEYOND_POOL = "mamba-slot-beyond-pool"
    HOST_SLOT_FREE_AND_HELD = "host-slot-free-and-held"
    HOST_SLOT_HELD_TWICE = "host-slot-held-twice"
    HOST_SLOT_FREED_TWICE = "host-slot-freed-twice"
    HOST_SLOT_OUT_OF_RANGE = "host-slot-out-of-range"
    HOST_SLOT_LEAKED = "host-slot-leaked"
    VERIFY_TOTAL_IMPLAUSIBLE = "verify-total-implausible"
    SCALAR_OUT_OF_RANGE = "scalar-out-of-range"
    EXPECTED_TOKEN_OUT_OF_RANGE = "expected-token-out-of-range"
    KERNEL_LIMIT_EXCEEDED = "kernel-limit-exceeded"
    KERNEL_DIVERGENCE = "kernel-divergence"
    CANARY_CHAIN_BREAK = "canary-chain-break"
    CANARY_POSITION_MISMATCH = "canary-position-mismatch"
    CANARY_TOKEN_MISMATCH = "canary-token-mismatch"
    CANARY_REAL_KV_MISMATCH = "canary-real-kv-mismatch"
    VERIFY_CAPACITY_OVERFLOW = "verify-capacity-overflow"
    NEGATIVE_LENGTH = "negative-length"
    GPU_DTYPE_MISMATCH = "gpu-dtype-mismatch"
    LUT_SENTINEL_MISSING = "lut-sentinel-missing"

    @property
    def severity(self) -> Severity:
        """The code's severity (its catalog entry)."""
        return FINDINGS[self].severity

    @property
    def order(self) -> int:
        """Position in the codes table: reports list codes in this order within a severity."""
        return _CODE_ORDER[self]


_CODE_ORDER = {code: i for i, code in enumerate(FindingCode)}


class CauseCode(StrEnum):
    """Stable cause identifiers (docs/findings.md, "Diagnosis"): what to fix, not a symptom.

    Equally sure causes rank in this order: allocator mechanisms (a double free, a reserved
    slot handed out, a stale SWA mapping, two owners of an SWA slot) before the symptoms they
    leave in the batch."""

    DOUBLE_FREE = "double-free"
    VIRTUAL_PAGE_FREED_WHILE_BOUND = "virtual-page-freed-while-bound"
    PHYSICAL_PAGE_DOUBLE_FREE = "physical-page-double-free"
    MAMBA_SLOT_FREED_WHILE_HELD = "mamba-slot-freed-while-held"
    MAMBA_SLOT_DOUBLE_FREE = "mamba-slot-double-free"
    MAMBA_RESERVED_SLOT_HANDED_OUT = "mamba-reserved-slot-handed-out"
    MAMBA_ROW_MAP_STALE = "mamba-row-map-stale"
    MAMBA_SLOT_ID_CORRUPT = "mamba-slot-id-corrupt"
    HOST_SLOT_FREED_WHILE_HELD = "host-slot-freed-while-held"
    HOST_SLOT_DOUBLE_FREE = "host-slot-double-free"
    HOST_SLOT_INDEX_CORRUPT = "host-slot-index-corrupt"
    REQ_ROW_DOUBLE_FREE = "req-row-double-free"
    RESERVED_SLOT_FREED = "reserved-slot-freed"
    PARTIAL_PAGE_FREE = "partial-page-free"
    SWA_PAGE_REISSUED = "swa-page-reissued"
    SWA_BOUNDARY_PAGE_CLEARED = "swa-boundary-page-cleared"
    STALE_SWA_MAPPING = "stale-swa-mapping"
    SWA_SHARED_OWNER = "swa-shared-owner"
    SWA_FREED_WHILE_LIVE = "swa-freed-while-live"
    SWA_WRITE_INTO_LIVE_SLOT = "swa-write-into-live-slot"
    SWA_MAPPING_REWRITTEN = "swa-mapping-rewritten"
    RADIX_PREFIX_BROKEN = "radix-prefix-broken"
    LUT_TOO_SHORT = "lut-too-short"
    SLOT_INDEX_CORRUPT = "slot-index-corrupt"
    BATCH_METADATA_CORRUPT = "batch-metadata-corrupt"
    STALE_ROW_READ = "stale-row-read"
    USE_AFTER_FREE = "use-after-free"
    CROSS_REQUEST_ALIASING = "cross-request-aliasing"
    SLOT_REUSED_WITHIN_REQUEST = "slot-reused-within-request"
    UNWRITTEN_CELLS = "unwritten-cells"
    SWA_MAPPING_CLEARED_IN_WINDOW = "swa-mapping-cleared-in-window"
    SWA_MAPPING_COLLISION = "swa-mapping-collision"
    WRITE_INTO_LIVE_SLOT = "write-into-live-slot"
    LUT_SENTINEL_OVERWRITTEN = "lut-sentinel-overwritten"
    EXPECTED_TOKEN_POOL_MISMATCH = "expected-token-pool-mismatch"
    VERIFY_CAPACITY_OVERFLOW = "verify-capacity-overflow"
    KERNEL_LIMIT = "kernel-limit"
    NONCANONICAL_DTYPE = "noncanonical-dtype"
    PLANNER_DIVERGENCE = "planner-divergence"
    KV_OVERWRITTEN = "kv-overwritten"
    SCALAR_METADATA_CORRUPT = "scalar-metadata-corrupt"
    FOREIGN_CANARY_RECORD = "foreign-canary-record"
    #: last among equals: a page is often leaked by a fault ranked above (a mapping
    #: overwritten or cleared without its free).
    SWA_LEAK = "swa-leak"
    FULL_LEAK = "full-leak"
    REQ_ROW_LEAK = "req-row-leak"
    TREE_LOCK_LEAK = "tree-lock-leak"
    PAGE_TABLE_CORRUPT = "page-table-corrupt"
    MAMBA_SLOT_LEAK = "mamba-slot-leak"
    HOST_SLOT_LEAK = "host-slot-leak"
    #: no page is lost: SGLang's own sum is wrong (`kvcanary leak LINE DUMP` says so).
    SGLANG_MISCOUNT = "sglang-miscount"


class EventKind(StrEnum):
    """Stable identifiers of the events a timeline finds between two dumps (docs/timeline.md):
    each is a change no single dump can date."""

    DOUBLE_ALLOCATION = "double-allocation"
    USE_AFTER_FREE = "use-after-free"
    PREFIX_REWRITTEN = "prefix-rewritten"
    LUT_REWRITTEN = "lut-rewritten"
    SWA_LEAK = "swa-leak"

    @property
    def default_cause(self) -> CauseCode:
        """The cause an event belongs to when no finding of its dump names one."""
        return EVENTS[self].cause


class ViolationRowCause(StrEnum):
    """What a violation row most likely means (docs/canary.md §7), in the order checked."""

    #: a write-kernel row: the token or position written is not the expected one.
    WRITE_CHECK = "write-check"
    #: the stored position belongs to another live row holding the same slot.
    ALIASING = "aliasing"
    #: the stored position belongs to another position of the very row that reads the slot.
    DUPLICATE_IN_ROW = "duplicate-in-row"
    #: the slot is on the free list and no live cell holds it at the stored position.
    USE_AFTER_FREE = "use-after-free"
    #: the stored position belongs to an idle row or a row's stale tail.
    STALE_SLOT = "stale-slot"
    #: no cell holds the slot at the stored position: an unseen writer.
    FOREIGN_RECORD = "foreign-record"
    #: a chain break after a record that is itself broken.
    FOLLOWS_BAD_RECORD = "follows-bad-record"
    #: a chain break at a slot on the free list: the row reads a previous owner's cells.
    STALE_ROW = "stale-row"
    #: any other chain break: the record was written by another sequence.
    CHAIN_BREAK = "chain-break"
    #: only the token differs.
    WRONG_TOKEN = "wrong-token"
    #: only the real-KV fingerprint differs: the KV bytes changed after the write.
    KV_OVERWRITTEN = "kv-overwritten"
    #: the dump has no live cell holding the slot.
    NO_LIVE_CELL = "no-live-cell"


# --- the entries --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class FindingEntry:
    """What the catalog says about a finding code (docs/findings.md, "Finding codes")."""

    severity: Severity
    #: the doc's severity column after the severity itself (when the severity can change).
    severity_note: str = ""
    #: the doc's columns: under which group it is reported, when, what it usually means.
    group: str
    when: str
    meaning: str


@dataclass(frozen=True, kw_only=True)
class CauseEntry:
    """What the catalog says about a cause (docs/findings.md, "Diagnosis: causes")."""

    #: what went wrong, and what to change (a diagnosis's `summary` and `fix`).
    summary: str
    fix: str
    #: the fix for a dump whose pages are single slots (page_size 1), where `fix` gives
    #: advice for larger pages (None: `fix` holds at every page size).
    fix_page_size_1: str | None = None
    #: the doc's "evidence that points to it".
    evidence: str
    #: what went wrong with the cause's slots, as its headline says it after them (one slot,
    #: several: `was freed twice`, `were freed twice`); None: the headline is the summary.
    step: tuple[str, str] | None = None
    #: finding codes this cause explains when no row-level or LUT-level cause claims them
    #: first (each code maps to at most one cause).
    findings: tuple[FindingCode, ...] = ()
    #: violation-row explanations that name this cause for a canary finding no other
    #: symptom explains (docs/canary.md §7).
    explanations: tuple[ViolationRowCause, ...] = ()


@dataclass(frozen=True, kw_only=True)
class EventEntry:
    """What the catalog says about a timeline event (docs/timeline.md, "Events")."""

    #: the cause the event belongs to when no finding of its dump names one.
    cause: CauseCode
    #: the doc's "what the timeline saw".
    seen: str


@dataclass(frozen=True, kw_only=True)
class ViolationCauseEntry:
    """What the catalog says about a violation row's cause (docs/canary.md §7)."""

    when: str
    meaning: str


_Code = TypeVar("_Code", bound=StrEnum)
_Entry = TypeVar("_Entry")


def _table(codes: type[_Code], entries: Iterable[tuple[_Code, _Entry]]) -> Mapping[_Code, _Entry]:
    """One entry per member of `codes`, in the members' order (a member missing or listed
    twice is an error at import)."""
    table: dict[_Code, _Entry] = {}
    for code, entry in entries:
        if code in table:
            raise ValueError(f"{codes.__name__}.{code.name} has two catalog entries")
        table[code] = entry
    missing = [code.name for code in codes if code not in table]
    if missing:
        raise ValueError(f"{codes.__name__} members without a catalog entry: {missing}")
    return MappingProxyType({code: table[code] for code in codes})


def _inverse(lists: Mapping[CauseCode, tuple[_Code, ...]]) -> Mapping[_Code, CauseCode]:
    """Members listed by causes, inverted: member -> the one cause listing it."""
    out: dict[_Code, CauseCode] = {}
    for cause, codes in lists.items():
        for code in codes:
            if code in out:
                raise ValueError(f"{code!r} maps to {out[code]} and {cause}")
            out[code] = cause
    return MappingProxyType(out)


FINDINGS: Mapping[FindingCode, FindingEntry] = _table(
    FindingCode,
    (
        (
            FindingCode.LUT_OUT_OF_RANGE,
            FindingEntry(
                severity=Severity.ERROR,
                group="the planned group (`swa`)",
                when=(
                    "the SWA plan has to translate a slot `≥ lut_len` (as a verify slot, as a "
                    "chain predecessor or as a write seed). SGLang's torch reference stops with "
                    "an error on the first such slot; the GPU path clamps the index to "
                    "`LUT[lut_len − 1]`, which is −1 in a production LUT. Every offending cell "
                    "is listed."
                ),
                meaning=(
                    "the LUT is shorter than the full pool (sliced to the allocated pages, "
                    "sized from the wrong pool), or the slot id itself is corrupt; "
                    "`num_full_slots` decides which"
                ),
            ),
        ),
        (
            FindingCode.LUT_SHORTER_THAN_POOL,
            FindingEntry(
                severity=Severity.ERROR,
                group="`swa`",
                when=(
                    "the recorded (or overridden) `num_full_slots + 1` is larger than "
                    "`lut_len`: the LUT cannot translate the pool's highest slots"
                ),
                meaning="the LUT was sized from another pool or sliced to the allocated pages",
            ),
        ),
        (
            FindingCode.SLOT_BEYOND_POOL,
            FindingEntry(
                severity=Severity.ERROR,
                severity_note="(`info` when `num_full_slots` is derived)",
                group="`full`",
                when=(
                    "a live full slot is `≥ num_full_slots`. Checked when `num_full_slots` is "
                    "known: recorded, given with `--set num_full_slots=N`, or derived as "
                    "`lut_len − 1`"
                ),
                meaning=(
                    "a corrupt slot id; with a derived `num_full_slots`, possibly only a short LUT"
                ),
            ),
        ),
        (
            FindingCode.NEGATIVE_SLOT,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when="a live cell of `req_to_token` is negative",
                meaning=(
                    'a corrupt table entry (for example −1 stored as "no slot"); negative '
                    "slots pass untranslated into the plan, and the canary then reads outside "
                    "its buffer"
                ),
            ),
        ),
        (
            FindingCode.PADDING_SLOT_IN_LIVE_RANGE,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when="a prefix cell holds slot 0",
                meaning=(
                    "the cell was never written or was zeroed; the canary silently skips slot "
                    "0, so that token is unchecked"
                ),
            ),
        ),
        (
            FindingCode.SWA_UNMAPPED_IN_WINDOW,
            FindingEntry(
                severity=Severity.ERROR,
                group="`swa`",
                when=(
                    "a verify-window cell holds a slot `s` with `0 < s < lut_len − 1` and "
                    "`LUT[s] = 0`"
                ),
                meaning=(
                    "the SWA slot paired with this token was released while the token was still "
                    "inside the window, so the SWA canary cannot check it (a LUT never written, "
                    "as in SGLang's per-request SWA ring mode, shows up for every cell)"
                ),
            ),
        ),
        (
            FindingCode.DUPLICATE_SLOT_IN_ROW,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "a pool row holds the same non-zero slot at two or more of its live positions"
                ),
                meaning="slot reuse inside one request: a stale or double allocation",
            ),
        ),
        (
            FindingCode.SLOT_SHARED_ACROSS_POSITIONS,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "one non-zero slot is live at **different** positions in two pool rows. The "
                    "same slot at the same position in several pool rows is radix prefix sharing: "
                    "legitimate, shown in provenance as `shared`, never a finding"
                ),
                meaning=(
                    "cross-request aliasing: a pointer copied from another request, or a slot "
                    "handed out twice"
                ),
            ),
        ),
        (
            FindingCode.SLOT_SHARED_WITHOUT_PREFIX,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "two live pool rows hold the same slot at the same position, but different "
                    "slots just before it. A radix tree shares whole prefixes, so this is a copied "
                    "cell, not sharing. The cell blamed is the one whose position-before differs "
                    "from the others holding the slot; on a tie, the one whose pool row was "
                    "sharing a prefix that the copy broke; when nothing decides, both. A break "
                    "whose cell before is itself a slot no pool holds (0, negative, past the full "
                    "pool) is that cell's echo, not a copy: it is left to the code that reports "
                    "the cell. `cells.extra.slot_before` is the pool row's slot one position "
                    "earlier"
                ),
                meaning=(
                    "a copy between pool rows, a prefix match that did not start at position 0, or "
                    "SGLang's fault injector (`perturb/req_to_token.py`) landing on the same "
                    "position"
                ),
            ),
        ),
        (
            FindingCode.SWA_SLOT_COLLISION,
            FindingEntry(
                severity=Severity.ERROR,
                group="`swa`",
                when=(
                    "the LUT sends two distinct full slots, each inside some verify window, to "
                    "one and the same non-zero SWA slot (the finding's slot is that SWA slot)"
                ),
                meaning=(
                    "a stale LUT entry after a free that skipped the SWA side, or an SWA slot "
                    "handed out twice"
                ),
            ),
        ),
        (
            FindingCode.FREED_SLOT_IN_LIVE_RANGE,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full` or `swa`",
                when=(
                    "the allocator counts a live slot as free: a live full slot listed in "
                    "`free_full_slots`; for the `swa` group, a live full slot whose non-zero "
                    "SWA slot is on `free_swa_slots`. Needs the free lists in the dump"
                ),
                meaning=(
                    "use after free; also typical when a reused pool row is read with a prefix "
                    "length that runs into what its previous owner left behind"
                ),
            ),
        ),
        (
            FindingCode.WRITE_TO_LIVE_SLOT,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "this step writes (through `out_cache_loc`) a non-zero slot that some other "
                    "(pool row, position) still holds as live. Needs `out_cache_loc`"
                ),
                meaning=(
                    "the allocator handed out a slot that is still in use; this step overwrites "
                    "another request's KV"
                ),
            ),
        ),
        (
            FindingCode.SWA_WRITE_TO_LIVE_SLOT,
            FindingEntry(
                severity=Severity.ERROR,
                group="`swa`",
                when=(
                    "this step's write of a full slot (`out_cache_loc`) lands, through the LUT "
                    "(or `swa_out_cache_loc` when the dump records it), on an SWA slot that "
                    "another live cell of the window holds: another request's, or the writing "
                    "request's own. The message says which, and where the target came from. "
                    "Needs `out_cache_loc` and the LUT"
                ),
                meaning=(
                    "a cached full → SWA translation outlived a mapping change (SGLang PR "
                    "#25889): the write overwrites another request's SWA KV"
                ),
            ),
        ),
        (
            FindingCode.FREE_SLOT_STILL_MAPPED,
            FindingEntry(
                severity=Severity.ERROR,
                group="`swa`",
                when=(
                    "a full slot on the full free list whose LUT entry is not 0. SGLang frees "
                    "the SWA peer and clears the entry before the full slot goes back "
                    "(`free_full` expects `LUT[slot] == 0`). About slots, not cells: the cell "
                    "columns hold −1; `cells.extra.swa_slot` is the entry"
                ),
                meaning=(
                    "a free that skipped the SWA side, or cleared only part of a page (SGLang "
                    "PR #27779). With `page_size` > 1 the finding names the pages wholly in it "
                    "and those only in part: a page partly still mapped is the mark of a free "
                    "that handled tokens, not pages"
                ),
            ),
        ),
        (
            FindingCode.SWA_SLOT_FREE_AND_MAPPED,
            FindingEntry(
                severity=Severity.ERROR,
                group="`swa`",
                when=(
                    "an SWA slot on the SWA free list that a full slot outside the batch's live "
                    "cells still maps to (a live cell's is `freed-slot-in-live-range`). Slots, "
                    "not cells; `cells.extra.full_slot` is the mapping full slot"
                ),
                meaning=(
                    "a stale mapping: the SWA page was freed, its LUT entries were not cleared"
                ),
            ),
        ),
        (
            FindingCode.SWA_SLOT_SHARED_OWNER,
            FindingEntry(
                severity=Severity.ERROR,
                group="`swa`",
                when=(
                    "an SWA slot that several full slots map to anywhere in the LUT (live, out "
                    "of the window, cached), reported at each owner that is not an in-window "
                    "cell (owners all in the window: `swa-slot-collision`). Slots, not cells; "
                    "`cells.extra.full_slot` is the owner"
                ),
                meaning=(
                    "a stale or tombstoned full slot kept its mapping after the SWA slot was "
                    "reused (SGLang PRs #27586, #25385, #25270): freeing it frees a live "
                    "request's SWA KV"
                ),
            ),
        ),
        (
            FindingCode.SWA_PAGE_OUT_OF_LOCKSTEP,
            FindingEntry(
                severity=Severity.ERROR,
                group="`swa`",
                when=(
                    "with `page_size` > 1, a mapped LUT entry out of its page's lockstep: "
                    "SGLang allocates, maps and frees full and SWA pages together, so a token "
                    "sits at the same offset of its page in both pools (`slot % page_size == "
                    "LUT[slot] % page_size`) and the mapped tokens of one full page map into "
                    "one SWA page. Named: each entry off its offset, or off the SWA page most "
                    "of its full page's tokens map to (the lower page on a tie). Slots, not "
                    "cells; `cells.extra.swa_slot` is the entry"
                ),
                meaning=(
                    "a mapping written token by token: a stale owner's entry pointed at another "
                    "slot (PRs #27586, #25889), a tombstone recovery or a copy of one token's "
                    "mapping"
                ),
            ),
        ),
        (
            FindingCode.FREE_LIST_DUPLICATE,
            FindingEntry(
                severity=Severity.ERROR,
                group="the list's (`full`, `swa`)",
                when="a slot on a free list twice (`cells.extra.times_listed`)",
                meaning="a double free: the slot will be handed to two owners",
            ),
        ),
        (
            FindingCode.RESERVED_SLOT_IN_USE,
            FindingEntry(
                severity=Severity.ERROR,
                group="the list's",
                when=(
                    "a slot of the reserved padding page (slots `0 .. page_size − 1`, in either "
                    "pool) is on a free list, is a LUT key that maps to an SWA slot, or is an "
                    "SWA slot the LUT maps to (slots `1 .. page_size − 1` of SWA page 0: SWA "
                    "page 0 was freed and handed out, SGLang PR #38519 at page_size > 1); "
                    "where the dump's metadata records `reserved_pages` N > 1 (a page-interleave "
                    "allocator's `shard_size`), a slot of full pages `0 .. N − 1` on "
                    "`free_full_slots` or in a live cell"
                ),
                meaning=(
                    "padding slots were freed or mapped: an allocator can hand the padding page out"
                ),
            ),
        ),
        (
            FindingCode.SWA_PAGE_LEAKED,
            FindingEntry(
                severity=Severity.ERROR,
                group="`swa`",
                when=(
                    "an SWA page that is neither on the SWA free list nor mapped from a full "
                    "slot a running request or the tree holds (SGLang's memory check, per "
                    "page). Needs `held_full_slots` (or the tree's record, `tree_full_slots` "
                    "with the running pool rows' `req_pool_allocated_lens`; or `free_full_slots`: "
                    "every full slot off it counts as held), `free_swa_slots`, recorded "
                    "`num_full_slots` and `num_swa_slots`, and a whole LUT; otherwise not "
                    "checked. With `tree_swa_resident_slots`, a tombstoned tree slot (held full "
                    "side only) holds no SWA page, as in SGLang's own count. Slots, not cells: "
                    "one cell per page (its first slot), `cells.extra.page`"
                ),
                meaning=(
                    "an unmapping that did not free the page (SGLang issue #27789: speculative "
                    "decoding with `page_size > 1`)"
                ),
            ),
        ),
        (
            FindingCode.FULL_PAGE_LEAKED,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "a full-pool slot that is neither on the full free list, nor among the "
                    "slots the radix tree holds (`tree_full_slots`), nor inside a running "
                    "request's allocated cells (`req_pool_allocated_lens`): what SGLang's `pool "
                    "memory leak detected!` counts, named. Needs those three records, "
                    "`free_full_slots` and a recorded `num_full_slots` (the capture hook's "
                    "`leak` dumps have them); otherwise not checked. Slots, not cells: one cell "
                    "per slot; the provenance names the table cells that still hold them (who "
                    "had them last)"
                ),
                meaning=(
                    "an owner dropped without its free (a request released without its KV, a "
                    "tree node removed without freeing it)"
                ),
            ),
        ),
        (
            FindingCode.FULL_SLOT_FREE_AND_HELD,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "a full slot on `free_full_slots` inside the allocated cells "
                    "(`req_pool_allocated_lens`, a whole `req_to_token`) of a running request "
                    "outside the batch (a batch row's are `freed-slot-in-live-range`'s), or one "
                    "the radix tree holds (`tree_full_slots`) and no running request. One cell "
                    "per held cell; the tree's have no pool row"
                ),
                meaning=(
                    "use after free before anyone reads them again: slots freed while a "
                    "request runs (a radix node's value freed under its lock) or while the tree "
                    "caches them, which the next allocation hands to another owner"
                ),
            ),
        ),
        (
            FindingCode.FULL_SLOT_HELD_TWICE,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "a full slot the radix tree does not hold (`tree_full_slots`) inside the "
                    "allocated cells (`req_pool_allocated_lens`) of two running requests, or "
                    "twice in one, one of them outside the batch (the batch's own live cells "
                    "are `slot-shared-across-positions`'s). Needs those records and a whole "
                    "`req_to_token`; otherwise not checked. One cell per holding cell"
                ),
                meaning=(
                    "a slot freed while a request held it and handed to another: both write "
                    "their KV into it (cross-request aliasing before either reads the other's)"
                ),
            ),
        ),
        (
            FindingCode.ROW_OUT_OF_RANGE,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when="`req_pool_indices[r]` is negative or `≥ max_reqs`",
                meaning=(
                    "corrupt batch metadata. The GPU path reads outside the table; the torch "
                    "reference raises, or for `−max_reqs ≤ rp < 0` silently reads pool row "
                    "`max_reqs + rp`"
                ),
            ),
        ),
        (
            FindingCode.PREFIX_BEYOND_ROW,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when="`max(P,0) + max(E,0) > max_seq_len` for an in-range pool row",
                meaning=(
                    "a wrong prefix length; the GPU path reads the following pool rows of the "
                    "table (or past its end)"
                ),
            ),
        ),
        (
            FindingCode.DUPLICATE_REQUEST_ROW,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when="one non-zero pool row is used by two batch rows",
                meaning="corrupt batch metadata; both batch rows verify and write the same request",
            ),
        ),
        (
            FindingCode.REQ_ROW_FREE_AND_HELD,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "a pool row of `req_to_token` on the request pool's free list "
                    "(`free_req_rows`) that a running request (`running_req_rows`) or a batch "
                    "row still uses. Pool rows, not cells: `details.rows`"
                ),
                meaning=(
                    "a request's pool row freed while it runs (or freed and kept): the next "
                    "request handed the pool row overwrites its `req_to_token` cells"
                ),
            ),
        ),
        (
            FindingCode.REQ_ROW_HANDED_OUT_TWICE,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "a pool row on `free_req_rows` more than once, or held by two running "
                    "requests (`running_req_rows`). Pool rows, not cells: `details.rows`"
                ),
                meaning=(
                    "a pool row freed twice: it is (or will be) handed to two requests, which then "
                    "write one another's `req_to_token` cells"
                ),
            ),
        ),
        (
            FindingCode.REQ_ROW_LEAKED,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "a pool row (1 .. `max_reqs` − 1) neither on `free_req_rows` nor held by a "
                    "running request (`running_req_rows`): SGLang's `req_to_token_pool memory "
                    "leak detected!`, named. Needs both records (kvcanary's capture and soak "
                    "write them); otherwise not checked. Pool rows, not cells: `details.rows`"
                ),
                meaning=(
                    "a request dropped without freeing its pool row (a finish, abort or retraction "
                    "path that skips `ReqToTokenPool.free`): the pool shrinks until no request "
                    "can be admitted"
                ),
            ),
        ),
        (
            FindingCode.TREE_LOCK_LEAKED,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "a full slot of a locked radix-tree node (`tree_locked_full_slots`) in no "
                    "running request's `req_to_token` pool row (`running_req_rows` and the batch's "
                    "pool rows, up to `req_pool_allocated_lens`); at idle, any locked slot. Needs "
                    "both records (kvcanary's capture and soak write them); otherwise not checked. "
                    "`details.slots`. `soak` also reports it, from SGLang's live objects, where a "
                    "node's lock count exceeds the running requests' locks through it (no dump "
                    "records lock counts)"
                ),
                meaning=(
                    "a lock that outlived its request: those nodes can never be evicted, and "
                    "SGLang counts them as protected, not leaked"
                ),
            ),
        ),
        (
            FindingCode.VIRTUAL_PAGE_FREE_AND_BOUND,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "unified layout: a virtual page on the virtual free list (`free_full_slots`) "
                    "that the full side still binds to a physical page (`full_virtual_to_physical` "
                    "≥ 0); SGLang's `free` unbinds a page before it recycles its id. One cell "
                    "per page (its first slot), `cells.extra.physical_page`"
                ),
                meaning=(
                    "a page pushed onto the free list while its owner (a tree node, a request) "
                    "keeps it: the next allocation hands it to a second owner, and the owner's "
                    "own free later trips SGLang's 'virtual_to_physical == -1 (double-free or "
                    "never-allocated)'"
                ),
            ),
        ),
        (
            FindingCode.VIRTUAL_PAGE_UNBOUND,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "unified layout: a virtual page the tree or a running request holds "
                    "(`tree_full_slots`, `req_pool_allocated_lens`), or one the SWA side binds, "
                    "that the full side does not bind (`full_virtual_to_physical` −1). One cell "
                    "per page (its first slot)"
                ),
                meaning=(
                    "the page was freed (unbound) under its holder, or bound on the SWA side "
                    "only: reads of it translate to no KV"
                ),
            ),
        ),
        (
            FindingCode.PAGE_TABLE_MISMATCH,
            FindingEntry(
                severity=Severity.ERROR,
                group="the side's (`full`, `swa`)",
                when=(
                    "unified layout: a side's `virtual_to_physical` and `physical_to_virtual` do "
                    "not name each other (`p2v[v2p[v]] != v` for a bound page, or a physical "
                    "page whose `p2v` names a virtual page bound elsewhere: one virtual page "
                    "bound to two physical pages). One cell per virtual page, "
                    "`cells.extra.physical_page` its `v2p` entry"
                ),
                meaning=(
                    "a bind, unbind or compaction move that updated one table and not the other"
                ),
            ),
        ),
        (
            FindingCode.PHYSICAL_PAGE_SHARED,
            FindingEntry(
                severity=Severity.ERROR,
                group="the side's (`full`, `swa`)",
                when=(
                    "unified layout: one physical page behind two bound virtual pages in a side's "
                    "`virtual_to_physical`. One cell per virtual page, "
                    "`cells.extra.physical_page`"
                ),
                meaning="two owners read and write the same KV bytes",
            ),
        ),
        (
            FindingCode.PAGE_TABLE_SIZE_MISMATCH,
            FindingEntry(
                severity=Severity.ERROR,
                group="the table's",
                when=(
                    "unified layout: `swa_virtual_to_physical` or a recorded `num_full_slots` "
                    "sized by another id space than the full side's virtual pages "
                    "(`full_virtual_to_physical` less its sentinel). A tensor-level finding: "
                    "`details.tensor`, `details.virtual_pages`"
                ),
                meaning=(
                    "a table sized by its own pool instead of the id space it is indexed by "
                    "(SGLang #37560): ids past its end read out of bounds"
                ),
            ),
        ),
        (
            FindingCode.PHYSICAL_HOLE_INVALID,
            FindingEntry(
                severity=Severity.ERROR,
                group="the side's (`full`, `swa`)",
                when=(
                    "unified layout: an entry of a side's lazy-compaction free list "
                    "(`<side>_physical_holes`) that is no free physical page: −1 or another id "
                    "outside the side's pages `1 .. num_pages − 1`, a page listed twice, or a "
                    "page still bound (`physical_to_virtual` ≥ 0). A tensor-level finding: "
                    "`details.side`, `details.out_of_range`, `details.listed_twice`, "
                    "`details.bound` (up to 8 of each)"
                ),
                meaning=(
                    "a physical page freed twice (a −1: the page of a virtual page already "
                    "released on that side, its tombstone freed as a page): the next "
                    "allocations hand it out twice, or bind a virtual page to physical page −1 "
                    "(the tables' sentinel entry); SGLang's span check still balances, its "
                    "live count is short by each such entry"
                ),
            ),
        ),
        (
            FindingCode.PAGE_TABLE_SENTINEL_OVERWRITTEN,
            FindingEntry(
                severity=Severity.ERROR,
                group="the side's (`full`, `swa`)",
                when=(
                    "unified layout: a side's `virtual_to_physical` or `physical_to_virtual` "
                    "whose last entry (the −1 sentinel) is not −1: `details.tensor`, "
                    "`details.value`. Where `physical_to_virtual`'s names a virtual page (the "
                    "page bound to physical page −1), one cell, its first slot; else a "
                    "tensor-level finding"
                ),
                meaning=(
                    "a bind or unbind indexed the table with −1: a −1 taken off the free list "
                    "as a physical page (a double free) and bound, so its virtual page reads "
                    "as unbound (tombstoned) while its owner holds it"
                ),
            ),
        ),
        (
            FindingCode.MAMBA_SLOT_FREE_AND_HELD,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "Mamba layout: a Mamba slot on the Mamba free list (`free_mamba_slots`) that "
                    "a radix-tree node (`tree_mamba_slots`) or a live request "
                    "(`req_mamba_slots`) holds. `details.mamba_slots`"
                ),
                meaning=(
                    "a slot pushed back onto `MambaSlotAllocator.free_slots` while its owner "
                    "keeps it: the next `alloc` hands the same state to a second owner, which "
                    "overwrites it"
                ),
            ),
        ),
        (
            FindingCode.MAMBA_SLOT_OWNED_TWICE,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "Mamba layout: a Mamba slot held twice: by two tree nodes, by a node and a "
                    "live request, or by two requests (working or ping-pong slots). "
                    "`details.mamba_slots`"
                ),
                meaning=(
                    "two owners read and write one recurrent state: a request resumes from "
                    "another's state, or a cached prefix's state is overwritten"
                ),
            ),
        ),
        (
            FindingCode.MAMBA_SLOT_FREED_TWICE,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "Mamba layout: a Mamba slot listed twice on the Mamba free list. "
                    "`details.mamba_slots`"
                ),
                meaning="a double free: two later `alloc`s hand out the same slot",
            ),
        ),
        (
            FindingCode.MAMBA_RESERVED_SLOT_IN_USE,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "Mamba layout: Mamba slot 0 on the Mamba free list, in the tree or held by "
                    "a live request"
                ),
                meaning=(
                    "slot 0 is the dummy write target of padded tokens: its state is garbage, "
                    "and a request or a cached prefix given it reads and writes that garbage"
                ),
            ),
        ),
        (
            FindingCode.MAMBA_ROW_MAP_MISMATCH,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "Mamba layout: a live request's pool row whose "
                    "`req_index_to_mamba_index_mapping` entry is not the request's Mamba slot "
                    "(`req_mamba_slots` with `req_mamba_rows`), or, with the extra buffer, "
                    "whose `req_index_to_mamba_ping_pong_track_buffer_mapping` entries "
                    "(those >= 0) are not the request's ping-pong slots. `pool_row`, "
                    "`details.mapped`, `details.held` (the ping-pong map: `details.map` "
                    "`ping-pong`, `details.mapped_track`, `details.held_track`)"
                ),
                meaning=(
                    "the kernels read and write the state the pool row map names, not the "
                    "request's own: another owner's state, or a freed slot"
                ),
            ),
        ),
        (
            FindingCode.MAMBA_SLOT_LEAKED,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "Mamba layout: a Mamba slot 1..`num_mamba_slots`−1 neither free, nor the "
                    "tree's, nor a live request's. Needs all three records (the requests' "
                    "only where every live request, waiting ones too, was known: soak and the "
                    "capture API record it). `details.mamba_slots`"
                ),
                meaning=(
                    "a slot lost to the pool: SGLang's idle check "
                    "(`[mamba] total=..., available=..., evictable=..., protected=...`) "
                    "reports it only when the counts stop adding up, at idle"
                ),
            ),
        ),
        (
            FindingCode.HOST_SLOT_FREE_AND_HELD,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "HiCache: a host pool slot on that pool's free list (`host_free_slots`: "
                    "`free_slots` and the staged `release_slots`; the SWA and Mamba host "
                    "pools' `swa_`/`mamba_host_free_slots`) that a radix-tree node's host "
                    "value of the same pool holds (`tree_host_slots`, "
                    "`tree_swa_host_slots`, `tree_mamba_host_slots`). `details.pool`, "
                    "`details.host_slots`, `details.nodes`, `details.host_locked`"
                ),
                meaning=(
                    "a host slot freed while its node keeps it as `host_value`: "
                    "`HostKVCache.free` cleared its `slot_used` bit (`MambaPoolHost` keeps "
                    "none), so the next `alloc` hands it to another node's backup without "
                    "SGLang's 'Double-alloc detected' assert, and a load-back of the first "
                    "node reads the other prefix's KV or state"
                ),
            ),
        ),
        (
            FindingCode.HOST_SLOT_HELD_TWICE,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "HiCache: a host slot of one pool held by two radix-tree nodes' host "
                    "values of that pool (or listed twice in one). `details.pool`, "
                    "`details.host_slots`, `details.nodes`"
                ),
                meaning=(
                    "two cached prefixes share one host copy: whichever was backed up last "
                    "overwrote the other, and loading the first back brings the wrong KV"
                ),
            ),
        ),
        (
            FindingCode.HOST_SLOT_FREED_TWICE,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "HiCache: a host slot listed twice on a host pool's free list "
                    "(`host_free_slots`, or the SWA or Mamba host pool's). `details.pool`, "
                    "`details.host_slots`"
                ),
                meaning=(
                    "a double free that went around `HostKVCache.free`'s 'Double-free "
                    "detected' assert: two later `alloc`s hand out the same slot, and SGLang "
                    "says so only at the second ('Double-alloc detected: slots already "
                    "allocated'), if the first still holds it"
                ),
            ),
        ),
        (
            FindingCode.HOST_SLOT_OUT_OF_RANGE,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "HiCache: a host slot below 0, or at or past its host pool's size "
                    "(`num_host_slots`, `num_swa_host_slots`, `num_mamba_host_slots`, where "
                    "recorded), on the pool's free list or in a node's host value of that "
                    "pool. `details.pool`, `details.host_slots`, `details.where`"
                ),
                meaning=(
                    "a corrupt host index: a backup or load-back through it copies into or "
                    "out of another slot's bytes, or `HostKVCache.free` fails indexing "
                    "`slot_used`"
                ),
            ),
        ),
        (
            FindingCode.HOST_SLOT_LEAKED,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "HiCache: a host slot of a pool (0 .. its size − 1) neither on that "
                    "pool's free list nor in any node's host value of that pool, in a dump "
                    "whose capture ruled out every other holder (`host_slots_accounted` 1: "
                    "no storage tier holding a slot in flight, no buffer-only host memory, no "
                    "disaggregated decode, no release queued). `details.pool`, "
                    "`details.host_slots`"
                ),
                meaning=(
                    "a host slot lost to its pool: allocated and never given to a node nor "
                    "freed, so HiCache's host tier shrinks for good; SGLang counts it as "
                    "used and never says so"
                ),
            ),
        ),
        (
            FindingCode.MAMBA_SLOT_BEYOND_POOL,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "Mamba layout: a Mamba slot id outside 0..`num_mamba_slots`−1 on the Mamba "
                    "free list, in the tree or held by a live request. `details.mamba_slots`"
                ),
                meaning=(
                    "an id no state exists for: the kernels read and write past the Mamba "
                    "pool, and no other Mamba check counts it"
                ),
            ),
        ),
        (
            FindingCode.VERIFY_TOTAL_IMPLAUSIBLE,
            FindingEntry(
                severity=Severity.ERROR,
                group="the planned group",
                when=(
                    "the batch asks for more verify entries than `req_to_token` can supply "
                    "(more than its cell count, at least 2^16, at most 2^26), with no capacity "
                    "overflow to skip them"
                ),
                meaning=(
                    "corrupt lengths (`prefix-beyond-row`, duplicate pool rows). kvcanary plans "
                    "none of this group's entries (nothing is sized by the claim), so no entry of "
                    "it is checked; the rest of the dump is"
                ),
            ),
        ),
        (
            FindingCode.SCALAR_OUT_OF_RANGE,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when=(
                    "a scalar the dump records is outside the range SGLang could use "
                    "([dump-format.md](dump-format.md))"
                ),
                meaning=(
                    "corrupt metadata, or a capture that recorded the wrong value. kvcanary "
                    "plans as if the dump did not record it; pass the real value with its option"
                ),
            ),
        ),
        (
            FindingCode.EXPECTED_TOKEN_OUT_OF_RANGE,
            FindingEntry(
                severity=Severity.ERROR,
                group="the planned group (reported once)",
                when=(
                    "an expected-token gather with `0 ≤ s < valid_lens[r]` falls outside the "
                    "expected-token pool: a column `≥ cols`, or a pool row outside its pool rows"
                ),
                meaning=(
                    "`valid_lens` larger than the pool's width, or a pool row the pool does not "
                    "have. The reference raises `IndexError`; the GPU reads another pool row's "
                    "tokens"
                ),
            ),
        ),
        (
            FindingCode.KERNEL_LIMIT_EXCEEDED,
            FindingEntry(
                severity=Severity.ERROR,
                group="`full`",
                when="`bs > 4096`, or `bs > write_req_capacity` (needs the capacity recorded)",
                meaning=(
                    "production's plan call raises before launching, so the canary does not run "
                    "this step"
                ),
            ),
        ),
        (
            FindingCode.KERNEL_DIVERGENCE,
            FindingEntry(
                severity=Severity.ERROR,
                group="the planned group",
                when=(
                    "the reference and the kernel planner disagree on a value both define, and "
                    "no other finding explains the difference; or the kernel's launch raises "
                    "other than the reference predicts, or runs through where a raise is due "
                    "(`details.field` is `launch`)"
                ),
                meaning=(
                    "a bug in the GPU path (or in kvcanary); with `--kernel sglang`, kvcanary's "
                    "model no longer matching your SGLang: report it with the dump and "
                    "`kvcanary selftest --sglang --format markdown`"
                ),
            ),
        ),
        (
            FindingCode.CANARY_CHAIN_BREAK,
            FindingEntry(
                severity=Severity.ERROR,
                group="the planned group",
                when=(
                    "replaying verify on the dump's canary buffers ([canary.md](canary.md) §5): "
                    "a verified record's `prev_hash` is not the link of the record before it"
                ),
                meaning=(
                    "the record was written by another sequence (aliasing, a stale slot or pool "
                    "row, a misplaced page), or the record before it is broken itself"
                ),
            ),
        ),
        (
            FindingCode.CANARY_POSITION_MISMATCH,
            FindingEntry(
                severity=Severity.ERROR,
                group="the planned group",
                when="a verified record stores another position than the one the plan expects",
                meaning=(
                    "the slot holds another request's record, or another position's: aliasing, "
                    "use after free, a slot handed out twice"
                ),
            ),
        ),
        (
            FindingCode.CANARY_TOKEN_MISMATCH,
            FindingEntry(
                severity=Severity.ERROR,
                group="the planned group",
                when=(
                    "(only with the expected-token pool) a verified record stores another token "
                    "than the pool's"
                ),
                meaning="a wrong token was written, or the record is stale",
            ),
        ),
        (
            FindingCode.CANARY_REAL_KV_MISMATCH,
            FindingEntry(
                severity=Severity.ERROR,
                group="the planned group",
                when=(
                    "a HEAD record holds a fingerprint, or a TAIL record's fingerprint is not "
                    "that of the slot's bytes in the dump's real-KV source (only when the dump "
                    "records `real_kv.mode`)"
                ),
                meaning="the KV bytes of a live slot changed after they were written",
            ),
        ),
        (
            FindingCode.VERIFY_CAPACITY_OVERFLOW,
            FindingEntry(
                severity=Severity.WARNING,
                group="the planned group",
                when="requested verify entries `> verify_capacity` (equality is not overflow)",
                meaning=(
                    "no slot is verified in this step (`enable = 0`), although canary writes go "
                    "on. Usually heavy radix sharing inflating `Σ P`"
                ),
            ),
        ),
        (
            FindingCode.NEGATIVE_LENGTH,
            FindingEntry(
                severity=Severity.WARNING,
                group="`full`",
                when="`P < 0` or `E < 0` on an active batch row",
                meaning="corrupt batch metadata; the planner treats the value as 0",
            ),
        ),
        (
            FindingCode.GPU_DTYPE_MISMATCH,
            FindingEntry(
                severity=Severity.WARNING,
                group="`full`",
                when=(
                    "a tensor is stored with an *also accepted* dtype "
                    "([dump-format.md](dump-format.md))"
                ),
                meaning=(
                    "the dump was converted on the way, or production would refuse this tensor"
                ),
            ),
        ),
        (
            FindingCode.LUT_SENTINEL_MISSING,
            FindingEntry(
                severity=Severity.WARNING,
                group="`swa`",
                when="the LUT's last entry is not −1",
                meaning=(
                    "the LUT was sliced (`lut[:n]`) or its last entry overwritten; a GPU clamp "
                    'then lands on a real SWA slot instead of "no slot"'
                ),
            ),
        ),
    ),
)
CAUSES: Mapping[CauseCode, CauseEntry] = _table(
    CauseCode,
    (
        (
            CauseCode.DOUBLE_FREE,
            CauseEntry(
                summary=(
                    "a slot is on a free list twice: it was freed twice, and will be handed out "
                    "to two owners"
                ),
                fix=(
                    "find the second free of these slots (a request freed twice, a free group "
                    "flushed twice, a tombstone freed after its slot was reused)"
                ),
                evidence="`free-list-duplicate`",
                findings=(FindingCode.FREE_LIST_DUPLICATE,),
                step=(
                    "is on a free list twice: it was freed twice",
                    "are on a free list twice: they were freed twice",
                ),
            ),
        ),
        (
            CauseCode.REQ_ROW_DOUBLE_FREE,
            CauseEntry(
                summary=(
                    "a request-pool row is free while a running request holds it, or is listed "
                    "or held twice: it was freed too early or twice, and two requests share "
                    "its req_to_token cells"
                ),
                fix=(
                    "find the free of this pool row (`ReqToTokenPool.free`) that ran while its "
                    "request still ran, or ran twice (a retraction or abort freeing a pool row its "
                    "finish frees again)"
                ),
                evidence="`req-row-free-and-held`, `req-row-handed-out-twice`",
                findings=(
                    FindingCode.REQ_ROW_FREE_AND_HELD,
                    FindingCode.REQ_ROW_HANDED_OUT_TWICE,
                ),
            ),
        ),
        (
            CauseCode.RESERVED_SLOT_FREED,
            CauseEntry(
                summary=(
                    "the reserved padding slot (page 0) is on a free list or mapped: an "
                    "allocator can hand it out"
                ),
                fix=(
                    "never put page 0 on a free list: find the free that passed it, padding "
                    "slots or tokens whose LUT entry already reads 0 (unmapped: their SWA slot "
                    "was freed before, and this second free lands on slot 0); free mapped "
                    "entries only, as filtering slot 0 out of the free would hide the second "
                    "free"
                ),
                evidence="`reserved-slot-in-use`",
                findings=(FindingCode.RESERVED_SLOT_IN_USE,),
            ),
        ),
        (
            CauseCode.PARTIAL_PAGE_FREE,
            CauseEntry(
                summary=(
                    "pages freed in part: some tokens of a full page still map to an SWA page "
                    "the allocator released whole, the others were cleared"
                ),
                fix=(
                    "free per page: with page_size > 1, clear the LUT for every token of each "
                    "page free_swa releases, not only the tokens passed; a later free of the "
                    "stale tokens double-frees the page"
                ),
                evidence=(
                    "with `page_size` > 1, `free-slot-still-mapped`, "
                    "`swa-slot-free-and-mapped`, or `freed-slot-in-live-range` (SWA, "
                    "out-of-window cells) on a full page whose other tokens' entries are 0: "
                    "part of the page still maps into an SWA page the allocator released whole. "
                    "A free that cleared the LUT for the tokens it was given, not for the page "
                    "(SGLang PR #27779); a later free of the stale tokens double-frees the SWA "
                    "page. The evidence names the pages and how many of their tokens are still "
                    "mapped"
                ),
            ),
        ),
        (
            CauseCode.SWA_PAGE_REISSUED,
            CauseEntry(
                summary=(
                    "an SWA page a partial-page free released whole was handed out again: a new "
                    "full page maps into it while the old page's kept entries still do (two "
                    "owners, one stale)"
                ),
                fix=(
                    "free SWA per page: clear every entry of a page that goes back (free per "
                    "entry and keep the page until its last mapping goes); the old page's stale "
                    "entries must go before their free releases the new owner's KV"
                ),
                evidence=(
                    "`swa-slot-shared-owner` whose stale owner is a full page that keeps at least "
                    "2 entries into the SWA page at their own offsets while its other entries are "
                    "0, with `page_size` >= 4: a partial-page free released the SWA page whole and "
                    "the allocator handed it to a new request (SGLang PR #27779, one step later). "
                    "The evidence names the SWA page, the old full page and how many entries it "
                    "keeps, and the new owner's full page with the pool rows and positions that "
                    "hold it"
                ),
            ),
        ),
        (
            CauseCode.SWA_BOUNDARY_PAGE_CLEARED,
            CauseEntry(
                summary=(
                    "a full page straddling a window's start was cleared whole: the clear of "
                    "the tokens that left the window erased the entries of those still in it"
                ),
                fix=(
                    "free per entry and keep the page until its last mapping goes: when the "
                    "first node's tokens of a shared boundary page leave the window, clear only "
                    "their entries, and release the SWA page with its last in-window token"
                ),
                evidence=(
                    "`swa-unmapped-in-window` cells, with `page_size` > 1, on a full page whose "
                    "every LUT entry is 0 and whose first token sits before its batch row's window "
                    "start: the page straddles the window's edge (two radix nodes sharing one page "
                    "at a split that is not page-aligned, SGLang PR #36457), and a clear meant for "
                    "its out-of-window part took the whole page. The evidence names the page, its "
                    "slots, the pool rows and positions holding it and each batch row's window "
                    "start"
                ),
            ),
        ),
        (
            CauseCode.STALE_SWA_MAPPING,
            CauseEntry(
                summary=(
                    "LUT entries outlived their frees: free full slots still map to SWA slots, "
                    "or free SWA slots are still mapped"
                ),
                fix=(
                    "clear the LUT for every token of every page free_swa releases (with "
                    "page_size > 1, the whole page, not only the tokens passed) before the full "
                    "slots go back"
                ),
                fix_page_size_1=(
                    "clear the LUT entry of every slot free_swa releases before the full slots "
                    "go back"
                ),
                evidence=(
                    "`free-slot-still-mapped`, `swa-slot-free-and-mapped` on whole pages: LUT "
                    "entries that outlived their frees (SGLang PRs #25385, #25270); and "
                    "`freed-slot-in-live-range` in the SWA pool at live cells outside the "
                    "window: a window free released their SWA side and left their entries"
                ),
                findings=(
                    FindingCode.FREE_SLOT_STILL_MAPPED,
                    FindingCode.SWA_SLOT_FREE_AND_MAPPED,
                ),
                step=(
                    "was freed without clearing its LUT entry",
                    "were freed without clearing their LUT entries",
                ),
            ),
        ),
        (
            CauseCode.SWA_SHARED_OWNER,
            CauseEntry(
                summary=(
                    "one SWA slot has several full owners in the LUT: freeing a stale or cached "
                    "owner frees a live request's SWA KV"
                ),
                fix=(
                    "track the owner of each SWA slot and let only that owner free it; clear a "
                    "replaced or tombstoned full slot's mapping when its SWA slot is reused"
                ),
                evidence=(
                    "`swa-slot-shared-owner`: no reverse ownership; only the SWA slot's owner "
                    "may free it"
                ),
                findings=(FindingCode.SWA_SLOT_SHARED_OWNER,),
                step=(
                    "has several full owners in the LUT",
                    "have several full owners in the LUT",
                ),
            ),
        ),
        (
            CauseCode.SWA_FREED_WHILE_LIVE,
            CauseEntry(
                summary=(
                    "SWA pages on the free list while live requests still map them: the next "
                    "allocation hands their KV to another request"
                ),
                fix=(
                    "find the free that released a mapped SWA page: a deferred free group "
                    "flushed after a recovery or replacement mapped one of its pages again, or "
                    "a free by an owner that no longer owns the page; free a page only while no "
                    "entry maps it"
                ),
                evidence=(
                    "`freed-slot-in-live-range` in the SWA pool: a live cell in the window "
                    "maps to an SWA slot on the SWA free list, which the next allocation hands "
                    "to another request. With `swa-page-leaked` beside it, the evidence says "
                    "so: a mapping replaced without freeing the page it replaced, the new page "
                    "then freed with a deferred free group (SGLang PR #36135)"
                ),
                step=(
                    "went back to the SWA free list while a live cell in the window maps it",
                    "went back to the SWA free list while live cells in the window map them",
                ),
            ),
        ),
        (
            CauseCode.SWA_WRITE_INTO_LIVE_SLOT,
            CauseEntry(
                summary=(
                    "this step's writes land on SWA slots that live cells of the window hold "
                    "(another request's, or the writing request's own)"
                ),
                fix=(
                    "recompute the SWA write targets from the current LUT (a cached "
                    "swa_out_cache_loc or translation outlived a mapping change)"
                ),
                evidence=(
                    "`swa-write-to-live-slot`: recompute the SWA write targets from the current LUT"
                ),
                findings=(FindingCode.SWA_WRITE_TO_LIVE_SLOT,),
            ),
        ),
        (
            CauseCode.SWA_MAPPING_REWRITTEN,
            CauseEntry(
                summary=(
                    "LUT entries out of their pages' lockstep: a full page's tokens map to "
                    "other offsets or other SWA pages, which no page allocation does"
                ),
                fix=(
                    "map and clear the LUT per page, full and SWA pages together; find the code "
                    "that set single entries (a cached translation, a tombstone recovery, a "
                    "copy of one token's mapping)"
                ),
                evidence=(
                    "`swa-page-out-of-lockstep` whose full slot no other finding explains (an "
                    "entry that joins a stale owner or a stale write translation goes to that "
                    "cause)"
                ),
            ),
        ),
        (
            CauseCode.RADIX_PREFIX_BROKEN,
            CauseEntry(
                summary=(
                    "pool rows share a slot at one position without sharing the prefix before it: "
                    "a copied cell, not radix sharing"
                ),
                fix=(
                    "find what wrote another request's slot into this pool row (a copy between "
                    "pool rows, a prefix match that did not start at position 0, a fault "
                    "injector); radix sharing always shares the whole prefix"
                ),
                evidence="`slot-shared-without-prefix`",
                findings=(FindingCode.SLOT_SHARED_WITHOUT_PREFIX,),
            ),
        ),
        (
            CauseCode.LUT_TOO_SHORT,
            CauseEntry(
                summary="the SWA LUT is shorter than the full pool: valid slots fall off its end",
                fix=(
                    "size full_to_swa_index_mapping from the full pool (num_full_slots + 1 "
                    "entries, the last one -1) and pass the allocator's mapping itself, not a "
                    "slice of it; the slots are fine"
                ),
                evidence=(
                    "slots `≥ lut_len` that are otherwise valid: below the recorded "
                    "`num_full_slots`, live, not free; also `lut-shorter-than-pool`, and a LUT "
                    "that no longer ends in −1 (sliced). The fix is the LUT, not the slots"
                ),
            ),
        ),
        (
            CauseCode.SLOT_INDEX_CORRUPT,
            CauseEntry(
                summary=(
                    "slot indices that cannot be right in any pool: the producer of the slot "
                    "indices is wrong"
                ),
                fix=(
                    "find what wrote these req_to_token cells (allocation, prefix-cache match, "
                    "copy between pool rows); the LUT is not at fault"
                ),
                evidence=(
                    "live slots that no pool can hold: negative, or `≥` the recorded "
                    "`num_full_slots` (and so `≥` a correctly sized LUT too). The producer of "
                    "the slot indices is wrong; the LUT is not"
                ),
                findings=(FindingCode.NEGATIVE_SLOT,),
            ),
        ),
        (
            CauseCode.BATCH_METADATA_CORRUPT,
            CauseEntry(
                summary=(
                    "the batch metadata itself is wrong (pool rows, lengths): the cells read "
                    "through it are symptoms"
                ),
                fix=(
                    "fix how req_pool_indices / prefix_lens / extend_seq_lens are built for the "
                    "batch (ForwardBatch); ignore the cell symptoms until then"
                ),
                evidence=(
                    "`row-out-of-range`, `prefix-beyond-row`, `duplicate-request-row`, "
                    "`negative-length`, `verify-total-implausible`; every other finding in "
                    "those batch rows is grouped under it"
                ),
            ),
        ),
        (
            CauseCode.STALE_ROW_READ,
            CauseEntry(
                summary=(
                    "a recycled pool row read through a too-long prefix: the live range runs "
                    "into the stale tail of an earlier owner"
                ),
                fix=(
                    "the prefix length of this request is larger than what its pool row holds: "
                    "check prefix_lens (chunked prefill, retraction, radix match) for this request"
                ),
                evidence=(
                    "a run of findings (freed, aliased, unwritten or repeated slots) that ends at "
                    "the last prefix position `P − 1` of a batch row and covers most of it, while "
                    "the cells before it are clean, with at least one freed, unwritten or repeated "
                    "slot of the pool row's own among them: a recycled pool row read through a "
                    "too-long prefix, into its previous owner's tail. The evidence names the first "
                    "5 such batch rows (positions, the cells per code) and counts the others in "
                    "one line, however large the batch. A pool row whose tail is only shared with "
                    "other pool rows is consistent as far as it goes (a slot handed out twice puts "
                    "a live run at the end of a newer pool row): that is `cross-request-aliasing`"
                ),
                explanations=(ViolationRowCause.STALE_ROW,),
                step=(
                    "is read through a prefix longer than its pool row holds",
                    "are read through a prefix longer than their pool row holds",
                ),
            ),
        ),
        (
            CauseCode.USE_AFTER_FREE,
            CauseEntry(
                summary="live slots are on the allocator's free list",
                fix=(
                    "find who freed these slots while a request still held them (free on finish "
                    "or retract, radix eviction of a locked node)"
                ),
                evidence=(
                    "`freed-slot-in-live-range` (full pool) not explained above, "
                    "`full-slot-free-and-held`"
                ),
                findings=(
                    FindingCode.FREED_SLOT_IN_LIVE_RANGE,
                    FindingCode.FULL_SLOT_FREE_AND_HELD,
                ),
                explanations=(
                    ViolationRowCause.USE_AFTER_FREE,
                    ViolationRowCause.STALE_SLOT,
                ),
                step=(
                    "was freed while its owner still holds it",
                    "were freed while their owners still hold them",
                ),
            ),
        ),
        (
            CauseCode.CROSS_REQUEST_ALIASING,
            CauseEntry(
                summary="one slot is live at different positions of two requests",
                fix=(
                    "two mechanisms leave one slot live in two requests: a radix eviction of a "
                    "node a running request still locks (its slots freed, then handed to the "
                    "other request), or a slot copied into another request at another position "
                    "(a prefix-cache match, a pool row reused without reset). The tree decides "
                    "(tree_locked_full_slots: the older request's slot unlocked while it runs "
                    "was evicted under its lock), or a timeline (the slot went through the free "
                    "list: evicted; it never did: copied)"
                ),
                evidence="`slot-shared-across-positions`, `full-slot-held-twice`",
                findings=(
                    FindingCode.SLOT_SHARED_ACROSS_POSITIONS,
                    FindingCode.FULL_SLOT_HELD_TWICE,
                ),
                explanations=(ViolationRowCause.ALIASING,),
                step=(
                    "is live in two requests at different positions",
                    "are live in two requests at different positions",
                ),
            ),
        ),
        (
            CauseCode.SLOT_REUSED_WITHIN_REQUEST,
            CauseEntry(
                summary="one slot sits at two live positions of one request",
                fix=(
                    "the allocator handed the same slot out twice to one request, or a copy "
                    "within the pool row went wrong"
                ),
                evidence=(
                    "`duplicate-slot-in-row`; and the `slot-shared-across-positions` cell of a "
                    "pool row that holds the same slot at an earlier position too: its radix "
                    "sharers hold that first position, and the repeat is the fault, not a copy "
                    "across requests"
                ),
                findings=(FindingCode.DUPLICATE_SLOT_IN_ROW,),
                explanations=(ViolationRowCause.DUPLICATE_IN_ROW,),
                step=(
                    "sits at two live positions of one request",
                    "sit at two live positions of one request",
                ),
            ),
        ),
        (
            CauseCode.UNWRITTEN_CELLS,
            CauseEntry(
                summary="live prefix cells hold slot 0: never written, or zeroed",
                fix=(
                    "find why these positions were never written (skipped allocation, zeroed "
                    "pool row, prefix length past the written part)"
                ),
                evidence="`padding-slot-in-live-range`",
                findings=(FindingCode.PADDING_SLOT_IN_LIVE_RANGE,),
            ),
        ),
        (
            CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW,
            CauseEntry(
                summary="SWA entries of tokens still in the window were cleared",
                fix=(
                    "two mechanisms leave this state, and one dump cannot tell them apart: an "
                    "out-of-window eviction that ran past the window's start (check its "
                    "threshold against the window; a timeline dates the step that cleared "
                    "them), or a tree eviction of an in-window node whose SWA lock did not "
                    "cover the whole window (check the lock's range; a dump that records the "
                    "tree, tree_swa_resident_slots, shows which node lost them)"
                ),
                evidence="`swa-unmapped-in-window`",
                findings=(FindingCode.SWA_UNMAPPED_IN_WINDOW,),
            ),
        ),
        (
            CauseCode.SWA_MAPPING_COLLISION,
            CauseEntry(
                summary="two live full slots map to one SWA slot",
                fix=(
                    "an SWA slot was handed out twice, or a free skipped the SWA side and left "
                    "a stale mapping"
                ),
                evidence="`swa-slot-collision`",
                findings=(FindingCode.SWA_SLOT_COLLISION,),
            ),
        ),
        (
            CauseCode.WRITE_INTO_LIVE_SLOT,
            CauseEntry(
                summary="this step writes slots that other requests still hold",
                fix="the allocator returned a slot still in use: check frees and the free list",
                evidence="`write-to-live-slot`",
                findings=(FindingCode.WRITE_TO_LIVE_SLOT,),
            ),
        ),
        (
            CauseCode.LUT_SENTINEL_OVERWRITTEN,
            CauseEntry(
                summary="the LUT's trailing -1 is gone",
                fix="keep the LUT's last entry at -1 (it makes a clamp land on 'no slot')",
                evidence="`lut-sentinel-missing` on a LUT that is not too short",
                findings=(FindingCode.LUT_SENTINEL_MISSING,),
            ),
        ),
        (
            CauseCode.EXPECTED_TOKEN_POOL_MISMATCH,
            CauseEntry(
                summary="the expected-token pool is smaller than its valid lengths say",
                fix=(
                    "size req_to_verify_expected_tokens to the request lengths, or fix its "
                    "valid lengths"
                ),
                evidence="`expected-token-out-of-range`",
                findings=(FindingCode.EXPECTED_TOKEN_OUT_OF_RANGE,),
            ),
        ),
        (
            CauseCode.VERIFY_CAPACITY_OVERFLOW,
            CauseEntry(
                summary=(
                    "more verify entries than capacity: the verify launch is skipped this step"
                ),
                fix="raise the verify capacity (ServerArgs / pool sizing)",
                evidence="`verify-capacity-overflow`",
                findings=(FindingCode.VERIFY_CAPACITY_OVERFLOW,),
            ),
        ),
        (
            CauseCode.KERNEL_LIMIT,
            CauseEntry(
                summary="the GPU plan path refuses this batch",
                fix=(
                    "keep bs at most 4096 (the GPU plan path's block size) and at most "
                    "write_req_capacity"
                ),
                evidence="`kernel-limit-exceeded`",
                findings=(FindingCode.KERNEL_LIMIT_EXCEEDED,),
            ),
        ),
        (
            CauseCode.NONCANONICAL_DTYPE,
            CauseEntry(
                summary="tensors in dtypes the production GPU path rejects",
                fix=(
                    "store the tensors in the dtypes the GPU path requires (or ignore: kvcanary "
                    "read them anyway)"
                ),
                evidence="`gpu-dtype-mismatch`",
                findings=(FindingCode.GPU_DTYPE_MISMATCH,),
            ),
        ),
        (
            CauseCode.PLANNER_DIVERGENCE,
            CauseEntry(
                summary="the reference and the kernel disagree where no finding explains it",
                fix=(
                    "report it to kvcanary with this dump: the kernel model and the reference "
                    "disagree"
                ),
                evidence="`kernel-divergence`",
                findings=(FindingCode.KERNEL_DIVERGENCE,),
            ),
        ),
        (
            CauseCode.KV_OVERWRITTEN,
            CauseEntry(
                summary="the KV bytes of live slots changed after the canary fingerprinted them",
                fix=(
                    "find what wrote into these slots' KV after their step (a kernel writing "
                    "out of bounds, a copy or transfer into the wrong pages)"
                ),
                evidence=(
                    "`canary-real-kv-mismatch` whose violation row explanation is `kv-overwritten` "
                    "([canary.md](canary.md) §7)"
                ),
                explanations=(ViolationRowCause.KV_OVERWRITTEN,),
            ),
        ),
        (
            CauseCode.SCALAR_METADATA_CORRUPT,
            CauseEntry(
                summary="a scalar the dump records is not one SGLang could have used",
                fix=(
                    "check what recorded the scalar (the capture hook's server context); rerun "
                    "with the real value through its option"
                ),
                evidence="`scalar-out-of-range`",
                findings=(FindingCode.SCALAR_OUT_OF_RANGE,),
            ),
        ),
        (
            CauseCode.FOREIGN_CANARY_RECORD,
            CauseEntry(
                summary="verified slots hold canary records of a writer the dump does not show",
                fix=(
                    "trace the slots with `kvcanary provenance --slot`: they were rewritten by "
                    "a sequence outside this batch (a transfer, a finished request, a misplaced "
                    "page)"
                ),
                evidence=(
                    "`canary-*` findings that no symptom in `req_to_token` or the allocator "
                    "explains, and whose violation row explanation names no cause above "
                    "(`foreign-record`, `chain-break`, `wrong-token`, `write-check`, "
                    "`no-live-cell`)"
                ),
            ),
        ),
        (
            CauseCode.SWA_LEAK,
            CauseEntry(
                summary=(
                    "SWA pages that are neither free nor mapped from a held full slot: leaked "
                    "(SGLang aborts with 'SWA Pool Mem Leak Detected' once enough are gone)"
                ),
                fix=(
                    "find the path that clears a mapping without freeing its SWA page (an "
                    "eviction or tombstone that drops the LUT entry, a failed allocation that "
                    "keeps the page, a speculative step with page_size > 1 that drops its "
                    "rejected tokens' entries)"
                ),
                fix_page_size_1=(
                    "find the path that clears a mapping without freeing its SWA slot (an "
                    "eviction or tombstone that drops the LUT entry, a failed allocation that "
                    "keeps the slot)"
                ),
                evidence="`swa-page-leaked`",
                findings=(FindingCode.SWA_PAGE_LEAKED,),
            ),
        ),
        (
            CauseCode.FULL_LEAK,
            CauseEntry(
                summary=(
                    "full-pool pages neither free, nor the radix tree's, nor a running "
                    "request's: leaked (SGLang's 'pool memory leak detected!')"
                ),
                fix=(
                    "find the path that dropped these pages' owner without freeing them (a "
                    "request released without its KV, a tree node removed without its free); "
                    "the table cells that still hold them, in the provenance, say who had them "
                    "last"
                ),
                evidence="`full-page-leaked`",
                findings=(FindingCode.FULL_PAGE_LEAKED,),
            ),
        ),
        (
            CauseCode.REQ_ROW_LEAK,
            CauseEntry(
                summary=(
                    "request-pool rows neither free nor held by a running request: leaked "
                    "(SGLang's 'req_to_token_pool memory leak detected!')"
                ),
                fix=(
                    "find the path that dropped these pool rows' requests without "
                    "`ReqToTokenPool.free` (a finish, abort or retraction); the pool rows' "
                    "req_to_token cells say which request had them last"
                ),
                evidence="`req-row-leaked`",
                findings=(FindingCode.REQ_ROW_LEAKED,),
            ),
        ),
        (
            CauseCode.TREE_LOCK_LEAK,
            CauseEntry(
                summary=(
                    "radix-tree nodes stay locked though no running request matched them: a "
                    "lock never released"
                ),
                fix=(
                    "find the finish, abort or retraction path that drops a request without "
                    "unlocking its prefix (`dec_lock_ref`, `tree_cache.unlock(req.lock)`)"
                ),
                evidence="`tree-lock-leaked`",
                findings=(FindingCode.TREE_LOCK_LEAKED,),
            ),
        ),
        (
            CauseCode.VIRTUAL_PAGE_FREED_WHILE_BOUND,
            CauseEntry(
                summary=(
                    "virtual pages went back on the virtual free list while still bound and "
                    "held: the next allocation hands them to a second owner, and the first "
                    "owner's free then raises SGLang's 'virtual_to_physical == -1 "
                    "(double-free or never-allocated)'"
                ),
                fix=(
                    "find the free of these pages that skipped `MultiEndedAllocator.free` (an id "
                    "recycled onto `free_virtual_ids` without its unbind, a tree node's page "
                    "freed while the node keeps it)"
                ),
                evidence="`virtual-page-free-and-bound`",
                findings=(FindingCode.VIRTUAL_PAGE_FREE_AND_BOUND,),
            ),
        ),
        (
            CauseCode.PHYSICAL_PAGE_DOUBLE_FREE,
            CauseEntry(
                summary=(
                    "a physical page of the unified pool was freed twice: its side's "
                    "lazy-compaction free list holds it twice, holds it while bound, or holds "
                    "−1 (a page released again after its tombstone), and the next allocations "
                    "hand it out twice or bind a virtual page to physical page −1"
                ),
                fix=(
                    "find the release of pages already released on that side: a segment "
                    "whose SWA pages are tombstoned freed through `free_segment` (both sides) "
                    "instead of `free_full_segment`, or a free of ids `free_swa` already took"
                ),
                evidence="`physical-hole-invalid`, `page-table-sentinel-overwritten`",
                findings=(
                    FindingCode.PHYSICAL_HOLE_INVALID,
                    FindingCode.PAGE_TABLE_SENTINEL_OVERWRITTEN,
                ),
            ),
        ),
        (
            CauseCode.MAMBA_SLOT_FREED_WHILE_HELD,
            CauseEntry(
                summary=(
                    "Mamba slots went back on `MambaSlotAllocator.free_slots` while a tree node "
                    "or a request still holds them: the next `alloc` hands the same state to a "
                    "second owner. SGLang's busy check has no Mamba check at all, and its idle "
                    "check sees only counts that stop adding up"
                ),
                fix=(
                    "find the `mamba_allocator.free` of a slot its owner keeps: a tree node's "
                    "Mamba value freed without the node dropping it (`evict_component`, "
                    "`_free_mamba_value`), or a request's `mamba_pool_idx` freed "
                    "(`free_mamba_cache`) while the tree adopted it on insert"
                ),
                evidence="`mamba-slot-free-and-held`",
                findings=(FindingCode.MAMBA_SLOT_FREE_AND_HELD,),
            ),
        ),
        (
            CauseCode.MAMBA_SLOT_DOUBLE_FREE,
            CauseEntry(
                summary=(
                    "a Mamba slot was freed twice, or handed to a second owner while the first "
                    "kept it: two owners share one recurrent state"
                ),
                fix=(
                    "find the second `mamba_allocator.free` of the slot (a finish and an abort, "
                    "`free_mamba_cache` after the tree took the slot on insert), or the free "
                    "of a held slot that let `alloc` hand it out again"
                ),
                evidence="`mamba-slot-freed-twice`, `mamba-slot-owned-twice`",
                findings=(
                    FindingCode.MAMBA_SLOT_FREED_TWICE,
                    FindingCode.MAMBA_SLOT_OWNED_TWICE,
                ),
            ),
        ),
        (
            CauseCode.MAMBA_RESERVED_SLOT_HANDED_OUT,
            CauseEntry(
                summary=(
                    "Mamba slot 0, the dummy write target `MambaSlotAllocator` reserves for "
                    "padded tokens, reached its free list or an owner"
                ),
                fix=(
                    "find the free of slot 0: a pool row map entry read for a padding pool row "
                    "(`req_index_to_mamba_index_mapping` is 0 there) and freed as a request's "
                    "slot, or a tree value of 0 freed on eviction"
                ),
                evidence="`mamba-reserved-slot-in-use`",
                findings=(FindingCode.MAMBA_RESERVED_SLOT_IN_USE,),
            ),
        ),
        (
            CauseCode.MAMBA_ROW_MAP_STALE,
            CauseEntry(
                summary=(
                    "`req_index_to_mamba_index_mapping` names another Mamba slot than the "
                    "request's `mamba_pool_idx`: its kernels run on a state that is not its own"
                ),
                fix=(
                    "find where the request's Mamba slot changed without the pool row map "
                    "(`HybridReqToTokenPool.alloc` writes it; a copy-on-write or a donated "
                    "slot must write it again), or the pool row map sized from another pool "
                    "(SGLang #24244)"
                ),
                evidence="`mamba-row-map-mismatch`",
                findings=(FindingCode.MAMBA_ROW_MAP_MISMATCH,),
            ),
        ),
        (
            CauseCode.HOST_SLOT_FREED_WHILE_HELD,
            CauseEntry(
                summary=(
                    "HiCache host slots went back on the host pool's free list while a radix "
                    "node still holds them as its `host_value`: the next `alloc` hands them "
                    "to another node's backup, and SGLang's 'Double-alloc detected' assert "
                    "stays silent because `free` cleared their `slot_used` bits (the Mamba "
                    "host pool keeps none)"
                ),
                fix=(
                    "find the `HostKVCache.free` (or `HostPoolGroup.free`, `details.pool` "
                    "names the pool) of a host value "
                    "whose node keeps it: a host eviction that frees a node's `host_value` "
                    "without dropping the node, a failed or rolled-back backup releasing "
                    "slots `commit_backup` already gave a node, or a load-back that frees the "
                    "host copy the node still points at"
                ),
                evidence="`host-slot-free-and-held`",
                findings=(FindingCode.HOST_SLOT_FREE_AND_HELD,),
            ),
        ),
        (
            CauseCode.HOST_SLOT_DOUBLE_FREE,
            CauseEntry(
                summary=(
                    "a HiCache host slot was freed twice, or given to a second node while the "
                    "first kept it: two owners share one host copy. SGLang's 'Double-free "
                    "detected' assert guards `HostKVCache.free` only (`MambaPoolHost.free` "
                    "has none); a slot pushed onto "
                    "`free_slots` or `release_slots` another way is seen at the second "
                    "`alloc` ('Double-alloc detected'), if at all"
                ),
                fix=(
                    "find the second release of the slot: a path that appends to "
                    "`release_slots` or rebuilds `free_slots` itself (a rollback of "
                    "`resolve_host_transfers`, a prefetch or backup revoked after its slots "
                    "were freed), or a split or insert that left one host value on two nodes"
                ),
                evidence="`host-slot-freed-twice`, `host-slot-held-twice`",
                findings=(FindingCode.HOST_SLOT_FREED_TWICE, FindingCode.HOST_SLOT_HELD_TWICE),
            ),
        ),
        (
            CauseCode.HOST_SLOT_INDEX_CORRUPT,
            CauseEntry(
                summary=(
                    "host slot ids outside the HiCache host pool (negative, or at or past its "
                    "size) are on its free list or in a node's host value"
                ),
                fix=(
                    "find where the host index was computed: a device index stored as a "
                    "`host_value`, host indices of another host pool (the SWA or Mamba host "
                    "pool, a page-first layout's page ids), or a pool resized without "
                    "`clear()`"
                ),
                evidence="`host-slot-out-of-range`",
                findings=(FindingCode.HOST_SLOT_OUT_OF_RANGE,),
            ),
        ),
        (
            CauseCode.MAMBA_SLOT_ID_CORRUPT,
            CauseEntry(
                summary=(
                    "Mamba slot ids past the pool: a slot written from another id space (a "
                    "pool row, a KV slot) or a pool sized apart from the allocator that hands "
                    "its ids out"
                ),
                fix=(
                    "find where the id was written: a `mamba_pool_idx` or tree value set from "
                    "another index, or `MambaPool` and `MambaSlotAllocator` built with different "
                    "sizes"
                ),
                evidence="`mamba-slot-beyond-pool`",
                findings=(FindingCode.MAMBA_SLOT_BEYOND_POOL,),
            ),
        ),
        (
            CauseCode.PAGE_TABLE_CORRUPT,
            CauseEntry(
                summary=(
                    "the unified pool's page tables disagree: a held virtual page unbound, a "
                    "virtual page bound to two physical pages, a physical page behind two "
                    "virtual pages, or a table sized by another id space"
                ),
                fix=(
                    "find the bind, unbind or compaction move that wrote one table and not the "
                    "other (`bind`, `free_unbind_inplace`, `_move_pages_and_rebind`), or the "
                    "table sized from the wrong pool"
                ),
                evidence=(
                    "`virtual-page-unbound`, `page-table-mismatch`, `physical-page-shared`, "
                    "`page-table-size-mismatch`"
                ),
                findings=(
                    FindingCode.VIRTUAL_PAGE_UNBOUND,
                    FindingCode.PAGE_TABLE_MISMATCH,
                    FindingCode.PHYSICAL_PAGE_SHARED,
                    FindingCode.PAGE_TABLE_SIZE_MISMATCH,
                ),
            ),
        ),
        (
            CauseCode.MAMBA_SLOT_LEAK,
            CauseEntry(
                summary=(
                    "Mamba slots are owned by nobody: not free, not a tree node's, not a live "
                    "request's. SGLang reports it only at idle, as '[mamba] total=..., "
                    "available=..., evictable=..., protected=...' with no slot named"
                ),
                fix=(
                    "find the path that drops a request's `mamba_pool_idx` without "
                    "`free_mamba_cache`: scheduling that fails after the match's copy-on-write "
                    "slot (SGLang #16067), the adder dropping a matched request (#21404), an "
                    "abort between match and alloc (#12693)"
                ),
                evidence="`mamba-slot-leaked`",
                findings=(FindingCode.MAMBA_SLOT_LEAKED,),
            ),
        ),
        (
            CauseCode.HOST_SLOT_LEAK,
            CauseEntry(
                summary=(
                    "HiCache host slots are owned by nobody: not on their pool's free list, "
                    "not a tree node's host value, and nothing else could hold them (the "
                    "capture ruled out prefetches, storage backups, retraction backups and "
                    "buffer-only staging)"
                ),
                fix=(
                    "find the host `alloc` whose slots never reached a node nor went back "
                    "with `free` (`details.pool` names the pool): a backup whose "
                    "`commit_backup` was skipped after the controller's `write` allocated, "
                    "a rolled-back `resolve_host_transfers` that freed one pool but not "
                    "another, a host eviction that drops a node without freeing its host "
                    "value"
                ),
                evidence="`host-slot-leaked`",
                findings=(FindingCode.HOST_SLOT_LEAKED,),
            ),
        ),
        (
            CauseCode.SGLANG_MISCOUNT,
            CauseEntry(
                summary=(
                    "SGLang's memory check sums its counts wrong, and nothing leaked: every "
                    "page is free, the radix tree's or a running request's, and no free list "
                    "holds a page twice; its evictable or protected size counts a page two "
                    "tree nodes hold once per node, and its idle check (strict by default) "
                    "then raises and stops the scheduler"
                ),
                fix=(
                    "fix the count or the tree, not the allocator: find how two tree nodes "
                    "came to hold the same page (an insert of a value another node holds, a "
                    "split that kept the page on both sides) or which counter drifted from "
                    "the tree; `kvcanary leak LINE DUMP` lists the pages"
                ),
                evidence=(
                    "SGLang's printed sum (`pool memory leak detected!`, `Pool Mem Leak "
                    "Detected!`) is off while the dump accounts for every page: none leaked, "
                    "none listed twice on a free list (`kvcanary leak LINE DUMP`; the pages "
                    "the tree lists twice, when it does)"
                ),
            ),
        ),
    ),
)
EVENTS: Mapping[EventKind, EventEntry] = _table(
    EventKind,
    (
        (
            EventKind.DOUBLE_ALLOCATION,
            EventEntry(
                cause=CauseCode.CROSS_REQUEST_ALIASING,
                seen=(
                    "a slot got a second owner (another position, or another slot before it) "
                    "while its owner still holds it, and no dump listed it free in between: "
                    "handed out twice without a free. Without free lists in the dumps, every "
                    "second owner is reported this way"
                ),
            ),
        ),
        (
            EventKind.USE_AFTER_FREE,
            EventEntry(
                cause=CauseCode.USE_AFTER_FREE,
                seen=(
                    "a live slot is on the full free list that was not before: freed while its "
                    "owner still holds it (`from_dump`: the last dump in which that owner held "
                    "it), or handed out while still listed free. Also: a slot a dump listed "
                    "free while held, handed to a second owner while the first still holds it "
                    '("handed out again")'
                ),
            ),
        ),
        (
            EventKind.PREFIX_REWRITTEN,
            EventEntry(
                cause=CauseCode.RADIX_PREFIX_BROKEN,
                seen=(
                    "a written cell of a live request holds another slot than in the dump before. "
                    "The request is the same one, not a new request in its pool row: its prefix "
                    "covers every cell it had, and a later position it had written still holds the "
                    "same slot (a new request in a reused pool row shares at most a cached prefix "
                    "from position 0 and differs from there on). SGLang changes a live request's "
                    "written cells only to de-duplicate them: the radix cache writes its own slots "
                    "over cells it already held and frees the request's copies. A cell whose new "
                    "slot is the tree's (`tree_full_slots` of the later dump; without it, another "
                    "live request's at the same position after the same slot, or a slot in use "
                    "already in the dump before) and whose old slot is accounted for (free, in a "
                    "page a live cell holds, or held as the dump records it) is such a "
                    "de-duplication, not an event. Without the tree's record in the later dump, a "
                    "cell is an event only when that dump proves its old slot orphaned (its free "
                    "list speaks for the slot and does not list it, its `held_full_slots` does not "
                    "hold it, no live cell holds its page): a request retracted and prefilled "
                    "again between the dumps looks the same otherwise, and such cells are a note, "
                    "not an event. Each cell has its old slot (`old_slot`) and what became of it "
                    "(`old_slot_fate`): `0` orphaned (neither on the free list nor held by a live "
                    "cell: leaked, or kept only by the radix cache), `1` free, `2` held by a live "
                    "cell (another request, or this one at another position), `-1` not held and no "
                    "free list to tell free from orphaned (or a shrunk dump that does not speak "
                    "for the slot). The pool row counts as `grew`; the changed cells count as "
                    "newly allocated. Every dump on its own may be clean"
                ),
            ),
        ),
        (
            EventKind.LUT_REWRITTEN,
            EventEntry(
                cause=CauseCode.SWA_MAPPING_REWRITTEN,
                seen=(
                    "a continuing cell in its request's SWA window maps to another non-zero "
                    "SWA slot than in the dump before (`swa_before`, `swa_after`). A mapping "
                    "moved page and all, still in lockstep, shows in no single dump. Behind the "
                    "window the SWA side of a cached cell may be freed and come back with other "
                    "slots (a tombstone recovered), and a pool row whose cells the radix cache "
                    "rewrote in the interval is not compared (it may be a request retracted and "
                    "prefilled again)"
                ),
            ),
        ),
        (
            EventKind.SWA_LEAK,
            EventEntry(
                cause=CauseCode.SWA_LEAK,
                seen=(
                    "SWA pages leaked (neither on the SWA free list nor mapped from a held full "
                    "slot: SGLang's memory check, as `swa-page-leaked`) that the last dump "
                    "accounting leaks did not have. One event for the sequence, dated by its "
                    "first pages; its pages grow with the leak, and its message says how many "
                    "pages per step"
                ),
            ),
        ),
    ),
)
VIOLATION_CAUSES: Mapping[ViolationRowCause, ViolationCauseEntry] = _table(
    ViolationRowCause,
    (
        (
            ViolationRowCause.WRITE_CHECK,
            ViolationCauseEntry(
                when="a write's violation row",
                meaning="a wrong token or position was written",
            ),
        ),
        (
            ViolationRowCause.ALIASING,
            ViolationCauseEntry(
                when=(
                    "position mismatch; another live pool row holds the slot at the stored position"
                ),
                meaning="two requests use one slot; the later writer's record won",
            ),
        ),
        (
            ViolationRowCause.DUPLICATE_IN_ROW,
            ViolationCauseEntry(
                when=(
                    "position mismatch; the reading pool row itself holds the slot at the stored "
                    "position"
                ),
                meaning="one slot at two positions of a request",
            ),
        ),
        (
            ViolationRowCause.USE_AFTER_FREE,
            ViolationCauseEntry(
                when=(
                    "position mismatch; the slot is on the free list and no live cell holds it "
                    "at the stored position"
                ),
                meaning=(
                    "the slot was freed and rewritten by its next owner while this request "
                    "still reads it"
                ),
            ),
        ),
        (
            ViolationRowCause.STALE_SLOT,
            ViolationCauseEntry(
                when=(
                    "position mismatch; only an idle pool row or a stale tail holds the slot at "
                    "the stored position"
                ),
                meaning="a slot freed and handed out again",
            ),
        ),
        (
            ViolationRowCause.FOREIGN_RECORD,
            ViolationCauseEntry(
                when="position mismatch; no cell holds the slot at the stored position",
                meaning="a writer the dump does not show (a transfer, a finished request)",
            ),
        ),
        (
            ViolationRowCause.FOLLOWS_BAD_RECORD,
            ViolationCauseEntry(
                when="chain break; the slot before has a position mismatch of its own",
                meaning="the break is the consequence of the bad record before it",
            ),
        ),
        (
            ViolationRowCause.STALE_ROW,
            ViolationCauseEntry(
                when="chain break at a slot on the free list",
                meaning=(
                    "a reused pool row read past its end: the records continue the previous "
                    "owner's chain"
                ),
            ),
        ),
        (
            ViolationRowCause.CHAIN_BREAK,
            ViolationCauseEntry(
                when="any other chain break",
                meaning=(
                    "the record was written by another sequence (a stale pool row without free "
                    "lists, a misplaced page)"
                ),
            ),
        ),
        (
            ViolationRowCause.WRONG_TOKEN,
            ViolationCauseEntry(
                when="only the token differs",
                meaning="a wrong token was written, or the record is stale",
            ),
        ),
        (
            ViolationRowCause.KV_OVERWRITTEN,
            ViolationCauseEntry(
                when="only the real-KV fingerprint differs",
                meaning="the KV bytes changed after the TAIL write",
            ),
        ),
        (
            ViolationRowCause.NO_LIVE_CELL,
            ViolationCauseEntry(
                when="the dump has no live cell holding the slot (or the tag is unknown)",
                meaning="the violation row is from another step, or the slot leaked",
            ),
        ),
    ),
)


#: finding code -> the cause that explains it by default (`CauseEntry.findings`).
CAUSE_OF_FINDING: Mapping[FindingCode, CauseCode] = _inverse(
    {cause: entry.findings for cause, entry in CAUSES.items()}
)
#: violation-row explanation -> the cause it names (`CauseEntry.explanations`).
CAUSE_OF_EXPLANATION: Mapping[ViolationRowCause, CauseCode] = _inverse(
    {cause: entry.explanations for cause, entry in CAUSES.items()}
)


#: Finding codes whose cells are LUT or free-list entries (about slots, not req_to_token
#: cells), and those whose cells are pages: what reports call their units.
_ENTRY_CODES = frozenset(
    {
        FindingCode.FREE_LIST_DUPLICATE,
        FindingCode.RESERVED_SLOT_IN_USE,
        FindingCode.FREE_SLOT_STILL_MAPPED,
        FindingCode.SWA_SLOT_FREE_AND_MAPPED,
        FindingCode.SWA_SLOT_SHARED_OWNER,
        FindingCode.SWA_PAGE_OUT_OF_LOCKSTEP,
    }
)
_PAGE_CODES = frozenset(
    {
        FindingCode.SWA_PAGE_LEAKED,
        FindingCode.FULL_PAGE_LEAKED,
        FindingCode.VIRTUAL_PAGE_FREE_AND_BOUND,
        FindingCode.VIRTUAL_PAGE_UNBOUND,
        FindingCode.PAGE_TABLE_MISMATCH,
        FindingCode.PHYSICAL_PAGE_SHARED,
        FindingCode.PAGE_TABLE_SENTINEL_OVERWRITTEN,
    }
)


def plural(count: int, word: str, many: str | None = None) -> str:
    """`1 finding`, `2 findings`; `many` where the plural is not `word` + s (`entries`). Every
    layer counts in these words (a leaf: never `slot(s)`)."""
    return f"{count} {word}" if count == 1 else f"{count} {many or word + 's'}"


def cell_unit(code: FindingCode, count: int) -> str:
    """What `count` cells of a finding code are, in words: `cells` of req_to_token, LUT or
    free-list `entries`, or `pages` (a leak), singular for 1."""
    if code in _PAGE_CODES:
        return "page" if count == 1 else "pages"
    if code in _ENTRY_CODES:
        return "entry" if count == 1 else "entries"
    return "cell" if count == 1 else "cells"


# --- block pools (vLLM's and any later engine's): codes of `kvcanary check` on a pool dump --


class PoolCode(StrEnum):
    """Stable identifiers of what a block-pool check finds (docs/findings.md, "Block pools"):
    a block's reference count, queue place, holders and hash against each other. Errors all."""

    BLOCK_OUT_OF_RANGE = "block-out-of-range"
    FREE_QUEUE_BROKEN = "free-queue-broken"
    FREE_QUEUE_DUPLICATE = "free-queue-duplicate"
    FREE_COUNT_MISMATCH = "free-count-mismatch"
    NEGATIVE_REF_COUNT = "negative-ref-count"
    QUEUED_BLOCK_HELD = "queued-block-held"
    REF_COUNT_LOW = "ref-count-low"
    REF_COUNT_HIGH = "ref-count-high"
    BLOCK_LEAKED = "block-leaked"
    NULL_BLOCK_MISPLACED = "null-block-misplaced"
    MAMBA_STATES_OVER_BOUND = "mamba-states-over-bound"
    BLOCK_IN_TWO_GROUPS = "block-in-two-groups"
    HASH_ENTRY_STALE = "hash-entry-stale"
    HASH_GROUP_FOREIGN = "hash-group-foreign"
    HASHED_BLOCK_UNMAPPED = "hashed-block-unmapped"
    TABLE_OF_DEAD_REQUEST = "table-of-dead-request"
    REQUEST_MISSING_IN_GROUP = "request-missing-in-group"


class PoolCause(StrEnum):
    """What to fix in a block pool, in precedence order among the faults a dump shows."""

    CORRUPT_BLOCK_ID = "corrupt-block-id"
    QUEUE_CORRUPT = "queue-corrupt"
    POOL_DOUBLE_FREE = "pool-double-free"
    FREED_WHILE_HELD = "freed-while-held"
    FREE_COUNT_DRIFT = "free-count-drift"
    NULL_BLOCK_MISUSED = "null-block-misused"
    MAMBA_STATE_NOT_RETIRED = "mamba-state-not-retired"
    CROSS_GROUP_BLOCK = "cross-group-block"
    STALE_HASH = "stale-hash"
    REQUEST_NOT_FREED = "request-not-freed"
    POOL_LEAK = "pool-leak"


@dataclass(frozen=True, kw_only=True)
class PoolFindingEntry:
    """What the catalog says about a block-pool finding (docs/findings.md, "Block pools")."""

    #: the invariant broken, and what it usually means.
    when: str
    meaning: str


@dataclass(frozen=True, kw_only=True)
class PoolCauseEntry:
    """What the catalog says about a block-pool cause: its story, fix and the findings it
    explains."""

    summary: str
    fix: str
    findings: tuple[PoolCode, ...]


POOL_FINDINGS: Mapping[PoolCode, PoolFindingEntry] = _table(
    PoolCode,
    (
        (
            PoolCode.BLOCK_OUT_OF_RANGE,
            PoolFindingEntry(
                when="a table, the free queue, the hash map or a deferred free names a block id "
                "outside `[0, num_blocks)`",
                meaning="a corrupt block id; the engine would index outside its pool",
            ),
        ),
        (
            PoolCode.FREE_QUEUE_BROKEN,
            PoolFindingEntry(
                when="the free queue walked head → tail does not end at its tail sentinel (a "
                "cycle) or disagrees with the walk back through the `prev` links",
                meaning="the queue's links were rewritten outside `popleft`/`remove`/`append`",
            ),
        ),
        (
            PoolCode.FREE_QUEUE_DUPLICATE,
            PoolFindingEntry(
                when="a block id appears more than once in the free queue",
                meaning="a block freed twice: it will be handed out to two requests",
            ),
        ),
        (
            PoolCode.FREE_COUNT_MISMATCH,
            PoolFindingEntry(
                when="the queue's own `num_free_blocks` differs from its length, or free + "
                "referenced + null differs from the pool size",
                meaning="the free counter ran ahead of (or behind) the queue: `popleft_n` "
                "asserts or hands out fewer blocks than asked",
            ),
        ),
        (
            PoolCode.NEGATIVE_REF_COUNT,
            PoolFindingEntry(
                when="a block's `ref_cnt` is negative",
                meaning="more frees than allocations of the block",
            ),
        ),
        (
            PoolCode.QUEUED_BLOCK_HELD,
            PoolFindingEntry(
                when="a block on the free queue is in a request's table or a deferred free "
                "(a block released until reuse excepted), or has `ref_cnt > 0`",
                meaning="freed while a request still reads it: the next allocation overwrites "
                "its KV",
            ),
        ),
        (
            PoolCode.REF_COUNT_LOW,
            PoolFindingEntry(
                when="a block's `ref_cnt` is below its holders (table entries across groups "
                "and deferred frees), not negative",
                meaning="a holder's reference was dropped early: the block returns to the queue "
                "while still held",
            ),
        ),
        (
            PoolCode.REF_COUNT_HIGH,
            PoolFindingEntry(
                when="a block's `ref_cnt` is above its holders",
                meaning="a reference never released: the block never returns to the queue",
            ),
        ),
        (
            PoolCode.BLOCK_LEAKED,
            PoolFindingEntry(
                when="a block that is not the null block, with `ref_cnt == 0`, is not on the "
                "free queue",
                meaning="freed without being queued: lost to the pool until restart",
            ),
        ),
        (
            PoolCode.NULL_BLOCK_MISPLACED,
            PoolFindingEntry(
                when="the null block is on the free queue; in a full-attention table; in a "
                "sliding-window or chunked-local table after a real block (only a leading run "
                "is dropped) or over a block the window of the request's computed tokens "
                "still reads (its processed tokens', where the dump records its tokens in "
                "flight and their stale share: a step in flight reads the window from "
                "before it); in a reference sliding window's table outside the gap between "
                "the request's prompt and its window; or in every entry of a Mamba table (its "
                "state dropped), a speculative decoder's scratch blocks at its end aside. Where "
                "else a Mamba table holds it is no finding (prefix caching leaves nulls "
                "between its states); a group of a kind kvcanary has no rule for is not "
                "checked here, and the report's coverage says so",
                meaning="the null block (no KV) is read as data, or handed out",
            ),
        ),
        (
            PoolCode.MAMBA_STATES_OVER_BOUND,
            PoolFindingEntry(
                when="a live request's Mamba table holds more state blocks (entries other "
                "than the null block) than its manager ever keeps at once: one where states "
                "are not cached by prefix (the block the model's length), two in prefix-"
                'caching ("align") mode (the last computed token\'s state and the previous '
                "step's, which the next step copies from), one more where the release keeps a "
                "prefill checkpoint block, and one more per block a request's tokens in flight "
                "reach (vLLM's async scheduling retires a state once the tokens after it are "
                "processed; `vllm.request_num_in_flight`), and one more per speculative block "
                "(a draft token a step verifies: `num_speculative_blocks`). The bound is read "
                "from the manager when the dump is taken; a group whose bound is not known (the "
                "scheduler's requests not read, an older dump) is not checked here, and the "
                "report's coverage says so",
                meaning="a state the request no longer reads was not retired (freed and "
                "nulled): its block is held until the request ends, and a long request "
                "holds more of the pool the longer it runs",
            ),
        ),
        (
            PoolCode.BLOCK_IN_TWO_GROUPS,
            PoolFindingEntry(
                when="one block is in the tables of two KV-cache groups",
                meaning="a group reuses a block another group still holds (groups share one "
                "pool and id space)",
            ),
        ),
        (
            PoolCode.HASH_ENTRY_STALE,
            PoolFindingEntry(
                when="a hash-map entry points to the null block or to a block that does not "
                "carry that hash",
                meaning="the block was reused without leaving the prefix cache: a prefix hit "
                "reads another prompt's KV",
            ),
        ),
        (
            PoolCode.HASH_GROUP_FOREIGN,
            PoolFindingEntry(
                when="a held block's hash names another group than the table holding it",
                meaning="a block cached for one group serves another",
            ),
        ),
        (
            PoolCode.HASHED_BLOCK_UNMAPPED,
            PoolFindingEntry(
                when="a block carries a hash that no hash-map entry points to it under",
                meaning="evicted from the map without its hash reset (or the reverse): a "
                "later eviction misses it",
            ),
        ),
        (
            PoolCode.TABLE_OF_DEAD_REQUEST,
            PoolFindingEntry(
                when="a non-empty block table belongs to a request the scheduler no longer has",
                meaning="a finished or aborted request whose blocks were never freed",
            ),
        ),
        (
            PoolCode.REQUEST_MISSING_IN_GROUP,
            PoolFindingEntry(
                when="a request has blocks in one group and none in another (groups allocate "
                "together)",
                meaning="a free or an allocation reached only some groups",
            ),
        ),
    ),
)

POOL_CAUSES: Mapping[PoolCause, PoolCauseEntry] = _table(
    PoolCause,
    (
        (
            PoolCause.CORRUPT_BLOCK_ID,
            PoolCauseEntry(
                summary="block ids outside the pool",
                fix="find the writer of the out-of-range id (a table or queue link written "
                "from another pool's size)",
                findings=(PoolCode.BLOCK_OUT_OF_RANGE,),
            ),
        ),
        (
            PoolCause.QUEUE_CORRUPT,
            PoolCauseEntry(
                summary="the free queue's links are corrupt",
                fix="touch the queue only through its own methods; guard `remove` against a "
                "block that is not queued",
                findings=(PoolCode.FREE_QUEUE_BROKEN,),
            ),
        ),
        (
            PoolCause.POOL_DOUBLE_FREE,
            PoolCauseEntry(
                summary="a block was freed twice",
                fix="guard `free_blocks` (ref_cnt > 0, block not queued) and find the second "
                "free: often a path that frees a request's blocks and a deferred or offload "
                "path that frees them again",
                findings=(PoolCode.FREE_QUEUE_DUPLICATE, PoolCode.NEGATIVE_REF_COUNT),
            ),
        ),
        (
            PoolCause.FREED_WHILE_HELD,
            PoolCauseEntry(
                summary="a block was freed while a request still holds it",
                fix="free a request's blocks only after its last reader (in-flight steps: "
                "defer the free), and drop it from the table when freeing",
                findings=(PoolCode.QUEUED_BLOCK_HELD, PoolCode.REF_COUNT_LOW),
            ),
        ),
        (
            PoolCause.FREE_COUNT_DRIFT,
            PoolCauseEntry(
                summary="the free counter disagrees with the free queue",
                fix="update `num_free_blocks` in the same place as the links",
                findings=(PoolCode.FREE_COUNT_MISMATCH,),
            ),
        ),
        (
            PoolCause.NULL_BLOCK_MISUSED,
            PoolCauseEntry(
                summary="the null block is where a real block belongs",
                fix="use the null block only for blocks a window dropped, never queue it",
                findings=(PoolCode.NULL_BLOCK_MISPLACED,),
            ),
        ),
        (
            PoolCause.MAMBA_STATE_NOT_RETIRED,
            PoolCauseEntry(
                summary="a Mamba group kept state blocks its request no longer reads",
                fix="retire each state once the next one is written: free it and put the null "
                "block in its place (the states before the last computed token's, and the "
                "previous step's once the new state is computed)",
                findings=(PoolCode.MAMBA_STATES_OVER_BOUND,),
            ),
        ),
        (
            PoolCause.CROSS_GROUP_BLOCK,
            PoolCauseEntry(
                summary="a block serves two KV-cache groups",
                fix="free a block in every group that holds it before any group reuses it",
                findings=(PoolCode.BLOCK_IN_TWO_GROUPS, PoolCode.HASH_GROUP_FOREIGN),
            ),
        ),
        (
            PoolCause.STALE_HASH,
            PoolCauseEntry(
                summary="the prefix-cache map and the blocks' hashes disagree",
                fix="evict a block from the map (and reset its hash) when it is reused",
                findings=(PoolCode.HASH_ENTRY_STALE, PoolCode.HASHED_BLOCK_UNMAPPED),
            ),
        ),
        (
            PoolCause.REQUEST_NOT_FREED,
            PoolCauseEntry(
                summary="a request left the scheduler with its blocks",
                fix="free the request in every group when it finishes, aborts or is preempted",
                findings=(PoolCode.TABLE_OF_DEAD_REQUEST, PoolCode.REQUEST_MISSING_IN_GROUP),
            ),
        ),
        (
            PoolCause.POOL_LEAK,
            PoolCauseEntry(
                summary="blocks neither free nor held",
                fix="find the path that drops a reference without `free_blocks`, or frees "
                "without queueing",
                findings=(PoolCode.BLOCK_LEAKED, PoolCode.REF_COUNT_HIGH),
            ),
        ),
    ),
)

#: pool finding code -> the cause that explains it.
POOL_CAUSE_OF: Mapping[PoolCode, PoolCause] = MappingProxyType(
    {code: cause for cause, entry in POOL_CAUSES.items() for code in entry.findings}
)
