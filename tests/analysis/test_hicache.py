"""HiCache's host pool checks (analysis/hicache.py) on small hand-made dumps: a correct state
checks clean, and each fault of the host slots (free and held, held by two nodes, freed twice,
outside the pool, leaked where the capture vouched that nothing else holds one) is named
with its cause, in the anchor KV pool and in each side pool (SWA, Mamba) with the pool
named, each beside its clean twin (a slot in neither place without that word is silent);
the pools' slot ids are separate spaces (the same id free in one and held in another is no
fault); a dump without host records says the HiCache checks do not apply, and one with the
free list only says which check did not run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcanary_cli.api import check
from kvcanary_cli.dump.writer import dump_contents, write_dump

#: host slots 0..SIZE-1: node 7 holds 0..3 (host-locked: a load-back reads it), node 9 holds
#: 4..5, 6..11 are free (8..11 staged for release, listed after the free slots)
SIZE = 12
#: the side pools, each its own id space: (record prefix, size, held, held's nodes, free).
#: SWA: node 7 holds 0..1, node 9 2..3, 4..7 free; Mamba: node 7 holds 0, node 9 1, 2..5 free
SIDE_POOLS = {
    "swa": ("swa_", 8, [0, 1, 2, 3], [7, 7, 9, 9], [4, 5, 6, 7]),
    "mamba": ("mamba_", 6, [0, 1], [7, 9], [2, 3, 4, 5]),
}
#: each pool's record prefix and size
POOLS = {"kv": ("", SIZE), **{name: pool[:2] for name, pool in SIDE_POOLS.items()}}


def _state(side: bool = True) -> dict[str, Any]:
    """The correct state, with the side pools' records (`side`) or the anchor's only (a dump
    of a tree without side pools, or one written before they were recorded)."""
    table = np.zeros((3, 8), dtype=np.int32)
    table[1, :3] = [1, 2, 3]
    state = {
        "req_to_token": table,
        "req_pool_indices": np.array([1]),
        "prefix_lens": np.array([2]),
        "extend_seq_lens": np.array([1]),
        "free_full_slots": np.arange(4, 16),
        "host_free_slots": np.array([6, 7, 8, 9, 10, 11]),
        "tree_host_slots": np.array([0, 1, 2, 3, 4, 5]),
        "tree_host_nodes": np.array([7, 7, 7, 7, 9, 9]),
        "tree_host_lock_refs": np.array([1, 1, 1, 1, 0, 0]),
    }
    if side:
        for prefix, _, held, nodes, free in SIDE_POOLS.values():
            state[f"{prefix}host_free_slots"] = np.array(free)
            state[f"tree_{prefix}host_slots"] = np.array(held)
            state[f"tree_{prefix}host_nodes"] = np.array(nodes)
            state[f"tree_{prefix}host_lock_refs"] = np.array([int(n == 7) for n in nodes])
    return state


def _check(
    tmp_path: Path, state: dict[str, Any], size: int | None = SIZE, accounted: bool = True
) -> Any:
    """Checked with the pools' sizes (`size`: the anchor's; None: no size recorded) and, with
    `accounted`, the capture's word that nothing else holds a host slot."""
    metadata: dict[str, Any] = {"num_full_slots": 16, "page_size": 1}
    if accounted:
        metadata["host_slots_accounted"] = 1
    if size is not None:
        metadata["num_host_slots"] = size
        for prefix, side_size, *_ in SIDE_POOLS.values():
            if f"{prefix}host_free_slots" in state:
                metadata[f"num_{prefix}host_slots"] = side_size
    path = write_dump(tmp_path / "h.safetensors", dump_contents(metadata, state))
    return check([path], kernel="none").dumps[0]


def _errors(report: Any) -> list[str]:
    return sorted(f.code.value for f in report.findings if f.severity.value == "error")


@pytest.mark.parametrize("side", [True, False], ids=["side-pools", "anchor-only"])
def test_correct_state_is_clean(tmp_path: Path, side: bool) -> None:
    """Clean with the side pools and without them (an older dump reads as before); ids free
    in one pool and held in another (SWA 4..5 free, the anchor's held) are no fault."""
    state = _state(side)
    report = _check(tmp_path, state)
    assert report.error is None
    assert _errors(report) == []
    status = {c.check: c.status for c in report.coverage}
    assert status["HiCache host free list"] == status["HiCache host slots"] == "ran"
    assert status["HiCache host slot leaks"] == "ran"
    if side:
        assert np.intersect1d(state["swa_host_free_slots"], state["tree_host_slots"]).size


def _planted(name: str, pool: str = "kv") -> dict[str, Any]:
    """The correct state with one fault planted in `pool`'s records."""
    state = _state()
    prefix, size = POOLS[pool]
    free_key, held_key = f"{prefix}host_free_slots", f"tree_{prefix}host_slots"
    free, held = list(state[free_key]), list(state[held_key])
    if name == "free-and-held":  # node 7's slot freed, the node keeping it as host_value
        free.append(held[0])
    elif name == "held-twice":  # a split that left one slot on both halves
        free.append(held[-1])
        held[-1] = held[-2]
    elif name == "freed-twice":  # a staged chunk appended twice
        free += free[-2:]
    elif name == "out-of-range":  # a device slot stored as a host value
        free.append(held[-1])
        held[-1] = size + 28
    elif name == "leaked":  # a slot allocated, then given to no node and never freed
        free.pop(1)
    state[free_key], state[held_key] = np.array(free), np.array(held)
    return state


