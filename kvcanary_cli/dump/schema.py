"""The dump format v1 as data (transcribed from docs/dump-format.md).

The loader, the writer, `inspect` and `--help` all read these tables, so the format is
written down exactly once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "CANARY_TENSOR_PATTERN",
    "DTYPE_ITEMSIZE",
    "FORMAT_VERSION",
    "INTEGER_DTYPES",
    "PROVENANCE_KEYS",
    "SCALARS",
    "TENSORS",
    "ScalarSpec",
    "TensorSpec",
    "dtype_label",
    "numpy_dtype",
    "parse_integer",
    "safetensors_dtype_of",
    "spec_for",
    "torch_dtype",
]

FORMAT_VERSION = "1"

#: Byte size of every dtype string safetensors defines. Anything else in a header is corrupt.
DTYPE_ITEMSIZE: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
    "F4": 1,
    "F6_E2M3": 1,
    "F6_E3M2": 1,
}

#: Integer dtypes kvcanary can read (as little-endian numpy dtypes).
INTEGER_DTYPES: dict[str, str] = {
    "U8": "<u1",
    "I8": "<i1",
    "I16": "<i2",
    "U16": "<u2",
    "I32": "<i4",
    "U32": "<u4",
    "I64": "<i8",
    "U64": "<u8",
}

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
}


_INTEGER_TEXT = re.compile(r"-?[0-9]+")


def parse_integer(text: str) -> int | None:
    """A metadata integer: optional minus sign and ASCII digits, nothing else (None if not).

    Stricter than `int()`, which also takes "1_0", "+5" and non-ASCII digits.
    """
    stripped = text.strip()
    return int(stripped) if _INTEGER_TEXT.fullmatch(stripped) else None


def dtype_label(dtype: str) -> str:
    """Human name of a safetensors dtype string (`I64` -> `int64`)."""
    special = {"BOOL": "bool", "BF16": "bfloat16"}
    kind = {"I": "int", "U": "uint", "F": "float"}.get(dtype[0])
    if dtype in special or kind is None or not dtype[1:].isdigit():
        return special.get(dtype, dtype.lower())
    return f"{kind}{dtype[1:]}"


def numpy_dtype(dtype: str) -> np.dtype:
    """Little-endian numpy dtype of a safetensors integer dtype string."""
    return np.dtype(INTEGER_DTYPES[dtype])


def torch_dtype(dtype: str) -> torch.dtype:
    """torch dtype of a safetensors dtype string kvcanary reads as a tensor."""
    return _TORCH_DTYPES[dtype]


def safetensors_dtype_of(dtype: torch.dtype) -> str | None:
    """The safetensors dtype string of a torch dtype, or None when the format has none."""
    for name, candidate in _TORCH_DTYPES.items():
        if candidate == dtype:
            return name
    return None


@dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """One tensor of the format: its canonical dtype, what else is accepted, and its role."""

    name: str
    #: dtype the production GPU path requires.
    canonical: str
    #: other dtypes read as if they were the canonical one (with a `gpu-dtype-mismatch` note).
    accepted: tuple[str, ...]
    #: number of dimensions; (0, 1) for scalars stored as tensors.
    ranks: tuple[int, ...]
    required: bool
    #: 'bs' when the first dimension must equal the batch size.
    length: str | None
    role: str

    @property
    def dtypes(self) -> tuple[str, ...]:
        """Every dtype the format accepts for this tensor."""
        return (self.canonical, *self.accepted)


def _t(
    name: str,
    canonical: str,
    accepted: tuple[str, ...],
    rank: int,
    required: bool,
    length: str | None,
    role: str,
) -> TensorSpec:
    return TensorSpec(
        name=name,
        canonical=canonical,
        accepted=accepted,
        ranks=(rank,),
        required=required,
        length=length,
        role=role,
    )


TENSORS: dict[str, TensorSpec] = {
    spec.name: spec
    for spec in (
        _t("req_to_token", "I32", ("I64",), 2, True, None,
           "full-pool slot per (pool row, position); row 0 is padding"),
        _t("req_pool_indices", "I64", ("I32",), 1, True, "bs",
           "pool row per batch row; 0 = padding"),
        _t("prefix_lens", "I64", ("I32",), 1, True, "bs",
           "tokens already in the KV cache before this step"),
        _t("extend_seq_lens", "I64", ("I32",), 1, False, "bs",
           "tokens written this step (default zeros)"),
        _t("full_to_swa_index_mapping", "I64", ("I32",), 1, False, None,
           "SWA LUT: full slot -> SWA slot (0 = unmapped); enables the swa group"),
        _t("req_to_verify_expected_tokens", "I32", ("I64",), 2, False, None,
           "expected-token pool (pool row, token index)"),
        _t("req_to_verify_expected_tokens_valid_lens", "I64", ("I32",), 1, False, "bs",
           "valid tokens in each batch row's expected-token pool row"),
        _t("out_cache_loc", "I64", ("I32",), 1, False, None,
           "full-pool slots written this step, flat in batch-row order"),
        _t("input_ids", "I64", ("I32",), 1, False, None, "tokens written this step"),
        _t("positions", "I64", ("I32",), 1, False, None, "positions written this step"),
        _t("free_full_slots", "I64", ("I32",), 1, False, None,
           "full-pool slots the allocator holds as free"),
        _t("free_swa_slots", "I64", ("I32",), 1, False, None,
           "SWA-pool slots the SWA allocator holds as free"),
        _t("violation_ring", "I64", (), 2, False, None, "violation ring rows [capacity, 8]"),
        TensorSpec(name="violation_write_index", canonical="I32", accepted=("I64",),
                   ranks=(0, 1), required=False, length=None,
                   role="violations ever recorded"),
    )
}

#: `canary.<group>.<head|tail>.<k|v>` buffers: uint8 [num_slots, slot_stride_bytes].
CANARY_TENSOR_PATTERN = re.compile(r"^canary\.(full|swa)\.(head|tail)\.(k|v)$")


def spec_for(name: str) -> TensorSpec | None:
    """The spec of a tensor name, including the canary buffer family; None if unknown."""
    if name in TENSORS:
        return TENSORS[name]
    if CANARY_TENSOR_PATTERN.match(name):
        return TensorSpec(name=name, canonical="U8", accepted=(), ranks=(2,), required=False,
                          length=None, role="canary buffer [num_slots, slot_stride_bytes]")
    return None


@dataclass(frozen=True, kw_only=True)
class ScalarSpec:
    """One scalar: where its default comes from and the CLI option that overrides it."""

    name: str
    option: str | None
    default: str
    meaning: str


SCALARS: dict[str, ScalarSpec] = {
    spec.name: spec
    for spec in (
        ScalarSpec(name="swa_window_size", option="--swa-window", default="none",
                   meaning="window W of the swa group; required with a LUT"),
        ScalarSpec(name="verify_capacity", option="--verify-capacity",
                   default="total requested entries", meaning="verify capacity of each plan"),
        ScalarSpec(name="write_req_capacity", option="--write-req-capacity", default="bs",
                   meaning="length of write_seed_slot_indices"),
        ScalarSpec(name="kv_token_id_vs_position_offset", option="--token-offset", default="0",
                   meaning="0 for target pools, 1 for EAGLE draft pools"),
        ScalarSpec(name="page_size", option="--page-size", default="1", meaning="KV page size"),
        ScalarSpec(name="num_full_slots", option="--num-full-slots",
                   default="lut_len - 1 with a LUT, else unknown",
                   meaning="rows of the full KV pool (size + page_size)"),
        ScalarSpec(name="num_swa_slots", option="--num-swa-slots", default="unknown",
                   meaning="rows of the SWA KV pool"),
    )
}

#: Free-form keys shown by `inspect` and in reports.
PROVENANCE_KEYS: tuple[str, ...] = (
    "sglang.version",
    "sglang.commit",
    "model",
    "rank",
    "step",
    "forward_mode",
    "captured_at",
    "note",
)
