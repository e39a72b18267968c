"""Results of `kvcanary check`: findings, the diagnosis' causes, per-dump and overall reports.

The report is the `kvcanary.check/2` record (`results.record.to_record`): each field is a key
(its `#:` comment the key's documentation), a derived key is a `@recorded` property.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, Union

from kvcanary_cli.catalog import CauseCode, Confidence, FindingCode, Severity
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.results.cells import (
    CellColumns,
    FindingOwner,
    Role,
    SlotProvenance,
    Space,
    Span,
)
from kvcanary_cli.results.record import not_recorded, recorded
from kvcanary_cli.results.shrink import Shrunk

__all__ = [
    "UPSTREAM_RAISE",
    "Assumption",
    "Cause",
    "CheckCoverage",
    "CheckReport",
    "CheckSummary",
    "CodeCount",
    "CoverageStatus",
    "DumpReport",
    "DumpVerdict",
    "Finding",
    "FirstRaise",
    "GroupSummary",
    "JsonValue",
    "KernelMode",
    "KernelName",
    "PlanValueName",
    "RequestSummary",
    "ScalarOrigin",
    "ScalarValue",
    "SeverityCounts",
    "code_order",
]

#: The `details` key of a finding where the kernel's launch raised as the reference predicts
#: (`Finding.upstream_raise`, the raise's text).
UPSTREAM_RAISE = "upstream_raise"

#: Any JSON value (a finding's `details` are code-specific).
JsonValue = Union[None, bool, int, float, str, list["JsonValue"], dict[str, "JsonValue"]]  # noqa: UP007
#: A dump's verdict: from its most severe finding, or bad-input when it could not be read.
DumpVerdict = Literal["clean", "warnings", "errors", "bad-input"]
#: The planner that stood in for the GPU path (--kernel triton | vectorized | sglang | none).
KernelName = Literal["triton", "vectorized-gpu", "sglang", "none"]
#: How the kernel ran: Triton compiled or interpreted, SGLang's torch reference or CUDA.
KernelMode = Literal["compiled", "interpreter", "reference", "cuda"]
#: A plan field of the reference/kernel comparison.
PlanValueName = Literal["verify slot", "prev slot", "expected token", "write seed"]
#: Whether a family of checks ran on a dump (`CheckCoverage`).
CoverageStatus = Literal["ran", "not-run", "not-applicable"]
#: Where a scalar's value came from, as a fact or an assumption.
ScalarOrigin = Literal["recorded", "overridden", "derived", "default", "unknown"]


def code_order(code: FindingCode, group: str = "") -> tuple[int, int, str]:
    """Sort key of a (code, group) count: most severe first, then the codes table, then group."""
    return (-code.severity.rank, code.order, group)


def _none_last(value: int | None) -> tuple[bool, int]:
    return (value is None, 0 if value is None else value)


def _json_safe(value: object) -> JsonValue:
    """A `details` value as JSON holds it: tuples as lists, map keys as strings (sorted),
    any other scalar as its text."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _json_safe(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return str(value)


