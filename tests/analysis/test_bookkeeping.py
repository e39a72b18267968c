"""The bookkeeping audit (both free lists, the whole SWA LUT, this step's SWA writes, radix
sharing that skips the prefix): each
fault is reported under its own cause first at page sizes 1 and 16, its clean twin stays
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
from kvcanary_cli.analysis.model import FindingCode
from kvcanary_cli.analysis.provenance import live_cells
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.synth.scenarios import SCENARIOS, SIZES, make_scenario
from kvcanary_cli.synth.state import build_dump
from tests.helpers import AUDIT_SCENARIOS, RULE_SCENARIOS, VECTORIZED, checked

#: scenario -> (the codes it must raise, the cause that must come first)
BOOKKEEPING = {
    name: (set(SCENARIOS[name].expected), SCENARIOS[name].cause)
    for name in (*AUDIT_SCENARIOS, *RULE_SCENARIOS)
}


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("size", ["tiny", "small"])
@pytest.mark.parametrize("name", sorted(BOOKKEEPING))
def test_each_fault_names_its_mechanism_and_its_twin_is_silent(
    name: str, size: str, page_size: int, tmp_path: Path
) -> None:
    expected, cause = BOOKKEEPING[name]
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
