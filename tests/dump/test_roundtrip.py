"""save_dump -> load_dump gives back what was saved; the writer and loader keep their promises.

The dumps are built from numpy arrays, so every test here runs without torch; the one that
hands `save_dump` torch tensors (as SGLang does) asks for torch itself.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from typer.testing import CliRunner

from kvcanary_cli.cli import app
from kvcanary_cli.dump.atomic import safetensors_dtype_of, write_safetensors
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.dump.releases import out_of_range_note
from kvcanary_cli.dump.schema import IDENTITY_KEYS, SCALARS, TENSORS
from kvcanary_cli.dump.tensor import StoredTensor
from kvcanary_cli.dump.writer import save_dump
from kvcanary_cli.errors import PathError, TensorDtypeError
from tests.torch_extra import needs_torch

INT_DTYPES: tuple[type[np.signedinteger[Any]], ...] = (np.int32, np.int64)
#: Scalars as save_dump takes them (Python ints), with the range of values SGLang could use
#: (outside it, a recorded value is reported as corrupt and planned as unrecorded).
SCALAR_RANGE = {
    "swa_window_size": (-8, 2**40),
    "verify_capacity": (0, 2**31 - 1),
    "write_req_capacity": (0, 2**31 - 1),
    "kv_token_id_vs_position_offset": (0, 2**31 - 1),
    "page_size": (1, 2**31 - 1),
    "num_full_slots": (0, 2**48),
    "num_swa_slots": (0, 2**48),
}
_EXAMPLE = itertools.count()
RESERVED_KEYS = {*SCALARS, "groups", "kvcanary.format", "sglang.version", "sglang.commit"}


def _bounds(dtype: type[np.signedinteger[Any]], limit: int) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return max(info.min, -limit), min(info.max, limit)


@st.composite
def int_tensors(
    draw: st.DrawFn,
    shape: tuple[int, ...],
    limit: int = 2**62,
    dtypes: tuple[type[np.signedinteger[Any]], ...] = INT_DTYPES,
) -> np.ndarray:
    dtype = draw(st.sampled_from(dtypes))
    low, high = _bounds(dtype, limit)
    numel = int(np.prod(shape))
    values = draw(st.lists(st.integers(low, high), min_size=numel, max_size=numel))
    return np.array(values, dtype=dtype).reshape(shape)


@st.composite
def dump_kwargs(draw: st.DrawFn) -> dict[str, Any]:
    """Keyword arguments for save_dump that make a valid format-v1 dump."""
    bs = draw(st.integers(0, 6))
    rows, cols = draw(st.integers(0, 5)), draw(st.integers(0, 6))
    kwargs: dict[str, Any] = {
        "req_to_token": draw(int_tensors((rows, cols), limit=2**31)),
        "req_pool_indices": draw(int_tensors((bs,))),
        # The loader rejects |length| > 2^40 as corrupt; negative lengths are findings, not errors.
        "prefix_lens": draw(int_tensors((bs,), limit=2**40)),
    }
    if draw(st.booleans()):
        kwargs["extend_seq_lens"] = draw(int_tensors((bs,), limit=2**40))
    else:
        kwargs["extend_seq_lens"] = None
    if draw(st.booleans()):
        lut_len = draw(st.integers(1, 8))
        kwargs["full_to_swa_index_mapping"] = draw(int_tensors((lut_len,)))
        kwargs["swa_window_size"] = draw(st.integers(-8, 4096))
    if draw(st.booleans()):
        pool_shape = (draw(st.integers(0, 4)), draw(st.integers(0, 5)))
        kwargs["req_to_verify_expected_tokens"] = draw(int_tensors(pool_shape, limit=2**31))
        kwargs["req_to_verify_expected_tokens_valid_lens"] = draw(int_tensors((bs,)))
    for name, (low, high) in SCALAR_RANGE.items():
        if name not in kwargs and draw(st.booleans()):
            kwargs[name] = draw(st.integers(low, high))
    keys = st.text(min_size=1, max_size=12).filter(lambda k: k not in RESERVED_KEYS)
    kwargs["metadata"] = draw(
        st.dictionaries(
            st.one_of(st.sampled_from(IDENTITY_KEYS), keys), st.text(max_size=20), max_size=4
        )
    )
    return kwargs


@pytest.mark.slow
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(kwargs=dump_kwargs())
def test_save_then_load_gives_back_every_value(kwargs: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / f"rt-{next(_EXAMPLE)}.safetensors"  # a fresh file per example
    save_dump(path, **kwargs)
    dump = load_dump(path)
    tensors = {k: v for k, v in kwargs.items() if isinstance(v, np.ndarray)}
    ints = {k: v for k, v in kwargs.items() if isinstance(v, int)}

    assert dump.metadata["kvcanary.format"] == "1"
    for key, value in kwargs["metadata"].items():
        assert dump.metadata[key] == value
    assert set(dump.tensors) == set(tensors)
    window = kwargs.get("swa_window_size")
    negative_window = window is not None and window < 0
    # the legal oddities: a negative window, and an SGLang version outside the checked range
    release = out_of_range_note(kwargs["metadata"].get("sglang.version"), "this dump")
    assert len(dump.notes) == int(negative_window) + int(release is not None), dump.notes

    for name, saved in tensors.items():
        loaded = getattr(dump, name)
        assert loaded is not None, name
        assert list(loaded.shape) == list(saved.shape), name
        if isinstance(loaded, StoredTensor):  # the tables and the LUT: read through the interface
            loaded = loaded.array()
        assert np.array_equal(loaded.astype(np.int64), saved.astype(np.int64)), name
        assert dump.tensors[name].dtype == safetensors_dtype_of(saved.dtype), name
    # The big tables keep their stored dtype; per-batch vectors are read as int64.
    assert dump.req_to_token.array().dtype == tensors["req_to_token"].dtype
    for name in ("req_pool_indices", "prefix_lens", "extend_seq_lens"):
        assert getattr(dump, name).dtype == np.int64
    if kwargs["extend_seq_lens"] is None:
        assert np.array_equal(dump.extend_seq_lens, np.zeros(dump.bs, dtype=np.int64))

    assert dump.bs == kwargs["req_pool_indices"].shape[0]
    noncanonical = {
        n for n, t in tensors.items() if safetensors_dtype_of(t.dtype) != TENSORS[n].canonical
    }
    assert {note.tensor for note in dump.dtype_notes} == noncanonical

    for name in SCALARS:
        scalar = dump.scalars[name]
        if name in ints:
            assert (scalar.value, scalar.source) == (ints[name], "metadata"), name
        else:
            assert scalar.source != "metadata", name
    lut = kwargs.get("full_to_swa_index_mapping")
    assert dump.groups == (("full",) if lut is None else ("full", "swa"))
    if lut is not None and "num_full_slots" not in ints:
        assert dump.scalar("num_full_slots") == lut.shape[0] - 1


# --- plain tests ------------------------------------------------------------------------------


def small_batch(**changes: Any) -> dict[str, Any]:
    batch: dict[str, Any] = {
        "req_to_token": np.arange(24, dtype=np.int32).reshape(4, 6),
        "req_pool_indices": np.array([2, 1, 0], dtype=np.int64),
        "prefix_lens": np.array([3, 1, 0], dtype=np.int64),
        "extend_seq_lens": np.array([1, 2, 0], dtype=np.int64),
    }
    batch.update(changes)
    return batch


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_loaded_dump_survives_its_file_being_replaced(tmp_dump: Path) -> None:
    save_dump(tmp_dump, **small_batch())
    dump = load_dump(tmp_dump)
    table_before = dump.req_to_token.array().copy()
    save_dump(
        tmp_dump, **small_batch(prefix_lens=np.array([5, 5, 5], dtype=np.int64))
    )  # atomic replace
    assert dump.prefix_lens.tolist() == [3, 1, 0]
    assert np.array_equal(dump.req_to_token.array(), table_before)  # still the old file's pages
    assert load_dump(tmp_dump).prefix_lens.tolist() == [5, 5, 5]


def test_writer_refuses_to_overwrite_an_input(tmp_dump: Path) -> None:
    save_dump(tmp_dump, **small_batch())
    before = file_hash(tmp_dump)
    with pytest.raises(PathError) as caught:
        write_safetensors(tmp_dump, {"x": np.zeros(1, dtype=np.int64)}, {}, inputs=[tmp_dump])
    assert str(tmp_dump) in str(caught.value) and "input" in str(caught.value)
    assert file_hash(tmp_dump) == before


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("req_to_token", np.zeros((4, 6), dtype=np.float32)),
        ("prefix_lens", np.zeros(3, dtype=np.float64)),
        ("req_pool_indices", np.zeros(3, dtype=np.bool_)),
        ("full_to_swa_index_mapping", np.zeros(3, dtype=np.int16)),
    ],
)
def test_save_rejects_a_wrong_dtype_for_a_known_name(
    name: str, value: np.ndarray, tmp_dump: Path
) -> None:
    with pytest.raises(TensorDtypeError) as caught:
        save_dump(tmp_dump, **small_batch(**{name: value}))
    text = str(caught.value)
    assert text.startswith(f"{name}: ") and "\n" not in text
    assert caught.value.hint is not None and ".astype(numpy." in caught.value.hint
    assert not tmp_dump.exists()
    assert list(tmp_dump.parent.iterdir()) == []  # no temporary file left behind


def test_none_kwargs_are_skipped(tmp_dump: Path) -> None:
    save_dump(
        tmp_dump,
        **small_batch(extend_seq_lens=None),
        full_to_swa_index_mapping=None,
        req_to_verify_expected_tokens=None,
        verify_capacity=None,
        swa_window_size=None,
    )
    dump = load_dump(tmp_dump)
    assert set(dump.tensors) == {"req_to_token", "req_pool_indices", "prefix_lens"}
    assert "verify_capacity" not in dump.metadata
    assert "swa_window_size" not in dump.metadata
    assert dump.scalars["verify_capacity"].source == "default"
    assert dump.full_to_swa_index_mapping is None
    assert dump.extend_seq_lens.tolist() == [0, 0, 0]


def test_writer_stores_contiguous_copies(tmp_dump: Path) -> None:
    transposed = np.arange(24, dtype=np.int32).reshape(6, 4).T  # [4, 6], not contiguous
    strided = np.arange(12, dtype=np.int64)[::4]  # [3], stride 4
    assert not transposed.flags.c_contiguous and not strided.flags.c_contiguous
    save_dump(tmp_dump, req_to_token=transposed, req_pool_indices=strided, prefix_lens=[0, 3, 6])
    with safe_open(str(tmp_dump), framework="np") as handle:
        stored = {name: handle.get_tensor(name) for name in handle.keys()}
    assert np.array_equal(stored["req_to_token"], transposed)
    assert np.array_equal(stored["req_pool_indices"], strided)
    assert stored["prefix_lens"].tolist() == [0, 3, 6]
    transposed[0, 0] = 99  # the file holds a copy, not a view of the caller's memory
    assert load_dump(tmp_dump).req_to_token.array()[0, 0] == 0


def test_writer_takes_torch_tensors_as_sglang_passes_them(tmp_dump: Path) -> None:
    """Non-contiguous CPU tensors are stored as copies; a wrong dtype's hint is torch's."""
    torch = needs_torch()
    transposed = torch.arange(24, dtype=torch.int32).reshape(6, 4).t()  # [4, 6], not contiguous
    strided = torch.arange(12, dtype=torch.int64)[::4]  # [3], stride 4
    assert not transposed.is_contiguous() and not strided.is_contiguous()
    save_dump(
        tmp_dump,
        req_to_token=transposed,
        req_pool_indices=strided,
        prefix_lens=torch.tensor([0, 3, 6]),
        write_req_capacity=torch.tensor(7),  # a 0-d tensor: a scalar stored as a tensor
    )
    with safe_open(str(tmp_dump), framework="np") as handle:
        stored = {name: handle.get_tensor(name) for name in handle.keys()}
    assert np.array_equal(stored["req_to_token"], transposed.numpy())
    assert np.array_equal(stored["req_pool_indices"], strided.numpy())
    assert stored["write_req_capacity"].shape == () and int(stored["write_req_capacity"]) == 7
    transposed[0, 0] = 99  # the file holds a copy, not a view of the caller's memory
    assert load_dump(tmp_dump).req_to_token.array()[0, 0] == 0
    with pytest.raises(TensorDtypeError) as caught:
        save_dump(tmp_dump, **small_batch(prefix_lens=torch.zeros(3, dtype=torch.float64)))
    assert caught.value.hint == "pass prefix_lens.to(torch.int64)"


def test_loader_never_modifies_the_input_file(tmp_dump: Path) -> None:
    pool = np.arange(24, dtype=np.int32).reshape(4, 6)
    save_dump(
        tmp_dump,
        **small_batch(),
        req_to_verify_expected_tokens=pool,
        req_to_verify_expected_tokens_valid_lens=np.array([4, 3, 0], dtype=np.int64),
    )
    before = file_hash(tmp_dump)
    mtime = tmp_dump.stat().st_mtime_ns
    dump = load_dump(tmp_dump)
    dump.req_to_token.array()[:] = -1  # memory-mapped: these writes must stay private
    assert dump.req_to_verify_expected_tokens is not None
    dump.req_to_verify_expected_tokens.array().fill(7)
    dump.prefix_lens += 100
    dump.req_pool_indices.fill(0)
    assert dump.req_to_token.array().min() == -1
    assert file_hash(tmp_dump) == before
    del dump
    gc.collect()
    assert file_hash(tmp_dump) == before
    assert tmp_dump.stat().st_mtime_ns == mtime
    again = load_dump(tmp_dump)
    assert np.array_equal(again.req_to_token.array(), np.arange(24, dtype=np.int32).reshape(4, 6))
    assert again.prefix_lens.tolist() == [3, 1, 0]


def run_inspect_json(path: Path) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["inspect", str(path), "--format", "json"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert result.stderr == ""
    record = json.loads(result.stdout)
    assert isinstance(record, dict)
    return record


def test_inspect_json_has_schema_bs_and_scalar_sources(tmp_dump: Path) -> None:
    save_dump(
        tmp_dump,
        **small_batch(),
        page_size=4,
        verify_capacity=10,
        write_req_capacity=np.array(7, dtype=np.int64),  # a scalar stored as a 0-d tensor
        metadata={"model": "m", "rank": 3, "custom.key": "x"},
    )
    record = run_inspect_json(tmp_dump)
    assert record["schema"] == "kvcanary.inspect/2"
    assert record["format"] == "1"
    assert record["batch"]["bs"] == 3
    assert record["batch"]["active_rows"] == 2
    assert record["batch"]["max_reqs"] == 4 and record["batch"]["max_seq_len"] == 6
    sources = {s["name"]: (s["value"], s["source"]) for s in record["scalars"]}
    options = {s["name"]: s["option"] for s in record["scalars"]}
    assert options["swa_window_size"] == "--set swa_window_size=N"  # the CLI's --set
    assert "identity" in record and "provenance" not in record
    assert sources["page_size"] == (4, "metadata")
    assert sources["verify_capacity"] == (10, "metadata")
    assert sources["write_req_capacity"] == (7, "tensor")
    assert sources["swa_window_size"] == (None, "default")
    assert sources["kv_token_id_vs_position_offset"] == (0, "default")
    assert record["groups"] == [{"name": "full", "window": 0}]
    assert record["identity"] == {"model": "m", "rank": "3"}
    assert record["other_metadata"] == {"custom.key": "x"}
    roles = {t["name"]: t["role"] for t in record["tensors"]}
    assert roles["write_req_capacity"] == "scalar"


def test_int32_req_pool_indices_gets_a_gpu_path_note(tmp_dump: Path) -> None:
    save_dump(tmp_dump, **small_batch(req_pool_indices=np.array([2, 1, 0], dtype=np.int32)))
    dump = load_dump(tmp_dump)
    assert [(n.tensor, n.found, n.expected) for n in dump.dtype_notes] == [
        ("req_pool_indices", "I32", "I64")
    ]
    notes = run_inspect_json(tmp_dump)["notes"]
    assert any(
        "req_pool_indices" in n and "production GPU path" in n and "int64" in n for n in notes
    ), notes
    table = CliRunner().invoke(app, ["inspect", str(tmp_dump)])
    assert table.exit_code == 0
    assert "production GPU path" in " ".join(table.stdout.split())


def test_canonical_dtypes_get_no_note(tmp_dump: Path) -> None:
    save_dump(tmp_dump, **small_batch())
    assert load_dump(tmp_dump).dtype_notes == []
    assert run_inspect_json(tmp_dump)["notes"] == []


def test_save_dump_refuses_a_list_of_floats(tmp_path: Path) -> None:
    with pytest.raises(TensorDtypeError, match="prefix_lens"):
        save_dump(
            tmp_path / "f.safetensors",
            req_to_token=np.zeros((2, 2), dtype=np.int32),
            req_pool_indices=[1],
            prefix_lens=[1.5],  # type: ignore[list-item]  # the point of the test
        )
    assert not list(tmp_path.iterdir())


def test_save_dump_takes_a_list_of_ints(tmp_path: Path) -> None:
    path = save_dump(
        tmp_path / "i.safetensors",
        req_to_token=np.zeros((2, 4), dtype=np.int32),
        req_pool_indices=[1],
        prefix_lens=[3],
    )
    assert load_dump(path).prefix_lens.tolist() == [3]
