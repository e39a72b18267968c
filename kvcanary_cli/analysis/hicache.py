"""HiCache's host pools (SGLang 0.5.23's `HostPoolGroup`: the anchor `HostKVCache`, and the
SWA and Mamba host pools beside it where the dump records them): the host slots the device
checks cannot see.

A node backed up to host keeps its copy's slots as its `host_value` (one per component and
pool: the Full KV's in the anchor, the SWA KV's and the Mamba state's in their own pools);
each pool keeps the rest on its free list (`free_slots`, and the freed chunks staged in
`release_slots` until an `alloc` merges them). In a correct state no slot of a pool is both,
none is held by two nodes or listed twice, and every one lies inside its pool. SGLang's only
guards are the asserts inside `HostKVCache.alloc` and `free` (its `slot_used` bits), which a
free of a slot its node still holds passes; `MambaPoolHost` has none. Slots in flight (a
prefetch's, a retraction backup's) are in neither place, so a leak is claimed only where the
capture ruled every such holder out (`host_slots_accounted`; docs/findings.md, "HiCache host
pools"). Each check is a sort over lists as long as the pool.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kvcanary_cli.analysis.cells import IDS_SHOWN, flat_ids, id_list_finding, repeated
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import HOST_POOL_PREFIXES
from kvcanary_cli.dump.tensor import common, distinct
from kvcanary_cli.results.check import Finding, JsonValue

__all__ = ["HOST_POOLS", "host_free_list_findings", "host_leak_findings", "host_slot_findings"]

#: Each host pool a dump may record (`HOST_POOL_PREFIXES`): its name in a finding's
#: `details.pool`, the word that names its slots in messages, and its records' prefix. The
#: anchor's first.
HOST_POOLS: tuple[tuple[str, str, str], ...] = tuple(
    (name, {"swa": "SWA ", "mamba": "Mamba "}.get(name, ""), prefix)
    for name, prefix in HOST_POOL_PREFIXES.items()
)


@dataclass(frozen=True)
class _Pool:
    """One host pool's records, flattened."""

    name: str
    #: "" for the anchor, "SWA " or "Mamba " for a side pool: put before "host slot"
    label: str
    free: np.ndarray
    #: the tree's host values of this pool (None: not recorded)
    held: np.ndarray | None
    nodes: np.ndarray | None
    locks: np.ndarray | None
    size: int | None


def _pools(dump: KvDump) -> Iterator[_Pool]:
    """The host pools whose free list the dump records, the anchor first."""
    for name, label, prefix in HOST_POOLS:
        free = flat_ids(getattr(dump, f"{prefix}host_free_slots"))
        if free is None:
            continue
        held = flat_ids(getattr(dump, f"tree_{prefix}host_slots"))
        yield _Pool(
            name=name,
            label=label,
            free=free,
            held=held,
            nodes=_aligned(getattr(dump, f"tree_{prefix}host_nodes"), held),
            locks=_aligned(getattr(dump, f"tree_{prefix}host_lock_refs"), held),
            size=dump.scalars[f"num_{prefix}host_slots"].value,
        )


def _aligned(values: np.ndarray | None, held: np.ndarray | None) -> np.ndarray | None:
    """A per-entry record of a pool's tree host slots (node ids, lock counts), None when it
    is not recorded or not aligned with the slots."""
    flat = None if values is None or held is None else flat_ids(values)
    return flat if flat is not None and held is not None and flat.size == held.size else None


def host_free_list_findings(dump: KvDump) -> list[Finding]:
    """Each host pool's free list alone: slots listed twice, slots outside the pool."""
    found: list[Finding] = []
    for pool in _pools(dump):
        twice = repeated(pool.free)
        if twice.size:
            where = f"the HiCache {pool.label}host free list"
            found.append(
                id_list_finding(
                    FindingCode.HOST_SLOT_FREED_TWICE,
                    twice,
                    f"{pool.label}host slot {{slot}} is listed twice on {where}: freed twice",
                    f"{pool.label}host slots {{slots}} are listed twice on {where}: freed twice",
                    key="host_slots",
                    pool=pool.name,
                )
            )
        found += _range_finding(pool, f"the {pool.label}host free list", pool.free)
    return found


