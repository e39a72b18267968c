"""The capture hook's live triggers on SGLang 0.5.23's unified-memory stack (real pools, the
`UnifiedSWATokenToKVPoolAllocator`, the tree, SGLang's invariant checker), end to end.

The launcher wrapper (guard and snapshot) is put around a stand-in plan launch that soak's
scheduler calls each step with the batch's plan arguments, as SGLang's canary runner does;
the leak trigger wraps SGLang's own checker. Each dump is read back and checked: correct
states clean, a leak and a tree page pushed onto the free list named. `req_to_token` holds
virtual ids here, minted over a space larger than the full side's physical pool: the hook's
own pool size must be that space, or the guard lets a LUT sized by the physical pool pass.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from kvcanary_cli.capture import launcher, leaks, server, store, triggers
from kvcanary_cli.capture import tree as tree_capture
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.dump.schema import LAYOUT_KEY, Layout
from tests.helpers import checked

torch = pytest.importorskip("torch")


@pytest.fixture
def hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sglang: Any) -> Any:
    """The hook's process state fresh, dumps to `tmp_path/dumps`, SGLang's checker watched
    (every wrapper undone after the test)."""
    dumps = tmp_path / "dumps"
    monkeypatch.setenv("KVCANARY_DUMP_LIMIT", "40")
    monkeypatch.setattr(store, "BUDGET", store.Budget())
    monkeypatch.setattr(triggers, "GUARD", triggers.Guard())
    monkeypatch.setattr(
        triggers, "_SETTINGS", [triggers.Settings(dump_dir=dumps, guard=True, dump_every=6)]
    )
    for name, value in (("_RUNNERS", []), ("_MANAGERS", []), ("_LAST", {}), ("_VERSION", [])):
        monkeypatch.setattr(server, name, value)
    monkeypatch.setattr(server, "_calls", itertools.count())
    monkeypatch.setattr(tree_capture, "_TREES", [])
    module = sglang.invariant_checker
    cls = module.SchedulerInvariantChecker
    monkeypatch.setattr(module, "raise_error_or_warn", module.raise_error_or_warn)
    monkeypatch.setattr(cls, "self_check_during_busy", cls.self_check_during_busy)
    assert leaks.watch_invariant_checker(module)
    return dumps


#: The last runner registered (the hook's registry holds runners weakly).
_HELD: list[Any] = []


class _Runner:
    """What the hook reads of SGLang's model runner (weakly held: a class, not a namespace)."""

    def __init__(self, stack: Any) -> None:
        self.req_to_token_pool = stack.req_to_token_pool
        self.token_to_kv_pool_allocator = stack.allocator


