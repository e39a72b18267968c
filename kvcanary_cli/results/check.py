"""Results of `kvcanary check`: findings, the diagnosis' causes, per-dump and overall reports."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kvcanary_cli.catalog import CauseCode, Confidence, FindingCode, Severity
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.dump.shrink_record import ShrinkRecord
from kvcanary_cli.results.cells import CellColumns, Role, SlotProvenance, Space

__all__ = [
    "UPSTREAM_RAISE",
    "Assumption",
    "Cause",
    "CheckReport",
    "DumpReport",
    "Finding",
    "FirstRaise",
    "GroupSummary",
    "RequestSummary",
    "ScalarValue",
    "code_order",
]


#: The `details` key of a finding record where the kernel's launch raised as the reference
#: predicts (records add it from `Finding.upstream_raise`).
UPSTREAM_RAISE = "upstream_raise"


def code_order(code: FindingCode, group: str = "") -> tuple[int, int, str]:
    """Sort key of a (code, group) count: most severe first, then the codes table, then group."""
    return (-code.severity.rank, code.order, group)


def _none_last(value: int | None) -> tuple[bool, int]:
    return (value is None, 0 if value is None else value)


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One problem: a finding *group* of cells sharing a code, cause, group and role, or one
    row or tensor.

    A cell-level finding holds every cell it stands for in `cells` (columns, complete); its
    scalar fields (`slot`, `batch_row`, `pool_row`, `position`) describe its example cell: the
    cell where SGLang's reference raises when the group holds it, else the first in report
    order. Output then grows with the problems, not with the cells.
    """

    code: FindingCode
    group: Group
    message: str
    slot: int | None = None
    space: Space = Space.FULL
    batch_row: int | None = None
    pool_row: int | None = None
    position: int | None = None
    #: the role every cell of the group has (a LUT read: the first role it was read as).
    role: Role | None = None
    #: code-specific facts (other cells, kernel values, counts), JSON-safe: shown, never read
    #: by the analysis (what it reads is a typed field below).
    details: dict[str, object] = field(default_factory=dict)
    #: every cell of a cell-level finding (None: a row- or tensor-level finding).
    cells: CellColumns | None = None
    #: for an SWA-space finding: the full slots whose LUT entries reach its example's SWA
    #: slot (each cell's own is its `full_slot` column).
    full_slots: tuple[int, ...] = ()
    #: the kernel's launch raised here, as the reference predicts (the raise's text).
    upstream_raise: str | None = None
    #: for a canary finding: the cause the record's explanation names (docs/canary.md §7),
    #: and the slot the failing entry chains from.
    canary_cause: str | None = None
    prev_slot: int | None = None
    #: for an expected-token finding: the index of the bad gather (a pool row outside the
    #: pool, or a position past it); every group makes the same gather.
    gather_index: int | None = None
    #: the provenance of the group's first distinct slots (the example's first);
    #: `provenance_total` counts the distinct slots of the group.
    provenance: tuple[SlotProvenance, ...] = ()
    provenance_total: int = 0
    #: scalars the finding holds under only because kvcanary derived them (not recorded):
    #: such a finding is `info` until the dump records them.
    assumes: tuple[str, ...] = ()
    #: the cause the diagnosis groups this symptom under.
    cause: CauseCode | None = None
    #: SGLang's torch reference raises at this finding's example cell (the first raising
    #: read, REF order).
    first_raise: bool = False

    @property
    def severity(self) -> Severity:
        """The code's severity; `info` while the finding rests on an assumption."""
        return Severity.INFO if self.assumes else self.code.severity

    @property
    def count(self) -> int:
        """Cells this finding stands for (1 for a row- or tensor-level finding)."""
        return 1 if self.cells is None else len(self.cells)

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
    """How one group was planned and how the kernel compared."""

    group: Group
    window: int
    total_verify: int
    verify_capacity: int
    enable: int
    kernel: str
    #: plan values that differ between reference and kernel, by the finding code that
    #: explains them (a cell read as a verify slot and as a chain predecessor counts twice).
    explained_differences: dict[str, int] = field(default_factory=dict)
    #: the same, per plan field: code -> {"verify slot" | "prev slot" | "expected token" |
    #: "write seed": values}.
    explained_by_field: dict[str, dict[str, int]] = field(default_factory=dict)
    unexplained_differences: int = 0
    kernel_launch_error: str | None = None


