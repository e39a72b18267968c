"""The record declarations' `Literal`s say what the code produces: each one that mirrors an
enum or a table of the package holds exactly its values, so the two cannot drift (the catalog's
codes need no mirror: records declare the enums themselves)."""

from __future__ import annotations

from typing import get_args

from kvcanary_cli.analysis.selftest import FIELDS
from kvcanary_cli.canary.constants import BUFFERS, VIOLATION_FIELDS
from kvcanary_cli.canary.ring_rows import RowOrigin
from kvcanary_cli.planners import BACKENDS
from kvcanary_cli.planners.base import ProblemKind, ProblemRole
from kvcanary_cli.planners.triton_runtime import Mode
from kvcanary_cli.results.cells import CellRole, Role
from kvcanary_cli.results.check import KernelMode, KernelName
from kvcanary_cli.results.plan import BackendName, ProblemKindName, ProblemRoleName
from kvcanary_cli.results.selftest import PlanField
from kvcanary_cli.results.violations import BufferName, OriginName, ViolationRow
from tests.render.record_schema import declared_keys


def test_plan_problem_literals_mirror_the_planner_enums() -> None:
    assert set(get_args(ProblemKindName)) == {kind.code for kind in ProblemKind}
    assert set(get_args(ProblemRoleName)) == {role.label for role in ProblemRole}


def test_finding_roles_are_cell_roles_and_plan_reads() -> None:
    plan_reads = {role.label for role in ProblemRole}
    assert {role.value for role in Role} == set(get_args(CellRole)) | plan_reads
    assert set(get_args(CellRole)) == {role for role in Role if role.live} | {
        Role.STALE_TAIL,
        Role.IDLE_ROW,
    }


def test_planner_names_cover_every_backend_and_kernel() -> None:
    """Every `--backend` is a plan record's backend; the check's kernels are the GPU-semantics
    planners (vectorized runs as vectorized-gpu) or none; Triton's modes are kernel modes."""
    assert {b.value for b in BACKENDS} < set(get_args(BackendName))
    assert set(get_args(KernelName)) - {"none"} < set(get_args(BackendName))
    assert set(get_args(Mode)) < set(get_args(KernelMode))


def test_selftest_fields_are_the_compared_fields() -> None:
    assert get_args(PlanField) == FIELDS


def test_violation_rows_lead_with_the_eight_ring_fields() -> None:
    assert tuple(declared_keys(ViolationRow))[:8] == VIOLATION_FIELDS
    assert get_args(BufferName) == BUFFERS
    assert get_args(OriginName) == tuple(origin.label for origin in RowOrigin)
