"""The one load of SGLang 0.5.23's memory-cache stack that the stack and timeline tests share,
and its modules first on `sys.path` for a module's tests (`modules`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.sglang_wheel import MISSING_WHEEL, wheel_path


@pytest.fixture(scope="session")
def sglang() -> Any:
    """SGLang's modules from the cached release wheel; the test is skipped without it."""
    wheel = wheel_path()
    if wheel is None:
        pytest.skip(MISSING_WHEEL)
    from kvcanary_cli.soak.stack import SGLangUnavailableError, load_sglang

    try:
        return load_sglang(wheel)
    except SGLangUnavailableError as exc:
        pytest.skip(f"SGLang's stack does not import here: {exc}")


@pytest.fixture(scope="session")
def vllm() -> Any:
    """vLLM 0.33.0's KV-cache manager modules from the cached release wheel (skipped without)."""
    from tests.vllm_wheel import load_or_skip

    return load_or_skip()


@pytest.fixture(scope="module")
def modules(sglang: Any) -> Iterator[Any]:
    """The session's SGLang, its modules importable for the module's tests (`loaded`)."""
    from tests.live_capture import loaded

    with loaded(sglang) as loaded_modules:
        yield loaded_modules
