"""`save_dump`: the writer users call from inside SGLang (or a test) to capture one step.

It takes the upstream keyword arguments as they are (CUDA or CPU torch tensors, numpy arrays,
int32 or int64, Python ints for scalars, None for absent optionals) and writes a format-v1
file atomically. Torch is never imported here: tensors go to numpy as they come in.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypeAlias, Union

import numpy as np

from kvcanary_cli.dump.atomic import (
    host_array,
    is_torch_tensor,
    safetensors_dtype_of,
    safetensors_writer,
    write_safetensors,
)
from kvcanary_cli.dump.schema import (
    FORMAT_VERSION,
    SCALARS,
    dtype_label,
    parse_integer,
    spec_for,
)
from kvcanary_cli.errors import DumpError, MetadataError, TensorDtypeError

__all__ = ["TensorLike", "dump_contents", "dump_writer", "save_dump", "write_dump"]

if TYPE_CHECKING:  # accepted, never imported: a tensor exists only where torch is
    import torch

#: What `save_dump` takes per name: an array (numpy, or a torch tensor on any device), a
#: Python int (a scalar), a list of ints, or None (skipped).
TensorLike: TypeAlias = Union["torch.Tensor", np.ndarray, int, list[int], None]  # noqa: UP007


def save_dump(
    path: str | os.PathLike[str],
    *,
    metadata: Mapping[str, object] | None = None,
    **tensors: TensorLike,
) -> Path:
    """Write tensors and scalars as one format-v1 dump; return the path written.

    Tensors are copied to contiguous host memory (numpy). Python ints named like a scalar
    key (`swa_window_size=128`) go to the metadata; None values are skipped, so a call's keyword
    arguments can be passed through unchanged. The file is replaced atomically, so a dump of
    the same path that is still loaded keeps reading the old contents. Only regular files (or
    `-`, standard output) are written; `write_dump` can refuse an existing file.
    """
    return write_dump(path, dump_contents(metadata, tensors))


def write_dump(
    path: str | os.PathLike[str],
    contents: tuple[dict[str, np.ndarray], dict[str, str]],
    *,
    overwrite: bool = True,
) -> Path:
    """Write what `dump_contents` prepared (`overwrite` False: refuse an existing file)."""
    tensors, metadata = contents
    return write_safetensors(path, tensors, metadata, overwrite=overwrite)


def dump_writer(
    contents: tuple[dict[str, np.ndarray], dict[str, str]],
) -> Callable[[BinaryIO], None]:
    """What writes what `dump_contents` prepared to a handle (for files written together)."""
    tensors, metadata = contents
    return safetensors_writer(tensors, metadata)


def dump_contents(
    metadata: Mapping[str, object] | None, tensors: Mapping[str, TensorLike]
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The arrays and metadata strings of a format-v1 dump, checked (see `save_dump`)."""
    meta: dict[str, str] = {str(k): str(v) for k, v in (metadata or {}).items()}
    out: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        if value is None:
            continue
        if isinstance(value, bool):
            raise TensorDtypeError("a bool is not a tensor or a scalar", field=name)
        if isinstance(value, int) and spec_for(name) is None:
            meta[name] = str(value)
            continue
        out[name] = _to_host_array(name, value)
    for name in SCALARS:
        if name in meta:
            if parse_integer(meta[name]) is None:
                raise MetadataError(f"value {meta[name]!r} is not an integer", field=name)
    meta["kvcanary.format"] = FORMAT_VERSION
    _record_sglang_version(meta)
    return out, meta


def _to_host_array(name: str, value: TensorLike) -> np.ndarray:
    is_tensor = is_torch_tensor(value)
    layout = str(getattr(value, "layout", "torch.strided")) if is_tensor else "torch.strided"
    if layout != "torch.strided":  # numpy refuses it, and its dtype was then blamed
        raise DumpError(
            f"is a sparse tensor ({layout}); a dump stores dense ones",
            field=name,
            hint=f"pass {name}.to_dense()",
        )
    try:
        array = host_array(value)
    except TypeError:  # a torch dtype numpy lacks (bfloat16...): never an integer one
        array = None
    if array is None and not is_tensor:  # a list of Python ints: refuse floats too
        array = _int_list(name, value)
    dtype_text = str(getattr(value, "dtype", None) if is_tensor or array is None else array.dtype)
    stored = None if array is None else safetensors_dtype_of(array.dtype)
    spec = spec_for(name)
    if spec is not None and stored not in spec.dtypes:
        want = " or ".join(dtype_label(d) for d in spec.dtypes)
        canonical = dtype_label(spec.canonical)
        convert = f".to(torch.{canonical})" if is_tensor else f".astype(numpy.{canonical})"
        raise TensorDtypeError(
            f"dtype {dtype_text} is not accepted (expected {want})",
            field=name,
            hint=f"pass {name}{convert}",
        )
    if array is None:
        raise TensorDtypeError(f"dtype {dtype_text} cannot be stored", field=name)
    # Contiguous, copied only when it is not (np.ascontiguousarray would make a 0-d array 1-d).
    return np.asarray(array, order="C")


def _int_list(name: str, value: object) -> np.ndarray:
    """A (nested) list of Python ints as int64; floats, bools and overflow are refused."""
    try:
        listed = np.asarray(value)
    except ValueError:
        raise TensorDtypeError("is not a rectangular list of integers", field=name) from None
    if listed.dtype.kind == "O":
        raise TensorDtypeError("holds values outside int64", field=name)
    if listed.dtype.kind not in "iu":
        raise TensorDtypeError(f"holds {listed.dtype} values, expected integers", field=name)
    try:
        return np.asarray(value, dtype=np.int64)
    except (OverflowError, ValueError, TypeError):
        raise TensorDtypeError("holds values outside int64", field=name) from None


def _record_sglang_version(meta: dict[str, str]) -> None:
    if "sglang.version" in meta:
        return
    try:
        meta["sglang.version"] = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        pass
