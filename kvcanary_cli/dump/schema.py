"""The dump format v1 as data (docs/dump-format.md is its prose).

Validation, the loader, the writer, capture, `inspect` and the CLI's scalar options all read
these tables, so the format is written down exactly once. Standard library only: the capture
hook imports it inside every server process, and `kvcanary --help` must start fast.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import IntEnum, StrEnum

__all__ = [
    "CHECK_COUNTS",
    "CHECK_COUNTS_PREFIX",
    "CANARY_TENSOR_PATTERN",
    "DTYPE_ITEMSIZE",
    "ENGINE_KEY",
    "EXCEPTION_MESSAGE_KEY",
    "EXCEPTION_TYPE_KEY",
    "FORMAT_VERSION",
    "IDENTITY_KEYS",
    "INTEGER_DTYPES",
    "LAUNCHER_ARGUMENTS",
    "LAUNCHER_FUNCTION",
    "LAUNCHER_MODULE",
    "LAUNCHER_OUTPUTS",
    "LAYOUT_KEY",
    "RESERVED_PAGES_KEY",
    "MAX_INTEGER_DIGITS",
    "ORIGINAL_DTYPES_KEY",
    "POOL_ENGINES",
    "REAL_KV_TENSOR_PATTERN",
    "SCALARS",
    "SGLANG",
    "SHRINK_KEY",
    "SHRUNK_FORMAT_VERSION",
    "SHRUNK_FORMAT_VERSION_1_1",
    "TENSORS",
    "Group",
    "LaunchTag",
    "Layout",
    "ScalarSpec",
    "TensorSpec",
    "dtype_label",
    "engine_of",
    "parse_integer",
    "required_tensors",
    "sparse_capable",
    "spec_for",
]


class Group(StrEnum):
    """A plan group: the plan over the full KV pool, or over the SWA pool through the LUT."""

    FULL = "full"
    SWA = "swa"


class LaunchTag(IntEnum):
    """The value in ring field 0: which launch (stage x half x group) recorded the row."""

    HEAD_K_FULL = 0
    HEAD_V_FULL = 1
    TAIL_K_FULL = 2
    TAIL_V_FULL = 3
    SWEEP_K_FULL = 4
    SWEEP_V_FULL = 5
    HEAD_K_SWA = 6
    HEAD_V_SWA = 7
    TAIL_K_SWA = 8
    TAIL_V_SWA = 9
    SWEEP_K_SWA = 10
    SWEEP_V_SWA = 11


class Layout(StrEnum):
    """The memory layout a dump's slot ids live in (metadata `layout`; absent: `paged`)."""

    #: the paged (or token) allocators: full-pool slot ids, the SWA side through a LUT
    PAGED = "paged"
    #: unified memory: virtual ids minted by the full side, each side's page tables bind them
    UNIFIED_SWA = "unified-swa"
    #: hybrid Mamba / linear attention: full-pool slot ids as paged, plus one Mamba state slot
    #: per request and per tree checkpoint (`MambaSlotAllocator`, slot 0 reserved)
    MAMBA = "hybrid-mamba"


#: Metadata key naming the layout; a layout kvcanary does not know is noted, not checked.
LAYOUT_KEY = "layout"
#: Metadata key: full-pool pages `0 .. N - 1` no request may hold (absent: 1, the padding page;
#: a page-interleave allocator reserves `shard_size`).
RESERVED_PAGES_KEY = "reserved_pages"

FORMAT_VERSION = "1"
#: The format `kvcanary shrink` writes: format 1 plus sparse tensors, stored in the narrowest
#: dtype that holds them, and the shrink record (docs/dump-format.md, "Shrunk dumps").
SHRUNK_FORMAT_VERSION = "1.2"
#: The first shrunk format: sparse tensors in their own dtype, runs as int64 (start, length).
#: Still read, never written.
SHRUNK_FORMAT_VERSION_1_1 = "1.1"
#: Metadata key of a shrunk dump's record: its source, and what was dropped.
SHRINK_KEY = "kvcanary.shrink"
#: Metadata key of a format-1.2 dump: the original dtype of each sparse tensor (JSON).
ORIGINAL_DTYPES_KEY = "kvcanary.dtypes"

