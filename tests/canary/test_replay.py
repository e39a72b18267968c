"""Verify replay (docs/canary.md §5): clean chains give no row; planted corruptions give exactly
the rows SGLang's verify would record; the vectorized replay equals a literal scalar oracle."""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from kvcanary_cli.canary.constants import FailReason, LaunchTag, to_signed
from kvcanary_cli.canary.hashing import CHAIN_HEAD, combine_source_hashes, fold_chunks, mix3
from kvcanary_cli.canary.real_kv import real_kv_setup
from kvcanary_cli.canary.replay import BufferReplay, replay_buffer, replay_dump
from kvcanary_cli.canary.ring_rows import multiset_difference
from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.planners.base import Plan, Semantics
from kvcanary_cli.planners.vectorized import VectorizedPlanner
from kvcanary_cli.synth.state import SynthDump, SynthSpec, build_dump

GPU = VectorizedPlanner(semantics=Semantics.GPU)
CHAIN, POSITION, REAL_KV, TOKEN = (
    int(FailReason.VERIFY_CHAIN_HASH_MISMATCH),
    int(FailReason.VERIFY_POSITION_MISMATCH),
    int(FailReason.VERIFY_REAL_KV_HASH_MISMATCH),
    int(FailReason.VERIFY_TOKEN_MISMATCH),
)
Row = tuple[int, ...]


def clean(tmp_path: Path, seed: int = 0, **spec: object) -> tuple[SynthDump, KvDump]:
    synth = build_dump(
        SynthSpec(canary=True, canary_v=True, canary_real_kv=True, **spec),  # type: ignore[arg-type]
        seed,
    )
    return synth, load_dump(synth.save(tmp_path / f"clean{seed}.safetensors"))


def replay_all(dump: KvDump) -> list[BufferReplay]:
    return replay_dump(dump, {g: GPU.plan(dump, g) for g in dump.groups})


def all_rows(replays: list[BufferReplay]) -> list[Row]:
    return [tuple(int(v) for v in row) for r in replays for row in r.rows.fields]


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"expected_pool": True, "mode": "decode"},
        {"window": 8, "mode": "mixed", "expected_pool": True},
        {"window": 32, "page_size": 16, "max_seq_len": 128, "mode": "mixed"},
        {"token_offset": 1, "expected_pool": True, "mode": "decode"},
    ],
    ids=["full", "tokens", "swa", "swa-paged", "eagle"],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clean_chains_replay_to_no_row(tmp_path: Path, spec: dict[str, object], seed: int) -> None:
    _, dump = clean(tmp_path, seed, **spec)
    replays = replay_all(dump)
    assert {r.buffer for r in replays} == {"head.k", "head.v", "tail.k", "tail.v"}
    assert all(r.checked > 0 and r.real_kv in ("zero", "checked") for r in replays)
    assert all_rows(replays) == []
    assert all(r.notes == () for r in replays)


# --- planted corruptions ---------------------------------------------------------------------


def _record(buffer: np.ndarray, slot: int) -> tuple[int, int, int, int]:
    values = struct.unpack("<4q", bytes(buffer[slot, :32].tolist()))
    return values[0], values[1], values[2], values[3]


def _set(buffer: np.ndarray, slot: int, field: int, value: int) -> None:
    raw = bytearray(buffer[slot, :32].tolist())
    raw[8 * field : 8 * field + 8] = struct.pack("<q", value)
    buffer[slot, :32] = np.array(list(raw), dtype=np.uint8)


def _unshared_entries(plan: Plan) -> list[int]:
    """Verify entries whose slot no other entry verifies, at least 3 positions apart."""
    slots = plan.verify_slot_indices.tolist()
    counts = Counter(slots)
    rows = plan.entry_batch_rows().tolist()
    positions = plan.verify_expected_positions.tolist()
    picked: list[int] = []
    for k, slot in enumerate(slots):
        if counts[slot] != 1 or slot == 0:
            continue
        if all(rows[j] != rows[k] or abs(positions[j] - positions[k]) >= 3 for j in picked):
            picked.append(k)
    return picked


