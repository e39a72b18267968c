"""Shared test set-up: the hypothesis profile, one torch thread, `--update-golden`, `tmp_dump`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

# Examples are drawn from a seeded-per-run random source as usual; only timing-based health
# checks are off, because a loaded 2-core CI machine must not turn slow generation into a failure.
settings.register_profile(
    "kvcanary",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("kvcanary")

# As the CLI does (kvcanary_cli.cli._limit_torch_threads): one intra-op thread; on CPU-quota'd
# CI machines more threads spin against each other and slow every small tensor op.
torch.set_num_threads(1)


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
