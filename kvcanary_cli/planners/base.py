"""The planner interface: `Planner.plan(dump, group) -> Plan`, shared by all backends.

A `Plan` holds SGLang's plan fields (kv-canary-semantics.md §1.3) plus what kvcanary adds to
explain bad input: which entry fields are undefined (where upstream raises or the GPU would
read out of bounds) and a columnar table of every problem met. Two semantics exist:

- "reference": SGLang's torch reference planner (REF). Problems are where REF would raise
  (`raises`), or silently misbehave (negative pool rows wrap around).
- "gpu": the production path (Triton offsets + CUDA entries). Translated slots >= lut_len are
  clamped to `LUT[lut_len-1]`; reads outside `req_to_token` are undefined; bs > 4096 or
  bs > write_req_capacity raise before launch (`launch_error`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, IntFlag, StrEnum
from typing import Protocol

import numpy as np
import torch

from kvcanary_cli.dump import KvDump
from kvcanary_cli.errors import UsageError

__all__ = [
    "GPU_MAX_BS",
    "Plan",
    "PlanProblem",
    "Planner",
    "ProblemKind",
    "ProblemRole",
    "ProblemTable",
    "Semantics",
    "Undefined",
    "failed_plan",
    "gpu_launch_error",
    "lut_error_message",
    "resolve_group",
]

#: `_PLAN_BS_BLOCK_SIZE`: the GPU plan path refuses larger batches.
GPU_MAX_BS = 4096


class Semantics(StrEnum):
    """Whose behaviour a planner reproduces on bad input (identical on valid input)."""

    REFERENCE = "reference"
    GPU = "gpu"


class Undefined(IntFlag):
    """Bits of `Plan.verify_undefined`: which fields of an entry have no defined value."""

    SLOT = 1
    PREV = 2
    TOKEN = 4


class ProblemKind(IntEnum):
    """What went wrong while planning one entry, seed or row."""

    LUT_OUT_OF_RANGE = 0
    ROW_OUT_OF_RANGE = 1
    POSITION_BEYOND_ROW = 2
    EXPECTED_TOKEN_OUT_OF_RANGE = 3

    @property
    def code(self) -> str:
        """Kebab-case name, matching the finding codes of findings.md where they overlap."""
        return self.name.lower().replace("_", "-").replace("position-beyond", "prefix-beyond")


class ProblemRole(IntEnum):
    """Which read of the plan met the problem."""

    VERIFY = 0
    CHAIN_PREV = 1
    SEED = 2
    EXPECTED_TOKEN = 3

    @property
    def label(self) -> str:
        """Provenance role name (findings.md)."""
        return self.name.lower().replace("_", "-")


#: Order of reads inside one REF entry; used to find the first raise of strict mode.
_ROLE_ORDER = {ProblemRole.VERIFY: 0, ProblemRole.CHAIN_PREV: 1, ProblemRole.EXPECTED_TOKEN: 2,
               ProblemRole.SEED: 3}


@dataclass(frozen=True, kw_only=True)
class PlanProblem:
    """One row of a `ProblemTable`, for rendering and tests."""

    kind: ProblemKind
    role: ProblemRole
    batch_row: int
    pool_row: int
    position: int
    #: the offending value: the raw slot for LUT problems, else the row or position index.
    value: int
    #: flat verify-entry index, or -1 for a seed.
    entry: int
    #: True where SGLang's reference planner raises at this read.
    raises: bool


@dataclass(frozen=True, kw_only=True)
class ProblemTable:
    """Every problem a plan met, columnar (int64 numpy arrays of equal length)."""

    kind: np.ndarray
    role: np.ndarray
    batch_row: np.ndarray
    pool_row: np.ndarray
    position: np.ndarray
    value: np.ndarray
    entry: np.ndarray
    raises: np.ndarray

    @classmethod
    def empty(cls) -> ProblemTable:
        """A table with no rows."""
        return cls.concat([])

    @classmethod
    def build(
        cls, kind: ProblemKind, role: ProblemRole, *, batch_row: object, pool_row: object,
        position: object, value: object, entry: object, raises: bool,
    ) -> ProblemTable:
        """Rows of one kind and role from equal-length arrays (or broadcastable scalars)."""
        shaped = np.broadcast_arrays(
            *(np.asarray(c, dtype=np.int64) for c in (batch_row, pool_row, position, value,
                                                       entry))
        )
        n = shaped[0].shape[0] if shaped[0].ndim else 1
        columns = [np.broadcast_to(c, (n,)).copy() for c in shaped]
        return cls(
            kind=np.full(n, int(kind), dtype=np.int64),
            role=np.full(n, int(role), dtype=np.int64),
            batch_row=columns[0],
            pool_row=columns[1],
            position=columns[2],
            value=columns[3],
            entry=columns[4],
            raises=np.full(n, raises, dtype=bool),
        )

    @classmethod
    def from_rows(cls, rows: list[PlanProblem]) -> ProblemTable:
        """A table from problem objects (the scalar reference collects these)."""
        def col(name: str) -> np.ndarray:
            return np.array([int(getattr(r, name)) for r in rows], dtype=np.int64)

        return cls.concat([cls(
            kind=col("kind"), role=col("role"), batch_row=col("batch_row"),
            pool_row=col("pool_row"), position=col("position"), value=col("value"),
            entry=col("entry"), raises=np.array([r.raises for r in rows], dtype=bool),
        )])

    @classmethod
    def concat(cls, tables: list[ProblemTable]) -> ProblemTable:
        """One table from many, in canonical order (entry order, then role, then kind)."""
        names = ("kind", "role", "batch_row", "pool_row", "position", "value", "entry", "raises")
        if not tables:
            return cls(**{n: np.zeros(0, dtype=bool if n == "raises" else np.int64)
                          for n in names})
        cols = {n: np.concatenate([getattr(t, n) for t in tables]) for n in names}
        phase = (cols["entry"] < 0).astype(np.int64)  # seeds after entries, like REF
        role_rank = np.vectorize(lambda r: _ROLE_ORDER[ProblemRole(r)], otypes=[np.int64])(
            cols["role"]) if cols["role"].size else cols["role"]
        order = np.lexsort((cols["value"], cols["position"], cols["kind"], role_rank,
                            cols["batch_row"], cols["entry"], phase))
        return cls(**{n: c[order] for n, c in cols.items()})

    def __len__(self) -> int:
        return int(self.kind.shape[0])

    def rows(self) -> list[PlanProblem]:
        """The problems as objects (for rendering a bounded number of them)."""
        return [self.rows_at(i) for i in range(len(self))]

    def first_raise(self) -> PlanProblem | None:
        """Where REF raises first (tables are kept in REF's evaluation order)."""
        hits = np.flatnonzero(self.raises)
        return self.rows_at(int(hits[0])) if hits.size else None

    def rows_at(self, index: int) -> PlanProblem:
        """One row as an object."""
        return PlanProblem(
            kind=ProblemKind(int(self.kind[index])), role=ProblemRole(int(self.role[index])),
            batch_row=int(self.batch_row[index]), pool_row=int(self.pool_row[index]),
            position=int(self.position[index]), value=int(self.value[index]),
            entry=int(self.entry[index]), raises=bool(self.raises[index]),
        )

    def same_as(self, other: ProblemTable) -> bool:
        """Exact equality of all columns."""
        return all(
            np.array_equal(getattr(self, n), getattr(other, n))
            for n in ("kind", "role", "batch_row", "pool_row", "position", "value", "entry",
                      "raises")
        )


def lut_error_message(slot: int, lut_len: int) -> str:
    """SGLang's reference error, verbatim."""
    return f"kv-canary: SWA slot {slot} is outside full_to_swa_index_mapping length {lut_len}"


@dataclass(frozen=True, kw_only=True)
class Plan:
    """One group's plan. Entry arrays hold `total_verify` entries when `enable == 1`, else 0.

    Upstream leaves the entry arrays untouched on overflow; kvcanary then holds none.
    """

    backend: str
    semantics: Semantics
    group: str
    window: int
    translated: bool
    bs: int
    verify_capacity: int
    write_req_capacity: int
    #: Σ verify_len over all rows: the entries requested, before the capacity check.
    total_verify: int
    verify_num_valid: int
    enable: int
    #: exclusive prefix sum of verify_len, int64 [bs+1] (the GPU's scratch buffer).
    verify_offsets: torch.Tensor
    verify_slot_indices: torch.Tensor
    verify_expected_tokens: torch.Tensor
    verify_expected_positions: torch.Tensor
    verify_prev_slot_indices: torch.Tensor
    #: uint8 [entries]: `Undefined` bits.
    verify_undefined: torch.Tensor
    #: int64 [min(bs, R) + 1]: upstream writes indices 0..min(bs, R).
    write_offsets: torch.Tensor
    #: int64 [min(bs, R)].
    write_seed_slot_indices: torch.Tensor
    #: bool [min(bs, R)].
    seed_undefined: torch.Tensor
    write_num_valid_reqs: int
    problems: ProblemTable = field(default_factory=ProblemTable.empty)
    #: GPU only: the error production raises before launching; outputs are then empty.
    launch_error: str | None = None

    @property
    def entries(self) -> int:
        """Number of materialized verify entries."""
        return int(self.verify_slot_indices.shape[0])

    def entry_batch_rows(self) -> torch.Tensor:
        """Batch row owning each materialized entry (int64 [entries])."""
        lens = self.verify_offsets[1:] - self.verify_offsets[:-1]
        rows = torch.repeat_interleave(torch.arange(self.bs, dtype=torch.int64), lens)
        return rows[: self.entries]

    def upstream_tensors(self) -> dict[str, torch.Tensor]:
        """The fields upstream defines, named like SGLang's VerifyPlan / WritePlan."""
        n = self.verify_num_valid if self.enable == 1 else 0
        return {
            "verify_slot_indices": self.verify_slot_indices[:n],
            "verify_expected_tokens": self.verify_expected_tokens[:n],
            "verify_expected_positions": self.verify_expected_positions[:n],
            "verify_prev_slot_indices": self.verify_prev_slot_indices[:n],
            "verify_num_valid": torch.tensor([self.verify_num_valid], dtype=torch.int32),
            "enable": torch.tensor([self.enable], dtype=torch.int32),
            "write_offsets": self.write_offsets,
            "write_seed_slot_indices": self.write_seed_slot_indices,
            "write_num_valid_reqs": torch.tensor([self.write_num_valid_reqs], dtype=torch.int32),
        }


def failed_plan(
    *, backend: str, group: str, window: int, translated: bool, bs: int, verify_capacity: int,
    write_req_capacity: int, launch_error: str,
) -> Plan:
    """The plan of a GPU launch that raised before running: no outputs, only the error."""
    empty = torch.zeros(0, dtype=torch.int64)
    return Plan(
        backend=backend, semantics=Semantics.GPU, group=group, window=window,
        translated=translated, bs=bs, verify_capacity=verify_capacity,
        write_req_capacity=write_req_capacity, total_verify=0, verify_num_valid=0, enable=0,
        verify_offsets=torch.zeros(bs + 1, dtype=torch.int64),
        verify_slot_indices=empty, verify_expected_tokens=empty,
        verify_expected_positions=empty, verify_prev_slot_indices=empty,
        verify_undefined=torch.zeros(0, dtype=torch.uint8), write_offsets=empty,
        write_seed_slot_indices=empty, seed_undefined=torch.zeros(0, dtype=torch.bool),
        write_num_valid_reqs=0, launch_error=launch_error,
    )


def gpu_launch_error(bs: int, write_req_capacity: int) -> str | None:
    """The ValueError production raises before launching the plan kernels (§1.6, §1.7)."""
    if bs > GPU_MAX_BS:
        return (
            f"kv-canary: launch_canary_plan_kernels supports at most bs={GPU_MAX_BS} reqs per "
            f"launch, got bs={bs}; bump _PLAN_BS_BLOCK_SIZE"
        )
    if bs > write_req_capacity:
        return f"kv-canary: bs={bs} exceeds write_req_capacity={write_req_capacity}"
    return None


class Planner(Protocol):
    """A backend that plans one group of a dump."""

    name: str
    semantics: Semantics

    def plan(self, dump: KvDump, group: str) -> Plan:
        """Plan `group` ('full' or 'swa') of `dump`."""
        ...


def resolve_group(dump: KvDump, group: str) -> tuple[int, torch.Tensor | None]:
    """Window and LUT (or None) for `group`; a usage error if the dump cannot plan it."""
    if group == "full":
        return 0, None
    if group == "swa":
        lut = dump.full_to_swa_index_mapping
        if lut is None:
            raise UsageError(
                "group swa needs full_to_swa_index_mapping, which this dump lacks",
                tensor="--group", hint="use --group full",
            )
        return dump.window("swa"), lut
    raise UsageError(f"unknown group {group!r} (expected full or swa)", tensor="--group")
