"""The lines of a block-pool soak report (`kvcanary.pool-soak/1`): per history, what ran,
when a fault was planted, when kvcanary saw it and when the engine's own asserts did."""

from __future__ import annotations

from kvcanary_cli.render.console import plural
from kvcanary_cli.results.pool_soak import PoolSoakHistory, PoolSoakReport

__all__ = ["fault_line", "history_lines", "soak_verdict", "replay_line"]


def soak_verdict(r: PoolSoakReport) -> str:
    """The report's first line."""
    histories = plural(len(r.histories), "history", "histories")
    scheduling = ["async scheduling"] if r.overlap else []
    if r.speculative_tokens:
        drafts = plural(r.speculative_tokens, "draft token")
        scheduling.append(f"speculative decoding, {drafts} a step")
    loop = f" ({'; '.join(scheduling)})" if scheduling else ""
    where = f"{r.engine} {r.engine_version}{loop}: {r.audited} steps audited in {histories}"
    if not r.found:
        return f"clean: {where}, nothing found by kvcanary or by {r.engine}'s own asserts"
    return f"found: {where}"


def fault_line(r: PoolSoakReport) -> str | None:
    """With --fault: in how many histories it acted. A fault that never found its place proves
    nothing either way, and one that acted unseen is kvcanary's miss: both are said."""
    if r.fault is None:
        return None
    acted = sum(h.fault_step is not None for h in r.histories)
    if acted == 0:
        return (
            f"the planted fault {r.fault} never acted: no history reached a step where it had "
            "a place, so there was nothing to find (more steps may reach one)"
        )
    histories = plural(len(r.histories), "history", "histories")
    said = f"the planted fault {r.fault} acted in {acted} of {histories}"
    unseen = not any(h.findings for h in r.histories)
    return f"{said}; kvcanary found nothing" if unseen else said


def history_lines(h: PoolSoakHistory, engine: str) -> list[str]:
    """One history: its run, the fault planted, kvcanary's finding, the engine's assert."""
    lines = [
        f"history {h.model} seed {h.seed}: {h.steps} steps ({h.audited} audited), "
        f"{h.preemptions} preemptions, {h.prefix_hits} prefix hits, {h.aborts} aborts"
        + (f", {h.accepted} of {h.drafted} drafts accepted" if h.drafted else "")
    ]
    if h.fault_step is not None:
        lines.append(f"  planted at step {h.fault_step}: {h.fault_note}")
    if h.finding_step is not None and h.findings:
        top = h.findings[0]
        lines.append(f"  kvcanary at step {h.finding_step}: {top.code} - {top.message}")
    said = h.engine_said
    if said is not None:
        later = (
            f", {said.step - h.finding_step} steps after kvcanary"
            if h.finding_step is not None
            else ""
        )
        text = f": {said.message}" if said.message else ""
        lines.append(
            f"  {engine}'s own asserts at step {said.step}{later}: {said.exception}{text} "
            f"(in {said.raised_in or 'no frame of its code'})"
        )
    elif h.findings:
        lines.append(f"  {engine}'s own asserts: nothing in the {h.steps} steps run")
    return lines


def replay_line(r: PoolSoakReport) -> str | None:
    """With --replay: the reproducer, and whether the finding it recorded came back."""
    if r.replay is None:
        return None
    came = "came back" if r.replay.reproduced else "did not come back"
    if not r.replay.reproduced:
        came += ": another failure instead" if r.found else ": nothing found"
    change = r.replay.release_change(r.engine, r.engine_version)
    said = f"replayed {r.replay.reproducer}: its finding ({r.replay.recorded}) {came}"
    return said if change is None else f"{said} ({change})"
