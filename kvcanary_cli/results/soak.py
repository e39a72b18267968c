"""Results of `kvcanary soak`: what a soak ran, and what kvcanary and SGLang's own checks saw
(standard library only).

A `SoakReport` is the `kvcanary.soak/2` record; the soak builds it once, at its end. /2 (from
/1): SGLang's complaints are kept for the whole run, per check (`sglang_checks`), not only at
kvcanary's failing step (`sglang_said` is gone); an SGLang crash carries its exception
(`failure.crash`); `seen` says who saw a fault first, and by how many steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from kvcanary_cli.results.leak import LeakVerdict
from kvcanary_cli.results.ranks import Divergence
from kvcanary_cli.results.record import recorded

__all__ = [
    "SGLANG_RECORDED",
    "SOAK_FILES",
    "AuditPoint",
    "CheckPoint",
    "FirstSeen",
    "SGLangCheck",
    "SGLangCheckName",
    "SGLangCrash",
    "SGLangMessage",
    "SGLangReading",
    "SGLangPoint",
    "SoakFailure",
    "SoakFile",
    "SoakCoverage",
    "SoakReplay",
    "SoakReport",
    "StatePoint",
]

#: A file a finding leaves in --out.
SoakFile = Literal["dump", "shrunk_dump", "workload", "reproducer", "reference_dump"]
#: When a history's failing audit ran.
AuditPoint = Literal["plan", "after-result", "idle", "crash"]
#: Where in a step kvcanary audits a state.
StatePoint = Literal["plan", "after-result", "idle"]
#: Where in a step SGLang's checks run.
CheckPoint = Literal["after-result", "idle"]
#: Where in a step SGLang complained: its checks, or its crash.
SGLangPoint = Literal["after-result", "idle", "crash"]
#: One of SGLang's own checks soak runs: two while requests run, three at idle.
SGLangCheckName = Literal[
    "self_check_during_busy",
    "_check_kv_page_invariants",
    "_check_all_pools",
    "_check_req_pool",
    "sanity_check",
]
#: How `SoakReplay.recorded` names a complaint of SGLang's own check: `sglang <check>`.
SGLANG_RECORDED = "sglang "
#: Who saw a fault first in one history.
Seer = Literal["kvcanary", "sglang", "both"]
#: The order of the audit points within one step.
_ORDER: dict[AuditPoint, int] = {"plan": 0, "crash": 1, "after-result": 2, "idle": 3}

#: The files a finding leaves in `--out`, by the name the report gives each, in order.
SOAK_FILES: dict[SoakFile, str] = {
    "dump": "soak-dump.safetensors",
    "shrunk_dump": "soak-shrunk-dump.safetensors",
    "workload": "soak-workload.json",
    "reproducer": "soak-reproducer.json",
    "reference_dump": "soak-reference-dump.safetensors",
}


@dataclass(frozen=True, kw_only=True)
class SGLangCrash:
    """An exception out of SGLang's code while the workload ran (out of memory, an
    assertion): the history ends there."""

    #: the exception's class name (OutOfMemoryError, AssertionError, ...)
    exception: str
    #: its message's first line (300 characters at most)
    message: str
    #: the innermost frame of SGLang's code it came out of ("sglang/srt/...py:LINE in
    #: FUNCTION"); null when no frame of the tree is on its traceback
    raised_in: str | None
    #: the step of the last state kvcanary audited before it (the dump in files); null when
    #: none was
    state_step: int | None
    #: where in that step it was audited; null when none was
    state_when: StatePoint | None


@dataclass(frozen=True, kw_only=True)
class SoakFailure:
    """The first failing history: kvcanary's first finding (SGLang's crash in that step beside
    it, if any), or SGLang's crash."""

    #: the history's own seed (its workload's, as the workload files hold it), not --seed
    seed: int
    page_size: int
    #: the radix tree core: python or rust
    core: str
    #: the scheduler step of the history that failed (from 0)
    step: int
    #: plan: before the step's forward; after-result: once its result was processed; idle: no
    #: request running (after the step); crash: SGLang raised during the step (see crash)
    when: AuditPoint
    #: kvcanary's error finding codes at that step, the top finding's first ("error: ..." for
    #: a dump kvcanary could not read); [] for a crash
    codes: tuple[str, ...]
    #: the top finding's diagnosis cause; shrinking keeps it
    top_cause: str | None
    #: the planted --fault, or null
    fault: str | None
    #: what SGLang raised, when is crash; else null
    crash: SGLangCrash | None = None
    #: what SGLang raised later in the same step, after kvcanary's plan-time audit had
    #: flagged it (the failure is kvcanary's finding; the history stopped there); else null
    crash_after: SGLangCrash | None = None
    #: --tp above 1: the rank whose finding or crash this is, or that diverged from rank 0;
    #: else null
    rank: str | None = None
    #: --tp above 1: how that rank's state parted from rank 0's, as `kvcanary ranks` names it
    #: (codes are then [] and top_cause null); else null
    divergence: Divergence | None = None


