"""The loading layer on hostile and unstable files (issue 11): a header parse bounded in
memory, shapes that claim more than the file, duplicate keys, over-long numbers, and a file
truncated while kvcanary reads it -- each one error line (exit 2), never a crash or signal.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcanary_cli import api
from kvcanary_cli.dump import loader
from kvcanary_cli.dump.header import (
    MAX_HEADER_BYTES,
    MAX_HEADER_VALUES,
    MAX_METADATA_KEYS,
    MAX_TENSORS,
    SafetensorsHeader,
    read_header,
)
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.dump.schema import MAX_INTEGER_DIGITS, parse_integer
from kvcanary_cli.errors import CorruptDumpError, FileChangedError, MetadataError
from kvcanary_cli.results.provenance import ProvenanceReport
from kvcanary_cli.synth.scenarios import make_scenario
from tests.dump.test_malformed import inspect_bad_input

ROOT = Path(__file__).resolve().parents[2]


def _frame(header: bytes, data: bytes = b"") -> bytes:
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


def _batch_header(extra: str = "", metadata: str = "") -> bytes:
    """A valid minimal batch (bs 1, an empty 1 x 0 table) plus `extra` JSON entries."""
    entries = [
        '"req_to_token":{"dtype":"I32","shape":[1,0],"data_offsets":[0,0]}',
        '"req_pool_indices":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}',
        '"prefix_lens":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}',
    ]
    if metadata:
        entries.insert(0, f'"__metadata__":{{{metadata}}}')
    if extra:
        entries.append(extra)
    return ("{" + ",".join(entries) + "}").encode()


def _write(path: Path, header: bytes) -> Path:
    path.write_bytes(_frame(header, b"\0" * 16))
    return path


def _peak_while_loading(path: Path) -> int:
    try:  # warm the imports, so only the parse is measured
        load_dump(path)
    except CorruptDumpError:
        pass
    tracemalloc.start()
    try:
        with pytest.raises(CorruptDumpError):
            load_dump(path)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- a header parse bounded in memory -----------------------------------------------------


def _many_tensors(count: int) -> bytes:
    return _batch_header(
        ",".join(f'"x{i}":{{"dtype":"I64","shape":[0],"data_offsets":[0,0]}}' for i in range(count))
    )


def _many_metadata(count: int) -> bytes:
    return _batch_header(metadata=",".join(f'"k{i}":"{i}"' for i in range(count)))


@pytest.mark.parametrize(
    ("build", "needles"),
    [
        (lambda: _many_tensors(70_000), ("more than", "JSON values", f"{MAX_TENSORS} tensors")),
        (lambda: _many_metadata(70_000), ("JSON values", f"{MAX_METADATA_KEYS} metadata keys")),
        (lambda: _many_tensors(250_000), ("JSON values",)),
    ],
    ids=["70k-tensors", "70k-metadata-keys", "250k-tensors"],
)
@pytest.mark.slow
def test_a_crowded_header_is_refused_before_it_is_parsed(
    build: Callable[[], bytes], needles: tuple[str, ...], tmp_path: Path
) -> None:
    path = _write(tmp_path / "d.safetensors", build())
    line = inspect_bad_input(path)
    for needle in needles:
        assert needle in line, line
    # Parsing it whole would build about 100 bytes of objects per byte of header.
    peak = _peak_while_loading(path)
    assert peak < 4 * path.stat().st_size + (1 << 20), (peak, path.stat().st_size)


@pytest.mark.parametrize(
    ("build", "needles"),
    [
        (lambda: _many_tensors(MAX_TENSORS + 1), (f"{MAX_TENSORS + 4} tensors", "at most")),
        (lambda: _many_metadata(MAX_METADATA_KEYS + 1), (f"{MAX_METADATA_KEYS + 1} keys",)),
        (lambda: _many_metadata(MAX_HEADER_VALUES // 2 - 8), ("keys", "at most")),
    ],
    ids=["one-tensor-too-many", "one-key-too-many", "just-under-the-value-count"],
)
def test_past_the_caps_a_header_is_refused_in_bounded_memory(
    build: Callable[[], bytes], needles: tuple[str, ...], tmp_path: Path
) -> None:
    path = _write(tmp_path / "d.safetensors", build())
    line = inspect_bad_input(path)
    for needle in needles:
        assert needle in line, line
    # Parsed, because its values are few enough: what that builds is bounded by their count.
    assert _peak_while_loading(path) < 32 << 20


def test_the_caps_leave_room_for_a_dump(tmp_path: Path) -> None:
    # Up to the caps a header is read: 4093 extra tensors, 4096 metadata keys.
    header = _many_tensors(MAX_TENSORS - 3)
    path = _write(tmp_path / "d.safetensors", header)
    dump = load_dump(path)
    assert len(dump.tensors) == MAX_TENSORS
    path = _write(tmp_path / "m.safetensors", _many_metadata(MAX_METADATA_KEYS))
    assert len(load_dump(path).metadata) == MAX_METADATA_KEYS


def test_a_header_above_the_cap_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "d.safetensors"
    path.write_bytes(struct.pack("<Q", MAX_HEADER_BYTES + 8) + b"{" + b" " * (MAX_HEADER_BYTES + 7))
    line = inspect_bad_input(path)
    assert f"header length {MAX_HEADER_BYTES + 8}" in line and "absurd" in line


def test_long_strings_do_not_count_as_values(tmp_path: Path) -> None:
    # A long metadata value full of separators is one value, not a million.
    note = "a,b:c[d{" * 200_000
    path = _write(tmp_path / "d.safetensors", _batch_header(metadata=f'"note":"{note}"'))
    assert load_dump(path).metadata["note"] == note


@pytest.mark.parametrize(
    ("header", "name"),
    [
        (
            _batch_header('"prefix_lens":{"dtype":"I32","shape":[2],"data_offsets":[8,16]}'),
            "prefix_lens",
        ),
        (_batch_header(metadata='"page_size":"1","page_size":"4"'), "page_size"),
        (
            _batch_header().replace(b'"dtype":"I64"', b'"dtype":"I64","dtype":"F32"', 1),
            "dtype",
        ),
    ],
    ids=["tensor", "metadata-key", "entry-field"],
)
def test_duplicate_keys_are_refused(header: bytes, name: str, tmp_path: Path) -> None:
    # json keeps the last copy, safetensors' parser may keep another: readers would disagree.
    line = inspect_bad_input(_write(tmp_path / "d.safetensors", header))
    assert f"names {name} twice" in line, line


# --- shapes that claim rows without bytes -----------------------------------------------


@pytest.mark.parametrize("shape", [[2**50, 0], [0, 2**50], [2**31, 0]])
def test_an_empty_table_claiming_huge_dimensions_loads_in_bounded_memory(
    shape: list[int], tmp_path: Path
) -> None:
    # [2^50, 0] is 96 bytes of file: loading it must neither allocate nor walk its rows (the
    # analysis does not scan rows without bytes either: tests/analysis/test_hostile_values.py).
    header = _batch_header().replace(b'"shape":[1,0]', b'"shape":' + json.dumps(shape).encode())
    path = _write(tmp_path / "d.safetensors", header)
    load_dump(path)  # warm
    tracemalloc.start()
    try:
        dump = load_dump(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert list(dump.req_to_token.shape) == shape
    assert peak < 1 << 20, peak


def test_an_empty_table_is_analysed(tmp_path: Path) -> None:
    header = _batch_header().replace(b'"shape":[1,0]', b'"shape":[4,0]')
    path = _write(tmp_path / "d.safetensors", header)
    assert tuple(load_dump(path).req_to_token.shape) == (4, 0)
    report = api.check(path, kernel="vectorized")
    assert report.dumps[0].error is None
    answer = api.provenance(path, slot=1)
    assert isinstance(answer, ProvenanceReport) and answer.slot is not None and not answer.findings


# --- numbers too long to be numbers -------------------------------------------------------


def test_parse_integer_refuses_overlong_digit_strings() -> None:
    assert parse_integer("9" * MAX_INTEGER_DIGITS) == int("9" * MAX_INTEGER_DIGITS)
    assert parse_integer("-" + "9" * MAX_INTEGER_DIGITS) is not None
    assert parse_integer("9" * (MAX_INTEGER_DIGITS + 1)) is None
    assert parse_integer("9" * 20_000) is None  # int() would raise past 4300 digits


@pytest.mark.parametrize("digits", [MAX_INTEGER_DIGITS + 1, 5000, 1_000_000])
def test_an_overlong_scalar_is_one_short_error_line(digits: int, tmp_path: Path) -> None:
    path = _write(
        tmp_path / "d.safetensors", _batch_header(metadata=f'"page_size":"{"9" * digits}"')
    )
    with pytest.raises(MetadataError):
        load_dump(path)
    line = inspect_bad_input(path)
    assert "page_size" in line and "not an integer" in line and f"{digits} characters" in line
    assert len(line) < 400, len(line)


# --- a file truncated while it is read ----------------------------------------------------


@pytest.fixture
def clean_dump(tmp_path: Path) -> Path:
    return make_scenario("canary-aliasing", size="tiny").save(tmp_path / "dump.safetensors")


def _truncate_before_tensors(monkeypatch: pytest.MonkeyPatch, path: Path, size: int) -> None:
    """Shrink the file to `size` bytes once its header is read and checked, just before the
    loader reads the tensors (as another process rewriting the dump in place would)."""
    real = loader._read_contents

    def truncate_then_read(header: SafetensorsHeader, *args: Any) -> loader.KvDump:
        os.truncate(path, size)
        return real(header, *args)

    monkeypatch.setattr(loader, "_read_contents", truncate_then_read)


@pytest.mark.parametrize("keep", [0, 100, -1])
def test_a_dump_truncated_during_the_load_is_one_error(
    keep: int, clean_dump: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = clean_dump.stat().st_size
    _truncate_before_tensors(monkeypatch, clean_dump, keep % size)
    with pytest.raises(CorruptDumpError) as caught:
        load_dump(clean_dump)
    assert "truncated while kvcanary read it" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_dump_replaced_between_header_and_tensors_is_one_error(
    clean_dump: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tensors are read from the file whose header was parsed, or not at all."""
    other = make_scenario("clean-swa", size="tiny").save(tmp_path / "other.safetensors")
    real = read_header

    def read_then_replace(path: Any) -> SafetensorsHeader:
        header = real(path)
        os.replace(other, clean_dump)  # a server's atomic save of its next dump
        return header

    monkeypatch.setattr("kvcanary_cli.dump.loader.read_header", read_then_replace)
    with pytest.raises(CorruptDumpError, match="another file took its place"):
        load_dump(clean_dump)


