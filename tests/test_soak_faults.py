"""The host-tier faults (`soak.faults`) act on the Python tree core's nodes alone: on the Rust
core's adapter, whose node reads raise `NotImplementedError`, they find no node and never act
(before, that error left the fault's wrapper inside SGLang's call, and the history stopped as
SGLang's crash); `--core rust` with one is refused in one line."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvcanary_cli.errors import OptionError
from kvcanary_cli.soak.faults import PYTHON_CORE_FAULTS


class _RustAdapter:
    """What SGLang's Rust tree core adapter answers for its Python nodes (0.5.22, 0.5.23)."""

    def node_by_id(self, node_id: Any) -> Any:
        raise NotImplementedError("node_by_id: not yet ported to the Rust tree core")

    @property
    def root_node(self) -> Any:
        raise NotImplementedError("root_node: not yet ported to the Rust tree core")


def test_the_rust_cores_adapter_has_no_node_for_a_fault() -> None:
    from kvcanary_cli.soak.faults import _python_node

    assert _python_node(SimpleNamespace(tree_core=_RustAdapter()), 3) is None
    node = object()
    python = SimpleNamespace(root_node=node, node_by_id=lambda node_id: node)
    assert _python_node(SimpleNamespace(tree_core=python), 3) is node


@pytest.mark.parametrize("fault", PYTHON_CORE_FAULTS)
def test_a_python_core_fault_on_the_rust_core_is_refused(tmp_path: Path, fault: str) -> None:
    from kvcanary_cli.soak.command import soak

    with pytest.raises(OptionError, match=f"the {fault} fault acts on the Python tree core"):
        soak(
            sglang_tree=None,
            steps=10,
            seed=0,
            out=tmp_path / "out",
            hicache=True,
            fault=fault,
            core="rust",
        )
