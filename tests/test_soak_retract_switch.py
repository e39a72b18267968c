"""soak.driver honours SGLang's own retraction test switch (`SGLANG_TEST_RETRACT`, with its
interval and its no-prefill batch size), read as the loaded release's `envs` reads it: off or
undeclared, nothing changes; on, a decode chosen after a multiple of the interval's forwards
retracts and no prefill is added while more requests run than the batch size allows. A
reproducer records the switch for its replay."""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvcanary_cli.soak.command import read_reproducer
from kvcanary_cli.soak.driver import TEST_RETRACT, RetractTest, retract_test
from tests.lanes import DEEP
from tests.sglang_wheel import WHEEL_VERSION, missing_wheel, wheel_path
from tests.torch_extra import needs_torch

SWITCH, INTERVAL, NO_PREFILL_BS = TEST_RETRACT
#: SGLang 0.5.23's crash under the overlapped loop, forced by its switch (docs/soak.md: a
#: streaming session's one-token turn retracted), shrunk from seed 534
ONE_TOKEN_TURN = (
    Path(__file__).resolve().parents[1]
    / "docs"
    / "reproducers"
    / "sglang-0.5.23-overlap-retract-one-token-turn.json"
)


class _Field:
    """A stand-in registry field: the environment variable its attribute names, parsed, or
    its default where unset."""

    def __init__(self, default: Any) -> None:
        self.default = default

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def get(self) -> Any:
        value = os.environ.get(self.name)
        if value is None:
            return self.default
        if isinstance(self.default, bool):
            return value.lower() in ("1", "true", "yes", "y")
        return int(value)


class _Envs:
    SGLANG_TEST_RETRACT = _Field(False)
    SGLANG_TEST_RETRACT_INTERVAL = _Field(3)
    SGLANG_TEST_RETRACT_NO_PREFILL_BS = _Field(2**31)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TEST_RETRACT:
        monkeypatch.delenv(name, raising=False)


def test_off_unless_the_release_reads_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    assert retract_test(_Envs()) is None
    monkeypatch.setenv(SWITCH, "0")
    assert retract_test(_Envs()) is None
    monkeypatch.setenv(SWITCH, "1")
    assert retract_test(None) is None  # a release that does not declare it
    assert retract_test(SimpleNamespace(SGLANG_TEST_RETRACT=_Envs.SGLANG_TEST_RETRACT)) is None


def test_on_with_sglang_s_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SWITCH, "true")
    test = retract_test(_Envs())
    assert test == RetractTest(interval=3, no_prefill_bs=2**31)
    # forward_ct as SGLang counts it when the decode is chosen: forwards launched before
    assert [ct for ct in range(10) if test.retracts(ct)] == [0, 3, 6, 9]
    assert not test.skips_prefill(10**6)
    assert "once every 3 forwards" in test.note() and "no prefill" not in test.note()


def test_on_with_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SWITCH, "1")
    monkeypatch.setenv(INTERVAL, "5")
    monkeypatch.setenv(NO_PREFILL_BS, "2")
    test = retract_test(_Envs())
    assert test == RetractTest(interval=5, no_prefill_bs=2)
    assert [ct for ct in range(11) if test.retracts(ct)] == [0, 5, 10]
    assert [bs for bs in range(5) if test.skips_prefill(bs)] == [3, 4]
    assert "over 2 requests run" in test.note()


def test_a_reproducer_records_the_switch_for_its_replay(tmp_path: Path) -> None:
    body = json.loads(ONE_TOKEN_TURN.read_text())
    on = tmp_path / "on.json"
    body["environment"] = {SWITCH: "1", INTERVAL: "3", "PATH": "/x"}
    on.write_text(json.dumps(body))
    assert read_reproducer(on).environment == {SWITCH: "1", INTERVAL: "3"}  # SGLang's only
    off = tmp_path / "off.json"
    del body["environment"]
    off.write_text(json.dumps(body))
    assert read_reproducer(off).environment == {}


def test_the_release_reads_the_names_soak_honours() -> None:
    wheel = wheel_path(WHEEL_VERSION)
    if wheel is None:
        pytest.skip(missing_wheel(WHEEL_VERSION))
    with zipfile.ZipFile(wheel) as archive:
        scheduler = archive.read("sglang/srt/managers/scheduler.py").decode()
    read = set(re.findall(r"envs\.(SGLANG_TEST_RETRACT\w*)\.get\(\)", scheduler))
    assert read == set(TEST_RETRACT)
    assert "self.forward_ct += 1" in scheduler  # counted once a batch runs


def test_the_shipped_reproducer_records_the_switch() -> None:
    assert read_reproducer(ONE_TOKEN_TURN).environment == {SWITCH: "1"}
    body = json.loads(ONE_TOKEN_TURN.read_text())
    assert body["workload"]["overlap"] and body["crash"]["exception"] == "AssertionError"


@pytest.mark.parametrize("lane", [pytest.param(0, marks=DEEP)])
def test_its_replay_crashes_as_sglang_does(lane: int) -> None:
    """The replay sets the switch the reproducer records (none in the environment) and
    SGLang's assertion comes back; the environment is left as it was."""
    needs_torch()
    wheel = wheel_path(WHEEL_VERSION)
    if wheel is None:
        pytest.skip(missing_wheel(WHEEL_VERSION))
    from kvcanary_cli.soak.command import replay

    report = replay(reproducer=ONE_TOKEN_TURN, sglang_tree=str(wheel))
    assert report.replay is not None and report.replay.reproduced, report
    assert report.failure is not None and report.failure.crash is not None
    assert report.failure.crash.message == "a reused row must carry allocated KV"
    assert all(name not in os.environ for name in TEST_RETRACT)
