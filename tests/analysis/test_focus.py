"""`provenance --slot` checks only the batch rows that hold or write the slot: the findings at
the slot must be exactly those the whole check finds there (before the diagnosis): the same
codes, roles, cells and provenance. Their messages may differ: a finding group of one cell
names that cell, a larger one what its cells share, and the focused check sees fewer rows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvcanary_cli.analysis.check import attach_provenance, collect_findings
from kvcanary_cli.analysis.focus import (
    _rows_holding,
    focused_findings,
    focused_index,
    related_slots,
    swa_peer,
    touching_part,
)
from kvcanary_cli.analysis.provenance import live_cells
from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.results.check import CheckReport, Finding
from kvcanary_cli.results.provenance import ProvenanceReport
from kvcanary_cli.synth.scenarios import SCENARIOS, make_scenario
from tests.helpers import VECTORIZED, cells_key
from tests.lanes import deep_repeats


def _key(f: Finding) -> tuple[object, ...]:
    prov = tuple((p.slot, p.cells, p.cells_total) for p in f.provenance)
    return (
        f.code,
        f.group,
        f.slot,
        f.space,
        f.batch_row,
        f.pool_row,
        f.position,
        f.role,
        cells_key(f),
        prov,
        f.provenance_total,
    )


def whole_check(dump: KvDump, slot: int) -> list[Finding]:
    """What the whole batch's check finds at `slot`, before the diagnosis."""
    found = collect_findings(dump, planner=VECTORIZED, kernel=None).findings
    peer = swa_peer(dump, slot)
    touching = [part for f in found if (part := touching_part(f, slot, peer)) is not None]
    return sorted(attach_provenance(dump, touching), key=Finding.order_key)


def slots_to_try(dump: KvDump, found: list[Finding], rng: np.random.Generator) -> set[int]:
    slots = {f.slot for f in found if f.slot is not None and f.space == "full"}
    for f in found:
        full = f.details.get("full_slots", f.details.get("full_slot"))
        slots.update(
            [s for s in full if isinstance(s, int)]
            if isinstance(full, list)
            else [full]
            if isinstance(full, int)
            else []
        )
    live = np.unique(live_cells(dump).slot)
    if live.size:
        slots.update(int(s) for s in rng.choice(live, size=min(4, live.size), replace=False))
    return {int(s) for s in slots}


@pytest.mark.parametrize("seed", deep_repeats([0, 1]))
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_focused_findings_equal_the_whole_check(name: str, seed: int, tmp_path: Path) -> None:
    dump = load_dump(make_scenario(name, seed=seed).save(tmp_path / "d.safetensors"))
    everything = collect_findings(dump, planner=VECTORIZED, kernel=None).findings
    for slot in sorted(slots_to_try(dump, everything, np.random.default_rng(seed))):
        expected = [_key(f) for f in whole_check(dump, slot)]
        got = [_key(f) for f in focused_findings(dump, slot, planner=VECTORIZED)]
        assert got == expected, (name, seed, slot)
        # as `provenance --slot` runs it: one wide index for the findings and the answer
        index = focused_index(dump, slot, max_cells=256)
        shared = focused_findings(dump, slot, planner=VECTORIZED, index=index)
        assert [_key(f) for f in shared] == expected, (name, seed, slot)


def test_the_view_keeps_only_rows_that_hold_the_slot(tmp_path: Path) -> None:
    dump = load_dump(make_scenario("cross-request-aliasing", seed=1).save(tmp_path / "d"))
    cells = live_cells(dump)
    slot = int(cells.slot[cells.slot > 0][0])
    view = _rows_holding(dump, cells, related_slots(dump, slot))
    kept = set(view.req_pool_indices[view.req_pool_indices != 0].tolist())
    holders = set(cells.pool_row[cells.slot == slot].tolist())
    assert holders <= kept
    assert len(kept) < int((dump.req_pool_indices != 0).sum())  # the point: fewer rows


def test_provenance_shows_no_diagnosis(tmp_path: Path) -> None:
    from kvcanary_cli import api

    path = make_scenario("use-after-free", seed=1).save(tmp_path / "d.safetensors")
    report = api.check(path, kernel="none")
    assert isinstance(report, CheckReport)
    finding = next(f for f in report.dumps[0].findings if f.slot is not None)
    answer = api.provenance(path, slot=finding.slot)
    assert isinstance(answer, ProvenanceReport)
    assert [replace(f, cause=None, first_raise=False).code for f in answer.findings] == [
        finding.code
    ]
    assert all(f.cause is None and not f.first_raise for f in answer.findings)
