"""Deterministic safetensors writes, through the safe atomic writer of `dump.files`.

Deterministic: tensors and metadata keys are sorted, so the same content gives the same bytes
(safetensors' own writer orders metadata by hash, which differs run to run). Atomic: a temp
file in the target folder, then one rename, so no reader sees a half-written file.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeGuard

import numpy as np

from kvcanary_cli.dump.files import write_atomically
from kvcanary_cli.errors import DumpError

if TYPE_CHECKING:  # never imported here: see is_torch_tensor
    import torch

__all__ = [
    "STORED_DTYPES",
    "host_array",
    "is_torch_tensor",
    "safetensors_dtype_of",
    "safetensors_writer",
    "write_safetensors",
]

#: safetensors dtype strings of the (little-endian) numpy dtypes kvcanary reads and writes.
#: (The unsigned ones beyond uint8 hold a shrunk dump's narrowed elements and runs.)
STORED_DTYPES: dict[str, np.dtype] = {
    "U8": np.dtype("<u1"),
    "I8": np.dtype("<i1"),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
}
_BY_KIND = {(dtype.kind, dtype.itemsize): name for name, dtype in STORED_DTYPES.items()}


def safetensors_dtype_of(dtype: object) -> str | None:
    """The safetensors dtype string of a numpy dtype (either byte order), or None when
    kvcanary does not store it. A torch dtype is read by its name, without importing torch."""
    if dtype is None:  # np.dtype(None) is float64
        return None
    text = str(dtype)
    spelled: Any = text[len("torch.") :] if text.startswith("torch.") else dtype
    try:
        resolved = np.dtype(spelled)
    except TypeError:
        return None
    return _BY_KIND.get((resolved.kind, resolved.itemsize))


def is_torch_tensor(value: object) -> TypeGuard[torch.Tensor]:
    """Whether `value` is a torch tensor, without importing torch (a tensor can only exist
    where its owner imported it)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def host_array(value: object) -> np.ndarray | None:
    """`value` as a numpy array in host memory when it is a numpy array or a torch tensor
    (on any device, copied to the CPU); None for anything else.

    Torch is never imported here: a tensor can only exist where its owner imported torch.
    Raises TypeError for a tensor numpy has no dtype for (bfloat16, say).
    """
    if isinstance(value, np.ndarray):
        return value
    if not is_torch_tensor(value):
        return None
    tensor = value.detach().to("cpu").resolve_conj().resolve_neg()
    array: np.ndarray = tensor.numpy()
    return array


def write_safetensors(
    path: str | os.PathLike[str],
    tensors: Mapping[str, np.ndarray],
    metadata: dict[str, str],
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
    overwrite: bool = True,
) -> Path:
    """Write integer arrays as a safetensors file, through `write_atomically` (torch
    tensors are taken too, through `host_array`)."""
    return write_atomically(
        path, safetensors_writer(tensors, metadata), inputs=inputs, overwrite=overwrite
    )


def safetensors_writer(
    tensors: Mapping[str, np.ndarray], metadata: dict[str, str]
) -> Callable[[BinaryIO], None]:
    """What writes these arrays as a safetensors file to a handle: for
    `dump.files.write_all_atomically`, where a dump is one of several files written together."""
    return lambda handle: _write(handle, tensors, metadata)


def _stored_array(name: str, value: object) -> tuple[np.ndarray, str]:
    """`value` as a C-contiguous little-endian array, and its safetensors dtype string."""
    try:
        array = host_array(value)
    except TypeError as exc:
        raise DumpError(
            f"dtype {getattr(value, 'dtype', '?')} cannot be stored", field=name
        ) from exc
    if array is None:
        raise DumpError(f"a {type(value).__name__} is not an array", field=name)
    dtype = safetensors_dtype_of(array.dtype)
    if dtype is None:
        raise DumpError(f"dtype {array.dtype} cannot be stored", field=name)
    # not np.ascontiguousarray, which makes a 0-d array 1-d
    return np.asarray(array, dtype=STORED_DTYPES[dtype], order="C"), dtype


def _write(handle: BinaryIO, tensors: Mapping[str, object], metadata: dict[str, str]) -> None:
    header: dict[str, object] = {"__metadata__": dict(sorted(metadata.items()))}
    blobs: list[memoryview] = []
    offset = 0
    for name in sorted(tensors):
        array, dtype = _stored_array(name, tensors[name])
        # A flat byte view, no copy: a 2 GB table must not need 4 GB to be written.
        blob = array.reshape(-1).view(np.uint8).data
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + blob.nbytes],
        }
        blobs.append(blob)
        offset += blob.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # keep the data 8-byte aligned, as safetensors does
    write = handle.write
    write(len(text).to_bytes(8, "little"))
    write(text)
    for blob in blobs:
        write(blob)
