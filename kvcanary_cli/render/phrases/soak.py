"""A soak report in words, as its table and Markdown views say it: what ran, the verdict,
what SGLang's own checks said, and the shrink."""

from __future__ import annotations

from kvcanary_cli.render.records.soak import SoakFailureRecord, SoakRecord

__all__ = ["ran_line", "shrunk_line", "sglang_verdict", "soak_verdict"]

CLEAN = "clean: no finding, SGLang's checks silent on every audited step"


def ran_line(record: SoakRecord) -> str:
    """Histories, steps of the budget, audits (and seconds, with --timings)."""
    seconds = "" if record["seconds"] is None else f", {record['seconds']} s"
    return (
        f"seed {record['seed']}, {record['histories']} histories, {record['steps']} of "
        f"{record['budget']} steps, {record['audited_steps']} audited{seconds}"
    )


def soak_verdict(failure: SoakFailureRecord | None) -> str:
    """Clean, or where the first failing history failed and what kvcanary named."""
    if failure is None:
        return CLEAN
    planted = "" if failure["fault"] is None else f", fault {failure['fault']} planted"
    return (
        f"FOUND at step {failure['step']} ({failure['when']}) of seed {failure['seed']}, page "
        f"size {failure['page_size']}, {failure['core']} core{planted}: "
        f"{', '.join(failure['codes'])} (cause: {failure['top_cause'] or 'none named'})"
    )


def sglang_verdict(record: SoakRecord) -> str:
    """What SGLang's own checks said at the failing step."""
    if record["sglang_missed"]:
        return "SGLang's own checks were silent at that step: only kvcanary saw it"
    return "SGLang's own checks at that step: " + " | ".join(record["sglang_said"])


def shrunk_line(record: SoakRecord) -> str | None:
    """How far the failing workload shrank, when something was found."""
    if record["shrunk_arrivals"] is None:
        return None
    before, after = record["shrunk_arrivals"]
    return f"shrunk the workload from {before} to {after} requests"
