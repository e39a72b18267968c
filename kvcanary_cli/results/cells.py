"""A slot and the cells holding it: the vocabulary the commands' results share.

Which pool a slot indexes (`Space`), what a cell is to the batch (`Role`), one cell (`Cell`),
a finding group's cells as columns (`CellColumns`), and where a slot lives (`SlotProvenance`,
with its canary records and violation-ring rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where cells are handled: `--help` never loads it
    import numpy as np

__all__ = [
    "CanaryRecord",
    "Cell",
    "CellColumns",
    "Role",
    "SlotProvenance",
    "Space",
    "ViolationRow",
]


class Space(StrEnum):
    """Which KV pool a slot indexes: the full pool, or the SWA pool (a LUT entry's value)."""

    FULL = "full"
    SWA = "swa"


class Role(StrEnum):
    """What a `req_to_token` cell (or a plan read) is to the batch (docs/findings.md).

    A cell is a verify cell, a live prefix cell before the window, the window's chain
    predecessor, a pending write, a stale cell past a live row's end, or a cell of an idle
    row; a finding may also name the plan read that met it: a write seed or an expected-token
    gather.
    """

    VERIFY = "verify"
    PREFIX = "prefix"
    CHAIN_PREV = "chain-prev"
    PENDING_WRITE = "pending-write"
    STALE_TAIL = "stale-tail"
    IDLE_ROW = "idle-row"
    SEED = "seed"
    EXPECTED_TOKEN = "expected-token"

    @property
    def live(self) -> bool:
        """A cell the batch reads or writes at this step."""
        return self in _LIVE_ROLES


_LIVE_ROLES = frozenset({Role.VERIFY, Role.PREFIX, Role.CHAIN_PREV, Role.PENDING_WRITE})


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One `req_to_token` cell holding a slot, labelled by its role in the batch."""

    pool_row: int
    position: int
    #: batch rows using this pool row (empty for idle rows).
    batch_rows: tuple[int, ...]
    #: verify, prefix, chain-prev, pending-write, stale-tail or idle-row.
    role: Role
    #: the cell is a row's write seed (`P-1` of a row that writes).
    seed: bool = False
    #: another live row holds the same slot at the same position (radix prefix sharing).
    shared: bool = False
    #: in SWA-space provenance: the full slot this cell holds (which reaches the SWA slot).
    full_slot: int | None = None


@dataclass(frozen=True, kw_only=True)
class CanaryRecord:
    """A slot's record in one canary buffer (`canary.<group>.<head|tail>.<k|v>`)."""

    buffer: str
    token: int
    position: int
    prev_hash: int
    real_kv_hash: int


@dataclass(frozen=True, kw_only=True)
class ViolationRow:
    """A violation-ring row whose slot field is this slot."""

    index: int
    fields: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class SlotProvenance:
    """Where a slot lives: every cell holding it, its translation, allocator and canary state."""

    slot: int
    space: Space
    #: the first cells (live ones first); `cells_total` counts all of them.
    cells: tuple[Cell, ...]
    cells_total: int
    #: LUT[slot] for a full slot, when the dump has a LUT and the slot is in range.
    swa_slot: int | None = None
    #: why there is no usable translation ("no LUT", "slot >= lut_len ...", "unmapped").
    translation_note: str | None = None
    #: for an SWA slot: the full slots whose LUT entry is this slot.
    mapped_from: tuple[int, ...] = ()
    #: for the SWA slot a truncated LUT ends in: the live full slots >= lut_len the GPU path
    #: clamps onto it.
    clamped_from: tuple[int, ...] = ()
    #: "free", "in use" or "beyond the pool" (no slot of it) when the dump has the allocator's
    #: free list for this space.
    allocator: str | None = None
    canary: tuple[CanaryRecord, ...] = ()
    #: the first ring rows of the slot; `violations_total` counts them all.
    violations: tuple[ViolationRow, ...] = ()
    violations_total: int = 0


@dataclass(frozen=True, kw_only=True, eq=False)
class CellColumns:
    """The `req_to_token` cells a finding group stands for, as parallel int64 arrays.

    One entry per cell, ordered by batch row, then position (then slot): a group of a million
    cells is five arrays, not a million objects; views turn into Python objects only what they
    show. `extra` holds the code's own per-cell columns (an SWA finding's `full_slot`, the
    position an aliased slot's owner holds it at, a write's `out_cache_loc` index).
    """

    batch_row: np.ndarray
    pool_row: np.ndarray
    position: np.ndarray
    #: the slot the finding is about (an SWA slot for an SWA-space finding); None for a
    #: finding about a cell's other reads (an expected-token gather).
    slot: np.ndarray | None
    extra: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.position.shape[0])

    def __eq__(self, other: object) -> bool:
        """Equal cells, in the same order (reports compare by value)."""
        import numpy as np

        if not isinstance(other, CellColumns):
            return NotImplemented
        return (
            all(
                np.array_equal(a, b)
                for a, b in (
                    (self.batch_row, other.batch_row),
                    (self.pool_row, other.pool_row),
                    (self.position, other.position),
                )
            )
            and _same(self.slot, other.slot)
            and self.extra.keys() == other.extra.keys()
            and all(np.array_equal(v, other.extra[k]) for k, v in self.extra.items())
        )

    def __hash__(self) -> int:
        return hash((len(self), self.position[:4].tobytes(), self.batch_row[:4].tobytes()))

    def distinct_count(self, column: str) -> int:
        """How many distinct values a column (`batch_row`, `slot`, ...) holds (one sort)."""
        import numpy as np

        values = getattr(self, column)
        if values is None or len(values) == 0:
            return 0
        ordered = np.sort(values)
        return int(np.count_nonzero(ordered[1:] != ordered[:-1])) + 1

    def take(self, index: np.ndarray) -> CellColumns:
        """The cells at `index` (a boolean mask or integer indices), in that order."""
        return CellColumns(
            batch_row=self.batch_row[index],
            pool_row=self.pool_row[index],
            position=self.position[index],
            slot=None if self.slot is None else self.slot[index],
            extra={name: values[index] for name, values in self.extra.items()},
        )


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    import numpy as np

    if a is None or b is None:
        return a is b
    return bool(np.array_equal(a, b))
