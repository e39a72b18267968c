"""Planner objects for tests, and `checked(dump, kernel=...)`: `run_check` with them injected."""

from __future__ import annotations

from kvcanary_cli.analysis.check import run_check
from kvcanary_cli.analysis.model import DumpReport, Finding
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.planners.base import Planner, Semantics
from kvcanary_cli.planners.reference import ReferencePlanner
from kvcanary_cli.planners.triton_planner import TritonPlanner
from kvcanary_cli.planners.vectorized import VectorizedPlanner

REFERENCE = ReferencePlanner()
STRICT = ReferencePlanner(strict=True)
VECTORIZED = VectorizedPlanner()
VECTORIZED_GPU = VectorizedPlanner(semantics=Semantics.GPU)
TRITON = TritonPlanner()
#: the `--kernel` choices of `kvcanary check`, as objects.
KERNELS: dict[str, Planner | None] = {"vectorized": VECTORIZED_GPU, "triton": TRITON, "none": None}
#: every planner, by the name tests parametrize over.
PLANNERS: dict[str, Planner] = {
    "reference": REFERENCE,
    "vectorized": VECTORIZED,
    "vectorized-gpu": VECTORIZED_GPU,
    "triton": TRITON,
}


def checked(dump: KvDump, *, kernel: str = "vectorized") -> DumpReport:
    """`run_check` with the vectorized reference and the named kernel."""
    return run_check(dump, planner=VECTORIZED, kernel=KERNELS[kernel])


#: The synth scenarios on which SGLang's torch reference raises (its first bad read): what
#: the real SGLang and the stand-in must raise on, and nothing else.
UPSTREAM_RAISING_SCENARIOS = frozenset(
    {
        "truncated-lut",
        "truncated-lut-unrecorded",
        "undersized-lut",
        "slot-beyond-pool-swa",
        "row-out-of-range",
        "prefix-past-row",
        "expected-token-out-of-range",
    }
)

#: Scenarios whose lengths ask for more verify entries than the table holds: kvcanary plans
#: none of them and never hands SGLang the claim to allocate (its plan is "not launched").
NOT_HANDED_TO_SGLANG = frozenset({"absurd-prefix-length"})


def cells_key(f: Finding) -> tuple[object, ...] | None:
    """A finding group's cells as plain, comparable values (None for a row-level finding)."""
    if f.cells is None:
        return None
    c = f.cells
    return (
        tuple(c.batch_row.tolist()),
        tuple(c.pool_row.tolist()),
        tuple(c.position.tolist()),
        None if c.slot is None else tuple(c.slot.tolist()),
        tuple(sorted((name, tuple(v.tolist())) for name, v in c.extra.items())),
    )


def expand_cells(f: Finding) -> list[tuple[object, ...]]:
    """One (code, group, space, batch row, pool row, position, slot, role) per cell a finding
    stands for: the shape findings had before they were groups."""
    base = (f.code.value, f.group.value, f.space.value)
    role = None if f.role is None else f.role.value
    if f.cells is None:
        return [(*base, f.batch_row, f.pool_row, f.position, f.slot, role)]
    c = f.cells
    slots = [None] * len(c) if c.slot is None else c.slot.tolist()
    return [
        (*base, b, p, q, s, role)
        for b, p, q, s in zip(
            c.batch_row.tolist(), c.pool_row.tolist(), c.position.tolist(), slots, strict=True
        )
    ]


#: The scenarios of the bookkeeping audit (free lists, the whole LUT, radix sharing, leaks).
AUDIT_SCENARIOS = (
    "double-free",
    "reserved-slot-freed",
    "reserved-swa-page-freed",
    "reserved-swa-page-handed-out",
    "stale-swa-mapping",
    "swa-shared-owner",
    "swa-write-into-live-slot",
    "radix-copy",
    "swa-page-leak",
    "full-page-leak",
    "partial-page-free",
    "swa-mapping-rewritten",
)
#: Scenarios of diagnosis rules over old codes (a consistent row is no stale-row read, a radix
#: sharer's repeat is no aliasing, a live SWA page on the free list is its own cause).
RULE_SCENARIOS = ("reuse-under-radix-sharer", "double-allocation", "swa-freed-while-live")
