"""Results of `kvcanary soak`: what a soak ran and found (standard library only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["SoakReport"]


@dataclass
class SoakReport:
    """What a soak ran and found."""

    sglang_version: str
    sglang_root: str
    histories: int = 0
    steps: int = 0
    audited_steps: int = 0
    seconds: float = 0.0
    found: bool = False
    #: the first failing history: its seed, page size, core, step, finding codes, top cause
    failure: dict[str, Any] | None = None
    #: what SGLang's own checks said at that step (empty: nothing), and whether they were
    #: silent about what kvcanary found
    sglang_said: list[str] = field(default_factory=list)
    sglang_missed: bool = False
    files: dict[str, str] = field(default_factory=dict)
    shrunk_arrivals: tuple[int, int] | None = None
