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
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rich.console import Console

from kvcanary_cli import api
from kvcanary_cli.output import deliver
from kvcanary_cli.render import JsonText, OutputFormat, emit, render
from kvcanary_cli.results.check import CheckReport
from tests.helpers import one_slot_shrunk_dump

#: The most a JSON view may hold beyond its report, as a share of its text: the pieces it
#: converts at a time and the batch it writes (a few hundred KB). Built whole, it held two
#: to three times its text.
_SHARE = 0.25


@pytest.fixture(scope="module")
def wide_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[CheckReport, int]:
    """A check of 100 live rows x 1,500 cells, every one holding slot 7 (150,000 cells in two
    findings), and the length of its JSON (about 4 MB), rendered once here so that what the
    views import is not counted."""
    path = one_slot_shrunk_dump(
        tmp_path_factory.mktemp("json-memory") / "one-slot.safetensors", rows=100, width=1500
    )
    report = api.check([path], kernel="none")
    assert isinstance(report, CheckReport) and report.failed
    size = len(str(render(report, OutputFormat.JSON)))
    assert size > 3 << 20
    return report, size


def _peak_of(step: Callable[[], object]) -> int:
    """Peak traced bytes above the start while `step()` runs."""
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - start


@pytest.mark.slow  # a large record traced (1.5 s)
def test_json_to_a_file_is_written_in_pieces(
    wide_report: tuple[CheckReport, int], tmp_path: Path
) -> None:
    report, size = wide_report
    out = tmp_path / "report.json"
    peak = _peak_of(lambda: deliver(render(report, OutputFormat.JSON, streamed=True), out))
    assert out.stat().st_size == size
    assert json.loads(out.read_bytes())["dumps"][0]["findings"]
    assert peak < _SHARE * size, f"{peak >> 10} KiB held for {size >> 10} KiB of JSON"


@pytest.mark.slow  # a large record traced (1.3 s)
def test_json_to_standard_output_is_written_in_pieces(
    wide_report: tuple[CheckReport, int],
) -> None:
    report, size = wide_report
    with open(os.devnull, "w", encoding="utf-8") as sink:
        console = Console(file=sink)
        peak = _peak_of(lambda: emit(render(report, OutputFormat.JSON, streamed=True), console))
    assert peak < _SHARE * size, f"{peak >> 10} KiB held for {size >> 10} KiB of JSON"


def test_json_stopped_mid_write_leaves_no_report_nor_image(
    single_report: CheckReport, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Made as it is written, the JSON is staged a piece at a time: Ctrl-C between two pieces
    # leaves neither the report, the image beside it, nor a staged file, and a report the run
    # was to replace keeps its content.
    out, svg = tmp_path / "report.json", tmp_path / "report.svg"
    out.write_text("the old report\n")
    pieces = JsonText.pieces

    def stopped(view: JsonText) -> Iterator[str]:
        for piece in pieces(view):
            yield piece
            raise KeyboardInterrupt

    monkeypatch.setattr(JsonText, "pieces", stopped)
    with pytest.raises(KeyboardInterrupt):
        deliver(render(single_report, OutputFormat.JSON, streamed=True), out, force=True, svg=svg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
    assert out.read_text() == "the old report\n"
