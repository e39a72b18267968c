"""HiCache's host KV pool (SGLang 0.5.23's `HostKVCache`, the anchor of its `HostPoolGroup`):
the host slots the device checks cannot see.

A node backed up to host keeps its copy's slots as its `host_value`; `HostKVCache` keeps the
rest on its free list (`free_slots`, and the freed chunks staged in `release_slots` until an
`alloc` merges them). In a correct state no slot is both, none is held by two nodes or listed
twice, and every one lies inside the pool. SGLang's only guards are the asserts inside
`alloc` and `free` (its `slot_used` bits), which a free of a slot its node still holds passes.
Slots in flight (a prefetch's, a retraction backup's) are in neither place, so no leak is
claimed. Each check is a sort over lists as long as the pool.
"""

from __future__ import annotations

import numpy as np

from kvcanary_cli.analysis.cells import IDS_SHOWN, flat_ids, id_list_finding, repeated
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.results.check import Finding, JsonValue

__all__ = ["host_free_list_findings", "host_slot_findings"]


def _aligned(values: np.ndarray | None, held: np.ndarray) -> np.ndarray | None:
    """A per-entry record of `tree_host_slots` (node ids, lock counts), None when it is not
    recorded or not aligned with the slots."""
    flat = None if values is None else flat_ids(values)
    return flat if flat is not None and flat.size == held.size else None


def host_free_list_findings(dump: KvDump) -> list[Finding]:
    """The host free list alone: slots listed twice, slots outside the pool."""
    free = flat_ids(dump.host_free_slots)
    found: list[Finding] = []
    twice = repeated(free)
    if twice.size:
        found.append(
            id_list_finding(
                FindingCode.HOST_SLOT_FREED_TWICE,
                twice,
                "host slot {slot} is listed twice on the HiCache host free list: freed twice",
                "host slots {slots} are listed twice on the HiCache host free list: freed twice",
                key="host_slots",
            )
        )
    found += _range_finding(dump, "the host free list", free)
    return found


def _range_finding(dump: KvDump, where: str, slots: np.ndarray) -> list[Finding]:
    """`HOST_SLOT_OUT_OF_RANGE`: slots below 0, or past the pool where its size is known."""
    size = dump.scalars["num_host_slots"].value
    bad = np.unique(slots[(slots < 0) if size is None else (slots < 0) | (slots >= size)])
    if not bad.size:
        return []
    pool = "below 0" if size is None else f"outside the host pool's {size} slots"
    return [
        id_list_finding(
            FindingCode.HOST_SLOT_OUT_OF_RANGE,
            bad,
            f"host slot {{slot}} in {where} is {pool}",
            f"host slots {{slots}} in {where} are {pool}",
            key="host_slots",
            where=where,
        )
    ]


def host_slot_findings(dump: KvDump) -> list[Finding]:
    """The tree's host values against the free list: free and held, held twice, and the
    tree's slots outside the pool."""
    free, held = flat_ids(dump.host_free_slots), flat_ids(dump.tree_host_slots)
    nodes = _aligned(dump.tree_host_nodes, held)
    locks = _aligned(dump.tree_host_lock_refs, held)
    found: list[Finding] = []
    both = np.intersect1d(free, held)
    if both.size:
        at = np.isin(held, both)
        details: dict[str, JsonValue] = {}
        if nodes is not None:
            details["nodes"] = [int(n) for n in np.unique(nodes[at])[:IDS_SHOWN]]
        if locks is not None:
            details["host_locked"] = bool((locks[at] > 0).any())
        found.append(
            id_list_finding(
                FindingCode.HOST_SLOT_FREE_AND_HELD,
                both,
                "host slot {slot} is on the HiCache host free list, yet a tree node's "
                "host value holds it: the next backup overwrites that node's host copy",
                "host slots {slots} are on the HiCache host free list, yet tree nodes' host "
                "values hold them: the next backups overwrite those host copies",
                key="host_slots",
                **details,
            )
        )
    twice = repeated(held)
    if twice.size:
        details = {}
        if nodes is not None:
            details["nodes"] = [int(n) for n in np.unique(nodes[np.isin(held, twice)])[:IDS_SHOWN]]
        found.append(
            id_list_finding(
                FindingCode.HOST_SLOT_HELD_TWICE,
                twice,
                "host slot {slot} is held twice by the tree's host values: two cached "
                "prefixes share one host copy",
                "host slots {slots} are held twice by the tree's host values: two cached "
                "prefixes share each host copy",
                key="host_slots",
                **details,
            )
        )
    found += _range_finding(dump, "a tree node's host value", held)
    return found
