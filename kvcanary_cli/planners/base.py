"""The planner interface: `Planner.plan(dump, group) -> Plan`, shared by all backends.

A `Plan` holds SGLang's plan fields (docs/semantics.md §1.3) plus what kvcanary adds to
explain bad input: which entry fields are undefined (where upstream raises or the GPU would
read out of bounds) and a columnar table of every problem met. Two semantics exist:

- "reference": SGLang's torch reference planner (REF). Problems are where REF would raise
  (`raises`), or silently misbehave (negative pool rows wrap around).
- "gpu": the production path (Triton offsets + CUDA entries). Translated slots >= lut_len are
  clamped to `LUT[lut_len-1]`; reads outside `req_to_token` are undefined; bs > 4096 or
  bs > write_req_capacity raise before launch (`launch_error`).

Row-level problems (a bad pool row, a prefix past the row, an expected-token gather outside
the pool) are kvcanary's annotations, not plan outputs: every backend derives them on the host
from the group's frame with `row_problems`, one implementation, so they cannot drift apart.

What upstream raises follows from a plan of the same inputs: REF raises at the first bad read
(docs/semantics.md §1.6), the GPU path only before launching (§1.5), and a plan records every
problem in REF's order, so where REF raises and the error it raises, message included, are
computed from it once (`reference_raise`): the strict reference raises it, `check` marks it
and matches it against what an upstream planner or the capture hook recorded, a plan file
records it, and `selftest` compares the two.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import IntEnum, IntFlag, StrEnum
from typing import Protocol

import numpy as np

from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.errors import UpstreamPlanError
from kvcanary_cli.planners.frame import GroupFrame

__all__ = [
    "NOT_LAUNCHED",
    "Plan",
    "PlanProblem",
    "Planner",
    "ProblemKind",
    "ProblemRole",
    "ProblemTable",
    "ReferenceRaise",
    "ClampFlag",
    "ColumnFill",
    "SeedFlag",
    "Semantics",
    "Undefined",
    "VerifyEntries",
    "assemble_plan",
    "expected_raise",
    "failed_plan",
    "held_narrow",
    "raised",
    "raised_plan",
    "reference_raise",
    "skipped_plan",
    "lut_error_message",
    "python_rows_resolve",
    "row_problems",
    "upstream_error",
]


class Semantics(StrEnum):
    """Whose behaviour a planner reproduces on bad input (identical on valid input)."""

    REFERENCE = "reference"
    GPU = "gpu"


class Undefined(IntFlag):
    """Bits of `Plan.verify_undefined`: which fields of an entry have no defined value."""

    SLOT = 1
    PREV = 2
    TOKEN = 4


class SeedFlag(IntFlag):
    """Bits the GPU offsets step reports per write seed (kvcanary's instrumentation)."""

    #: the seed read fell outside `req_to_token`.
    UNDEFINED = 1
    #: the seed slot was >= lut_len and clamped.
    CLAMPED = 2


class ClampFlag(IntFlag):
    """Bits the GPU entries step reports per verify entry: which translated slot was clamped."""

    SLOT = 1
    PREV = 2


class ProblemKind(IntEnum):
    """What went wrong while planning one entry, seed or row; `code` is its finding code."""

    LUT_OUT_OF_RANGE = 0
    ROW_OUT_OF_RANGE = 1
    PREFIX_BEYOND_ROW = 2
    EXPECTED_TOKEN_OUT_OF_RANGE = 3

    @property
    def code(self) -> FindingCode:
        """The finding code this problem is reported under (the member of the same name)."""
        return FindingCode[self.name]

    @property
    def row_level(self) -> bool:
        """A bad row spoils every later entry of its batch row, not just one."""
        return self in (ProblemKind.ROW_OUT_OF_RANGE, ProblemKind.PREFIX_BEYOND_ROW)


class ProblemRole(IntEnum):
    """Which read of the plan met the problem, numbered in REF's order within one entry.

    REF reads an entry's verify slot, then its chain predecessor, then its expected token;
    seeds come after all entries. The same order picks the role a finding shows when one
    cell is read in several roles (a verify slot at p is the chain-prev of p+1).
    """

    VERIFY = 0
    CHAIN_PREV = 1
    EXPECTED_TOKEN = 2
    SEED = 3

    @property
    def label(self) -> str:
        """Provenance role name (docs/findings.md)."""
        return self.name.lower().replace("_", "-")


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


#: The columns of a `ProblemTable`.
_PROBLEM_COLUMNS = ("kind", "role", "batch_row", "pool_row", "position", "value", "entry", "raises")


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
        cls,
        kind: ProblemKind,
        role: ProblemRole,
        *,
        batch_row: object,
        pool_row: object,
        position: object,
        value: object,
        entry: object,
        raises: bool,
    ) -> ProblemTable:
        """Rows of one kind and role from equal-length arrays (or broadcastable scalars)."""
        shaped = np.broadcast_arrays(
            *(np.asarray(c, dtype=np.int64) for c in (batch_row, pool_row, position, value, entry))
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

        return cls.concat(
            [
                cls(
                    kind=col("kind"),
                    role=col("role"),
                    batch_row=col("batch_row"),
                    pool_row=col("pool_row"),
                    position=col("position"),
                    value=col("value"),
                    entry=col("entry"),
                    raises=np.array([r.raises for r in rows], dtype=bool),
                )
            ]
        )

    @classmethod
    def concat(cls, tables: list[ProblemTable]) -> ProblemTable:
        """One table from many, in canonical order (entry order, then role, then kind)."""
        joined = cls.joined(tables)
        return joined.take(joined.canonical_order(np.arange(len(joined))))

    @classmethod
    def joined(cls, tables: list[ProblemTable]) -> ProblemTable:
        """One table from many, in no particular order (for lookups that need none: sorting a
        million LUT problems costs more than the lookups)."""
        names = _PROBLEM_COLUMNS
        if not tables:
            return cls(**{n: np.zeros(0, dtype=bool if n == "raises" else np.int64) for n in names})
        return cls(**{n: np.concatenate([getattr(t, n) for t in tables]) for n in names})

    def canonical_order(self, index: np.ndarray) -> np.ndarray:
        """`index` (rows of this table) in canonical order: REF's evaluation order, entries
        first and seeds after them, then role, kind, position and value."""
        phase = (self.entry[index] < 0).astype(np.int64)
        order = np.lexsort(
            (
                self.value[index],
                self.position[index],
                self.kind[index],
                self.role[index],
                self.batch_row[index],
                self.entry[index],
                phase,
            )
        )
        ordered: np.ndarray = index[order]
        return ordered

    def take(self, index: np.ndarray) -> ProblemTable:
        """The rows at `index`, in that order."""
        return ProblemTable(**{n: getattr(self, n)[index] for n in _PROBLEM_COLUMNS})

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
            kind=ProblemKind(int(self.kind[index])),
            role=ProblemRole(int(self.role[index])),
            batch_row=int(self.batch_row[index]),
            pool_row=int(self.pool_row[index]),
            position=int(self.position[index]),
            value=int(self.value[index]),
            entry=int(self.entry[index]),
            raises=bool(self.raises[index]),
        )

    def same_as(self, other: ProblemTable) -> bool:
        """Exact equality of all columns."""
        return all(
            np.array_equal(getattr(self, n), getattr(other, n))
            for n in (
                "kind",
                "role",
                "batch_row",
                "pool_row",
                "position",
                "value",
                "entry",
                "raises",
            )
        )