@dataclass(frozen=True, kw_only=True)
class SoakReplay:
    """`--replay`: a reproducer run again, and whether the finding it recorded came back."""

    #: the reproducer file replayed
    reproducer: str
    #: what it recorded: the top cause of kvcanary's finding, `crash <exception>`, or
    #: `sglang <check>` (only that check of SGLang's complained)
    recorded: str
    #: the replay failed the same way (same top cause, a crash of the same exception, or
    #: that check of SGLang's complaining with kvcanary silent)
    reproduced: bool
    #: the engine's release the reproducer was recorded on (null: the reproducer does not say)
    recorded_on: str | None = None

    def release_change(self, engine: str, running: str) -> str | None:
        """`recorded on SGLang 0.5.21, replayed on 0.5.23` where the releases differ (a finding
        that does not come back may be the release's doing); None where they are one or the
        reproducer does not say."""
        if self.recorded_on is None or self.recorded_on == running:
            return None
        return f"recorded on {engine} {self.recorded_on}, replayed on {running}"


@dataclass(frozen=True, kw_only=True)
class SoakCoverage:
    """`--coverage`: which of SGLang's memory-cache functions the soak's histories ran (not
    the shrinking after a finding). A free path is a function whose name says free, release or
    evict, of the objects soak built (allocators, pools, tree, tree components: the method
    each resolves to) or of `mem_cache/common.py` and `allocation.py`."""

    #: functions of SGLang's srt/mem_cache files that ran at least once
    functions_run: int
    #: free paths that ran, as Class.method (the class defining it) or module.function
    reached: tuple[str, ...]
    #: free paths of the layout soak drives that never ran
    not_reached: tuple[str, ...]
    #: free paths that never ran and serve what soak does not drive (a host tier, sessions,
    #: CUDA; Mamba outside the Mamba layout)
    other_features: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class SGLangMessage:
    """One complaint of one of SGLang's checks."""

    #: the history's own seed
    seed: int
    page_size: int
    core: str
    step: int
    #: after-result: the busy checks, once the step's result was processed; idle: the idle
    #: checks
    when: CheckPoint
    #: what the check raised: its class and the first line of its message (300 characters at
    #: most)
    message: str


@dataclass(frozen=True, kw_only=True)
class SGLangCheck:
    """What one of SGLang's own checks said over the whole soak (a check that never complained
    has no entry)."""

    check: SGLangCheckName
    #: audited steps it complained on, over every history
    steps: int
    #: histories it complained in
    histories: int
    #: its first complaints (3 at most), in the order said
    first: tuple[SGLangMessage, ...]


@dataclass(frozen=True, kw_only=True)
class SGLangReading:
    """The complaint a soak kept (only SGLang's checks complained) read by `kvcanary leak`
    against the state it was said of: a real leak, a double free, or the check's own count
    wrong with everything owned."""

    #: the check whose complaint was kept, and the step and point it was said at
    check: SGLangCheckName
    step: int
    when: CheckPoint
    #: `kvcanary leak`'s verdict, the cause it points to, and the verdict in one sentence
    verdict: LeakVerdict
    cause: str | None
    summary: str


