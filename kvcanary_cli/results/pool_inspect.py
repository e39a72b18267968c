"""Result of `kvcanary inspect` on a block-pool dump (vLLM's): `kvcanary.pool-inspect/1`, what
the dump holds as its reader reads it (the pool, its free queue, groups, requests and their
tables, the prefix-cache map, tensors, metadata). Engine-neutral: the engine's package fills
it in; nothing here is checked (that is `check`'s `kvcanary.pool-check/1`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvcanary_cli.results.record import recorded
from kvcanary_cli.results.shrink import ShrinkSummary

__all__ = ["PoolDumpDescription", "PoolGroupDescription", "PoolRequest", "PoolTensor"]


@dataclass(frozen=True, kw_only=True)
class PoolTensor:
    """One tensor of the file, as stored."""

    name: str
    #: int32, int64, uint8, ...
    dtype: str
    shape: tuple[int, ...]
    bytes: int
    #: not a tensor of the engine's layout: the reader ignores it
    ignored: bool


@dataclass(frozen=True, kw_only=True)
class PoolGroupDescription:
    """One KV-cache group and its request tables."""

    #: the group's index
    group: int
    #: its manager kind (full, sliding_window, ...)
    kind: str
    #: tokens per block
    block_size: int
    #: the window in tokens (null for full attention)
    window: int | None
    #: requests with a table in the group
    tables: int
    #: table entries of the group, and those holding the null block (blocks a window dropped)
    entries: int
    null_entries: int
    #: a Mamba group's most state blocks in a live request's table with nothing in flight
    #: (null: not recorded, or another kind)
    max_states: int | None
    #: a Mamba group's scratch blocks at the end of each table, one per draft token a step
    #: verifies (0: none, or not recorded)
    speculative_blocks: int


@dataclass(frozen=True, kw_only=True)
class PoolRequest:
    """One request of the dump's request list."""

    #: its id, as recorded
    request: str
    #: the scheduler has it (waiting or running)
    live: bool
    #: its token counts (null: not recorded)
    num_tokens: int | None
    num_computed: int | None
    #: its table's length in each group, by group index (0: no table there)
    table_lengths: tuple[int, ...]
    #: its tokens scheduled but not yet processed (vLLM's async scheduling; null: not
    #: recorded)
    num_in_flight: int | None = None
    #: its prompt's tokens (null: not recorded)
    num_prompt: int | None = None


@dataclass(frozen=True, kw_only=True)
class PoolDumpDescription:
    """`kvcanary inspect --format json` on a block-pool dump: the pool, queue, groups,
    requests, map, tensors and metadata the dump holds."""

    SCHEMA: ClassVar[str] = "kvcanary.pool-inspect/1"

    path: str
    file_bytes: int
    #: the kvcanary.format metadata value
    format: str | None
    #: the engine the dump describes, and its version when recorded
    engine: str
    engine_version: str | None
    #: blocks in the pool, the null block's id
    num_blocks: int
    null_block: int
    #: the free queue's own counter, as recorded
    num_free_blocks: int
    #: the free queue walked head → tail (a shrunk dump's: the original's length), and
    #: whether the walk reached the tail (false: cut after num_blocks steps, a cycle)
    queue_length: int
    queue_complete: bool
    #: the walk back tail → head: its length, as queue_length's (null: not recorded)
    reverse_queue_length: int | None
    #: a shrunk dump: the blocks whose state it holds (null: every block's)
    kept_blocks: int | None
    #: of the blocks whose state the dump holds: those with a positive reference count, and
    #: those with a hash
    referenced: int
    hashed_blocks: int
    #: prefix-cache map entries (one per key and block), and blocks' extra keys
    map_entries: int
    extra_keys: int
    #: deferred frees, and blocks released until reuse
    deferred_frees: int
    released_blocks: int
    groups: tuple[PoolGroupDescription, ...]
    #: every request of the request list, in its order
    requests: tuple[PoolRequest, ...]
    #: in the order of the file's header
    tensors: tuple[PoolTensor, ...]
    #: metadata that is not the layout's (step, note, trigger, ...), as written
    metadata: dict[str, str]
    #: a shrunk dump's record of its original (null: a whole dump)
    shrink: ShrinkSummary | None
    #: reading notes
    notes: tuple[str, ...]

    @recorded
    def live_requests(self) -> int:
        """Requests the scheduler has."""
        return sum(r.live for r in self.requests)

    @recorded
    def requests_with_blocks(self) -> int:
        """Requests with a table entry in some group."""
        return sum(any(r.table_lengths) for r in self.requests)
