"""Shared fixtures: synthetic dumps on disk, a CLI runner, and the golden-refresh flag."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite tests/golden/* from the current output instead of comparing",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture
def tmp_dump(tmp_path: Path) -> Path:
    return tmp_path / "dump.safetensors"
