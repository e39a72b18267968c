"""Every finding code fires on its corruption (at the right cell) and is silent when clean."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcanary_cli.analysis.check import run_check
from kvcanary_cli.analysis.compare import compare_plans
from kvcanary_cli.catalog import FindingCode, Severity
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.planners.base import Plan, Semantics
from kvcanary_cli.planners.reference import ReferencePlanner
from kvcanary_cli.planners.vectorized import VectorizedPlanner
from kvcanary_cli.results.check import Finding
from kvcanary_cli.synth.scenarios import SCENARIOS
from kvcanary_cli.synth.state import SynthSpec, build_dump
from tests.analysis.conftest import LoadSynth, ScenarioDump
from tests.analysis.test_hicache import HOST_FAULTS
from tests.analysis.test_mamba import MAMBA_FAULTS
from tests.helpers import VECTORIZED, checked, expand_cells

CORRUPT = [name for name, s in SCENARIOS.items() if s.expected]
CLEAN = [name for name, s in SCENARIOS.items() if not s.expected]


def codes_of(findings: tuple[Finding, ...]) -> set[str]:
    return {f.code.value for f in findings}


def test_every_code_but_divergence_has_a_scenario() -> None:
    covered = {code for s in SCENARIOS.values() for code in s.expected}
    covered |= {code for _, code, _ in MAMBA_FAULTS}  # the Mamba layout's own dumps
    covered |= {code for _, code, _ in HOST_FAULTS}  # HiCache's host pool dumps
    assert covered == {c.value for c in FindingCode} - {"kernel-divergence"}


@pytest.mark.parametrize("name", CORRUPT)
def test_scenario_fires_its_code_and_nothing_else(name: str, scenario_dump: ScenarioDump) -> None:
    dump, _ = scenario_dump(name)
    report = checked(dump, kernel="vectorized")
    scenario = SCENARIOS[name]
    found = codes_of(report.findings)
    assert set(scenario.expected) <= found
    assert found <= set(scenario.expected) | set(scenario.allowed)
    assert all(g.unexplained_differences == 0 for g in report.groups)


@pytest.mark.parametrize("name", CORRUPT)
def test_same_shape_clean_dump_is_silent(name: str, scenario_dump: ScenarioDump) -> None:
    dump, _ = scenario_dump(name, corrupt=False)
    report = checked(dump, kernel="vectorized")
    assert report.findings == ()


def _at(report_findings: tuple[Finding, ...], code: str) -> list[Finding]:
    return [f for f in report_findings if f.code.value == code]


@pytest.mark.parametrize(
    ("name", "code", "keys"),
    [
        ("use-after-free", "freed-slot-in-live-range", ("batch_row", "position", "slot")),
        ("cross-request-aliasing", "slot-shared-across-positions", ("slot",)),
        ("stale-tail", "freed-slot-in-live-range", ("batch_row",)),
        ("unfilled-cells", "padding-slot-in-live-range", ("batch_row", "position", "slot")),
        ("swa-lut-cleared-in-window", "swa-unmapped-in-window", ("batch_row", "position", "slot")),
        ("swa-slot-collision", "swa-slot-collision", ("slot",)),
        ("row-out-of-range", "row-out-of-range", ("batch_row", "pool_row")),
        ("prefix-past-row", "prefix-beyond-row", ("batch_row", "pool_row")),
        ("write-into-live-slot", "write-to-live-slot", ("batch_row", "slot")),
        ("negative-slot", "negative-slot", ("batch_row", "position", "slot")),
        ("slot-beyond-pool", "slot-beyond-pool", ("batch_row", "position", "slot")),
        ("duplicate-slot-in-row", "duplicate-slot-in-row", ("batch_row", "position", "slot")),
        ("duplicate-request-row", "duplicate-request-row", ("batch_row", "pool_row")),
        ("negative-length", "negative-length", ("batch_row",)),
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_finding_points_at_the_corrupted_cell(
    name: str, code: str, keys: tuple[str, ...], seed: int, scenario_dump: ScenarioDump
) -> None:
    dump, truth = scenario_dump(name, seed)
    hits = _at(checked(dump, kernel="vectorized").findings, code)
    assert hits, f"{code} did not fire"
    want = {k: truth[k] for k in keys}
    assert any(all(getattr(f, k) == v for k, v in want.items()) for f in hits), (want, hits)


def test_aliasing_reports_both_cells(scenario_dump: ScenarioDump) -> None:
    dump, truth = scenario_dump("cross-request-aliasing")
    (finding,) = _at(checked(dump, kernel="vectorized").findings, "slot-shared-across-positions")
    (provenance,) = [p for p in finding.provenance if p.slot == truth["slot"]]
    rpi = dump.req_pool_indices
    cells = {(c.pool_row, c.position) for c in provenance.cells}
    assert (int(rpi[truth["batch_row"]]), truth["position"]) in cells
    assert (int(rpi[truth["other_batch_row"]]), truth["other_position"]) in cells


def test_truncated_lut_lists_every_out_of_range_slot(scenario_dump: ScenarioDump) -> None:
    dump, truth = scenario_dump("truncated-lut")
    report = checked(dump, kernel="vectorized")
    hits = [cell for f in _at(report.findings, "lut-out-of-range") for cell in expand_cells(f)]
    lut_len = truth["lut_len"]
    assert all(isinstance(slot, int) and slot >= lut_len for *_, slot, _ in hits)
    # Independently: every in-window cell whose slot >= lut_len must be reported.
    window = dump.window("swa")
    expected = set()
    for r, rp in enumerate(dump.req_pool_indices.tolist()):
        if rp == 0:
            continue
        p = int(dump.prefix_lens[r])
        for pos in range(max(0, p - window - 1), p):
            if int(dump.req_to_token.array()[rp, pos]) >= lut_len:
                expected.add((r, pos))
    assert {(row, position) for _, _, _, row, _, position, _, _ in hits} == expected
    swa = next(g for g in report.groups if g.group == "swa")
    assert swa.explained_differences.get(FindingCode.LUT_OUT_OF_RANGE, 0) > 0


def test_kernel_divergence_fires_on_an_unexplained_difference(scenario_dump: ScenarioDump) -> None:
    dump, _ = scenario_dump("clean-swa")
    reference = VectorizedPlanner().plan(dump, "swa")
    assert compare_plans(reference, reference).divergences == []
    broken_slots = reference.verify_slot_indices.copy()
    broken_slots[3] += 1
    from dataclasses import replace

    kernel = replace(reference, verify_slot_indices=broken_slots)
    (finding,) = compare_plans(reference, kernel).divergences
    assert finding.code is FindingCode.KERNEL_DIVERGENCE
    assert finding.batch_row == int(reference.entry_batch_rows()[3])
    assert finding.position == int(reference.verify_expected_positions[3])
    assert finding.details["reference"] == int(reference.verify_slot_indices[3])


def test_kernel_divergence_reaches_the_report(scenario_dump: ScenarioDump) -> None:
    dump, _ = scenario_dump("clean-decode")

    class Broken(VectorizedPlanner):
        def plan(self, dump: KvDump, group: str, *, keep_entries: bool = True) -> Plan:
            from dataclasses import replace

            plan = super().plan(dump, group, keep_entries=keep_entries)
            seeds = plan.write_seed_slot_indices.copy()
            seeds[0] = 12345
            return replace(plan, write_seed_slot_indices=seeds)

    report = run_check(dump, planner=VECTORIZED, kernel=Broken(semantics=Semantics.GPU))
    assert codes_of(report.findings) == {"kernel-divergence"}


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 10_000),
    window=st.sampled_from([0, 0, 3, 8, 20]),
    page=st.sampled_from([1, 1, 4, 16]),
    mode=st.sampled_from(["decode", "extend", "mixed"]),
    pool=st.booleans(),
    offset=st.sampled_from([0, 1]),
    active=st.integers(0, 6),
    padding=st.integers(0, 3),
)
def test_clean_random_dumps_have_no_error_finding(
    load_synth: LoadSynth,
    seed: int,
    window: int,
    page: int,
    mode: str,
    pool: bool,
    offset: int,
    active: int,
    padding: int,
) -> None:
    spec = SynthSpec(
        max_reqs=10,
        max_seq_len=64,
        window=window,
        page_size=page,
        mode=mode,
        expected_pool=pool,
        token_offset=offset,
        active_rows=active,
        padding_rows=padding,
        history=8,
    )
    dump = load_synth(build_dump(spec, seed))
    report = checked(dump, kernel="vectorized")
    errors = [f for f in report.findings if f.severity is Severity.ERROR]
    assert errors == []


def test_clean_dump_with_triton_kernel_agrees(scenario_dump: ScenarioDump) -> None:
    pytest.importorskip("triton")
    dump, _ = scenario_dump("clean-swa")
    report = checked(dump, kernel="triton")
    assert report.findings == ()
    assert all(g.kernel == "triton" and g.unexplained_differences == 0 for g in report.groups)
    assert report.kernel_mode == "interpreter" or report.kernel_mode == "compiled"


def test_truncated_lut_with_triton_kernel_is_explained(scenario_dump: ScenarioDump) -> None:
    pytest.importorskip("triton")
    dump, _ = scenario_dump("truncated-lut")
    report = checked(dump, kernel="triton")
    assert codes_of(report.findings) == {
        "lut-out-of-range",
        "lut-shorter-than-pool",
        "lut-sentinel-missing",
    }
    assert all(g.unexplained_differences == 0 for g in report.groups)


def test_int64_table_is_read_like_int32(load_synth: LoadSynth) -> None:
    synth = build_dump(SynthSpec(window=8), 3)
    synth.tensors["req_to_token"] = synth.tensors["req_to_token"].astype(np.int64)
    report = checked(load_synth(synth), kernel="vectorized")
    assert codes_of(report.findings) == {"gpu-dtype-mismatch"}


@pytest.mark.parametrize("seed", [3, 4])
def test_a_pool_row_outside_the_token_pool_is_one_finding_for_both_groups(
    seed: int, load_synth: LoadSynth
) -> None:
    """Both groups make the same expected-token gather of a row's pool row, at different
    positions (0 in full, the window start in swa): one finding, the full group's."""
    synth = build_dump(SynthSpec(window=8, expected_pool=True, max_seq_len=48), seed=seed)
    rpi = synth.tensors["req_pool_indices"]
    row = int(np.argmax(rpi))
    pool_row = int(rpi[row])
    synth.tensors["req_to_verify_expected_tokens"] = synth.tensors["req_to_verify_expected_tokens"][
        :pool_row
    ].copy()  # the pool ends just below this row's pool row
    dump = load_synth(synth)
    assert int(dump.prefix_lens[row]) > 8  # so the swa window starts past position 0
    for planner in (VECTORIZED, ReferencePlanner()):
        found = [
            f
            for f in run_check(dump, planner=planner, kernel=None).findings
            if f.code is FindingCode.EXPECTED_TOKEN_OUT_OF_RANGE and f.batch_row == row
        ]
        assert [(f.group.value, f.pool_row, f.gather_index) for f in found] == [
            ("full", pool_row, pool_row)
        ]


