"""`check` made a few cells at a time gives the report it gives at its default sizes.

The passes over every live cell, plan entry or finding cell that bound their temporaries by
working a piece at a time (the live cells' gather, the vectorized plan's entries, the
duplicate count, the copied-prefix grouping, the plans' comparison, the stale-row diagnosis,
the causes' split, the request summaries, the findings' cells gathered from runs) are run
with pieces of a few cells, so that runs, rows and groups cross piece boundaries: the JSON
report is byte for byte the one of the default sizes. A corrupt scenario of each kind is
checked, and a clean one, whose report stays clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcanary_cli.analysis import cells as cells_module
from kvcanary_cli.analysis import compare as compare_module
from kvcanary_cli.analysis import findings as findings_module
from kvcanary_cli.analysis import provenance as provenance_module
from kvcanary_cli.analysis.check import run_check
from kvcanary_cli.catalog import Severity
from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.planners.base import Semantics
from kvcanary_cli.planners.vectorized import VectorizedPlanner
from kvcanary_cli.render import render
from kvcanary_cli.render.console import OutputFormat
from kvcanary_cli.results import cells as cell_results
from kvcanary_cli.results.cells import RunColumn
from kvcanary_cli.results.check import CheckReport
from tests.analysis.conftest import ScenarioDump
from tests.helpers import one_slot_shrunk_dump

PIECE = 5  # cells, entries or rows a piece: no divisor of the sizes below


def _report(dump: KvDump, chunk: int) -> str:
    """The JSON report of `dump`, its plans made `chunk` entries at a time."""
    report = run_check(
        dump,
        planner=VectorizedPlanner(chunk_entries=chunk),
        kernel=VectorizedPlanner(semantics=Semantics.GPU, chunk_entries=chunk),
    )
    whole = CheckReport(dumps=(report,), fail_on=Severity.ERROR, sglang_installed=None)
    text = render(whole, OutputFormat.JSON)
    assert isinstance(text, str)
    return text


def _in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cells_module, "PIECE_CELLS", PIECE)
    monkeypatch.setattr(cells_module, "_KEY_CHUNK", PIECE)
    monkeypatch.setattr(findings_module, "_COUNT_CHUNK", PIECE)
    monkeypatch.setattr(compare_module, "_PIECE", PIECE)
    monkeypatch.setattr(provenance_module, "_LIVE_CHUNK", PIECE)
    monkeypatch.setattr(findings_module, "_PLACE_CELLS", PIECE)
    # the live cells' rows and every finding column held as runs, however many: the
    # findings' columns are gathered from runs, and runs decoded, a few entries at a time
    monkeypatch.setattr(provenance_module, "_RUNS_FROM", 2)
    monkeypatch.setattr(RunColumn, "MIN_CELLS", 2)
    monkeypatch.setattr(RunColumn, "SAVING", 0)
    monkeypatch.setattr(cell_results, "_RUN_PIECE", PIECE)


def _same_in_pieces(dump: KvDump, monkeypatch: pytest.MonkeyPatch) -> str:
    """The default sizes' report, asserted equal to the one made in pieces."""
    whole = _report(dump, 1 << 17)
    with monkeypatch.context() as patched:
        _in_pieces(patched)
        assert _report(dump, PIECE) == whole
    return whole


@pytest.mark.parametrize(
    "scenario",
    ["stale-tail", "cross-request-aliasing", "radix-copy", "truncated-lut", "use-after-free"],
)
def test_a_scenario_checked_in_pieces_reports_the_same(
    scenario: str, scenario_dump: ScenarioDump, monkeypatch: pytest.MonkeyPatch
) -> None:
    dump, _ = scenario_dump(scenario)
    text = _same_in_pieces(dump, monkeypatch)
    assert '"verdict": "findings"' in text  # a report with findings was compared


def test_a_clean_scenario_checked_in_pieces_stays_clean(
    scenario_dump: ScenarioDump, monkeypatch: pytest.MonkeyPatch
) -> None:
    dump, _ = scenario_dump("clean-swa", corrupt=False)
    text = _same_in_pieces(dump, monkeypatch)
    assert '"findings": []' in text


def test_one_slot_every_cell_holds_checked_in_pieces_reports_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every path at once: duplicates in a row, sharing across positions and rows, the stale
    # rows and the reuse within a request diagnosed, the causes split, the rows summarized
    dump = load_dump(one_slot_shrunk_dump(tmp_path / "one.safetensors", rows=6, width=9))
    text = _same_in_pieces(dump, monkeypatch)
    assert '"duplicate-slot-in-row"' in text and '"slot-shared-across-positions"' in text
