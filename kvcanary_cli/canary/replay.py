"""Offline replay of SGLang's verify kernel from a plan and a dump's canary buffers
(docs/canary.md §5).

For each materialized verify entry (slot, expected position, prev slot, expected token) the
replay reads the slot's record and applies the kernel's checks: slot 0 is skipped; the chain
check is skipped when the prev slot is 0 (and a negative prev slot means the chain head); the
token is checked when the dump has an expected-token pool; the position always; the real-KV
hash when the dump says what it must be. A failing entry yields the row the kernel would
append: `[tag, slot, stored position, stored token, expected token, stored prev_hash,
expected aux, bits]`. Entries are processed in bounded chunks, each fully vectorized.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from kvcanary_cli.canary.buffers import dump_buffers, read_records
from kvcanary_cli.canary.constants import BUFFERS, FailReason, buffer_tensor_name, tag_for
from kvcanary_cli.canary.hashing import CHAIN_HEAD, as_int64, mix3_array
from kvcanary_cli.canary.real_kv import (
    RealKvExpectation,
    RealKvSetup,
    real_kv_expectation,
    real_kv_setup,
)
from kvcanary_cli.canary.ring_rows import RowOrigin, ViolationRows
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.dump.tensor import StoredTensor
from kvcanary_cli.planners.base import Plan, Undefined

__all__ = ["BufferReplay", "replay_buffer", "replay_dump"]

#: verify entries replayed per step (bounds the temporaries: about 200 bytes per entry).
CHUNK_ENTRIES = 1 << 18
_ANCHOR = int(as_int64(np.array([CHAIN_HEAD], dtype=np.uint64))[0])


@dataclass(frozen=True, kw_only=True)
class BufferReplay:
    """What replaying one buffer's verify launch did."""

    group: str
    buffer: str
    tag: int
    #: verify entries in the plan (0 when the launch is skipped).
    entries: int
    #: entries whose record was read and checked.
    checked: int = 0
    #: entries with slot 0: the kernel skips them.
    slot_zero: int = 0
    #: checked entries whose prev slot is 0: no chain check.
    chain_skipped: int = 0
    #: entries whose slot or prev slot is outside the buffer (the GPU reads out of bounds).
    outside_buffer: int = 0
    #: entries whose slot or prev slot the plan could not define (reads outside req_to_token).
    undefined: int = 0
    #: entries whose record (or the one before it) a shrunk dump did not keep: not checked.
    not_kept: int = 0
    #: "checked", "zero" (HEAD, or mode none) or "skipped" (the dump does not say).
    real_kv: str = "skipped"
    #: entries whose real-KV hash could not be computed (slot outside the source).
    real_kv_unknown: int = 0
    rows: ViolationRows = field(default_factory=ViolationRows.empty)
    notes: tuple[str, ...] = ()


def replay_buffer(
    plan: Plan,
    buffer: str,
    data: StoredTensor,
    *,
    real_kv: RealKvSetup | None = None,
    check_tokens: bool = False,
    chunk: int = CHUNK_ENTRIES,
) -> BufferReplay:
    """Replay the verify launch of `buffer` (`head.k`, ...) of `plan`'s group on `data`."""
    tag = int(tag_for(plan.group, buffer))
    name = buffer_tensor_name(plan.group, buffer)
    if plan.launch_error is not None or plan.enable == 0:
        why = plan.launch_error or "verify capacity overflow (enable = 0)"
        return BufferReplay(
            group=plan.group,
            buffer=buffer,
            tag=tag,
            entries=0,
            notes=(f"{name}: verify not launched: {why}",),
        )
    num_slots = int(data.shape[0])
    entries = plan.entries
    batch_rows = plan.entry_batch_rows()
    # every slot's fingerprint once, however many entries read it (and whatever the chunk)
    expectation = (
        None
        if real_kv is None
        else real_kv_expectation(real_kv, plan.group, buffer, plan.verify_slot_indices)
    )
    mode = _real_kv_mode(expectation, buffer)
    counts = dict.fromkeys(
        (
            "checked",
            "slot_zero",
            "chain_skipped",
            "outside",
            "undefined",
            "kv_unknown",
            "not_kept",
        ),
        0,
    )
    parts: list[ViolationRows] = []
    written = False
    for start in range(0, entries, chunk):
        stop = min(start + chunk, entries)
        rows, any_written = _replay_chunk(
            plan,
            data,
            num_slots,
            start,
            stop,
            tag=tag,
            batch_rows=batch_rows,
            real_kv=expectation,
            check_tokens=check_tokens,
            counts=counts,
        )
        written |= any_written
        parts.append(rows)
    notes: list[str] = []
    result = ViolationRows.concat(parts)
    if counts["checked"] and not written:
        notes.append(
            f"{name}: every record the plan reads is zero, so the buffer was never written "
            "(V launches are off by default); not replayed"
        )
        result = ViolationRows.empty()
    if counts["outside"]:
        notes.append(
            f"{name}: {counts['outside']} entries read a slot outside the buffer "
            f"({num_slots} slots): the GPU reads out of bounds there; not replayed"
        )
    if counts["not_kept"]:
        notes.append(
            f"{name}: {counts['not_kept']} entries read records this shrunk dump does not keep: "
            "not replayed"
        )
    if counts["kv_unknown"]:
        notes.append(
            f"{name}: {counts['kv_unknown']} entries read slots whose bytes the real-KV "
            "source does not hold (outside it, or not kept by a shrunk dump): real-KV check "
            "skipped for them"
        )
    return BufferReplay(
        group=plan.group,
        buffer=buffer,
        tag=tag,
        entries=entries,
        checked=counts["checked"],
        slot_zero=counts["slot_zero"],
        chain_skipped=counts["chain_skipped"],
        outside_buffer=counts["outside"],
        undefined=counts["undefined"],
        not_kept=counts["not_kept"],
        real_kv=mode,
        real_kv_unknown=counts["kv_unknown"],
        rows=result,
        notes=tuple(notes),
    )


