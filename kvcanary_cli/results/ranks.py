"""Results of `kvcanary ranks`: one step's dumps of every tensor-parallel rank, compared.
`RanksReport` is the `kvcanary.ranks/1` record.

TP ranks run the same scheduler on the same requests, and SGLang's pools and allocators are a
pure function of that stream (pool sizes are the MIN over ranks), so every rank holds the same
bookkeeping, slot ids included. Each rank is compared with the reference (the first) and its
first divergence named; a divergent rank deadlocks the next all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import kvcanary_cli
from kvcanary_cli.results.record import recorded

__all__ = ["ComparedPart", "Divergence", "DivergenceKind", "RankDump", "RanksReport"]

#: What differs, in the order compared: the pools' sizes, the batch size, a request (its
#: pool row or lengths), a req_to_token cell a request uses, a free list, the slots the
#: radix tree holds, the SWA LUT.
DivergenceKind = Literal["pool-size", "batch-size", "request", "table", "free-list", "tree", "lut"]
#: What a rank is compared on, in order.
ComparedPart = Literal[
    "sizes",
    "batch",
    "req_to_token",
    "free_full_slots",
    "free_swa_slots",
    "tree_full_slots",
    "lut",
]


@dataclass(frozen=True, kw_only=True)
class Divergence:
    """The first thing a rank holds otherwise than the reference."""

    kind: DivergenceKind
    #: the tensor or scalar that differs (prefix_lens, req_to_token, free_full_slots, ...)
    field: str
    #: the batch row of the request (request and table kinds)
    batch_row: int | None
    #: its pool row (req_to_token row)
    pool_row: int | None
    #: the position in the row (table), or where the two prefixes part (request)
    position: int | None
    #: the page of that position (table, request), or of the slot or LUT entry (free-list, lut)
    page: int | None
    #: free-list: the slot one side lacks or lists twice, or the reference's at the first
    #: entry out of order; tree: the slot one side's tree holds and the other's does not;
    #: lut: the full slot whose entry differs
    slot: int | None
    #: the reference's value and this rank's (a length, a slot, a size; null: absent there)
    reference_value: int | None
    value: int | None
    #: the divergence in words
    message: str


@dataclass(frozen=True, kw_only=True)
class RankDump:
    """One rank's dump and how it compares with the reference."""

    #: the dump's `rank` metadata; "#N" (N-th on the command line) when it records none
    rank: str
    path: str
    #: the dump's identity keys (sglang.version, model, rank, step, ...)
    identity: dict[str, str]
    #: the first divergence from the reference; null for the reference and identical ranks
    divergence: Divergence | None
    #: what was compared, in order, up to the first divergence ([] for the reference)
    compared: tuple[ComparedPart, ...]
    #: req_to_token cells compared: the rows the batch uses, up to their lengths
    table_cells: int


@dataclass(frozen=True, kw_only=True)
class RanksReport:
    """`kvcanary ranks --format json`."""

    SCHEMA: ClassVar[str] = "kvcanary.ranks/1"

    #: the step every dump records; null when none records one
    step: int | None
    #: the model the dumps record; null when none records one
    model: str | None
    #: the rank the others are compared with (the first)
    reference: str
    #: in rank order (command-line order when a rank is not a number), the reference first
    ranks: tuple[RankDump, ...]
    #: what could not be compared, and why
    notes: tuple[str, ...]

    @recorded
    def kvcanary_version(self) -> str:
        """The kvcanary that made the record."""
        return kvcanary_cli.__version__

    #: the exit code in words: divergent (1) or identical (0)
    @recorded
    def verdict(self) -> Literal["divergent", "identical"]:
        """Whether any rank diverges from the reference."""
        return "divergent" if self.first_divergence is not None else "identical"

    #: the first rank's (in rank order) first divergence, with that rank; null when identical
    @recorded
    def first_divergence(self) -> RankDump | None:
        """The first divergent rank, with its divergence."""
        return next((r for r in self.ranks if r.divergence is not None), None)