@pytest.mark.parametrize("how", ["replaced", "rewritten in place"])
def test_a_dump_changed_since_its_given_header_is_one_error(
    clean_dump: Path, tmp_path: Path, how: str
) -> None:
    """A header read earlier in the run (`timeline` orders dumps by theirs) is not read again:
    the file loaded by it must be the one it came from, unchanged. Unchanged, the dump loads
    by that very header (the clean twin)."""
    header = read_header(clean_dump)
    dump = load_dump(clean_dump, header=header)
    assert dump.header is header and dump.file_state == header.state
    other = make_scenario("clean-swa", size="tiny").save(tmp_path / "other.safetensors")
    if how == "replaced":
        os.replace(other, clean_dump)
    else:
        clean_dump.write_bytes(other.read_bytes())
    with pytest.raises(FileChangedError, match="changed since its header was read") as caught:
        load_dump(clean_dump, header=header)
    assert str(clean_dump) in str(caught.value) and "\n" not in str(caught.value)
    assert load_dump(clean_dump).header.state != header.state  # read afresh, it loads


def test_only_big_tables_are_mapped(clean_dump: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    header = read_header(clean_dump)
    with clean_dump.open("rb") as handle:
        for name in header.entries:  # a small dump: everything read, nothing mapped
            assert not isinstance(loader._read_array(handle, header.entries[name]), np.memmap)
        monkeypatch.setattr(loader, "READ_LIMIT", 0)  # now every table is "big"
        mapped = {
            name
            for name, entry in header.entries.items()
            if isinstance(loader._read_array(handle, entry), np.memmap)
        }
    tables = {"req_to_token", "req_to_verify_expected_tokens"}
    assert mapped == tables | {n for n in header.entries if n.startswith("canary.")}


def test_a_big_table_is_mapped_only_while_the_file_holds_it(
    clean_dump: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loader, "READ_LIMIT", 0)
    table = read_header(clean_dump).entries["req_to_token"]
    _truncate_before_tensors(monkeypatch, clean_dump, table.offset + 1)
    with pytest.raises(CorruptDumpError) as caught:
        load_dump(clean_dump)
    assert caught.value.field == "req_to_token" and "truncated while" in str(caught.value)


_SHRINK_AFTER_LOAD = textwrap.dedent(
    """
    import os, sys
    from kvcanary_cli.analysis.check import run_check
    from kvcanary_cli.analysis.query import row_map, slot_query
    from kvcanary_cli.analysis.violations.collect import violations_report
    from kvcanary_cli.dump.loader import load_dump
    from kvcanary_cli.planners.vectorized import VectorizedPlanner
    from kvcanary_cli.planners.base import Semantics

    path = sys.argv[1]
    dump = load_dump(path)
    os.truncate(path, 0)  # another process rewrites the dump in place
    gpu = VectorizedPlanner(semantics=Semantics.GPU)
    report = run_check(dump, planner=VectorizedPlanner(), kernel=gpu)
    slot = int(dump.req_to_token.rows(dump.req_pool_indices[:1])[0][0, 0])
    slot_query(dump, report.findings, slot, space="full", group=None, max_cells=64)
    row_map(dump, report, int(dump.req_pool_indices[0]), group=None, positions=None, max_cells=64)
    print(len(report.findings), "findings")
    """
)


def test_a_dump_truncated_after_the_load_cannot_kill_the_process(clean_dump: Path) -> None:
    # A mapped page the file no longer has is SIGBUS; a read tensor is the process's own.
    # In a subprocess: a signal here would take pytest down with it.
    done = subprocess.run(
        [sys.executable, "-c", _SHRINK_AFTER_LOAD, str(clean_dump)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode < 0:
        pytest.fail(f"killed by {signal.Signals(-done.returncode).name}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert clean_dump.stat().st_size == 0
    assert "findings" in done.stdout
