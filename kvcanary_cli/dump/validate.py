"""Cross-tensor checks that separate "bad input, exit 2" from "findings, exit 1".

A dump is *bad input* when kvcanary cannot even say what the upstream planner would do with
it (lengths that disagree with bs, a LUT without a window, ...). Suspicious *values* in a
well-formed dump (negative lengths, rows out of range, bad slots) are findings, not errors:
they are what the user came to diagnose.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from kvcanary_cli.errors import (
    MetadataError,
    MissingTensorError,
    TensorShapeError,
    UsageError,
)

__all__ = ["MAX_LENGTH", "check_batch", "derive_scalar_defaults", "resolve_groups"]

#: Lengths beyond this are corrupt, not long: 2^40 tokens would be a 4 TB req_to_token row.
MAX_LENGTH = 1 << 40

_BATCH_VECTORS = (
    "prefix_lens",
    "extend_seq_lens",
    "req_to_verify_expected_tokens_valid_lens",
)


def check_batch(arrays: Mapping[str, np.ndarray], scalars: Mapping[str, int | None]) -> list[str]:
    """Check presence and agreement of the batch tensors; return notes for odd-but-legal input."""
    notes: list[str] = []
    for name in ("req_to_token", "req_pool_indices", "prefix_lens"):
        if name not in arrays:
            raise MissingTensorError(
                "required tensor is missing",
                tensor=name,
                hint="save it with kvcanary_cli.dump.save_dump(..., " + name + "=...)",
            )
    bs = int(arrays["req_pool_indices"].shape[0])
    for name in _BATCH_VECTORS:
        if name in arrays and int(arrays[name].shape[0]) != bs:
            raise TensorShapeError(
                f"has length {arrays[name].shape[0]}, expected bs={bs} "
                "(the length of req_pool_indices)",
                tensor=name,
            )
    for name in ("prefix_lens", "extend_seq_lens"):
        if name in arrays and arrays[name].size:
            # Python ints from min and max: numpy's abs(-2^63) overflows and would slip through.
            low, high = int(arrays[name].min()), int(arrays[name].max())
            worst = high if high >= -low else low
            if abs(worst) > MAX_LENGTH:
                raise TensorShapeError(
                    f"holds {worst}, beyond any real sequence length (> 2^40)",
                    tensor=name,
                    hint="the tensor is corrupt or holds something else",
                )
    has_pool = "req_to_verify_expected_tokens" in arrays
    has_valid = "req_to_verify_expected_tokens_valid_lens" in arrays
    if has_pool and not has_valid:
        raise MissingTensorError(
            "is required when req_to_verify_expected_tokens is present",
            tensor="req_to_verify_expected_tokens_valid_lens",
            hint="save the per-batch-row valid lengths, or drop the pool",
        )
    if has_valid and not has_pool:
        notes.append(
            "req_to_verify_expected_tokens_valid_lens is present without the pool: ignored"
        )
    if "full_to_swa_index_mapping" in arrays:
        if int(arrays["full_to_swa_index_mapping"].shape[0]) == 0:
            raise TensorShapeError(
                "is empty; upstream rejects a LUT of length 0",
                tensor="full_to_swa_index_mapping",
            )
        if scalars.get("swa_window_size") is None:
            raise MetadataError(
                "is required when full_to_swa_index_mapping is present",
                tensor="swa_window_size",
                hint="pass --swa-window W, or set swa_window_size in the dump's metadata",
            )
    window = scalars.get("swa_window_size")
    if window is not None and window < 0:
        notes.append(f"swa_window_size={window} is negative: planned as 0, like upstream")
    for name, minimum in (("verify_capacity", 0), ("write_req_capacity", 0), ("page_size", 1),
                          ("num_full_slots", 0), ("num_swa_slots", 0)):
        value = scalars.get(name)
        if value is not None and value < minimum:
            raise MetadataError(f"is {value}, must be >= {minimum}", tensor=name)
    _check_write_tensors(arrays)
    if "violation_write_index" in arrays and arrays["violation_write_index"].size != 1:
        raise TensorShapeError(
            f"has shape {list(arrays['violation_write_index'].shape)}, expected [] or [1]",
            tensor="violation_write_index",
        )
    if "violation_ring" in arrays:
        if "violation_write_index" not in arrays:
            raise MissingTensorError(
                "is required with violation_ring (it says how many rows are valid)",
                tensor="violation_write_index",
            )
        ring = arrays["violation_ring"]
        if ring.shape[1] != 8:
            raise TensorShapeError(
                f"has shape {list(ring.shape)}, expected [ring_capacity, 8]",
                tensor="violation_ring",
            )
    return notes


def _check_write_tensors(arrays: Mapping[str, np.ndarray]) -> None:
    if "out_cache_loc" not in arrays:
        for name in ("input_ids", "positions"):
            if name in arrays:
                raise MissingTensorError(
                    f"out_cache_loc is required alongside {name}", tensor="out_cache_loc"
                )
        return
    tokens = int(arrays["out_cache_loc"].shape[0])
    for name in ("input_ids", "positions"):
        if name in arrays and int(arrays[name].shape[0]) != tokens:
            raise TensorShapeError(
                f"has length {arrays[name].shape[0]}, expected {tokens} "
                "(the length of out_cache_loc)",
                tensor=name,
            )


def derive_scalar_defaults(
    scalars: Mapping[str, int | None], lut_len: int | None
) -> dict[str, tuple[int | None, str]]:
    """Values for scalars left at their default that the dump itself determines."""
    derived: dict[str, tuple[int | None, str]] = {}
    if scalars.get("num_full_slots") is None and lut_len is not None:
        derived["num_full_slots"] = (lut_len - 1, "derived (lut_len - 1)")
    if scalars.get("page_size") is None:
        derived["page_size"] = (1, "default")
    if scalars.get("kv_token_id_vs_position_offset") is None:
        derived["kv_token_id_vs_position_offset"] = (0, "default")
    return derived


def resolve_groups(text: str | None, *, has_lut: bool) -> tuple[str, ...]:
    """Parse the `groups` comma list (default: full, plus swa with a LUT)."""
    if text is None or not text.strip():
        return ("full", "swa") if has_lut else ("full",)
    names = [part.strip() for part in text.split(",") if part.strip()]
    if names == ["all"]:
        return ("full", "swa") if has_lut else ("full",)
    for name in names:
        if name not in ("full", "swa"):
            raise UsageError(
                f"unknown group {name!r} (expected full, swa or all)", tensor="groups"
            )
    if "swa" in names and not has_lut:
        raise UsageError(
            "group swa needs full_to_swa_index_mapping, which this dump lacks",
            tensor="groups",
            hint="plan --group full, or capture the LUT",
        )
    return tuple(dict.fromkeys(names))
