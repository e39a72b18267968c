"""Canary findings and their explanations: each code fires on its scenario at the corrupted
cell, is silent on the same dump uncorrupted, and the replay yields exactly the scenario's
recorded rows."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from kvcanary_cli.analysis.violations.explain import explain_rows
from kvcanary_cli.canary.replay import replay_dump
from kvcanary_cli.canary.ring import decode_ring
from kvcanary_cli.canary.ring_rows import RowOrigin, ViolationRows
from kvcanary_cli.catalog import FindingCode, ViolationRowCause
from kvcanary_cli.planners.base import Semantics
from kvcanary_cli.planners.vectorized import VectorizedPlanner
from kvcanary_cli.results.check import Finding
from kvcanary_cli.results.violations import explanation_text
from kvcanary_cli.synth.scenarios import SCENARIOS
from tests.analysis.conftest import ScenarioDump
from tests.helpers import checked

GPU = VectorizedPlanner(semantics=Semantics.GPU)
CANARY = [name for name in SCENARIOS if name.startswith("canary-")]
CODE_SCENARIO = {
    FindingCode.CANARY_CHAIN_BREAK: "canary-stale-row",
    FindingCode.CANARY_POSITION_MISMATCH: "canary-use-after-free",
    FindingCode.CANARY_TOKEN_MISMATCH: "canary-aliasing",
    FindingCode.CANARY_REAL_KV_MISMATCH: "canary-kv-overwritten",
}


def _canary(findings: tuple[Finding, ...], code: FindingCode) -> list[Finding]:
    return [f for f in findings if f.code is code]


@pytest.mark.parametrize("code", list(CODE_SCENARIO), ids=lambda c: c.value)
@pytest.mark.parametrize("seed", [0, 1])
def test_code_fires_at_the_corrupted_cell(
    code: FindingCode, seed: int, scenario_dump: ScenarioDump
) -> None:
    dump, truth = scenario_dump(CODE_SCENARIO[code], seed)
    hits = _canary(checked(dump).findings, code)
    assert hits and code.severity.value == "error"
    first = min(hits, key=lambda f: f.position or 0)
    assert (first.batch_row, first.position, first.slot) == (
        truth["batch_row"],
        truth["position"],
        truth["slot"],
    )
    assert first.role == "verify" and first.provenance is not None
    assert first.details["explanation"]["referenced_by"]["position"] == truth["position"]  # type: ignore[index, call-overload]


@pytest.mark.parametrize("code", list(CODE_SCENARIO), ids=lambda c: c.value)
def test_code_is_silent_on_the_clean_dump(code: FindingCode, scenario_dump: ScenarioDump) -> None:
    dump, _ = scenario_dump(CODE_SCENARIO[code], 0, corrupt=False)
    assert not any(f.code.value.startswith("canary-") for f in checked(dump).findings)


def test_clean_canary_scenario_is_silent(scenario_dump: ScenarioDump) -> None:
    dump, _ = scenario_dump("clean-canary", 0)
    assert checked(dump).findings == ()


def test_buffers_failing_the_same_way_make_one_finding(scenario_dump: ScenarioDump) -> None:
    dump, truth = scenario_dump("canary-aliasing", 0)
    hits = _canary(checked(dump).findings, FindingCode.CANARY_POSITION_MISMATCH)
    assert len(hits) == 1
    details = hits[0].details
    assert details["buffers"] == ["canary.full.head.k", "canary.full.tail.k"]
    rows = details["rows"]
    assert isinstance(rows, list) and [row[1] for row in rows] == [truth["slot"]] * 2  # type: ignore[index]
    assert details["explanation"]["cause"] == "aliasing"  # type: ignore[index, call-overload]
    assert "aliasing" in hits[0].message


@pytest.mark.parametrize("name", CANARY)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replay_yields_exactly_the_recorded_rows(
    name: str, seed: int, scenario_dump: ScenarioDump
) -> None:
    dump, _ = scenario_dump(name, seed)
    expected = json.loads(dump.metadata["kvcanary.expected_violations"])
    plans = {g: GPU.plan(dump, g) for g in dump.groups}
    got = [tuple(int(v) for v in r) for b in replay_dump(dump, plans) for r in b.rows.fields]
    assert Counter(got) == Counter(tuple(r) for r in expected)
    assert dump.violation_ring is not None and dump.violation_write_index is not None
    ring = decode_ring(dump.violation_ring, dump.violation_write_index)
    assert ring.rows.tolist() == expected and not ring.overflow


EXPECTED_CAUSES = {
    "canary-use-after-free": {
        ViolationRowCause.USE_AFTER_FREE,
        ViolationRowCause.FOLLOWS_BAD_RECORD,
    },
    "canary-aliasing": {ViolationRowCause.ALIASING, ViolationRowCause.FOLLOWS_BAD_RECORD},
    "canary-stale-row": {ViolationRowCause.STALE_ROW},
    "canary-kv-overwritten": {ViolationRowCause.KV_OVERWRITTEN},
}


@pytest.mark.parametrize("name", CANARY)
@pytest.mark.parametrize("seed", [0, 1])
def test_ring_rows_are_explained_like_replayed_rows(
    name: str, seed: int, scenario_dump: ScenarioDump
) -> None:
    dump, truth = scenario_dump(name, seed)
    assert dump.violation_ring is not None and dump.violation_write_index is not None
    ring = decode_ring(dump.violation_ring, dump.violation_write_index)
    observed = ViolationRows.build(ring.rows, origin=RowOrigin.RING)
    plans = {g: GPU.plan(dump, g) for g in dump.groups}
    replayed = ViolationRows.concat([b.rows for b in replay_dump(dump, plans)])
    seen = explain_rows(dump, observed)
    known = explain_rows(dump, replayed)
    assert {seen.cause_at(i) for i in range(len(seen))} == EXPECTED_CAUSES[name]
    # replayed rows come in the same (launch, entry) order here: same causes, same cells
    assert [seen.cause_at(i) for i in range(len(seen))] == [
        known.cause_at(i) for i in range(len(known))
    ]
    assert seen.ref_row.tolist() == known.ref_row.tolist()
    texts = [explanation_text(seen, i, observed.fields[i]) for i in range(len(seen))]
    assert all(texts)


def test_aliasing_names_both_rows(scenario_dump: ScenarioDump) -> None:
    dump, truth = scenario_dump("canary-aliasing", 1)
    assert dump.violation_ring is not None
    ring = decode_ring(dump.violation_ring, dump.violation_write_index or 0)
    rows = ViolationRows.build(ring.rows, origin=RowOrigin.RING)
    why = explain_rows(dump, rows)
    first = int(np.flatnonzero(rows.slot == truth["slot"])[0])
    rpi = dump.req_pool_indices.tolist()
    text = explanation_text(why, first, rows.fields[first])
    owner, reader = rpi[truth["other_batch_row"]], rpi[truth["batch_row"]]
    assert text == (
        f"stored position {truth['other_position']} belongs to pool row {owner}; "
        f"pool row {reader} references the slot at position {truth['position']}: aliasing"
    )


def test_rows_of_an_unknown_tag_or_absent_slot(scenario_dump: ScenarioDump) -> None:
    dump, _ = scenario_dump("canary-aliasing", 0)
    rows = ViolationRows.build(
        np.array(
            [[77, 5, 1, 0, -1, 0, 0, 2], [0, 10**9, 1, 0, -1, 0, 0, 2], [8, 5, 1, 0, -1, 0, 0, 2]]
        ),
        origin=RowOrigin.LOG,
    )
    why = explain_rows(dump, rows)
    assert [why.cause_at(i) for i in range(3)] == [ViolationRowCause.NO_LIVE_CELL] * 3
    assert "no live cell" in explanation_text(why, 1, rows.fields[1])


def test_swa_rows_are_explained_in_the_swa_space(scenario_dump: ScenarioDump) -> None:
    dump, _ = scenario_dump("clean-canary", 0)
    plan = GPU.plan(dump, "swa")
    k = int(np.flatnonzero(plan.verify_slot_indices > 0)[0])
    slot = int(plan.verify_slot_indices[k])
    position = int(plan.verify_expected_positions[k])
    rows = ViolationRows.build(
        np.array([[6, slot, position + 1000, 0, -1, 0, 0, 3]]), origin=RowOrigin.RING
    )
    why = explain_rows(dump, rows)
    facts = why.facts(0)
    assert facts["space"] == "swa" and why.cause_at(0) is ViolationRowCause.FOREIGN_RECORD
    assert facts["referenced_by"]["position"] == position  # type: ignore[index]
