"""The hybrid Mamba layout's state slots (SGLang 0.5.23's `HybridReqToTokenPool`,
`MambaSlotAllocator`, the radix tree's `MambaComponent`): what the paged checks cannot see.

Besides its full-attention KV (checked as the paged layout's), each live request holds one
Mamba state slot (`mamba_pool_idx`; a waiting request's copy-on-write slot too, and with the
extra buffer its ping-pong slots), each tree checkpoint one, and the allocator's free list the
rest; slot 0 is the dummy write target of padded tokens, never handed out. In a correct state
every slot 1..size is in exactly one of those places, and each live request's row maps
(`req_index_to_mamba_index_mapping`) to its own slot and, with the extra buffer, to its own
ping-pong slots (`req_index_to_mamba_ping_pong_track_buffer_mapping`: the forward writes the
tracked state where that map points, so a stale entry writes into a slot the tree now holds).
SGLang checks none of it while busy, and at idle only counts. Each check is a few sorts over
lists as long as the pool.
"""

from __future__ import annotations

import numpy as np

from kvcanary_cli.analysis.cells import flat_ids, id_list_finding, repeated
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import Group, Layout
from kvcanary_cli.dump.tensor import common, distinct
from kvcanary_cli.results.check import Finding

__all__ = ["mamba_findings", "mamba_leak_findings", "track_groups", "track_map_mismatches"]


def _finding(code: FindingCode, slots: np.ndarray, one: str, many: str) -> Finding:
    return id_list_finding(code, slots, one, many, key="mamba_slots")


def _size(dump: KvDump) -> int | None:
    size = dump.scalars["num_mamba_slots"].value
    return None if size is None else int(size)


def _in_pool(dump: KvDump, *records: np.ndarray | None) -> np.ndarray:
    """The slots `records` name, once per mention, less those past the pool (`_beyond` names
    them once; no other check counts them)."""
    slots = np.concatenate([flat_ids(values) for values in records])
    size = _size(dump)
    return slots if size is None else slots[(slots >= 0) & (slots < size)]


def _beyond(dump: KvDump) -> list[Finding]:
    """`MAMBA_SLOT_BEYOND_POOL`: ids outside 0..size-1 on the free list, in the tree or held
    by a live request, said once with where each place holds them."""
    size = _size(dump)
    if size is None:
        return []
    places = (
        ("the Mamba free list", flat_ids(dump.free_mamba_slots)),
        ("the tree", flat_ids(dump.tree_mamba_slots)),
        ("a live request", flat_ids(dump.req_mamba_slots)),
    )
    outside = [(name, s[(s < 0) | (s >= size)]) for name, s in places]
    where = [name for name, slots in outside if slots.size]
    if not where:
        return []
    slots = distinct(np.concatenate([slots for _, slots in outside]))
    pool = f"outside the pool's slots 0..{size - 1}, on " + " and ".join(where)
    return [
        _finding(
            FindingCode.MAMBA_SLOT_BEYOND_POOL,
            slots,
            "Mamba slot {slot} is " + pool,
            "Mamba slots {slots} are " + pool,
        )
    ]


def mamba_findings(dump: KvDump) -> list[Finding]:
    """Slot ids past the pool, slots free and held, owned twice, freed twice, slot 0 in use,
    and live rows mapped to another slot than their request's (none for another layout, or a
    shrunk dump)."""
    if dump.layout != Layout.MAMBA or dump.shrunk:
        return []
    found = _beyond(dump)
    free = _in_pool(dump, dump.free_mamba_slots)
    held = _in_pool(dump, dump.tree_mamba_slots, dump.req_mamba_slots)  # once per holding
    for code, slots, one, many in (
        (
            FindingCode.MAMBA_SLOT_FREE_AND_HELD,
            common(free, held),
            "Mamba slot {slot} is on the Mamba free list, yet a tree node or a live request "
            "holds it: the next alloc hands its state to a second owner",
            "Mamba slots {slots} are on the Mamba free list, yet tree nodes or live requests "
            "hold them: the next allocs hand their states to second owners",
        ),
        (
            FindingCode.MAMBA_SLOT_OWNED_TWICE,
            repeated(held),
            "Mamba slot {slot} is held twice (tree nodes or live requests): two owners "
            "share one recurrent state",
            "Mamba slots {slots} are held twice (tree nodes or live requests): two owners "
            "share each state",
        ),
        (
            FindingCode.MAMBA_SLOT_FREED_TWICE,
            repeated(free),
            "Mamba slot {slot} is listed twice on the Mamba free list: freed twice",
            "Mamba slots {slots} are listed twice on the Mamba free list: freed twice",
        ),
    ):
        slots = slots[slots > 0]  # slot 0 is said once, as the reserved slot in use
        if slots.size:
            found.append(_finding(code, slots, one, many))
    if bool((free == 0).any() or (held == 0).any()):
        where = [
            name
            for name, values in (
                ("the Mamba free list", free),
                ("the tree", flat_ids(dump.tree_mamba_slots)),
                ("a live request", flat_ids(dump.req_mamba_slots)),
            )
            if bool((values == 0).any())
        ]
        found.append(
            _finding(
                FindingCode.MAMBA_RESERVED_SLOT_IN_USE,
                np.zeros(1, dtype=np.int64),
                "Mamba slot 0, reserved for padded tokens, is on " + " and ".join(where),
                "",
            )
        )
    found += _row_map(dump)
    return found