def _by_code(counts: dict[Any, Any]) -> dict[Any, Any]:
    return dict(sorted(counts.items(), key=lambda item: code_order(FindingCode(item[0]))))


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One finding group: cells sharing a code, cause, group and role (or one row or
    tensor), with where they came from.

    A cell-level finding holds every cell it stands for in `cells` (columns, complete); its
    scalar fields (`slot`, `batch_row`, `pool_row`, `position`) describe its example cell: the
    cell where SGLang's reference raises when the group holds it, else the first in report
    order. Output then grows with the problems, not with the cells.
    """

    code: FindingCode
    group: Group
    #: the example cell's slot (where SGLang's reference raises, when the group holds that
    #: cell; else its first cell); null for row-, batch- and tensor-level findings
    slot: int | None = None
    #: which pool the slot belongs to
    space: Space = Space.FULL
    #: the example cell's batch row (a row-level finding: its row)
    batch_row: int | None = None
    #: the example cell's pool row
    pool_row: int | None = None
    #: the example cell's position
    position: int | None = None
    #: the role of every cell of the group, or the plan read that met the problem (seed,
    #: expected-token)
    role: Role | None = None
    #: for one cell: what it is; for more: what they share
    message: str
    #: code-specific facts (below), JSON values only
    details: dict[str, JsonValue] = field(default_factory=dict)
    #: every cell, as columns; null for row-, batch- and tensor-level findings
    cells: CellColumns | None = None
    #: provenance of the group's first distinct slots (the example's first)
    provenance: tuple[SlotProvenance, ...] = ()
    #: distinct slots the group has (provenance lists the first few)
    provenance_total: int = 0
    #: the current or last owner of each slot provenance lists (the first few of
    #: provenance_total), the example's first
    owners: tuple[FindingOwner, ...] = ()
    #: derived scalars it rests on (then severity info)
    assumes: tuple[str, ...] = ()
    #: the diagnosis cause it is grouped under
    cause: CauseCode | None = None
    #: SGLang's torch reference raises first at the example cell
    first_raise: bool = False
    # What the analysis reads and the record does not carry:
    #: for an SWA-space finding: the full slots whose LUT entries reach its example's SWA
    #: slot (each cell's own is its `full_slot` column).
    full_slots: tuple[int, ...] = not_recorded(default=())
    #: the kernel's launch raised here, as the reference predicts (the raise's text; in
    #: `details` too).
    upstream_raise: str | None = not_recorded(default=None)
    #: for a canary finding: the cause its explanation names (docs/canary.md §7), and the
    #: slot the failing entry chains from.
    canary_cause: str | None = not_recorded(default=None)
    prev_slot: int | None = not_recorded(default=None)
    #: for an expected-token finding: the index of the bad gather (a pool row outside the
    #: pool, or a position past it); every group makes the same gather.
    gather_index: int | None = not_recorded(default=None)

    @recorded
    def severity(self) -> Severity:
        """The code's severity; `info` while the finding rests on an assumption."""
        return Severity.INFO if self.assumes else self.code.severity

    #: cells the finding stands for (1 for a row-, batch- or tensor-level finding)
    @recorded
    def count(self) -> int:
        """Cells this finding stands for (1 for a row- or tensor-level finding)."""
        return 1 if self.cells is None else len(self.cells)

    #: where the cells lie; null when `cells` is
    @recorded
    def span(self) -> Span | None:
        """Ranges and distinct counts of the cells (computed when read: a view reads it of the
        findings it shows)."""
        return Span.of(self.cells)

    def __post_init__(self) -> None:  # JSON values, whatever a detector put in
        object.__setattr__(
            self, "details", {str(k): _json_safe(v) for k, v in self.details.items()}
        )

    def order_key(self) -> tuple[Any, ...]:
        """The order of findings in every report.

        Most severe first, then the codes table, group, batch row, position and slot (None
        last); the remaining fields only break ties, so the order never depends on the order
        the detectors ran in.
        """
        return (
            *code_order(self.code, self.group),
            _none_last(self.batch_row),
            _none_last(self.position),
            _none_last(self.slot),
            self.space,
            _none_last(self.pool_row),
            self.role or "",
            self.message,
            json.dumps(self.details, sort_keys=True, default=str),
        )


@dataclass(frozen=True, kw_only=True)
class GroupSummary:
    """How one group was planned, and how the kernel compared with the reference."""

    #: the group planned
    group: Group
    #: W used for this group (0 for full)
    window: int
    #: verify entries requested (reference plan)
    total_verify: int
    #: capacity used (recorded, or total_verify)
    verify_capacity: int
    #: 0: the verify launch is skipped (overflow)
    enable: Literal[0, 1]
    #: the planner that stood in for the GPU path (--kernel triton | vectorized | sglang |
    #: none)
    kernel: KernelName
    #: plan values where reference and kernel differ, by the finding code explaining them
    explained_differences: dict[FindingCode, int] = field(default_factory=dict)
    #: the same per plan field (verify slot, prev slot, expected token, write seed)
    explained_by_field: dict[FindingCode, dict[PlanValueName, int]] = field(default_factory=dict)
    #: = the kernel-divergence findings of this group
    unexplained_differences: int = 0
    #: the error the kernel's launch raised: production's GPU path refusing the batch, or,
    #: for --kernel sglang, SGLang's own exception text
    kernel_launch_error: str | None = None

    def __post_init__(self) -> None:  # the codes in the codes table's order, as views list them
        object.__setattr__(self, "explained_differences", _by_code(self.explained_differences))
        object.__setattr__(self, "explained_by_field", _by_code(self.explained_by_field))


