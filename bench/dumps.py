"""The benchmark's dumps: production-shaped serving states, built once and cached.

`kvcanary synth --size medium/large` has the production table shapes but a batch about 25 times
smaller than production's; the benchmark keeps synth's table shapes (`scenarios.SIZES`) and
gives them a production batch: bs 2048 (4096 for large) of which 256 rows are live, requests up
to 16 K tokens (32 K for large) with radix-shared prefixes, an SWA window of 4096 and a full
pool of 4 M slots (8 M), so that medium plans ~2 M full and ~0.9 M SWA verify entries from a
~300 MB file, like the production dump the targets were set on; large plans about twice
that from a table eight times larger (2.1 GB).

Slots are handed out from a shuffled free list, as on a serving engine after some churn: every
request holds pages from all over the pool, so the slots past a truncated LUT are scattered
through the table, not one run at its end. `ordered=True` keeps the old shape (pages handed out
in order), to compare.

A dump is cached under `<cache>/{size}-{allocation}-{variant}-{key}.safetensors` with a
sidecar `.json` (the slots and rows the benchmark queries, the entry counts); `key` hashes the
shape, the seed, the truncation and the source of the code that writes the bytes (synth,
writer), so a change to any of them builds afresh (and the stale file of that shape is removed).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvcanary_cli import __version__
from kvcanary_cli.dump import writer
from kvcanary_cli.dump.files import write_atomically
from kvcanary_cli.synth import state
from kvcanary_cli.synth.scenarios import SIZES
from kvcanary_cli.synth.state import SynthDump, SynthSpec, build_dump

__all__ = [
    "CLEAN",
    "LUT_KEPT",
    "SHAPES",
    "TRUNCATED",
    "BenchDump",
    "default_cache",
    "ensure_dumps",
    "shape",
    "write_json",
]

CLEAN = "clean"
TRUNCATED = "truncated-lut"
#: `--truncated-lut` keeps this fraction of the LUT (the production bug: `lut[:num_allocated]`).
LUT_KEPT = 0.6
SEED = 0
#: Bump when the benchmark's own choices change (what the sidecar holds, the query picks).
BENCH_DUMPS_VERSION = 2
SHUFFLED = "shuffled"
ORDERED = "ordered"

_SWA = {"window": 4096, "mode": "mixed"}
#: synth's table shapes with a production batch (tiny and small: quick runs and the test).
SHAPES: dict[str, SynthSpec] = {
    # tiny: enough history that slots reach past a 60 % LUT (the test's dump has findings).
    "tiny": replace(SIZES["tiny"], window=8, mode="mixed", history=24),
    "small": replace(SIZES["small"], window=64, mode="mixed"),
    "medium": replace(
        SIZES["medium"],
        active_rows=256,
        padding_rows=2048 - 256,
        history=512,
        max_request_len=16384,
        pool_slots=1 << 22,
        **_SWA,  # type: ignore[arg-type]
    ),
    "large": replace(
        SIZES["large"],
        active_rows=256,
        padding_rows=4096 - 256,
        history=1024,
        max_request_len=32768,
        pool_slots=1 << 23,
        **_SWA,  # type: ignore[arg-type]
    ),
}


def shape(size: str, ordered: bool = False) -> SynthSpec:
    """`size`'s spec, its pages drawn from a shuffled free list (`ordered`: in page order)."""
    return replace(SHAPES[size], shuffled_free_list=not ordered)


def _allocation(ordered: bool) -> str:
    return ORDERED if ordered else SHUFFLED


@dataclass(frozen=True, kw_only=True)
class BenchDump:
    """One cached dump and what the benchmark needs to know about it."""

    path: Path
    variant: str
    #: sidecar: shape, entries per group, the slots/rows to query, the table bytes the batch reads.
    info: dict[str, Any]

    @property
    def table_offset(self) -> int:
        """File offset of `req_to_token`'s first byte."""
        return int(self.info["table_offset"])

    @property
    def table_bytes(self) -> int:
        """Size of `req_to_token` in the file."""
        return int(self.info["table_bytes"])


def default_cache() -> Path:
    """`${KVCANARY_CACHE:-~/.cache/kvcanary}/bench`."""
    base = os.environ.get("KVCANARY_CACHE") or Path.home() / ".cache" / "kvcanary"
    return Path(base) / "bench"


def _key(size: str, variant: str, ordered: bool) -> str:
    """Hash of everything that decides the dump's bytes and the sidecar's picks."""
    h = hashlib.sha256()
    spec = json.dumps(asdict(shape(size, ordered)), sort_keys=True)
    parts = [spec, variant, str(SEED), str(LUT_KEPT), str(BENCH_DUMPS_VERSION), __version__]
    h.update("\0".join(parts).encode())
    for module in (state, writer):
        assert module.__file__ is not None
        h.update(Path(module.__file__).read_bytes())
    return h.hexdigest()[:12]


def _paths(cache: Path, size: str, variant: str, ordered: bool) -> tuple[Path, Path]:
    stem = f"{size}-{_allocation(ordered)}-{variant}-{_key(size, variant, ordered)}"
    return cache / f"{stem}.safetensors", cache / f"{stem}.json"


