"""Results of `kvcanary selftest`: the drift report, every synthetic scenario through several
planners compared field by field with the baseline of its semantics.

A `SelftestReport` is the `kvcanary.selftest/1` record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from kvcanary_cli.dump.schema import Group
from kvcanary_cli.planners.base import Semantics
from kvcanary_cli.results.record import recorded

__all__ = [
    "Difference",
    "FieldStatus",
    "GroupResult",
    "PlanField",
    "PlannerComparison",
    "PlannerInfo",
    "RefRaise",
    "SGLangInfo",
    "ScenarioResult",
    "SelftestReport",
    "SelftestSummary",
    "Tally",
]

#: A compared plan field (SGLang's names), or where and with what the plan step raises.
PlanField = Literal[
    "verify_slot_indices",
    "verify_expected_tokens",
    "verify_expected_positions",
    "verify_prev_slot_indices",
    "verify_num_valid",
    "enable",
    "write_offsets",
    "write_seed_slot_indices",
    "write_num_valid_reqs",
    "raise",
]
#: n/a: a side raised, so upstream defines no values.
FieldStatus = Literal["agree", "differ", "n/a"]


@dataclass(frozen=True, kw_only=True)
class Difference:
    """The first place where one field differs."""

    field: PlanField
    #: first differing element
    index: int | None
    #: values, "undefined", "N values" on a length mismatch, or raise texts for field "raise"
    baseline: int | str | None
    planner: int | str | None


@dataclass(frozen=True, kw_only=True)
class PlannerComparison:
    """One planner's plan of a group against its baseline's."""

    planner: str
    baseline: str
    semantics: Semantics
    #: every compared field; n/a: a side raised, so upstream defines no values
    fields: dict[PlanField, FieldStatus]
    differences: tuple[Difference, ...]
    #: the baseline's raise ("ValueError: ...")
    expected_raise: str | None
    #: the planner's raise
    raised: str | None
    #: why kvcanary did not launch SGLang's CUDA kernels (reads outside req_to_token)
    not_launched: str | None

    @recorded
    def agree(self) -> bool:
        """No field and no raise differs."""
        return not self.differences


@dataclass(frozen=True, kw_only=True)
class RefRaise:
    """Where SGLang's torch reference raises (kvcanary's prediction, REF order)."""

    error: str
    #: the problem kind (a finding code)
    kind: str
    #: the read role
    role: str
    batch_row: int
    pool_row: int
    position: int
    #: the raw slot, or the bad row or index
    value: int


@dataclass(frozen=True, kw_only=True)
class GroupResult:
    """One group of a scenario."""

    group: Group
    #: where SGLang's torch reference raises (kvcanary's prediction, REF order), or null when
    #: it does not
    ref_raise: RefRaise | None
    #: one per planner, in "planners" order
    comparisons: tuple[PlannerComparison, ...]


@dataclass(frozen=True, kw_only=True)
class ScenarioResult:
    """One `synth` scenario."""

    scenario: str
    summary: str
    expected_findings: tuple[str, ...]
    groups: tuple[GroupResult, ...]

    #: a clean state (no expected finding)
    @recorded
    def clean(self) -> bool:
        """No expected finding: every planner must agree without a raise."""
        return not self.expected_findings


@dataclass(frozen=True, kw_only=True)
class PlannerInfo:
    """A compared planner."""

    #: vectorized, triton, sglang (with --sglang)
    name: str
    #: whose behaviour it reproduces on bad input
    semantics: Semantics
    #: as check's kernel_mode
    mode: str | None
    #: reference (REF semantics) or vectorized-gpu (GPU)
    baseline: str


@dataclass(frozen=True, kw_only=True)
class SGLangInfo:
    """The SGLang installed here, and whether it was run."""

    #: as check's sglang_installed
    installed: str | None
    #: --sglang: SGLang's launcher is one of the planners
    run: bool
    #: how SGLang's launcher ran: its torch reference, or its CUDA kernels
    mode: Literal["reference", "cuda"] | None
    #: SGLang versions kvcanary's model was verified on
    verified: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Tally:
    """One planner's comparisons, and how many differ."""

    comparisons: int
    disagreements: int


@dataclass(frozen=True, kw_only=True)
class SelftestSummary:
    """Totals over every scenario."""

    scenarios: int
    groups: int
    comparisons: int
    disagreements: int
    #: by planner name
    by_planner: dict[str, Tally]


@dataclass(frozen=True, kw_only=True)
class SelftestReport:
    """`kvcanary selftest --format json`: every scenario's comparisons, and what SGLang was
    here."""

    SCHEMA: ClassVar[str] = "kvcanary.selftest/1"

    kvcanary_version: str
    size: Literal["tiny", "small"]
    seed: int
    #: the compared fields, in order
    fields: tuple[PlanField, ...]
    planners: tuple[PlannerInfo, ...]
    sglang: SGLangInfo
    #: in synth --list order
    scenarios: tuple[ScenarioResult, ...]

    def comparisons(self) -> list[PlannerComparison]:
        """Every comparison, scenario by scenario and group by group."""
        return [c for s in self.scenarios for g in s.groups for c in g.comparisons]

    @property
    def agree(self) -> bool:
        """Every planner agrees with its baseline on every group (exit 0)."""
        return all(c.agree for c in self.comparisons())

    @recorded
    def verdict(self) -> Literal["agree", "disagree"]:
        """`agree` as the record says it."""
        return "agree" if self.agree else "disagree"

    @recorded
    def summary(self) -> SelftestSummary:
        """The totals, per planner and over all."""
        counts = {p.name: [0, 0] for p in self.planners}
        for c in self.comparisons():
            counts[c.planner][0] += 1
            counts[c.planner][1] += 0 if c.agree else 1
        return SelftestSummary(
            scenarios=len(self.scenarios),
            groups=sum(len(s.groups) for s in self.scenarios),
            comparisons=sum(n for n, _ in counts.values()),
            disagreements=sum(d for _, d in counts.values()),
            by_planner={
                name: Tally(comparisons=n, disagreements=d) for name, (n, d) in counts.items()
            },
        )