#: Byte size of every dtype string safetensors defines. Anything else in a header is corrupt.
DTYPE_ITEMSIZE: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
    "F4": 1,
    "F6_E2M3": 1,
    "F6_E3M2": 1,
}

#: Integer dtypes kvcanary can read, as little-endian numpy dtype strings.
INTEGER_DTYPES: dict[str, str] = {
    "U8": "<u1",
    "I8": "<i1",
    "I16": "<i2",
    "U16": "<u2",
    "I32": "<i4",
    "U32": "<u4",
    "I64": "<i8",
    "U64": "<u8",
}

#: Digits a metadata integer may have: int64 needs 19; ten times that is text, not a number
#: (and `int()` of a long digit string costs quadratic time, or raises past 4300 digits).
MAX_INTEGER_DIGITS = 200
_INTEGER_TEXT = re.compile(rf"-?[0-9]{{1,{MAX_INTEGER_DIGITS}}}")


def parse_integer(text: str) -> int | None:
    """A metadata integer: optional minus sign and ASCII digits (at most
    `MAX_INTEGER_DIGITS`), nothing else (None if not).

    Stricter than `int()`, which also takes "1_0", "+5" and non-ASCII digits.
    """
    stripped = text.strip()
    return int(stripped) if _INTEGER_TEXT.fullmatch(stripped) else None


def dtype_label(dtype: str) -> str:
    """Human name of a safetensors dtype string (`I64` -> `int64`)."""
    special = {"BOOL": "bool", "BF16": "bfloat16"}
    kind = {"I": "int", "U": "uint", "F": "float"}.get(dtype[0])
    if dtype in special or kind is None or not dtype[1:].isdigit():
        return special.get(dtype, dtype.lower())
    return f"{kind}{dtype[1:]}"


@dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """One tensor of the format: its canonical dtype, what else is accepted, and its role."""

    name: str
    #: dtype the production GPU path requires.
    canonical: str
    #: other dtypes read as if they were the canonical one (with a `GPU_DTYPE_MISMATCH` note).
    accepted: tuple[str, ...] = ()
    #: number of dimensions; (0, 1) for scalars stored as tensors.
    ranks: tuple[int, ...] = (1,)
    #: a dump without it is bad input.
    required: bool = False
    #: one value per batch row: its length must equal len(req_pool_indices).
    per_batch_row: bool = False
    role: str

    @property
    def dtypes(self) -> tuple[str, ...]:
        """Every dtype the format accepts for this tensor."""
        return (self.canonical, *self.accepted)


