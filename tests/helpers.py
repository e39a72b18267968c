"""Planner objects for tests, and `checked(dump, kernel=...)`: `run_check` with them injected."""

from __future__ import annotations

from kvcanary_cli.analysis.check import run_check
from kvcanary_cli.analysis.model import DumpReport
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
