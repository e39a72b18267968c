"""The canary's hash functions (docs/canary.md §2, §3), scalar and vectorized.

`splitmix64` is the splitmix64 *finalizer* only (no golden-ratio increment, so it maps 0 to 0);
`mix3` folds three 64-bit values; the chain head is the finalizer of the anchor; the real-KV
fingerprint folds 16-byte chunks of KV bytes. The array forms work on numpy uint64 and wrap
modulo 2^64 like the kernels; int64 inputs are read as their two's-complement bit patterns.

A leaf module (numpy only): the synthesizer (`synth`) stamps chains with it too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvcanary_cli.canary.constants import CHAIN_ANCHOR, MASK64

__all__ = [
    "CHAIN_HEAD",
    "as_int64",
    "as_uint64",
    "combine_source_hashes",
    "fold_chunks",
    "mix3",
    "mix3_array",
    "splitmix64",
    "splitmix64_array",
]

_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_U64 = np.uint64


def splitmix64(x: int) -> int:
    """The splitmix64 finalizer of `x` taken modulo 2^64 (a Python int in [0, 2^64))."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * _M1) & MASK64
    x = ((x ^ (x >> 27)) * _M2) & MASK64
    return x ^ (x >> 31)


def mix3(a: int, b: int, c: int) -> int:
    """`sm(sm(sm(a) ^ b) ^ c)`, every input taken modulo 2^64."""
    return splitmix64(splitmix64(splitmix64(a) ^ (b & MASK64)) ^ (c & MASK64))


#: the chain hash entering position 0 (unsigned; 0xDE7FAE23A9A1B716).
CHAIN_HEAD = splitmix64(CHAIN_ANCHOR)


def as_uint64(values: np.ndarray | Sequence[int] | int) -> np.ndarray:
    """Values as a uint64 array of their 64-bit patterns (int64 is reinterpreted, not cast)."""
    array = np.asarray(values)
    if array.dtype == np.uint64:
        return array
    if array.dtype == np.int64:
        return array.view(np.uint64)
    if array.dtype == object:
        return np.array([int(v) & MASK64 for v in array.reshape(-1)], dtype=np.uint64).reshape(
            array.shape
        )
    return array.astype(np.int64).view(np.uint64)


def as_int64(values: np.ndarray) -> np.ndarray:
    """uint64 bit patterns as int64 (how records and rings store hashes)."""
    return np.asarray(values, dtype=np.uint64).view(np.int64)


def splitmix64_array(values: np.ndarray | int) -> np.ndarray:
    """The finalizer over an array (uint64 result, wrapping multiplication)."""
    x = as_uint64(values).copy()
    with np.errstate(over="ignore"):
        x ^= x >> _U64(30)
        x *= _U64(_M1)
        x ^= x >> _U64(27)
        x *= _U64(_M2)
        x ^= x >> _U64(31)
    return x


def mix3_array(a: np.ndarray | int, b: np.ndarray | int, c: np.ndarray | int) -> np.ndarray:
    """`mix3` elementwise over broadcastable arrays (uint64 result)."""
    inner = splitmix64_array(splitmix64_array(a) ^ as_uint64(b))
    return splitmix64_array(inner ^ as_uint64(c))


def fold_chunks(data: np.ndarray, acc: np.ndarray | None = None) -> np.ndarray:
    """Per-source real-KV hash of each row of `data` (uint8 `[n, bytes]`, bytes a multiple of
    16): start at 0 and fold every little-endian 8-byte word in order, `acc = sm(acc ^ word)`
    (the low then the high half of each 16-byte chunk). Returns uint64 `[n]`.

    `acc` (uint64 `[n]`) continues a fold: the rows' earlier bytes were folded into it, so a
    long token's bytes can be folded a piece at a time.
    """
    rows = np.ascontiguousarray(data, dtype=np.uint8)
    if rows.shape[1] % 16:
        raise ValueError(f"real-KV rows must be a multiple of 16 bytes, got {rows.shape[1]}")
    words = rows.view("<u8").reshape(rows.shape[0], rows.shape[1] // 8)
    out = np.zeros(rows.shape[0], dtype=np.uint64) if acc is None else as_uint64(acc).copy()
    if rows.shape[0] < _FEW_ROWS:  # a fold is sequential within a row: see _FEW_ROWS
        for i in range(rows.shape[0]):
            out[i] = _fold_words(int(out[i]), words[i].tolist())
        return out
    step = np.empty_like(out)
    with np.errstate(over="ignore"):
        for column in range(words.shape[1]):  # bounded by the bytes per token, never by slots
            out ^= words[:, column]
            for shift, factor in ((30, _M1), (27, _M2), (31, None)):
                np.right_shift(out, _U64(shift), out=step)
                out ^= step
                if factor is not None:
                    out *= _U64(factor)
    return out


#: rows below which `fold_chunks` folds on Python ints: numpy pays a few microseconds per
#: call, about eleven calls per 8-byte word, however few the rows; a Python int pays a third
#: of a microsecond per word and row (a token of a megabyte: 2 s in numpy, 0.05 s so).
_FEW_ROWS = 16


def _fold_words(acc: int, words: list[int]) -> int:
    """`acc = sm(acc ^ word)` over `words`, on Python ints."""
    for word in words:
        x = acc ^ word
        x = ((x ^ (x >> 30)) * _M1) & MASK64
        x = ((x ^ (x >> 27)) * _M2) & MASK64
        acc = x ^ (x >> 31)
    return acc


def combine_source_hashes(per_source: Sequence[np.ndarray]) -> np.ndarray:
    """A slot's real-KV hash from its per-source hashes, in source order:
    `total = sm(total ^ h)` starting at 0 (uint64; 0 without sources)."""
    if not per_source:
        return np.zeros(0, dtype=np.uint64)
    total = np.zeros(np.asarray(per_source[0]).shape, dtype=np.uint64)
    for hashes in per_source:
        total = splitmix64_array(total ^ as_uint64(hashes))
    return total
