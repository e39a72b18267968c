"""A finding group's columns held as runs (`results.cells.RunColumn`: one batch row's many
cells, a row's consecutive positions, one slot in every cell) read back as the arrays they
stand for, and change no output: every format of `check` and `provenance` is the same byte for
byte with every column held as an array, on the synth corpus (runs made of a few cells) and
on a one-slot dump whose positions reach int16's largest value."""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from kvcanary_cli import api
from kvcanary_cli.render import render
from kvcanary_cli.render.console import OutputFormat
from kvcanary_cli.results.cells import CellColumns, NarrowColumn, RunColumn
from kvcanary_cli.results.columns import IntColumn, int_items
from kvcanary_cli.results.record import Result
from kvcanary_cli.synth.scenarios import make_scenario
from tests.helpers import one_slot_shrunk_dump
from tests.lanes import DEEP


def _arrays() -> Iterator[np.ndarray]:
    """Columns of runs of equal values, of values counting up by one (across int8's and
    int16's largest values, where `+ 1` wraps), and of both mixed."""
    rng = np.random.default_rng(5)
    for _ in range(12):
        lengths = rng.multinomial(6000, [1 / 24] * 24)
        yield np.repeat(rng.integers(-40_000, 40_000, 24), lengths)
        yield np.concatenate([np.arange(n) + int(rng.integers(-200, 100)) for n in lengths])
        heads = rng.integers(-(2**31), 2**31 - 7000, 24)
        yield np.concatenate([np.arange(n) + h for n, h in zip(lengths, heads, strict=True)])
    for top in (127, 32767):  # counting up to the dtype's largest value, then on from its least
        yield np.concatenate([np.arange(top - 4999, top + 1), np.arange(-top - 1, -top + 4999)])
        yield np.concatenate([np.arange(top - 4999, top + 1), np.full(5000, -top - 1)])
        yield np.concatenate([np.full(5000, top), np.arange(-top - 1, -top + 4999)])


def _cases() -> list[object]:
    """`_arrays()` as cases: of its 12 draws of 3 random shapes, the draws after the first
    repeat a path the first takes (the deep lane); the dtype edges after them run in every
    lane."""
    shapes, draws = 3, 12
    return [
        pytest.param(given, marks=DEEP) if shapes <= i < shapes * draws else given
        for i, given in enumerate(_arrays())
    ]


@pytest.mark.parametrize("given", _cases(), ids=lambda a: f"{a.min()}..{a.max()}")
def test_a_column_of_runs_reads_back_as_its_array(given: np.ndarray) -> None:
    array = NarrowColumn.of(given)
    held = RunColumn.held_as_runs(array)
    if isinstance(held, NarrowColumn):  # too many runs to be worth it: kept as it is
        assert held is array
        return
    assert held.values.dtype == array.values.dtype
    assert np.array_equal(held.values, array.values)
    assert held.wide().dtype == given.dtype and held.wide().tolist() == given.tolist()
    rng = np.random.default_rng(int(given.size))
    picked = rng.integers(0, given.size, 100)
    assert np.array_equal(held[picked], array.values[picked])
    for start, stop in rng.integers(0, given.size, (20, 2)):
        assert np.array_equal(held[start:stop], array.values[start:stop])
        assert held[int(start)] == array.values[start] and held[-1] == array.values[-1]
    wanted = rng.choice(given, 3)
    assert np.array_equal(held.where_in(wanted), np.flatnonzero(np.isin(given, wanted)))
    assert held.bounds() == (int(given.min()), int(given.max()))
    assert np.array_equal(held.distinct(), np.unique(array.values))
    assert held.distinct_count() == np.unique(given).size
    back = pickle.loads(pickle.dumps(held))  # a `check -j` worker hands its findings back
    assert isinstance(back, RunColumn) and np.array_equal(back.values, array.values)


