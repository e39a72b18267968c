"""Plan comparison with readable failures, and access to the planners under test.

`assert_plans_equal(a, b)` checks every field of two plans (or only what upstream defines,
`upstream=True`) and, on a mismatch, names the field, the first differing indices and the
values there, so that a failing hypothesis example says *where* two backends diverge.
"""

from __future__ import annotations

import functools

import numpy as np

from kvcanary_cli.errors import PlannerUnavailableError
from kvcanary_cli.planners.base import Plan, Planner

__all__ = [
    "PLAN_SCALARS",
    "PLAN_TENSORS",
    "assert_plans_equal",
    "assert_tensor_equal",
    "triton_planner",
]

#: Scalar fields compared by `assert_plans_equal` (backend and semantics are identities).
PLAN_SCALARS = (
    "group",
    "window",
    "translated",
    "bs",
    "verify_capacity",
    "write_req_capacity",
    "total_verify",
    "verify_num_valid",
    "enable",
    "write_num_valid_reqs",
    "launch_error",
)
#: Tensor fields compared by `assert_plans_equal`.
PLAN_TENSORS = (
    "verify_offsets",
    "verify_slot_indices",
    "verify_expected_tokens",
    "verify_expected_positions",
    "verify_prev_slot_indices",
    "verify_undefined",
    "write_offsets",
    "write_seed_slot_indices",
    "seed_undefined",
)
_PROBLEM_COLUMNS = ("kind", "role", "batch_row", "pool_row", "position", "value", "entry", "raises")
_SHOW = 8


def _describe_mismatch(name: str, a: np.ndarray, b: np.ndarray, labels: tuple[str, str]) -> str:
    bad = np.flatnonzero(a != b)
    first = bad[:_SHOW].tolist()
    lines = [
        f"{name}: {bad.size} of {a.size} elements differ; first at indices {first}",
        f"  {labels[0]}: {a[bad[:_SHOW]].tolist()}",
        f"  {labels[1]}: {b[bad[:_SHOW]].tolist()}",
    ]
    lo = max(0, int(bad[0]) - 3)
    hi = min(a.size, int(bad[0]) + 4)
    lines.append(
        f"  around [{lo}:{hi}]: {labels[0]}={a[lo:hi].tolist()} {labels[1]}={b[lo:hi].tolist()}"
    )
    return "\n".join(lines)


def assert_tensor_equal(
    name: str, a: np.ndarray, b: np.ndarray, labels: tuple[str, str] = ("a", "b")
) -> None:
    """Same dtype, shape and values; the message shows the first differing indices."""
    if a.dtype != b.dtype:
        raise AssertionError(f"{name}: dtype {labels[0]}={a.dtype} {labels[1]}={b.dtype}")
    if tuple(a.shape) != tuple(b.shape):
        raise AssertionError(
            f"{name}: shape {labels[0]}={list(a.shape)} {labels[1]}={list(b.shape)}\n"
            f"  {labels[0]}: {a.reshape(-1)[:32].tolist()}\n"
            f"  {labels[1]}: {b.reshape(-1)[:32].tolist()}"
        )
    if not np.array_equal(a, b):
        raise AssertionError(_describe_mismatch(name, a.reshape(-1), b.reshape(-1), labels))


def assert_plans_equal(a: Plan, b: Plan, *, upstream: bool = False) -> None:
    """Fail with a precise message unless `a` and `b` agree.

    `upstream=False`: every scalar, every tensor (dtype, shape, values) and the problem table
    (`ProblemTable.same_as`). `upstream=True`: only `Plan.upstream_tensors()`, the region
    SGLang defines (what upstream's differential test compares) and `launch_error`.
    """
    labels = (a.backend, b.backend) if a.backend != b.backend else ("a", "b")
    if a.launch_error != b.launch_error:
        raise AssertionError(
            f"launch_error: {labels[0]}={a.launch_error!r} {labels[1]}={b.launch_error!r}"
        )
    if upstream:
        ta, tb = a.upstream_tensors(), b.upstream_tensors()
        assert ta.keys() == tb.keys()
        for name in ta:
            assert_tensor_equal(name, ta[name], tb[name], labels)
        return
    for name in PLAN_SCALARS:
        va, vb = getattr(a, name), getattr(b, name)
        if va != vb:
            raise AssertionError(f"{name}: {labels[0]}={va!r} {labels[1]}={vb!r}")
    for name in PLAN_TENSORS:
        assert_tensor_equal(name, getattr(a, name), getattr(b, name), labels)
    pa, pb = a.problems, b.problems
    if not pa.same_as(pb):
        lines = [f"problems differ: {labels[0]} has {len(pa)}, {labels[1]} has {len(pb)}"]
        for col in _PROBLEM_COLUMNS:
            ca, cb = getattr(pa, col), getattr(pb, col)
            if ca.shape != cb.shape or not np.array_equal(ca, cb):
                lines.append(f"  first differing column: {col}")
                break
        for label, table in zip(labels, (pa, pb), strict=True):
            lines.append(f"  {label}:")
            lines.extend(f"    {row}" for row in table.rows()[:_SHOW])
        raise AssertionError("\n".join(lines))


@functools.cache
def triton_planner() -> Planner | None:
    """The Triton planner, or None only where triton cannot run here (not installed).

    A planner that loads but then fails is *not* hidden: its tests fail.
    """
    from kvcanary_cli.planners import triton_runtime
    from kvcanary_cli.planners.triton_planner import TritonPlanner

    try:
        triton_runtime.load_triton()
    except PlannerUnavailableError:
        return None
    return TritonPlanner()