def _range_finding(pool: _Pool, where: str, slots: np.ndarray) -> list[Finding]:
    """`HOST_SLOT_OUT_OF_RANGE`: slots below 0, or past the pool where its size is known."""
    size = pool.size
    bad = distinct(slots[(slots < 0) if size is None else (slots < 0) | (slots >= size)])
    if not bad.size:
        return []
    outside = "below 0" if size is None else f"outside the {pool.label}host pool's {size} slots"
    return [
        id_list_finding(
            FindingCode.HOST_SLOT_OUT_OF_RANGE,
            bad,
            f"{pool.label}host slot {{slot}} in {where} is {outside}",
            f"{pool.label}host slots {{slots}} in {where} are {outside}",
            key="host_slots",
            where=where,
            pool=pool.name,
        )
    ]


def host_slot_findings(dump: KvDump) -> list[Finding]:
    """Each host pool's tree host values against its free list: free and held, held twice,
    and the tree's slots outside the pool (pools whose tree host values are recorded)."""
    found: list[Finding] = []
    for pool in _pools(dump):
        if pool.held is not None:
            found += _held_findings(pool, pool.held)
    return found


def _held_findings(pool: _Pool, held: np.ndarray) -> list[Finding]:
    found: list[Finding] = []
    label, nodes = pool.label, pool.nodes
    both = common(pool.free, held)
    if both.size:
        at = np.isin(held, both)
        details: dict[str, JsonValue] = {"pool": pool.name}
        if nodes is not None:
            details["nodes"] = [int(n) for n in distinct(nodes[at])[:IDS_SHOWN]]
        if pool.locks is not None:
            details["host_locked"] = bool((pool.locks[at] > 0).any())
        found.append(
            id_list_finding(
                FindingCode.HOST_SLOT_FREE_AND_HELD,
                both,
                f"{label}host slot {{slot}} is on the HiCache {label}host free list, yet a "
                f"tree node's {label}host value holds it: the next backup overwrites that "
                "node's host copy",
                f"{label}host slots {{slots}} are on the HiCache {label}host free list, yet "
                f"tree nodes' {label}host values hold them: the next backups overwrite those "
                "host copies",
                key="host_slots",
                **details,
            )
        )
    twice = repeated(held)
    if twice.size:
        details = {"pool": pool.name}
        if nodes is not None:
            details["nodes"] = [int(n) for n in distinct(nodes[np.isin(held, twice)])[:IDS_SHOWN]]
        found.append(
            id_list_finding(
                FindingCode.HOST_SLOT_HELD_TWICE,
                twice,
                f"{label}host slot {{slot}} is held twice by the tree's {label}host values: "
                "two cached prefixes share one host copy",
                f"{label}host slots {{slots}} are held twice by the tree's {label}host "
                "values: two cached prefixes share each host copy",
                key="host_slots",
                **details,
            )
        )
    found += _range_finding(pool, f"a tree node's {label}host value", held)
    return found


def host_leak_findings(dump: KvDump) -> list[Finding]:
    """`HOST_SLOT_LEAKED`: each pool's slots 0 .. size - 1 neither free nor held (run only
    where the capture vouched that nothing else holds one: see coverage)."""
    found: list[Finding] = []
    for pool in _pools(dump):
        if pool.held is None or pool.size is None:
            continue
        placed = np.zeros(pool.size, dtype=bool)
        for slots in (pool.free, pool.held):
            placed[slots[(slots >= 0) & (slots < pool.size)]] = True
        leaked = np.flatnonzero(~placed).astype(np.int64)
        if leaked.size:
            label = pool.label
            found.append(
                id_list_finding(
                    FindingCode.HOST_SLOT_LEAKED,
                    leaked,
                    f"{label}host slot {{slot}} is neither on the HiCache {label}host free "
                    f"list nor in any node's {label}host value, and nothing else holds "
                    "one: leaked",
                    f"{label}host slots {{slots}} are neither on the HiCache {label}host free "
                    f"list nor in any node's {label}host value, and nothing else holds "
                    "one: leaked",
                    key="host_slots",
                    pool=pool.name,
                )
            )
    return found
