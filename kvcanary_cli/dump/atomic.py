"""Deterministic safetensors writes, through the safe atomic writer of `dump.files`.

Deterministic: tensors and metadata keys are sorted, so the same content gives the same bytes
(safetensors' own writer orders metadata by hash, which differs run to run). Atomic: a temp
file in the target folder, then one rename, so no reader sees a half-written file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from kvcanary_cli.dump.files import write_atomically
from kvcanary_cli.errors import DumpError

__all__ = ["TORCH_DTYPES", "safetensors_dtype_of", "write_safetensors"]

#: safetensors dtype strings of the torch dtypes kvcanary reads and writes.
TORCH_DTYPES: dict[str, torch.dtype] = {
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
}


def safetensors_dtype_of(dtype: torch.dtype) -> str | None:
    """The safetensors dtype string of a torch dtype, or None when kvcanary does not store it."""
    for name, candidate in TORCH_DTYPES.items():
        if candidate == dtype:
            return name
    return None


def write_safetensors(
    path: str | os.PathLike[str],
    tensors: Mapping[str, torch.Tensor],
    metadata: dict[str, str],
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
    overwrite: bool = True,
) -> Path:
    """Write contiguous CPU tensors as a safetensors file, through `write_atomically`."""
    return write_atomically(
        path, lambda handle: _write(handle, tensors, metadata), inputs=inputs, overwrite=overwrite
    )


def _write(handle: BinaryIO, tensors: Mapping[str, torch.Tensor], metadata: dict[str, str]) -> None:
    header: dict[str, object] = {"__metadata__": dict(sorted(metadata.items()))}
    blobs: list[memoryview] = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        dtype = safetensors_dtype_of(tensor.dtype)
        if dtype is None:
            raise DumpError(f"dtype {tensor.dtype} cannot be stored", field=name)
        # A flat byte view, no copy: a 2 GB table must not need 4 GB to be written.
        blob = tensor.numpy().reshape(-1).view(np.uint8).data
        header[name] = {
            "dtype": dtype,
            "shape": list(tensor.shape),
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