#: Signed dtypes an entry column may be held in, narrowest first (a -1 is common).
_NARROW_DTYPES = (np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32))


def held_narrow(values: np.ndarray) -> np.ndarray:
    """Integer `values` in the narrowest signed dtype holding every one of them (themselves
    when none is narrower): ten million entries of a small pool hold a few bytes each, not
    eight. The dtype follows the values, so two plans of equal entries hold equal dtypes."""
    if values.dtype.kind not in "iu" or values.size == 0:
        return values
    low, high = int(values.min()), int(values.max())
    for dtype in _NARROW_DTYPES:
        if dtype.itemsize >= values.dtype.itemsize:
            break
        limits = np.iinfo(dtype)
        if limits.min <= low and high <= limits.max:
            return values.astype(dtype)
    return values


class ColumnFill:
    """One column of `size` values filled a piece at a time, each piece held narrow
    (`held_narrow`) already: the column `np.concatenate` would join from the pieces (their
    widest dtype, which `held_narrow` gives the whole), never held twice (the pieces and the
    joined copy: 60 MB beside the 60 MB of a plan of ten million entries). A piece wider than
    those before it widens what is filled so far (rare: values that grow past a byte or two);
    an empty piece decides nothing."""

    __slots__ = ("_size", "filled", "values")

    def __init__(self, size: int) -> None:
        self.values = np.zeros(0, dtype=np.int64) if size == 0 else None
        self.filled = 0
        self._size = size

    def put(self, piece: np.ndarray) -> None:
        """Append `piece` (held narrow already); an empty one decides nothing."""
        if piece.size == 0:
            return
        if self.values is None:
            self.values = np.empty(self._size, dtype=piece.dtype)
        elif (wider := np.result_type(self.values.dtype, piece.dtype)) != self.values.dtype:
            grown = np.empty(self.values.size, dtype=wider)
            grown[: self.filled] = self.values[: self.filled]
            self.values = grown
        self.values[self.filled : self.filled + piece.size] = piece
        self.filled += piece.size

    def column(self) -> np.ndarray:
        """The filled column (every value put: `size` of them)."""
        assert self.values is not None and self.filled == self.values.size, "not filled"
        return self.values


