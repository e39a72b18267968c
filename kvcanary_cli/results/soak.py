"""Results of `kvcanary soak`: what a soak ran and found (standard library only).

A `SoakReport` is the `kvcanary.soak/1` record; the soak builds it once, at its end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from kvcanary_cli.results.record import recorded

__all__ = ["SOAK_FILES", "AuditPoint", "SoakFailure", "SoakFile", "SoakReport"]

#: A file a finding leaves in --out.
SoakFile = Literal["dump", "shrunk_dump", "workload", "reproducer"]
#: When a history's failing audit ran.
AuditPoint = Literal["plan", "after-result", "idle", "crash"]

#: The files a finding leaves in `--out`, by the name the report gives each, in order.
SOAK_FILES: dict[SoakFile, str] = {
    "dump": "soak-dump.safetensors",
    "shrunk_dump": "soak-shrunk-dump.safetensors",
    "workload": "soak-workload.json",
    "reproducer": "soak-reproducer.json",
}


@dataclass(frozen=True, kw_only=True)
class SoakFailure:
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
    codes: tuple[str, ...]
    #: the top finding's diagnosis cause; shrinking keeps it
    top_cause: str | None
    #: the planted --fault, or null
    fault: str | None


@dataclass(frozen=True, kw_only=True)
class SoakReport:
    """`kvcanary soak --format json`: what a soak ran, and its first finding."""

    SCHEMA: ClassVar[str] = "kvcanary.soak/1"

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
    seconds: float | None = None
    #: the first failing history; null when none failed
    failure: SoakFailure | None = None
    #: what SGLang's own checks said at the failing step, first line of each; [] when silent
    sglang_said: tuple[str, ...] = ()
    #: the files written to --out, by kind: dump, shrunk_dump, workload, reproducer (below);
    #: {} when nothing was found
    files: dict[SoakFile, str] = field(default_factory=dict)
    #: [requests in the failing workload, requests in the shrunk one]; null when nothing was
    #: found
    shrunk_arrivals: tuple[int, int] | None = None

    #: a history failed (exit 1)
    @recorded
    def found(self) -> bool:
        """Whether there is a failure: the exit code reads it."""
        return self.failure is not None

    #: found, and SGLang's own checks were silent at that step: only kvcanary saw it
    @recorded
    def sglang_missed(self) -> bool:
        """The case a soak is for: kvcanary saw what SGLang's checks did not."""
        return self.found and not self.sglang_said