def test_planted_corruptions_give_exactly_their_rows(tmp_path: Path) -> None:
    synth, dump = clean(tmp_path, 3, expected_pool=True, mode="decode")
    plan = GPU.plan(dump, "full")
    slots = plan.verify_slot_indices.tolist()
    prevs = plan.verify_prev_slot_indices.tolist()
    positions = plan.verify_expected_positions.tolist()
    tokens = plan.verify_expected_tokens.tolist()
    token_at, position_at, hash_at, kv_at = _unshared_entries(plan)[:4]
    expected: list[Row] = []
    # Each corruption of a record breaks its own entry and the chain link of its successor.
    for k, field, bit in ((token_at, 0, TOKEN), (position_at, 1, POSITION), (hash_at, 2, CHAIN)):
        s = slots[k]
        for stage in ("head", "tail"):
            buffer = synth.tensors[f"canary.full.{stage}.k"]
            token, position, prev_hash, rkv = _record(buffer, s)
            new = [token, position, prev_hash][field] + 1000003
            _set(buffer, s, field, new)
            changed = [token, position, prev_hash]
            changed[field] = new
            tag = int(LaunchTag[f"{stage.upper()}_K_FULL"])
            aux = prev_hash  # the predecessor is intact: the expected hash is the old one
            expected.append((tag, s, changed[1], changed[0], tokens[k], changed[2], aux, bit))
            for j in [j for j, pv in enumerate(prevs) if pv == s]:
                succ = _record(buffer, slots[j])
                link = to_signed(mix3(changed[2], changed[0], changed[1]))
                expected.append((tag, slots[j], succ[1], succ[0], tokens[j], succ[2], link, CHAIN))
    # The KV bytes of one slot change after its TAIL record was written.
    s = slots[kv_at]
    synth.tensors["real_kv.full.k"][s, 0] ^= 0xFF
    token, position, prev_hash, _ = _record(synth.tensors["canary.full.tail.k"], s)
    expected.append(
        (
            int(LaunchTag.TAIL_K_FULL),
            s,
            position,
            token,
            tokens[kv_at],
            prev_hash,
            prev_hash,
            REAL_KV,
        )
    )
    corrupted = load_dump(synth.save(tmp_path / "corrupted.safetensors"))
    replays = replay_all(corrupted)
    got = all_rows(replays)
    assert Counter(got) == Counter(expected)
    assert positions[token_at] == expected[0][2]
    # the rows know which entry failed
    by_buffer = {(r.group, r.buffer): r for r in replays}
    head = by_buffer[("full", "head.k")].rows
    assert set(head.expected_position.tolist()) >= {positions[token_at], positions[hash_at]}


def test_corruptions_removed_give_no_row(tmp_path: Path) -> None:
    synth, dump = clean(tmp_path, 3, expected_pool=True, mode="decode")
    assert all_rows(replay_all(dump)) == []


# --- a literal scalar oracle --------------------------------------------------------------