@dataclass(frozen=True, kw_only=True)
class CheckCoverage:
    """One family of checks, and whether this dump let it run: a clean verdict says what it
    checked (docs/findings.md, "Coverage")."""

    #: the family's name
    check: str
    #: what it looks for
    covers: str
    #: ran; not-run (a record it needs is missing, or `reason`); not-applicable (an SWA
    #: check of a dump with no sign of an SWA pool)
    status: CoverageStatus
    #: the records it needs that the dump lacks ("a or b": either one would do); [] unless
    #: not-run
    missing: tuple[str, ...] = ()
    #: why it did not run, beyond a missing record (a shrunk dump, --group full)
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class Cause:
    """A diagnosis: what went wrong upstream of a group of findings, and what to fix."""

    code: CauseCode = not_recorded()
    confidence: Confidence
    summary: str
    #: the facts that point to it
    evidence: tuple[str, ...]
    #: findings it accounts for (their `cause`)
    explains: dict[FindingCode, int]
    fix: str
    #: the cause whose fault left these symptoms too (a chain, docs/findings.md "Chains");
    #: null for a top-level cause
    explained_by: CauseCode | None = None
    #: for a parent: one line per cause it explains (codes, counts, where)
    also_shows: tuple[str, ...] = ()
    #: for a parent: the codes of the causes it explains (each one's `explained_by` is this
    #: cause), in the order of its `also_shows` lines
    nests: tuple[CauseCode, ...] = ()
    #: the command that traces its first slot (or pool row) to its owners, the dump's path
    #: as one shell word; null when it names neither
    next_command: str | None = None
    #: one bug-report sentence from the dump: its slots, who holds or last held them, the
    #: step that went wrong; null where the summary heads the cause
    headline: str | None = None

    #: docs/findings.md, "Diagnosis"
    @recorded
    def cause(self) -> CauseCode:
        """The cause's code."""
        return self.code


@dataclass(frozen=True, kw_only=True)
class ScalarValue:
    """A scalar as the check used it."""

    name: str
    value: int | None
    origin: ScalarOrigin
    #: metadata, tensor, command line, default or derived (...)
    source: str


@dataclass(frozen=True, kw_only=True)
class Assumption:
    """A derived scalar some findings rest on."""

    scalar: str
    value: int | None
    source: str
    #: findings that rest on the derived value
    decides: dict[FindingCode, int]
    #: what to record (or pass) to decide them
    advice: str


@dataclass(frozen=True, kw_only=True)
class RequestSummary:
    """A batch row with findings."""

    batch_row: int
    pool_row: int
    prefix_len: int
    extend_len: int
    #: findings at this batch row
    counts: dict[FindingCode, int]
    first_bad_position: int | None


@dataclass(frozen=True, kw_only=True)
class FirstRaise:
    """Where SGLang's torch reference raises first, and the finding it marks."""

    group: Group
    #: upstream's exception, verbatim
    exception_type: str
    message: str
    code: FindingCode
    batch_row: int
    position: int


@dataclass(frozen=True, kw_only=True)
class CodeCount:
    """Findings of one code, group and severity."""

    code: FindingCode
    severity: Severity
    group: Group
    count: int


@dataclass(frozen=True, kw_only=True)
class DumpReport:
    """Everything `check` found in one dump."""

    #: the dump's path, as given (normalised)
    path: str
    #: identity keys the dump records (sglang.version, sglang.commit, model, rank, step,
    #: forward_mode, captured_at, note); {} when unreadable
    identity: dict[str, str]
    #: 0 when unreadable
    bs: int
    #: the reading error, for an unreadable dump
    error: str | None = None
    #: --kernel triton: Triton's mode; --kernel sglang: SGLang's torch reference or its CUDA
    #: kernels; null for --kernel vectorized|none
    kernel_mode: KernelMode | None = None
    #: a shrunk dump (format 1.1 or 1.2): where it came from
    shrunk: Shrunk | None = None
    #: reading notes: ignored tensors, ignored valid_lens, ...
    notes: tuple[str, ...] = ()
    #: in planning order (by default full, then swa)
    groups: tuple[GroupSummary, ...]
    #: every scalar as the check used it
    scalars: tuple[ScalarValue, ...] = ()
    #: each family of checks: whether it ran, and what it lacked if not ([] when unreadable)
    coverage: tuple[CheckCoverage, ...] = ()
    #: derived scalars some findings rest on (those findings are info)
    assumptions: tuple[Assumption, ...] = ()
    #: most likely first; [] without findings
    diagnosis: tuple[Cause, ...] = ()
    #: where SGLang's torch reference raises first
    first_raise: FirstRaise | None = None
    #: "Type: message" the capture hook stored in `note`
    recorded_exception: str | None = None
    #: it is the first raise above (null: none)
    recorded_exception_matches: bool | None = None
    #: only rows with findings
    requests: tuple[RequestSummary, ...] = ()
    #: every finding; never truncated
    findings: tuple[Finding, ...]
    #: the threshold `fails` reads (the check's `--fail-on`: `CheckReport` sets it).
    fail_on: Severity = not_recorded(default=Severity.ERROR)

    def __post_init__(self) -> None:  # report order, whatever order the detectors ran in
        object.__setattr__(self, "findings", tuple(sorted(self.findings, key=Finding.order_key)))

    def worst(self) -> Severity | None:
        """The most severe finding's severity, or None when there is none."""
        if not self.findings:
            return None
        return max((f.severity for f in self.findings), key=lambda s: s.rank)

    #: from the most severe finding
    @recorded
    def verdict(self) -> DumpVerdict:
        """`bad-input` when unreadable, else the worst severity found: errors, warnings or
        clean."""
        if self.error is not None:
            return "bad-input"
        worst = self.worst()
        if worst is Severity.ERROR:
            return "errors"
        if worst is Severity.WARNING:
            return "warnings"
        return "clean"

    #: true if some finding reaches fail_on
    @recorded
    def fails(self) -> bool:
        """A finding is at or above `fail_on`."""
        return any(f.severity.rank >= self.fail_on.rank for f in self.findings)

    #: one per (code, group, severity) that occurs: severity, then code order, then group
    @recorded
    def counts(self) -> tuple[CodeCount, ...]:
        """Cells per (code, group, severity): a code is `info` where its findings rest on
        assumptions."""
        counter: Counter[tuple[FindingCode, Group, Severity]] = Counter()
        for f in self.findings:  # a finding group counts its cells
            counter[(f.code, f.group, f.severity)] += f.count
        return tuple(
            CodeCount(code=code, severity=severity, group=group, count=n)
            for (code, group, severity), n in sorted(
                counter.items(),
                key=lambda item: (*code_order(item[0][0], item[0][1]), -item[0][2].rank),
            )
        )

    #: = len(findings)
    @recorded
    def findings_total(self) -> int:
        """How many findings (groups) the dump has."""
        return len(self.findings)


