"""Result of `kvcanary timeline` and `diff` on block-pool dumps (vLLM's): what changed in the
pool between snapshots of one scheduler, and the findings each snapshot has
(`kvcanary.pool-timeline/1`; engine-neutral, standard library only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from kvcanary_cli.catalog import PoolCode
from kvcanary_cli.results.pool import BlockOwner
from kvcanary_cli.results.record import recorded

__all__ = ["BlockState", "PoolBlockChange", "PoolSnapshotCheck", "PoolStep", "PoolTimelineReport"]

#: A block's state in one snapshot: queued (free), held (by a table or a deferred free), both
#: (queued while held: a fault), or neither (lost: a fault).
BlockState = Literal["free", "held", "free-and-held", "lost"]


@dataclass(frozen=True, kw_only=True)
class PoolBlockChange:
    """One block whose state or holders changed between two snapshots."""

    block: int
    before: BlockState
    after: BlockState
    #: its reference count before and after
    ref_before: int
    ref_after: int
    #: its holders after (the first few)
    owners: tuple[BlockOwner, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PoolSnapshotCheck:
    """One snapshot: where it is, its step, and the codes its check found."""

    path: str
    #: the step its metadata records (null: none)
    step: int | None
    #: the codes of its findings, the top one first ([]: clean)
    codes: tuple[PoolCode, ...]


@dataclass(frozen=True, kw_only=True)
class PoolStep:
    """What changed from one snapshot to the next."""

    #: the two snapshots' places in `snapshots`
    before: int
    after: int
    #: requests with a table or live in one snapshot only
    requests_added: tuple[str, ...]
    requests_gone: tuple[str, ...]
    #: blocks free before and held after, held before and free after, held in both by
    #: another set of holders
    allocated: int
    freed: int
    rehomed: int
    #: blocks that changed into or out of a faulty state (free-and-held, lost)
    went_bad: int
    #: codes found after and not before, and the other way round
    new_codes: tuple[PoolCode, ...]
    gone_codes: tuple[PoolCode, ...]
    #: the changed blocks, faulty ones first, then ascending (the first few)
    blocks: tuple[PoolBlockChange, ...]


@dataclass(frozen=True, kw_only=True)
class PoolTimelineReport:
    """`kvcanary timeline` / `diff` on block-pool dumps of one pool."""

    SCHEMA: ClassVar[str] = "kvcanary.pool-timeline/1"

    engine: str
    #: blocks in the pool (every snapshot's)
    num_blocks: int
    snapshots: tuple[PoolSnapshotCheck, ...]
    steps: tuple[PoolStep, ...]

    @recorded
    def failed(self) -> bool:
        """A snapshot has a finding."""
        return any(s.codes for s in self.snapshots)
