"""vLLM (v1 `KVCacheManager`): its block pool as a dump, checked, traced and synthesized.

The engine's face to the rest of kvcanary (`kvcanary_cli.engines` calls these): a dump read
into a `VllmState` and checked or described, one block's provenance, the synth scenarios.
Nothing of vLLM is imported here; `capture` reads a live manager by attribute.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from kvcanary_cli.dump.engine import StoredArrays
from kvcanary_cli.dump.schema import SHRINK_KEY
from kvcanary_cli.dump.shrink_record import ShrinkRecord, parse_shrink_record
from kvcanary_cli.engines.vllm.check import COVERAGE, audit, owners_of, queue_places
from kvcanary_cli.engines.vllm.state import VllmState, state_of
from kvcanary_cli.engines.vllm.synth import SCENARIOS, SIZES, build
from kvcanary_cli.errors import DumpError, MetadataError, OptionError
from kvcanary_cli.option_values import checked_choice
from kvcanary_cli.results.pool import BlockHash, PoolDumpReport, PoolProvenance
from kvcanary_cli.results.pool_timeline import PoolSnapshotCheck, PoolTimelineReport

if TYPE_CHECKING:
    from kvcanary_cli.dump.shrink_writer import ShrinkResult
    from kvcanary_cli.results.pool_inspect import PoolDumpDescription

__all__ = [
    "check_dump",
    "describe_dump",
    "provenance",
    "scenario_lines",
    "shrink_dump",
    "synth_contents",
    "timeline_of",
]


def _record(stored: StoredArrays, state: VllmState) -> ShrinkRecord | None:
    """A shrunk dump's record of its original (None: a whole dump)."""
    text = stored.metadata.get(SHRINK_KEY)
    if state.shrunk is None:
        return None
    if text is None:
        raise MetadataError("missing (a shrunk dump records its original)", field=SHRINK_KEY)
    return parse_shrink_record(text)


def _shrunk_line(state: VllmState, record: ShrinkRecord) -> str:
    assert state.shrunk is not None
    return (
        f"shrunk from {record.source_file} ({record.source_bytes:,} bytes, sha256 "
        f"{record.source_sha256[:16]}…): per-block invariants on the blocks it kept "
        f"({int(state.shrunk.blocks.sum()):,}: those the findings name), the pool's counts "
        "the original's"
    )


def report_of(path: str, state: VllmState, record: ShrinkRecord | None = None) -> PoolDumpReport:
    """`state` checked, as the report of the dump at `path` (shrunk from `record`'s)."""
    result = audit(state)
    coverage = (*COVERAGE, *result.skipped)
    if record is not None:
        coverage = (*coverage, _shrunk_line(state, record))
    return PoolDumpReport(
        path=path,
        engine="vllm",
        engine_version=state.version,
        num_blocks=state.num_blocks,
        null_block=state.null_block,
        num_free_blocks=state.num_free_blocks,
        queue_length=state.queue_length,
        referenced=result.referenced,
        live_requests=int(state.request_live.sum()),
        requests_with_blocks=result.requests_with_blocks,
        groups=result.groups,
        coverage=coverage,
        findings=result.findings,
        diagnosis=result.diagnosis,
    )


def check_dump(stored: StoredArrays) -> PoolDumpReport:
    """A vLLM dump checked (a `DumpError` on bad input)."""
    state = state_of(stored)
    return report_of(str(stored.path), state, _record(stored, state))


def describe_dump(stored: StoredArrays) -> PoolDumpDescription:
    """What a vLLM dump holds (`inspect`; a `DumpError` on bad input, as `check` says it)."""
    from kvcanary_cli.engines.vllm.describe import description_of

    state = state_of(stored)
    return description_of(stored, state, _record(stored, state))


def shrink_dump(
    stored: StoredArrays, out: str | os.PathLike[str], *, kvcanary_version: str, force: bool
) -> ShrinkResult:
    """Write the small dump of `stored` at `out` (`shrink` says what it keeps)."""
    from kvcanary_cli.dump.shrink_writer import write_shrunk_arrays
    from kvcanary_cli.engines.vllm.shrink import SHRUNK_TENSORS, shrunk_state

    state = state_of(stored)
    previous = _record(stored, state)
    tensors, metadata = shrunk_state(state).contents()
    assert stored.file_state is not None
    return write_shrunk_arrays(
        stored.path,
        stored.file_state,
        tensors,
        metadata,
        out,
        original={k: v for k, v in stored.arrays.items() if k not in SHRUNK_TENSORS},
        previous=previous,
        kvcanary_version=kvcanary_version,
        overwrite=force,
    )


