"""The capture hook's live triggers around soak's scheduler on SGLang's real stack: the hook
armed as a server arms it, the stack's model runner and tree registered as the hook registers
SGLang's, and each step's plan launched through the launcher wrapper (guard and snapshot)
with the batch's plan arguments, as SGLang's canary runner launches it."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kvcanary_cli.capture import launcher, leaks, server, store, triggers
from kvcanary_cli.capture import tree as tree_capture

__all__ = ["arm_hook", "drive", "live_scheduler", "loaded", "plan_call"]


@contextmanager
def loaded(modules: Any) -> Iterator[Any]:
    """SGLang's modules with their package in `sys.modules` (SGLang imports inside its own
    functions): the session's load while it is still there, else a fresh load for the
    duration (a test that stood in for `sglang`, or forgot it, dropped it), forgotten after
    so the process is left as it was found."""
    reinstate = getattr(modules, "reinstate", None)  # a load that can put its modules back
    if callable(reinstate):
        reinstate()
    if sys.modules.get(modules.memory_pool.__name__) is modules.memory_pool:
        yield modules
        return
    from kvcanary_cli.soak import stack
    from tests.sglang_standin import forget_sglang
    from tests.sglang_wheel import wheel_path

    with pytest.MonkeyPatch.context() as patch:
        forget_sglang()
        patch.setattr(stack, "_LOADED", {})
        try:
            yield stack.load_sglang(wheel_path())
        finally:
            forget_sglang()


#: The runners registered last (the hook's registry holds runners weakly).
_HELD: list[Any] = []


def arm_hook(
    monkeypatch: pytest.MonkeyPatch,
    sglang: Any,
    dumps: Path,
    *,
    rank: int | None = None,
    dump_every: int = 6,
) -> Path:
    """The hook's process state fresh (every wrapper undone after the test), dumps to
    `dumps`, the guard on, a snapshot every `dump_every` launches, SGLang's checker watched."""
    monkeypatch.setenv("KVCANARY_DUMP_LIMIT", "40")
    monkeypatch.setattr(store, "BUDGET", store.Budget())
    monkeypatch.setattr(triggers, "GUARD", triggers.Guard())
    settings = triggers.Settings(dump_dir=dumps, rank=rank, guard=True, dump_every=dump_every)
    monkeypatch.setattr(triggers, "_SETTINGS", [settings])
    for name, value in (("_RUNNERS", []), ("_MANAGERS", []), ("_LAST", {}), ("_VERSION", [])):
        monkeypatch.setattr(server, name, value)
    monkeypatch.setattr(server, "_calls", itertools.count())
    monkeypatch.setattr(tree_capture, "_TREES", [])
    module = sglang.invariant_checker
    cls = module.SchedulerInvariantChecker
    monkeypatch.setattr(module, "raise_error_or_warn", module.raise_error_or_warn)
    monkeypatch.setattr(cls, "self_check_during_busy", cls.self_check_during_busy)
    assert leaks.watch_invariant_checker(module)
    _HELD.clear()
    return dumps


class _Runner:
    """What the hook reads of SGLang's model runner (weakly held: a class, not a namespace)."""

    def __init__(self, stack: Any) -> None:
        self.req_to_token_pool = stack.req_to_token_pool
        self.token_to_kv_pool_allocator = stack.allocator


def live_scheduler(
    sglang: Any, page_size: int, seed: int, steps: int, *, layout: str = "swa"
) -> Any:
    """Soak's scheduler over a fresh stack of `layout`, registered with the hook."""
    from kvcanary_cli.soak.driver import Scheduler
    from kvcanary_cli.soak.stack import StackSpec, build_stack
    from kvcanary_cli.soak.workload import random_workload

    stack = build_stack(sglang, StackSpec.pressured(page_size, "python", layout))
    workload = random_workload(seed, steps=steps, requests=steps // 4, max_prompt=60, max_new=20)
    scheduler = Scheduler(stack, workload)
    runner = _Runner(stack)
    server.register_model_runner(runner)
    tree_capture.register_tree_cache(stack.tree)
    _HELD.append(runner)
    return scheduler


def plan_call(scheduler: Any, batch: Any) -> dict[str, Any]:
    """The plan arguments of `batch` as the canary runner passes them (the live table)."""
    import torch

    facts = tree_capture.batch_state(batch)
    call: dict[str, Any] = {
        name: torch.from_numpy(facts[name])
        for name in ("req_pool_indices", "prefix_lens", "extend_seq_lens", "out_cache_loc")
        if name in facts
    }
    call["req_to_token"] = scheduler.stack.req_to_token_pool.req_to_token
    call["swa_window_size"] = scheduler.stack.spec.window
    return call


def drive(scheduler: Any, steps: int, fault: str | None = None) -> None:
    """Run up to `steps` scheduler steps, each plan launched through the hook's wrapper."""
    from kvcanary_cli.soak.faults import plant

    launch = launcher._wrap(lambda **kwargs: None)  # SGLang's plan launch, stood in
    each_step, undo = plant(fault, scheduler.stack)
    try:
        for _ in range(steps):
            scheduler.step(on_plan=lambda batch: launch(**plan_call(scheduler, batch)))
            each_step(scheduler.stack, scheduler.step_no)
            if scheduler.done:
                break
    finally:
        undo()
