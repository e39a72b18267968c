"""Which families of checks a dump lets run, declared once: `check` runs a family only where
`runs` says so, and reports the same answer as the dump's coverage (`coverage`), so a clean
verdict says what it checked and what it could not for lack of a record.

Each family names the records it needs (a tensor, a recorded scalar, the canary buffers),
whether it is an SWA check (not applicable to a dump with no sign of an SWA pool), the group
whose plan it runs in, and what else can stop it (a shrunk dump). The detectors read the same
declarations for the parts they gate themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvcanary_cli.dump.loader import KvDump, read_in_any_layout
from kvcanary_cli.dump.schema import HOST_POOL_PREFIXES, SCALARS, Group, Layout
from kvcanary_cli.results.check import CheckCoverage

__all__ = [
    "CANARY_REPLAY",
    "CHECKS",
    "FULL_FREE_LIST",
    "FULL_LEAKS",
    "HOST_FREE_LIST",
    "HOST_LEAKS",
    "HOST_SLOTS",
    "MAMBA_LEAKS",
    "MAMBA_SLOTS",
    "PAGE_TABLES",
    "REQUEST_ROWS",
    "STEP_WRITES",
    "SWA_FREE_LIST",
    "SWA_LEAKS",
    "SWA_LUT",
    "TREE_LOCKS",
    "CheckFamily",
    "coverage",
    "is_hicache_dump",
    "is_swa_dump",
    "runs",
    "why_not",
]

#: The canary buffers' name in a family's needs (any `canary.<group>.<buffer>` tensor).
CANARY_BUFFERS = "canary buffers"


@dataclass(frozen=True, kw_only=True)
class CheckFamily:
    """One family of checks and what it needs to run."""

    name: str
    #: what it looks for, in a user's words
    covers: str
    #: every entry is needed; an entry lists alternatives, each a set of records that
    #: together would do (`(("a",), ("b", "c"))`: a, or b and c)
    needs: tuple[tuple[tuple[str, ...], ...], ...] = ()
    #: an SWA check: not applicable to a dump with no sign of an SWA pool
    swa: bool = False
    #: the group whose plan it runs in (not run when that group is not checked)
    group: Group | None = None
    #: what else stops it (None: nothing), once its records are there
    blocker: Callable[[KvDump], str | None] | None = None
    #: the memory layouts it applies to (not applicable to the others)
    layouts: tuple[Layout, ...] = tuple(Layout)
    #: a HiCache check: not applicable to a dump with no record of a host pool
    hicache: bool = False


def _need(*names: str) -> tuple[tuple[str, ...], ...]:
    """One needed record (several names: any one of them)."""
    return tuple((name,) for name in names)


def _not_shrunk(dump: KvDump) -> str | None:
    return "a shrunk dump keeps too little of the free lists and the tree" if dump.shrunk else None


def _undescribed(dump: KvDump, size: str, lists: Sequence[str]) -> str | None:
    """Why a leak check (a bit per slot) does not run on a pool of scalar `size`: a size its
    `lists` (the records that place its slots) could not describe, as a corrupt scalar gives
    (2^44 slots beside a few dozen listed); None: it runs."""
    value = dump.scalars[size].value
    recorded = (getattr(dump, name) for name in lists)
    listed = sum(0 if values is None else int(values.size) for values in recorded)
    if value is None or value <= 4 * listed + (1 << 20):
        return None
    return f"{size} {value} is not a pool its lists could describe"


def _mamba_leak_blocker(dump: KvDump) -> str | None:
    lists = ("free_mamba_slots", "tree_mamba_slots", "req_mamba_slots")
    return _not_shrunk(dump) or _undescribed(dump, "num_mamba_slots", lists)


def _swa_leak_blocker(dump: KvDump) -> str | None:
    if dump.shrunk:
        return "a shrunk dump keeps too little of the LUT and the free lists"
    lut = dump.full_to_swa_index_mapping
    full_slots = dump.scalars["num_full_slots"].value
    if lut is None or full_slots is None:
        return None  # said as a missing record
    if not lut.complete or lut.element(-1) != -1 or int(lut.shape[0]) < full_slots + 1:
        # the slots past a sliced or short LUT map nowhere we can see
        return "the LUT is partial, sliced or shorter than the pool"
    return None


_LUT = "full_to_swa_index_mapping"

FULL_FREE_LIST = CheckFamily(
    name="full free list",
    covers="live slots on the free list (a batch row's, or with `req_pool_allocated_lens` a "
    "running request's: use after free), full double frees, the reserved "
    "page on the free list, free full slots still mapped in the LUT",
    needs=(_need("free_full_slots"),),
)
SWA_FREE_LIST = CheckFamily(
    name="SWA free list",
    covers="SWA double frees, the reserved SWA page on the free list; with the LUT: freed "
    "SWA peers of live cells, stale SWA mappings",
    needs=(_need("free_swa_slots"),),
    swa=True,
    layouts=(Layout.PAGED,),  # unified memory's SWA side frees through its page table
)
SWA_LUT = CheckFamily(
    name="SWA LUT",
    covers="every SWA check of the batch: unmapped and colliding in-window slots, the LUT's "
    "length and sentinel, SWA slots with two owners, pages out of lockstep, the reserved page "
    "mapped",
    needs=(_need(_LUT),),
    swa=True,
    group=Group.SWA,
)
STEP_WRITES = CheckFamily(
    name="step writes",
    covers="this step's writes (out_cache_loc) into slots other cells hold live",
    needs=(_need("out_cache_loc"),),
)
FULL_LEAKS = CheckFamily(
    name="full pool leaks",
    covers="full slots neither free, nor the tree's, nor a running request's; slots the tree "
    "does not hold in two running requests' cells",
    needs=(
        _need("tree_full_slots"),
        _need("free_full_slots"),
        _need("req_pool_allocated_lens"),
        _need("num_full_slots"),
    ),
    blocker=_not_shrunk,
)
SWA_LEAKS = CheckFamily(
    name="SWA pool leaks",
    covers="SWA pages neither free nor mapped from a held full slot",
    needs=(
        _need(_LUT),
        _need("free_swa_slots"),
        (
            ("held_full_slots",),
            ("free_full_slots",),
            ("tree_full_slots", "req_pool_allocated_lens"),
        ),
        _need("num_full_slots"),
        _need("num_swa_slots"),
    ),
    swa=True,
    blocker=_swa_leak_blocker,
    layouts=(Layout.PAGED,),
)
REQUEST_ROWS = CheckFamily(
    name="request rows",
    covers="pool rows free and held, listed twice, or leaked",
    needs=(_need("free_req_rows", "running_req_rows"),),
)
TREE_LOCKS = CheckFamily(
    name="tree locks",
    covers="locked tree slots no running request holds (locks never released)",
    needs=(_need("tree_locked_full_slots"), _need("running_req_rows")),
)
PAGE_TABLES = CheckFamily(
    name="page tables",
    covers="unified memory's virtual pages: unbound while held, bound twice, a physical page "
    "behind two virtual ones, free while bound, tables sized by the wrong id space or their "
    "sentinels overwritten, a physical free list (holes) naming -1, a page twice or a bound "
    "page",
    layouts=(Layout.UNIFIED_SWA,),
    blocker=lambda dump: None if dump.page_tables else "the dump records no page tables",
)
MAMBA_SLOTS = CheckFamily(
    name="Mamba slots",
    covers="Mamba state slots free and held, held twice, freed twice, slot 0 handed out, a "
    "live row mapped to another slot than its request's",
    needs=(_need("free_mamba_slots", "tree_mamba_slots", "req_mamba_slots"),),
    layouts=(Layout.MAMBA,),
    blocker=_not_shrunk,
)
MAMBA_LEAKS = CheckFamily(
    name="Mamba slot leaks",
    covers="Mamba slots neither free, nor the tree's, nor a live request's",
    needs=(
        _need("free_mamba_slots"),
        _need("tree_mamba_slots"),
        _need("req_mamba_slots"),
        _need("num_mamba_slots"),
    ),
    layouts=(Layout.MAMBA,),
    blocker=_mamba_leak_blocker,
)
HOST_FREE_LIST = CheckFamily(
    name="HiCache host free list",
    covers="HiCache host slots freed twice, host slots outside the host pool",
    needs=(_need("host_free_slots"),),
    hicache=True,
)
HOST_SLOTS = CheckFamily(
    name="HiCache host slots",
    covers="HiCache host slots free while a tree node's host value holds them, held by two "
    "nodes, outside the host pool",
    needs=(_need("tree_host_slots"), _need("host_free_slots")),
    hicache=True,
)


def _host_leak_blocker(dump: KvDump) -> str | None:
    if dump.shrunk:
        return "a shrunk dump keeps too little of the free lists and the tree"
    if dump.scalars["host_slots_accounted"].value != 1:
        return (
            "the capture did not rule out host slots held in flight (a storage tier's, "
            "buffer-only host memory, disaggregated decode; host_slots_accounted not 1)"
        )
    for prefix in HOST_POOL_PREFIXES.values():
        lists = (f"{prefix}host_free_slots", f"tree_{prefix}host_slots")
        if (refused := _undescribed(dump, f"num_{prefix}host_slots", lists)) is not None:
            return refused
    return None


HOST_LEAKS = CheckFamily(
    name="HiCache host slot leaks",
    covers="HiCache host slots neither on their pool's free list nor a tree node's, where "
    "the capture ruled out every other holder",
    needs=(_need("host_free_slots"), _need("tree_host_slots"), _need("num_host_slots")),
    hicache=True,
    blocker=_host_leak_blocker,
)
CANARY_REPLAY = CheckFamily(
    name="canary replay",
    covers="verify replayed on the dump's canary buffers (chain, position, token, real KV)",
    needs=(_need(CANARY_BUFFERS),),
)

#: Every family, in report order.
CHECKS: tuple[CheckFamily, ...] = (
    FULL_FREE_LIST,
    SWA_LUT,
    SWA_FREE_LIST,
    STEP_WRITES,
    FULL_LEAKS,
    SWA_LEAKS,
    REQUEST_ROWS,
    TREE_LOCKS,
    PAGE_TABLES,
    MAMBA_SLOTS,
    MAMBA_LEAKS,
    HOST_FREE_LIST,
    HOST_SLOTS,
    HOST_LEAKS,
    CANARY_REPLAY,
)

#: Records only a dump of a hybrid-SWA model holds.
_SWA_SIGNS = ("free_swa_slots", "swa_out_cache_loc", "tree_swa_resident_slots")


def _has(dump: KvDump, name: str) -> bool:
    """The dump records `name`: a tensor, a scalar given as a fact, or canary buffers."""
    if name == CANARY_BUFFERS:
        return bool(dump.canary_buffers)
    if name in SCALARS:
        scalar = dump.scalars[name]
        return scalar.value is not None and not scalar.assumed
    return getattr(dump, name) is not None


def is_swa_dump(dump: KvDump) -> bool:
    """A hybrid-SWA dump: it has a LUT, records an SWA window or pool, or an SWA record."""
    if dump.full_to_swa_index_mapping is not None:
        return True
    if any(_has(dump, name) for name in ("swa_window_size", "num_swa_slots")):
        return True
    return any(getattr(dump, name) is not None for name in _SWA_SIGNS)


#: Records only a dump of a HiCache server holds (its host pool).
_HICACHE_SIGNS = ("host_free_slots", "tree_host_slots")


def is_hicache_dump(dump: KvDump) -> bool:
    """A dump of a server with HiCache on: it records the host pool's size or a host record."""
    if _has(dump, "num_host_slots"):
        return True
    return any(getattr(dump, name) is not None for name in _HICACHE_SIGNS)