_INDEX = ("I32",)  # int64 canonical, int32 accepted
TENSORS: dict[str, TensorSpec] = {
    spec.name: spec
    for spec in (
        TensorSpec(
            name="req_to_token",
            canonical="I32",
            accepted=("I64",),
            ranks=(2,),
            required=True,
            role="full-pool slot per (pool row, position); row 0 is padding",
        ),
        TensorSpec(
            name="req_pool_indices",
            canonical="I64",
            accepted=_INDEX,
            required=True,
            per_batch_row=True,
            role="pool row per batch row; 0 = padding",
        ),
        TensorSpec(
            name="prefix_lens",
            canonical="I64",
            accepted=_INDEX,
            required=True,
            per_batch_row=True,
            role="tokens already in the KV cache before this step",
        ),
        TensorSpec(
            name="extend_seq_lens",
            canonical="I64",
            accepted=_INDEX,
            per_batch_row=True,
            role="tokens written this step (default zeros)",
        ),
        TensorSpec(
            name="full_to_swa_index_mapping",
            canonical="I64",
            accepted=_INDEX,
            role="SWA LUT: full slot -> SWA slot (0 = unmapped); enables the swa group",
        ),
        TensorSpec(
            name="req_to_verify_expected_tokens",
            canonical="I32",
            accepted=("I64",),
            ranks=(2,),
            role="expected-token pool (pool row, token index)",
        ),
        TensorSpec(
            name="req_to_verify_expected_tokens_valid_lens",
            canonical="I64",
            accepted=_INDEX,
            per_batch_row=True,
            role="valid tokens in each batch row's expected-token pool row",
        ),
        TensorSpec(
            name="out_cache_loc",
            canonical="I64",
            accepted=_INDEX,
            role="full-pool slots written this step, flat in batch-row order",
        ),
        TensorSpec(
            name="input_ids", canonical="I64", accepted=_INDEX, role="tokens written this step"
        ),
        TensorSpec(
            name="positions", canonical="I64", accepted=_INDEX, role="positions written this step"
        ),
        TensorSpec(
            name="free_full_slots",
            canonical="I64",
            accepted=_INDEX,
            role="full-pool slots the allocator holds as free",
        ),
        TensorSpec(
            name="free_swa_slots",
            canonical="I64",
            accepted=_INDEX,
            role="SWA-pool slots the SWA allocator holds as free",
        ),
        TensorSpec(
            name="swa_out_cache_loc",
            canonical="I64",
            accepted=_INDEX,
            role="SWA-pool slots written this step, as the attention backend translated "
            "out_cache_loc (aligned with it)",
        ),
        TensorSpec(
            name="held_full_slots",
            canonical="I64",
            accepted=_INDEX,
            role="full-pool slots held by a running request or the radix tree (what SGLang's "
            "memory check counts as in use)",
        ),
        TensorSpec(
            name="tree_full_slots",
            canonical="I64",
            accepted=_INDEX,
            role="full-pool slots the radix tree holds (tombstoned nodes too)",
        ),
        TensorSpec(
            name="tree_swa_resident_slots",
            canonical="I64",
            accepted=_INDEX,
            role="the tree's full slots whose nodes keep their SWA side (not tombstoned)",
        ),
        TensorSpec(
            name="tree_locked_full_slots",
            canonical="I64",
            accepted=_INDEX,
            role="the tree's full slots whose nodes are locked (a request or a session holds them)",
        ),
        TensorSpec(
            name="req_pool_allocated_lens",
            canonical="I64",
            accepted=_INDEX,
            role="per pool row, the tokens its running request or session has allocated (0: none)",
        ),
        TensorSpec(
            name="free_req_rows",
            canonical="I64",
            accepted=_INDEX,
            role="pool rows of req_to_token the request pool holds as free",
        ),
        TensorSpec(
            name="running_req_rows",
            canonical="I64",
            accepted=_INDEX,
            role="the pool row of each running request and streaming session",
        ),
        *(
            TensorSpec(
                name=f"{side}_{name}",
                canonical="I64",
                accepted=_INDEX,
                role=f"unified layout, {side} side: {role}",
            )
            for side in ("full", "swa")
            for name, role in (
                ("virtual_to_physical", "physical page per virtual page (-1 unbound)"),
                ("physical_to_virtual", "virtual page per physical page (-1 unbound)"),
                ("physical_holes", "physical pages lazy compaction holds free inside the span"),
            )
        ),
        TensorSpec(
            name="req_index_to_mamba_index_mapping",
            canonical="I64",
            accepted=_INDEX,
            role="Mamba layout: per pool row, the Mamba slot its request works in",
        ),
        TensorSpec(
            name="req_index_to_mamba_ping_pong_track_buffer_mapping",
            canonical="I64",
            accepted=_INDEX,
            ranks=(2,),
            role="Mamba layout, extra buffer: per pool row, its ping-pong track slots (-1 empty)",
        ),
        TensorSpec(
            name="free_mamba_slots",
            canonical="I64",
            accepted=_INDEX,
            role="Mamba layout: the Mamba slot allocator's free list, in its order",
        ),
        TensorSpec(
            name="tree_mamba_slots",
            canonical="I64",
            accepted=_INDEX,
            role="Mamba layout: the Mamba slots the radix tree's nodes hold",
        ),
        TensorSpec(
            name="req_mamba_slots",
            canonical="I64",
            accepted=_INDEX,
            role="Mamba layout: each live request's Mamba slot (mamba_pool_idx; a waiting "
            "request's copy-on-write slot too), then its ping-pong slots",
        ),
        TensorSpec(
            name="req_mamba_rows",
            canonical="I64",
            accepted=_INDEX,
            role="Mamba layout: the pool row of each req_mamba_slots entry's request (-1: none; "
            "-2: a ping-pong slot)",
        ),
        TensorSpec(
            name="host_free_slots",
            canonical="I64",
            accepted=_INDEX,
            role="HiCache: the host KV pool's free slots (free_slots, then the staged "
            "release_slots), in their order, duplicates kept",
        ),
        TensorSpec(
            name="tree_host_slots",
            canonical="I64",
            accepted=_INDEX,
            role="HiCache: the host slots the radix tree's nodes hold (each node's Full "
            "host_value), node after node",
        ),
        TensorSpec(
            name="tree_host_nodes",
            canonical="I64",
            accepted=_INDEX,
            role="HiCache: aligned with tree_host_slots, the id of the node holding each",
        ),
        TensorSpec(
            name="tree_host_lock_refs",
            canonical="I64",
            accepted=_INDEX,
            role="HiCache: aligned with tree_host_slots, the holding node's host lock count "
            "(host_lock_ref)",
        ),
        TensorSpec(
            name="swa_host_free_slots",
            canonical="I64",
            accepted=_INDEX,
            role="HiCache: the SWA host pool's free slots (free_slots, then the staged "
            "release_slots), in their order, duplicates kept",
        ),
        TensorSpec(
            name="tree_swa_host_slots",
            canonical="I64",
            accepted=_INDEX,
            role="HiCache: the SWA host slots the radix tree's nodes hold (each node's "
            "SWA host_value), node after node",
        ),
        TensorSpec(
            name="tree_swa_host_nodes",
            canonical="I64",
            accepted=_INDEX,
            role="HiCache: aligned with tree_swa_host_slots, the id of the node holding each",
        ),
        TensorSpec(
            name="tree_swa_host_lock_refs",
            canonical="I64",
            accepted=_INDEX,
            role="HiCache: aligned with tree_swa_host_slots, the holding node's SWA host "
            "lock count",
        ),
        TensorSpec(
            name="mamba_host_free_slots",
            canonical="I64",
            accepted=_INDEX,
            role="HiCache: the Mamba host pool's free slots (free_slots, then the staged "
            "release_slots), in their order, duplicates kept",
        ),
        TensorSpec(
            name="tree_mamba_host_slots",
            canonical="I64",
            accepted=_INDEX,
            role="HiCache: the Mamba host slots the radix tree's nodes hold (each node's "
            "Mamba host_value), node after node",
        ),
        TensorSpec(
            name="tree_mamba_host_nodes",
            canonical="I64",
            accepted=_INDEX,
            role="HiCache: aligned with tree_mamba_host_slots, the id of the node holding each",
        ),
        TensorSpec(
            name="tree_mamba_host_lock_refs",
            canonical="I64",
            accepted=_INDEX,
            role="HiCache: aligned with tree_mamba_host_slots, the holding node's Mamba host "
            "lock count",
        ),
        TensorSpec(
            name="violation_ring",
            canonical="I64",
            ranks=(2,),
            role="violation ring rows [capacity, 8]",
        ),
        TensorSpec(
            name="violation_write_index",
            canonical="I32",
            accepted=("I64",),
            ranks=(0, 1),
            role="violations ever recorded",
        ),
    )
}

