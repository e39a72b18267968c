"""The JSON view of a report with many cells is written a piece at a time: its memory grows with
the pieces, not with the text. JSON carries every cell, so its text may be hundreds of
megabytes (335 MB for the 9.8 M cells of `bench/hostile.py`'s one-slot dump); it was built
whole, joined from the columns' texts, then held again as bytes for its file (1.3 GB at the
peak for that dump, 0.6 GB for its table). Measured as the peak of the traced allocations
while the view is rendered and delivered, never as a wall time."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest
from rich.console import Console

from kvcanary_cli import api
from kvcanary_cli.output import deliver
from kvcanary_cli.render import OutputFormat, emit, render
from kvcanary_cli.results.check import CheckReport
from tests.helpers import one_slot_shrunk_dump

#: The most a JSON view may hold beyond its report, as a share of its text: the pieces it
#: converts at a time and the batch it writes (a few hundred KB). Built whole, it held two
#: to three times its text.
_SHARE = 0.25


@pytest.fixture(scope="module")
def wide_report(tmp_path_factory: pytest.TempPathFactory) -> CheckReport:
    # 160 live rows x 600 cells, every one holding slot 7: 96,000 cells in two findings,
    # about 3 MB of JSON.
    path = one_slot_shrunk_dump(
        tmp_path_factory.mktemp("json-memory") / "one-slot.safetensors", rows=160, width=600
    )
    report = api.check([path], kernel="none")
    assert isinstance(report, CheckReport) and report.failed
    return report


def _peak_of(step: object) -> int:
    """Peak traced bytes above the start while `step()` runs."""
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        step()  # type: ignore[operator]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - start


def test_json_to_a_file_is_written_in_pieces(wide_report: CheckReport, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    peak = _peak_of(lambda: deliver(render(wide_report, OutputFormat.JSON), out))
    size = out.stat().st_size
    assert size > 2 << 20
    assert json.loads(out.read_bytes())["dumps"][0]["findings"]
    assert peak < _SHARE * size, f"{peak >> 10} KiB held for {size >> 10} KiB of JSON"


def test_json_to_standard_output_is_written_in_pieces(wide_report: CheckReport) -> None:
    with open(os.devnull, "w", encoding="utf-8") as sink:
        console = Console(file=sink)
        peak = _peak_of(lambda: emit(render(wide_report, OutputFormat.JSON), console))
    size = len(str(render(wide_report, OutputFormat.JSON)))
    assert size > 2 << 20
    assert peak < _SHARE * size, f"{peak >> 10} KiB held for {size >> 10} KiB of JSON"