def test_a_lock_held_at_idle_is_named_and_a_lock_free_idle_is_silent(
    load_synth: LoadSynth,
) -> None:
    """At idle (no request runs, no batch) every locked tree slot is a lock never released;
    the same idle state with no lock says nothing."""
    from kvcanary_cli.analysis.tree_locks import tree_lock_findings
    from kvcanary_cli.dump.schema import TENSORS

    synth = build_dump(SynthSpec(req_rows=True, tree_locks=True, write_tensors=False), 5)
    locked = synth.tensors["tree_locked_full_slots"]
    assert locked.size
    empty = np.zeros(0, dtype=np.int64)
    batch = [name for name in synth.tensors if name in TENSORS and TENSORS[name].per_batch_row]
    synth.tensors |= dict.fromkeys([*batch, "running_req_rows"], empty)
    [finding] = tree_lock_findings(load_synth(synth))
    assert finding.code is FindingCode.TREE_LOCK_LEAKED and "no request runs" in finding.message
    assert finding.details["slots_total"] == locked.size and finding.slot == int(locked.min())
    synth.tensors["tree_locked_full_slots"] = empty
    assert tree_lock_findings(load_synth(synth)) == []
    del synth.tensors["running_req_rows"]  # requests not known: no lock is called stray
    synth.tensors["tree_locked_full_slots"] = locked
    assert tree_lock_findings(load_synth(synth)) == []


