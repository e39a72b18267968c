"""`provenance --row` marks every bad cell of its row, not only each finding's first: in the
JSON record (`row.cells[].marks`), in the terminal table and in Markdown, for every synth
scenario at page size 1, 4 and 16, bounded by `--max-rows` (the marked positions past it are
counted, "N marked positions do not fit"). The suite runs every scenario at tiny at one page
size, taken in turn, and one scenario at medium; the deep lane the other page sizes, every
scenario at small (at the suite's page size) and two more at medium; every size and page size
run with `KVCANARY_TEST_LARGE=1`."""

from __future__ import annotations

import io
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from kvcanary_cli.analysis.query import row_map
from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.render.markdown.provenance import provenance_markdown
from kvcanary_cli.render.table.provenance import provenance_table
from kvcanary_cli.results.check import DumpReport
from kvcanary_cli.synth.scenarios import SCENARIOS, make_scenario
from tests.helpers import PAGE_SIZES, checked, page_sizes_in_turn
from tests.lanes import DEEP
from tests.render.record_schema import record_of

#: the default of `provenance --max-rows`.
MAX_CELLS = 256


def _bad_cells(dump: KvDump, report: DumpReport) -> dict[int, dict[int, set[str]]]:
    """pool row -> position -> codes of every finding cell inside the table."""
    out: dict[int, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    rows, width = dump.max_reqs, dump.max_seq_len
    for f in report.findings:
        if f.cells is not None:
            pool_rows, positions = f.cells.pool_row, f.cells.position
        elif f.pool_row is not None and f.position is not None:
            pool_rows, positions = np.array([f.pool_row]), np.array([f.position])
        else:
            continue
        inside = (pool_rows >= 0) & (pool_rows < rows) & (positions >= 0) & (positions < width)
        for r, p in zip(pool_rows[inside].tolist(), positions[inside].tolist(), strict=True):
            out[r][p].add(f.code.value)
    return out


def _table_marks(text: str) -> dict[int, set[str]]:
    """position -> codes the terminal table marks (`! code`, one per line of a cell)."""
    marks: dict[int, set[str]] = defaultdict(set)
    position = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) < 7:
            continue
        if cells[1].isdigit():
            position = int(cells[1])
        elif cells[1]:
            position = None  # a gap row
        if position is not None and cells[5].startswith("! "):
            marks[position].add(cells[5][2:])
    return marks


def _check_rows(path: Path) -> int:
    """Check every pool row holding a bad cell; how many rows were checked. The table view
    (rich draws a 256-cell row at about 0.15 s) is drawn for three of them: the first, the
    last and the one with most marks; the JSON and Markdown views for every one."""
    dump = load_dump(path)
    report = checked(dump)
    checked_rows = 0
    bad = sorted(_bad_cells(dump, report).items())
    drawn = {bad[0][0], bad[-1][0], max(bad, key=lambda row: len(row[1]))[0]} if bad else set()
    for pool_row, wanted in bad:
        answer = row_map(dump, report, pool_row, max_cells=MAX_CELLS)
        row = record_of(answer)["row"]
        assert row is not None
        shown = sorted(wanted)[:MAX_CELLS]
        json_marks = {c["position"]: set(c["marks"]) for c in row["cells"] if c["marks"]}
        assert json_marks == {p: wanted[p] for p in shown}, (path.name, pool_row)
        assert row["marks_not_shown"] == len(wanted) - len(shown)
        if pool_row in drawn:
            console = Console(file=io.StringIO(), record=True, width=400, color_system=None)
            console.print(provenance_table(answer))
            assert _table_marks(console.export_text()) == json_marks, (path.name, pool_row)
        markdown = provenance_markdown(answer, max_rows=MAX_CELLS)
        for p in shown:
            assert any(
                line.startswith(f"| {p} |") and all(code in line for code in wanted[p])
                for line in markdown.splitlines()
            ), (path.name, pool_row, p)
        if len(wanted) > len(shown):
            assert f"{len(wanted) - len(shown)} marked positions do not fit" in markdown
        checked_rows += 1
    return checked_rows


def _cases(sizes: tuple[str, ...]) -> list[tuple[str, str, int]]:
    return [
        (name, size, page)
        for size in sizes
        for name, scenario in SCENARIOS.items()
        for page in PAGE_SIZES
        if page >= scenario.min_page_size
    ]


def _build(tmp_path: Path, name: str, size: str, page: int) -> Path:
    synth = make_scenario(name, seed=0, size=size, page_size=page)
    return synth.save(tmp_path / f"{name}.safetensors")


@pytest.mark.parametrize(("name", "page"), page_sizes_in_turn(SCENARIOS))
def test_every_bad_cell_is_marked(tmp_path: Path, name: str, page: int) -> None:
    _check_rows(_build(tmp_path, name, "tiny", page))


#: The production shapes: medium (2049 x 32,772 tables, about 2 s a case) for a few
#: scenarios in the slow and deep lanes, every scenario at medium and large (4097 x 131,076:
#: 2 GB a table, hours for the sweep) only when asked for with KVCANARY_TEST_LARGE=1.
_SWEEP = bool(os.environ.get("KVCANARY_TEST_LARGE"))
_MEDIUM_SAMPLE = {("truncated-lut", 1), ("stale-tail", 4), ("partial-page-free", 16)}


def _small_cases() -> list[tuple[str, str, int]]:
    """Every scenario once at small, at the page size the fast lane takes it at in tiny: tiny
    already crosses every scenario with every page size, the same path."""
    return [(name, "small", page) for name, page in page_sizes_in_turn(SCENARIOS, fast_only=True)]


def _larger_cases() -> list[Any]:
    if _SWEEP:
        return _cases(("small", "medium", "large"))
    medium = [
        case if case[0] == "truncated-lut" else pytest.param(*case, marks=DEEP)
        for case in _cases(("medium",))
        if (case[0], case[2]) in _MEDIUM_SAMPLE
    ]
    assert len(medium) == len(_MEDIUM_SAMPLE), "a sampled scenario was renamed"
    small = [pytest.param(*case, marks=DEEP) for case in _small_cases()]
    assert {case.values[2] for case in small} == set(PAGE_SIZES)
    return small + medium


@pytest.mark.slow
@pytest.mark.parametrize(("name", "size", "page"), _larger_cases())
def test_every_bad_cell_is_marked_at_larger_sizes(
    tmp_path: Path, name: str, size: str, page: int
) -> None:
    _check_rows(_build(tmp_path, name, size, page))


def test_a_run_of_bad_cells_is_marked_whole() -> None:
    # examples/stale-tail: row 10's stale tail is positions 15..18, one finding group.
    path = Path(__file__).resolve().parents[2] / "examples" / "stale-tail.safetensors"
    dump = load_dump(path)
    answer = row_map(dump, checked(dump), 10)
    assert answer.row is not None
    marked = [c.position for c in answer.row.cells if "freed-slot-in-live-range" in c.marks]
    assert marked == [15, 16, 17, 18]


def test_marks_past_max_rows_are_counted(tmp_path: Path) -> None:
    # a truncated LUT leaves dozens of out-of-range cells in a row: 4 shown, the rest counted
    path = _build(tmp_path, "truncated-lut", "small", 1)
    dump = load_dump(path)
    report = checked(dump)
    pool_row, wanted = max(_bad_cells(dump, report).items(), key=lambda kv: len(kv[1]))
    assert len(wanted) > 4
    row = row_map(dump, report, pool_row, max_cells=4).row
    assert row is not None
    assert [c.position for c in row.cells if c.marks] == sorted(wanted)[:4]
    assert row.marks_not_shown == len(wanted) - 4
