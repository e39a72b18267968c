"""`soak --hicache` on SGLang 0.5.23: the host tier driven by soak's scheduler loop as SGLang's
scheduler drives it (`check_hicache_events` each step, `ready_to_load_host_cache` on each
prefill batch; backups on insert, load-back at admission and host eviction are the tree's
and the adder's own), the host pools audited each step.

Clean twins: a history of each write policy runs clean with SGLang's checks silent, and
reaches load-backs from host; on the Rust core too (its host values unread: the host checks
that need them do not run). The faults (`soak.faults`) a correct history never shows:
a host eviction that forgets its host frees, a load-back that frees its node's host copy, a
write-through ack that commits its backup twice; each acts and is named, SGLang's own checks
silent.

SGLang 0.5.23's own defect on this stack (docs/soak.md): a load-back's SWA admitted against
SWA the loaded prefix then pins, so the prefill's allocation runs out; the shipped reproducer
replays to SGLang's crash with kvcanary silent, and runs clean where the adder's check is made
with that prefix pinned (its twin: soak's loop is not what crashes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")


def _history(
    modules: Any,
    history: int,
    *,
    core: str = "python",
    page_size: int = 1,
    fault: str | None = None,
    steps: int = 120,
    layout: str = "swa",
) -> tuple[Any, Any]:
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec

    spec = StackSpec.pressured(page_size, core, layout)
    workload = history_workload(0, history, 1, page_size, layout=layout, hicache=True)
    return run_history(modules, spec, workload, fault=fault, max_steps=steps), workload


@pytest.mark.parametrize("history", [0, 1, 2])
def test_each_write_policy_runs_clean_and_loads_back_from_host(modules: Any, history: int) -> None:
    """History by history the three write policies: clean, SGLang silent, prefix hits loaded
    back from host (the pools are small enough that device eviction leaves host-only nodes)."""
    from kvcanary_cli.soak.workload import WRITE_POLICIES

    result, workload = _history(modules, history)
    assert workload.hicache_write_policy == WRITE_POLICIES[history]
    assert result.failure is None, result.failure
    assert result.sglang_step is None, result.sglang_first
    assert result.counters.host_loads > 0
    assert result.fallbacks == 0  # the live audit held on every state: no whole `check`


@pytest.mark.slow
def test_the_rust_core_and_a_larger_page_run_clean(modules: Any) -> None:
    """The Rust core (its nodes' host values unread: the host free lists alone audited) at
    page size 4: clean, and the live audit never falls back to a whole `check`."""
    if "rust" not in modules.cores:
        pytest.skip("this SGLang has no Rust tree core")
    result, _ = _history(modules, 0, core="rust", page_size=4)
    assert result.failure is None and result.sglang_step is None, result.failure
    assert result.fallbacks == 0


@pytest.mark.slow
def test_the_extra_buffer_layout_runs_clean_under_the_host_tier(modules: Any) -> None:
    """The Mamba extra buffer (its ping-pong track slots) under the host tier, at page size 4:
    its host pool is page-first like the Mamba layout's (a layer-first one made SGLang's
    `init_hicache` assert), the history clean and SGLang silent."""
    result, _ = _history(modules, 0, page_size=4, layout="mamba-extra")
    assert result.failure is None, result.failure
    assert result.sglang_step is None, result.sglang_first
    assert result.fallbacks == 0


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ("host-evict-leak", "host-slot-leaked"),
        ("load-back-frees-host", "host-slot-free-and-held"),
        ("backup-twice", "host-slot-leaked"),
    ],
)
def test_a_host_fault_is_named(modules: Any, fault: str, code: str) -> None:
    """Each planted host-tier fault acts and is named in its pool, SGLang's checks silent."""
    result, _ = _history(modules, 0, fault=fault)
    assert result.fault_acted > 0
    failure = result.failure
    assert failure is not None and failure.codes[:1] == [code], failure
    assert result.sglang_step is None


def test_a_host_fault_needs_the_host_tier(modules: Any) -> None:
    """Without `--hicache` a host fault is one error line, never a soak that finds nothing."""
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import SGLangUnavailableError, StackSpec
    from kvcanary_cli.soak.workload import random_workload

    workload = random_workload(0, steps=10, requests=2, max_prompt=8, max_new=2)
    with pytest.raises(SGLangUnavailableError, match="--hicache"):
        run_history(modules, StackSpec.pressured(1, "python"), workload, fault="backup-twice")


