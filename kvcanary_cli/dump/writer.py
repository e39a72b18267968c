"""`save_dump`: the writer users call from inside SGLang (or a test) to capture one step.

It takes the upstream keyword arguments as they are (CUDA or CPU tensors, int32 or int64,
Python ints for scalars, None for absent optionals) and writes a format-v1 file atomically.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from kvcanary_cli.dump.atomic import safetensors_dtype_of, write_safetensors
from kvcanary_cli.dump.schema import (
    FORMAT_VERSION,
    SCALARS,
    dtype_label,
    parse_integer,
    spec_for,
)
from kvcanary_cli.errors import MetadataError, TensorDtypeError

__all__ = ["TensorLike", "dump_contents", "save_dump", "write_dump"]

TensorLike = torch.Tensor | np.ndarray | int | list[int] | None


def save_dump(
    path: str | os.PathLike[str],
    *,
    metadata: Mapping[str, object] | None = None,
    **tensors: TensorLike,
) -> Path:
    """Write tensors and scalars as one format-v1 dump; return the path written.

    Tensors are copied to contiguous CPU memory. Python ints named like a scalar key
    (`swa_window_size=128`) go to the metadata; None values are skipped, so a call's keyword
    arguments can be passed through unchanged. The file is replaced atomically, so a dump of
    the same path that is still loaded keeps reading the old contents. Only regular files (or
    `-`, standard output) are written; `write_dump` can refuse an existing file.
    """
    return write_dump(path, dump_contents(metadata, tensors))


def write_dump(
    path: str | os.PathLike[str],
    contents: tuple[dict[str, torch.Tensor], dict[str, str]],
    *,
    overwrite: bool = True,
) -> Path:
    """Write what `dump_contents` prepared (`overwrite` False: refuse an existing file)."""
    tensors, metadata = contents
    return write_safetensors(path, tensors, metadata, overwrite=overwrite)


def dump_contents(
    metadata: Mapping[str, object] | None, tensors: Mapping[str, TensorLike]
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata strings of a format-v1 dump, checked (see `save_dump`)."""
    meta: dict[str, str] = {str(k): str(v) for k, v in (metadata or {}).items()}
    out: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        if value is None:
            continue
        if isinstance(value, bool):
            raise TensorDtypeError("a bool is not a tensor or a scalar", field=name)
        if isinstance(value, int) and spec_for(name) is None:
            meta[name] = str(value)
            continue
        out[name] = _to_cpu_tensor(name, value)
    for name in SCALARS:
        if name in meta:
            if parse_integer(meta[name]) is None:
                raise MetadataError(f"value {meta[name]!r} is not an integer", field=name)
    meta["kvcanary.format"] = FORMAT_VERSION
    _record_sglang_version(meta)
    return out, meta


def _to_cpu_tensor(name: str, value: TensorLike) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
    elif isinstance(value, np.ndarray):
        tensor = torch.from_numpy(np.ascontiguousarray(value))
    else:  # a list of Python ints: refuse floats instead of truncating them
        tensor = torch.as_tensor(value)
        if tensor.is_floating_point() or tensor.dtype == torch.bool:
            raise TensorDtypeError(f"holds {tensor.dtype} values, expected integers", field=name)
        tensor = tensor.to(torch.int64)
    tensor = tensor.to("cpu").contiguous()
    stored = safetensors_dtype_of(tensor.dtype)
    spec = spec_for(name)
    if spec is not None and stored not in spec.dtypes:
        want = " or ".join(dtype_label(d) for d in spec.dtypes)
        raise TensorDtypeError(
            f"dtype {tensor.dtype} is not accepted (expected {want})",
            field=name,
            hint=f"pass {name}.to(torch.{dtype_label(spec.canonical)})",
        )
    return tensor


def _record_sglang_version(meta: dict[str, str]) -> None:
    if "sglang.version" in meta:
        return
    try:
        meta["sglang.version"] = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        pass
