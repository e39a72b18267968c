"""SGLang 0.5.23's unified-memory layout (`UnifiedSWAKVPool`, `UnifiedSWATokenToKVPoolAllocator`
over two `MultiEndedAllocator`s sharing one virtual id space) on CPU, driven by kvcanary's soak
scheduler: kvcanary's capture records each audited state from the real objects, and a correct
state checks clean, with SGLang's own checks silent on the same steps.

`req_to_token` and the tree hold virtual ids, minted by the full side over a space larger
than the full side's nominal size; a dump that recorded the nominal size read every id past
it as `slot-beyond-pool`.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")


def _run(sglang: Any, page_size: int, seed: int, steps: int, **kw: Any) -> Any:
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec
    from kvcanary_cli.soak.workload import random_workload

    workload = random_workload(seed, steps=steps, requests=steps // 4, max_prompt=60, max_new=20)
    return run_history(sglang, StackSpec.pressured(page_size, "python", "unified"), workload, **kw)


@pytest.mark.parametrize("page_size", [1, 4])
def test_clean_unified_history(sglang: Any, page_size: int) -> None:
    """A correct unified history checks clean at every audited step (plan time and idle)."""
    result = _run(sglang, page_size, 100, 40)
    assert result.failure is None, (result.failure.step, result.failure.codes)
    assert result.sglang_counts == {}, result.sglang_first
    assert result.audited >= result.steps // 2
    assert result.counters.finishes > 0 and result.counters.decodes > 0


@pytest.mark.parametrize("page_size", [1, 4])
def test_clean_unified_history_under_lazy_compaction(
    sglang: Any, monkeypatch: pytest.MonkeyPatch, page_size: int
) -> None:
    """Lazy compaction, SGLang's default for unified memory: a freed physical page is left a
    hole (`_free_lazy`) that the capture records, and at idle the scheduler's compaction pass
    (`flush_opportunistic`) moves live pages into the holes; the history checks clean and
    SGLang's checks stay silent."""
    from dataclasses import replace
    from importlib import import_module

    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec
    from kvcanary_cli.soak.workload import random_workload

    allocator = import_module("sglang.srt.mem_cache.allocator.unified_sub_pool")
    sub = allocator.MultiEndedAllocator
    free_lazy, flush = sub._free_lazy, sub._flush
    holes, moves = [0], [0]

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        holes[0] += 1
        return free_lazy(self, *args, **kwargs)

    def moving(self: Any, **kwargs: Any) -> int:
        moved: int = flush(self, **kwargs)
        moves[0] += moved
        return moved

    monkeypatch.setattr(sub, "_free_lazy", counting)
    monkeypatch.setattr(sub, "_flush", moving)
    workload = random_workload(100, steps=40, requests=10, max_prompt=60, max_new=20)
    spec = StackSpec.pressured(page_size, "python", "unified")
    result = run_history(sglang, spec, replace(workload, lazy_compaction=True))
    assert result.failure is None, (result.failure.step, result.failure.codes)
    assert result.sglang_counts == {}, result.sglang_first
    assert holes[0] > 0 and result.counters.flushes > 0 and moves[0] > 0


@pytest.mark.parametrize("page_size", [1, 4])
def test_tree_page_freed_is_named(sglang: Any, page_size: int) -> None:
    """A tree-held virtual page pushed onto the virtual free list (still bound, the node
    keeping it): named at the next audit with its cause; SGLang's checks are silent there."""
    result = _run(sglang, page_size, 100, 40, fault="tree-page-freed")
    failure = result.failure
    assert failure is not None, "the planted fault was not found"
    assert failure.top_cause == "virtual-page-freed-while-bound", failure.codes
    assert "virtual-page-free-and-bound" in failure.codes
    assert failure.sglang == [] and failure.crash is None
