"""The one timer the benchmark scripts share: median wall time, CUDA work included."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time (s) of `repeat` runs; synchronizes CUDA so GPU work is counted."""
    samples = []
    for _ in range(repeat):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
