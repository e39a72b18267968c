"""Real-KV sources and the fingerprint a TAIL record must hold (docs/canary.md §3).

A dump carries a source as `real_kv.<group>.<k|v>` (uint8 `[rows, row_bytes]`: layer 0 of the
K or V cache viewed as bytes) and describes it in its metadata: `real_kv.mode` (`none`,
`partial`, `all`), `real_kv.page_size` (default 1), `real_kv.num_bytes_per_token` (default
`row_bytes / page_size`) and `real_kv.read_bytes` (default: all of a token's bytes). HEAD
records never carry a fingerprint (expected 0); TAIL records are checked only when the dump
says how they were fingerprinted.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from kvcanary_cli.canary.hashing import as_int64, combine_source_hashes, fold_chunks
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import parse_integer
from kvcanary_cli.dump.tensor import StoredTensor
from kvcanary_cli.errors import MetadataError, TensorShapeError
from kvcanary_cli.safe_text import excerpt

__all__ = ["RealKvMode", "RealKvSetup", "RealKvSource", "expected_real_kv", "real_kv_setup"]

#: bytes folded per token in partial mode, whatever `read_bytes` says.
PARTIAL_BYTES = 16


class RealKvMode(StrEnum):
    """SGLang's `--kv-canary-real-data`."""

    NONE = "none"
    PARTIAL = "partial"
    ALL = "all"


@dataclass(frozen=True, kw_only=True)
class RealKvSource:
    """One source: the bytes and how a slot's bytes are found in them."""

    name: str
    #: uint8 `[rows, row_bytes]` (sparse in a shrunk dump).
    data: StoredTensor
    page_size: int
    num_bytes_per_token: int
    read_bytes: int


@dataclass(frozen=True, kw_only=True)
class RealKvSetup:
    """How the dump's TAIL records were fingerprinted; `mode` None: the dump does not say."""

    mode: RealKvMode | None
    sources: dict[tuple[str, str], RealKvSource]


def _int_key(dump: KvDump, key: str, default: int) -> int:
    text = dump.metadata.get(key)
    if text is None:
        return default
    value = parse_integer(text)
    if value is None or value <= 0:
        raise MetadataError(f"metadata value {excerpt(text)} is not a positive integer", field=key)
    return value


def real_kv_setup(dump: KvDump) -> RealKvSetup:
    """Read and check the dump's real-KV mode and sources (bad values are bad input)."""
    text = dump.metadata.get("real_kv.mode")
    mode: RealKvMode | None = None
    if text is not None:
        try:
            mode = RealKvMode(text.strip())
        except ValueError:
            raise MetadataError(
                f"metadata value {text!r} is not none, partial or all", field="real_kv.mode"
            ) from None
    sources: dict[tuple[str, str], RealKvSource] = {}
    for name, data in sorted(dump.real_kv_sources.items()):
        _, group, half = name.split(".")
        width = int(data.shape[1])
        page = _int_key(dump, "real_kv.page_size", 1)
        per_token = _int_key(dump, "real_kv.num_bytes_per_token", max(width // page, 1))
        read = _int_key(dump, "real_kv.read_bytes", per_token)
        if per_token % 16:
            raise MetadataError(
                f"is {per_token}; upstream needs a positive multiple of 16",
                field="real_kv.num_bytes_per_token",
            )
        if read % 16 or read > per_token:
            raise MetadataError(
                f"is {read}; upstream needs a multiple of 16 of at most num_bytes_per_token "
                f"({per_token})",
                field="real_kv.read_bytes",
            )
        if width % 16 or width < page * per_token:
            raise TensorShapeError(
                f"rows of {width} bytes; upstream needs a multiple of 16 holding "
                f"page_size x num_bytes_per_token = {page * per_token} bytes",
                field=name,
            )
        sources[(group, half)] = RealKvSource(
            name=name, data=data, page_size=page, num_bytes_per_token=per_token, read_bytes=read
        )
    return RealKvSetup(mode=mode, sources=sources)


def expected_real_kv(
    setup: RealKvSetup, group: str, buffer: str, slots: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """The real_kv_hash each slot's record must hold in `buffer` (`head.k`, `tail.v`, ...),
    and whether it is known; None when the check cannot be made at all.

    HEAD: 0 (no sources). TAIL: 0 in mode none, else the fingerprint of the slot's bytes in
    the group's source for that half; unknown for slots outside the source. None for TAIL
    when the dump records no mode, or a mode without the source.
    """
    slots = np.asarray(slots, dtype=np.int64)
    zeros = np.zeros(slots.shape, dtype=np.int64)
    known = np.ones(slots.shape, dtype=bool)
    stage, half = buffer.split(".")
    if stage == "head" or setup.mode is RealKvMode.NONE:
        return zeros, known
    source = setup.sources.get((group, half))
    if setup.mode is None or source is None:
        return None
    eff = PARTIAL_BYTES if setup.mode is RealKvMode.PARTIAL else source.read_bytes
    rows, width = source.data.shape
    row = slots // source.page_size
    inside = (slots >= 0) & (row < rows)
    base = np.where(
        inside, row * width + (slots % source.page_size) * source.num_bytes_per_token, 0
    )
    flat = base[:, None] + np.arange(eff, dtype=np.int64)[None, :]
    read, kept = source.data.take_known(flat.reshape(-1))
    chunk = read.astype(np.uint8).reshape(flat.shape)
    inside &= kept.reshape(flat.shape).all(axis=1)  # a shrunk dump may not keep the bytes
    values = as_int64(combine_source_hashes([fold_chunks(chunk)]))
    return np.where(inside, values, 0), inside