def _missing(dump: KvDump, family: CheckFamily) -> tuple[str, ...]:
    """The needed records the dump lacks, each as its alternatives read ("a or b and c")."""
    return tuple(
        " or ".join(" and ".join(together) for together in alternatives)
        for alternatives in family.needs
        if not any(all(_has(dump, name) for name in together) for together in alternatives)
    )


def _coverage(
    dump: KvDump, family: CheckFamily, groups: Sequence[str] | None = None
) -> CheckCoverage:
    def line(
        status: str, missing: tuple[str, ...] = (), reason: str | None = None
    ) -> CheckCoverage:
        return CheckCoverage(
            check=family.name,
            covers=family.covers,
            status=status,  # type: ignore[arg-type]
            missing=missing,
            reason=reason,
        )

    if dump.layout not in tuple(Layout) and not all(
        read_in_any_layout(name)
        for alternatives in family.needs
        for together in alternatives
        for name in together
    ):  # its records were not read (the dump's one note says which)
        return line("not-run", reason=f"layout {dump.layout[:60]!r} is not one kvcanary checks")
    if (
        dump.layout not in family.layouts
        or (family.swa and not is_swa_dump(dump))
        or (family.hicache and not is_hicache_dump(dump))
    ):
        return line("not-applicable")
    missing = _missing(dump, family)
    if missing:
        return line("not-run", missing)
    if family.group is not None and groups is not None and family.group not in groups:
        return line("not-run", reason=f"the {family.group} group was not checked (--group)")
    reason = family.blocker(dump) if family.blocker is not None else None
    return line("not-run", reason=reason) if reason else line("ran")


def runs(dump: KvDump, family: CheckFamily, groups: Sequence[str] | None = None) -> bool:
    """Whether `family` runs on `dump` (with `groups` checked; None: whatever the groups)."""
    return _coverage(dump, family, groups).status == "ran"


def why_not(dump: KvDump, family: CheckFamily) -> str | None:
    """Why `family` does not run on `dump`, in words (None: it runs)."""
    found = _coverage(dump, family)
    if found.status == "ran":
        return None
    if found.missing:
        return "record " + " and ".join(found.missing)
    if found.reason:
        return found.reason
    return "not a HiCache dump" if family.hicache else "not a hybrid-SWA dump"


def coverage(dump: KvDump, groups: Sequence[str] | None = None) -> tuple[CheckCoverage, ...]:
    """Every family, in report order, with whether it ran on `dump` (`groups`: the groups
    checked)."""
    return tuple(_coverage(dump, family, groups) for family in CHECKS)
