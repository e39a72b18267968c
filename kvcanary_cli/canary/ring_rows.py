"""`ViolationRows`: violation-ring rows from any origin, columnar (docs/canary.md §4).

A ring, a log and a replay all produce the same eight int64 fields per row; this table keeps
them side by side with where each row came from and what is known about it, so decoding,
filtering, comparing and explaining stay vectorized whatever the number of rows.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from enum import IntEnum

import numpy as np

from kvcanary_cli.canary.constants import LaunchTag, buffer_of_tag, group_of_tag

__all__ = ["RowOrigin", "ViolationRows", "multiset_difference"]


class RowOrigin(IntEnum):
    """Where a row was read: a dump's ring, a log line, a log message alone, or a replay."""

    RING = 0
    LOG = 1
    LOG_MESSAGE = 2
    REPLAY = 3

    @property
    def label(self) -> str:
        """`ring`, `log`, `log-message` or `replay`."""
        return self.name.lower().replace("_", "-")


def _column(values: object, n: int) -> np.ndarray:
    if values is None:
        return np.full(n, -1, dtype=np.int64)
    return np.asarray(values, dtype=np.int64).reshape(n)


@dataclass(frozen=True, kw_only=True)
class ViolationRows:
    """Rows of 8 fields (int64 `[n, 8]`) and per-row facts (int64 `[n]`, -1 when unknown)."""

    fields: np.ndarray
    origin: np.ndarray
    #: index of the row's source in the report's list of sources.
    source: np.ndarray
    #: ring row index, 1-based log line number, or replay order.
    index: np.ndarray
    #: from a log message's pump line: the write index at pump time, overflow (0/1), step.
    total_violations: np.ndarray
    ring_overflow: np.ndarray
    step_when_pumped: np.ndarray
    #: replay only: the verify entry that failed (batch row, expected position, prev slot).
    batch_row: np.ndarray
    expected_position: np.ndarray
    prev_slot: np.ndarray

    @classmethod
    def build(
        cls,
        field_rows: np.ndarray,
        *,
        origin: RowOrigin | np.ndarray,
        source: int = 0,
        index: object = None,
        total_violations: object = None,
        ring_overflow: object = None,
        step_when_pumped: object = None,
        batch_row: object = None,
        expected_position: object = None,
        prev_slot: object = None,
    ) -> ViolationRows:
        """Rows from an `[n, 8]` array; missing facts are -1, `index` defaults to 0..n-1."""
        data = np.asarray(field_rows, dtype=np.int64).reshape(-1, 8)
        n = data.shape[0]
        origins = (
            np.full(n, int(origin), dtype=np.int64)
            if isinstance(origin, RowOrigin)
            else _column(origin, n)
        )
        return cls(
            fields=data,
            origin=origins,
            source=np.full(n, source, dtype=np.int64),
            index=np.arange(n, dtype=np.int64) if index is None else _column(index, n),
            total_violations=_column(total_violations, n),
            ring_overflow=_column(ring_overflow, n),
            step_when_pumped=_column(step_when_pumped, n),
            batch_row=_column(batch_row, n),
            expected_position=_column(expected_position, n),
            prev_slot=_column(prev_slot, n),
        )

    @classmethod
    def empty(cls) -> ViolationRows:
        """No rows."""
        return cls.build(np.zeros((0, 8), dtype=np.int64), origin=RowOrigin.RING)

    @classmethod
    def concat(cls, parts: list[ViolationRows]) -> ViolationRows:
        """All rows of `parts`, in order."""
        if not parts:
            return cls.empty()
        return cls(
            **{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)}
        )

    def __len__(self) -> int:
        return int(self.fields.shape[0])

    def select(self, mask: np.ndarray) -> ViolationRows:
        """The rows where `mask` holds (a boolean mask or an index array)."""
        return replace(self, **{f.name: getattr(self, f.name)[mask] for f in fields(self)})

    def with_source(self, source: int) -> ViolationRows:
        """The same rows attributed to source number `source`."""
        return replace(self, source=np.full(len(self), source, dtype=np.int64))

    @property
    def tag(self) -> np.ndarray:
        """Field 0, the launch tag."""
        return self.fields[:, 0]

    @property
    def slot(self) -> np.ndarray:
        """Field 1, the slot (in the tag's slot space)."""
        return self.fields[:, 1]

    @property
    def bits(self) -> np.ndarray:
        """Field 7, the fail-reason bits."""
        return self.fields[:, 7]

    def group_mask(self, group: str) -> np.ndarray:
        """Rows whose tag belongs to `group` (`full` or `swa`); unknown tags never match."""
        known = (self.tag >= 0) & (self.tag < len(LaunchTag))
        wanted = np.array([group_of_tag(int(t)) == group for t in LaunchTag], dtype=bool)
        return np.asarray(known & wanted[np.clip(self.tag, 0, len(LaunchTag) - 1)], dtype=bool)

    def buffer_mask(self, buffer: str) -> np.ndarray:
        """Rows whose launch reads `buffer` (`head.k`, ...; sweeps read the tail buffers)."""
        known = (self.tag >= 0) & (self.tag < len(LaunchTag))
        wanted = np.array([buffer_of_tag(int(t)) == buffer for t in LaunchTag], dtype=bool)
        return np.asarray(known & wanted[np.clip(self.tag, 0, len(LaunchTag) - 1)], dtype=bool)


def multiset_difference(left: np.ndarray, right: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """Compare two `[n, 8]` row sets as multisets.

    Returns (matched rows, indices of `left` rows without a partner, indices of `right` rows
    without a partner); within equal rows, the first ones are the matched ones.
    """
    left = np.asarray(left, dtype=np.int64).reshape(-1, 8)
    right = np.asarray(right, dtype=np.int64).reshape(-1, 8)
    both = np.concatenate([left, right])
    if both.shape[0] == 0:
        return 0, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    _, inverse = np.unique(both, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    groups = int(inverse.max()) + 1
    left_ids, right_ids = inverse[: left.shape[0]], inverse[left.shape[0] :]
    left_count = np.bincount(left_ids, minlength=groups)
    right_count = np.bincount(right_ids, minlength=groups)
    matched = int(np.minimum(left_count, right_count).sum())
    return matched, _extra(left_ids, right_count), _extra(right_ids, left_count)


def _extra(ids: np.ndarray, partner_count: np.ndarray) -> np.ndarray:
    """Indices of rows beyond the partner side's count of their value (stable)."""
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
    run_start = np.repeat(starts, np.diff(np.r_[starts, sorted_ids.size]))
    rank = np.arange(sorted_ids.size) - run_start
    return np.sort(order[rank >= partner_count[sorted_ids]])
