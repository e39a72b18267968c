"""The terminal view of a soak (the `kvcanary.soak/1` record): a few lines, the files last;
and the soak in words, as its Markdown view says it too."""

from __future__ import annotations

from kvcanary_cli.results.soak import SoakFailure, SoakReport
from kvcanary_cli.safe_text import printable_record

__all__ = ["ran_line", "shrunk_line", "sglang_verdict", "soak_table", "soak_verdict"]

CLEAN = "clean: no finding, SGLang's checks silent on every audited step"


def soak_table(report: SoakReport) -> str:
    """What ran, the verdict, what SGLang said, the shrink and the files written."""
    report = printable_record(report)
    lines = [
        f"kvcanary soak: SGLang {report.sglang_version} ({report.sglang_root}), "
        + ran_line(report),
        soak_verdict(report.failure),
    ]
    if report.failure is not None:
        lines.append(sglang_verdict(report))
        shrunk = shrunk_line(report)
        if shrunk is not None:
            lines.append(shrunk)
        lines += [f"  {name}: {path}" for name, path in report.files.items()]
    return "".join(line + "\n" for line in lines)


def ran_line(report: SoakReport) -> str:
    """Histories, steps of the budget, audits (and seconds, with --timings)."""
    seconds = "" if report.seconds is None else f", {report.seconds} s"
    return (
        f"seed {report.seed}, {report.histories} histories, {report.steps} of "
        f"{report.budget} steps, {report.audited_steps} audited{seconds}"
    )


def soak_verdict(failure: SoakFailure | None) -> str:
    """Clean, or where the first failing history failed and what kvcanary named."""
    if failure is None:
        return CLEAN
    planted = "" if failure.fault is None else f", fault {failure.fault} planted"
    return (
        f"FOUND at step {failure.step} ({failure.when}) of seed {failure.seed}, page "
        f"size {failure.page_size}, {failure.core} core{planted}: "
        f"{', '.join(failure.codes)} (cause: {failure.top_cause or 'none named'})"
    )


def sglang_verdict(report: SoakReport) -> str:
    """What SGLang's own checks said at the failing step."""
    if report.sglang_missed:
        return "SGLang's own checks were silent at that step: only kvcanary saw it"
    return "SGLang's own checks at that step: " + " | ".join(report.sglang_said)


def shrunk_line(report: SoakReport) -> str | None:
    """How far the failing workload shrank, when something was found."""
    if report.shrunk_arrivals is None:
        return None
    before, after = report.shrunk_arrivals
    return f"shrunk the workload from {before} to {after} requests"
