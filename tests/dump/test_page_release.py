"""A whole-table scan hands the pages of a mapped table back as it goes: the same cells are
found, and the table's pages do not stay in the process's resident set (a 2 GB production
table would otherwise add 2 GB of RSS to every provenance query)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from kvcanary_cli.dump import loader
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.dump.tensor import DenseTensor
from kvcanary_cli.dump.writer import save_dump
from kvcanary_cli.synth.scenarios import make_scenario

ROWS, COLS = 512, 32768  # 64 MiB of int32: far above the noise of the resident set


def _resident_bytes(mapped: np.memmap) -> int:
    """Bytes of `mapped`'s file resident in this process (its mappings in /proc/self/smaps):
    the table's pages only, not the scan's own temporaries (which threads keep in their
    malloc arenas)."""
    name = str(Path(mapped.filename).resolve()) if mapped.filename else ""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:
            inside = len(fields) >= 6 and fields[5] == name  # a mapping's header line
        elif inside and fields[:1] == ["Rss:"]:
            total += int(fields[1]) * 1024
    return total


def _scan(table: np.ndarray, mapped: np.memmap | None, threads: int = 1) -> list[np.ndarray]:
    found = [[], [], []]  # type: list[list[np.ndarray]]
    for part in DenseTensor(table, mapping=mapped).find_cells(
        lambda v: v % 4099 == 7, chunk_cells=1 << 20, threads=threads
    ):
        for kept, array in zip(found, part, strict=True):
            kept.append(array)
    return [np.concatenate(arrays) for arrays in found]


@pytest.fixture
def mapped_table(tmp_path: Path) -> np.memmap:
    path = tmp_path / "table.bin"
    np.arange(ROWS * COLS, dtype=np.int32).reshape(ROWS, COLS).tofile(path)
    return np.memmap(path, dtype=np.int32, mode="c", offset=0, shape=(ROWS, COLS))


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs /proc (Linux)")
@pytest.mark.parametrize("threads", [1, 3])
def test_a_scan_releases_the_pages_it_read_and_finds_the_same_cells(
    mapped_table: np.memmap, threads: int
) -> None:
    """With several threads too: the same cells, in the same order, and the pages let go."""
    before = _resident_bytes(mapped_table)
    released = _scan(mapped_table, mapped_table, threads)
    grown_released = _resident_bytes(mapped_table) - before
    kept = _scan(mapped_table, None)  # the same scan, pages left mapped
    grown_kept = _resident_bytes(mapped_table) - before
    for a, b in zip(released, kept, strict=True):
        np.testing.assert_array_equal(a, b)
    assert released[0].size > 1000  # the scan found cells in every part of the table
    table_bytes = ROWS * COLS * 4
    assert grown_kept > table_bytes // 2, "without release the table's pages stay resident"
    assert grown_released < table_bytes // 4, f"{grown_released} bytes stayed resident"


@pytest.mark.slow
def test_released_pages_read_back_unchanged(mapped_table: np.memmap) -> None:
    _scan(mapped_table, mapped_table)
    expected = np.arange(ROWS * COLS, dtype=np.int32).reshape(ROWS, COLS)
    np.testing.assert_array_equal(np.asarray(mapped_table), expected)


def test_the_dump_names_its_mapped_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_scenario("canary-aliasing", size="tiny").save(tmp_path / "dump.safetensors")
    assert load_dump(path).mapped == {}  # a small dump: read, nothing to release
    monkeypatch.setattr(loader, "READ_LIMIT", 0)  # now every table is "big"
    dump = load_dump(path)
    table = dump.mapped["req_to_token"]
    assert isinstance(table, np.memmap)
    assert np.shares_memory(table, dump.req_to_token.array())


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs /proc (Linux)")
def test_a_loaded_big_table_hands_its_pages_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loader gives a mapped table's tensor its mapping: a scan through the dump (what
    provenance and the violation owners do) lets the pages go too."""
    path = save_dump(
        tmp_path / "big.safetensors",
        req_to_token=np.arange(ROWS * COLS, dtype=np.int32).reshape(ROWS, COLS),
        req_pool_indices=np.array([1]),
        prefix_lens=np.array([4]),
    )
    monkeypatch.setattr(loader, "READ_LIMIT", 0)  # a "big" table: mapped
    dump = load_dump(path)
    mapped = dump.mapped["req_to_token"]
    before = _resident_bytes(mapped)
    hits = sum(
        rows.size
        for rows, _, _ in dump.req_to_token.find_cells(lambda v: v % 4099 == 7, chunk_cells=1 << 20)
    )
    assert hits > 1000
    assert _resident_bytes(mapped) - before < ROWS * COLS * 4 // 4


def test_a_threaded_scan_stopped_early_leaves_no_work_behind(mapped_table: np.memmap) -> None:
    scan = DenseTensor(mapped_table).find_cells(
        lambda v: v % 4099 == 7, chunk_cells=1 << 16, threads=2
    )
    first = next(scan)
    scan.close()  # what a caller that found enough does
    assert first[0][0] == 0 and first[2][0] == 7
    assert not [t for t in threading.enumerate() if t.name.startswith("kvcanary-scan")]


def test_a_chunk_that_raises_raises_in_the_caller(mapped_table: np.memmap) -> None:
    def match(values: np.ndarray) -> np.ndarray:
        if int(values.reshape(-1)[0]) > ROWS * COLS // 2:
            raise ValueError("bad chunk")
        return np.asarray(values == 7)

    with pytest.raises(ValueError, match="bad chunk"):
        list(DenseTensor(mapped_table).find_cells(match, chunk_cells=1 << 18, threads=2))