@dataclass(frozen=True, kw_only=True)
class VerifyEntries:
    """The materialized verify entries of a plan: equal-length integer columns, each held in
    the narrowest signed dtype its values fit once in a `Plan` (`held_narrow`: compare, count
    and index with them; widen to int64 before arithmetic), flags uint8."""

    slot: np.ndarray
    expected_token: np.ndarray
    position: np.ndarray
    prev_slot: np.ndarray
    #: `Undefined` bits per entry.
    undefined: np.ndarray

    @classmethod
    def empty(cls) -> VerifyEntries:
        """No entries (overflow, or an empty batch)."""
        none = np.zeros(0, dtype=np.int64)
        return cls(
            slot=none,
            expected_token=none,
            position=none,
            prev_slot=none,
            undefined=np.zeros(0, dtype=np.uint8),
        )


@dataclass(frozen=True, kw_only=True)
class Plan:
    """One group's plan. Entry arrays hold `total_verify` entries when `enable == 1`, else 0.

    Upstream leaves the entry arrays untouched on overflow; kvcanary then holds none. The
    frame (geometry, LUT, capacities) is the one every backend planned from; build plans with
    `assemble_plan` (below). The four integer entry columns are held narrow (`held_narrow`:
    a check compares two plans of ten million entries at a few bytes an entry, not 33);
    `upstream_tensors` reads them back as int64.
    """

    backend: str
    semantics: Semantics
    frame: GroupFrame
    #: Σ verify_len over all rows: the entries requested, before the capacity check.
    total_verify: int
    verify_num_valid: int
    enable: int
    #: exclusive prefix sum of verify_len, int64 [bs+1] (the GPU's scratch buffer).
    verify_offsets: np.ndarray
    verify_slot_indices: np.ndarray
    verify_expected_tokens: np.ndarray
    verify_expected_positions: np.ndarray
    verify_prev_slot_indices: np.ndarray
    #: uint8 [entries]: `Undefined` bits.
    verify_undefined: np.ndarray
    #: int64 [min(bs, R) + 1]: upstream writes indices 0..min(bs, R).
    write_offsets: np.ndarray
    #: int64 [min(bs, R)].
    write_seed_slot_indices: np.ndarray
    #: bool [min(bs, R)].
    seed_undefined: np.ndarray
    write_num_valid_reqs: int
    problems: ProblemTable = field(default_factory=ProblemTable.empty)
    #: the error the launch raised (production's GPU path refusing the batch, or an upstream
    #: planner run by kvcanary); outputs are then empty.
    launch_error: str | None = None
    #: the exception type of `launch_error` (`ValueError`, `IndexError`, ...).
    launch_error_type: str = "ValueError"
    #: why kvcanary planned no entry of this group (corrupt lengths asking for more entries
    #: than the table can hold; `GroupFrame.unplannable`); outputs are then empty.
    skipped: str | None = None
    #: the entries were planned (their problems are all here) but not kept: a check that reads
    #: no entry (no canary buffer to replay, no kernel to compare) does not hold them. Entry
    #: arrays are then empty; `entry_arrays` refuses such a plan.
    entries_dropped: bool = False

    @property
    def group(self) -> Group:
        """The group planned."""
        return self.frame.group

    @property
    def window(self) -> int:
        """Window W the group was planned with (0 for full)."""
        return self.frame.window

    @property
    def translated(self) -> bool:
        """Slots went through the SWA LUT."""
        return self.frame.lut is not None

    @property
    def bs(self) -> int:
        """Batch size, padding rows included."""
        return self.frame.bs

    @property
    def verify_capacity(self) -> int:
        """Capacity the plan was checked against."""
        return self.frame.verify_capacity

    @property
    def write_req_capacity(self) -> int:
        """Length of `write_seed_slot_indices` upstream allocates."""
        return self.frame.write_req_capacity

    @property
    def entries(self) -> int:
        """Number of materialized verify entries."""
        return int(self.verify_slot_indices.shape[0])

    def entry_arrays(self) -> Plan:
        """This plan, for a reader of its entries: `ValueError` when they were not kept
        (`entries_dropped`), never an empty plan read as one with no entries."""
        if self.entries_dropped:
            raise ValueError(f"the {self.group} plan's entries were not kept")
        return self

    def entry_batch_rows(self) -> np.ndarray:
        """Batch row owning each materialized entry (int64 [entries])."""
        lens = self.verify_offsets[1:] - self.verify_offsets[:-1]
        rows = np.repeat(np.arange(self.bs, dtype=np.int64), lens)
        return rows[: self.entries]

    def upstream_tensors(self) -> dict[str, np.ndarray]:
        """The fields upstream defines, named like SGLang's VerifyPlan / WritePlan (entry
        columns read back as int64, upstream's dtype)."""
        n = self.verify_num_valid if self.enable == 1 else 0
        self.entry_arrays()
        return {
            "verify_slot_indices": _wide(self.verify_slot_indices[:n]),
            "verify_expected_tokens": _wide(self.verify_expected_tokens[:n]),
            "verify_expected_positions": _wide(self.verify_expected_positions[:n]),
            "verify_prev_slot_indices": _wide(self.verify_prev_slot_indices[:n]),
            "verify_num_valid": np.array([self.verify_num_valid], dtype=np.int32),
            "enable": np.array([self.enable], dtype=np.int32),
            "write_offsets": self.write_offsets,
            "write_seed_slot_indices": self.write_seed_slot_indices,
            "write_num_valid_reqs": np.array([self.write_num_valid_reqs], dtype=np.int32),
        }


