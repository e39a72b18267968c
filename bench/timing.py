"""The timers the benchmark scripts share: wall times of repeated runs, CUDA work included."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["samples", "summary", "timed"]


def samples(fn: Callable[[], object], repeat: int) -> list[float]:
    """Wall times (s) of `repeat` runs; synchronizes CUDA so GPU work is counted."""
    out = []
    for _ in range(repeat):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
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