def ensure_dumps(
    size: str, variants: list[str], cache: Path, *, ordered: bool = False
) -> dict[str, BenchDump]:
    """The dumps of `size` in `variants` (clean, truncated-lut), built if not cached; slots
    from a shuffled free list (`ordered`: in page order)."""
    cache.mkdir(parents=True, exist_ok=True)
    missing = [v for v in variants if not all(p.exists() for p in _paths(cache, size, v, ordered))]
    if missing:
        start = time.perf_counter()
        state = build_dump(shape(size, ordered), seed=SEED)
        print(
            f"simulated {size} ({_allocation(ordered)}) in {time.perf_counter() - start:.1f}s",
            flush=True,
        )
        for variant in missing:
            _save(state, size, variant, cache, ordered)
    result = {}
    for variant in variants:
        path, side = _paths(cache, size, variant, ordered)
        result[variant] = BenchDump(path=path, variant=variant, info=json.loads(side.read_text()))
    return result


def _save(state: SynthDump, size: str, variant: str, cache: Path, ordered: bool) -> None:
    """Write one variant of `state` and its sidecar; remove that shape's stale files."""
    path, side = _paths(cache, size, variant, ordered)
    for old in cache.glob(f"{size}-{_allocation(ordered)}-{variant}-*"):
        if old not in (path, side):
            old.unlink()
    tensors = dict(state.tensors)
    metadata = dict(state.metadata)
    lut = tensors["full_to_swa_index_mapping"]
    cut = int(lut.shape[0])
    if variant == TRUNCATED:
        cut = max(1, int(lut.shape[0] * LUT_KEPT))
        tensors["full_to_swa_index_mapping"] = lut[:cut].copy()
    metadata["note"] = f"kvcanary bench {size} {_allocation(ordered)} {variant} (seed {SEED})" + (
        f": LUT cut to {LUT_KEPT:.0%} of its length" if variant == TRUNCATED else ""
    )
    start = time.perf_counter()
    SynthDump(
        spec=state.spec, seed=state.seed, tensors=tensors, metadata=metadata, live=state.live
    ).save(path)
    info = _describe(state, size, variant, cut, path)
    info["allocation"] = _allocation(ordered)
    write_json(side, info)
    print(
        f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) in "
        f"{time.perf_counter() - start:.1f}s",
        flush=True,
    )


def _header(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        length = int.from_bytes(f.read(8), "little")
        header: dict[str, Any] = json.loads(f.read(length))
    header["__data_start__"] = 8 + length
    return header


def _describe(
    state: SynthDump, size: str, variant: str, lut_len: int, path: Path
) -> dict[str, Any]:
    """The sidecar: geometry, entry counts, table bytes the batch reads, and what to query."""
    spec = state.spec
    table = state.tensors["req_to_token"]
    max_reqs, max_seq_len = (int(x) for x in table.shape)
    live = state.live
    prefix = np.array([r.prefix_len for r in live], dtype=np.int64)
    extend = np.array([r.extend_len for r in live], dtype=np.int64)
    window_len = np.minimum(prefix, spec.window)
    # Pages of req_to_token holding the batch's cells: [0, P + E) of each live row.
    page = os.sysconf("SC_PAGE_SIZE")
    row_bytes = max_seq_len * table.itemsize
    firsts = np.array([r.pool_row * row_bytes for r in live], dtype=np.int64)
    lasts = firsts + np.maximum(prefix + extend, 1) * table.itemsize - 1
    batch_pages = int(((lasts // page) - (firsts // page) + 1).sum())
    header = _header(path)
    table_start = header["__data_start__"] + header["req_to_token"]["data_offsets"][0]
    return {
        "size": size,
        "variant": variant,
        "file_bytes": path.stat().st_size,
        "req_to_token": [max_reqs, max_seq_len],
        "bs": int(state.tensors["req_pool_indices"].shape[0]),
        "active_rows": len(live),
        "window": spec.window,
        "lut_len": lut_len,
        "num_full_slots": int(state.metadata["num_full_slots"]),
        "entries": {"full": int(prefix.sum()), "swa": int(window_len.sum())},
        "table_offset": int(table_start),
        "table_bytes": int(table.nbytes),
        "batch_table_bytes": batch_pages * page,
        "queries": _queries(state, lut_len),
    }


def _queries(state: SynthDump, lut_len: int) -> dict[str, Any]:
    """What `provenance` is asked: a slot with findings (on a clean dump, a radix-shared slot,
    the busiest kind), a clean one, and the pool row of the longest request."""
    live = state.live
    window = state.spec.window
    prefix_slots = np.concatenate([r.slots[: r.prefix_len] for r in live])
    slots, counts = np.unique(prefix_slots, return_counts=True)
    in_window = np.concatenate(
        [r.slots[max(0, r.prefix_len - window) : r.prefix_len] for r in live]
    )
    beyond = np.unique(in_window[in_window >= lut_len])
    if beyond.size:
        finding, why = int(beyond[beyond.size // 2]), "in an SWA window and past the LUT's end"
    elif (counts > 1).any():
        shared = slots[counts == counts.max()]
        finding, why = int(shared[shared.size // 2]), f"radix-shared by {counts.max()} cells"
    else:
        finding, why = int(slots[slots.size // 2]), "a live slot"
    alone = slots[(counts == 1) & (slots < lut_len)]
    clean = int(alone[alone.size // 2]) if alone.size else int(slots[0])
    longest = max(live, key=lambda r: r.prefix_len)
    return {
        "slot_finding": finding,
        "slot_finding_why": why,
        "slot_clean": clean,
        "row": longest.pool_row,
        "row_len": longest.prefix_len + longest.extend_len,
        "lut_out_of_range_cells": int((in_window >= lut_len).sum()),
    }


def write_json(path: Path, record: object) -> None:
    """`record` as indented JSON, written atomically."""
    data = json.dumps(record, indent=2, sort_keys=True).encode() + b"\n"
    write_atomically(path, lambda handle: handle.write(data))
