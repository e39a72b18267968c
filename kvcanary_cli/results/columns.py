"""`IntColumn`: a cell column of a record, as a read-only sequence of ints over the analysis'
numpy array (`CellColumns.__record__` gives its columns as these).

A finding group may stand for millions of cells. Its record carries every one (JSON lists
them all), but a table or Markdown view shows a few and counts the rest: a column that turned
every cell into a Python int before a view read three of them cost gigabytes for kilobytes of
output. So a record's cell column wraps the array: an entry read is converted when read, a
view that needs the whole column computes over the array (`numpy.asarray(column)`, no copy),
and JSON writes it in pieces (`json_pieces`). numpy is imported only when a column is built or
read: `kvcanary --help` never loads it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, overload, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

__all__ = ["JSON_SLICE", "Entries", "IntColumn", "TextEntries", "int_items"]


class Entries(Protocol):
    """What a column reads from: a one-dimensional integer array, or a column that decodes
    the entries asked for (`results.cells.RunColumn`)."""

    @property
    def shape(self) -> tuple[int, ...]:
        """`(entries,)`."""

    def __getitem__(self, index: Any, /) -> Any: ...
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray: ...


@runtime_checkable
class TextEntries(Entries, Protocol):
    """Entries that write their own JSON text (`results.cells.RunColumn`: a run of equal
    values as its text repeated)."""

    def json_items(self, start: int, stop: int) -> str:
        """Entries `[start, stop)` as the items of a compact JSON list, `1,2,3`."""


#: Entries converted to Python ints at a time when a column is iterated or written as JSON.
_PIECE = 1 << 16


class IntColumn(Sequence[int]):
    """The entries of a one-dimensional integer array as a read-only `Sequence[int]`."""

    __slots__ = ("_array",)

    def __init__(self, array: np.ndarray | Entries) -> None:
        self._array = array

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        import numpy as np

        return np.asarray(self._array, dtype=dtype)

    def __len__(self) -> int:
        return int(self._array.shape[0])

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> IntColumn: ...
    def __getitem__(self, index: int | slice) -> int | IntColumn:
        if isinstance(index, slice):
            return IntColumn(self._array[index])
        return int(self._array[index])

    def __iter__(self) -> Iterator[int]:
        for start in range(0, len(self), _PIECE):
            yield from self._array[start : start + _PIECE].tolist()

    def __eq__(self, other: object) -> bool:
        """Equal to a column or a list of the same ints, in order."""
        import numpy as np

        if isinstance(other, IntColumn):
            return bool(np.array_equal(self._array, other._array))
        if isinstance(other, list | tuple):
            return len(other) == len(self) and self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to a list, which has no hash

    def __repr__(self) -> str:
        """Short, whatever the length: `printable_record` reads a record's repr to learn
        whether any string needs escaping (an int never does)."""
        return f"IntColumn(<{len(self)} ints>)"

    def tolist(self) -> list[int]:
        """Every entry as a Python int (what a JSON parser gives back)."""
        return list(self)

    def json_pieces(self) -> Iterator[str]:
        """The column as a compact JSON list, `[1,2,3]`, in pieces converted one at a time
        (by the entries themselves where they write their own text)."""
        entries, size = self._array, len(self)
        own_text = entries.json_items if isinstance(entries, TextEntries) else None
        yield "["
        for start in range(0, size, JSON_SLICE):
            stop = min(start + JSON_SLICE, size)
            if own_text is not None:
                text = own_text(start, stop)
            else:
                text = int_items(entries[start:stop].tolist())
            yield text if start == 0 else "," + text
        yield "]"


#: Entries of an integer list converted to JSON text at a time (their ints and text: a few
#: hundred KB, whatever the list).
JSON_SLICE = 1 << 13


def int_items(values: list[int]) -> str:
    """Python ints as the items of a compact JSON list, `1,2,3`: the list's repr without its
    brackets and spaces (a third faster than joining each int's `str`, which holds them all)."""
    return repr(values)[1:-1].replace(" ", "")
