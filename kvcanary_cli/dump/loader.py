"""`load_dump`: open a dump lazily and return a validated, typed `KvDump` (the one class a
loaded dump is, for `inspect` and the analysis alike).

The big tensors (tables, LUT, canary buffers, real-KV sources) load as `StoredTensor`s
(`dump.tensor`): one interface whichever way the file stores them. Big tables (`req_to_token`
reaches 2 GB in production) stay memory-mapped: planners gather only the rows of the batch.
Everything else is read into memory while the file is open: per-batch tensors (as int64),
LUT, free lists, ring, and tables up to `READ_LIMIT` bytes. A shrunk dump (format 1.2, or 1.1
before it) stores its big tensors sparse (`dump.sparse`, in their original coordinates; 1.2 in
a narrow dtype, `dump.narrow`), and its `kvcanary.shrink` record says where it came from.

Loading also separates "bad input, exit 2" from "findings, exit 1": a dump is bad input when
kvcanary cannot even say what the upstream planner would do with it (lengths that disagree
with bs, a LUT without a window, ...). Suspicious *values* in a well-formed dump (negative
lengths, rows out of range, bad slots) are findings, not errors: they are what the user came
to diagnose.

Why read rather than map: a mapped page the file no longer has (another process truncated
or rewrote it) kills the process with SIGBUS, which Python cannot catch. A read sees the
truncation as a short read and ends in one error line. So only tables too big to copy are
mapped, after checking through the open file that it still holds them; such a table can
still fault if the file is truncated while kvcanary runs (docs/guarantees.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from io import BufferedReader
from pathlib import Path

import numpy as np
from safetensors import safe_open

from kvcanary_cli.dump import releases
from kvcanary_cli.dump.header import (
    FileState,
    HeaderEntry,
    SafetensorsHeader,
    read_header,
    refuse_other_engine,
)
from kvcanary_cli.dump.narrow import RUN_DTYPES, dtype_code, parse_original_dtypes
from kvcanary_cli.dump.releases import out_of_range_note
from kvcanary_cli.dump.schema import (
    EXCEPTION_MESSAGE_KEY,
    EXCEPTION_TYPE_KEY,
    FORMAT_VERSION,
    IDENTITY_KEYS,
    INTEGER_DTYPES,
    LAYOUT_KEY,
    ORIGINAL_DTYPES_KEY,
    SCALARS,
    SHRINK_KEY,
    SHRUNK_FORMAT_VERSION,
    SHRUNK_FORMAT_VERSION_1_1,
    TENSORS,
    Group,
    Layout,
    TensorSpec,
    dtype_label,
    parse_integer,
    required_tensors,
    sparse_capable,
    spec_for,
)
from kvcanary_cli.dump.shrink_record import ShrinkRecord, parse_shrink_record
from kvcanary_cli.dump.sparse import SparseTensor, ring_slots, sparse_tensor
from kvcanary_cli.dump.tensor import DenseTensor, StoredTensor, distinct, union
from kvcanary_cli.errors import (
    CorruptDumpError,
    DumpError,
    FileChangedError,
    MetadataError,
    MissingTensorError,
    OptionError,
    TensorDtypeError,
    TensorShapeError,
)
from kvcanary_cli.safe_text import excerpt

__all__ = [
    "HOST_RECORDS",
    "MAMBA_RECORDS",
    "READ_LIMIT",
    "DtypeNote",
    "KvDump",
    "NAMED_IGNORED",
    "RecordedException",
    "RejectedScalar",
    "ignored_notes",
    "Scalar",
    "TensorInfo",
    "load_dump",
    "read_in_any_layout",
]

#: Tables (`req_to_token`, the expected-token pool, canary buffers, real-KV sources) up to
#: this many bytes are read into memory; larger ones are memory-mapped. Other tensors are
#: always read: kvcanary reads them whole anyway.
READ_LIMIT = 64 * 1024 * 1024
#: Tensors kvcanary gathers from sparsely, by row: mapped when larger than `READ_LIMIT`.
_TABLES = ("req_to_token", "req_to_verify_expected_tokens")
_TABLE_PREFIXES = ("canary.", "real_kv.")


@dataclass(frozen=True, kw_only=True)
class TensorInfo:
    """What the header says about one tensor, and its role in the format (None: ignored)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    role: str | None
    #: elements stored, for a sparse tensor of a shrunk dump (`shape` is then the original's).
    kept: int | None = None


@dataclass(frozen=True, kw_only=True)
class Scalar:
    """A resolved scalar and where it came from: metadata, tensor, default or command line."""

    name: str
    value: int | None
    #: "metadata", "tensor", "command line", "default" or "derived (...)".
    source: str

    @property
    def origin(self) -> str:
        """recorded (in the dump), overridden (command line), derived (from the dump's other
        contents), default (the format's default) or unknown (no value)."""
        if self.value is None:
            return "unknown"
        if self.source in ("metadata", "tensor"):
            return "recorded"
        if self.source == "command line":
            return "overridden"
        return "derived" if self.source.startswith("derived") else "default"

    @property
    def assumed(self) -> bool:
        """The value is kvcanary's inference, not a fact the dump or the user gave."""
        return self.origin == "derived"


@dataclass(frozen=True, kw_only=True)
class RejectedScalar:
    """A scalar the dump records with a value SGLang could not have used: reported as a
    finding, and the scalar is then planned as if the dump did not record it."""

    name: str
    value: int
    #: "metadata" or "tensor".
    source: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class DtypeNote:
    """A tensor stored with an accepted dtype that the production GPU path rejects."""

    tensor: str
    found: str
    expected: str


