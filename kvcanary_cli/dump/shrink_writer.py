"""Writing a shrunk dump (format 1.2): what `analysis.shrink_selection` chose to keep, and a
record of what was dropped.

The big tensors (the tables, the LUT, canary buffers, real-KV sources) are written sparse:
their kept elements in the narrowest dtype that holds them (the original dtype recorded
under `kvcanary.dtypes`), the runs those elements form in the original's flat order as
narrow (gap, length) pairs, and the original shape (docs/dump-format.md, "Shrunk dumps").
Free lists keep the entries chosen. Everything else the format defines is small and copied
as stored (same dtype), so findings about dtypes and scalars read the same. Tensors the
format does not define are dropped.

Shrinking a shrunk dump keeps its record's source (the first original) and writes the same
bytes when it keeps the same elements: the writer is deterministic.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

import numpy as np

from kvcanary_cli.dump.atomic import write_safetensors
from kvcanary_cli.dump.files import sha256_of
from kvcanary_cli.dump.header import FileState, HeaderEntry
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.narrow import dtype_code, narrowest_dtype, original_dtypes_text
from kvcanary_cli.dump.schema import (
    DTYPE_ITEMSIZE,
    INTEGER_DTYPES,
    ORIGINAL_DTYPES_KEY,
    SCALARS,
    SHRINK_KEY,
    SHRUNK_FORMAT_VERSION,
    sparse_capable,
    spec_for,
)
from kvcanary_cli.dump.shrink_record import ShrinkRecord, TensorCut
from kvcanary_cli.dump.sparse import flat_runs, gap_runs
from kvcanary_cli.dump.tensor import DenseTensor, StoredTensor, distinct
from kvcanary_cli.errors import DumpError
from kvcanary_cli.safe_text import printable

__all__ = [
    "FREE_LISTS",
    "Keep",
    "ShrinkResult",
    "write_shrunk",
    "write_shrunk_arrays",
]

#: The free lists: a shrunk dump keeps the entries `Keep.free_lists` marks.
FREE_LISTS = ("free_full_slots", "free_swa_slots")


@dataclass(frozen=True, kw_only=True)
class Keep:
    """What a shrunk dump keeps of its source."""

    #: per sparse-capable tensor: sorted, unique flat indices of the elements to keep.
    elements: dict[str, np.ndarray] = field(default_factory=dict)
    #: per free list: which of its entries to keep (a mask over the stored list).
    free_lists: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ShrinkResult:
    """A written shrunk dump."""

    path: Path
    file_bytes: int
    record: ShrinkRecord
    #: what provenance covers of it: cells (SGLang), blocks (a block pool)
    kept: str = "cells"

    def summary_lines(self) -> list[str]:
        """What `kvcanary shrink` prints: sizes, and what each big tensor kept."""
        record = self.record
        lines = [
            f"wrote {printable(str(self.path))}: {self.file_bytes:,} bytes, from "
            f"{record.source_file} "
            f"({record.source_bytes:,} bytes, sha256 {record.source_sha256[:16]}…)"
        ]
        for cut in record.tensors:
            total = cut.kept + cut.dropped
            name = printable(cut.name)
            if cut.kept == 0 and cut.rows is None and cut.name not in FREE_LISTS:
                lines.append(f"  {name}: dropped ({cut.dropped_bytes:,} bytes)")
                continue
            rows = f" ({cut.kept_rows:,} of {cut.rows:,} rows)" if cut.rows is not None else ""
            lines.append(f"  {name}: kept {cut.kept:,} of {total:,}{rows}")
        lines.append(
            f"check it: kvcanary check {printable(str(self.path))} (same findings as the "
            f"original; provenance covers the kept {self.kept} only)"
        )
        return lines


def _mapped(handle: BinaryIO, entry: HeaderEntry) -> np.ndarray:
    dtype = np.dtype(INTEGER_DTYPES[entry.dtype])
    if entry.numel == 0:
        return np.zeros(entry.shape, dtype=dtype)
    return np.memmap(handle, dtype=dtype, mode="c", offset=entry.offset, shape=entry.shape)


@contextmanager
def _analysed_file(path: Path, state: FileState) -> Iterator[BinaryIO]:
    """The file a dump was read from, open, once checked to be that file still, unchanged:
    a dump replaced (or rewritten) since its analysis would give a small dump with one
    file's bytes and hash and the other's cells."""
    try:
        handle = open(path, "rb")  # closed below, after the check
    except OSError as exc:
        raise DumpError(f"cannot be read again: {exc.strerror}", path=str(path)) from None
    with handle:
        if FileState.of(os.fstat(handle.fileno())) != state:
            raise DumpError(
                "changed on disk after kvcanary analysed it",
                path=str(path),
                hint="another process replaced or rewrote it; shrink a stable copy",
            )
        yield handle


def _stored(dump: KvDump, name: str) -> StoredTensor | None:
    """The dump's tensor `name` when the dump stores it sparse (None when dense: the writer
    then reads the file's own bytes, in their stored dtype)."""
    info = dump.tensors.get(name)
    if info is None or info.kept is None:
        return None
    tensors: dict[str, StoredTensor | None] = {
        "req_to_token": dump.req_to_token,
        "full_to_swa_index_mapping": dump.full_to_swa_index_mapping,
        "req_to_verify_expected_tokens": dump.req_to_verify_expected_tokens,
        **dump.canary_buffers,
        **dump.real_kv_sources,
    }
    return tensors.get(name)