#: `canary.<group>.<head|tail>.<k|v>` buffers: uint8 [num_slots, slot_stride_bytes].
CANARY_TENSOR_PATTERN = re.compile(r"^canary\.(full|swa)\.(head|tail)\.(k|v)$")
_CANARY_SPEC = TensorSpec(
    name="canary.<group>.<head|tail>.<k|v>",
    canonical="U8",
    ranks=(2,),
    role="canary buffer [num_slots, slot_stride_bytes]",
)


#: `real_kv.<group>.<k|v>`: the layer-0 KV bytes a TAIL canary fingerprints (docs/canary.md §3).
REAL_KV_TENSOR_PATTERN = re.compile(r"^real_kv\.(full|swa)\.(k|v)$")
_REAL_KV_SPEC = TensorSpec(
    name="real_kv.<group>.<k|v>",
    canonical="U8",
    ranks=(2,),
    role="real-KV source of the tail canary [rows, row_bytes]",
)


def spec_for(name: str) -> TensorSpec | None:
    """The spec of a tensor name, including the canary buffer and real-KV source families;
    None if unknown."""
    if name in TENSORS:
        return TENSORS[name]
    if CANARY_TENSOR_PATTERN.match(name):
        return _CANARY_SPEC
    if REAL_KV_TENSOR_PATTERN.match(name):
        return _REAL_KV_SPEC
    return None


