"""Slot records of canary buffers, decoded columnar (docs/canary.md §1).

A canary buffer is uint8 `[num_slots, stride]`; slot `s` keeps four little-endian int64 in
the first 32 bytes of its row: token, position, prev_hash (the chain hash entering the slot)
and real_kv_hash. Reads gather only the rows asked for, so a memory-mapped 32 MB buffer costs
what the plan touches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcanary_cli.canary.constants import BUFFERS, RECORD_BYTES, buffer_tensor_name
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.tensor import StoredTensor

__all__ = ["Records", "dump_buffers", "read_records"]


@dataclass(frozen=True, kw_only=True)
class Records:
    """Records of some slots (int64 columns of equal length)."""

    token: np.ndarray
    position: np.ndarray
    prev_hash: np.ndarray
    real_kv_hash: np.ndarray
    #: per slot: its 32 bytes are not all zero (a slot that was written at least once).
    written: np.ndarray
    #: per slot: the record is in the dump (False where a shrunk dump did not keep it).
    known: np.ndarray

    def __len__(self) -> int:
        return int(self.token.shape[0])

    def subset(self, mask: np.ndarray) -> Records:
        """The records where `mask` is True."""
        return Records(
            token=self.token[mask],
            position=self.position[mask],
            prev_hash=self.prev_hash[mask],
            real_kv_hash=self.real_kv_hash[mask],
            written=self.written[mask],
            known=self.known[mask],
        )


def read_records(buffer: StoredTensor, slots: np.ndarray) -> Records:
    """Records of `slots` (each in `[0, num_slots)`; the caller masks the others)."""
    if len(buffer.shape) != 2 or buffer.shape[1] < RECORD_BYTES:
        raise ValueError(f"a canary buffer needs rows of >= {RECORD_BYTES} bytes")
    index = np.asarray(slots, dtype=np.int64).reshape(-1)
    # a shrunk dump keeps only some records: the others are not known
    cells, known = buffer.rows(index, RECORD_BYTES)
    raw = np.ascontiguousarray(cells, dtype=np.uint8)
    words = raw.view("<i8").reshape(-1, 4).astype(np.int64)
    return Records(
        token=words[:, 0],
        position=words[:, 1],
        prev_hash=words[:, 2],
        real_kv_hash=words[:, 3],
        written=np.asarray(raw.any(axis=1), dtype=bool),
        known=known,
    )


def dump_buffers(dump: KvDump, group: str) -> list[tuple[str, StoredTensor]]:
    """The group's canary buffers in the dump, as (`head.k`, ...) in launch order (K before V).

    Buffers whose rows are narrower than a record are left out (upstream refuses them).
    """
    found = []
    for buffer in BUFFERS:
        tensor = dump.canary_buffers.get(buffer_tensor_name(group, buffer))
        if tensor is not None and tensor.ndim == 2 and tensor.shape[1] >= RECORD_BYTES:
            found.append((buffer, tensor))
    return found
