"""Shrunk dumps of production-wide pools: memory follows what is asked for and found (a quiet
check holds no record per cell; the kernels' staging of a wide row holds no int64 copy of
it), measured as a child's peak (`tests.child_memory`), never as a wall time."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcanary_cli import api
from kvcanary_cli.render import render
from kvcanary_cli.render.console import OutputFormat
from kvcanary_cli.results.cells import CellColumns
from kvcanary_cli.results.check import DumpReport
from tests.child_memory import peak_rss_of
from tests.helpers import stale_rows_dump, wide_dump

#: a check of a small shrunk dump with the Triton kernels imported and a 67 MB staged table
#: (128 rows x 131,076 cells, int32): 340 MB; 1 GB when each staged cell had int64 copies.
WIDE_CHECK_RSS = 560 << 20


def test_a_quiet_check_builds_no_record_per_finding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = api.check([stale_rows_dump(tmp_path / "rows.safetensors", 500)])
    assert report.failed

    def refuse(*_: object) -> None:
        raise AssertionError("a quiet check turned a finding's cells into a record")

    monkeypatch.setattr(CellColumns, "__record__", refuse)
    lines = render(report, OutputFormat.TABLE, quiet=True)
    assert isinstance(lines, str)
    assert lines.startswith("ERRORS: ") and "2000 error cells" in lines
    with pytest.raises(AssertionError, match="quiet check"):  # the full views do build it
        render(report, OutputFormat.JSON)


@pytest.fixture(scope="module")
def wide_small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("wide")
    source = wide_dump(directory / "wide.safetensors")
    small = directory / "wide.small.safetensors"
    api.shrink(source, small)
    source.unlink()
    return small


@pytest.mark.slow  # whole processes, measured in memory
def test_a_wide_shrunk_dump_checks_in_bounded_memory(wide_small: Path) -> None:
    code, peak = peak_rss_of("check", str(wide_small), "--quiet")
    assert code == 0
    assert peak < WIDE_CHECK_RSS


def _story(report: DumpReport) -> tuple[str, list[tuple[object, ...]], list[str]]:
    findings = sorted(
        (f.code.value, f.group, f.slot, f.batch_row, f.pool_row, f.position, f.count)
        for f in report.findings
    )
    return (
        "clean" if not report.findings else "findings",
        [tuple(-1 if v is None else v for v in f) for f in findings],
        [c.code.value for c in report.diagnosis],
    )


@pytest.mark.parametrize("scenario", ["clean-swa", "truncated-lut"])
def test_a_shrunk_batch_of_every_row_checks_like_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: str
) -> None:
    # A clean 2049 x 131,076 pool whose 2048 batch rows are all live: its shrunk dump asked
    # the Triton kernels to stage 268,574,724 cells dense, past the 2^28 kvcanary stages, and
    # `check` (shrink's next step) said BAD INPUT. Here the limit is lowered to the rows of a
    # tiny dump: the check plans the kernel with their numpy model and finds what the
    # original does, saying so in a note.
    from kvcanary_cli.planners import staging
    from kvcanary_cli.synth.scenarios import make_scenario

    source = make_scenario(scenario, seed=0).save(tmp_path / "source.safetensors")
    small = tmp_path / "small.safetensors"
    api.shrink(source, small)
    monkeypatch.setattr(staging, "MAX_STAGED_CELLS", 10)
    [original] = api.check([source]).dumps
    [shrunk] = api.check([small]).dumps
    assert isinstance(original, DumpReport) and isinstance(shrunk, DumpReport)
    assert shrunk.error is None
    assert _story(shrunk) == _story(original)
    assert any("kernel plan is the vectorized-gpu model of the triton" in n for n in shrunk.notes)
    assert not any("model of the triton" in n for n in original.notes)
    assert [g.kernel for g in shrunk.groups] == [g.kernel for g in original.groups]


def test_a_clean_production_wide_shrunk_pool_checks_clean(tmp_path: Path) -> None:
    # The shape of the report: 2049 x 131,076, all 2048 batch rows live, only their cells
    # stored (a 100 KB file); the default kernel is Triton's.
    from tests.helpers import wide_shrunk_dump

    [dump] = api.check([wide_shrunk_dump(tmp_path / "wide.safetensors")]).dumps
    assert isinstance(dump, DumpReport)
    assert dump.error is None and not dump.findings
    assert {g.group for g in dump.groups} == {"full"} and dump.groups[0].kernel == "triton"
    assert any("vectorized-gpu model of the triton kernels" in n for n in dump.notes)


#: `provenance --slot 7` of a shrunk table whose 1024 live rows hold slot 7 in all 1200 cells
#: (1.2 M cells, two findings of every one): 108 MiB; 162 MiB when the duplicate count, the
#: plan's entries and the live cells made table-long int64 temporaries (a million entries a
#: chunk, pieces joined into a second copy); 180-187 MiB when the findings' columns
#: were held as arrays, not runs; 290 MiB when the live cells, the findings' cells and the
#: reference plan's verify entries were held as int64 columns (590 MiB when the table view
#: built every cell as Python ints).
ONE_SLOT_RSS = 150 << 20
#: `check` of the same dump: 176 MiB; 182 MiB when the findings' cells were gathered from
#: the live cells' rows decoded whole and the copied-prefix grouping sorted a million cells at
#: a time; 187 MiB before that; 235-240 MiB when the duplicate count, the diagnosis and
#: the request summaries indexed every cell at once and the plans took a million entries a
#: chunk (250 MiB with the findings' columns held as arrays, 270 MiB under load; 300 MiB
#: with both plans' entries held as int64); 410 MiB with the
#: columns held as int64 and the reference plans kept through the diagnosis.
ONE_SLOT_CHECK_RSS = 230 << 20


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.helpers import one_slot_shrunk_dump

    path = tmp_path_factory.mktemp("one-slot") / "one-slot.safetensors"
    return one_slot_shrunk_dump(path, rows=1024, width=1200)


@pytest.mark.slow  # a whole process, measured in memory
def test_provenance_of_a_slot_every_cell_holds_is_bounded(one_slot: Path) -> None:
    code, peak = peak_rss_of("provenance", str(one_slot), "--slot", "7")
    assert code == 0
    assert peak < ONE_SLOT_RSS, f"{peak >> 20} MiB"


@pytest.mark.slow  # a whole process, measured in memory
def test_check_of_a_slot_every_cell_holds_is_bounded(one_slot: Path) -> None:
    code, peak = peak_rss_of("check", str(one_slot))
    assert code == 1
    assert peak < ONE_SLOT_CHECK_RSS, f"{peak >> 20} MiB"


#: `check` (its table view, the Triton kernels planning beside the detectors) of a one-slot
#: dump of 2048 rows x 1600 cells (3.3 M live cells, two findings of every one): 205-208 MiB,
#: its peak in the diagnosis; 208-209 MiB when the detectors decoded the live cells' pool
#: rows whole and sorted the alias search's key of every cell;
#: 222 MiB when the findings' cells were gathered from the live cells' rows decoded whole and
#: the copied-prefix grouping sorted a million cells at a time; 232 MiB before that;
#: 271-274 MiB with the temporaries above made of every cell at once;
#: 311-327 MiB (336-362 under load) with the findings' columns held as arrays, not runs, and
#: the duplicate-in-row search sorting every cell at once; 515 MiB when both plans held their
#: entries as int64 columns (33 bytes an entry), live cells were gathered whole as int64 before
#: they were narrowed, the stale-row diagnosis sorted every symptom cell with a lexsort and the
#: provenance scan made every kept cell's flat index.
ONE_SLOT_WIDE_CHECK_RSS = 260 << 20


@pytest.fixture(scope="module")
def one_slot_wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.helpers import one_slot_shrunk_dump

    path = tmp_path_factory.mktemp("one-slot-wide") / "one-slot.safetensors"
    return one_slot_shrunk_dump(path, rows=2048, width=1600)


@pytest.mark.slow
@pytest.mark.deep  # a whole process, measured in memory (4 s)
def test_check_table_of_a_slot_every_cell_holds_grows_with_its_cells_once(
    one_slot_wide: Path,
) -> None:
    """The deep lane's: the suite asks the same of `check` at 1024 x 1200 and at the hostile
    dump's size."""
    code, peak = peak_rss_of("check", str(one_slot_wide))
    assert code == 1
    assert peak < ONE_SLOT_WIDE_CHECK_RSS, f"{peak >> 20} MiB"


#: `check` (its table view) of the hostile one-slot dump itself (4096 rows x 2400 cells, 9.8 M
#: live cells, two findings of every one; `bench/hostile.py`): 271 MiB, the same in every
#: run; 319-326 MiB when the alias search sorted a key of every cell, the slot detectors and
#: each finding made decoded the live cells' pool rows whole, a finding's columns were
#: gathered whole before their runs were found and the Triton kernels' entries came back on
#: top of the detectors (docs/performance.md).
HOSTILE_CHECK_RSS = 310 << 20


@pytest.mark.slow  # a whole process, measured in memory (15 s; a minute on a loaded machine)
def test_check_of_the_hostile_one_slot_dump_is_bounded(tmp_path: Path) -> None:
    from tests.helpers import one_slot_shrunk_dump

    path = one_slot_shrunk_dump(tmp_path / "one-slot.safetensors")
    code, peak = peak_rss_of("check", str(path))
    assert code == 1
    assert peak < HOSTILE_CHECK_RSS, f"{peak >> 20} MiB"
