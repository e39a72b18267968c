"""Results of `kvcanary check` and `provenance --block` on a block-pool dump (vLLM's; any
engine whose KV cache is a pool of reference-counted blocks): `kvcanary.pool-check/1` and
`kvcanary.pool-provenance/1`. Engine-neutral: the engine's package fills them in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from kvcanary_cli.catalog import POOL_CAUSE_OF, PoolCause, PoolCode, Severity
from kvcanary_cli.results.record import recorded

__all__ = [
    "BlockHash",
    "BlockOwner",
    "PoolCheckReport",
    "PoolDiagnosis",
    "PoolDumpReport",
    "PoolFinding",
    "PoolGroup",
    "PoolProvenance",
]


@dataclass(frozen=True, kw_only=True)
class BlockOwner:
    """Who holds a block: a request's table entry in one group, or a deferred free."""

    #: the request's id ("" when a deferred free does not name it)
    request: str
    #: the KV-cache group (null for a deferred free)
    group: int | None
    #: the block's index in that table (null for a deferred free)
    index: int | None
    #: "table" or "deferred"
    holds: Literal["table", "deferred"] = "table"


@dataclass(frozen=True, kw_only=True)
class BlockHash:
    """A block hash: the group it was made for and its digest (hex)."""

    #: the group id carried by the hash
    group: int
    #: the digest, hex, without the group id
    digest: str


@dataclass(frozen=True, kw_only=True)
class PoolGroup:
    """One KV-cache group of the pool."""

    #: the group's index
    group: int
    #: its manager kind (full, sliding_window, ...)
    kind: str
    #: tokens per block
    block_size: int
    #: the window in tokens (null for full attention)
    window: int | None
    #: table entries of the group (null blocks included)
    entries: int


@dataclass(frozen=True, kw_only=True)
class PoolFinding:
    """One broken invariant: every block (or entry) it concerns, and the story of the first."""

    code: PoolCode
    #: what broke, in words (the example block's facts and holders)
    message: str
    #: the example block (null for a pool-wide finding)
    block: int | None = None
    #: every block concerned, ascending
    blocks: tuple[int, ...] = ()
    #: the example block's holders
    owners: tuple[BlockOwner, ...] = ()
    #: the example block's place in the free queue from its head (null: not queued)
    queue_position: int | None = None
    #: the example block's reference count
    ref_cnt: int | None = None
    #: the example block's holders counted (table entries and deferred frees)
    holders: int | None = None

    @recorded
    def severity(self) -> Severity:
        """Every pool finding is an error: the KV cache is wrong or about to be."""
        return Severity.ERROR

    @recorded
    def cause(self) -> PoolCause:
        """The fault this finding is evidence of."""
        return POOL_CAUSE_OF[self.code]

    @recorded
    def count(self) -> int:
        """Blocks concerned (1 for a pool-wide finding)."""
        return max(1, len(self.blocks))


@dataclass(frozen=True, kw_only=True)
class PoolDiagnosis:
    """One fault the dump shows, with its story."""

    cause: PoolCause
    #: what went wrong, and what to change
    summary: str
    fix: str
    #: the story of its first block: facts and holders
    story: str
    #: the finding codes that are its evidence
    findings: tuple[PoolCode, ...]
    #: distinct blocks concerned
    blocks: int


#: A pool dump's verdict.
PoolVerdict = Literal["clean", "errors", "bad-input"]


@dataclass(frozen=True, kw_only=True)
class PoolDumpReport:
    """One block-pool dump checked."""

    #: the dump's path
    path: str
    #: the engine the dump describes
    engine: str
    #: the engine's version, when recorded
    engine_version: str | None = None
    #: blocks in the pool, the null block's id
    num_blocks: int = 0
    null_block: int = 0
    #: the free queue's counter and its walked length
    num_free_blocks: int = 0
    queue_length: int = 0
    #: blocks with a positive reference count
    referenced: int = 0
    #: requests the scheduler has, and requests with a table
    live_requests: int = 0
    requests_with_blocks: int = 0
    groups: tuple[PoolGroup, ...] = ()
    #: what was and was not checked, in words
    coverage: tuple[str, ...] = ()
    findings: tuple[PoolFinding, ...] = ()
    #: the faults, most fundamental first
    diagnosis: tuple[PoolDiagnosis, ...] = ()
    #: why the dump could not be read (then nothing else is filled in)
    error: str | None = None

    @recorded
    def verdict(self) -> PoolVerdict:
        """bad-input, errors or clean."""
        if self.error is not None:
            return "bad-input"
        return "errors" if self.findings else "clean"


@dataclass(frozen=True, kw_only=True)
class PoolCheckReport:
    """`kvcanary check` on block-pool dumps."""

    SCHEMA: ClassVar[str] = "kvcanary.pool-check/1"

    dumps: tuple[PoolDumpReport, ...]
    #: the severity that fails the check
    fail_on: Severity = Severity.ERROR

    @recorded
    def bad_input(self) -> bool:
        """A dump could not be read."""
        return any(d.error is not None for d in self.dumps)

    @recorded
    def failed(self) -> bool:
        """A finding at or above `fail_on`."""
        return any(f.severity.rank >= self.fail_on.rank for d in self.dumps for f in d.findings)


@dataclass(frozen=True, kw_only=True)
class PoolProvenance:
    """`kvcanary provenance --block N` on a block-pool dump: one block's whole story."""

    SCHEMA: ClassVar[str] = "kvcanary.pool-provenance/1"

    path: str
    engine: str
    block: int
    num_blocks: int
    #: the pool's null block is this one
    is_null: bool
    ref_cnt: int
    #: its place from the free queue's head (null: not queued), of the queue's length
    queue_position: int | None
    queue_length: int
    #: it is queued more than once (every place listed)
    queue_positions: tuple[int, ...]
    owners: tuple[BlockOwner, ...]
    #: its hash (null: none)
    hash: BlockHash | None
    #: the prefix-cache keys that point to it
    map_keys: tuple[BlockHash, ...]
    #: released until reuse (queued, still read)
    released: bool
    #: the findings that name this block
    findings: tuple[PoolFinding, ...]