_SPARSE_TENSORS = ("req_to_token", "req_to_verify_expected_tokens", "full_to_swa_index_mapping")


def sparse_capable(name: str) -> bool:
    """The big tensors a shrunk dump may store sparse: the tables, the LUT, canary buffers and
    real-KV sources (everything else is small and kept whole)."""
    return (
        name in _SPARSE_TENSORS
        or CANARY_TENSOR_PATTERN.match(name) is not None
        or REAL_KV_TENSOR_PATTERN.match(name) is not None
    )


def required_tensors() -> tuple[str, ...]:
    """Tensors without which a file is not a dump, in table order."""
    return tuple(name for name, spec in TENSORS.items() if spec.required)


@dataclass(frozen=True, kw_only=True)
class ScalarSpec:
    """One scalar: its default when absent, and the smallest and largest legal values."""

    name: str
    #: what applies when neither the dump nor the command line gives a value: a constant, or
    #: a description of where the value is derived from.
    default: int | str
    meaning: str
    #: the smallest and largest values SGLang could have used (None: no bound). A dump
    #: value outside is corrupt metadata (a finding; the scalar is then unknown); a
    #: command-line value outside is a usage error.
    minimum: int | None = None
    maximum: int | None = None

    @property
    def option(self) -> str:
        """How a user overrides the dump's value (the command line's `--set`)."""
        return f"--set {self.name}=N"

    def out_of_range(self, value: int) -> str | None:
        """Why `value` cannot be this scalar (None: it can)."""
        if self.minimum is not None and value < self.minimum:
            return f"is {value}, must be >= {self.minimum}"
        if self.maximum is not None and value > self.maximum:
            return f"is {value}, beyond what SGLang could use (<= {self.maximum})"
        return None


#: Plan counts and capacities are int32 in SGLang's plan tensors.
_INT32_LIMIT = 1 << 31
#: Lengths (and windows) beyond this are corrupt, not long: a 4 TB req_to_token row.
_MAX_LENGTH = 1 << 40
#: KV pool rows beyond this are corrupt: a KV cache of more than 2^48 tokens.
_MAX_SLOTS = 1 << 48

SCALARS: dict[str, ScalarSpec] = {
    spec.name: spec
    for spec in (
        ScalarSpec(
            name="swa_window_size",
            default="none",
            meaning="window W of the swa group; required with a LUT",
            minimum=-_INT32_LIMIT,
            maximum=_MAX_LENGTH,
        ),
        ScalarSpec(
            name="verify_capacity",
            default="total requested entries (no overflow)",
            meaning="verify capacity of each group's plan",
            minimum=0,
            maximum=_INT32_LIMIT - 1,
        ),
        ScalarSpec(
            name="write_req_capacity",
            default="bs",
            meaning="write capacity (length of write_seed_slot_indices)",
            minimum=0,
            maximum=_INT32_LIMIT - 1,
        ),
        ScalarSpec(
            name="kv_token_id_vs_position_offset",
            default=0,
            meaning="0 for target pools, 1 for EAGLE draft pools",
            minimum=-_INT32_LIMIT,
            maximum=_INT32_LIMIT - 1,
        ),
        ScalarSpec(
            name="page_size",
            default=1,
            meaning="KV page size",
            minimum=1,
            maximum=_INT32_LIMIT - 1,
        ),
        ScalarSpec(
            name="num_full_slots",
            default="lut_len - 1 with a LUT, else unknown",
            meaning="rows of the full KV pool (size + page_size)",
            minimum=0,
            maximum=_MAX_SLOTS,
        ),
        ScalarSpec(
            name="num_swa_slots",
            default="unknown",
            meaning="rows of the SWA KV pool",
            minimum=0,
            maximum=_MAX_SLOTS,
        ),
        ScalarSpec(
            name="num_mamba_slots",
            default="unknown",
            meaning="Mamba layout: slots of the Mamba state pool (size + 1: slot 0 is reserved)",
            minimum=0,
            maximum=_MAX_SLOTS,
        ),
        ScalarSpec(
            name="num_host_slots",
            default="unknown",
            meaning="HiCache: slots of the host KV pool (its logical size)",
            minimum=0,
            maximum=_MAX_SLOTS,
        ),
        ScalarSpec(
            name="num_swa_host_slots",
            default="unknown",
            meaning="HiCache: slots of the SWA host pool (its logical size)",
            minimum=0,
            maximum=_MAX_SLOTS,
        ),
        ScalarSpec(
            name="num_mamba_host_slots",
            default="unknown",
            meaning="HiCache: slots of the Mamba host pool (its logical size)",
            minimum=0,
            maximum=_MAX_SLOTS,
        ),
        ScalarSpec(
            name="host_slots_accounted",
            default="unknown: no host leak is claimed",
            meaning="HiCache: 1 when the capture ruled out every holder of a host slot but "
            "the free lists and the tree's nodes (no storage tier holding a slot in flight, "
            "no buffer-only host memory, no disaggregated decode, no release queued), so a "
            "slot in neither is leaked",
            minimum=0,
            maximum=1,
        ),
    )
}

