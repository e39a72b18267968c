"""Malformed dumps: each one is bad input -- one `error:` line on stderr, exit 2, no traceback.

Every case builds its file in tmp_path (raw bytes and hand-written headers for broken files,
`safetensors.numpy.save_file` for well-formed files the format rejects), then runs
`kvcanary inspect FILE` in-process and calls `load_dump` directly on the same file.
"""

from __future__ import annotations

import json
import random
import struct
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from typer.testing import CliRunner

from kvcanary_cli.cli import app
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.errors import (
    CorruptDumpError,
    DumpError,
    KvcanaryError,
    MetadataError,
    MissingTensorError,
    TensorDtypeError,
    TensorShapeError,
)

BS = 3


# --- builders ---------------------------------------------------------------------------------


def raw_file(
    path: Path, header: bytes | object, data: bytes = b"", *, length: int | None = None
) -> Path:
    """A file laid out like safetensors: u64 little-endian header length, header, data."""
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    size = len(blob) if length is None else length
    path.write_bytes(struct.pack("<Q", size) + blob + data)
    return path


def good_tensors() -> dict[str, np.ndarray]:
    """A minimal valid batch of BS rows (padding row included)."""
    return {
        "req_to_token": np.arange(4 * 8, dtype=np.int32).reshape(4, 8),
        "req_pool_indices": np.array([1, 2, 0], dtype=np.int64),
        "prefix_lens": np.array([3, 0, 0], dtype=np.int64),
        "extend_seq_lens": np.array([1, 2, 0], dtype=np.int64),
    }


def st_file(
    path: Path,
    metadata: dict[str, str] | None = None,
    drop: tuple[str, ...] = (),
    **changes: np.ndarray,
) -> Path:
    """A well-formed safetensors file: the good batch, minus `drop`, with `changes` applied."""
    tensors = {k: v for k, v in good_tensors().items() if k not in drop}
    tensors.update(changes)
    save_file(tensors, str(path), metadata=metadata)
    return path


def one_tensor_header(name: str = "prefix_lens", **fields: object) -> dict[str, object]:
    entry: dict[str, object] = {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}
    entry.update(fields)
    return {name: entry}


@dataclass(frozen=True)
class Case:
    """One malformed dump: how to build it, the error class, and words the line must carry."""

    build: Callable[[Path], Path]
    error: type[KvcanaryError]
    needles: tuple[str, ...]


def _missing(tmp: Path) -> Path:
    return tmp / "no-such-dump.safetensors"


def _directory(tmp: Path) -> Path:
    (tmp / "dumpdir").mkdir()
    return tmp / "dumpdir"


def _empty(tmp: Path) -> Path:
    (tmp / "d").write_bytes(b"")
    return tmp / "d"


def _five_bytes(tmp: Path) -> Path:
    (tmp / "d").write_bytes(b"\x01\x02\x03\x04\x05")
    return tmp / "d"


def _text(tmp: Path) -> Path:
    (tmp / "d").write_text("this is a README, not a safetensors dump\n" * 20)
    return tmp / "d"


def _no_header(tmp: Path) -> Path:
    # its first 8 bytes read as a header length inside the cap, yet past the end of the file
    (tmp / "d").write_bytes(b"ab\0\0\0\0\0\0 and some more text\n")
    return tmp / "d"


def _random_bytes(tmp: Path) -> Path:
    (tmp / "d").write_bytes(random.Random(0).randbytes(4096))
    return tmp / "d"


def _header_absurd(tmp: Path) -> Path:
    return raw_file(tmp / "d", b"{}", length=2**60)


def _header_past_eof(tmp: Path) -> Path:
    return raw_file(tmp / "d", b'{"a": 1}', length=1000)


def _header_not_json(tmp: Path) -> Path:
    return raw_file(tmp / "d", b"this is not json at all!")


def _header_not_utf8(tmp: Path) -> Path:
    return raw_file(tmp / "d", random.Random(1).randbytes(64))


def _header_deeply_nested(tmp: Path) -> Path:
    return raw_file(tmp / "d", b"[" * 10_000 + b"]" * 10_000)


def _header_too_many_values(tmp: Path) -> Path:
    return raw_file(tmp / "d", b"[" * 100_000 + b"]" * 100_000)


