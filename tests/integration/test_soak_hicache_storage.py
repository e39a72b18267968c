"""`soak --hicache --hicache-storage` on SGLang 0.5.23: the host tier's storage tier (SGLang's
file backend, in a folder soak makes and removes) driven by soak's loop as SGLang's scheduler
drives it, its four storage threads run in soak's thread each step (`soak.storage`).

Clean twins: a history under each prefetch policy runs clean with SGLang's checks silent and
the live audit holding on every state, while its backups write pages into the folder and its
requests ask storage for their prompts; the folder is gone once the history ends, and no
thread of SGLang's was started.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.slow
@pytest.mark.parametrize("history", [0, 3])
def test_a_history_with_the_storage_tier_runs_clean_and_leaves_no_folder(
    modules: Any, history: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvcanary_cli.soak import run
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.stack import Stack, StackSpec
    from kvcanary_cli.soak.workload import PREFETCH_POLICIES

    stacks: list[Any] = []
    pages: list[int] = []
    built = run.history_stack
    close = Stack.close

    def kept(*args: Any, **kwargs: Any) -> Any:
        stacks.append(built(*args, **kwargs))
        return stacks[-1]

    def counted(stack: Any) -> None:
        if stack.storage is not None:
            pages.append(len(list(Path(stack.storage.folder.name).glob("*.bin"))))
        close(stack)

    monkeypatch.setattr(run, "history_stack", kept)
    monkeypatch.setattr(Stack, "close", counted)
    before = threading.active_count()
    spec = StackSpec.pressured(1, "python")
    workload = history_workload(0, history, 1, 1, hicache=True, storage=True)
    assert workload.hicache_storage == PREFETCH_POLICIES[history // 3]
    result = run.run_history(modules, spec, workload, max_steps=80)
    assert result.failure is None, result.failure
    assert result.sglang_step is None, result.sglang_first
    assert result.fallbacks == 0
    (stack,) = stacks
    assert stack.tree.enable_storage
    assert stack.storage.pump.runs.get("backup_thread", 0) > 0
    assert result.counters.storage_asks > 0
    assert pages and pages[0] > 0  # backups reached the folder
    assert not Path(stack.storage.folder.name).exists()
    assert threading.active_count() == before


def test_the_storage_tier_under_the_overlapped_loop_runs_clean(modules: Any) -> None:
    """Under SGLang's overlapped loop (`--overlap`) the storage tier's calls come at the points
    of a step they come at without it (a request's prefetch as it arrives, its progress asked
    as a prefill is chosen, the backups after the host tier's acks), the last batch's result
    still queued: a history asks storage, loads from it and runs clean."""
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec

    workload = history_workload(0, 3, 1, 1, hicache=True, storage=True, overlap=True)
    result = run_history(modules, StackSpec.pressured(1, "python"), workload, max_steps=80)
    assert result.failure is None, result.failure
    assert result.sglang_step is None, result.sglang_first
    counters = result.counters
    assert counters.overlapped > 0 and counters.finishing_inflight > 0
    assert counters.storage_asks > 0 and counters.storage_loads > 0


@pytest.mark.slow
def test_a_storage_ack_that_frees_its_nodes_host_copy_is_named(modules: Any) -> None:
    """The fault (`storage-ack-frees-host`): a backup's ack to storage frees the host pages
    the node keeps; kvcanary names the slot free and held, SGLang's own checks silent. Its
    clean twin is the test above (the same history, no fault)."""
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec

    workload = history_workload(0, 0, 1, 1, hicache=True, storage=True)
    result = run_history(
        modules, StackSpec.pressured(1, "python"), workload, fault="storage-ack-frees-host"
    )
    assert result.failure is not None
    assert "host-slot-free-and-held" in result.failure.codes
    assert result.fault_acted > 0
    assert result.sglang_step is None


#: The shrunk reproducer of SGLang 0.5.23's storage prefetch on a streaming session's turn
#: (docs/soak.md, The storage tier).
VIRTUAL_NODE = (
    Path(__file__).resolve().parents[2]
    / "docs"
    / "reproducers"
    / "sglang-0.5.23-storage-streaming-virtual-node.json"
)


def _virtual_node_history(modules: Any) -> Any:
    from kvcanary_cli.soak.command import read_reproducer
    from kvcanary_cli.soak.run import run_history

    spec, workload, fault, recorded, release, *_ = read_reproducer(VIRTUAL_NODE)
    if modules.tree.version != release:
        pytest.skip(f"the reproducer is SGLang {release}'s; this is {modules.tree.version}")
    assert recorded == "crash KeyError" and workload.streaming_sessions
    assert workload.hicache_storage is not None
    return run_history(modules, spec, workload, fault=fault)


@pytest.mark.slow
def test_a_streaming_sessions_turn_asking_storage_crashes_sglangs_tree(modules: Any) -> None:
    """A streaming session's later turn enters the waiting queue; asking storage for its prompt
    (the scheduler's `_prefetch_kvcache`) matches it first, and the session's match answers
    with the session's stand-in node (`_VirtualNode`), which the tree's `is_backuped` looks up
    among its nodes: SGLang's own `KeyError`, kvcanary silent on every state before it."""
    result = _virtual_node_history(modules)
    crash = result.failure.crash if result.failure is not None else None
    assert crash is not None and crash.exception == "KeyError", result.failure
    assert crash.raised_in is not None and crash.raised_in.endswith("in is_backuped")
    assert "_VirtualNode" in crash.message
    assert list(result.failure.codes) == [] and not result.sglang_counts


@pytest.mark.slow
def test_the_same_history_runs_clean_when_a_sessions_node_is_not_on_the_host(
    modules: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The twin: the tree answers that a session's stand-in node is neither backed up to host
    nor its root (the session's KV lives on the device, so storage has nothing to add), and
    the same history, storage tier and streaming sessions both running, is clean."""
    import importlib

    virtual = importlib.import_module("sglang.srt.session.streaming_session")._VirtualNode
    tree = importlib.import_module("sglang.srt.mem_cache.unified_radix_cache").UnifiedRadixCache
    backuped, root = tree.is_backuped, tree.is_root
    monkeypatch.setattr(
        tree,
        "is_backuped",
        lambda self, node: not isinstance(node, virtual) and backuped(self, node),
    )
    monkeypatch.setattr(
        tree, "is_root", lambda self, node: not isinstance(node, virtual) and root(self, node)
    )
    result = _virtual_node_history(modules)
    assert result.failure is None and result.sglang_step is None, result.failure
    assert result.counters.storage_asks > 0


@pytest.mark.slow
def test_a_return_to_an_evicted_stem_is_admitted_with_tokens_read_from_storage(
    modules: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 0's fourth history (`write_through`, `wait_complete`): a request that comes back
    late to an early prompt is admitted with at least the prefetch threshold of it read from
    storage. Storage is asked only for what follows the request's host match, so what it
    loaded had left the device and the host. Without returns no request of it loads any."""
    from kvcanary_cli.soak import run, storage
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.stack import StackSpec

    reads: list[tuple[tuple[int, ...], int]] = []
    real = storage.wait_for_prefetch

    def counted(tree: Any, req: Any) -> tuple[bool, int]:
        ready, tokens = real(tree, req)
        if ready and tokens:
            reads.append((tuple(req.origin_input_ids), tokens))
        return ready, tokens

    monkeypatch.setattr(storage, "wait_for_prefetch", counted)
    workload = history_workload(0, 3, 1, 1, hicache=True, storage=True)
    assert (workload.hicache_write_policy, workload.hicache_storage) == (
        "write_through",
        "wait_complete",
    )
    last = workload.steps * 3 // 4
    back = {a.prompt for a in workload.arrivals if a.step >= last}
    result = run.run_history(modules, StackSpec.pressured(1, "python"), workload, max_steps=80)
    assert result.failure is None, result.failure
    assert result.sglang_step is None, result.sglang_first
    assert any(
        prompt in back and tokens >= storage.PREFETCH_THRESHOLD for prompt, tokens in reads
    ), reads
    reads.clear()
    kept = tuple(a for a in workload.arrivals if a.step < last)
    result = run.run_history(
        modules, StackSpec.pressured(1, "python"), replace(workload, arrivals=kept), max_steps=80
    )
    assert result.failure is None and not reads, reads