def test_the_write_policy_round_trips_a_reproducer() -> None:
    from kvcanary_cli.soak.workload import Workload, random_workload

    workload = random_workload(
        3, steps=10, requests=2, max_prompt=8, max_new=2, hicache_write_policy="write_back"
    )
    assert Workload.from_json(workload.to_json()) == workload
    older = workload.to_json().replace(', "hicache_write_policy": "write_back"', "")
    assert Workload.from_json(older).hicache_write_policy is None
    with pytest.raises(TypeError):
        Workload.from_json(workload.to_json().replace("write_back", "write_sideways"))


#: The shrunk reproducers of SGLang 0.5.23's SWA load-back admission crash (docs/soak.md): the
#: host tier's (seed 0), and the one `--hicache-storage` met at seed 7 (its storage tier runs,
#: and the same admission crashes).
LOAD_BACK_OOM = [
    Path(__file__).resolve().parents[2] / "docs" / "reproducers" / f"sglang-0.5.23-{name}.json"
    for name in ("hicache-swa-load-back-oom", "hicache-storage-load-back-oom")
]


def _load_back_oom(modules: Any, reproducer: Path) -> Any:
    from kvcanary_cli.soak.command import read_reproducer
    from kvcanary_cli.soak.run import run_history

    spec, workload, fault, recorded, release, *_ = read_reproducer(reproducer)
    if modules.tree.version != release:
        pytest.skip(f"the reproducer is SGLang {release}'s; this is {modules.tree.version}")
    assert recorded == "crash RuntimeError"
    return run_history(modules, spec, workload, fault=fault)


@pytest.mark.slow
@pytest.mark.parametrize("reproducer", LOAD_BACK_OOM, ids=lambda path: path.stem)
def test_sglangs_swa_load_back_admission_crash_is_reported_as_sglangs(
    modules: Any, reproducer: Path
) -> None:
    """The reproducer comes back as SGLang's own `Out of memory` in `alloc_token_slots`, after
    a load-back from host; kvcanary and SGLang's checks silent on every state before it."""
    result = _load_back_oom(modules, reproducer)
    failure = result.failure
    assert failure is not None and failure.crash is not None, failure
    assert failure.crash.message.startswith("Out of memory"), failure.crash
    assert "alloc_token_slots" in failure.crash.raised_in
    assert list(failure.codes) == [] and not result.sglang_counts  # silent until the crash
    assert result.counters.host_loads > 0


@pytest.mark.slow
@pytest.mark.parametrize("reproducer", LOAD_BACK_OOM, ids=lambda path: path.stem)
def test_the_same_history_runs_clean_when_the_swa_check_pins_the_loaded_prefix(
    modules: Any, monkeypatch: pytest.MonkeyPatch, reproducer: Path
) -> None:
    """The twin: SGLang's adder, its check made with the host hit's prefix (`best_match_node`)
    already pinned, as the load-back pins it right after: the SWA that prefix holds on the
    device no longer counts as evictable, the admission waits, and the same soak loop runs the
    whole history clean. What crashed is the adder's budget, not soak's loop."""
    adder = modules.schedule_policy.PrefillAdder
    add_one_req = adder.add_one_req

    def pinned_first(self: Any, req: Any, **kwargs: Any) -> Any:
        if not req.needs_host_load_back():
            return add_one_req(self, req, **kwargs)
        with self._lock_node(req.best_match_node):
            return add_one_req(self, req, **kwargs)

    monkeypatch.setattr(adder, "add_one_req", pinned_first)
    result = _load_back_oom(modules, reproducer)
    assert result.failure is None and result.sglang_step is None, result.failure
    assert result.counters.host_loads > 0


def test_the_cpu_timing_probe_is_answered_without_sglangs_warning(
    modules: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """SGLang 0.5.23's L2 transfer probes once a process whether the device's events can time
    a copy, and logs a warning where they cannot: on soak's CPU, every soak's stderr. soak
    answers the probe (no) without the warning, and the transfers go untimed as SGLang's
    own answer would have them."""
    import importlib
    import logging

    from kvcanary_cli.soak.hicache import stand_in_cuda

    l2_transfer = importlib.import_module("sglang.srt.mem_cache.l2_transfer")
    probe = l2_transfer._timing_events_supported
    if hasattr(probe, "cache_clear"):  # SGLang's own, its answer of an earlier test forgotten
        probe.cache_clear()
    stand_in_cuda()
    with caplog.at_level(logging.WARNING):
        _, _, timed = l2_transfer.make_timing_event_pair()
    assert timed is False
    assert not [r for r in caplog.records if "does not support timing" in r.getMessage()]
