"""`run_check` lets the live cells go before the plans where no detector beside them reads
them (ten million cells of one slot: 74 MiB); an SWA group's LUT findings and a canary replay
still read them, and every finding is the one keeping them gives."""

from __future__ import annotations

import pytest

from kvcanary_cli.analysis.check import collect_findings
from kvcanary_cli.synth.scenarios import make_scenario
from tests.analysis.conftest import LoadSynth
from tests.helpers import TRITON, VECTORIZED


@pytest.mark.parametrize(
    ("scenario", "read"),
    [
        ("duplicate-slot-in-row", False),
        ("swa-lut-cleared-in-window", True),
        ("canary-aliasing", True),
    ],
)
def test_the_live_cells_go_where_nothing_reads_them(
    scenario: str, read: bool, load_synth: LoadSynth
) -> None:
    dump = load_synth(make_scenario(scenario, seed=1))
    kept = collect_findings(dump, planner=VECTORIZED, kernel=TRITON)
    dropped = collect_findings(dump, planner=VECTORIZED, kernel=TRITON, keep_cells=False)
    assert kept.cells is not None
    assert (dropped.cells is not None) == read
    assert dropped.findings == kept.findings and kept.findings
    assert dropped.summaries == kept.summaries
