"""Real-KV sources and the fingerprint a TAIL record must hold (docs/canary.md §3).

A dump carries a source as `real_kv.<group>.<k|v>` (uint8 `[rows, row_bytes]`: layer 0 of the
K or V cache viewed as bytes) and describes it in its metadata: `real_kv.mode` (`none`,
`partial`, `all`), `real_kv.page_size` (default 1), `real_kv.num_bytes_per_token` (default
`row_bytes / page_size`) and `real_kv.read_bytes` (default: all of a token's bytes). HEAD
records never carry a fingerprint (expected 0); TAIL records are checked only when the dump
says how they were fingerprinted.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from kvcanary_cli.canary.hashing import as_int64, combine_source_hashes, fold_chunks
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import parse_integer
from kvcanary_cli.dump.tensor import StoredTensor, distinct
from kvcanary_cli.errors import DumpError, MetadataError, TensorShapeError
from kvcanary_cli.safe_text import excerpt

__all__ = [
    "RealKvExpectation",
    "RealKvMode",
    "RealKvSetup",
    "RealKvSource",
    "expected_real_kv",
    "real_kv_expectation",
    "real_kv_setup",
    "slot_bytes",
]

#: bytes folded per token in partial mode, whatever `read_bytes` says.
PARTIAL_BYTES = 16
#: KV bytes gathered per folding step (a power of two; the gather's indices take 8x that).
FOLD_BYTES = 1 << 20


class RealKvMode(StrEnum):
    """SGLang's `--kv-canary-real-data`."""

    NONE = "none"
    PARTIAL = "partial"
    ALL = "all"


@dataclass(frozen=True, kw_only=True)
class RealKvSource:
    """One source: the bytes and how a slot's bytes are found in them."""

    name: str
    #: uint8 `[rows, row_bytes]` (sparse in a shrunk dump).
    data: StoredTensor
    page_size: int
    num_bytes_per_token: int
    read_bytes: int


@dataclass(frozen=True, kw_only=True)
class RealKvSetup:
    """How the dump's TAIL records were fingerprinted; `mode` None: the dump does not say."""

    mode: RealKvMode | None
    sources: dict[tuple[str, str], RealKvSource]


def _int_key(dump: KvDump, key: str, default: int) -> int:
    text = dump.metadata.get(key)
    if text is None:
        return default
    value = parse_integer(text)
    if value is None or value <= 0:
        raise MetadataError(f"metadata value {excerpt(text)} is not a positive integer", field=key)
    return value


def real_kv_setup(dump: KvDump) -> RealKvSetup:
    """Read and check the dump's real-KV mode and sources (bad values are bad input, the
    error naming the dump: the loader that names files has returned by now)."""
    try:
        return _setup(dump)
    except DumpError as exc:
        if exc.path is None:
            exc.path = str(dump.path)
        raise


def _setup(dump: KvDump) -> RealKvSetup:
    text = dump.metadata.get("real_kv.mode")
    mode: RealKvMode | None = None
    if text is not None:
        try:
            mode = RealKvMode(text.strip())
        except ValueError:
            raise MetadataError(
                f"metadata value {excerpt(text)} is not none, partial or all",
                field="real_kv.mode",
            ) from None
    sources: dict[tuple[str, str], RealKvSource] = {}
    for name, data in sorted(dump.real_kv_sources.items()):
        _, group, half = name.split(".")
        width = int(data.shape[1])
        if width % 16 or width == 0:
            raise TensorShapeError(
                f"rows of {width} bytes; upstream needs a positive multiple of 16", field=name
            )
        page = _int_key(dump, "real_kv.page_size", 1)
        derived = width // page
        if "real_kv.num_bytes_per_token" not in dump.metadata and (derived < 16 or derived % 16):
            # the page size makes the default: the value at fault is the page size
            raise MetadataError(
                f"is {page}: rows of {width} bytes ({name}) then hold {derived} bytes per "
                "token, and upstream needs a positive multiple of 16",
                field="real_kv.page_size",
                hint="record real_kv.num_bytes_per_token, or the page size the KV pool uses",
            )
        per_token = _int_key(dump, "real_kv.num_bytes_per_token", derived)
        read = _int_key(dump, "real_kv.read_bytes", per_token)
        if per_token % 16:
            raise MetadataError(
                f"is {per_token}; upstream needs a positive multiple of 16",
                field="real_kv.num_bytes_per_token",
            )
        if read % 16 or read > per_token:
            raise MetadataError(
                f"is {read}; upstream needs a multiple of 16 of at most num_bytes_per_token "
                f"({per_token})",
                field="real_kv.read_bytes",
            )
        if width < page * per_token:
            raise TensorShapeError(
                f"rows of {width} bytes; upstream needs rows holding "
                f"page_size x num_bytes_per_token = {page * per_token} bytes",
                field=name,
            )
        sources[(group, half)] = RealKvSource(
            name=name, data=data, page_size=page, num_bytes_per_token=per_token, read_bytes=read
        )
    return RealKvSetup(mode=mode, sources=sources)