def _wide(values: np.ndarray) -> np.ndarray:
    """An entry column as int64 (the array itself when it is held so)."""
    return values.astype(np.int64, copy=False)


def assemble_plan(
    frame: GroupFrame,
    *,
    backend: str,
    semantics: Semantics,
    entries: VerifyEntries,
    seeds: np.ndarray,
    seed_undefined: np.ndarray,
    problems: ProblemTable,
    kernel_totals: tuple[int, int, int] | None = None,
    verify_offsets: np.ndarray | None = None,
    write_offsets: np.ndarray | None = None,
    write_num_valid_reqs: int | None = None,
    launch_error: str | None = None,
    launch_error_type: str = "ValueError",
    entries_dropped: bool = False,
) -> Plan:
    """The one place a `Plan` is built.

    Host backends take totals and offsets from the frame; a kernel passes the ones it
    computed itself (`kernel_totals` = total_verify, verify_num_valid, enable) so that the
    comparison with the reference checks them.
    """
    total, num_valid, enable = kernel_totals or (
        frame.total_verify,
        frame.verify_num_valid,
        frame.enable,
    )
    return Plan(
        backend=backend,
        semantics=semantics,
        frame=frame,
        total_verify=total,
        verify_num_valid=num_valid,
        enable=enable,
        verify_offsets=frame.verify_offsets if verify_offsets is None else verify_offsets,
        verify_slot_indices=held_narrow(entries.slot),
        verify_expected_tokens=held_narrow(entries.expected_token),
        verify_expected_positions=held_narrow(entries.position),
        verify_prev_slot_indices=held_narrow(entries.prev_slot),
        verify_undefined=entries.undefined,
        write_offsets=frame.write_offsets if write_offsets is None else write_offsets,
        write_seed_slot_indices=seeds,
        seed_undefined=seed_undefined,
        write_num_valid_reqs=frame.bs if write_num_valid_reqs is None else write_num_valid_reqs,
        problems=problems,
        launch_error=launch_error,
        launch_error_type=launch_error_type,
        entries_dropped=entries_dropped,
    )