def _header_huge_number(tmp: Path) -> Path:
    blob = b'{"x": {"dtype": "I64", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 8]}}'
    return raw_file(tmp / "d", blob, b"\0" * 8)


def _header_not_object(tmp: Path) -> Path:
    return raw_file(tmp / "d", b"[1, 2, 3]")


def _metadata_not_strings(tmp: Path) -> Path:
    header = {**one_tensor_header(), "__metadata__": {"page_size": 4}}
    return raw_file(tmp / "d", header, b"\0" * 8)


def _entry_not_object(tmp: Path) -> Path:
    return raw_file(tmp / "d", {"prefix_lens": [1, 2]}, b"\0" * 8)


def _offsets_outside(tmp: Path) -> Path:
    return raw_file(tmp / "d", one_tensor_header(data_offsets=[0, 800]), b"\0" * 8)


def _truncated_data(tmp: Path) -> Path:
    path = st_file(tmp / "d")
    blob = path.read_bytes()
    path.write_bytes(blob[:-5])
    return path


def _offsets_malformed(tmp: Path) -> Path:
    return raw_file(tmp / "d", one_tensor_header(data_offsets=[0]), b"\0" * 8)


def _nbytes_mismatch(tmp: Path) -> Path:
    return raw_file(tmp / "d", one_tensor_header(shape=[3], data_offsets=[0, 16]), b"\0" * 16)


def _shape_overflow(tmp: Path) -> Path:
    return raw_file(tmp / "d", one_tensor_header(shape=[2**40, 2**40]), b"\0" * 8)


def _shape_dim_beyond_int64(tmp: Path) -> Path:
    return raw_file(tmp / "d", one_tensor_header(shape=[0, 2**70], data_offsets=[0, 0]))


def _shape_too_many_dims(tmp: Path) -> Path:
    return raw_file(tmp / "d", one_tensor_header(shape=[2**62] * 1000), b"\0" * 8)


def _negative_dim(tmp: Path) -> Path:
    return raw_file(tmp / "d", one_tensor_header(shape=[-1]), b"\0" * 8)


def _shape_not_ints(tmp: Path) -> Path:
    return raw_file(tmp / "d", one_tensor_header(shape=[1.0]), b"\0" * 8)


def _unknown_dtype(tmp: Path) -> Path:
    return raw_file(tmp / "d", one_tensor_header(dtype="Q7"), b"\0" * 8)


def _name_with_newline(tmp: Path) -> Path:
    return raw_file(tmp / "d", one_tensor_header("evil\nname", dtype="Q7"), b"\0" * 8)


def _rust_refuses(tmp: Path) -> Path:
    # Our bounds hold, but the data is not fully covered: safetensors itself refuses it.
    return raw_file(tmp / "d", one_tensor_header(), b"\0" * 16)


def _missing_tensor(name: str) -> Callable[[Path], Path]:
    return lambda tmp: st_file(tmp / "d", drop=(name,))


def _changed(
    metadata: dict[str, str] | None = None, drop: tuple[str, ...] = (), **changes: np.ndarray
) -> Callable[[Path], Path]:
    return lambda tmp: st_file(tmp / "d", metadata, drop, **changes)


_I64 = np.int64
_LUT = np.arange(10, dtype=_I64)
_POOL = np.zeros((4, 8), dtype=np.int32)

