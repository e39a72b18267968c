"""The violation ring (docs/canary.md §4): fill-once, overflow, a wrapped counter; multisets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcanary_cli.canary.ring import decode_ring, encode_ring
from kvcanary_cli.canary.ring_rows import RowOrigin, ViolationRows, multiset_difference

I64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
ROWS = st.lists(st.lists(I64, min_size=8, max_size=8), max_size=12)


@given(ROWS, st.integers(min_value=1, max_value=8))
def test_fill_once_keeps_the_first_rows_and_counts_them_all(
    rows: list[list[int]], capacity: int
) -> None:
    ring, write_index = encode_ring(np.array(rows, dtype=np.int64).reshape(-1, 8), capacity)
    state = decode_ring(ring, write_index)
    assert state.write_index == len(rows)
    assert state.valid == min(len(rows), capacity)
    assert state.overflow == (len(rows) > capacity)
    assert state.rows.tolist() == rows[:capacity]
    assert state.stray_rows == 0


def test_rows_past_the_write_index_are_ignored_and_counted() -> None:
    ring = np.zeros((6, 8), dtype=np.int64)
    ring[:2] = 1
    ring[4] = 7
    state = decode_ring(ring, 2)
    assert state.valid == 2 and state.stray_rows == 1 and not state.overflow


def test_a_negative_counter_reads_a_full_overflowed_ring() -> None:
    ring = np.arange(32, dtype=np.int64).reshape(4, 8)
    state = decode_ring(ring, -5)
    assert state.wrapped and state.overflow and state.valid == 4


def test_multiset_difference_counts_duplicates() -> None:
    a = np.array([[1] * 8, [1] * 8, [2] * 8], dtype=np.int64)
    b = np.array([[2] * 8, [1] * 8, [3] * 8], dtype=np.int64)
    matched, only_a, only_b = multiset_difference(a, b)
    assert matched == 2 and only_a.tolist() == [1] and only_b.tolist() == [2]
    assert multiset_difference(a[:0], b[:0])[0] == 0


@pytest.mark.slow
@given(ROWS, st.randoms())
def test_multiset_ignores_order(rows: list[list[int]], rnd: object) -> None:
    shuffled = list(rows)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    matched, a, b = multiset_difference(
        np.array(rows).reshape(-1, 8), np.array(shuffled).reshape(-1, 8)
    )
    assert (matched, a.size, b.size) == (len(rows), 0, 0)


def test_group_and_buffer_masks() -> None:
    tags = [0, 1, 2, 4, 6, 9, 10, 77, -1]
    rows = ViolationRows.build(
        np.array([[t] + [0] * 7 for t in tags], dtype=np.int64), origin=RowOrigin.RING
    )
    assert rows.group_mask("swa").tolist() == [t in (6, 9, 10) for t in tags]
    assert rows.buffer_mask("tail.k").tolist() == [t in (2, 4, 10) for t in tags]
    assert rows.buffer_mask("tail.v").tolist() == [t == 9 for t in tags]