def skipped_plan(
    frame: GroupFrame, *, backend: str, semantics: Semantics, problems: ProblemTable
) -> Plan:
    """The plan of a group whose entries kvcanary does not plan (`frame.unplannable`): the
    frame's totals, the once-per-row `problems` (so the first raise is still known), no
    entries, no seeds, and the reason."""
    assert frame.unplannable is not None
    plan = _plan_without_outputs(frame, backend=backend, semantics=semantics, problems=problems)
    return replace(plan, skipped=frame.unplannable)


def failed_plan(frame: GroupFrame, *, backend: str) -> Plan:
    """The plan of a GPU launch that raised before running: no outputs, only the error."""
    assert frame.launch is not None
    return raised_plan(
        frame, backend=backend, semantics=Semantics.GPU, message=frame.launch.message
    )


def raised_plan(
    frame: GroupFrame,
    *,
    backend: str,
    semantics: Semantics,
    message: str,
    exception_type: str = "ValueError",
) -> Plan:
    """The plan of a launch that raised: no outputs, only the error and its type."""
    return _plan_without_outputs(
        frame,
        backend=backend,
        semantics=semantics,
        problems=ProblemTable.empty(),
        kernel_totals=(0, 0, 0),
        launch_error=message,
        launch_error_type=exception_type,
    )


def _plan_without_outputs(
    frame: GroupFrame,
    *,
    backend: str,
    semantics: Semantics,
    problems: ProblemTable,
    kernel_totals: tuple[int, int, int] | None = None,
    launch_error: str | None = None,
    launch_error_type: str = "ValueError",
) -> Plan:
    """A plan with no entries, seeds or offsets (zeros), for a group left unplanned or a
    launch that raised."""
    empty = np.zeros(0, dtype=np.int64)
    return assemble_plan(
        frame,
        backend=backend,
        semantics=semantics,
        entries=VerifyEntries.empty(),
        seeds=empty,
        seed_undefined=np.zeros(0, dtype=bool),
        problems=problems,
        kernel_totals=kernel_totals,
        verify_offsets=np.zeros(frame.bs + 1, dtype=np.int64),
        write_offsets=empty,
        write_num_valid_reqs=0,
        launch_error=launch_error,
        launch_error_type=launch_error_type,
    )


def lut_error_message(slot: int, lut_len: int) -> str:
    """SGLang's reference error, verbatim."""
    return f"kv-canary: SWA slot {slot} is outside full_to_swa_index_mapping length {lut_len}"


#: `Plan.launch_error_type` of a launch kvcanary declined to run (an upstream GPU kernel that
#: would read outside its tensors); never an upstream raise.
NOT_LAUNCHED = "NotLaunched"


def upstream_error(problem: PlanProblem, frame: GroupFrame) -> UpstreamPlanError:
    """The exception REF raises at `problem` (one of its raising problems), message verbatim."""
    if problem.kind is ProblemKind.LUT_OUT_OF_RANGE:
        return UpstreamPlanError(lut_error_message(problem.value, frame.lut_len))
    if problem.kind is ProblemKind.EXPECTED_TOKEN_OUT_OF_RANGE:
        shape = frame.pool_shape or (0, 0)
        dim = 0 if problem.value == problem.pool_row else 1
    else:
        shape = frame.table_shape
        dim = 0 if problem.kind is ProblemKind.ROW_OUT_OF_RANGE else 1
    return UpstreamPlanError(
        f"index {problem.value} is out of bounds for dimension {dim} with size {shape[dim]}",
        exception_type="IndexError",
    )


@dataclass(frozen=True, kw_only=True)
class ReferenceRaise:
    """Where REF raises on one group's inputs (its first raising read, in its own order), and
    the exception it raises there."""

    group: Group
    problem: PlanProblem
    error: UpstreamPlanError


def reference_raise(plan: Plan) -> ReferenceRaise | None:
    """Where and what REF raises at the first raising problem `plan` recorded (None: nothing
    there raises)."""
    first = plan.problems.first_raise()
    if first is None:
        return None
    return ReferenceRaise(group=plan.group, problem=first, error=upstream_error(first, plan.frame))


