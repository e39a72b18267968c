"""The `kvcanary.soak/1` record: its declaration, and `soak_record`, the one place it is built
from `results.soak.SoakReport`."""

from __future__ import annotations

from typing import Literal, TypedDict, cast

from kvcanary_cli.results.soak import SoakReport

__all__ = ["SOAK_SCHEMA", "SoakFailureRecord", "SoakFile", "SoakRecord", "soak_record"]

SOAK_SCHEMA: Literal["kvcanary.soak/1"] = "kvcanary.soak/1"

#: A file a finding leaves in --out.
SoakFile = Literal["dump", "shrunk_dump", "workload", "reproducer"]
#: When a history's failing audit ran.
AuditPoint = Literal["plan", "after-result", "idle", "crash"]


class SoakFailureRecord(TypedDict):
    """The first failing history."""

    #: the history's own seed (its workload's, as the workload files hold it), not --seed
    seed: int
    page_size: int
    #: the radix tree core: python or rust
    core: str
    #: the scheduler step of the history that failed
    step: int
    #: plan: before the step's forward; after-result: once its result was processed; idle: no
    #: request running; crash: SGLang raised (its text is in sglang_said)
    when: AuditPoint
    #: kvcanary's error finding codes at that step, the top finding's first ("error: ..." for
    #: a dump kvcanary could not read)
    codes: list[str]
    #: the top finding's diagnosis cause; shrinking keeps it
    top_cause: str | None
    #: the planted --fault, or null
    fault: str | None


class SoakRecord(TypedDict):
    """`kvcanary soak --format json`."""

    schema: Literal["kvcanary.soak/1"]
    kvcanary_version: str
    #: the SGLang release soaked
    sglang_version: str
    #: the tree it was read from
    sglang_root: str
    #: --seed: each history's seed is derived from it
    seed: int
    #: --steps: scheduler steps to run in all (shrinking a finding runs more)
    budget: int
    histories: int
    #: scheduler steps run: the budget, or fewer when a history failed
    steps: int
    #: steps audited by kvcanary and SGLang's checks (some steps are audited twice)
    audited_steps: int
    #: wall-clock seconds of the histories; null unless --timings (a record is reproducible)
    seconds: float | None
    #: a history failed (exit 1)
    found: bool
    #: the first failing history; null when none failed
    failure: SoakFailureRecord | None
    #: what SGLang's own checks said at the failing step, first line of each; [] when silent
    sglang_said: list[str]
    #: found, and SGLang's own checks were silent at that step: only kvcanary saw it
    sglang_missed: bool
    #: the files written to --out, by kind: dump, shrunk_dump, workload, reproducer (below);
    #: {} when nothing was found
    files: dict[SoakFile, str]
    #: [requests in the failing workload, requests in the shrunk one]; null when nothing was
    #: found
    shrunk_arrivals: list[int] | None


def soak_record(report: SoakReport) -> SoakRecord:
    """The `kvcanary.soak/1` record of a soak."""
    failure = report.failure
    return {
        "schema": SOAK_SCHEMA,
        "kvcanary_version": report.kvcanary_version,
        "sglang_version": report.sglang_version,
        "sglang_root": report.sglang_root,
        "seed": report.seed,
        "budget": report.budget,
        "histories": report.histories,
        "steps": report.steps,
        "audited_steps": report.audited_steps,
        "seconds": report.seconds,
        "found": report.found,
        "failure": None
        if failure is None
        else {
            "seed": failure.seed,
            "page_size": failure.page_size,
            "core": failure.core,
            "step": failure.step,
            "when": cast(AuditPoint, failure.when),
            "codes": list(failure.codes),
            "top_cause": failure.top_cause,
            "fault": failure.fault,
        },
        "sglang_said": list(report.sglang_said),
        "sglang_missed": report.sglang_missed,
        "files": {cast(SoakFile, name): path for name, path in report.files.items()},
        "shrunk_arrivals": None if report.shrunk_arrivals is None else [*report.shrunk_arrivals],
    }