CASES: dict[str, Case] = {
    # The file itself.
    "missing-path": Case(_missing, DumpError, ("no-such-dump.safetensors", "no such file")),
    "directory": Case(_directory, DumpError, ("dumpdir", "is a directory")),
    "empty-file": Case(_empty, CorruptDumpError, ("file is empty",)),
    "five-bytes": Case(_five_bytes, CorruptDumpError, ("5 bytes", "too short")),
    "text-file": Case(_text, CorruptDumpError, ("not a safetensors file", "text", "README")),
    "random-bytes": Case(_random_bytes, CorruptDumpError, ("not a safetensors file",)),
    "length-past-eof-no-header": Case(_no_header, CorruptDumpError, ("not a safetensors file",)),
    # The header.
    "header-length-absurd": Case(
        _header_absurd, CorruptDumpError, (str(2**60), "absurd", "expected 1..")
    ),
    "header-past-eof": Case(
        _header_past_eof, CorruptDumpError, ("header length 1000", "past the end", "truncated")
    ),
    "header-not-json": Case(_header_not_json, CorruptDumpError, ("header is not JSON",)),
    "header-not-utf8": Case(_header_not_utf8, CorruptDumpError, ("header is not JSON",)),
    "header-deeply-nested": Case(_header_deeply_nested, CorruptDumpError, ("nested",)),
    "header-too-many-values": Case(
        _header_too_many_values, CorruptDumpError, ("more than 65536 JSON values",)
    ),
    "header-huge-number": Case(_header_huge_number, CorruptDumpError, ("long number",)),
    "header-not-object": Case(_header_not_object, CorruptDumpError, ("not a JSON object",)),
    "metadata-not-strings": Case(
        _metadata_not_strings, CorruptDumpError, ("__metadata__", "strings")
    ),
    "entry-not-object": Case(_entry_not_object, CorruptDumpError, ("prefix_lens", "object")),
    "offsets-outside-file": Case(
        _offsets_outside, CorruptDumpError, ("prefix_lens", "[0, 800]", "outside", "8 data")
    ),
    "truncated-data": Case(_truncated_data, CorruptDumpError, ("outside", "truncated")),
    "offsets-malformed": Case(_offsets_malformed, CorruptDumpError, ("prefix_lens", "[begin")),
    "shape-x-dtype-ne-bytes": Case(
        _nbytes_mismatch, CorruptDumpError, ("prefix_lens", "[3]", "24 bytes", "span 16")
    ),
    "shape-product-overflows": Case(
        _shape_overflow, CorruptDumpError, ("prefix_lens", str(2**40), "overflows")
    ),
    "shape-dim-beyond-int64": Case(
        _shape_dim_beyond_int64, CorruptDumpError, ("prefix_lens", "2^50")
    ),
    "shape-too-many-dims": Case(
        _shape_too_many_dims, CorruptDumpError, ("prefix_lens", "1000 dimensions", "64")
    ),
    "negative-dimension": Case(_negative_dim, CorruptDumpError, ("prefix_lens", "negative")),
    "shape-not-ints": Case(_shape_not_ints, CorruptDumpError, ("prefix_lens", "[1.0]")),
    "unknown-dtype": Case(_unknown_dtype, CorruptDumpError, ("prefix_lens", "'Q7'", "dtype")),
    "name-with-newline": Case(_name_with_newline, CorruptDumpError, ("'evil\\nname'",)),
    "safetensors-refuses": Case(_rust_refuses, CorruptDumpError, ("safetensors refuses",)),
    # Required tensors.
    **{
        f"missing-{name}": Case(_missing_tensor(name), MissingTensorError, (name, "missing"))
        for name in ("req_to_token", "req_pool_indices", "prefix_lens")
    },
    # Dtypes.
    "float32-req_to_token": Case(
        _changed(req_to_token=np.zeros((4, 8), dtype=np.float32)),
        TensorDtypeError,
        ("req_to_token", "float32", "expected int32 or int64"),
    ),
    "bool-prefix_lens": Case(
        _changed(prefix_lens=np.zeros(BS, dtype=np.bool_)),
        TensorDtypeError,
        ("prefix_lens", "bool", "expected int64 or int32"),
    ),
    "uint16-req_pool_indices": Case(
        _changed(req_pool_indices=np.zeros(BS, dtype=np.uint16)),
        TensorDtypeError,
        ("req_pool_indices", "uint16", "expected int64 or int32"),
    ),
    "float16-extend_seq_lens": Case(
        _changed(extend_seq_lens=np.zeros(BS, dtype=np.float16)),
        TensorDtypeError,
        ("extend_seq_lens", "float16"),
    ),
    "int8-expected-pool": Case(
        _changed(
            req_to_verify_expected_tokens=np.zeros((4, 8), dtype=np.int8),
            req_to_verify_expected_tokens_valid_lens=np.zeros(BS, dtype=_I64),
        ),
        TensorDtypeError,
        ("req_to_verify_expected_tokens", "int8"),
    ),
    "float-scalar-tensor": Case(
        _changed(page_size=np.array(1.0, dtype=np.float32)),
        TensorDtypeError,
        ("page_size", "float32", "integer"),
    ),
    # Ranks.
    "1d-req_to_token": Case(
        _changed(req_to_token=np.zeros(32, dtype=np.int32)),
        TensorShapeError,
        ("req_to_token", "[32]", "1-D", "expected 2-D"),
    ),
    "2d-prefix_lens": Case(
        _changed(prefix_lens=np.zeros((BS, 1), dtype=_I64)),
        TensorShapeError,
        ("prefix_lens", "[3, 1]", "2-D", "expected 1-D"),
    ),
    "0d-req_pool_indices": Case(
        _changed(req_pool_indices=np.array(1, dtype=np.int64)),
        TensorShapeError,
        ("req_pool_indices", "0-D", "expected 1-D"),
    ),
    "violation_write_index-empty": Case(
        _changed(
            violation_ring=np.zeros((2, 8), dtype=_I64),
            violation_write_index=np.zeros(0, dtype=np.int32),
        ),
        TensorShapeError,
        ("violation_write_index", "[0]", "expected [] or [1]"),
    ),
    "scalar-tensor-two-elements": Case(
        _changed(page_size=np.array([1, 2], dtype=np.int64)),
        MetadataError,
        ("page_size", "[2]", "expected [] or [1]"),
    ),
    # Lengths against bs.
    "prefix_lens-length-ne-bs": Case(
        _changed(prefix_lens=np.zeros(BS + 1, dtype=_I64)),
        TensorShapeError,
        ("prefix_lens", "length 4", "bs=3"),
    ),
    "extend_seq_lens-length-ne-bs": Case(
        _changed(extend_seq_lens=np.zeros(BS - 1, dtype=_I64)),
        TensorShapeError,
        ("extend_seq_lens", "length 2", "bs=3"),
    ),
    "valid_lens-length-ne-bs": Case(
        _changed(
            req_to_verify_expected_tokens=_POOL,
            req_to_verify_expected_tokens_valid_lens=np.zeros(1, dtype=_I64),
        ),
        TensorShapeError,
        ("req_to_verify_expected_tokens_valid_lens", "length 1", "bs=3"),
    ),
    # Scalars.
    "scalar-not-integer": Case(
        _changed({"swa_window_size": "abc"}),
        MetadataError,
        ("swa_window_size", "'abc'", "not an integer"),
    ),
    "scalar-with-underscore": Case(
        _changed({"verify_capacity": "1_0"}),
        MetadataError,
        ("verify_capacity", "'1_0'", "not an integer"),
    ),
    "ring-without-write-index": Case(
        _changed(violation_ring=np.zeros((4, 8), dtype=_I64)),
        MissingTensorError,
        ("violation_write_index", "violation_ring"),
    ),
    "scalar-given-twice": Case(
        _changed({"page_size": "2"}, page_size=np.array(4, dtype=np.int64)),
        MetadataError,
        ("page_size", "given twice", "metadata says 2", "tensor says 4"),
    ),
    "lut-without-window": Case(
        _changed(full_to_swa_index_mapping=_LUT),
        MetadataError,
        ("swa_window_size", "full_to_swa_index_mapping", "--set swa_window_size=W"),
    ),
    "pool-without-valid_lens": Case(
        _changed(req_to_verify_expected_tokens=_POOL),
        MissingTensorError,
        ("req_to_verify_expected_tokens_valid_lens", "required", "req_to_verify_expected_tokens"),
    ),
    "lut-length-0": Case(
        _changed({"swa_window_size": "4"}, full_to_swa_index_mapping=np.zeros(0, dtype=_I64)),
        TensorShapeError,
        ("full_to_swa_index_mapping", "empty", "length 0"),
    ),
    "format-version-2": Case(
        _changed({"kvcanary.format": "2"}),
        MetadataError,
        ("kvcanary.format", "'2'", "not supported", "upgrade"),
    ),
    # A newer format may change anything: the version is what to report, not the dtype.
    "format-version-2-before-dtype": Case(
        _changed({"kvcanary.format": "2"}, req_to_token=np.zeros((4, 8), dtype=np.float32)),
        MetadataError,
        ("kvcanary.format", "'2'"),
    ),
    "unknown-group": Case(
        _changed({"groups": "full,mamba"}),
        MetadataError,
        ("groups", "'mamba'", "full, swa"),
    ),
    "groups-swa-without-lut": Case(
        _changed({"groups": "swa"}),
        MetadataError,
        ("groups", "full_to_swa_index_mapping"),
    ),
}