@dataclass(frozen=True, kw_only=True)
class RecordedException:
    """The exception SGLang's plan launcher raised on the dumped call, as the capture hook
    records it (`sglang.exception.type` and `sglang.exception.message`)."""

    exception_type: str
    message: str

    def __str__(self) -> str:
        return f"{self.exception_type}: {self.message}"


@dataclass(eq=False, kw_only=True)
class KvDump:
    """One forward step of one rank, checked and typed: what `inspect` describes and what
    planners and analysis read.

    Per-batch vectors are int64 `[bs]`. The big tensors are `StoredTensor`s in their stored
    dtype (the dense LUT as int64); big tables are memory-mapped copy-on-write: the input
    file is never modified.
    """

    path: Path
    file_size: int
    #: the file as it was when its tensors were read and mapped: a writer that reads the
    #: file again (shrink) checks that it still is.
    file_state: FileState
    #: the header the tensors were read by.
    header: SafetensorsHeader
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    scalars: dict[str, Scalar]
    groups: tuple[Group, ...]
    notes: list[str]
    dtype_notes: list[DtypeNote]
    #: the memory layout its slot ids live in (metadata `layout`; `paged` when absent).
    layout: str
    #: the unified layout's page tables and holes (`full_virtual_to_physical`, ...), by name.
    page_tables: dict[str, np.ndarray]
    req_to_token: StoredTensor
    req_pool_indices: np.ndarray
    prefix_lens: np.ndarray
    extend_seq_lens: np.ndarray
    full_to_swa_index_mapping: StoredTensor | None = None
    req_to_verify_expected_tokens: StoredTensor | None = None
    req_to_verify_expected_tokens_valid_lens: np.ndarray | None = None
    out_cache_loc: np.ndarray | None = None
    input_ids: np.ndarray | None = None
    positions: np.ndarray | None = None
    free_full_slots: np.ndarray | None = None
    free_swa_slots: np.ndarray | None = None
    #: the SWA slots this step writes, as the backend translated `out_cache_loc`.
    swa_out_cache_loc: np.ndarray | None = None
    #: full slots a running request or the radix tree holds (SWA leak accounting).
    held_full_slots: np.ndarray | None = None
    #: what the radix tree holds, all of it and its SWA-resident part, and each pool row's
    #: allocated length (capture.tree records them from the real tree and requests).
    tree_full_slots: np.ndarray | None = None
    tree_swa_resident_slots: np.ndarray | None = None
    #: the tree's full slots whose nodes are locked.
    tree_locked_full_slots: np.ndarray | None = None
    req_pool_allocated_lens: np.ndarray | None = None
    #: the request pool's free rows, and each running request's row (one entry a request).
    free_req_rows: np.ndarray | None = None
    running_req_rows: np.ndarray | None = None
    #: the Mamba layout's records: the row map (and ping-pong map), the Mamba free list, the
    #: tree's Mamba slots, each live request's Mamba slots and rows.
    req_index_to_mamba_index_mapping: np.ndarray | None = None
    req_index_to_mamba_ping_pong_track_buffer_mapping: np.ndarray | None = None
    free_mamba_slots: np.ndarray | None = None
    tree_mamba_slots: np.ndarray | None = None
    req_mamba_slots: np.ndarray | None = None
    req_mamba_rows: np.ndarray | None = None
    #: HiCache's host KV pool: its free slots, and the host slots the tree's nodes hold
    #: (with each entry's node id and that node's host lock count).
    host_free_slots: np.ndarray | None = None
    tree_host_slots: np.ndarray | None = None
    tree_host_nodes: np.ndarray | None = None
    tree_host_lock_refs: np.ndarray | None = None
    #: the same of the group's SWA and Mamba host pools, where the dump records them.
    swa_host_free_slots: np.ndarray | None = None
    tree_swa_host_slots: np.ndarray | None = None
    tree_swa_host_nodes: np.ndarray | None = None
    tree_swa_host_lock_refs: np.ndarray | None = None
    mamba_host_free_slots: np.ndarray | None = None
    tree_mamba_host_slots: np.ndarray | None = None
    tree_mamba_host_nodes: np.ndarray | None = None
    tree_mamba_host_lock_refs: np.ndarray | None = None
    violation_ring: np.ndarray | None = None
    violation_write_index: int | None = None
    #: scalars recorded out of their range (`ScalarSpec.out_of_range`), left unknown.
    rejected_scalars: list[RejectedScalar] = field(default_factory=list)
    canary_buffers: dict[str, StoredTensor] = field(default_factory=dict)
    #: `real_kv.<group>.<k|v>` sources (uint8, memory-mapped), by tensor name.
    real_kv_sources: dict[str, StoredTensor] = field(default_factory=dict)
    #: a shrunk dump's record (format 1.1, 1.2): its source and what was dropped; None
    #: otherwise.
    shrink: ShrinkRecord | None = None
    #: the exception the launcher raised on this call, when the dump records one.
    recorded_exception: RecordedException | None = None
    #: The tables memory-mapped from the file, by tensor name (the same memory as their
    #: tensors, whose scans hand the pages back as they go).
    mapped: dict[str, np.memmap] = field(default_factory=dict)
    #: what the analysis works out from this dump's records and reads more than once (`check`
    #: and the timeline's snapshot both count its SWA leaks), by the name of what works it out;
    #: a dump `dataclasses.replace` makes is another, and starts empty.
    derived: dict[str, object] = field(default_factory=dict, init=False, repr=False)

    def scalar(self, name: str) -> int | None:
        """The resolved value of a scalar key (None when unknown)."""
        return self.scalars[name].value

    def window(self, group: str) -> int:
        """Window W used to plan `group`: 0 for full, `swa_window_size` (>= 0) for swa."""
        if group == "full":
            return 0
        return max(0, self.scalar("swa_window_size") or 0)

    @property
    def token_offset(self) -> int:
        """`kv_token_id_vs_position_offset`: 0 for target pools, 1 for EAGLE draft pools."""
        return self.scalar("kv_token_id_vs_position_offset") or 0

    @property
    def identity(self) -> dict[str, str]:
        """Free-form identity keys (sglang version, model, rank, step, ...) present in the
        dump, in `IDENTITY_KEYS` order."""
        return {k: self.metadata[k] for k in IDENTITY_KEYS if k in self.metadata}

    @property
    def shrunk(self) -> bool:
        """A shrunk dump: it holds only what the analysis of its original read."""
        return self.shrink is not None

    @property
    def bs(self) -> int:
        """Batch size, padding rows included (`len(req_pool_indices)`)."""
        return int(self.req_pool_indices.shape[0])

    @property
    def max_reqs(self) -> int:
        """Rows of `req_to_token` (row 0 is the padding row)."""
        return int(self.req_to_token.shape[0])

    @property
    def max_seq_len(self) -> int:
        """Columns of `req_to_token`, i.e. its row stride."""
        return int(self.req_to_token.shape[1])

    @property
    def lut_len(self) -> int | None:
        """Length of the SWA LUT, or None without one."""
        lut = self.full_to_swa_index_mapping
        return None if lut is None else int(lut.shape[0])

    @property
    def write_req_capacity(self) -> int:
        """Length of `write_seed_slot_indices` (default: bs)."""
        value = self.scalar("write_req_capacity")
        return self.bs if value is None else value

    @cached_property
    def free_domain(self) -> dict[str, np.ndarray]:
        """In a shrunk dump, per slot space (`full`, `swa`), the slots whose free-list
        membership it records (sorted); a space not listed records every slot's. Worked out
        on first use: `inspect` never asks."""
        return _free_domain(
            self.req_to_token,
            self.full_to_swa_index_mapping,
            self.violation_ring,
            self.violation_write_index,
        )