def raised(plan: Plan) -> UpstreamPlanError | None:
    """What the planner that made `plan` raised: its launch error, or, for a reference planner
    in collect mode, the error it would have raised first (None: it ran through)."""
    if plan.launch_error is not None:
        return UpstreamPlanError(plan.launch_error, exception_type=plan.launch_error_type)
    first = reference_raise(plan)
    return None if first is None else first.error


def expected_raise(reference: Plan, semantics: Semantics) -> UpstreamPlanError | None:
    """What upstream raises, with `semantics`, on the inputs `reference` (a REF plan) planned.

    REF raises at the reference plan's first raising problem; the GPU path only refuses a
    batch before launching (`frame.launch`).
    """
    if semantics is Semantics.REFERENCE:
        return raised(reference)
    launch = reference.frame.launch
    return None if launch is None else UpstreamPlanError(launch.message)


class Planner(Protocol):
    """A backend that plans one group of a dump.

    `semantics` says whose behaviour it reproduces on bad input; `mode` how it runs
    ("compiled", "interpreter", or None for host code), for reports.
    """

    name: str
    semantics: Semantics

    @property
    def mode(self) -> str | None:
        """How the planner executes (None: plain host code)."""
        ...

    def plan(self, dump: KvDump, group: str) -> Plan:
        """Plan `group` ('full' or 'swa') of `dump`."""
        ...


def python_rows_resolve(rpi: np.ndarray, rows: int) -> np.ndarray:
    """Where Python indexing reaches a row (REF: negative indices wrap, others raise)."""
    row = np.where(rpi < 0, rpi + rows, rpi)
    return (row >= 0) & (row < rows)


def row_problems(dump: KvDump, frame: GroupFrame, *, gpu: bool) -> ProblemTable:
    """Once-per-row problems, each at the first entry it affects.

    REF problems raise where SGLang's reference raises (negative pool rows wrap silently);
    GPU problems never raise.
    """
    rpi, prefix = dump.req_pool_indices, dump.prefix_lens
    ws, offsets = frame.window_start, frame.verify_offsets
    has = frame.verify_len > 0
    in_range = (rpi >= 0) & (rpi < dump.max_reqs)
    resolves = in_range if gpu else python_rows_resolve(rpi, dump.max_reqs)
    tables: list[ProblemTable] = []

    def add(
        kind: ProblemKind,
        role: ProblemRole,
        mask: np.ndarray,
        position: np.ndarray,
        value: np.ndarray,
        raises: np.ndarray | bool,
    ) -> None:
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            return
        table = ProblemTable.build(
            kind,
            role,
            batch_row=idx,
            pool_row=rpi[idx],
            position=position[idx],
            value=value[idx],
            entry=offsets[idx] + position[idx] - ws[idx],
            raises=False,
        )
        if not gpu:
            table.raises[:] = raises if isinstance(raises, bool) else raises[idx]
        tables.append(table)

    add(ProblemKind.ROW_OUT_OF_RANGE, ProblemRole.VERIFY, has & ~in_range, ws, rpi, ~resolves)
    beyond = np.maximum(ws, dump.max_seq_len)
    add(
        ProblemKind.PREFIX_BEYOND_ROW,
        ProblemRole.VERIFY,
        has & resolves & (prefix > dump.max_seq_len),
        beyond,
        beyond,
        True,
    )
    pool = dump.req_to_verify_expected_tokens
    valid = dump.req_to_verify_expected_tokens_valid_lens
    if pool is not None and valid is not None:
        off = dump.token_offset
        rows, cols = int(pool.shape[0]), int(pool.shape[1])
        s_lo = np.maximum(ws + off, 0)  # first gathered token index
        s_hi = np.minimum(prefix + off, valid)  # one past the last
        gathers = has & (s_lo < s_hi)
        pool_ok = ((rpi >= 0) & (rpi < rows)) if gpu else python_rows_resolve(rpi, rows)
        add(
            ProblemKind.EXPECTED_TOKEN_OUT_OF_RANGE,
            ProblemRole.EXPECTED_TOKEN,
            gathers & ~pool_ok,
            s_lo - off,
            rpi,
            True,
        )
        first_bad = np.maximum(s_lo, cols)
        add(
            ProblemKind.EXPECTED_TOKEN_OUT_OF_RANGE,
            ProblemRole.EXPECTED_TOKEN,
            gathers & pool_ok & (s_hi > cols),
            first_bad - off,
            first_bad,
            True,
        )
    return ProblemTable.concat(tables)