# --- assertions -------------------------------------------------------------------------------


def inspect_bad_input(path: Path) -> str:
    """Run `kvcanary inspect PATH`; assert exit 2, one `error:` line, no traceback; return it."""
    result = CliRunner().invoke(app, ["inspect", str(path)])
    everything = result.output + result.stdout + result.stderr
    assert "Traceback" not in everything
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stderr == lines[0] + "\n"
    assert lines[0].startswith("error: ")
    assert lines[0].startswith(f"error: {_shown(path)}"), lines[0]  # every line names the file
    return lines[0]


def _shown(path: Path) -> str:
    """How an error line names `path` (hostile names are shown as their repr)."""
    text = str(path)
    return text if text.isprintable() else repr(text)[:20]


# --- tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case_id", list(CASES))
def test_inspect_rejects_malformed_dump(case_id: str, tmp_path: Path) -> None:
    case = CASES[case_id]
    line = inspect_bad_input(case.build(tmp_path))
    for needle in case.needles:
        assert needle in line, (needle, line)
    assert len(line) < 1000, line


@pytest.mark.parametrize("case_id", list(CASES))
def test_load_dump_raises_the_documented_class(case_id: str, tmp_path: Path) -> None:
    case = CASES[case_id]
    with pytest.raises(KvcanaryError) as caught:
        load_dump(case.build(tmp_path))
    assert type(caught.value) is case.error
    text = str(caught.value)
    assert text and "\n" not in text and "\r" not in text
    for needle in case.needles:
        assert needle in text, (needle, text)


