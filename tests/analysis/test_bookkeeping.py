"""The bookkeeping audit (both free lists, the whole SWA LUT, this step's SWA writes, radix
sharing that skips the prefix): each
fault is reported under its own cause first at page sizes 1, 4 and 16, its clean twin stays
silent, and clean serving states of every shape raise nothing."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcanary_cli.analysis.bookkeeping import free_list_findings, lut_bookkeeping_findings
from kvcanary_cli.analysis.provenance import live_cells
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.synth.scenarios import SCENARIOS, SIZES, make_scenario
from kvcanary_cli.synth.state import build_dump
from tests.helpers import (
    AUDIT_SCENARIOS,
    RULE_SCENARIOS,
    VECTORIZED,
    checked,
)
from tests.lanes import deep_repeats

#: scenario -> (the codes it must raise, the cause that must come first)
BOOKKEEPING = {
    name: (set(SCENARIOS[name].expected), SCENARIOS[name].cause)
    for name in (*AUDIT_SCENARIOS, *RULE_SCENARIOS)
}


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("size", deep_repeats(["tiny", "small"]))  # small: 3x the CPU
@pytest.mark.parametrize("name", sorted(BOOKKEEPING))
def test_each_fault_names_its_mechanism_and_its_twin_is_silent(
    name: str, size: str, page_size: int, tmp_path: Path
) -> None:
    expected, cause = BOOKKEEPING[name]
    if page_size < SCENARIOS[name].min_page_size:
        pytest.skip(f"{name} needs pages of {SCENARIOS[name].min_page_size} slots or more")
    for seed in (0, 1):
        bad = make_scenario(name, seed=seed, size=size, page_size=page_size)
        report = checked(load_dump(bad.save(tmp_path / "bad.safetensors")), kernel="vectorized")
        found = {f.code.value for f in report.findings}
        assert expected <= found <= expected | set(SCENARIOS[name].allowed), (name, seed)
        if bad.truth.get("position") is not None:  # the corrupted cell is among those named
            named = {
                (row, position)
                for f in report.findings
                if f.cells is not None
                for row, position in zip(
                    f.cells.batch_row.tolist(), f.cells.position.tolist(), strict=True
                )
            }
            assert (bad.truth["batch_row"], bad.truth["position"]) in named, (name, seed)
        assert report.diagnosis[0].code.value == cause, (name, seed)
        twin = make_scenario(name, seed=seed, size=size, page_size=page_size, corrupt=False)
        clean = checked(load_dump(twin.save(tmp_path / "twin.safetensors")), kernel="vectorized")
        assert clean.findings == (), (name, seed, clean.findings)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    page_size=st.sampled_from([1, 4, 16]),
    window=st.sampled_from([0, 4, 8, 32]),
    evict_prob=st.sampled_from([0.0, 0.7, 1.0]),
    shuffled=st.booleans(),
)
def test_clean_serving_states_raise_no_bookkeeping_finding(
    seed: int, page_size: int, window: int, evict_prob: float, shuffled: bool
) -> None:
    """A false alarm is a defect: random clean histories, any page size, window and eviction."""
    spec = replace(
        SIZES["tiny"],
        max_seq_len=96,
        page_size=page_size,
        window=window,
        evict_prob=evict_prob,
        shuffled_free_list=shuffled,
        mode="mixed",
    )
    dump = build_dump(spec, seed=seed)
    with tempfile.TemporaryDirectory() as folder:
        report = checked(load_dump(dump.save(Path(folder) / "d.safetensors")), kernel="none")
        assert report.findings == ()


def test_a_shrunk_lut_is_audited_on_its_kept_entries(tmp_path: Path) -> None:
    """The audit reads a shrunk dump's LUT through its kept entries: the fault is still found,
    and nothing about entries the small dump does not hold is guessed."""
    from kvcanary_cli import api

    bad = make_scenario("stale-swa-mapping", seed=1, page_size=4)
    original = bad.save(tmp_path / "bad.safetensors")
    small = tmp_path / "small.safetensors"
    api.shrink(original, small)
    dump = load_dump(small)
    plan = VECTORIZED.plan(dump, "swa")
    codes = {f.code for f in lut_bookkeeping_findings(dump, live_cells(dump), plan)}
    assert codes == {FindingCode.FREE_SLOT_STILL_MAPPED, FindingCode.SWA_SLOT_FREE_AND_MAPPED}


def test_free_list_duplicates_are_counted_once_per_slot(tmp_path: Path) -> None:
    state = make_scenario("clean-swa", seed=0)
    free = state.tensors["free_full_slots"]
    twice = np.array([int(free[0])] * 3 + [int(free[1])], dtype=np.int64)
    state.tensors["free_full_slots"] = np.concatenate([free, twice])
    dump = load_dump(state.save(tmp_path / "d.safetensors"))
    [finding] = free_list_findings(dump)
    assert finding.cells is not None and finding.cells.slot is not None
    listed = dict(
        zip(
            finding.cells.slot.tolist(),
            finding.cells.extra["times_listed"].tolist(),
            strict=True,
        )
    )
    assert listed == {int(free[0]): 4, int(free[1]): 2}
    assert finding.batch_row is None and finding.position is None


def _lockstep_cells(full: np.ndarray, swa: np.ndarray, page: int) -> dict[int, int]:
    """{full slot: SWA slot} of the entries `_out_of_lockstep` reports."""
    from kvcanary_cli.analysis.bookkeeping import _out_of_lockstep

    found = _out_of_lockstep(full.astype(np.int64), swa.astype(np.int64), page)
    if not found:
        return {}
    [finding] = found
    assert finding.code is FindingCode.SWA_PAGE_OUT_OF_LOCKSTEP and finding.cells is not None
    assert finding.cells.slot is not None
    return dict(
        zip(finding.cells.slot.tolist(), finding.cells.extra["swa_slot"].tolist(), strict=True)
    )


@settings(max_examples=50, deadline=None)
@given(
    page=st.sampled_from([2, 4, 16]),
    pages=st.integers(1, 40),
    seed=st.integers(0, 10_000),
)
def test_pages_mapped_in_lockstep_are_silent_and_one_moved_entry_is_named(
    page: int, pages: int, seed: int
) -> None:
    """Full pages mapped whole or in part (a request's last page) onto shuffled SWA pages at
    the same offsets are silent; one entry moved to another offset or another SWA page is the
    one named (never its page's other tokens)."""
    rng = np.random.default_rng(seed)
    swa_pages = rng.permutation(np.arange(1, pages + 1))
    used = rng.integers(1, page + 1, size=pages)  # tokens mapped from each page's start
    full = np.concatenate([(q + 1) * page + np.arange(n) for q, n in enumerate(used)])
    swa = np.concatenate([s * page + np.arange(n) for s, n in zip(swa_pages, used, strict=True)])
    assert _lockstep_cells(full, swa, page) == {}
    moved = swa.copy()
    k = int(rng.integers(full.size))
    moved[k] = (pages + 1) * page + int(rng.integers(page))  # a page no one else maps to
    if used[(full[k] // page) - 1] < 2 and moved[k] % page == full[k] % page:
        return  # a page's only token, moved whole: still in lockstep
    assert _lockstep_cells(full, moved, page) == {int(full[k]): int(moved[k])}


def test_a_split_page_names_the_tokens_off_its_majority() -> None:
    full = np.arange(4, 8)
    assert _lockstep_cells(full, np.array([8, 9, 10, 11]), 4) == {}
    assert _lockstep_cells(full, np.array([8, 10, 9, 11]), 4) == {5: 10, 6: 9}  # swapped
    assert _lockstep_cells(full, np.array([8, 9, 42, 11]), 4) == {6: 42}  # another page
    assert _lockstep_cells(full, np.array([8, 9, 14, 15]), 4) == {6: 14, 7: 15}  # a tie: lower
    assert _lockstep_cells(full, np.array([8, 10, 9, 11]), 1) == {}  # no pages, no lockstep


@pytest.mark.parametrize(
    ("name", "cause"),
    [
        ("use-after-free", "use-after-free"),
        ("cross-request-aliasing", "cross-request-aliasing"),
        ("stale-tail", "stale-row-read"),
        ("duplicate-slot-in-row", "slot-reused-within-request"),
        ("swa-lut-cleared-in-window", "swa-mapping-cleared-in-window"),
        ("slot-beyond-pool-swa", "slot-index-corrupt"),
    ],
)
@pytest.mark.parametrize("page_size", [4, 16])
def test_symptom_causes_keep_their_names_with_pages(
    name: str, cause: str, page_size: int, tmp_path: Path
) -> None:
    """The page rules claim only what they explain: faults of live cells keep their causes at
    any page size, and a slot no pool holds is not read as a broken radix prefix after it."""
    for seed in range(3):
        bad = make_scenario(name, seed=seed, size="small", page_size=page_size)
        report = checked(load_dump(bad.save(tmp_path / "bad.safetensors")), kernel="none")
        assert report.diagnosis[0].code.value == cause, (name, seed)
        codes = {f.code.value for f in report.findings}
        assert "slot-shared-without-prefix" not in codes, (name, seed)


@pytest.mark.parametrize("page_size", [1, 4])
def test_leaks_are_accounted_from_the_free_lists_when_held_slots_are_not_recorded(
    page_size: int, tmp_path: Path
) -> None:
    """Without `held_full_slots`, every full slot off the full free list counts as held (what
    SGLang counts in use): the leak is still found, its twin stays silent, and a dump without
    the full free list is not accounted at all."""
    for seed in range(3):
        for corrupt in (True, False):
            state = make_scenario("swa-page-leak", seed=seed, page_size=page_size, corrupt=corrupt)
            del state.tensors["held_full_slots"]
            dump = load_dump(state.save(tmp_path / "leak.safetensors"))
            codes = {f.code.value for f in checked(dump, kernel="none").findings}
            assert codes == ({"swa-page-leaked"} if corrupt else set()), (seed, corrupt)
            del state.tensors["free_full_slots"]
            dump = load_dump(state.save(tmp_path / "leak.safetensors", overwrite=True))
            assert "swa-page-leaked" not in {
                f.code.value for f in checked(dump, kernel="none").findings
            }


def test_a_check_the_dump_has_no_record_for_says_what_to_record(tmp_path: Path) -> None:
    """A missing free list or pool size is named in the report's coverage, never guessed; a
    dump with every record the bookkeeping reads runs all of it."""

    def not_run(dump: KvDump) -> dict[str, tuple[str, ...]]:
        report = checked(dump, kernel="none")
        return {c.check: c.missing for c in report.coverage if c.status == "not-run"}

    bookkeeping = {"full free list", "SWA free list", "SWA LUT", "SWA pool leaks"}
    state = make_scenario("clean-swa-paged", seed=0)
    whole = load_dump(state.save(tmp_path / "whole.safetensors"))
    assert not bookkeeping & set(not_run(whole))
    del state.tensors["free_swa_slots"]
    dump = load_dump(state.save(tmp_path / "no-swa-list.safetensors"))
    assert {k: v for k, v in not_run(dump).items() if k in bookkeeping} == {
        "SWA free list": ("free_swa_slots",),
        "SWA pool leaks": ("free_swa_slots",),
    }
    state = make_scenario("clean-swa-paged", seed=0)
    del state.metadata["num_swa_slots"]
    dump = load_dump(state.save(tmp_path / "no-pool.safetensors"))
    assert {k: v for k, v in not_run(dump).items() if k in bookkeeping} == {
        "SWA pool leaks": ("num_swa_slots",)
    }


@pytest.mark.parametrize("page_size", [4, 16])
def test_swa_slots_handed_out_from_the_reserved_page_are_named_as_that_page(
    page_size: int, tmp_path: Path
) -> None:
    """PR #38519 at page_size > 1: the SWA padding page freed and handed out to two full
    pages, which then map into SWA slots 1 .. page_size - 1. The reserved page comes first;
    the shared owners it makes are named too, and never alone. The twin is silent."""
    bad = make_scenario("reserved-swa-page-handed-out", seed=0, page_size=page_size)
    report = checked(load_dump(bad.save(tmp_path / "bad.safetensors")), kernel="vectorized")
    [reserved] = [f for f in report.findings if f.code is FindingCode.RESERVED_SLOT_IN_USE]
    assert reserved.cells is not None and reserved.cells.slot is not None
    handed = set(reserved.cells.extra["swa_slot"].tolist())
    assert handed == set(range(1, page_size))  # every reserved slot but 0, which reads unmapped
    assert bad.truth["full_slot"] in reserved.cells.slot.tolist()
    codes = {f.code for f in report.findings}
    assert FindingCode.SWA_SLOT_SHARED_OWNER in codes
    assert [c.code.value for c in report.diagnosis][:2] == [
        "reserved-slot-freed",
        "swa-shared-owner",
    ]
    twin = make_scenario("reserved-swa-page-handed-out", seed=0, page_size=page_size, corrupt=False)
    assert (
        checked(load_dump(twin.save(tmp_path / "twin.safetensors")), kernel="vectorized").findings
        == ()
    )
