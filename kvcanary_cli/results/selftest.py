"""Results of `kvcanary selftest`: the drift report, every synthetic scenario through several
planners compared field by field with the baseline of its semantics.

Render turns a `SelftestReport` into the `kvcanary.selftest/1` record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvcanary_cli.planners.base import PlanProblem, Semantics

__all__ = [
    "Difference",
    "GroupResult",
    "PlannerComparison",
    "PlannerInfo",
    "RefRaise",
    "ScenarioResult",
    "SelftestReport",
]


@dataclass(frozen=True, kw_only=True)
class Difference:
    """The first place where one field of two plans differs."""

    #: a plan field of `FIELDS`, or "raise".
    field: str
    #: the first differing element (None: a length mismatch, or the raise).
    index: int | None
    #: the values, "undefined", "N values" on a length mismatch, or raise texts (None: no raise).
    baseline: int | str | None
    planner: int | str | None


@dataclass(frozen=True, kw_only=True)
class PlannerComparison:
    """One planner's plan of a group against its baseline's, field by field."""

    planner: str
    baseline: str
    semantics: Semantics
    #: field -> "agree", "differ" or "n/a" (a side raised: upstream defines no values).
    fields: dict[str, str]
    differences: tuple[Difference, ...]
    #: the baseline's raise ("ValueError: ..."), and the planner's.
    expected_raise: str | None
    raised: str | None
    #: why kvcanary did not launch SGLang's CUDA kernels (reads outside req_to_token).
    not_launched: str | None

    @property
    def agree(self) -> bool:
        """No field and no raise differs."""
        return not self.differences


@dataclass(frozen=True, kw_only=True)
class RefRaise:
    """Where SGLang's torch reference raises on a group (kvcanary's prediction, REF order)."""

    error: str
    problem: PlanProblem


@dataclass(frozen=True, kw_only=True)
class GroupResult:
    """One group of a scenario: where REF raises, and each planner's comparison."""

    group: str
    ref_raise: RefRaise | None
    #: one per planner, in the report's planner order.
    comparisons: tuple[PlannerComparison, ...]


@dataclass(frozen=True, kw_only=True)
class ScenarioResult:
    """One `synth` scenario, group by group."""

    scenario: str
    summary: str
    expected_findings: tuple[str, ...]
    groups: tuple[GroupResult, ...]

    @property
    def clean(self) -> bool:
        """A clean serving state (no expected finding)."""
        return not self.expected_findings


@dataclass(frozen=True, kw_only=True)
class PlannerInfo:
    """A compared planner and the baseline it is compared with."""

    name: str
    semantics: Semantics
    #: as check's kernel mode (None for kvcanary's numpy planners).
    mode: str | None
    baseline: str


@dataclass(frozen=True, kw_only=True)
class SelftestReport:
    """The drift report: every scenario's comparisons, and what SGLang was here."""

    SCHEMA: ClassVar[str] = "kvcanary.selftest/1"

    kvcanary_version: str
    size: str
    seed: int
    fields: tuple[str, ...]
    planners: tuple[PlannerInfo, ...]
    sglang_installed: str | None
    #: SGLang's launcher is one of the planners (`--sglang`), and how it ran.
    sglang_run: bool
    sglang_mode: str | None
    #: SGLang versions kvcanary's model was verified on.
    verified: tuple[str, ...]
    scenarios: tuple[ScenarioResult, ...]

    def comparisons(self) -> list[PlannerComparison]:
        """Every comparison, scenario by scenario and group by group."""
        return [c for s in self.scenarios for g in s.groups for c in g.comparisons]

    @property
    def agree(self) -> bool:
        """Every planner agrees with its baseline on every group (exit 0)."""
        return all(c.agree for c in self.comparisons())
