"""`ColumnFill` fills a column in place with the values and dtype `np.concatenate` gives the
same narrow pieces (what a plan's entries and the live cells were joined with)."""

from __future__ import annotations

import numpy as np
import pytest

from kvcanary_cli.planners.base import ColumnFill, held_narrow


def _filled(pieces: list[np.ndarray]) -> np.ndarray:
    column = ColumnFill(sum(p.size for p in pieces))
    for piece in pieces:
        column.put(piece)
    return column.column()


@pytest.mark.parametrize(
    "values",
    [
        [[1, 2, 3], [4, 5]],  # one dtype throughout: never widened
        [[1, -1], [300, 2], [7]],  # widened at the second piece, what was filled kept
        [[5], [], [70_000, -70_000], [1, 2]],  # an empty piece decides nothing
        [[2**40], [1]],  # a piece no narrow dtype holds stays int64
    ],
)
def test_a_filled_column_is_the_pieces_joined(values: list[list[int]]) -> None:
    pieces = [held_narrow(np.array(v, dtype=np.int64)) for v in values]
    joined = np.concatenate([p for p in pieces if p.size])
    filled = _filled(pieces)
    assert filled.dtype == joined.dtype
    assert filled.tolist() == joined.tolist()


def test_a_column_of_narrow_pieces_stays_narrow() -> None:
    filled = _filled([held_narrow(np.arange(k, k + 5, dtype=np.int64)) for k in range(3)])
    assert filled.dtype == np.int8 and filled.tolist() == [
        k + i for k in range(3) for i in range(5)
    ]


def test_an_empty_column_is_int64() -> None:
    assert _filled([]).dtype == np.int64 and _filled([]).size == 0


def test_a_column_not_filled_is_refused() -> None:
    column = ColumnFill(3)
    column.put(np.array([1, 2], dtype=np.int8))
    with pytest.raises(AssertionError):
        column.column()