@pytest.mark.parametrize(
    ("case_id", "family"),
    [
        ("empty-file", DumpError),
        ("shape-product-overflows", DumpError),
        ("missing-req_to_token", DumpError),
        ("bool-prefix_lens", DumpError),
        ("2d-prefix_lens", DumpError),
        ("scalar-given-twice", DumpError),
        ("unknown-group", MetadataError),
    ],
)
def test_error_families(case_id: str, family: type[KvcanaryError], tmp_path: Path) -> None:
    with pytest.raises(family):
        load_dump(CASES[case_id].build(tmp_path))


@pytest.mark.parametrize(
    "case_id",
    [
        "header-length-absurd",
        "shape-product-overflows",
        "shape-too-many-dims",
        "header-huge-number",
        "header-too-many-values",
    ],
)
def test_hostile_header_is_rejected_without_allocating(case_id: str, tmp_path: Path) -> None:
    path = CASES[case_id].build(tmp_path)
    try:  # warm the imports so only the check itself is measured
        load_dump(path)
    except KvcanaryError:
        pass
    tracemalloc.start()
    try:
        with pytest.raises(CorruptDumpError):
            load_dump(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The lie is 2^60 header bytes or 2^83 tensor bytes; the truth is a few MB of header at most.
    # (Memory, not time, is asserted: wall-clock limits belong in bench/, not in tests.)
    assert peak < 4 * path.stat().st_size + (1 << 20), peak


@pytest.mark.parametrize("case_id", ["text-file", "random-bytes", "length-past-eof-no-header"])
def test_a_file_that_is_not_safetensors_is_called_so(case_id: str, tmp_path: Path) -> None:
    # not "header length 8031924123371070824 is absurd": a user passed the wrong file
    line = inspect_bad_input(CASES[case_id].build(tmp_path))
    assert "header length" not in line and "absurd" not in line, line


def test_header_length_absurd_file_is_tiny(tmp_path: Path) -> None:
    path = CASES["header-length-absurd"].build(tmp_path)
    assert path.stat().st_size == 10


def test_truncated_data_names_the_last_tensor(tmp_path: Path) -> None:
    path = CASES["truncated-data"].build(tmp_path)
    (size,) = struct.unpack("<Q", path.read_bytes()[:8])
    header = json.loads(path.read_bytes()[8 : 8 + size])
    header.pop("__metadata__", None)
    last = max(header, key=lambda name: header[name]["data_offsets"][1])
    assert inspect_bad_input(path).startswith(f"error: {path}: {last}: data offsets")


def test_missing_path_is_not_created(tmp_path: Path) -> None:
    path = _missing(tmp_path)
    inspect_bad_input(path)
    assert not path.exists()
