"""Results of `kvcanary soak`: what a soak ran and found (standard library only).

Render turns a `SoakReport` into the `kvcanary.soak/1` record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

__all__ = ["SOAK_FILES", "SoakFailure", "SoakReport"]

#: The files a finding leaves in `--out`, by the name the report gives each, in order.
SOAK_FILES = {
    "dump": "soak-dump.safetensors",
    "shrunk_dump": "soak-shrunk-dump.safetensors",
    "workload": "soak-workload.json",
    "reproducer": "soak-reproducer.json",
}


@dataclass(frozen=True, kw_only=True)
class SoakFailure:
    """The first failing history: where it failed and what kvcanary named."""

    #: the history's own seed (its workload's), not `--seed`
    seed: int
    page_size: int
    core: str
    step: int
    #: when the failing audit ran: plan, after-result, idle, or crash (SGLang raised)
    when: str
    #: kvcanary's error codes at that step, the top finding's first
    codes: tuple[str, ...]
    top_cause: str | None
    fault: str | None


@dataclass(kw_only=True)
class SoakReport:
    """What a soak ran and found."""

    SCHEMA: ClassVar[str] = "kvcanary.soak/1"

    kvcanary_version: str
    sglang_version: str
    sglang_root: str
    seed: int
    #: `--steps`: scheduler steps to run in all
    budget: int
    histories: int = 0
    steps: int = 0
    audited_steps: int = 0
    #: wall-clock seconds, measured only when asked (`--timings`): a report is reproducible
    seconds: float | None = None
    failure: SoakFailure | None = None
    #: what SGLang's own checks said at the failing step (empty: nothing)
    sglang_said: list[str] = field(default_factory=list)
    #: the files written, by their `SOAK_FILES` name
    files: dict[str, str] = field(default_factory=dict)
    #: requests in the failing workload and in the shrunk one
    shrunk_arrivals: tuple[int, int] | None = None

    @property
    def found(self) -> bool:
        """A history failed (exit 1)."""
        return self.failure is not None

    @property
    def sglang_missed(self) -> bool:
        """SGLang's own checks were silent at the step kvcanary flagged."""
        return self.found and not self.sglang_said