@dataclass(frozen=True, kw_only=True)
class SeverityCounts:
    """Findings per severity."""

    error: int
    warning: int
    info: int


@dataclass(frozen=True, kw_only=True)
class CheckSummary:
    """Totals over every dump checked."""

    #: number of dumps on the command line
    dumps: int
    #: dumps with a finding at or above fail_on
    failed: int
    #: dumps that could not be read
    bad_input: int
    #: findings (groups) over all dumps
    findings: int
    #: cells (and rows, tensors) the findings stand for: the sum of their `count`
    cells: int
    #: cells per severity over all dumps
    by_severity: SeverityCounts
    #: over all dumps; only codes that occur
    counts: dict[FindingCode, int]


@dataclass(frozen=True, kw_only=True)
class CheckReport:
    """`kvcanary check --format json`: one report per dump, and the `--fail-on` threshold
    that sets the verdicts."""

    SCHEMA: ClassVar[str] = "kvcanary.check/2"

    fail_on: Severity = Severity.ERROR
    #: the SGLang version installed where check ran ("unknown": importable without package
    #: metadata); null when not installed. Each dump's identity holds the version it was
    #: recorded with
    sglang_installed: str | None = None
    #: in the order given on the command line
    dumps: tuple[DumpReport, ...]

    def __post_init__(self) -> None:  # each dump's `fails` reads this report's threshold
        dumps = tuple(
            d if d.fail_on is self.fail_on else replace(d, fail_on=self.fail_on) for d in self.dumps
        )
        object.__setattr__(self, "dumps", dumps)

    @recorded
    def kvcanary_version(self) -> str:
        """The kvcanary that checked."""
        import kvcanary_cli

        return kvcanary_cli.__version__

    #: the exit code in words: bad-input 2, findings 1, clean 0
    @recorded
    def verdict(self) -> Literal["clean", "findings", "bad-input"]:
        """`bad-input` (2) when a dump could not be read, else `findings` (1) when a finding
        reaches `fail_on`, else `clean` (0)."""
        if self.bad_input:
            return "bad-input"
        return "findings" if self.failed else "clean"

    @recorded
    def summary(self) -> CheckSummary:
        """Totals over every dump: cells, not findings (a group of 15 bad cells is 15)."""
        every = tuple(f for d in self.dumps for f in d.findings)
        by_code: Counter[FindingCode] = Counter()
        by_severity: Counter[Severity] = Counter()
        for f in every:
            by_code[f.code] += f.count
            by_severity[f.severity] += f.count
        return CheckSummary(
            dumps=len(self.dumps),
            failed=sum(d.fails for d in self.dumps),
            bad_input=sum(d.error is not None for d in self.dumps),
            findings=len(every),
            cells=sum(f.count for f in every),
            by_severity=SeverityCounts(
                error=by_severity[Severity.ERROR],
                warning=by_severity[Severity.WARNING],
                info=by_severity[Severity.INFO],
            ),
            counts={c: by_code[c] for c in FindingCode if by_code[c]},
        )

    @property
    def failed(self) -> bool:
        """At least one dump has a finding at or above the threshold."""
        return any(d.fails for d in self.dumps)

    @property
    def bad_input(self) -> bool:
        """At least one dump could not be read."""
        return any(d.error is not None for d in self.dumps)