#: HiCache's host pools a dump may record, by name, each with its records' prefix
#: (`<prefix>host_free_slots`, `tree_<prefix>host_slots`, `num_<prefix>host_slots` ...): the
#: anchor (the Full KV's host pool) first.
HOST_POOL_PREFIXES = {"kv": "", "swa": "swa_", "mamba": "mamba_"}

#: Free-form identity keys, in the order reports show them.
IDENTITY_KEYS: tuple[str, ...] = (
    "sglang.version",
    "sglang.commit",
    "model",
    "rank",
    "step",
    "forward_mode",
    "captured_at",
    "note",
)

#: The exception SGLang's plan launcher raised on the dumped call (the capture hook's `raise`
#: dumps): its type's name and its message, as two metadata strings.
EXCEPTION_TYPE_KEY = "sglang.exception.type"
EXCEPTION_MESSAGE_KEY = "sglang.exception.message"

#: The counts SGLang's memory check printed, as a leak dump's metadata integers
#: (`sglang.check.<pool>.<count>`: the capture hook writes them, the leak accounting reads them).
CHECK_COUNTS_PREFIX = "sglang.check."
CHECK_COUNTS = ("total", "available", "evictable", "protected", "session_held", "uncached")

#: Module and function of SGLang's plan launcher (`kernels/ops/kv_canary/plan/api.py`).
LAUNCHER_MODULE = "sglang.kernels.ops.kv_canary.plan.api"
LAUNCHER_FUNCTION = "launch_canary_plan_kernels"

#: Outputs SGLang's plan launcher fills in place: a dump records their capacities only.
LAUNCHER_OUTPUTS: tuple[str, ...] = ("verify_plan_out", "write_plan_out")

#: Keyword arguments of SGLang's `launch_canary_plan_kernels`, in upstream order
#: (docs/semantics.md §1.1): every one is a tensor or scalar of the format, or an output.
LAUNCHER_ARGUMENTS: tuple[str, ...] = (
    "req_pool_indices",
    "prefix_lens",
    "extend_seq_lens",
    "req_to_token",
    "swa_window_size",
    "full_to_swa_index_mapping",
    "verify_capacity",
    "req_to_verify_expected_tokens",
    "req_to_verify_expected_tokens_valid_lens",
    "kv_token_id_vs_position_offset",
    *LAUNCHER_OUTPUTS,
)


#: The metadata key naming the engine a dump describes.
ENGINE_KEY = "kvcanary.engine"
#: The engine of a dump without `kvcanary.engine`.
SGLANG = "sglang"


def engine_of(metadata: dict[str, str]) -> str:
    """The engine a dump's metadata names (SGLang when it names none)."""
    return metadata.get(ENGINE_KEY, SGLANG).strip().lower() or SGLANG


#: The engines whose dumps are block pools (`kvcanary_cli.engines` checks them).
POOL_ENGINES = ("vllm",)