def _truncated(entry: HeaderEntry) -> CorruptDumpError:
    return CorruptDumpError(
        f"the file was truncated while kvcanary read it: {entry.nbytes} bytes at offset "
        f"{entry.offset} are gone",
        field=entry.name,
        hint="another process truncated or rewrote it; read a stable copy",
    )


def _read_array(handle: BufferedReader, entry: HeaderEntry) -> np.ndarray:
    """One tensor from the open dump: read into memory, or (a big table) mapped copy-on-write
    (no read until touched; writes never reach the file)."""
    dtype = np.dtype(INTEGER_DTYPES[entry.dtype])
    if entry.numel == 0:
        return np.zeros(entry.shape, dtype=dtype)
    table = entry.name in _TABLES or entry.name.startswith(_TABLE_PREFIXES)
    if table and entry.nbytes > READ_LIMIT:
        if os.fstat(handle.fileno()).st_size < entry.offset + entry.nbytes:
            raise _truncated(entry)
        return np.memmap(handle, dtype=dtype, mode="c", offset=entry.offset, shape=entry.shape)
    array = np.empty(entry.shape, dtype=dtype)
    handle.seek(entry.offset)
    if handle.readinto(array.reshape(-1).view(np.uint8).data) != entry.nbytes:
        raise _truncated(entry)
    return array


def _check_tensor(entry: HeaderEntry, spec: TensorSpec) -> None:
    if entry.dtype not in spec.dtypes:
        want = " or ".join(dtype_label(d) for d in spec.dtypes)
        raise TensorDtypeError(
            f"dtype {dtype_label(entry.dtype)} is not accepted (expected {want})",
            field=entry.name,
            hint="convert it before saving, e.g. tensor.to(torch.int64)",
        )
    if len(entry.shape) not in spec.ranks:
        want = " or ".join(f"{r}-D" for r in spec.ranks)
        raise TensorShapeError(
            f"has shape {list(entry.shape)} ({len(entry.shape)}-D), expected {want}",
            field=entry.name,
        )


def _parse_int(key: str, text: str) -> int:
    value = parse_integer(text)
    if value is None:
        raise MetadataError(f"metadata value {excerpt(text)} is not an integer", field=key)
    return value


#: Tensors a reader ignores named one by one in a dump's notes; the rest are counted (a file may
#: hold any number: notes grow with what is wrong with the state, not with a file's extras).
NAMED_IGNORED = 5


def ignored_notes(names: Sequence[str], why: str) -> list[str]:
    """A note for each of the first `NAMED_IGNORED` tensors a reader ignores, and one counting
    the rest (`kvcanary inspect` lists every tensor)."""
    notes = [f"ignored tensor {name!r} ({why})" for name in names[:NAMED_IGNORED]]
    if len(names) > NAMED_IGNORED:
        left = len(names) - NAMED_IGNORED
        notes.append(f"ignored {left} more tensors ({why}; `kvcanary inspect` lists them all)")
    return notes