def oracle(
    plan: Plan, buffer: np.ndarray, tag: int, check_tokens: bool, rkv: dict[int, int]
) -> list[Row]:
    """The verify kernel, one entry at a time, read literally."""
    rows: list[Row] = []
    n = buffer.shape[0]
    for k in range(plan.entries):
        s = int(plan.verify_slot_indices[k])
        ep = int(plan.verify_expected_positions[k])
        pv = int(plan.verify_prev_slot_indices[k])
        et = int(plan.verify_expected_tokens[k]) if check_tokens else -1
        if s == 0 or not 0 < s < n or pv >= n:
            continue
        tok, pos, ph, real = _record(buffer, s)
        bits = 0
        if pv == 0:
            aux = ph
        else:
            if pv < 0:
                aux = to_signed(CHAIN_HEAD)
            else:
                p_tok, p_pos, p_ph, _ = _record(buffer, pv)
                aux = to_signed(mix3(p_ph, p_tok, p_pos))
            bits |= CHAIN if ph != aux else 0
        if check_tokens and et != -1 and tok != et:
            bits |= TOKEN
        if pos != ep:
            bits |= POSITION
        if real != rkv.get(s, 0):
            bits |= REAL_KV
        if bits:
            rows.append((tag, s, pos, tok, et, ph, aux, bits))
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_vectorized_replay_equals_the_scalar_oracle(tmp_path: Path, seed: int) -> None:
    synth, _ = clean(tmp_path, seed, expected_pool=True, window=8 if seed % 2 else 0)
    rng = np.random.default_rng(seed)
    for name, tensor in synth.tensors.items():
        if name.startswith("canary."):  # scribble over a few records, and a few KV bytes
            hit = rng.choice(tensor.shape[0], size=6, replace=False)
            tensor[hit, rng.integers(0, 32, size=6)] ^= np.array(
                rng.integers(1, 256, size=6), dtype=np.uint8
            )
        if name.startswith("real_kv."):
            tensor[rng.choice(tensor.shape[0], size=3), 0] ^= 0x5A
    dump = load_dump(synth.save(tmp_path / "scribbled.safetensors"))
    setup = real_kv_setup(dump)
    for group in dump.groups:
        plan = GPU.plan(dump, group)
        source = dump.real_kv_sources[f"real_kv.{group}.k"].array()
        rkv = {
            s: to_signed(int(combine_source_hashes([fold_chunks(source[s : s + 1, :16])])[0]))
            for s in range(source.shape[0])
        }
        for stage in ("head", "tail"):
            stored = dump.canary_buffers[f"canary.{group}.{stage}.k"]
            tag = int(LaunchTag[f"{stage.upper()}_K_{group.upper()}"])
            want = oracle(plan, stored.array(), tag, True, rkv if stage == "tail" else {})
            got = replay_buffer(
                plan, f"{stage}.k", stored, real_kv=setup, check_tokens=True, chunk=7
            )
            rows = got.rows.fields
            matched, extra, missing = multiset_difference(rows, np.array(want).reshape(-1, 8))
            assert (matched, extra.size, missing.size) == (len(want), 0, 0)
            assert [tuple(int(v) for v in r) for r in rows] == want  # entry order, chunked


def test_overflow_and_launch_errors_replay_nothing(tmp_path: Path) -> None:
    synth, _ = clean(tmp_path, 0)
    synth.metadata["verify_capacity"] = "1"
    dump = load_dump(synth.save(tmp_path / "overflow.safetensors"))
    replays = replay_all(dump)
    assert all_rows(replays) == [] and all(r.entries == 0 for r in replays)
    assert "overflow" in replays[0].notes[0]


def test_zero_buffers_are_not_replayed(tmp_path: Path) -> None:
    synth, _ = clean(tmp_path, 0)
    synth.tensors["canary.full.head.v"][...] = 0
    dump = load_dump(synth.save(tmp_path / "zero-v.safetensors"))
    head_v = [r for r in replay_all(dump) if r.buffer == "head.v"][0]
    assert len(head_v.rows) == 0 and "never written" in head_v.notes[0]


def test_tail_without_a_recorded_mode_skips_the_real_kv_check(tmp_path: Path) -> None:
    synth, _ = clean(tmp_path, 0)
    del synth.metadata["real_kv.mode"]
    for name in [n for n in synth.tensors if n.startswith("real_kv.")]:
        del synth.tensors[name]
    dump = load_dump(synth.save(tmp_path / "no-mode.safetensors"))
    replays = replay_all(dump)
    assert {r.buffer: r.real_kv for r in replays} == {
        "head.k": "zero",
        "head.v": "zero",
        "tail.k": "skipped",
        "tail.v": "skipped",
    }
    assert all_rows(replays) == []
