"""The chain hash and the real-KV fingerprint: the published test vectors, scalar = vectorized."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvcanary_cli.canary.constants import CHAIN_ANCHOR, to_signed
from kvcanary_cli.canary.hashing import (
    CHAIN_HEAD,
    as_int64,
    combine_source_hashes,
    fold_chunks,
    mix3,
    mix3_array,
    splitmix64,
    splitmix64_array,
)

U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
I64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)


# --- docs/canary.md §2: the chain ----------------------------------------------------------


def test_finalizer_vectors() -> None:
    assert splitmix64(0) == 0
    assert splitmix64(1) == 0x5692161D100B05E5


def test_mix3_vectors() -> None:
    assert mix3(0, 0, 0) == 0
    assert mix3(1, 2, 3) == 0xA55BDF37C08724B5


def test_chain_head_is_the_finalized_anchor() -> None:
    assert CHAIN_ANCHOR == 0xC0FFEE1234567890
    assert CHAIN_HEAD == splitmix64(CHAIN_ANCHOR) == 0xDE7FAE23A9A1B716
    assert to_signed(CHAIN_HEAD) == -2414019407054260458


def test_chain_of_tokens_10_11_12() -> None:
    stored = []
    running = CHAIN_HEAD
    for token, position in ((10, 0), (11, 1), (12, 2)):
        stored.append(running)
        running = mix3(running, token, position)
    assert stored == [0xDE7FAE23A9A1B716, 0xCD6D3FC64AB68B75, 0x2C33B2A133749990]
    assert running == 0xBFE8C306676BEF86


def test_vectorized_chain_matches_the_vectors() -> None:
    prev = np.array([to_signed(CHAIN_HEAD), to_signed(0xCD6D3FC64AB68B75)], dtype=np.int64)
    links = mix3_array(prev, np.array([10, 11]), np.array([0, 1]))
    assert [int(x) for x in links] == [0xCD6D3FC64AB68B75, 0x2C33B2A133749990]


@given(st.lists(st.tuples(I64, I64, I64), min_size=1, max_size=20))
def test_mix3_array_equals_scalar_for_negative_inputs(triples: list[tuple[int, int, int]]) -> None:
    a, b, c = (np.array(col, dtype=np.int64) for col in zip(*triples, strict=True))
    assert [int(x) for x in mix3_array(a, b, c)] == [mix3(*t) for t in triples]
    assert [int(x) for x in as_int64(mix3_array(a, b, c))] == [to_signed(mix3(*t)) for t in triples]


@given(st.lists(U64, min_size=1, max_size=20))
def test_finalizer_array_equals_scalar(values: list[int]) -> None:
    out = splitmix64_array(np.array(values, dtype=np.uint64))
    assert [int(x) for x in out] == [splitmix64(v) for v in values]


# --- docs/canary.md §3: the real-KV fingerprint --------------------------------------------


def _real_kv(*sources: bytes) -> int:
    per_source = [fold_chunks(np.frombuffer(s, dtype=np.uint8)[None, :]) for s in sources]
    return int(combine_source_hashes(per_source)[0])


def test_real_kv_vectors() -> None:
    counting = bytes(range(16))
    assert int(fold_chunks(np.frombuffer(counting, dtype=np.uint8)[None, :])[0]) == (
        0x447F1B95028CE131
    )
    assert _real_kv(counting) == 0xD6D75024DFD6C30C
    assert _real_kv(b"\x11" * 16) == 0xD0D75FB652F288D8
    assert _real_kv(b"\x11" * 16, b"\x22" * 16) == 0x33109C273CC3CC03
    assert _real_kv(b"\x00" * 16) == 0
    assert _real_kv(b"\x00" * 64) == 0


def test_one_source_is_the_hand_oracle() -> None:
    data = np.arange(32, dtype=np.uint8)[None, :]
    words = data.view("<u8")[0]
    acc = 0
    for word in words:
        acc = splitmix64(acc ^ int(word))
    assert _real_kv(data.tobytes()) == splitmix64(0 ^ acc)


def test_fold_is_per_row() -> None:
    rows = np.stack([np.full(16, 0x11, np.uint8), np.arange(16, dtype=np.uint8)])
    combined = combine_source_hashes([fold_chunks(rows)])
    assert [int(x) for x in combined] == [0xD0D75FB652F288D8, 0xD6D75024DFD6C30C]
    assert fold_chunks(np.zeros((0, 16), np.uint8)).shape == (0,)


def test_a_fold_continues_and_agrees_for_few_rows_and_many() -> None:
    # Few rows fold on Python ints, many in numpy; a fold continued from `acc` is one fold.
    data = np.random.default_rng(3).integers(0, 256, size=(40, 96), dtype=np.uint8)
    whole = fold_chunks(data)
    oracle = []
    for row in data:
        acc = 0
        for word in row.view("<u8").tolist():
            acc = splitmix64(acc ^ word)
        oracle.append(acc)
    assert whole.tolist() == oracle
    assert [int(fold_chunks(data[i : i + 1])[0]) for i in range(40)] == oracle
    assert fold_chunks(data[:, 48:], fold_chunks(data[:, :48])).tolist() == oracle
    assert fold_chunks(data[:3, 32:], fold_chunks(data[:3, :32])).tolist() == oracle[:3]