def load_dump(
    path: str | os.PathLike[str],
    *,
    overrides: Mapping[str, int | str | None] | None = None,
    header: SafetensorsHeader | None = None,
) -> KvDump:
    """Open, check and type a dump; raise a `DumpError` naming the culprit on bad input.

    `overrides` are command-line values for scalar keys (and `groups`); they win over the
    metadata and over scalar tensors, and their source is recorded as "command line". Every
    `DumpError` raised names the file. Cheap enough for `inspect`: big tables stay mapped
    and nothing is derived from their contents until asked.

    `header`: the dump's header, read earlier in the run (`timeline` orders the dumps by
    theirs): not read again, and the file opened must be the one it was read from, unchanged
    (device, inode, size, modification time), else `FileChangedError`.
    """
    try:
        earlier = None if header is None else header.state
        if header is None:
            header = read_header(path)
        try:
            with safe_open(str(header.path), framework="numpy") as parsed:
                parsed.keys()
        except Exception as exc:  # the Rust parser's verdict, on a header we already bounded
            raise CorruptDumpError(f"safetensors refuses the file: {exc}") from None
        try:
            handle = header.path.open("rb")
        except OSError as exc:
            raise DumpError(f"cannot read: {exc.strerror}") from None
        with handle:
            state = FileState.of(os.fstat(handle.fileno()))
            if earlier is not None and state != earlier:
                raise FileChangedError(
                    "changed since its header was read (replaced or rewritten)",
                    hint="read a stable copy",
                )
            if not state.same_file(header.state):
                raise CorruptDumpError(
                    "another file took its place while kvcanary read it",
                    hint="another process replaced it; read a stable copy",
                )
            if state.size < header.file_size:
                raise CorruptDumpError(
                    "the file was truncated while kvcanary read it",
                    hint="another process truncated or rewrote it; read a stable copy",
                )
            return _read_contents(header, handle, state, dict(overrides or {}))
    except DumpError as exc:
        if exc.path is None:
            exc.path = str(path)
        raise