def _sparse_parts(
    name: str, source: StoredTensor, wanted: np.ndarray
) -> tuple[dict[str, np.ndarray], TensorCut]:
    """The three tensors of sparse `name` keeping `wanted` (its elements narrowed from
    `source.dtype`), and what that cut."""
    shape = source.shape
    total = int(np.prod(shape, dtype=object)) if shape else 1
    flat = distinct(np.asarray(wanted, dtype=np.int64))
    flat = flat[(flat >= 0) & (flat < total)]
    flat = flat[source.known(flat)]  # what was not kept is not known: it stays dropped
    values = source.take_raw(flat)
    itemsize = np.dtype(values.dtype).itemsize
    cut = TensorCut(
        name=name,
        shape=tuple(int(d) for d in shape),
        kept=int(flat.size),
        dropped=total - int(flat.size),
        dropped_bytes=(total - int(flat.size)) * itemsize,
        rows=int(shape[0]) if len(shape) == 2 else None,
        kept_rows=int(distinct(flat // max(int(shape[1]), 1)).size) if len(shape) == 2 else None,
    )
    narrow = INTEGER_DTYPES[narrowest_dtype(values, dtype_code(source.dtype))]
    parts = {
        name: np.ascontiguousarray(values.astype(narrow)),
        f"{name}.runs": gap_runs(flat_runs(flat)),
        f"{name}.shape": np.array(list(shape), dtype=np.int64),
    }
    return parts, cut


def write_shrunk(
    dump: KvDump,
    keep: Keep,
    out: str | os.PathLike[str],
    *,
    kvcanary_version: str,
    overrides: dict[str, int] | None = None,
    overwrite: bool = False,
) -> ShrinkResult:
    """Write `dump` shrunk to `keep` as a format-1.2 dump at `out` (never over `dump`).

    Its bytes and hash come from the file the analysis read, checked to be unchanged.
    """
    with _analysed_file(dump.path, dump.file_state) as handle:
        return _write_shrunk(
            dump,
            keep,
            handle,
            out,
            kvcanary_version=kvcanary_version,
            overrides=overrides,
            overwrite=overwrite,
        )


def _write_shrunk(
    dump: KvDump,
    keep: Keep,
    handle: BinaryIO,
    out: str | os.PathLike[str],
    *,
    kvcanary_version: str,
    overrides: dict[str, int] | None,
    overwrite: bool,
) -> ShrinkResult:
    header = dump.header
    previous = {t.name: t for t in dump.shrink.tensors} if dump.shrink else {}
    tensors: dict[str, np.ndarray] = {}
    cuts: list[TensorCut] = []
    original_dtypes: dict[str, str] = {}
    sparse_names = {
        name[: -len(".runs")]
        for name in header.entries
        if name.endswith(".runs") and _stored(dump, name[: -len(".runs")]) is not None
    }
    for name, entry in header.entries.items():
        base = name.rsplit(".", 1)[0]
        if base in sparse_names and name in (f"{base}.runs", f"{base}.shape"):
            continue  # written again with their tensor
        if sparse_capable(name):
            stored_sparse = _stored(dump, name)
            source = DenseTensor(_mapped(handle, entry)) if stored_sparse is None else stored_sparse
            parts, cut = _sparse_parts(
                name, source, keep.elements.get(name, np.zeros(0, dtype=np.int64))
            )
            tensors.update(parts)
            cuts.append(cut)
            original_dtypes[name] = dtype_code(source.dtype)
        elif name in FREE_LISTS or name in keep.free_lists:  # lists of slots: masked
            stored = _mapped(handle, entry)
            mask = keep.free_lists.get(name, np.zeros(stored.shape, dtype=bool))
            kept = np.ascontiguousarray(stored[mask])
            tensors[name] = kept
            original = previous[name].shape if name in previous else tuple(stored.shape)
            dropped = int(np.prod(original)) - int(kept.size)
            cuts.append(
                TensorCut(
                    name=name,
                    shape=original,
                    kept=int(kept.size),
                    dropped=dropped,
                    dropped_bytes=dropped * DTYPE_ITEMSIZE[entry.dtype],
                )
            )
        elif spec_for(name) is not None or name in SCALARS:
            # 1-d at least, as written before (a 0-d scalar tensor is stored as [1])
            tensors[name] = np.ascontiguousarray(_mapped(handle, entry))
        else:  # not part of the format: nothing reads it
            cuts.append(
                TensorCut(
                    name=name,
                    shape=entry.shape,
                    kept=0,
                    dropped=entry.numel,
                    dropped_bytes=entry.nbytes,
                )
            )
    written = {cut.name for cut in cuts} | set(tensors)
    cuts.extend(t for name, t in previous.items() if name not in written)  # dropped before
    if dump.shrink is not None:
        source_name, source_bytes = dump.shrink.source_name, dump.shrink.source_bytes
        source_sha = dump.shrink.source_sha256
        merged = {**dump.shrink.overrides, **(overrides or {})}
    else:
        source_name, source_bytes = dump.path.name, dump.file_size
        source_sha = sha256_of(handle)
        merged = dict(overrides or {})
    record = ShrinkRecord(
        source_name=source_name,
        source_bytes=source_bytes,
        source_sha256=source_sha,
        kvcanary_version=kvcanary_version,
        overrides=merged,
        tensors=tuple(sorted(cuts, key=lambda t: t.name)),
    )
    metadata = _stamped(dump.metadata, record)
    metadata[ORIGINAL_DTYPES_KEY] = original_dtypes_text(original_dtypes)
    return _write(out, tensors, metadata, record, source=dump.path, overwrite=overwrite)


def _stamped(metadata: dict[str, str], record: ShrinkRecord) -> dict[str, str]:
    """`metadata` saying it is a shrunk dump, with its record."""
    metadata = dict(metadata)
    metadata["kvcanary.format"] = SHRUNK_FORMAT_VERSION
    metadata[SHRINK_KEY] = record.to_json()
    return metadata


def _write(
    out: str | os.PathLike[str],
    tensors: dict[str, np.ndarray],
    metadata: dict[str, str],
    record: ShrinkRecord,
    *,
    source: Path,
    overwrite: bool,
) -> ShrinkResult:
    """The small dump written (atomically, never over `source` nor through a link)."""
    path = write_safetensors(out, tensors, metadata, inputs=[source], overwrite=overwrite)
    return ShrinkResult(path=path, file_bytes=os.stat(path).st_size, record=record)


def write_shrunk_arrays(
    source: Path,
    state: FileState,
    tensors: dict[str, np.ndarray],
    metadata: dict[str, str],
    out: str | os.PathLike[str],
    *,
    original: dict[str, np.ndarray],
    previous: ShrinkRecord | None,
    kvcanary_version: str,
    overwrite: bool = False,
) -> ShrinkResult:
    """Write a block-pool engine's small dump: the `tensors` and `metadata` its package chose
    from the dump at `source` (read as `state`, checked unchanged), with the record of the
    original (`previous`'s source when `source` is itself shrunk) and of what each of
    `original`'s tensors lost (against `previous`'s shapes, so shrinking again says the same)."""
    before = {t.name: t for t in previous.tensors} if previous else {}
    cuts = []
    for name in sorted(set(original) | set(before)):
        array, cut = original.get(name), before.get(name)
        # the first original's shape and bytes an element, as its record says when it has one
        shape = cut.shape if cut else tuple(int(d) for d in getattr(array, "shape", ()))
        if cut and cut.dropped:
            itemsize = cut.dropped_bytes // cut.dropped
        else:
            itemsize = 0 if array is None else array.dtype.itemsize
        total = int(np.prod(shape, dtype=np.int64))
        kept = int(tensors[name].size) if name in tensors else 0
        cuts.append(
            TensorCut(
                name=name,
                shape=shape,
                kept=kept,
                dropped=total - kept,
                dropped_bytes=(total - kept) * itemsize,
            )
        )
    with _analysed_file(source, state) as handle:
        if previous is not None:
            name, size, sha = previous.source_name, previous.source_bytes, previous.source_sha256
        else:
            name, size, sha = source.name, os.fstat(handle.fileno()).st_size, sha256_of(handle)
        record = ShrinkRecord(
            source_name=name,
            source_bytes=size,
            source_sha256=sha,
            kvcanary_version=kvcanary_version,
            tensors=tuple(cuts),
        )
        stamped = _stamped(metadata, record)
        written = _write(out, tensors, stamped, record, source=source, overwrite=overwrite)
    return replace(written, kept="blocks")