def _hash(group: int, digest: np.ndarray) -> BlockHash:
    return BlockHash(group=group, digest=bytes(digest.astype(np.uint8)).hex())


def provenance(stored: StoredArrays, block: int) -> PoolProvenance:
    """Block `block`'s whole story: ref count, queue places, holders, hash, map keys and the
    findings naming it."""
    state = state_of(stored)
    if not 0 <= block < state.num_blocks:
        raise OptionError(
            f"block {block} is outside the pool of {state.num_blocks} blocks", option="block"
        )
    record = _record(stored, state)
    if state.shrunk is not None and record is not None and not state.shrunk.blocks[block]:
        raise DumpError(
            f"block {block} was not kept: this dump is shrunk to the blocks its findings name",
            path=str(stored.path),
            hint=f"trace it in the original, {record.source_file}",
        )
    places = queue_places(state, block)
    keys = np.flatnonzero(state.map_block == block)
    group = int(state.hash_group[block])
    findings = tuple(f for f in audit(state).findings if block in f.blocks)
    return PoolProvenance(
        path=str(stored.path),
        engine="vllm",
        block=block,
        num_blocks=state.num_blocks,
        is_null=block == state.null_block,
        ref_cnt=int(state.ref_cnt[block]),
        queue_position=places[0] if places else None,
        queue_length=state.queue_length,
        queue_positions=places,
        owners=owners_of(state, block, limit=state.table_block.size + 1),
        hash=_hash(group, state.hash_digest[block]) if group >= 0 else None,
        map_keys=tuple(_hash(int(state.map_group[i]), state.map_digest[i]) for i in keys[:256]),
        released=bool(np.isin(block, state.released_block)),
        findings=findings,
    )


def scenario_lines() -> list[str]:
    """The vLLM synth scenarios, one line each: name, summary, expected finding codes."""
    width = max(map(len, SCENARIOS))  # as SGLang's lines: two spaces, `none (clean)`
    return [
        f"{name:<{width}}  {s.summary}  [{', '.join(s.expected) or 'none (clean)'}]"
        for name, s in SCENARIOS.items()
    ]


def synth_contents(
    name: str, *, seed: int, size: str
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Scenario `name`'s dump contents (tensors, metadata)."""
    checked_choice(size, list(SIZES), "size")
    return build(name, seed=seed, size=size).contents()


def is_scenario(name: str) -> bool:
    """Whether `name` is a vLLM synth scenario."""
    return name in SCENARIOS


def timeline_of(stored: list[StoredArrays], *, keep_order: bool) -> PoolTimelineReport:
    """What changed between snapshots of one pool: in step order (as given with
    `keep_order`, or when a snapshot records no step), each one's findings."""
    from kvcanary_cli.engines.vllm.timeline import step_between

    states = [state_of(s) for s in stored]
    for s, state in zip(stored, states, strict=True):
        if state.shrunk is not None:
            raise DumpError(
                "a shrunk dump: a timeline reads whole snapshots (a shrunk one holds the blocks "
                "its findings name)",
                path=str(s.path),
                hint="run timeline and diff on the originals",
            )
    steps = [_step(s) for s in stored]
    order = list(range(len(stored)))
    if not keep_order and all(step is not None for step in steps):
        order.sort(key=lambda i: steps[i] or 0)
    first = states[order[0]]
    for i in order[1:]:
        if (states[i].num_blocks, states[i].groups) != (first.num_blocks, first.groups):
            raise DumpError(
                f"holds {states[i].num_blocks} blocks in {len(states[i].groups)} groups, "
                f"{stored[order[0]].path} {first.num_blocks} in {len(first.groups)} (or other "
                "groups): a timeline reads snapshots of one pool",
                field="vllm.num_blocks",
                path=str(stored[i].path),
            )
    codes = [tuple(f.code for f in audit(states[i]).findings) for i in order]
    return PoolTimelineReport(
        engine="vllm",
        num_blocks=first.num_blocks,
        snapshots=tuple(
            PoolSnapshotCheck(path=str(stored[i].path), step=steps[i], codes=codes[k])
            for k, i in enumerate(order)
        ),
        steps=tuple(
            step_between(states[i], states[j], k, (codes[k], codes[k + 1]))
            for k, (i, j) in enumerate(zip(order, order[1:], strict=False))
        ),
    )


def _step(stored: StoredArrays) -> int | None:
    from kvcanary_cli.dump.schema import parse_integer

    text = stored.metadata.get("step")
    return None if text is None else parse_integer(text)
