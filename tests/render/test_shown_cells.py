"""The table and Markdown views read the cells they show, not every cell of every finding.

One slot held by every live cell of a shrunk dump (`one_slot_shrunk_dump`): its two findings
stand for 153,344 cells each, of which the views show a handful and count the rest. What a
view allocates is measured with `tracemalloc` while it is built and drawn (a bound on memory,
never a wall time): it once built every cell as Python ints, then copied the record to make it
printable (3.9 GB at 9.8 M cells); JSON, which lists every cell, writes the columns from their
arrays a piece at a time. A timeline's event and owner changes of a million cells each: its
views read the few they show (they built the whole record first: 589 MiB).
"""

from __future__ import annotations

import io
import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from kvcanary_cli import api
from kvcanary_cli.render import render
from kvcanary_cli.render.console import OutputFormat
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.results.provenance import ProvenanceReport
from kvcanary_cli.results.timeline import TimelineReport
from tests.helpers import one_slot_shrunk_dump

ROWS, WIDTH = 256, 600
#: What a view of the dump may allocate: its text and rich's drawing of it (a few hundred KB).
#: Every cell as a Python int in a list is 8 bytes per entry before any int object: 12 MB for
#: the findings' 10 columns here.
VIEW_BYTES = 4 << 20


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("one-slot") / "one-slot.safetensors"
    return one_slot_shrunk_dump(path, rows=ROWS, width=WIDTH)


@pytest.fixture(scope="module")
def provenance(dump: Path) -> ProvenanceReport:
    answer = api.provenance(dump, slot=7)
    assert isinstance(answer, ProvenanceReport)
    return answer


@pytest.fixture(scope="module")
def check(dump: Path) -> CheckReport:
    report = api.check([dump], kernel="none")
    assert isinstance(report, CheckReport)
    return report


def _drawn(view: object) -> str:
    if isinstance(view, str):
        return view
    buffer = io.StringIO()
    Console(file=buffer, width=120, color_system=None).print(view)
    return buffer.getvalue()


def _allocated(make: Callable[[], object]) -> tuple[int, str]:
    """(peak bytes allocated, text) while the view is built and drawn."""
    tracemalloc.start()
    try:
        text = _drawn(make())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, text


@pytest.mark.parametrize("fmt", [OutputFormat.TABLE, OutputFormat.MARKDOWN])
@pytest.mark.slow
def test_a_provenance_view_allocates_what_it_shows(
    provenance: ProvenanceReport, fmt: OutputFormat
) -> None:
    assert [f.count for f in provenance.findings] == [ROWS * (WIDTH - 1)] * 2
    peak, text = _allocated(lambda: render(provenance, fmt, max_rows=8))
    assert f"{ROWS * (WIDTH - 1) - 2} more" in text or "+153341 more" in text
    assert peak < VIEW_BYTES, f"{peak / 2**20:.1f} MiB"


@pytest.mark.parametrize("fmt", [OutputFormat.TABLE, OutputFormat.MARKDOWN])
def test_a_check_view_allocates_what_it_shows(check: CheckReport, fmt: OutputFormat) -> None:
    peak, text = _allocated(lambda: render(check, fmt))
    assert "slot-shared-across-positions" in text
    assert peak < VIEW_BYTES, f"{peak / 2**20:.1f} MiB"


def test_json_lists_every_cell_from_the_arrays(provenance: ProvenanceReport) -> None:
    text = render(provenance, OutputFormat.JSON)
    assert isinstance(text, str)
    findings = json.loads(text)["findings"]
    for finding, group in zip(findings, provenance.findings, strict=True):
        assert group.cells is not None
        assert finding["cells"]["position"] == group.cells.position.tolist()
        assert finding["cells"]["slot"] == [7] * group.count


#: A timeline event (and an interval's owner changes) of a million cells.
TIMELINE_CELLS = 1 << 20
#: The JSON record lists every cell: more than any view shows is enough (a million cost 3 s).
JSON_CELLS = 1000


@pytest.fixture(scope="module")
def timeline() -> TimelineReport:
    return timeline_of(TIMELINE_CELLS)


def timeline_of(cells: int) -> TimelineReport:
    """Two dumps, one interval whose owner changes and one use-after-free event each stand
    for `cells` cells."""
    import numpy as np

    from kvcanary_cli.catalog import CauseCode, EventKind
    from kvcanary_cli.results.cells import CellColumns, Space
    from kvcanary_cli.results.timeline import TimelineDump, TimelineEvent, TimelineInterval

    cell = np.arange(cells, dtype=np.int64)

    def columns(*extra: str) -> CellColumns:
        named = {name: cell + k for k, name in enumerate(extra)}
        return CellColumns(batch_row=cell, pool_row=cell, position=cell, slot=cell, extra=named)

    dumps = tuple(
        TimelineDump(
            index=i,
            path=f"d{i}.safetensors",
            step=i + 1,
            identity={},
            bs=1,
            requests=1,
            live_cells=cells,
            free_full_slots=None,
            leaked_swa_pages=None,
            leak_note=None,
            finding_cells=None,
            worst=None,
            shrunk=False,
        )
        for i in range(2)
    )
    interval = TimelineInterval(
        from_dump=0,
        to_dump=1,
        after_step=1,
        at_step=2,
        born=(),
        grew=(),
        finished=(),
        reused=(),
        resumed=(),
        unchanged=1,
        tokens_added=0,
        allocated_from_free=0,
        allocated_unseen=0,
        owner_changes=columns("old_pool_row", "old_position"),
    )
    event = TimelineEvent(
        from_dump=0,
        to_dump=1,
        after_step=1,
        at_step=2,
        kind=EventKind.USE_AFTER_FREE,
        cause=CauseCode.USE_AFTER_FREE,
        space=Space.FULL,
        cells=columns("page"),
        pages=(),
        findings=(),
        message="a page of a running request put back on the free list",
    )
    return TimelineReport(
        rank="0", dumps=dumps, intervals=(interval,), events=(event,), findings=(), checked=False
    )


@pytest.mark.parametrize("fmt", [OutputFormat.TABLE, OutputFormat.MARKDOWN])
def test_a_timeline_view_allocates_what_it_shows(
    timeline: TimelineReport, fmt: OutputFormat
) -> None:
    peak, text = _allocated(lambda: render(timeline, fmt, max_rows=8))
    assert f"{TIMELINE_CELLS - 8} more" in text  # the event's cells and the owner changes
    assert peak < VIEW_BYTES, f"{peak / 2**20:.1f} MiB"


def test_timeline_json_lists_every_cell() -> None:
    text = render(timeline_of(JSON_CELLS), OutputFormat.JSON)
    assert isinstance(text, str)
    record = json.loads(text)
    (event,) = record["events"]
    assert event["count"] == JSON_CELLS and event["cells"]["extra"]["page"] == list(
        range(JSON_CELLS)
    )
    changes = record["intervals"][0]["owner_changes"]
    assert changes["extra"]["old_position"] == list(range(1, JSON_CELLS + 1))