@pytest.mark.parametrize("given", _cases(), ids=lambda a: f"{a.min()}..{a.max()}")
@pytest.mark.slow
def test_a_finding_column_held_as_runs_is_made_as_its_gathered_array_would_be(
    given: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finding's column is gathered from the live cells a piece at a time when it is held
    as runs (`_gathered`): with pieces of 7 entries, each run, its step and its first value,
    or the column kept as an array, are what gathering it whole and then finding its runs
    make, for a mask and for an index, from an array or from runs."""
    import kvcanary_cli.results.cells as cells_module

    monkeypatch.setattr(cells_module, "_GATHER_PIECE", 7)
    rng = np.random.default_rng(int(given.size) + 1)
    array = NarrowColumn.of(given)
    sources = (array, RunColumn.held_as_runs(array))
    picks = (
        np.ones(given.size, dtype=bool),
        rng.random(given.size) < 0.999,  # runs cut here and there
        rng.random(given.size) < 0.5,  # too many runs: an array
        np.zeros(given.size, dtype=bool),
        np.arange(given.size // 2, given.size),
        np.sort(rng.integers(0, given.size, 5000)),
    )
    for source in sources:
        for index in picks:
            made = cells_module._gathered(source, index)
            whole = cells_module._held(NarrowColumn(array.values[index], np.dtype(np.int64)))
            assert type(made) is type(whole)
            assert made.dtype == whole.dtype == np.dtype(np.int64)
            if isinstance(whole, RunColumn):
                assert isinstance(made, RunColumn) and made.step == whole.step
                assert made.starts.dtype == whole.starts.dtype
                assert made.firsts.dtype == whole.firsts.dtype
            assert cells_module._same(made, whole)
            assert np.array_equal(made.values, whole.values)


@pytest.mark.parametrize("given", list(_arrays())[:6], ids=lambda a: f"{a.min()}..{a.max()}")
def test_a_column_of_runs_gathers_what_its_array_gathers(
    given: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gather` decodes a piece at a time: with pieces of 7 entries (runs and the picked
    entries cross every piece's ends), a mask of every entry and an ascending or repeating
    index take what the decoded array takes, in its dtype."""
    import kvcanary_cli.results.cells as cells_module

    monkeypatch.setattr(cells_module, "_RUN_PIECE", 7)
    array = NarrowColumn.of(given)
    held = RunColumn.held_as_runs(array)
    assert isinstance(held, RunColumn)
    rng = np.random.default_rng(int(given.size) + 1)
    for mask in (
        rng.random(given.size) < 0.3,
        np.ones(given.size, bool),
        np.zeros(given.size, bool),
    ):
        taken = held.gather(mask)
        assert taken.dtype == array.values.dtype and np.array_equal(taken, array.values[mask])
    for index in (np.flatnonzero(rng.random(given.size) < 0.1), rng.integers(0, given.size, 50)):
        assert np.array_equal(held.gather(index), array.values[index])
    assert held.gather(np.zeros(0, dtype=np.int64)).size == 0


@pytest.mark.parametrize(
    "given", list(_arrays())[:3] + list(_arrays())[-6:], ids=lambda a: f"{a.min()}..{a.max()}"
)
def test_a_column_of_runs_writes_the_json_text_of_its_array(
    given: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of equal values writes its text repeated (`json_items`), not each entry: the
    JSON of the column, in pieces of 7 entries that cut runs anywhere, and any range of its
    items, are the text its decoded array gives."""
    import kvcanary_cli.results.columns as columns_module

    monkeypatch.setattr(RunColumn, "SAVING", 0)  # runs, however many
    array = NarrowColumn.of(given)
    held = RunColumn.held_as_runs(array)
    assert isinstance(held, RunColumn)
    as_array = "".join(IntColumn(array.values).json_pieces())
    assert as_array == json.dumps(given.tolist(), separators=(",", ":"))
    monkeypatch.setattr(columns_module, "JSON_SLICE", 7)
    assert "".join(IntColumn(held).json_pieces()) == as_array
    rng = np.random.default_rng(int(given.size))
    for start, stop in [(0, 0), (0, given.size), *rng.integers(0, given.size, (20, 2))]:
        start, stop = sorted((int(start), int(stop)))
        assert held.json_items(start, stop) == int_items(given[start:stop].tolist())


def test_cell_columns_of_runs_equal_the_same_cells_held_as_arrays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows, width = 64, 300
    columns = {
        "batch_row": np.repeat(np.arange(rows), width),
        "pool_row": np.repeat(np.arange(rows) + 1, width),
        "position": np.tile(np.arange(width), rows),
        "slot": np.full(rows * width, 7),
    }
    runs = CellColumns(**columns, extra={"owner_position": np.zeros(rows * width, np.int64)})
    monkeypatch.setattr(RunColumn, "enabled", False)
    arrays = CellColumns(**columns, extra={"owner_position": np.zeros(rows * width, np.int64)})
    assert runs == arrays and hash(runs) == hash(arrays)
    other = {**columns, "slot": columns["slot"] + 1}  # the same runs, another slot
    monkeypatch.setattr(RunColumn, "enabled", True)
    assert runs != CellColumns(**other, extra={"owner_position": np.zeros(rows * width, np.int64)})
    assert runs.__record__() == arrays.__record__()
    mask = (columns["position"] % 7 == 0) | (columns["batch_row"] == 3)
    assert runs.take(mask) == arrays.take(mask)
    assert runs.distinct_count("batch_row") == rows and runs.bounds("position") == (0, width - 1)


#: Every format.
FORMATS = (OutputFormat.JSON, OutputFormat.TABLE, OutputFormat.MARKDOWN)


def _outputs(runs: list[Callable[[], Result]], formats: tuple[OutputFormat, ...]) -> list[str]:
    """Each result in each format, as drawn."""
    out = []
    for run in runs:
        result = run()
        for fmt in formats:
            view = render(result, fmt)
            if not isinstance(view, str):
                buffer = io.StringIO()
                Console(file=buffer, width=120, color_system=None).print(view)
                view = buffer.getvalue()
            out.append(view)
    return out


def _same_as_arrays(
    runs: list[Callable[[], Result]],
    monkeypatch: pytest.MonkeyPatch,
    formats: tuple[OutputFormat, ...] = FORMATS,
) -> None:
    """The outputs with every column of two cells or more held as runs, and with none: the
    same; and runs of both steps were held."""
    made: list[RunColumn] = []
    held_as_runs = RunColumn.held_as_runs.__func__  # type: ignore[attr-defined]

    def counted(cls: type[RunColumn], column: NarrowColumn) -> object:
        held = held_as_runs(cls, column)
        if isinstance(held, RunColumn):
            made.append(held)
        return held

    monkeypatch.setattr(RunColumn, "MIN_CELLS", 2)
    monkeypatch.setattr(RunColumn, "SAVING", 0)  # every column: runs of a cell or more
    monkeypatch.setattr(RunColumn, "held_as_runs", classmethod(counted))
    with_runs = _outputs(runs, formats)
    assert {run.step for run in made} == {0, 1}, "runs of both kinds were held"
    monkeypatch.setattr(RunColumn, "enabled", False)
    assert _outputs(runs, formats) == with_runs


@pytest.mark.parametrize(
    "name", ["canary-aliasing", "canary-stale-row", "radix-copy", "stale-tail"]
)
def test_outputs_are_the_same_with_columns_held_as_runs(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make_scenario(name, seed=3).save(tmp_path / f"{name}.safetensors")
    _same_as_arrays([lambda: api.check([path], kernel="vectorized")], monkeypatch)


def test_a_one_slot_dump_at_int16s_limit_is_the_same_with_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Positions 1 .. 32767 in every row, slot 7 in every cell: the findings' columns are a
    few runs each, counting up to int16's largest value (the table view, which draws each
    row's 32,768 cells, is the scenarios' to compare)."""
    path = one_slot_shrunk_dump(tmp_path / "limit.safetensors", rows=2, width=32768, slots=16)
    runs: list[Callable[[], Result]] = [
        lambda: api.check([path], kernel="none"),
        lambda: api.provenance(path, slot=7),
    ]
    _same_as_arrays(runs, monkeypatch, (OutputFormat.JSON, OutputFormat.MARKDOWN))


def test_a_one_slot_dumps_findings_hold_their_cells_as_runs(tmp_path: Path) -> None:
    """Every live cell holds slot 7: two findings of every cell but each row's first, whose
    columns are runs (a batch row's cells, its consecutive positions, one slot, one owner
    position): a few bytes a row, where the arrays held 7 to 9 bytes a cell."""
    from kvcanary_cli.results.check import DumpReport

    rows, width = 64, 600
    path = one_slot_shrunk_dump(tmp_path / "one-slot.safetensors", rows=rows, width=width)
    [dump] = api.check([path], kernel="none").dumps
    assert isinstance(dump, DumpReport)
    assert [f.count for f in dump.findings] == [rows * (width - 1)] * 2
    for finding in dump.findings:
        assert finding.cells is not None
        held = len(pickle.dumps(finding.cells))  # what a `check -j` worker hands back
        assert held < 64 * rows, f"{held} bytes for {finding.count} cells"


@pytest.mark.parametrize("runs", [True, False])
def test_live_cells_hold_their_rows_as_runs(
    runs: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row's live cells are one run of its batch row and pool row: held as runs (ten million
    cells of a few thousand rows: a few KB, not 40 MB), read back as the arrays they stand for
    (and as arrays with runs off)."""
    from kvcanary_cli.analysis import provenance as provenance_module
    from kvcanary_cli.analysis.provenance import live_cells
    from kvcanary_cli.dump.loader import load_dump

    monkeypatch.setattr(RunColumn, "enabled", runs)
    monkeypatch.setattr(provenance_module, "_RUNS_FROM", 4096)
    rows, width = 8, 1024  # past `_RUNS_FROM` and `RunColumn.MIN_CELLS`
    cells = live_cells(
        load_dump(one_slot_shrunk_dump(tmp_path / "d.safetensors", rows=rows, width=width))
    )
    for name in ("batch_row", "pool_row"):
        assert isinstance(cells.column(name), RunColumn) is runs
    assert len(cells) == rows * width
    assert cells.batch_row.tolist() == np.repeat(np.arange(rows), width).tolist()
    assert cells.pool_row.tolist() == np.repeat(np.arange(1, rows + 1), width).tolist()
    assert cells.held("pool_row").dtype == np.int8  # as held: narrow
    assert cells.position.tolist() == np.tile(np.arange(width), rows).tolist()
