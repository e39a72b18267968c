"""A vLLM dump described (`inspect`): what its reader read, counted, with nothing checked
(`check` judges it). Read through `state_of`, so a malformed dump is refused as `check`
refuses it."""

from __future__ import annotations

import os

import numpy as np

from kvcanary_cli.dump.engine import StoredArrays
from kvcanary_cli.dump.loader import ignored_notes
from kvcanary_cli.dump.schema import dtype_label
from kvcanary_cli.dump.shrink_record import ShrinkRecord
from kvcanary_cli.engines.vllm.state import ENGINE, LAYOUT_TENSORS, VllmState
from kvcanary_cli.results.pool_inspect import (
    PoolDumpDescription,
    PoolGroupDescription,
    PoolRequest,
    PoolTensor,
)
from kvcanary_cli.results.shrink import ShrinkSummary

__all__ = ["description_of"]


def _notes(stored: StoredArrays, state: VllmState) -> tuple[str, ...]:
    """What a reader of the figures should know: a cut walk, a shrunk dump, ignored tensors."""
    notes = []
    if not state.queue_complete:
        notes.append(
            f"the free queue's walk was cut after {state.free_queue.size} steps "
            "(vllm.free_queue_complete 0): its links never reached the tail"
        )
    if state.shrunk is not None:
        s = state.shrunk
        notes.append(
            f"shrunk: the dump holds the state of {int(s.blocks.sum())} of {state.num_blocks} "
            "blocks (those its original's findings name), their holders' tables and queue "
            f"places; the original's counts: {s.referenced} referenced, "
            f"{s.requests_with_blocks} requests with blocks, {s.queue_length} queued, table "
            f"entries per group {', '.join(map(str, s.group_entries))}"
        )
    foreign = [name for name in (*stored.arrays, *stored.unread) if name not in LAYOUT_TENSORS]
    return (*notes, *ignored_notes(foreign, "not a tensor of the vLLM layout"))


def _reverse_length(state: VllmState) -> int | None:
    """The walk back's length, the original's on a shrunk dump (None: not recorded)."""
    if state.free_queue_reverse is None:
        return None
    if state.shrunk is not None and state.shrunk.reverse_length is not None:
        return state.shrunk.reverse_length
    return int(state.free_queue_reverse.size)


def description_of(
    stored: StoredArrays, state: VllmState, record: ShrinkRecord | None
) -> PoolDumpDescription:
    """The description of `stored`, read as `state` (shrunk from `record`'s original)."""
    groups, requests = len(state.groups), len(state.request_ids)
    lengths = np.zeros((requests, groups), dtype=np.int64)
    np.add.at(lengths, (state.table_request, state.table_group), 1)
    nulls = np.bincount(state.table_group[state.table_block == state.null_block], minlength=groups)
    known = state.known()
    held = np.ones(state.num_blocks, dtype=bool) if known is None else known
    recorded = stored.arrays
    tokens = "vllm.request_num_tokens" in recorded
    computed = "vllm.request_num_computed" in recorded
    in_flight = state.request_num_in_flight
    prompts = state.request_num_prompt
    size = stored.file_state.size if stored.file_state else os.path.getsize(stored.path)
    return PoolDumpDescription(
        path=str(stored.path),
        file_bytes=size,
        format=stored.metadata.get("kvcanary.format"),
        engine=ENGINE,
        engine_version=state.version,
        num_blocks=state.num_blocks,
        null_block=state.null_block,
        num_free_blocks=state.num_free_blocks,
        queue_length=state.queue_length,
        queue_complete=state.queue_complete,
        reverse_queue_length=_reverse_length(state),
        kept_blocks=None if known is None else int(known.sum()),
        referenced=int((state.ref_cnt[held] > 0).sum()),
        hashed_blocks=int((state.hash_group[held] >= 0).sum()),
        map_entries=int(state.map_block.size),
        extra_keys=int(state.extra_key_block.size),
        deferred_frees=int(state.deferred_block.size),
        released_blocks=int(state.released_block.size),
        groups=tuple(
            PoolGroupDescription(
                group=g,
                kind=spec.kind,
                block_size=spec.block_size,
                window=spec.window,
                tables=int((lengths[:, g] > 0).sum()),
                entries=int(lengths[:, g].sum()),
                null_entries=int(nulls[g]),
                max_states=spec.max_states,
                speculative_blocks=spec.speculative_blocks,
            )
            for g, spec in enumerate(state.groups)
        ),
        requests=tuple(
            PoolRequest(
                request=rid,
                live=bool(state.request_live[i]),
                num_tokens=int(state.request_num_tokens[i]) if tokens else None,
                num_computed=int(state.request_num_computed[i]) if computed else None,
                table_lengths=tuple(int(n) for n in lengths[i]),
                num_in_flight=None if in_flight is None else int(in_flight[i]),
                num_prompt=None if prompts is None else int(prompts[i]),
            )
            for i, rid in enumerate(state.request_ids)
        ),
        tensors=tuple(
            PoolTensor(
                name=name,
                dtype=array.dtype.name,
                shape=tuple(int(n) for n in array.shape),
                bytes=int(array.nbytes),
                ignored=name not in LAYOUT_TENSORS,
            )
            for name, array in stored.arrays.items()
        )
        + tuple(
            PoolTensor(
                name=name,
                dtype=dtype_label(entry.dtype),
                shape=entry.shape,
                bytes=entry.nbytes,
                ignored=True,
            )
            for name, entry in stored.unread.items()
        ),
        metadata=dict(state.extra),
        shrink=None if record is None else ShrinkSummary.of(record, stored.path.name),
        notes=_notes(stored, state),
    )
