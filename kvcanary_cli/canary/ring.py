"""The violation ring (docs/canary.md §4): fill-once decoding and encoding.

Every violation takes the next sequence number from the write index; only numbers below the
ring's capacity get a row. So row 0 is the first violation ever, the valid rows are
`min(write_index, capacity)`, and `write_index > capacity` means later violations were
counted but dropped. Everything here is array slicing: no loop over ring rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["RingState", "decode_ring", "encode_ring"]


@dataclass(frozen=True, kw_only=True)
class RingState:
    """A decoded ring: its valid rows (oldest first) and what its counter says."""

    capacity: int
    #: violations ever recorded, as stored (the int32 counter).
    write_index: int
    #: rows holding a violation: `min(write_index, capacity)`.
    valid: int
    #: more violations than rows: the newest were dropped.
    overflow: bool
    #: a negative counter: the int32 wrapped after 2^31 violations (read as full).
    wrapped: bool
    #: rows past `valid` that are not all zero (a zero-initialised ring should have none).
    stray_rows: int
    #: int64 `[valid, 8]`.
    rows: np.ndarray


def decode_ring(ring: np.ndarray, write_index: int) -> RingState:
    """The valid rows of a ring `[capacity, 8]` given its write index."""
    data = np.asarray(ring, dtype=np.int64)
    capacity = int(data.shape[0])
    wrapped = write_index < 0
    valid = capacity if wrapped else min(write_index, capacity)
    rest = data[valid:]
    return RingState(
        capacity=capacity,
        write_index=write_index,
        valid=valid,
        overflow=wrapped or write_index > capacity,
        wrapped=wrapped,
        stray_rows=int(np.count_nonzero(rest.any(axis=1))) if rest.size else 0,
        rows=np.array(data[:valid], dtype=np.int64),
    )


def encode_ring(rows: np.ndarray, capacity: int) -> tuple[np.ndarray, int]:
    """The ring and write index after recording `rows` in order into an empty ring."""
    data = np.asarray(rows, dtype=np.int64).reshape(-1, 8)
    ring = np.zeros((capacity, 8), dtype=np.int64)
    kept = min(capacity, data.shape[0])
    ring[:kept] = data[:kept]
    return ring, int(data.shape[0])
