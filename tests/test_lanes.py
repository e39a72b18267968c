"""The suite's order: the modules that load an engine into the test process come first."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.lanes import engines_first


def _item(module: str, *fixtures: str) -> SimpleNamespace:
    return SimpleNamespace(path=Path(module), fixturenames=["request", *fixtures], name=module)


def test_engine_modules_go_first_whole_and_the_rest_keep_their_order() -> None:
    items = [
        _item("analysis/test_a.py"),
        _item("integration/test_stack.py"),
        _item("integration/test_stack.py", "sglang", "modules"),
        _item("cli/test_b.py", "tmp_path"),
        _item("integration/test_releases.py"),
        _item("integration/test_vllm.py", "vllm"),
        _item("analysis/test_a.py"),
    ]
    before = list(items)
    engines_first(items)
    assert [(item.path.name, item.fixturenames) for item in items] == [
        (before[i].path.name, before[i].fixturenames) for i in (1, 2, 5, 0, 3, 4, 6)
    ]


def test_a_run_without_engine_tests_keeps_its_order() -> None:
    items = [_item("b.py"), _item("a.py", "tmp_path"), _item("b.py")]
    before = list(items)
    engines_first(items)
    assert items == before