def track_groups(slots: np.ndarray, rows: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Each live request's (row, ping-pong slots), read from `req_mamba_slots` and
    `req_mamba_rows`: a request's slot with its row, then its ping-pong slots marked -2.
    Requests without a row (waiting) and ping-pong slots before any row are left out."""
    starts = np.flatnonzero(rows != -2)
    groups: list[tuple[int, np.ndarray]] = []
    for at, end in zip(starts, [*starts[1:], rows.size][: starts.size], strict=True):
        if rows[at] > 0:
            groups.append((int(rows[at]), slots[at + 1 : end]))
    return groups


def track_map_mismatches(
    track_map: np.ndarray, slots: np.ndarray, rows: np.ndarray
) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Each live row whose ping-pong map entries (those >= 0) are not, as a set with their
    counts, its request's ping-pong slots: (row, mapped, held). A request of no track slots is
    not compared (a release without the extra buffer lists none, its map row is zeros)."""
    found = []
    for row, held in track_groups(slots, rows):
        if not held.size or row >= track_map.shape[0]:
            continue
        mapped = track_map[row]
        mapped = mapped[mapped >= 0]
        if not np.array_equal(np.sort(mapped), np.sort(held)):
            found.append((row, mapped, held))
    return found


def _track_map(dump: KvDump) -> list[Finding]:
    """`MAMBA_ROW_MAP_MISMATCH` for the extra buffer's ping-pong map
    (`track_map_mismatches`)."""
    track_map, slots, rows = (
        dump.req_index_to_mamba_ping_pong_track_buffer_mapping,
        dump.req_mamba_slots,
        dump.req_mamba_rows,
    )
    if track_map is None or slots is None or rows is None or slots.size != rows.size:
        return []
    track_map = np.asarray(track_map, dtype=np.int64).reshape(track_map.shape[0], -1)
    found = []
    for row, mapped, held in track_map_mismatches(track_map, flat_ids(slots), flat_ids(rows)):
        shown = ", ".join(str(int(s)) for s in mapped) or "none"
        own = ", ".join(str(int(s)) for s in held)
        found.append(
            Finding(
                code=FindingCode.MAMBA_ROW_MAP_MISMATCH,
                group=Group.FULL,
                pool_row=row,
                message=(
                    f"pool row {row}'s ping-pong track map names Mamba slots {shown}, but its "
                    f"request tracks in {own}: the forward writes its tracked state into "
                    "slots that are not the request's (a state the tree holds, or a free one)"
                ),
                details={
                    "map": "ping-pong",
                    "mapped_track": [int(s) for s in mapped],
                    "held_track": [int(s) for s in held],
                },
            )
        )
    return found


def _row_map(dump: KvDump) -> list[Finding]:
    """`MAMBA_ROW_MAP_MISMATCH`: a live request's row maps to another slot than its own (its
    working slot, then with the extra buffer its ping-pong slots: `_track_map`)."""
    row_map, slots, rows = (
        dump.req_index_to_mamba_index_mapping,
        dump.req_mamba_slots,
        dump.req_mamba_rows,
    )
    if row_map is None or slots is None or rows is None or slots.size != rows.size:
        return _track_map(dump)
    mapping = flat_ids(row_map)
    slots, rows = flat_ids(slots), flat_ids(rows)
    live = (rows > 0) & (rows < mapping.size)
    slots, rows = slots[live], rows[live]
    wrong = mapping[rows] != slots
    found = []
    for row, mapped, held in zip(rows[wrong], mapping[rows][wrong], slots[wrong], strict=True):
        found.append(
            Finding(
                code=FindingCode.MAMBA_ROW_MAP_MISMATCH,
                group=Group.FULL,
                pool_row=int(row),
                message=(
                    f"pool row {int(row)} maps to Mamba slot {int(mapped)}, but its request "
                    f"holds Mamba slot {int(held)}: its kernels run on another state"
                ),
                details={"mapped": int(mapped), "held": int(held)},
            )
        )
    return found + _track_map(dump)


def mamba_leak_findings(dump: KvDump) -> list[Finding]:
    """`MAMBA_SLOT_LEAKED`: slots 1..size in no place (every record needed: see coverage)."""
    size = _size(dump)
    if dump.layout != Layout.MAMBA or size is None or dump.req_mamba_slots is None:
        return []
    accounted = np.zeros(size, dtype=bool)
    accounted[0] = True
    for values in (dump.free_mamba_slots, dump.tree_mamba_slots, dump.req_mamba_slots):
        flat = flat_ids(values)
        accounted[flat[(flat >= 0) & (flat < size)]] = True
    leaked = np.flatnonzero(~accounted).astype(np.int64)
    if not leaked.size:
        return []
    return [
        _finding(
            FindingCode.MAMBA_SLOT_LEAKED,
            leaked,
            "Mamba slot {slot} is neither free, nor a tree node's, nor a live request's: leaked",
            "Mamba slots {slots} are neither free, nor a tree node's, nor a live request's: leaked",
        )
    ]