def _read_contents(
    header: SafetensorsHeader,
    handle: BufferedReader,
    state: FileState,
    overrides: dict[str, int | str | None],
) -> KvDump:
    # First: another engine's dump, or a newer format, may break every other rule below.
    refuse_other_engine(header.metadata)
    version = header.metadata.get("kvcanary.format")
    shrunk_versions = (SHRUNK_FORMAT_VERSION_1_1, SHRUNK_FORMAT_VERSION)
    if version is not None and version.strip() not in (FORMAT_VERSION, *shrunk_versions):
        raise MetadataError(
            f"format version {version!r} is not supported (this kvcanary reads "
            f"{FORMAT_VERSION!r}, {SHRUNK_FORMAT_VERSION_1_1!r} and {SHRUNK_FORMAT_VERSION!r})",
            field="kvcanary.format",
            hint="upgrade kvcanary",
        )
    shrunk = version is not None and version.strip() in shrunk_versions
    narrow = version is not None and version.strip() == SHRUNK_FORMAT_VERSION
    sparse, companions = _sparse_tensors(header, handle, narrow=narrow) if shrunk else ({}, {})
    shrink = _shrink_record(header) if shrunk else None
    notes: list[str] = []
    dtype_notes: list[DtypeNote] = []
    arrays: dict[str, np.ndarray | SparseTensor] = {}
    infos: dict[str, TensorInfo] = {}
    scalar_tensors: dict[str, int] = {}
    ignored: list[str] = []
    for name, entry in header.entries.items():
        if name in companions:
            infos[name] = TensorInfo(
                name=name,
                dtype=entry.dtype,
                shape=entry.shape,
                nbytes=entry.nbytes,
                role=companions[name],
            )
            continue
        if name in sparse:
            kept = sparse[name]
            spec = spec_for(name)
            assert spec is not None  # _sparse_tensors takes sparse-capable names only
            original = dtype_code(kept.dtype)  # what the elements were before any narrowing
            _check_tensor(replace(entry, shape=kept.shape, dtype=original), spec)
            if original != spec.canonical:
                dtype_notes.append(DtypeNote(tensor=name, found=original, expected=spec.canonical))
            infos[name] = TensorInfo(
                name=name,
                dtype=original,
                shape=kept.shape,
                nbytes=entry.nbytes,
                role=spec.role,
                kept=kept.kept,
            )
            arrays[name] = kept
            continue
        spec = spec_for(name)
        role = spec.role if spec else None
        if spec is None and name in SCALARS:
            role = "scalar"
            scalar_tensors[name] = _scalar_tensor(handle, entry)
        infos[name] = TensorInfo(
            name=name, dtype=entry.dtype, shape=entry.shape, nbytes=entry.nbytes, role=role
        )
        if spec is None:
            if role is None:
                ignored.append(name)
            continue
        _check_tensor(entry, spec)
        if entry.dtype != spec.canonical:
            dtype_notes.append(DtypeNote(tensor=name, found=entry.dtype, expected=spec.canonical))
        arrays[name] = _read_array(handle, entry)

    notes += ignored_notes(ignored, f"not part of format v{FORMAT_VERSION}")
    layout = (header.metadata.get(LAYOUT_KEY) or Layout.PAGED.value).strip()
    metadata = header.metadata
    if layout not in tuple(Layout):
        notes.append(unsupported_layout_note(layout))
        for name in [n for n in arrays if n in _KV_RECORDS or n.startswith(_KV_FAMILIES)]:
            del arrays[name]
        metadata = {k: v for k, v in metadata.items() if k not in _KV_SCALARS}
        scalar_tensors = {k: v for k, v in scalar_tensors.items() if k not in _KV_SCALARS}
    scalars, rejected = _resolve_scalars(metadata, scalar_tensors, overrides)
    values = {name: scalar.value for name, scalar in scalars.items()}
    notes.extend(_check_batch(arrays, values, rejected={r.name: r.reason for r in rejected}))
    version = header.metadata.get(releases.METADATA_KEY)  # a synthetic dump records none
    release = None if version is None else out_of_range_note(version, "this dump")
    if release is not None:
        notes.append(release)
    lut = arrays.get("full_to_swa_index_mapping")
    lut_len = None if lut is None else int(lut.shape[0])
    for name, (value, source) in _derive_scalar_defaults(values, lut_len).items():
        scalars[name] = Scalar(name=name, value=value, source=source)

    def small(name: str) -> np.ndarray | None:
        array = arrays.get(name)
        if isinstance(array, SparseTensor):
            raise AssertionError(f"{name} cannot be sparse")  # _sparse_tensors refuses it
        return None if array is None else np.asarray(array, dtype=np.int64)

    def big(name: str) -> StoredTensor | None:
        array = arrays.get(name)
        if array is None or isinstance(array, SparseTensor):
            return array
        return DenseTensor(array, mapping=array if isinstance(array, np.memmap) else None)

    rpi, prefix = _require(small("req_pool_indices")), _require(small("prefix_lens"))
    extend = small("extend_seq_lens")
    extend = np.zeros(rpi.shape[0], dtype=np.int64) if extend is None else extend
    table = big("req_to_token")
    assert table is not None  # _check_batch raised MissingTensorError otherwise
    _check_live_ranges_kept(table, rpi, prefix, extend)
    groups_override = overrides.get("groups")
    groups = _resolve_groups(
        metadata.get("groups") if groups_override is None else str(groups_override),
        has_lut=lut is not None,
        option=None if groups_override is None else "group",
    )
    ring_index = arrays.get("violation_write_index")
    has_pool = "req_to_verify_expected_tokens" in arrays
    return KvDump(
        path=header.path,
        file_size=header.file_size,
        file_state=state,
        header=header,
        tensors=infos,
        metadata=dict(header.metadata),
        scalars=scalars,
        groups=groups,
        notes=notes,
        dtype_notes=dtype_notes,
        layout=layout,
        page_tables={n: _require(small(n)) for n in arrays if n in _PAGE_TABLES},
        req_to_token=table,
        req_pool_indices=rpi,
        prefix_lens=prefix,
        extend_seq_lens=extend,
        full_to_swa_index_mapping=_lut_tensor(lut),
        req_to_verify_expected_tokens=big("req_to_verify_expected_tokens"),
        req_to_verify_expected_tokens_valid_lens=(
            small("req_to_verify_expected_tokens_valid_lens") if has_pool else None
        ),
        out_cache_loc=small("out_cache_loc"),
        input_ids=small("input_ids"),
        positions=small("positions"),
        free_full_slots=small("free_full_slots"),
        free_swa_slots=small("free_swa_slots"),
        swa_out_cache_loc=small("swa_out_cache_loc"),
        held_full_slots=small("held_full_slots"),
        tree_full_slots=small("tree_full_slots"),
        tree_swa_resident_slots=small("tree_swa_resident_slots"),
        tree_locked_full_slots=small("tree_locked_full_slots"),
        req_pool_allocated_lens=small("req_pool_allocated_lens"),
        free_req_rows=small("free_req_rows"),
        running_req_rows=small("running_req_rows"),
        req_index_to_mamba_index_mapping=small("req_index_to_mamba_index_mapping"),
        req_index_to_mamba_ping_pong_track_buffer_mapping=small(
            "req_index_to_mamba_ping_pong_track_buffer_mapping"
        ),
        free_mamba_slots=small("free_mamba_slots"),
        tree_mamba_slots=small("tree_mamba_slots"),
        req_mamba_slots=small("req_mamba_slots"),
        req_mamba_rows=small("req_mamba_rows"),
        host_free_slots=small("host_free_slots"),
        tree_host_slots=small("tree_host_slots"),
        tree_host_nodes=small("tree_host_nodes"),
        tree_host_lock_refs=small("tree_host_lock_refs"),
        swa_host_free_slots=small("swa_host_free_slots"),
        tree_swa_host_slots=small("tree_swa_host_slots"),
        tree_swa_host_nodes=small("tree_swa_host_nodes"),
        tree_swa_host_lock_refs=small("tree_swa_host_lock_refs"),
        mamba_host_free_slots=small("mamba_host_free_slots"),
        tree_mamba_host_slots=small("tree_mamba_host_slots"),
        tree_mamba_host_nodes=small("tree_mamba_host_nodes"),
        tree_mamba_host_lock_refs=small("tree_mamba_host_lock_refs"),
        violation_ring=small("violation_ring"),
        violation_write_index=(
            None if ring_index is None else int(np.asarray(ring_index).reshape(-1)[0])
        ),
        rejected_scalars=rejected,
        canary_buffers={n: _require_tensor(big(n)) for n in arrays if n.startswith("canary.")},
        real_kv_sources={n: _require_tensor(big(n)) for n in arrays if n.startswith("real_kv.")},
        shrink=shrink,
        recorded_exception=_recorded_exception(header.metadata),
        mapped={n: a for n, a in arrays.items() if isinstance(a, np.memmap)},
    )


