"""The operations on a finding group's cells (`analysis.cells`) on random groups: a part keeps
exactly the cells asked for, in order, and its example and marks only when it keeps that cell."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcanary_cli.analysis.cells import at_cell, holding, in_pool_row, part, restricted
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.results.cells import CellColumns, Role
from kvcanary_cli.results.check import Finding


@st.composite
def groups(draw: st.DrawFn) -> tuple[Finding, np.ndarray]:
    """A finding group of 1..40 distinct cells (report order), an example, and a mask."""
    n = draw(st.integers(1, 40))
    flat = draw(st.lists(st.integers(0, 400), min_size=n, max_size=n, unique=True))
    flat.sort()
    batch_row = np.array([f // 50 for f in flat], dtype=np.int64)
    position = np.array([f % 50 for f in flat], dtype=np.int64)
    slot = np.array(draw(st.lists(st.integers(1, 12), min_size=n, max_size=n)), dtype=np.int64)
    cells = CellColumns(
        batch_row=batch_row,
        pool_row=batch_row + 1,
        position=position,
        slot=slot,
        extra={"full_slot": slot * 10},
    )
    k = draw(st.integers(0, n - 1))
    finding = Finding(
        code=FindingCode.LUT_OUT_OF_RANGE,
        group=Group.SWA,
        message="m",
        slot=int(slot[k]),
        batch_row=int(batch_row[k]),
        pool_row=int(batch_row[k]) + 1,
        position=int(position[k]),
        role=Role.VERIFY,
        cells=cells,
        first_raise=True,
        upstream_raise="ValueError: x",
    )
    mask = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    return finding, mask


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(case=groups())
def test_a_part_keeps_the_cells_asked_for(case: tuple[Finding, np.ndarray]) -> None:
    finding, mask = case
    cells = finding.cells
    assert cells is not None
    got = part(finding, mask)
    if not mask.any():
        assert got is None
        return
    assert got is not None and got.cells is not None
    assert got.cells == cells.take(mask)
    assert got.count == int(mask.sum())
    kept_example = bool(
        (mask & (cells.batch_row == finding.batch_row) & (cells.position == finding.position)).any()
    )
    assert got.first_raise is kept_example
    assert (got.upstream_raise is not None) is kept_example
    # the example is always one of the part's cells
    assert at_cell(got, got.batch_row or 0, got.position or 0) is not None
    assert restricted(finding, np.ones(len(cells), dtype=bool)) is finding


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(case=groups(), wanted=st.sets(st.integers(1, 12), min_size=1, max_size=4))
def test_holding_selects_the_cells_of_the_slots(
    case: tuple[Finding, np.ndarray], wanted: set[int]
) -> None:
    finding, _ = case
    cells = finding.cells
    assert cells is not None and cells.slot is not None
    slots = np.array(sorted(wanted), dtype=np.int64)
    got = holding(finding, slots)
    hit = np.isin(cells.slot, slots)
    assert (got is None) == (not hit.any())
    if got is not None:
        assert got.cells == cells.take(hit)
    via = holding(finding, slots * 10, via_full_slot=True)  # the full_slot column
    assert (via is None) == (not hit.any())
    row = int(cells.pool_row[0])
    by_row = in_pool_row(finding, row)
    assert by_row is not None and by_row.cells == cells.take(cells.pool_row == row)
