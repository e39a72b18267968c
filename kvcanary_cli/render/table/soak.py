"""The terminal view of a soak (the `kvcanary.soak/2` record): a few lines, the files last;
and the soak in words, as its Markdown view says it too. What each side saw is said side by
side: kvcanary's finding (or "kvcanary: nothing"), SGLang's complaints or crash (or that its
checks were silent), and who saw a fault first."""

from __future__ import annotations

from kvcanary_cli.render.console import plural
from kvcanary_cli.results.soak import SGLANG_RECORDED, SGLangCheck, SGLangMessage, SoakReport
from kvcanary_cli.safe_text import printable_record

__all__ = [
    "check_line",
    "coverage_lines",
    "fault_line",
    "message_line",
    "ran_line",
    "reading_line",
    "replay_line",
    "seen_line",
    "shrunk_line",
    "soak_table",
    "soak_verdict",
]

SILENT = "SGLang's own checks silent on every audited step"
CLEAN = f"clean: kvcanary found nothing, {SILENT}"


def soak_table(report: SoakReport) -> str:
    """What ran, the verdict, who saw it first, what SGLang said, the shrink and the files."""
    report = printable_record(report)
    lines = [
        f"kvcanary soak: SGLang {report.sglang_version} ({report.sglang_root}), "
        + ran_line(report),
        soak_verdict(report),
    ]
    replayed = replay_line(report)
    if replayed is not None:
        lines.insert(1, replayed)
    planted = fault_line(report)
    if planted is not None:
        lines.append(planted)
    seen = seen_line(report)
    if seen is not None:
        lines.append(seen)
    if report.sglang_checks:
        lines.append("SGLang's own checks over the run:")
        for check in report.sglang_checks:
            lines.append(f"  {check_line(check)}")
            lines += [f"    {message_line(said)}" for said in check.first]
    elif report.found:
        lines.append(SILENT)
    reading = reading_line(report)
    if reading is not None:
        lines.append(reading)
    lines += coverage_lines(report)
    shrunk = shrunk_line(report)
    if shrunk is not None:
        lines.append(shrunk)
    lines += [f"  {name}: {path}" for name, path in report.files.items()]
    return "".join(line + "\n" for line in lines)


def coverage_lines(report: SoakReport) -> list[str]:
    """With --coverage: how many memory-cache functions ran, and the free paths reached and
    not reached (those of features soak does not drive apart); none without it."""
    covered = report.coverage
    if covered is None:
        return []
    total = len(covered.reached) + len(covered.not_reached)
    lines = [
        f"coverage: {covered.functions_run} SGLang memory-cache functions ran; "
        f"{len(covered.reached)} of {total} free paths of this layout reached"
    ]
    for title, names in (
        ("not reached", covered.not_reached),
        ("not reached, other features (host tier, sessions, mamba, CUDA)", covered.other_features),
        ("reached", covered.reached),
    ):
        if names:
            lines.append(f"  {title}: {', '.join(names)}")
    return lines


def ran_line(report: SoakReport) -> str:
    """Histories, steps of the budget, audits, the ranks and the overlapped loop where they ran
    (and seconds, with --timings)."""
    seconds = "" if report.seconds is None else f", {report.seconds} s"
    histories = plural(report.histories, "history", "histories")
    ranks = "" if report.tp == 1 else f" on {report.tp} tensor-parallel ranks, compared"
    loop = ", SGLang's overlapped loop" if report.overlap else ""
    return (
        f"seed {report.seed}, {histories}, {report.steps} of "
        f"{report.budget} steps, {report.audited_steps} audited{ranks}{loop}{seconds}"
    )


def soak_verdict(report: SoakReport) -> str:
    """Clean; where kvcanary's first finding was and what it named (and SGLang's crash later
    in that step); SGLang's crash; or SGLang's complaints alone."""
    failure = report.failure
    if failure is None:
        if not report.found:
            return CLEAN
        return "FOUND by SGLang's own checks only; kvcanary: nothing on every audited step"
    where = f"seed {failure.seed}, page size {failure.page_size}, {failure.core} core"
    if failure.rank is not None and failure.divergence is None:
        where += f", rank {failure.rank}"
    planted = "" if failure.fault is None else f", fault {failure.fault} planted"
    crash = failure.crash
    if crash is not None:
        raised = "" if crash.raised_in is None else f", raised in {crash.raised_in}"
        state = (
            "no state was audited before it"
            if crash.state_step is None
            else f"the dump is the last state audited before it, step {crash.state_step} "
            f"({crash.state_when})"
        )
        return (
            f"FOUND: SGLang crashed at step {failure.step} ({where}{planted}): "
            f"{crash.exception}: {crash.message}{raised}; {state}"
        )
    if failure.divergence is not None:
        return (
            f"FOUND at step {failure.step} ({failure.when}) of {where}{planted}: rank "
            f"{failure.rank} parted from rank 0 ({failure.divergence.kind}): "
            f"{failure.divergence.message}"
        )
    after = failure.crash_after
    then = (
        ""
        if after is None
        else f"; SGLang crashed too, in the same step: {after.exception}: {after.message}"
        + ("" if after.raised_in is None else f", raised in {after.raised_in}")
    )
    return (
        f"FOUND at step {failure.step} ({failure.when}) of {where}{planted}: "
        f"{', '.join(failure.codes)} (cause: {failure.top_cause or 'none named'}){then}"
    )