#: Each planted HiCache fault, the finding it must give and its cause; the catalog's coverage
#: test (test_findings) counts these codes as planted.
HOST_FAULTS = (
    ("free-and-held", "host-slot-free-and-held", "host-slot-freed-while-held"),
    ("held-twice", "host-slot-held-twice", "host-slot-double-free"),
    ("freed-twice", "host-slot-freed-twice", "host-slot-double-free"),
    ("out-of-range", "host-slot-out-of-range", "host-slot-index-corrupt"),
    ("leaked", "host-slot-leaked", "host-slot-leak"),
)


@pytest.mark.parametrize("pool", sorted(POOLS))
@pytest.mark.parametrize(("fault", "code", "cause"), HOST_FAULTS)
def test_each_fault_is_named(tmp_path: Path, fault: str, code: str, cause: str, pool: str) -> None:
    report = _check(tmp_path, _planted(fault, pool))
    assert _errors(report) == [code]
    [finding] = report.findings
    assert finding.details["pool"] == pool
    named = {"kv": "host slot", "swa": "SWA host slot", "mamba": "Mamba host slot"}[pool]
    assert finding.message.startswith(named), finding.message
    assert report.diagnosis[0].code.value == cause, report.diagnosis


def test_side_pool_free_and_held_names_the_node_and_its_host_lock(tmp_path: Path) -> None:
    [finding] = _check(tmp_path, _planted("free-and-held", "mamba")).findings
    assert finding.details["host_slots"] == [0] and finding.details["nodes"] == [7]
    assert finding.details["host_locked"] is True


def test_free_and_held_names_the_node_and_its_host_lock(tmp_path: Path) -> None:
    [finding] = _check(tmp_path, _planted("free-and-held")).findings
    assert finding.details["host_slots"] == [0]
    assert finding.details["nodes"] == [7] and finding.details["host_locked"] is True


def test_pool_size_unknown_only_negative_slots_are_out_of_range(tmp_path: Path) -> None:
    """Without `num_host_slots` a slot past the pool cannot be told from a big pool's: only a
    negative one is named."""
    assert _errors(_check(tmp_path, _planted("out-of-range"), size=None)) == []
    state = _planted("out-of-range")
    state["tree_host_slots"] = np.array([0, 1, 2, 3, 4, -1])
    assert _errors(_check(tmp_path, state, size=None)) == ["host-slot-out-of-range"]


def test_without_host_records_the_checks_do_not_apply(tmp_path: Path) -> None:
    state = _state(side=False)
    for name in ("host_free_slots", "tree_host_slots", "tree_host_nodes", "tree_host_lock_refs"):
        del state[name]
    status = {c.check: c.status for c in _check(tmp_path, state, size=None).coverage}
    assert status["HiCache host free list"] == status["HiCache host slots"] == "not-applicable"


def test_free_list_alone_runs_its_checks_and_says_what_did_not(tmp_path: Path) -> None:
    """A tree whose host values cannot be read (the Rust tree core): the free list's checks
    run, the tree's are said not to."""
    state = _planted("freed-twice")
    for prefix in ("", "swa_", "mamba_"):
        for name in ("slots", "nodes", "lock_refs"):
            del state[f"tree_{prefix}host_{name}"]
    report = _check(tmp_path, state)
    assert _errors(report) == ["host-slot-freed-twice"]
    [slots] = [c for c in report.coverage if c.check == "HiCache host slots"]
    assert slots.status == "not-run" and "tree_host_slots" in slots.missing


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_a_slot_in_neither_place_is_no_leak_unless_the_capture_vouched(
    tmp_path: Path, pool: str
) -> None:
    """The leaked state's twin: the same slot in no free list and no node, from a capture
    that could not rule out a holder in flight (a prefetch's, a retraction backup's, a
    buffer's): silent, and the leak check says why it did not run."""
    report = _check(tmp_path, _planted("leaked", pool), accounted=False)
    assert report.findings == ()
    [leaks] = [c for c in report.coverage if c.check == "HiCache host slot leaks"]
    assert leaks.status == "not-run" and "in flight" in (leaks.reason or "")


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_a_pool_size_no_list_could_describe_leaves_its_leak_check_out(
    tmp_path: Path, pool: str
) -> None:
    """A corrupt size (2^44 slots beside a dozen listed) would cost a bit per slot: the leak
    check does not run and says which size, and the rest is checked as before (the planted
    fault still named)."""
    prefix, _ = POOLS[pool]
    metadata: dict[str, Any] = {"num_full_slots": 16, "page_size": 1, "host_slots_accounted": 1}
    metadata["num_host_slots"] = SIZE
    for side_prefix, side_size, *_ in SIDE_POOLS.values():
        metadata[f"num_{side_prefix}host_slots"] = side_size
    metadata[f"num_{prefix}host_slots"] = 1 << 44
    state = _planted("free-and-held", pool)
    path = write_dump(tmp_path / "h.safetensors", dump_contents(metadata, state))
    report: Any = check([path], kernel="none").dumps[0]
    assert _errors(report) == ["host-slot-free-and-held"]
    [leaks] = [c for c in report.coverage if c.check == "HiCache host slot leaks"]
    assert leaks.status == "not-run"
    assert f"num_{prefix}host_slots {1 << 44} is not a pool" in (leaks.reason or "")