@dataclass(frozen=True, kw_only=True)
class FirstSeen:
    """Who saw a fault first, in one history: the failing one, else the first SGLang
    complained in."""

    #: the history's own seed
    seed: int
    page_size: int
    core: str
    #: kvcanary's first error finding in that history; null: none
    kvcanary_step: int | None
    #: where in its step; null: none
    kvcanary_when: StatePoint | None
    #: SGLang's first complaint in it (a check, or its crash); null: none up to where the
    #: history stopped
    sglang_step: int | None
    #: where in its step: its checks (after-result, idle) or its crash; null: none
    sglang_when: SGLangPoint | None

    #: the side that saw it first (at an earlier step, or earlier in the same step: plan,
    #: crash, after-result, idle); both: at the same point; a side that saw nothing is never
    #: first
    @recorded
    def first(self) -> Seer:
        """The side that saw it earlier."""
        if self.kvcanary_step is None or self.kvcanary_when is None:
            return "sglang"
        if self.sglang_step is None or self.sglang_when is None:
            return "kvcanary"
        kvcanary = (self.kvcanary_step, _ORDER[self.kvcanary_when])
        sglang = (self.sglang_step, _ORDER[self.sglang_when])
        return "both" if kvcanary == sglang else "kvcanary" if kvcanary < sglang else "sglang"

    #: steps between the two sides' first sight (0: the same step); null unless both saw
    @recorded
    def lead(self) -> int | None:
        """How many steps the first side was ahead."""
        if self.kvcanary_step is None or self.sglang_step is None:
            return None
        return abs(self.kvcanary_step - self.sglang_step)


@dataclass(frozen=True, kw_only=True)
class SoakReport:
    """`kvcanary soak --format json`: what a soak ran, kvcanary's first finding, and what
    SGLang's own checks said over the whole run."""

    SCHEMA: ClassVar[str] = "kvcanary.soak/2"

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
    #: the first failing history (kvcanary's finding or SGLang's crash: the soak stops
    #: there); null when none failed
    failure: SoakFailure | None = None
    #: what SGLang's own checks complained of over the whole run, per check, in the order
    #: they first did; [] when they were silent on every audited step
    sglang_checks: tuple[SGLangCheck, ...] = ()
    #: who saw a fault first; null when neither kvcanary nor SGLang saw one
    seen: FirstSeen | None = None
    #: the files written to --out, by kind: dump, shrunk_dump, workload, reproducer (below),
    #: and with ranks that parted reference_dump (rank 0's state beside dump's); where no
    #: history failed, those of the first history SGLang's checks complained in (the state its
    #: check complained of); {} when none failed and SGLang's checks were silent
    files: dict[SoakFile, str] = field(default_factory=dict)
    #: [requests in the failing (or first complained-of) workload, requests in the shrunk
    #: one]; null when nothing was kept
    shrunk_arrivals: tuple[int, int] | None = None
    #: where only SGLang's checks complained and `kvcanary leak` reads the kept complaint (a
    #: leak, double-free or request-pool message): its verdict on the dump kept; else null
    reading: SGLangReading | None = None
    #: --replay: the reproducer replayed (one history, no files written); null for a soak
    replay: SoakReplay | None = None
    #: --coverage: the memory-cache functions and free paths the histories ran; null without
    #: --coverage
    coverage: SoakCoverage | None = None
    #: --fault: the SGLang bug planted in every history; null without one
    fault: str | None = None
    #: times the planted fault did its wrong thing over the histories (0: the workload never
    #: ran the code it changes, so there was nothing to find); null without --fault
    fault_acted: int | None = None
    #: --tp: the tensor-parallel ranks each history ran, compared at every audited step
    tp: int = 1
    #: --overlap: the histories ran SGLang's overlapped scheduler loop (a replay: the
    #: reproducer's history did)
    overlap: bool = False

    #: kvcanary named an error finding
    @recorded
    def kvcanary_found(self) -> bool:
        """A failure that is not SGLang's crash."""
        return self.failure is not None and self.failure.crash is None

    #: SGLang's own checks complained, or SGLang crashed
    @recorded
    def sglang_found(self) -> bool:
        """Any complaint of SGLang's, or its crash (alone, or after kvcanary's finding)."""
        failure = self.failure
        crashed = failure is not None and (
            failure.crash is not None or failure.crash_after is not None
        )
        return bool(self.sglang_checks) or crashed

    #: kvcanary or SGLang saw something (exit 1)
    @recorded
    def found(self) -> bool:
        """Either side: the exit code reads it."""
        return self.kvcanary_found or self.sglang_found

    #: kvcanary found, and SGLang's checks were silent in that history up to that step: only
    #: kvcanary saw it
    @recorded
    def sglang_missed(self) -> bool:
        """The case a soak is for: kvcanary saw what SGLang's checks did not."""
        return self.kvcanary_found and self.seen is not None and self.seen.sglang_step is None