@dataclass(frozen=True, kw_only=True)
class RealKvExpectation:
    """The real_kv_hash the records of one buffer must hold, slot by slot: 0 for every slot
    (`zero`: HEAD, or mode none), or the fingerprints of some distinct slots (sorted), each
    known or not (outside the source, or bytes a shrunk dump did not keep)."""

    zero: bool
    slots: np.ndarray
    values: np.ndarray
    known: np.ndarray

    def lookup(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(expected real_kv_hash, known) of each of `slots` (unknown ones read 0)."""
        slots = np.asarray(slots, dtype=np.int64)
        if self.zero:
            return np.zeros(slots.shape, dtype=np.int64), np.ones(slots.shape, dtype=bool)
        if self.slots.size == 0:
            return np.zeros(slots.shape, dtype=np.int64), np.zeros(slots.shape, dtype=bool)
        at = np.minimum(np.searchsorted(self.slots, slots), self.slots.size - 1)
        known = (self.slots[at] == slots) & self.known[at]
        return np.where(known, self.values[at], 0), known


def real_kv_expectation(
    setup: RealKvSetup, group: str, buffer: str, slots: np.ndarray
) -> RealKvExpectation | None:
    """What `buffer`'s (`head.k`, `tail.v`, ...) records must hold as real_kv_hash, for the
    slots among `slots` (any number of times each); None when the check cannot be made.

    HEAD: 0 (no sources). TAIL: 0 in mode none, else the fingerprint of the slot's bytes in
    the group's source for that half; unknown for slots outside the source. None for TAIL
    when the dump records no mode, or a mode without the source.
    """
    empty = np.zeros(0, dtype=np.int64)
    stage, half = buffer.split(".")
    if stage == "head" or setup.mode is RealKvMode.NONE:
        return RealKvExpectation(zero=True, slots=empty, values=empty, known=empty.astype(bool))
    source = setup.sources.get((group, half))
    if setup.mode is None or source is None:
        return None
    eff = PARTIAL_BYTES if setup.mode is RealKvMode.PARTIAL else source.read_bytes
    distinct, values, known = _fingerprints(source, eff, np.asarray(slots, dtype=np.int64))
    return RealKvExpectation(zero=False, slots=distinct, values=values, known=known)


def expected_real_kv(
    setup: RealKvSetup, group: str, buffer: str, slots: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """The real_kv_hash each of `slots`' records must hold in `buffer`, and whether it is
    known; None when the check cannot be made at all (see `real_kv_expectation`)."""
    expectation = real_kv_expectation(setup, group, buffer, slots)
    return None if expectation is None else expectation.lookup(slots)


def slot_bytes(source: RealKvSource, slots: np.ndarray) -> np.ndarray:
    """The flat index of the first byte of each slot (each inside the source) in `source`."""
    width = int(source.data.shape[1])
    page = source.page_size
    flat: np.ndarray = (slots // page) * width + (slots % page) * source.num_bytes_per_token
    return flat


def _fingerprints(
    source: RealKvSource, eff: int, slots: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distinct slots, int64 fingerprints, known) of the slots inside `source`: each slot's
    first `eff` bytes folded once, however many entries read it.

    Only slots whose bytes the file stores are folded (a shrunk dump may keep some and not
    others). Distinct slots' bytes never overlap (`eff` <= bytes per token, a page's tokens
    fit in a row), so the work is at most the source's stored bytes, and memory is one step's
    (`FOLD_BYTES` of KV bytes) whatever the entries, the rows or a claimed width.
    """
    rows = int(source.data.shape[0])
    inside = slots[(slots >= 0) & (slots // source.page_size < rows)]
    wanted = distinct(inside)
    base = slot_bytes(source, wanted)
    known = source.data.kept_before(base + eff) - source.data.kept_before(base) == eff
    values = np.zeros(wanted.shape, dtype=np.int64)
    todo = np.flatnonzero(known)
    # many slots a step, a few of their bytes at a time: a fold is sequential within a slot,
    # so the loop below turns once per 8 bytes of a slot, and each turn takes every slot
    step = min(max(todo.size, 1), FOLD_BYTES // 16)
    block = min(eff, max(FOLD_BYTES // step // 16 * 16, 16))
    for a in range(0, todo.size, step):
        pick = todo[a : a + step]
        acc = np.zeros(pick.shape, dtype=np.uint64)
        for b in range(0, eff, block):
            span = np.arange(b, min(b + block, eff), dtype=np.int64)
            flat = (base[pick, None] + span[None, :]).reshape(-1)
            acc = fold_chunks(source.data.take_raw(flat).reshape(pick.size, span.size), acc)
        values[pick] = as_int64(combine_source_hashes([acc]))
    return wanted, values, known