def fault_line(report: SoakReport) -> str | None:
    """With --fault: whether the planted bug ever acted. A clean soak whose fault never acted
    proves nothing either way, and one whose fault acted unseen is kvcanary's miss: both are
    said, never a bare "clean"."""
    if report.fault is None or report.fault_acted is None:
        return None
    if report.fault_acted == 0:
        return (
            f"the planted fault {report.fault} never acted: the workload never ran the code it "
            "changes, so there was nothing to find (more steps, another layout or page size "
            "may reach it)"
        )
    acted = f"the planted fault {report.fault} acted {plural(report.fault_acted, 'time')}"
    return acted if report.kvcanary_found else f"{acted}; kvcanary found nothing"


def seen_line(report: SoakReport) -> str | None:
    """Who saw a fault first in the history compared, and by how many steps."""
    seen = report.seen
    if seen is None:
        return None
    history = f"seed {seen.seed}, page size {seen.page_size}, {seen.core} core"
    kvcanary = f"step {seen.kvcanary_step} ({seen.kvcanary_when})"
    sglang = f"step {seen.sglang_step} ({seen.sglang_when})"
    if seen.kvcanary_step is None:
        return f"only SGLang saw it, first at {sglang} of {history}; kvcanary: nothing"
    if seen.sglang_step is None:
        return (
            f"only kvcanary saw it: SGLang's own checks were silent in that history through "
            f"{kvcanary}"
        )
    if seen.first == "both":
        return f"kvcanary and SGLang both saw it first at {kvcanary} of {history}"
    (first, at), (second, then) = (
        [("kvcanary", kvcanary), ("SGLang", sglang)]
        if seen.first == "kvcanary"
        else [("SGLang", sglang), ("kvcanary", kvcanary)]
    )
    later = "later in the same step" if seen.lead == 0 else f"{seen.lead} steps later"
    return f"{first} saw it first, at {at} of {history}; {second} at {then}, {later}"


def check_line(check: SGLangCheck) -> str:
    """One of SGLang's checks: how often it complained."""
    steps, histories = (
        plural(check.steps, "audited step"),
        plural(check.histories, "history", "histories"),
    )
    return f"{check.check}: {steps} in {histories}"


def message_line(said: SGLangMessage) -> str:
    """One complaint: where, and what."""
    return (
        f"step {said.step} ({said.when}) of seed {said.seed}, page size {said.page_size}, "
        f"{said.core} core: {said.message}"
    )


def reading_line(report: SoakReport) -> str | None:
    """Where only SGLang complained: what `kvcanary leak` reads of the kept complaint on the
    state it was said of."""
    read = report.reading
    if read is None:
        return None
    cause = "" if read.cause is None else f" [{read.cause}]"
    return (
        f"kvcanary leak on {read.check}'s complaint and the dump of step {read.step} "
        f"({read.when}): {read.verdict}{cause}: {read.summary}"
    )


def shrunk_line(report: SoakReport) -> str | None:
    """How far the failing workload shrank, when something was found; its dump is no smaller
    (the same pools), and the line says so."""
    if report.shrunk_arrivals is None:
        return None
    before, after = report.shrunk_arrivals
    return (
        f"shrunk the workload from {before} to {after} requests (its dump records the same "
        "pools: no smaller than the first)"
    )


def replay_line(report: SoakReport) -> str | None:
    """With --replay: the reproducer, and whether the finding it recorded came back."""
    replay = report.replay
    if replay is None:
        return None
    sglangs = replay.recorded.startswith(SGLANG_RECORDED)  # only SGLang's check complained
    if replay.reproduced:
        came = "came back"
    elif report.failure is not None or (sglangs and report.sglang_checks):
        came = "did not come back: another failure instead"
    elif sglangs:
        came = "did not come back: SGLang's checks silent"
    else:
        came = "did not come back: kvcanary found nothing"
    change = replay.release_change("SGLang", report.sglang_version)
    said = f"replayed {replay.reproducer}: its finding ({replay.recorded}) {came}"
    return said if change is None else f"{said} ({change})"
