"""Cell columns held narrow (`results.cells.NarrowColumn`: live cells, finding groups) read
back bit for bit, and change no result: every command's output is the same byte for byte with
every column held as given (int64), on the synth corpus and at the narrow dtypes' limits."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvcanary_cli.cli import app
from kvcanary_cli.results.cells import CellColumns, NarrowColumn
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.synth.scenarios import SCENARIOS, make_scenario
from tests.helpers import one_slot_shrunk_dump
from tests.lanes import DEEP

LIMITS = [
    ([-128, 127], np.int8),
    ([-129, 0], np.int16),
    ([0, 128], np.int16),
    ([-32768, 32767], np.int16),
    ([0, 32768], np.int32),
    ([-(2**31), 2**31 - 1], np.int32),
    ([0, 2**31], np.int64),
    ([-(2**63), 2**63 - 1], np.int64),
]


@pytest.mark.parametrize(("values", "held"), LIMITS)
def test_a_column_is_held_in_the_narrowest_dtype_and_read_back_as_given(
    values: list[int], held: type
) -> None:
    given = np.array(values, dtype=np.int64)
    column = NarrowColumn.of(given)
    assert column.values.dtype == held
    wide = column.wide()
    assert wide.dtype == np.int64 and wide.tolist() == values


def test_other_dtypes_read_back_as_given() -> None:
    for given in (
        np.array([1, 2**63 + 5], dtype=np.uint64),  # no signed dtype holds it: kept as given
        np.array([3, 200], dtype=np.uint8),  # as narrow as it gets
        np.array([True, False]),
        np.zeros(0, dtype=np.int64),
    ):
        column = NarrowColumn.of(given)
        assert column.wide().dtype == given.dtype
        assert column.wide().tolist() == given.tolist()


def _columns() -> CellColumns:
    return CellColumns(
        batch_row=np.array([0, 1, 2]),
        pool_row=np.array([1, 2, 3]),
        position=np.array([0, 32767, 5]),
        slot=np.array([-1, 127, 128]),
        extra={"owner_position": np.array([0, 0, 2**40])},
    )


def test_cell_columns_read_as_given_and_equal_columns_held_wide(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cells = _columns()
    held = cells.column("position")
    assert held is not None and held.dtype == np.int16
    assert cells.position.dtype == np.int64 and cells.position.tolist() == [0, 32767, 5]
    assert cells.extra["owner_position"].tolist() == [0, 0, 2**40]
    monkeypatch.setattr(NarrowColumn, "enabled", False)
    wide = _columns()
    held = wide.column("position")
    assert held is not None and held.dtype == np.int64
    assert cells == wide and hash(cells) == hash(wide)
    taken = cells.take(np.array([2, 0])).slot
    assert taken is not None and taken.tolist() == [128, -1]
    assert cells.without_slot().slot is None and cells.distinct_count("slot") == 3
    # a `check -j` worker hands its findings back pickled
    back = pickle.loads(pickle.dumps(cells))
    assert back == cells and back.position.dtype == np.int64


def _outputs(paths: list[tuple[str, list[str]]], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setattr("kvcanary_cli.api.installed_version", lambda: None)
    out = []
    for command, args in paths:
        for fmt in ("json", "table"):
            result = CliRunner().invoke(app, [command, *args, "--format", fmt])
            assert result.exit_code in (0, 1), result.stderr
            out.append(result.stdout)
    return out


def _same_held_wide(runs: list[tuple[str, list[str]]], monkeypatch: pytest.MonkeyPatch) -> None:
    narrow = _outputs(runs, monkeypatch)
    monkeypatch.setattr(NarrowColumn, "enabled", False)
    wide = _outputs(runs, monkeypatch)
    assert narrow == wide


def _scenario_runs(name: str, tmp_path: Path) -> list[tuple[str, list[str]]]:
    path = str(make_scenario(name, seed=3).save(tmp_path / f"{name}.safetensors"))
    from kvcanary_cli import api

    report = api.check([path], kernel="vectorized")
    assert isinstance(report, CheckReport)
    runs = [("check", [path, "--kernel", "vectorized"])]
    slots = sorted({f.slot for f in report.dumps[0].findings if f.slot is not None})
    runs += [("provenance", [path, "--slot", str(s)]) for s in slots[:2]]
    return runs


#: Scenarios whose findings hold many cells of several codes (aliasing, repeats, stale rows,
#: SWA collisions, writes, canary replays): the fast lane's share of the corpus.
FAST = (
    "cross-request-aliasing",
    "canary-aliasing",
    "canary-stale-row",
    "duplicate-slot-in-row",
    "radix-copy",
    "stale-tail",
    "swa-slot-collision",
    "write-into-live-slot",
)


@pytest.mark.parametrize("name", FAST)
def test_outputs_are_the_same_with_every_column_held_wide(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _same_held_wide(_scenario_runs(name, tmp_path), monkeypatch)


# the whole corpus (a check and two provenance queries each, twice): the deep lane
@pytest.mark.parametrize("name", [pytest.param(n, marks=DEEP) for n in SCENARIOS if n not in FAST])
def test_the_whole_corpus_is_the_same_with_every_column_held_wide(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _same_held_wide(_scenario_runs(name, tmp_path), monkeypatch)


@pytest.mark.parametrize("slot", [127, 128])
@pytest.mark.slow
def test_values_at_the_narrow_limits_change_no_output(
    slot: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Positions up to 32767 (int16's largest: `position + 1` would wrap there), slots at
    int8's largest and just past it: the aliasing detectors and the views see what int64
    columns give them."""
    path = str(
        one_slot_shrunk_dump(
            tmp_path / "limits.safetensors", rows=2, width=32768, slot=slot, slots=256
        )
    )
    runs = [
        ("check", [path, "--kernel", "vectorized"]),
        ("provenance", [path, "--slot", str(slot)]),
    ]
    _same_held_wide(runs, monkeypatch)
