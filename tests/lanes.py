"""The suite's three lanes, one rule each.

- the fast lane (`-m "not slow"`): what a change needs while it is made, in about a minute and
  a quarter: kvcanary's own code, each test well under a second; the tests that start a process,
  run an engine's own code (`tests/integration/`: `engine_stack`) or take seconds are `slow`;
- the suite (`python -m pytest`, the README's command and CI's): every question once, on every
  engine layout and the releases where the engine's code differs, in five minutes on 2 cores;
- the deep lane (`python -m pytest -m deep`; `KVCANARY_DEEP=1` adds it to any run): the same
  questions asked again, at more seeds, sizes, page sizes, mutants and releases, and the
  benchmark harnesses run end to end (their figures are measured in bench/ anyway). Its tests
  are `deep` (and `slow`); a run that neither names the marker nor sets the variable
  deselects them, and says so after its summary.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

__all__ = ["DEEP", "DEEP_ENV", "deep_lane_on", "deep_repeats", "engine_stack", "engines_first"]

#: Set to 1, the suite runs the deep lane too.
DEEP_ENV = "KVCANARY_DEEP"
#: The marks of a deep test: deselected by default, outside the fast lane always.
DEEP = (pytest.mark.slow, pytest.mark.deep)


@functools.cache  # asked once per test item (thousands), of a few hundred modules
def engine_stack(path: Path) -> bool:
    """Whether the test module at `path` runs an engine's own code (SGLang's memory-cache
    stack, vLLM's manager, from their wheels: `tests/integration/`). Those tests are the
    suite's, never the fast lane's: a process imports the engine once before its first such
    test (SGLang: about 11 s of CPU), and its histories run for seconds."""
    return _INTEGRATION in path.resolve().parents


_INTEGRATION = Path(__file__).resolve().parent / "integration"


def deep_lane_on(markexpr: str = "") -> bool:
    """Whether this run asks every question again: `KVCANARY_DEEP=1`, or a `-m` expression
    (`markexpr`) that names the deep lane (`-m deep`; `-m "not deep"` leaves it out itself)."""
    return os.environ.get(DEEP_ENV) == "1" or "deep" in markexpr


def deep_repeats(values: Iterable[object]) -> list[Any]:
    """`values` for `parametrize`: the first in every lane, the others (repeats of the path the
    first takes: another seed, a larger size) in the deep lane."""
    first, *rest = values
    return [first, *(pytest.param(value, marks=DEEP) for value in rest)]


#: The fixtures that load an engine's stack into the test process (tests/integration/conftest.py).
ENGINE_FIXTURES = frozenset({"sglang", "vllm"})


def engines_first(items: list[Any]) -> None:
    """Reorder `items` (pytest's, in place): the modules with a test that loads an engine into
    the test process (`ENGINE_FIXTURES`: SGLang's import is 10 s of CPU, vLLM's manager's 2 s)
    first, each whole, everything in its order otherwise. xdist's work stealing hands each
    worker a slice of the list in order and steals from the tail of a queue, so in a suite run
    one worker loads each engine once; where these modules sat mid-list, both workers loaded
    both (13 s of CPU a run)."""
    first = {
        item.path for item in items if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ()))
    }
    items.sort(key=lambda item: item.path not in first)  # stable
