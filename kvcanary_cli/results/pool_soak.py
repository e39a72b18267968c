"""Result of `kvcanary soak --engine vllm`: histories of a seeded workload on a block-pool
engine's real manager (vLLM's `KVCacheManager`), audited each step, and what the engine's own
asserts said (`kvcanary.pool-soak/1`; standard library only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from kvcanary_cli.results.pool import PoolFinding
from kvcanary_cli.results.record import recorded
from kvcanary_cli.results.soak import SoakFile, SoakReplay

__all__ = ["EngineComplaint", "PoolSoakHistory", "PoolSoakReport"]


@dataclass(frozen=True, kw_only=True)
class EngineComplaint:
    """What the engine raised during a step (its own asserts): the history ends there."""

    step: int
    #: the exception's class name (AssertionError, ...)
    exception: str
    #: its message's first line (300 characters at most; vLLM's asserts often have none)
    message: str
    #: the innermost frame of the engine's code it came out of ("vllm/...py:LINE in FUNC")
    raised_in: str | None


@dataclass(frozen=True, kw_only=True)
class PoolSoakHistory:
    """One history: its model, how far it ran, and who saw what first."""

    #: full (full attention), hybrid (full + sliding window), hybrid-mamba (full + Mamba
    #: state) or hybrid-chunked-local (full + chunked local attention); a hybrid's groups
    #: share one pool
    model: str
    #: the history's own seed
    seed: int
    #: steps run (a crash ends a history)
    steps: int
    #: steps audited (auditing stops at kvcanary's first finding)
    audited: int
    preemptions: int
    prefix_hits: int
    aborts: int
    #: --speculative-tokens: the draft tokens its steps verified, and of those accepted (0
    #: without speculative decoding)
    drafted: int = 0
    accepted: int = 0
    #: the step a planted --fault was planted at, and what it did; null without one
    fault_step: int | None
    fault_note: str | None
    #: the step of kvcanary's first finding; null when it found none
    finding_step: int | None
    #: kvcanary's findings at that step (the top one first)
    findings: tuple[PoolFinding, ...]
    #: what the engine's own asserts raised, and when; null when they said nothing
    engine_said: EngineComplaint | None


@dataclass(frozen=True, kw_only=True)
class PoolSoakReport:
    """`kvcanary soak --engine vllm`: the histories run, each with what each side saw."""

    SCHEMA: ClassVar[str] = "kvcanary.pool-soak/1"

    engine: str
    #: the engine release run (from its wheel's metadata; "unknown" when it does not say)
    engine_version: str
    #: --steps: audited steps asked for, over every history
    steps: int
    seed: int
    #: the planted fault, or null
    fault: str | None
    histories: tuple[PoolSoakHistory, ...]
    #: seconds the soak took (only with --timings; null otherwise)
    seconds: float | None = None
    #: the files a finding wrote to --out, by kind: dump (the failing step's pool: kvcanary's
    #: finding, else the one the assert hook wrote when the engine raised) and reproducer
    #: (the history's model, seed, steps and fault, and what it found); {} when none
    files: dict[SoakFile, str] = field(default_factory=dict)
    #: --replay: the reproducer run again (one history, no files written); null for a soak.
    #: Its `recorded` is the top finding's code, or `crash <exception>`
    replay: SoakReplay | None = None
    #: --overlap: run under the engine's async scheduling (vLLM's: a step scheduled while
    #: the last is in flight)
    overlap: bool = False
    #: --speculative-tokens: the draft tokens a decode step verifies (speculative decoding);
    #: 0 without it
    speculative_tokens: int = 0

    @recorded
    def audited(self) -> int:
        """Steps audited over every history."""
        return sum(h.audited for h in self.histories)

    @recorded
    def found(self) -> bool:
        """kvcanary found something, or the engine's asserts raised."""
        return any(h.findings or h.engine_said for h in self.histories)
