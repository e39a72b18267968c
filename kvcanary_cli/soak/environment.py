"""One process-wide environment variable set for a while: SGLang reads some of its switches
(the tree core, the Triton interpreter, the storage backend's folder) from the environment
when it builds an object, so soak sets them around that and puts the process's own back."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["environment_set"]


@contextmanager
def environment_set(name: str, value: str) -> Iterator[None]:
    """`name` set to `value` inside, restored on the way out (unset if it was)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