def test_running_rows_read_a_piece_at_a_time_give_the_same_answer(
    load_synth: LoadSynth, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The running rows are read a few million cells at a time; read one row at a time, a
    busy state whose locks lie in its running prefixes is still silent, and one slot
    locked outside them is still the one named."""
    from kvcanary_cli.analysis import tree_locks

    synth = build_dump(SynthSpec(req_rows=True, tree_locks=True, write_tensors=False), 5)
    dump = load_synth(synth)
    assert dump.running_req_rows is not None and dump.running_req_rows.size > 1
    monkeypatch.setattr(tree_locks, "_CELLS_AT_ONCE", 1)  # one row per piece
    assert tree_locks.tree_lock_findings(dump) == []
    held = {int(s) for s in np.asarray(dump.req_to_token.rows(dump.running_req_rows)[0]).ravel()}
    stray = next(s for s in range(1, 1 << 20) if s not in held)
    synth.tensors["tree_locked_full_slots"] = np.append(
        synth.tensors["tree_locked_full_slots"], stray
    ).astype(np.int64)
    [finding] = tree_locks.tree_lock_findings(load_synth(synth))
    assert finding.details["slots"] == [stray] and finding.slot == stray


@pytest.mark.parametrize("name", ["radix-copy", "clean-decode"])
def test_places_grouped_a_range_of_positions_at_a_time_find_what_one_sort_finds(
    name: str, scenario_dump: ScenarioDump, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`slot-shared-without-prefix` groups the cells by (position, slot) a range of positions
    at a time (the sort never holds every cell): with ranges of a few cells, the findings are
    those of one range holding all of them."""
    import kvcanary_cli.analysis.findings as findings

    for seed in range(2):
        dump, _ = scenario_dump(name, seed=seed)
        whole = checked(dump, kernel="none").findings
        monkeypatch.setattr(findings, "_PIECE", 3)
        pieces = checked(dump, kernel="none").findings
        monkeypatch.undo()
        assert [(expand_cells(f), f.message) for f in pieces] == [
            (expand_cells(f), f.message) for f in whole
        ], (name, seed)
        if name == "radix-copy":
            assert FindingCode.SLOT_SHARED_WITHOUT_PREFIX in {f.code for f in pieces}