#: The unified layout's page tables and compaction holes.
_PAGE_TABLES = tuple(
    f"{side}_{name}"
    for side in ("full", "swa")
    for name in ("virtual_to_physical", "physical_to_virtual", "physical_holes")
)
#: The Mamba layout's records (docs/dump-format.md, "hybrid-mamba").
MAMBA_RECORDS = (
    "req_index_to_mamba_index_mapping",
    "req_index_to_mamba_ping_pong_track_buffer_mapping",
    "free_mamba_slots",
    "tree_mamba_slots",
    "req_mamba_slots",
    "req_mamba_rows",
)
#: HiCache's host pool records (docs/dump-format.md, "HiCache host pool").
HOST_RECORDS = tuple(
    name
    for prefix in ("", "swa_", "mamba_")
    for name in (
        f"{prefix}host_free_slots",
        f"tree_{prefix}host_slots",
        f"tree_{prefix}host_nodes",
        f"tree_{prefix}host_lock_refs",
    )
)
#: What a dump records about its KV slots (their ids mean what its layout says): not read
#: for a layout kvcanary does not know. The batch, the table, the request pool's rows and
#: the violation ring are read as they are.
_KV_RECORDS = frozenset(
    {
        "full_to_swa_index_mapping",
        "free_full_slots",
        "free_swa_slots",
        "swa_out_cache_loc",
        "held_full_slots",
        "tree_full_slots",
        "tree_swa_resident_slots",
        "tree_locked_full_slots",
        *_PAGE_TABLES,
        *MAMBA_RECORDS,
        *HOST_RECORDS,
    }
)
_KV_FAMILIES = ("canary.", "real_kv.")
_KV_SCALARS = frozenset(
    {
        "num_full_slots",
        "num_swa_slots",
        "num_mamba_slots",
        "num_host_slots",
        "num_swa_host_slots",
        "num_mamba_host_slots",
        "host_slots_accounted",
        "groups",
    }
)


def read_in_any_layout(name: str) -> bool:
    """Whether the record `name` (a tensor, a scalar, `canary buffers`) is read whatever the
    dump's layout: a KV record of a layout kvcanary does not know is not."""
    if name in _KV_RECORDS or name in _KV_SCALARS or name.startswith(_KV_FAMILIES):
        return False
    return not name.startswith("canary")


def unsupported_layout_note(layout: str) -> str:
    """The one note of a dump whose layout kvcanary does not know: what was not checked."""
    known = ", ".join(item.value for item in Layout)
    return (
        f"layout {layout[:60]!r} is not one kvcanary checks ({known}): its pool sizes, LUT, "
        "free lists, tree records, page tables and canary buffers were not read, so pool "
        "bounds, free lists, leaks, the SWA group and canary records were not checked; the "
        "batch, the table's rows and the request pool's rows were checked"
    )


def _recorded_exception(metadata: Mapping[str, str]) -> RecordedException | None:
    """The recorded exception: its type names it (a message without one is not read)."""
    exception_type = metadata.get(EXCEPTION_TYPE_KEY, "")
    if not exception_type.strip():
        return None
    return RecordedException(
        exception_type=exception_type, message=metadata.get(EXCEPTION_MESSAGE_KEY, "")
    )


def _lut_tensor(lut: np.ndarray | SparseTensor | None) -> StoredTensor | None:
    """The LUT as stored when sparse; a dense one is read whole (never mapped) and held as
    int64, like the per-batch vectors."""
    if lut is None or isinstance(lut, SparseTensor):
        return lut
    return DenseTensor(np.asarray(lut, dtype=np.int64))


def _free_domain(
    table: StoredTensor,
    lut: StoredTensor | None,
    ring: np.ndarray | None,
    ring_index: int | None,
) -> dict[str, np.ndarray]:
    """The slots a shrunk dump's free lists speak for: those its kept cells (full) and kept
    LUT entries (SWA) hold, and those its violation ring names (`kvcanary shrink` keeps the
    free-list entries of exactly these, and nothing else asks); none for a whole dump,
    which records every slot's."""
    if not isinstance(table, SparseTensor) and not isinstance(lut, SparseTensor):
        return {}
    ring_full, ring_swa = ring_slots(ring, ring_index)
    domain = {}
    if isinstance(table, SparseTensor):
        domain["full"] = union(_distinct_int64(table.values), ring_full)
    if isinstance(lut, SparseTensor):
        domain["swa"] = union(_distinct_int64(lut.values), ring_swa)
    return domain


def _distinct_int64(values: np.ndarray) -> np.ndarray:
    """The distinct stored values as int64: sorted in their stored dtype (a uint8 table of
    ten million cells sorts ten megabytes, not eighty), then widened."""
    return distinct(np.asarray(values)).astype(np.int64)


def _check_live_ranges_kept(
    table: StoredTensor, rp: np.ndarray, prefix: np.ndarray, extend: np.ndarray
) -> None:
    """A shrunk dump keeps every batch row's live cells (`kvcanary shrink` does): then the
    analysis, whose work follows the live ranges, is bounded by what the file stores and not
    by the original shape it claims. (A dense table keeps every cell: it always passes.)"""
    rows, width = int(table.shape[0]), int(table.shape[1])
    row = np.where(rp < 0, rp + rows, rp)  # where Python indexing (the reference) reads
    live = np.minimum(prefix.clip(0, width) + extend.clip(0, width), width)
    reads = (rp != 0) & (row >= 0) & (row < rows) & (live > 0)
    start = row[reads] * width
    kept = table.kept_before(start + live[reads]) - table.kept_before(start)
    short = np.flatnonzero(kept < live[reads])
    if short.size:
        r = int(np.flatnonzero(reads)[short[0]])
        raise TensorShapeError(
            f"keeps {int(kept[short[0]])} of the {int(live[r])} live cells of batch row {r} "
            f"(pool row {int(rp[r])}); a shrunk dump keeps every batch row's live cells",
            field="req_to_token",
            hint="the shrunk dump is damaged; shrink the original again",
        )


def _require(tensor: np.ndarray | None) -> np.ndarray:
    assert tensor is not None  # _check_batch raised MissingTensorError otherwise
    return tensor


