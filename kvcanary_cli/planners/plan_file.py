"""Plan files (`kvcanary plan --out`): SGLang's plan fields, trimmed to what upstream defines."""

from __future__ import annotations

import os
from pathlib import Path

from kvcanary_cli.dump.atomic import write_safetensors
from kvcanary_cli.planners.base import Plan

__all__ = ["PLAN_FORMAT", "save_plan"]

PLAN_FORMAT = "1"


def save_plan(path: str | os.PathLike[str], plan: Plan, *, source: str) -> Path:
    """Write `plan.upstream_tensors()` with identifying metadata (never the backend's name,
    so that files from different backends compare byte for byte); never over `source`."""
    metadata = {
        "kvcanary.plan": PLAN_FORMAT,
        "group": plan.group,
        "window": str(plan.window),
        "source": os.path.basename(source),
    }
    tensors = {k: v.contiguous() for k, v in plan.upstream_tensors().items()}
    return write_safetensors(path, tensors, metadata, inputs=(source,))