def _scheduler(sglang: Any, page_size: int, seed: int, steps: int) -> Any:
    """Soak's scheduler over a fresh unified stack, its runner and tree registered the way
    the hook registers SGLang's."""
    from kvcanary_cli.soak.driver import Scheduler
    from kvcanary_cli.soak.stack import StackSpec, build_stack
    from kvcanary_cli.soak.workload import random_workload

    stack = build_stack(sglang, StackSpec.pressured(page_size, "python", "unified"))
    workload = random_workload(seed, steps=steps, requests=steps // 4, max_prompt=60, max_new=20)
    scheduler = Scheduler(stack, workload)
    runner = _Runner(stack)
    server.register_model_runner(runner)
    tree_capture.register_tree_cache(stack.tree)
    _HELD[:] = [runner]  # the registry holds it weakly
    return scheduler


def _space(allocator: Any, page_size: int) -> tuple[int, int]:
    """(virtual id space, the physical full pool's rows) in slots."""
    full = allocator.full_attn_allocator
    return int(full.num_virtual_ids) * page_size, int(allocator._size_full) + page_size


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_hooks_pool_size_is_the_virtual_id_space(
    sglang: Any, hook: Path, page_size: int
) -> None:
    """The guard's size is the virtual id space: a LUT sized by the physical pool is named
    short (it was silent: the hook read the physical size), one sized by the ids is not."""
    scheduler = _scheduler(sglang, page_size, 3, 8)
    table = scheduler.stack.req_to_token_pool.req_to_token
    virtual, physical = _space(scheduler.stack.allocator, page_size)
    assert virtual > physical
    assert server.pool_size(table) == virtual

    def lut(entries: int) -> Any:
        return torch.cat([torch.zeros(entries - 1, dtype=torch.int64), torch.tensor([-1])])

    guard = triggers.Guard()
    short = guard.failures(
        {"req_to_token": table, "full_to_swa_index_mapping": lut(physical + 1)}, 0
    )
    assert len(short) == 1 and f"num_full_slots + 1 = {virtual + 1}" in short[0]
    whole = {"req_to_token": table, "full_to_swa_index_mapping": lut(virtual + 1)}
    assert triggers.Guard().failures(whole, 0) == []


def _plan_call(scheduler: Any, batch: Any) -> dict[str, Any]:
    """The plan arguments of `batch` as the canary runner passes them (the live table)."""
    facts = tree_capture.batch_state(batch)
    call: dict[str, Any] = {
        name: torch.from_numpy(facts[name])
        for name in ("req_pool_indices", "prefix_lens", "extend_seq_lens", "out_cache_loc")
        if name in facts
    }
    call["req_to_token"] = scheduler.stack.req_to_token_pool.req_to_token
    call["swa_window_size"] = scheduler.stack.spec.window
    return call


def _drive(scheduler: Any, steps: int, fault: str | None = None) -> None:
    """Run `steps` scheduler steps, each plan launched through the hook's wrapper."""
    from kvcanary_cli.soak.faults import plant

    launch = launcher._wrap(lambda **kwargs: None)  # SGLang's plan launch, stood in
    each_step, undo = plant(fault, scheduler.stack)
    try:
        for _ in range(steps):
            scheduler.step(on_plan=lambda batch: launch(**_plan_call(scheduler, batch)))
            each_step(scheduler.stack, scheduler.step_no)
            if scheduler.done:
                break
    finally:
        undo()


@pytest.mark.parametrize("page_size", [1, 4])
def test_snapshots_of_a_correct_unified_history_record_its_layout_and_check_clean(
    sglang: Any, hook: Path, page_size: int
) -> None:
    scheduler = _scheduler(sglang, page_size, 100, 40)
    _drive(scheduler, 60)
    paths = sorted(hook.glob("*.safetensors"))
    assert len(paths) >= 5
    virtual, physical = _space(scheduler.stack.allocator, page_size)
    beyond = 0
    for path in paths:
        dump = load_dump(path)
        assert dump.metadata["kvcanary.trigger"] == "snapshot"  # the guard never spoke
        assert dump.metadata[LAYOUT_KEY] == Layout.UNIFIED_SWA.value
        assert dump.scalar("num_full_slots") == virtual
        beyond += int((dump.req_to_token.array() >= physical).sum())
        report = checked(dump, kernel="vectorized")
        assert report.findings == (), (path.name, [f.code for f in report.findings])
    assert beyond > 0  # ids past the physical pool were live in what was checked


def test_a_tree_page_pushed_onto_the_free_list_is_named_in_the_next_snapshot(
    sglang: Any, hook: Path
) -> None:
    scheduler = _scheduler(sglang, 4, 100, 40)
    _drive(scheduler, 60, fault="tree-page-freed")
    codes = set()
    for path in sorted(hook.glob("*.safetensors")):
        codes |= {f.code for f in checked(load_dump(path), kernel="vectorized").findings}
    assert FindingCode.VIRTUAL_PAGE_FREE_AND_BOUND in codes, codes


def _checker(scheduler: Any) -> Any:
    from kvcanary_cli.soak.audit import SGLangChecks

    checker = SGLangChecks(scheduler).checker
    assert checker is not None
    return checker


def _idle_check(checker: Any) -> None:
    """What the scheduler runs when idle (`Scheduler.on_idle`, 0.5.23)."""
    has_leak, messages = checker._check_all_pools(checker.pool_stats_observer.get_pool_stats())
    if has_leak:
        checker._report_leak("pool", "\n".join(messages))


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_leak_trigger_on_the_unified_stack(sglang: Any, hook: Path, page_size: int) -> None:
    """A row released without freeing its virtual pages: SGLang's idle check raises, the
    dump it left first names the leak; the clean twin's dump of the same check is clean."""
    scheduler = _scheduler(sglang, page_size, 7, 8)
    checker = _checker(scheduler)
    leaks.capture_leak(checker, "", raised=False)  # the clean twin, same stack
    [clean] = sorted(hook.glob("*.safetensors"))
    assert load_dump(clean).metadata[LAYOUT_KEY] == Layout.UNIFIED_SWA.value
    assert checked(load_dump(clean), kernel="vectorized").findings == ()
    stack = scheduler.stack
    tokens = 3 * page_size
    if page_size == 1:
        slots = stack.allocator.alloc(tokens)
    else:
        zero, length = torch.tensor([0]), torch.tensor([tokens])
        slots = stack.allocator.alloc_extend(zero, zero, length, length, torch.tensor([-1]), tokens)
    pool = stack.req_to_token_pool
    row = pool.free_slots.pop(0)
    pool.write((row, slice(0, tokens)), slots.to(torch.int32))
    pool.free_slots.append(row)
    with pytest.raises(ValueError, match="pool memory leak detected"):
        _idle_check(checker)
    [leaked] = [p for p in sorted(hook.glob("*.safetensors")) if p != clean]
    dump = load_dump(leaked)
    assert dump.metadata["kvcanary.trigger"] == "leak"
    assert dump.metadata[LAYOUT_KEY] == Layout.UNIFIED_SWA.value
    report = checked(dump, kernel="vectorized")
    by_code = {f.code: f for f in report.findings}
    assert FindingCode.FULL_PAGE_LEAKED in by_code, list(by_code)
    cells = by_code[FindingCode.FULL_PAGE_LEAKED].cells
    assert cells is not None and cells.slot is not None
    assert sorted(cells.slot.tolist()) == sorted(slots.tolist())
