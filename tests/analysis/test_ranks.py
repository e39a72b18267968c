"""`ranks`: one step's dumps of every TP rank compared. Identical ranks are silent (and so is a
difference in cells the batch does not use); a rank whose prefix is a page shorter, a slot
that differs in a used cell, a free list in another order are each named where they lie;
dumps of different steps or models, or of one rank twice, are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvcanary_cli.analysis.ranks import compare_ranks
from kvcanary_cli.errors import DumpError
from kvcanary_cli.results.ranks import RanksReport
from kvcanary_cli.synth.state import SynthDump
from tests.rank_dumps import PAGE, Tensors, rank_state, write_ranks


@pytest.fixture(scope="module")
def base() -> SynthDump:
    return rank_state()


def first(report: RanksReport) -> tuple[str, dict[str, object]]:
    found = report.first_divergence
    assert found is not None and found.divergence is not None
    return found.rank, vars(found.divergence)


def test_identical_ranks_are_silent(base: SynthDump, tmp_path: Path) -> None:
    report = compare_ranks(write_ranks(base, tmp_path)[::-1])  # any order: by rank
    assert report.verdict == "identical" and report.first_divergence is None
    assert [r.rank for r in report.ranks] == ["0", "1", "2"] and report.reference == "0"
    assert report.ranks[1].compared == (
        "sizes", "batch", "req_to_token", "free_full_slots", "free_swa_slots", "lut",
    )  # fmt: skip
    lengths = base.tensors["prefix_lens"] + base.tensors["extend_seq_lens"]
    used = base.tensors["req_pool_indices"] > 0
    assert report.ranks[1].table_cells == int(lengths[used].sum())
    assert report.notes == ()


def test_a_prefix_one_page_shorter_is_named(base: SynthDump, tmp_path: Path) -> None:
    row = int(np.argmax(base.tensors["prefix_lens"]))  # the longest prefix: a page to lose
    prefix = int(base.tensors["prefix_lens"][row])

    def shorter(t: Tensors) -> None:  # its radix match a page shorter: a page more to extend
        t["prefix_lens"][row] -= PAGE
        t["extend_seq_lens"][row] += PAGE

    rank, d = first(compare_ranks(write_ranks(base, tmp_path, shorter)))
    assert rank == "2"
    assert d["kind"] == "request" and d["field"] == "prefix_lens"
    assert d["batch_row"] == row and d["pool_row"] == int(base.tensors["req_pool_indices"][row])
    assert (d["reference_value"], d["value"]) == (prefix, prefix - PAGE)
    assert d["position"] == prefix - PAGE and d["page"] == (prefix - PAGE) // PAGE
    assert "(1 page) apart" in str(d["message"])


def test_a_slot_of_a_used_cell_is_named(base: SynthDump, tmp_path: Path) -> None:
    row = 1
    pool_row = int(base.tensors["req_pool_indices"][row])
    position = int(base.tensors["prefix_lens"][row]) - 1

    def moved(t: Tensors) -> None:
        t["req_to_token"][pool_row, position] += 1

    rank, d = first(compare_ranks(write_ranks(base, tmp_path, moved, ranks=2)))
    assert rank == "1" and d["kind"] == "table"
    assert (d["batch_row"], d["pool_row"], d["position"]) == (row, pool_row, position)
    assert d["page"] == position // PAGE
    slot = int(base.tensors["req_to_token"][pool_row, position])
    assert (d["reference_value"], d["value"]) == (slot, slot + 1)


def test_cells_the_batch_does_not_use_are_not_compared(base: SynthDump, tmp_path: Path) -> None:
    """A stale tail past a request's length and a row outside the batch: no divergence."""
    rows = base.tensors["req_pool_indices"]
    lengths = base.tensors["prefix_lens"] + base.tensors["extend_seq_lens"]
    idle = next(r for r in range(1, base.tensors["req_to_token"].shape[0]) if r not in rows)

    def stale(t: Tensors) -> None:
        t["req_to_token"][int(rows[0]), int(lengths[0]) :] += 1
        t["req_to_token"][idle] += 1

    report = compare_ranks(write_ranks(base, tmp_path, stale, ranks=2))
    assert report.verdict == "identical"


def test_a_free_list_in_another_order_is_named(base: SynthDump, tmp_path: Path) -> None:
    free = base.tensors["free_full_slots"]

    def reordered(t: Tensors) -> None:
        t["free_full_slots"][[0, 1]] = free[[1, 0]]

    rank, d = first(compare_ranks(write_ranks(base, tmp_path, reordered, ranks=2)))
    assert d["kind"] == "free-list" and d["field"] == "free_full_slots"
    assert (d["slot"], d["value"]) == (int(free[0]), int(free[1]))
    assert "next allocation" in str(d["message"])


def test_a_slot_free_on_one_rank_only_is_named(base: SynthDump, tmp_path: Path) -> None:
    free = base.tensors["free_full_slots"]

    def taken(t: Tensors) -> None:
        t["free_full_slots"] = np.delete(free, 3)

    _, d = first(compare_ranks(write_ranks(base, tmp_path, taken, ranks=2)))
    assert d["kind"] == "free-list" and d["slot"] == int(free[3])
    assert d["page"] == int(free[3]) // PAGE
    assert (d["reference_value"], d["value"]) == (free.size, free.size - 1)


def _with_tree(base: SynthDump) -> SynthDump:
    """`base` with what the tree holds: the whole pages of the batch's prefixes."""
    t = {name: array.copy() for name, array in base.tensors.items()}
    rows, prefixes = t["req_pool_indices"], t["prefix_lens"]
    held = [
        t["req_to_token"][r, : p - p % PAGE] for r, p in zip(rows, prefixes, strict=True) if r > 0
    ]
    t["tree_full_slots"] = np.unique(np.concatenate(held).astype(np.int64))
    assert t["tree_full_slots"].size >= 2 * PAGE
    return SynthDump(spec=base.spec, seed=base.seed, tensors=t, metadata=base.metadata, live=[])


def test_the_trees_slots_are_compared(base: SynthDump, tmp_path: Path) -> None:
    """Identical trees are silent; a tree a page short on one rank (its cache evicted a
    node the others keep) is named with that page."""
    tree = _with_tree(base)
    (tmp_path / "same").mkdir()
    (tmp_path / "short").mkdir()
    same = compare_ranks(write_ranks(tree, tmp_path / "same", ranks=2))
    assert same.verdict == "identical" and "tree_full_slots" in same.ranks[1].compared
    held = tree.tensors["tree_full_slots"]
    page = int(held[-1]) // PAGE

    def evicted(t: Tensors) -> None:
        t["tree_full_slots"] = held[held // PAGE != page]

    _, d = first(compare_ranks(write_ranks(tree, tmp_path / "short", evicted, ranks=2)))
    assert d["kind"] == "tree" and d["field"] == "tree_full_slots"
    assert d["page"] == page and d["slot"] == page * PAGE
    assert "held by the tree on rank 0, not on rank 1" in str(d["message"])


@pytest.mark.parametrize(
    ("meta", "words"),
    [
        ({"step": "8"}, "records step 8, "),
        ({"model": "other"}, "records model 'other'"),
        ({"rank": "0"}, "two dumps of one rank"),
    ],
)
def test_dumps_of_other_steps_models_or_one_rank_are_refused(
    base: SynthDump, tmp_path: Path, meta: dict[str, str], words: str
) -> None:
    with pytest.raises(DumpError, match=words):
        compare_ranks(write_ranks(base, tmp_path, meta=meta, ranks=2))
