"""soak.driver's environment switches: a history sets the early SWA prefix-lock release under
the name its release declares (0.5.22's new name, or 0.5.13 - 0.5.21's old one), on stand-in
`envs` registries that name the switch each way, and on the names each cached release wheel
declares and reads (read from its source, not imported)."""

from __future__ import annotations

import ast
import os
import re
import zipfile
from types import SimpleNamespace
from typing import Any

import pytest

from kvcanary_cli.soak.driver import (
    RELEASE_PREFILL_SWA,
    SWA_EVICTION_INTERVAL,
    release_prefill_swa_name,
    serving_options,
)
from kvcanary_cli.soak.workload import Workload
from tests.sglang_wheel import RELEASES, WHEEL_VERSION, missing_wheel, wheel_path
from tests.torch_extra import needs_torch

NEW, OLD = RELEASE_PREFILL_SWA


class _Switch:
    """A stand-in registry field: it reads the environment variable its attribute is named."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name


class _NewNames:
    """A registry as 0.5.22 on declares it (the old name only its alias, not a field)."""

    SGLANG_OPT_RELEASE_PREFILL_SWA = _Switch()


class _OldNames:
    """A registry as 0.5.13 - 0.5.21 declare it."""

    SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW = _Switch()


class _NoSwitch:
    """A registry without the switch."""


def _schedule_batch(registry: type) -> SimpleNamespace:
    return SimpleNamespace(envs=registry())


def _workload(release: bool, interval: int = 4) -> Workload:
    return Workload(
        seed=0, arrivals=(), steps=1, release_prefill_swa=release, swa_eviction_interval=interval
    )


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*RELEASE_PREFILL_SWA, SWA_EVICTION_INTERVAL):
        monkeypatch.delenv(name, raising=False)


def _set(schedule_batch: Any, workload: Workload) -> dict[str, str | None]:
    """The switches as a history under `workload` sees them, then put back (the options also
    stand in torch's pinned tensors, as soak runs SGLang: torch needed)."""
    needs_torch()
    undo = serving_options(workload, schedule_batch)
    try:
        return {
            name: os.environ.get(name) for name in (*RELEASE_PREFILL_SWA, SWA_EVICTION_INTERVAL)
        }
    finally:
        undo()


def test_the_name_each_release_declares() -> None:
    assert release_prefill_swa_name(_NewNames()) == NEW
    assert release_prefill_swa_name(_OldNames()) == OLD
    assert release_prefill_swa_name(_NoSwitch()) is None
    assert release_prefill_swa_name(None) is None


def test_the_name_the_field_reads_wins_over_the_attribute() -> None:
    registry = SimpleNamespace(**{OLD: SimpleNamespace(name="SGLANG_SOMETHING_ELSE")})
    assert release_prefill_swa_name(registry) == "SGLANG_SOMETHING_ELSE"
    unnamed = SimpleNamespace(**{OLD: SimpleNamespace(name=None)})
    assert release_prefill_swa_name(unnamed) == OLD


@pytest.mark.usefixtures("clean_environment")
def test_an_older_release_gets_the_old_name() -> None:
    seen = _set(_schedule_batch(_OldNames), _workload(True))
    assert seen == {OLD: "1", NEW: None, SWA_EVICTION_INTERVAL: "4"}
    assert _set(_schedule_batch(_OldNames), _workload(False))[OLD] == "0"


@pytest.mark.usefixtures("clean_environment")
def test_a_newer_release_gets_the_new_name() -> None:
    seen = _set(_schedule_batch(_NewNames), _workload(True))
    assert seen == {NEW: "1", OLD: None, SWA_EVICTION_INTERVAL: "4"}


@pytest.mark.usefixtures("clean_environment")
def test_a_release_without_the_switch_gets_neither_name() -> None:
    seen = _set(_schedule_batch(_NoSwitch), _workload(True, interval=0))
    assert seen == {NEW: None, OLD: None, SWA_EVICTION_INTERVAL: None}


def test_the_process_values_come_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OLD, "keep")
    monkeypatch.delenv(NEW, raising=False)
    seen = _set(_schedule_batch(_OldNames), _workload(True))
    assert seen[OLD] == "1"
    assert (os.environ.get(OLD), os.environ.get(NEW)) == ("keep", None)


def _declared(environ: str) -> list[str]:
    """The names the `Envs` class of a release's `environ.py` assigns in its body."""
    (registry,) = (
        node
        for node in ast.parse(environ).body
        if isinstance(node, ast.ClassDef) and node.name == "Envs"
    )
    return [
        target.id
        for node in registry.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    ]


@pytest.mark.parametrize("version", [*RELEASES, WHEEL_VERSION])
def test_each_release_gets_the_name_its_decode_reads(version: str) -> None:
    wheel = wheel_path(version)
    if wheel is None:
        pytest.skip(missing_wheel(version))
    with zipfile.ZipFile(wheel) as archive:
        environ = archive.read("sglang/srt/environ.py").decode()
        decode = archive.read("sglang/srt/managers/schedule_batch.py").decode()
    read = {
        name for name in re.findall(r"envs\.(\w+)\.get\(\)", decode) if name in RELEASE_PREFILL_SWA
    }
    assert len(read) == 1, read  # the decode reads one of the names soak knows
    registry = type("Envs", (), {name: _Switch() for name in _declared(environ)})
    assert release_prefill_swa_name(registry()) == read.pop()
