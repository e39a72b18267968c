"""torch in kvcanary's tests: an extra (`kvcanary[torch]`), so a test that needs it skips where
it is absent, with the reason and the install command, and every other test runs without it.

A test module that imports torch (itself or through a helper) is skipped as a whole by
`tests/conftest.py` when that import fails for want of torch; a test that imports it lazily
asks `needs_torch()`. With torch installed (CI installs it) all of them run.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

import kvcanary_cli

#: The reason every torch-less skip gives.
NEEDS_TORCH = "needs torch, which kvcanary installs as an extra: pip install 'kvcanary[torch]'"

HAS_TORCH = importlib.util.find_spec("torch") is not None
PACKAGE = Path(kvcanary_cli.__file__).resolve().parent


def needs_torch() -> ModuleType:
    """torch, or skip the calling test (or module) where it is not installed."""
    torch: ModuleType = pytest.importorskip("torch", reason=NEEDS_TORCH)
    return torch


def is_missing_torch(error: BaseException | None, *, torch_installed: bool = HAS_TORCH) -> bool:
    """Whether `error` (an import's failure) is torch, or a part of it, not being installed,
    and a test (or its helper) asked for it: kvcanary's own modules never import torch when
    imported, so a failure raised from one of them is a bug to report, not a test to skip."""
    if torch_installed or not isinstance(error, ModuleNotFoundError) or error.name is None:
        return False
    if error.name != "torch" and not error.name.startswith("torch."):
        return False
    frame = error.__traceback__
    while frame is not None:
        if PACKAGE in Path(frame.tb_frame.f_code.co_filename).parents:
            return False
        frame = frame.tb_next
    return True


#: Python source that makes torch absent from the process it runs in, as on a machine where it
#: was never installed (`import torch` raises `No module named 'torch'`), whatever this one has.
WITHOUT_TORCH = """
import importlib.abc
import sys


class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoTorch())
for _name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
    del sys.modules[_name]
"""
