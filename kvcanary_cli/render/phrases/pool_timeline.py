"""The lines of a block-pool timeline (`kvcanary.pool-timeline/1`): each snapshot's verdict,
then per step what changed in the pool."""

from __future__ import annotations

from kvcanary_cli.results.pool import BlockOwner
from kvcanary_cli.results.pool_timeline import PoolBlockChange, PoolStep, PoolTimelineReport

__all__ = ["block_line", "snapshot_lines", "step_line", "timeline_verdict"]


def timeline_verdict(r: PoolTimelineReport) -> str:
    """The report's first line."""
    bad = sum(bool(s.codes) for s in r.snapshots)
    where = f"{r.engine}, {len(r.snapshots)} snapshots of a {r.num_blocks}-block pool"
    if not bad:
        return f"clean: {where}, no finding in any"
    return f"found: {where}, {bad} with findings"


def snapshot_lines(r: PoolTimelineReport) -> list[str]:
    """Each snapshot: its place, step, path and codes."""
    return [
        f"[{i}] step {'?' if s.step is None else s.step} {s.path}: "
        + (", ".join(str(c) for c in s.codes) if s.codes else "clean")
        for i, s in enumerate(r.snapshots)
    ]


def step_line(step: PoolStep) -> str:
    """One step's counts and codes."""
    text = (
        f"[{step.before}] -> [{step.after}]: {step.allocated} allocated, {step.freed} freed, "
        f"{step.rehomed} rehomed, {step.went_bad} into or out of a fault; "
        f"{len(step.requests_added)} requests came, {len(step.requests_gone)} went"
    )
    if step.new_codes:
        text += f"; new: {', '.join(str(c) for c in step.new_codes)}"
    if step.gone_codes:
        text += f"; gone: {', '.join(str(c) for c in step.gone_codes)}"
    return text


def _owner(o: BlockOwner) -> str:
    if o.holds == "deferred":
        return f"a deferred free of {o.request or 'an unknown request'}"
    return f"{o.request} (group {o.group}, index {o.index})"


def block_line(c: PoolBlockChange) -> str:
    """One changed block."""
    held = ", ".join(_owner(o) for o in c.owners) or "nobody"
    return (
        f"block {c.block}: {c.before} (ref {c.ref_before}) -> {c.after} (ref {c.ref_after}), "
        f"held by {held}"
    )
