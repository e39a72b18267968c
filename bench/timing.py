"""The timers the benchmark scripts share: wall times of repeated runs, CUDA work included."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["samples", "summary", "timed"]


def _synchronize() -> None:
    """Wait for queued CUDA work, when torch is loaded and a device is in use (the compiled
    kernels); the timers never import torch themselves, as `check` on a CPU does not."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def samples(fn: Callable[[], object], repeat: int) -> list[float]:
    """Wall times (s) of `repeat` runs; synchronizes CUDA so GPU work is counted."""
    out = []
    for _ in range(repeat):
        _synchronize()
        start = time.perf_counter()
        fn()
        _synchronize()
        out.append(time.perf_counter() - start)
    return out


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time (s) of `repeat` runs."""
    return statistics.median(samples(fn, repeat))


def summary(values: list[float]) -> dict[str, Any]:
    """min / median / max of some samples, and the samples."""
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "samples": values,
    }
