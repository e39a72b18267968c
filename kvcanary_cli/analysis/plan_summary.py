"""`plan_record`: the per-request summary behind `kvcanary plan` (schema `kvcanary.plan/1`)."""

from __future__ import annotations

from typing import Any

from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.planners.base import Plan

__all__ = ["PLAN_SCHEMA", "plan_record"]

PLAN_SCHEMA = "kvcanary.plan/1"


def plan_record(dump: KvDump, plan: Plan, *, max_problems: int = 50) -> dict[str, Any]:
    """Plan scalars, one row per batch row, and the first `max_problems` problems."""
    window = plan.window
    prefix = dump.prefix_lens
    start = plan.frame.window_start
    lens = plan.verify_offsets[1:] - plan.verify_offsets[:-1]
    seeds = plan.write_seed_slot_indices.tolist()
    seed_undefined = plan.seed_undefined.tolist()
    write_offsets = plan.write_offsets.tolist()
    requests = []
    for r, (rp, p, e, ws, n) in enumerate(
        zip(
            dump.req_pool_indices.tolist(),
            prefix.tolist(),
            dump.extend_seq_lens.tolist(),
            start.tolist(),
            lens.tolist(),
            strict=True,
        )
    ):
        has_seed = r < len(seeds)
        requests.append(
            {
                "batch_row": r,
                "pool_row": rp,
                "prefix_len": p,
                "extend_len": e,
                "verify_start": ws if n else None,
                "verify_end": ws + n if n else None,
                "entries": n,
                "entry_offset": int(plan.verify_offsets[r]),
                "write_offset": write_offsets[r] if r < len(write_offsets) else None,
                "seed": (None if not has_seed or seed_undefined[r] else seeds[r]),
                "seed_undefined": bool(has_seed and seed_undefined[r]),
            }
        )
    problems = plan.problems
    return {
        "schema": PLAN_SCHEMA,
        "dump": str(dump.path),
        "group": plan.group,
        "backend": plan.backend,
        "semantics": str(plan.semantics),
        "window": window,
        "translated": plan.translated,
        "bs": plan.bs,
        "verify_capacity": plan.verify_capacity,
        "total_verify": plan.total_verify,
        "verify_num_valid": plan.verify_num_valid,
        "enable": plan.enable,
        "write_req_capacity": plan.write_req_capacity,
        "write_num_valid_reqs": plan.write_num_valid_reqs,
        "undefined_entries": int((plan.verify_undefined != 0).sum()),
        "launch_error": plan.launch_error,
        "requests": requests,
        "problem_count": len(problems),
        "problems": [
            {
                "kind": p.kind.code,
                "role": p.role.label,
                "batch_row": p.batch_row,
                "pool_row": p.pool_row,
                "position": p.position,
                "value": p.value,
                "entry": p.entry,
                "upstream_raises": p.raises,
            }
            for p in (problems.rows_at(i) for i in range(min(len(problems), max_problems)))
        ],
    }
