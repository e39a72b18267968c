"""Plan files (`kvcanary plan --out`): SGLang's plan fields, trimmed to what upstream defines.

Where the plan has values upstream does not define (SGLang's reference raises there, or the
GPU path would read outside a table), the file says so: it carries the `Undefined` bits of
every entry and seed (`kvcanary.verify_undefined`, `kvcanary.seed_undefined`, uint8) and the
reference's exception (`kvcanary.upstream_raises`). A plan with nothing undefined has neither,
so the files of different backends on a valid dump are the same bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from kvcanary_cli.dump.atomic import write_safetensors
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.planners.base import Plan, Semantics, reference_raise

__all__ = ["PLAN_FORMAT", "save_plan", "upstream_raise"]

PLAN_FORMAT = "1"


def upstream_raise(plan: Plan) -> str | None:
    """SGLang's reference exception for this plan ("Type: message"), when it raises."""
    raised = reference_raise(plan) if plan.semantics is Semantics.REFERENCE else None
    return None if raised is None else str(raised.error)


def save_plan(
    path: str | os.PathLike[str], plan: Plan, *, dump: KvDump, overwrite: bool = True
) -> Path:
    """Write `plan.upstream_tensors()` with identifying metadata (never the backend's name,
    so that files from different backends compare byte for byte); never over the dump."""
    metadata = {
        "kvcanary.plan": PLAN_FORMAT,
        "group": plan.group,
        "window": str(plan.window),
        "source": os.path.basename(dump.path),
    }
    tensors = dict(plan.upstream_tensors())
    raised = upstream_raise(plan)
    n = tensors["verify_slot_indices"].shape[0]
    undefined = plan.verify_undefined[:n]
    if raised is not None or bool(undefined.any()) or bool(plan.seed_undefined.any()):
        tensors["kvcanary.verify_undefined"] = np.asarray(undefined, dtype=np.uint8)
        tensors["kvcanary.seed_undefined"] = np.asarray(plan.seed_undefined, dtype=np.uint8)
    if raised is not None:
        metadata["kvcanary.upstream_raises"] = raised
    return write_safetensors(path, tensors, metadata, inputs=(dump.path,), overwrite=overwrite)