def _require_tensor(tensor: StoredTensor | None) -> StoredTensor:
    assert tensor is not None  # named from the loaded arrays
    return tensor


#: suffixes of the two tensors that complete a sparse tensor `NAME` (docs/dump-format.md).
_RUNS, _SHAPE = ".runs", ".shape"


def _sparse_tensors(
    header: SafetensorsHeader, handle: BufferedReader, *, narrow: bool
) -> tuple[dict[str, SparseTensor], dict[str, str]]:
    """The sparse tensors of a shrunk dump (`NAME` + `NAME.runs` + `NAME.shape`), checked,
    and the roles of their companion tensors. `narrow`: format 1.2 (runs as unsigned (gap,
    length) pairs, elements narrowed from the dtype `kvcanary.dtypes` gives); else 1.1."""
    names: list[str] = []
    for runs_name in header.entries:
        if not runs_name.endswith(_RUNS):
            continue
        name = runs_name[: -len(_RUNS)]
        if not sparse_capable(name):
            raise TensorShapeError(
                f"stores {name!r} sparse, which only the tables, the LUT, canary buffers and "
                "real-KV sources may be",
                field=runs_name,
            )
        for part in (name, name + _SHAPE):
            if part not in header.entries:
                raise MissingTensorError(f"is required with {runs_name}", field=part)
        _check_companion_dtype(header.entries[runs_name], RUN_DTYPES if narrow else ("I64",))
        _check_companion_dtype(header.entries[name + _SHAPE], ("I64",))
        if header.entries[name].dtype not in INTEGER_DTYPES:
            raise TensorDtypeError(
                f"dtype {dtype_label(header.entries[name].dtype)} is not accepted "
                "(expected an integer dtype)",
                field=name,
            )
        names.append(name)
    stored = {name: header.entries[name].dtype for name in names}
    original = (
        parse_original_dtypes(header.metadata.get(ORIGINAL_DTYPES_KEY), stored)
        if narrow
        else stored
    )
    sparse: dict[str, SparseTensor] = {}
    companions: dict[str, str] = {}
    for name in names:
        spec = spec_for(name)
        assert spec is not None
        sparse[name] = sparse_tensor(
            name,
            _read_array(handle, header.entries[name]),
            _read_array(handle, header.entries[name + _RUNS]),
            _read_array(handle, header.entries[name + _SHAPE]),
            spec.ranks,
            gaps=narrow,
            dtype=np.dtype(INTEGER_DTYPES[original[name]]),
        )
        pair = "gap, length" if narrow else "flat start, length"
        companions[name + _RUNS] = f"runs of {name} kept by kvcanary shrink ({pair})"
        companions[name + _SHAPE] = f"original shape of {name}"
    return sparse, companions


def _check_companion_dtype(entry: HeaderEntry, accepted: tuple[str, ...]) -> None:
    if entry.dtype not in accepted:
        want = " or ".join(dtype_label(d) for d in accepted)
        raise TensorDtypeError(
            f"dtype {dtype_label(entry.dtype)} is not accepted (expected {want})",
            field=entry.name,
        )


def _shrink_record(header: SafetensorsHeader) -> ShrinkRecord:
    text = header.metadata.get(SHRINK_KEY)
    if text is None:
        raise MetadataError(
            "is required in a shrunk dump (format 1.1 or 1.2)",
            field=SHRINK_KEY,
            hint="the shrunk dump is damaged; shrink the original again",
        )
    return parse_shrink_record(text)


def _scalar_tensor(handle: BufferedReader, entry: HeaderEntry) -> int:
    if entry.dtype not in INTEGER_DTYPES:
        raise TensorDtypeError(
            f"scalar stored as {dtype_label(entry.dtype)}, expected an integer dtype",
            field=entry.name,
        )
    if entry.numel != 1 or len(entry.shape) > 1:
        raise MetadataError(
            f"scalar tensor has shape {list(entry.shape)}, expected [] or [1]", field=entry.name
        )
    return int(np.asarray(_read_array(handle, entry)).reshape(-1)[0])


def _resolve_scalars(
    metadata: Mapping[str, str],
    scalar_tensors: Mapping[str, int],
    overrides: Mapping[str, int | str | None],
) -> tuple[dict[str, Scalar], list[RejectedScalar]]:
    """Each scalar's value and source; values out of range are rejected (an override: usage
    error naming its option; a recorded value: left unknown, and reported)."""
    resolved: dict[str, Scalar] = {}
    rejected: list[RejectedScalar] = []
    for name, spec in SCALARS.items():
        from_meta = _parse_int(name, metadata[name]) if name in metadata else None
        from_tensor = scalar_tensors.get(name)
        if from_meta is not None and from_tensor is not None and from_meta != from_tensor:
            raise MetadataError(
                f"given twice with two values: metadata says {from_meta}, "
                f"the tensor says {from_tensor}",
                field=name,
                hint="keep one of them",
            )
        override = overrides.get(name)
        if override is not None:
            value = int(override)
            if (why := spec.out_of_range(value)) is not None:
                raise OptionError(why, option=name)
            resolved[name] = Scalar(name=name, value=value, source="command line")
            continue
        recorded, source = (
            (from_meta, "metadata") if from_meta is not None else (from_tensor, "tensor")
        )
        if recorded is not None and (why := spec.out_of_range(recorded)) is not None:
            rejected.append(RejectedScalar(name=name, value=recorded, source=source, reason=why))
            recorded = None
        if recorded is None:
            resolved[name] = Scalar(name=name, value=None, source="default")
        else:
            resolved[name] = Scalar(name=name, value=recorded, source=source)
    return resolved, rejected