def _real_kv_mode(expectation: RealKvExpectation | None, buffer: str) -> str:
    """`zero` (HEAD, or mode none), `checked` (a source), `skipped` (the dump does not say)."""
    if buffer.startswith("head"):
        return "zero"
    if expectation is None:
        return "skipped"
    return "zero" if expectation.zero else "checked"


def _replay_chunk(
    plan: Plan,
    data: StoredTensor,
    num_slots: int,
    start: int,
    stop: int,
    *,
    tag: int,
    batch_rows: np.ndarray,
    real_kv: RealKvExpectation | None,
    check_tokens: bool,
    counts: dict[str, int],
) -> tuple[ViolationRows, bool]:
    """Rows of entries `[start, stop)`; `counts` accumulates; also says if a record was set."""
    slot = plan.verify_slot_indices[start:stop]
    expected_pos = plan.verify_expected_positions[start:stop]
    prev = plan.verify_prev_slot_indices[start:stop]
    plan_token = plan.verify_expected_tokens[start:stop]
    undefined_bits = plan.verify_undefined[start:stop]
    undefined = (undefined_bits & int(Undefined.SLOT | Undefined.PREV)) != 0
    token_known = (undefined_bits & int(Undefined.TOKEN)) == 0
    nonzero = slot != 0
    outside = nonzero & ~undefined & ((slot < 0) | (slot >= num_slots) | (prev >= num_slots))
    usable = nonzero & ~undefined & ~outside
    counts["slot_zero"] += int((~nonzero).sum())
    counts["undefined"] += int((nonzero & undefined).sum())
    counts["outside"] += int(outside.sum())
    idx = np.flatnonzero(usable)
    s, ep, pv = slot[idx], expected_pos[idx], prev[idx]
    record = read_records(data, s)
    reads_prev = pv > 0
    before = read_records(data, pv[reads_prev])
    kept = record.known.copy()
    kept[reads_prev] &= before.known
    if not kept.all():  # a shrunk dump: only entries whose records it kept are checked
        counts["not_kept"] += int((~kept).sum())
        before = before.subset(kept[reads_prev])
        idx, s, ep, pv, record = idx[kept], s[kept], ep[kept], pv[kept], record.subset(kept)
        reads_prev = pv > 0
    counts["checked"] += int(idx.size)
    counts["chain_skipped"] += int((pv == 0).sum())
    linked = np.full(idx.shape, _ANCHOR, dtype=np.int64)
    linked[reads_prev] = as_int64(mix3_array(before.prev_hash, before.token, before.position))
    aux = np.where(pv == 0, record.prev_hash, linked)
    bits = np.where(
        (pv != 0) & (record.prev_hash != aux), int(FailReason.VERIFY_CHAIN_HASH_MISMATCH), 0
    )
    token = np.full(idx.shape, -1, dtype=np.int64)
    if check_tokens:
        token = np.where(token_known[idx], plan_token[idx], -1)
        mismatch = (token != -1) & (record.token != token)
        bits |= np.where(mismatch, int(FailReason.VERIFY_TOKEN_MISMATCH), 0)
    bits |= np.where(record.position != ep, int(FailReason.VERIFY_POSITION_MISMATCH), 0)
    if real_kv is not None:
        want, known = real_kv.lookup(s)
        counts["kv_unknown"] += int((~known).sum())
        differs = known & (record.real_kv_hash != want)
        bits |= np.where(differs, int(FailReason.VERIFY_REAL_KV_HASH_MISMATCH), 0)
    fail = np.flatnonzero(bits)
    table = np.stack(
        [
            np.full(fail.shape, tag, dtype=np.int64),
            s[fail],
            record.position[fail],
            record.token[fail],
            token[fail],
            record.prev_hash[fail],
            aux[fail],
            bits[fail],
        ],
        axis=1,
    )
    entry = idx[fail] + start
    rows = ViolationRows.build(
        table,
        origin=RowOrigin.REPLAY,
        index=entry,
        batch_row=batch_rows[entry],
        expected_position=ep[fail],
        prev_slot=pv[fail],
    )
    written = bool(record.written.any() or before.written.any())
    return rows, written


def replay_dump(
    dump: KvDump,
    plans: Mapping[Group, Plan],
    *,
    buffers: Iterable[str] = BUFFERS,
) -> list[BufferReplay]:
    """Replay every canary buffer of the planned groups, in SGLang's launch order: the HEAD
    launches of every group, then the TAIL launches (K before V within a group)."""
    setup = real_kv_setup(dump)
    wanted = set(buffers)
    check_tokens = dump.req_to_verify_expected_tokens is not None
    done: list[BufferReplay] = []
    for stage in ("head", "tail"):
        for group, plan in plans.items():
            for buffer, data in dump_buffers(dump, group):
                if buffer.startswith(stage) and buffer in wanted:
                    done.append(
                        replay_buffer(
                            plan.entry_arrays(),
                            buffer,
                            data,
                            real_kv=setup,
                            check_tokens=check_tokens,
                        )
                    )
    return done
