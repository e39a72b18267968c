"""The hostile budget values of `tests/fuzz/budget_values.py` through the capture's budget:
each closes capture (a count: its trigger) and is never read as the default."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcanary_cli.capture import store, triggers
from tests.fuzz.budget_values import HOSTILE_BYTE_COUNTS, HOSTILE_COUNTS, READABLE_BYTE_COUNTS


@pytest.mark.parametrize("value", HOSTILE_COUNTS, ids=ascii)
def test_a_hostile_dump_limit_closes_the_budget(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KVCANARY_DUMP_MAX_BYTES", raising=False)
    monkeypatch.setenv("KVCANARY_DUMP_LIMIT", value)
    budget = store.Budget()
    closed = budget.closed()
    assert closed is not None and closed[0] == "unreadable"
    assert "KVCANARY_DUMP_LIMIT=" in closed[1]
    assert budget.refusal(0) is not None


@pytest.mark.parametrize("value", HOSTILE_COUNTS, ids=ascii)
def test_a_hostile_snapshot_count_turns_its_trigger_off(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "BUDGET", store.Budget())
    monkeypatch.setenv("KVCANARY_DUMP_EVERY", value)
    monkeypatch.setenv("KVCANARY_GUARD_EVERY", value)
    settings = triggers.Settings.from_env(Path("unused"), None)
    assert (settings.dump_every, settings.guard_every) == (0, 0)
    assert store.read_count("KVCANARY_DUMP_EVERY")[1] is not None


@pytest.mark.parametrize("value", HOSTILE_BYTE_COUNTS, ids=ascii)
def test_a_hostile_byte_budget_closes_the_budget(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KVCANARY_DUMP_LIMIT", raising=False)
    monkeypatch.setenv("KVCANARY_DUMP_MAX_BYTES", value)
    assert store.read_bytes("KVCANARY_DUMP_MAX_BYTES")[0] is None
    closed = store.Budget().closed()
    assert closed is not None and "KVCANARY_DUMP_MAX_BYTES=" in closed[1]


@pytest.mark.parametrize(("value", "expected"), READABLE_BYTE_COUNTS, ids=ascii)
def test_a_readable_byte_budget_is_exactly_what_it_says(
    value: str, expected: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KVCANARY_DUMP_LIMIT", raising=False)
    monkeypatch.setenv("KVCANARY_DUMP_MAX_BYTES", value)
    assert store.Budget().limits() == (store.DEFAULT_DUMP_LIMIT, expected)