# Cross-tensor checks: bad input (exit 2), or notes for odd but legal input.


def _check_batch(
    arrays: Mapping[str, np.ndarray | StoredTensor],
    scalars: Mapping[str, int | None],
    *,
    rejected: Mapping[str, str] | None = None,
) -> list[str]:
    """Check presence and agreement of the batch tensors; return notes for odd-but-legal input.

    `rejected`: scalars the dump records out of range (name -> why), now unknown.
    """
    notes: list[str] = []
    for name in required_tensors():
        if name not in arrays:
            raise MissingTensorError(
                "required tensor is missing",
                field=name,
                hint="save it with kvcanary_cli.dump.writer.save_dump(..., " + name + "=...)",
            )
    bs = int(arrays["req_pool_indices"].shape[0])
    for name, spec in TENSORS.items():
        if spec.per_batch_row and name in arrays and int(arrays[name].shape[0]) != bs:
            raise TensorShapeError(
                f"has length {arrays[name].shape[0]}, expected bs={bs} "
                "(the length of req_pool_indices)",
                field=name,
            )
    has_pool = "req_to_verify_expected_tokens" in arrays
    has_valid = "req_to_verify_expected_tokens_valid_lens" in arrays
    if has_pool and not has_valid:
        raise MissingTensorError(
            "is required when req_to_verify_expected_tokens is present",
            field="req_to_verify_expected_tokens_valid_lens",
            hint="save the per-batch-row valid lengths, or drop the pool",
        )
    if has_valid and not has_pool:
        notes.append(
            "req_to_verify_expected_tokens_valid_lens is present without the pool: ignored"
        )
    if "full_to_swa_index_mapping" in arrays:
        if int(arrays["full_to_swa_index_mapping"].shape[0]) == 0:
            raise TensorShapeError(
                "is empty; upstream rejects a LUT of length 0",
                field="full_to_swa_index_mapping",
            )
        if scalars.get("swa_window_size") is None:
            why = (rejected or {}).get("swa_window_size")
            raise MetadataError(
                "is required when full_to_swa_index_mapping is present"
                if why is None
                else f"{why}: the swa group cannot be planned without a window",
                field="swa_window_size",
                hint="pass --set swa_window_size=W, or record it in the dump's metadata",
            )
    window = scalars.get("swa_window_size")
    if window is not None and window < 0:
        notes.append(f"swa_window_size={window} is negative: planned as 0, like upstream")
    _check_write_tensors(arrays)
    if "violation_write_index" in arrays and arrays["violation_write_index"].size != 1:
        raise TensorShapeError(
            f"has shape {list(arrays['violation_write_index'].shape)}, expected [] or [1]",
            field="violation_write_index",
        )
    if "violation_ring" in arrays:
        if "violation_write_index" not in arrays:
            raise MissingTensorError(
                "is required with violation_ring (it says how many rows are valid)",
                field="violation_write_index",
            )
        ring = arrays["violation_ring"]
        if ring.shape[1] != 8:
            raise TensorShapeError(
                f"has shape {list(ring.shape)}, expected [ring_capacity, 8]",
                field="violation_ring",
            )
    return notes


def _check_write_tensors(arrays: Mapping[str, np.ndarray | StoredTensor]) -> None:
    if "out_cache_loc" not in arrays:
        for name in ("input_ids", "positions"):
            if name in arrays:
                raise MissingTensorError(
                    f"out_cache_loc is required alongside {name}", field="out_cache_loc"
                )
        return
    tokens = int(arrays["out_cache_loc"].shape[0])
    for name in ("input_ids", "positions"):
        if name in arrays and int(arrays[name].shape[0]) != tokens:
            raise TensorShapeError(
                f"has length {arrays[name].shape[0]}, expected {tokens} "
                "(the length of out_cache_loc)",
                field=name,
            )


def _derive_scalar_defaults(
    scalars: Mapping[str, int | None], lut_len: int | None
) -> dict[str, tuple[int | None, str]]:
    """Values for scalars left at their default that the dump itself determines."""
    derived: dict[str, tuple[int | None, str]] = {}
    if scalars.get("num_full_slots") is None and lut_len is not None:
        derived["num_full_slots"] = (lut_len - 1, "derived (lut_len - 1)")
    for name, spec in SCALARS.items():
        if scalars.get(name) is None and isinstance(spec.default, int):
            derived[name] = (spec.default, "default")
    return derived


def _resolve_groups(
    text: str | None, *, has_lut: bool, option: str | None = None
) -> tuple[Group, ...]:
    """Parse a `groups` comma list (default: full, plus swa with a LUT).

    `option` names the command-line option the text came from (None: the dump's metadata), so
    that a bad value is blamed on the option or on the dump.
    """
    every = (Group.FULL, Group.SWA) if has_lut else (Group.FULL,)
    if text is None or not text.strip():
        return every
    names = [part.strip() for part in text.split(",") if part.strip()]
    if names == ["all"]:
        return every

    def bad(message: str, hint: str | None = None) -> Exception:
        if option is not None:
            return OptionError(message, option=option, hint=hint)
        return MetadataError(message, field="groups", hint=hint)

    for name in names:
        if name not in ("full", "swa"):
            raise bad(f"unknown group {name!r} (expected full, swa or all)")
    if "swa" in names and not has_lut:
        raise bad(
            "group swa needs full_to_swa_index_mapping, which this dump lacks",
            "plan the full group, or capture the LUT",
        )
    return tuple(Group(name) for name in dict.fromkeys(names))
