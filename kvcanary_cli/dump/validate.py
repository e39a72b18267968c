"""Cross-tensor checks that separate "bad input, exit 2" from "findings, exit 1".

A dump is *bad input* when kvcanary cannot even say what the upstream planner would do with
it (lengths that disagree with bs, a LUT without a window, ...). Suspicious *values* in a
well-formed dump (negative lengths, rows out of range, bad slots) are findings, not errors:
they are what the user came to diagnose.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from kvcanary_cli.dump.schema import SCALARS, TENSORS, Group, required_tensors
from kvcanary_cli.dump.tensor import StoredTensor
from kvcanary_cli.errors import (
    MetadataError,
    MissingTensorError,
    OptionError,
    TensorShapeError,
)

__all__ = ["check_batch", "derive_scalar_defaults", "resolve_groups"]


def check_batch(
    arrays: Mapping[str, np.ndarray | StoredTensor],
    scalars: Mapping[str, int | None],
    *,
    rejected: Mapping[str, str] | None = None,
) -> list[str]:
    """Check presence and agreement of the batch tensors; return notes for odd-but-legal input.

    `rejected`: scalars the dump records out of range (name -> why), now unknown.
    """
    notes: list[str] = []
    for name in required_tensors():
        if name not in arrays:
            raise MissingTensorError(
                "required tensor is missing",
                field=name,
                hint="save it with kvcanary_cli.dump.writer.save_dump(..., " + name + "=...)",
            )
    bs = int(arrays["req_pool_indices"].shape[0])
    for name, spec in TENSORS.items():
        if spec.per_batch_row and name in arrays and int(arrays[name].shape[0]) != bs:
            raise TensorShapeError(
                f"has length {arrays[name].shape[0]}, expected bs={bs} "
                "(the length of req_pool_indices)",
                field=name,
            )
    has_pool = "req_to_verify_expected_tokens" in arrays
    has_valid = "req_to_verify_expected_tokens_valid_lens" in arrays
    if has_pool and not has_valid:
        raise MissingTensorError(
            "is required when req_to_verify_expected_tokens is present",
            field="req_to_verify_expected_tokens_valid_lens",
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
                field="full_to_swa_index_mapping",
            )
        if scalars.get("swa_window_size") is None:
            why = (rejected or {}).get("swa_window_size")
            raise MetadataError(
                "is required when full_to_swa_index_mapping is present"
                if why is None
                else f"{why}: the swa group cannot be planned without a window",
                field="swa_window_size",
                hint="pass --set swa_window_size=W, or record it in the dump's metadata",
            )
    window = scalars.get("swa_window_size")
    if window is not None and window < 0:
        notes.append(f"swa_window_size={window} is negative: planned as 0, like upstream")
    _check_write_tensors(arrays)
    if "violation_write_index" in arrays and arrays["violation_write_index"].size != 1:
        raise TensorShapeError(
            f"has shape {list(arrays['violation_write_index'].shape)}, expected [] or [1]",
            field="violation_write_index",
        )
    if "violation_ring" in arrays:
        if "violation_write_index" not in arrays:
            raise MissingTensorError(
                "is required with violation_ring (it says how many rows are valid)",
                field="violation_write_index",
            )
        ring = arrays["violation_ring"]
        if ring.shape[1] != 8:
            raise TensorShapeError(
                f"has shape {list(ring.shape)}, expected [ring_capacity, 8]",
                field="violation_ring",
            )
    return notes


def _check_write_tensors(arrays: Mapping[str, np.ndarray | StoredTensor]) -> None:
    if "out_cache_loc" not in arrays:
        for name in ("input_ids", "positions"):
            if name in arrays:
                raise MissingTensorError(
                    f"out_cache_loc is required alongside {name}", field="out_cache_loc"
                )
        return
    tokens = int(arrays["out_cache_loc"].shape[0])
    for name in ("input_ids", "positions"):
        if name in arrays and int(arrays[name].shape[0]) != tokens:
            raise TensorShapeError(
                f"has length {arrays[name].shape[0]}, expected {tokens} "
                "(the length of out_cache_loc)",
                field=name,
            )


def derive_scalar_defaults(
    scalars: Mapping[str, int | None], lut_len: int | None
) -> dict[str, tuple[int | None, str]]:
    """Values for scalars left at their default that the dump itself determines."""
    derived: dict[str, tuple[int | None, str]] = {}
    if scalars.get("num_full_slots") is None and lut_len is not None:
        derived["num_full_slots"] = (lut_len - 1, "derived (lut_len - 1)")
    for name, spec in SCALARS.items():
        if scalars.get(name) is None and isinstance(spec.default, int):
            derived[name] = (spec.default, "default")
    return derived


def resolve_groups(
    text: str | None, *, has_lut: bool, option: str | None = None
) -> tuple[Group, ...]:
    """Parse a `groups` comma list (default: full, plus swa with a LUT).

    `option` names the command-line option the text came from (None: the dump's metadata), so
    that a bad value is blamed on the option or on the dump.
    """
    every = (Group.FULL, Group.SWA) if has_lut else (Group.FULL,)
    if text is None or not text.strip():
        return every
    names = [part.strip() for part in text.split(",") if part.strip()]
    if names == ["all"]:
        return every

    def bad(message: str, hint: str | None = None) -> Exception:
        if option is not None:
            return OptionError(message, option=option, hint=hint)
        return MetadataError(message, field="groups", hint=hint)

    for name in names:
        if name not in ("full", "swa"):
            raise bad(f"unknown group {name!r} (expected full, swa or all)")
    if "swa" in names and not has_lut:
        raise bad(
            "group swa needs full_to_swa_index_mapping, which this dump lacks",
            "plan the full group, or capture the LUT",
        )
    return tuple(Group(name) for name in dict.fromkeys(names))