@dataclass(frozen=True, kw_only=True)
class Cause:
    """A diagnosis: what went wrong upstream of a group of findings, and what to fix."""

    code: CauseCode
    confidence: Confidence
    summary: str
    #: the facts that point to this cause, one short phrase each.
    evidence: tuple[str, ...]
    #: finding code -> how many findings this cause explains.
    explains: dict[str, int]
    fix: str
    #: the cause that explains this one's symptoms too (a chain: one fault, one story); None
    #: for a top-level cause. Reports show an explained cause as an "also shows" line of its
    #: parent, and print only the parent's fix.
    explained_by: CauseCode | None = None
    #: for a parent: one line per cause it explains (codes, counts, where).
    also_shows: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ScalarValue:
    """A scalar as the check used it, and whether it is a fact or an assumption."""

    name: str
    value: int | None
    #: recorded, overridden, derived, default or unknown.
    origin: str
    source: str


@dataclass(frozen=True, kw_only=True)
class Assumption:
    """A derived scalar some findings rest on, and how to turn them into facts."""

    scalar: str
    value: int | None
    source: str
    #: finding code -> findings that hold only under the derived value.
    decides: dict[str, int]
    advice: str


@dataclass(frozen=True, kw_only=True)
class RequestSummary:
    """One batch row with findings: the request as the batch describes it, and its counts."""

    batch_row: int
    pool_row: int
    prefix_len: int
    extend_len: int
    #: finding code -> findings at this batch row.
    counts: dict[str, int]
    #: the smallest position of a finding in this row (None: only row-level findings).
    first_bad_position: int | None


@dataclass(frozen=True, kw_only=True)
class FirstRaise:
    """Where SGLang's torch reference stops (its first raising read, in its own order)."""

    group: Group
    exception_type: str
    message: str
    code: FindingCode
    batch_row: int
    position: int


@dataclass(frozen=True, kw_only=True)
class DumpReport:
    """Everything `check` found in one dump."""

    path: str
    identity: dict[str, str]
    bs: int
    groups: tuple[GroupSummary, ...]
    findings: tuple[Finding, ...]
    notes: tuple[str, ...] = ()
    kernel_mode: str | None = None
    #: set when the dump could not be read (multi-dump runs report it instead of stopping).
    error: str | None = None
    #: ranked causes, most likely first; empty when there is no finding.
    diagnosis: tuple[Cause, ...] = ()
    #: the batch rows that have findings.
    requests: tuple[RequestSummary, ...] = ()
    first_raise: FirstRaise | None = None
    #: the upstream exception the dump's `note` records (the capture hook stores it), and
    #: whether it is the one kvcanary's reference raises first.
    recorded_exception: str | None = None
    recorded_exception_matches: bool | None = None
    scalars: tuple[ScalarValue, ...] = ()
    assumptions: tuple[Assumption, ...] = ()
    #: set for a shrunk dump: where it came from and what it dropped (its provenance covers
    #: the kept cells only).
    shrink: ShrinkRecord | None = None

    def worst(self) -> Severity | None:
        """The most severe finding's severity, or None when there is none."""
        if not self.findings:
            return None
        return max((f.severity for f in self.findings), key=lambda s: s.rank)

    def fails(self, fail_on: Severity) -> bool:
        """True when a finding is at or above `fail_on`."""
        return any(f.severity.rank >= fail_on.rank for f in self.findings)


@dataclass(frozen=True, kw_only=True)
class CheckReport:
    """One report per dump plus the `--fail-on` threshold that sets the verdicts."""

    SCHEMA: ClassVar[str] = "kvcanary.check/2"

    dumps: tuple[DumpReport, ...]
    fail_on: Severity = Severity.ERROR
    #: the SGLang version installed where the check ran (None: not installed); each dump's
    #: `identity` holds the version it was recorded with.
    sglang_installed: str | None = None

    @property
    def failed(self) -> bool:
        """At least one dump has a finding at or above the threshold."""
        return any(d.fails(self.fail_on) for d in self.dumps)

    @property
    def bad_input(self) -> bool:
        """At least one dump could not be read."""
        return any(d.error is not None for d in self.dumps)
