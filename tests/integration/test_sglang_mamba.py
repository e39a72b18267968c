"""SGLang 0.5.23's hybrid Mamba layout (`HybridReqToTokenPool` with its `MambaPool` and
`MambaSlotAllocator`, `UnifiedRadixCache(FULL, MAMBA)`) on CPU, driven by kvcanary's soak
scheduler: kvcanary's capture records each audited state from the real objects (the row map,
the Mamba free list, the tree's and every live request's Mamba slots, waiting requests'
copy-on-write slots included), a correct state checks clean with SGLang's own checks silent,
and a tree-held Mamba slot pushed onto the free list is named at the next audit, while SGLang's
busy check, which has no Mamba check, says nothing. The soak's own Mamba histories retract and
abort in chunked prefill, so a lock leaked there is found; a request the adder turns down gives
back the copy-on-write slot its prefix match took, as SGLang's scheduler does. Capped by
`--mamba-max-states-per-path`, a history evicts Mamba states from nodes that stay in the tree,
clean, and a state freed but kept by its node is named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvcanary_cli.results.check import DumpReport

torch = pytest.importorskip("torch")


def _run(
    sglang: Any,
    seed: int,
    steps: int,
    *,
    requests: int | None = None,
    max_new: int = 20,
    aborts: float = 0.0,
    within: int | None = None,
    **kw: Any,
) -> Any:
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec
    from kvcanary_cli.soak.workload import random_workload

    workload = random_workload(
        seed,
        steps=steps,
        requests=requests or steps // 4,
        max_prompt=60,
        max_new=max_new,
        aborts=aborts,
        abort_within=within,
    )
    return run_history(sglang, StackSpec.pressured(1, "python", "mamba"), workload, **kw)


def test_clean_mamba_history(sglang: Any) -> None:
    """Every audited state of a correct history: the live accounting and the whole `check` of
    its recorded dump agree that it is clean, and SGLang's checks are silent."""
    result = _run(sglang, 100, 40, mode="both")
    assert result.failure is None, (result.failure.step, result.failure.codes)
    assert result.sglang_counts == {}, result.sglang_first
    assert result.verdicts and all(v.broken is None and not v.codes for v in result.verdicts)
    assert result.counters.finishes > 0 and result.counters.decodes > 0


def test_capture_records_the_mamba_layout(sglang: Any, tmp_path: Path) -> None:
    """The dump capture writes from the real objects names the layout and carries the Mamba
    records, so both Mamba families run on it (and the SWA ones do not apply)."""
    from kvcanary_cli.api import check

    result = _run(sglang, 100, 20, folder=tmp_path)
    assert result.failure is None
    report = check([tmp_path / "state.safetensors"], kernel="none").dumps[0]
    assert isinstance(report, DumpReport) and report.error is None and report.findings == ()
    status = {c.check: c.status for c in report.coverage}
    assert status["Mamba slots"] == status["Mamba slot leaks"] == "ran", status
    assert status["SWA LUT"] == "not-applicable"


def test_tree_mamba_slot_freed_is_named(sglang: Any) -> None:
    """A Mamba slot the tree holds pushed onto the Mamba free list (the node keeping it):
    named at the next audit with its cause in SGLang's words; SGLang's checks silent there."""
    result = _run(sglang, 100, 40, fault="tree-mamba-slot-freed")
    failure = result.failure
    assert failure is not None, "the planted fault was not found"
    assert failure.codes == ["mamba-slot-free-and-held"], failure.codes
    assert failure.top_cause == "mamba-slot-freed-while-held"
    assert failure.mode == "plan" and failure.sglang == [] and failure.crash is None


def _soak_history(sglang: Any, history: int, *, path_cap: bool = False, **kw: Any) -> Any:
    """The `history`-th history of `soak --layout mamba --core python --seed 0` (`path_cap`:
    on a release with `--mamba-max-states-per-path`; without: as on one before it)."""
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec

    workload = history_workload(0, history, 1, layout="mamba", path_cap=path_cap)
    return run_history(sglang, StackSpec.pressured(1, "python", "mamba"), workload, **kw)


@pytest.mark.parametrize(
    ("history", "event"), [(25, "aborts_chunked"), (11, "retractions")], ids=["chunk", "retract"]
)
def test_soak_history_leaks_a_lock_where_it_releases_without_caching(
    sglang: Any, history: int, event: str
) -> None:
    """A request released without caching (an abort in chunked prefill; a decode
    retraction): the soak's Mamba workload reaches both, so `lock-leak` acts and kvcanary
    names the leaked lock; the same history without the fault is clean, SGLang silent."""
    leaked = _soak_history(sglang, history, fault="lock-leak")
    assert leaked.fault_acted > 0, "the fault never acted"
    assert leaked.failure is not None and leaked.failure.codes == ["tree-lock-leaked"]
    clean = _soak_history(sglang, history, max_steps=leaked.steps + 1)
    assert getattr(clean.counters, event) > 0, clean.counters
    assert clean.failure is None and clean.sglang_counts == {}


def test_a_chunk_checkpoint_lands_on_a_node_holding_a_state(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The soak's first Mamba history: a warm-up finishes in the prefill where the next
    request's first chunk ends, so that chunk's checkpoint finds its node already holding a
    Mamba state (`mamba_exist`: SGLang frees the copy the tree did not take); clean, SGLang
    silent. Without warm-ups no chunk's checkpoint met one."""
    from importlib import import_module

    component = import_module("sglang.srt.mem_cache.unified_cache.components.mamba")
    cleanup = component.MambaComponent.cleanup_after_caching_req
    found: list[str] = []

    def counting(
        self: Any,
        req: Any,
        is_finished: bool,
        insert_result: Any = None,
        insert_params: Any = None,
    ) -> Any:
        if not is_finished and insert_result is not None and insert_result.mamba_exist:
            found.append(req.rid)
        return cleanup(self, req, is_finished, insert_result, insert_params)

    monkeypatch.setattr(component.MambaComponent, "cleanup_after_caching_req", counting)
    result = _soak_history(sglang, 0, max_steps=4)
    assert found, "no chunk checkpoint found its node holding a state"
    assert result.failure is None and result.sglang_counts == {}


def test_a_capped_path_evicts_a_state_whose_node_stays_and_stays_clean(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The soak's first Mamba history where the release has `--mamba-max-states-per-path`:
    published on the server args, the tree's Mamba component takes the cap, drops the state
    of a path's shallow node past it and keeps the node in the tree (an uncapped history's
    evicted states leave with their node); clean to the live audit, which never falls back,
    and to `check` of each state's dump, SGLang silent."""
    from importlib import import_module

    from kvcanary_cli.soak.command import MAMBA_PATH_CAP

    component = import_module("sglang.srt.mem_cache.unified_cache.components.mamba")
    evict = component.MambaComponent.evict_component
    evicted: list[Any] = []
    caps: set[int] = set()

    def recording(self: Any, node: Any, *args: Any, **kw: Any) -> Any:
        caps.add(self.mamba_max_states_per_path)
        held = node.component_data[self.component_type].value is not None
        out = evict(self, node, *args, **kw)
        if held and node.component_data[self.component_type].value is None:
            evicted.append(node)
        return out

    def in_tree(node: Any) -> bool:
        while node.parent is not None:
            if all(child is not node for child in node.parent.children.values()):
                return False
            node = node.parent
        return True

    monkeypatch.setattr(component.MambaComponent, "evict_component", recording)
    result = _soak_history(sglang, 0, path_cap=True, max_steps=10, mode="both")
    assert caps == {MAMBA_PATH_CAP}
    assert any(in_tree(node) for node in evicted), f"{len(evicted)} evicted, none stayed"
    assert result.failure is None and result.sglang_counts == {} and result.fallbacks == 0
    assert result.verdicts and all(v.broken is None and not v.codes for v in result.verdicts)


def test_a_state_a_capped_path_frees_but_its_node_keeps_is_named(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The twin of the clean capped history: an eviction that frees a node's Mamba slot but
    leaves it on the node (bench/mutants.py's `mamba-evict-keeps-value`). Uncapped, every
    evicted state left with its node and the bug went unseen; capped, the node stays holding
    a free slot and kvcanary names it at the next audit."""
    from importlib import import_module

    component = import_module("sglang.srt.mem_cache.unified_cache.components.mamba")
    evict = component.MambaComponent.evict_component

    def keeping(self: Any, node: Any, *args: Any, **kw: Any) -> Any:
        held = node.component_data[self.component_type].value
        out = evict(self, node, *args, **kw)
        if held is not None:
            node.component_data[self.component_type].value = held
        return out

    monkeypatch.setattr(component.MambaComponent, "evict_component", keeping)
    result = _soak_history(sglang, 0, path_cap=True, max_steps=10)
    assert result.failure is not None, "the kept state was not found"
    assert "mamba-slot-free-and-held" in result.failure.codes, result.failure.codes


def test_a_request_turned_down_gives_back_its_copy_on_write_slot(sglang: Any) -> None:
    """A waiting request whose prefix match took a copy-on-write Mamba slot and which the
    adder then turns down gives the slot back in that round, as SGLang's scheduler does
    (`get_new_batch_prefill`): between steps no waiting request holds a Mamba slot, and
    aborts while waiting leak nothing."""
    from kvcanary_cli.soak.calls import holds_mamba
    from kvcanary_cli.soak.driver import Scheduler
    from kvcanary_cli.soak.stack import StackSpec, build_stack
    from kvcanary_cli.soak.workload import random_workload

    workload = random_workload(
        9, steps=40, requests=16, max_prompt=60, max_new=40, aborts=0.5, abort_within=6
    )
    scheduler = Scheduler(build_stack(sglang, StackSpec.pressured(1, "python", "mamba")), workload)
    holding = []
    while scheduler.step_no < 30:
        scheduler.step()
        holding += [(scheduler.step_no, r.rid) for r in scheduler.waiting if holds_mamba(r)]
    assert holding == []
    assert scheduler.counters.aborts_waiting > 0 and scheduler.counters.extends > 0
    result = _run(sglang, 9, 40, max_steps=30, requests=16, max_new=40, aborts=0.5, within=6)
    assert result.failure is None, (result.failure.step, result.failure.codes)


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ("double-free-group-end", "free-list-duplicate"),
        ("tree-page-freed", "full-slot-free-and-held"),
    ],
)
def test_full_side_faults_act_in_the_mamba_layout(sglang: Any, fault: str, code: str) -> None:
    """The full-attention faults act on the Mamba layout's one token allocator (it has no
    `full_attn_allocator` side) and kvcanary names them."""
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec

    workload = history_workload(0, 6, 2, layout="mamba")
    result = run_history(sglang, StackSpec.pressured(1, "rust", "mamba"), workload, fault=fault)
    assert result.fault_acted > 0 and result.failure is not None
    assert code in result.failure.codes, result.failure.codes


def test_unmapped_representative_is_refused_in_the_mamba_layout(sglang: Any) -> None:
    """The fault frees a tree node's SWA pairs: the Mamba layout has none, so one line says
    so (before: a line saying SGLang's objects differ from soak's)."""
    from kvcanary_cli.soak.stack import SGLangUnavailableError

    with pytest.raises(SGLangUnavailableError, match="no SWA side"):
        _run(sglang, 100, 8, fault="unmapped-representative")


def test_a_session_turn_waits_for_the_turn_before_and_continues_it(sglang: Any) -> None:
    """A session's later turn is made once the turn before it finished, by SGLang's
    `Session.create_req`: its request carries the session and its prompt is that turn's
    prompt and output, then its own tokens; a request of no session carries none."""
    from kvcanary_cli.soak.driver import Scheduler
    from kvcanary_cli.soak.stack import StackSpec, build_stack
    from kvcanary_cli.soak.workload import Arrival, Workload

    first, second = Arrival(0, (1, 2, 3, 4, 5), 3, session=0), Arrival(1, (9, 9), 2, session=0)
    workload = Workload(3, (first, Arrival(0, (7, 7, 7), 2), second), 10, ignore_eos=False)
    scheduler = Scheduler(build_stack(sglang, StackSpec.pressured(1, "python", "mamba")), workload)
    made: dict[str, Any] = {}
    while not scheduler.done:
        scheduler.step()
        made.update({r.rid: (r, scheduler.step_no) for r in scheduler.waiting})
        made.update({r.rid: (r, scheduler.step_no) for r in scheduler.running.reqs})
    (one, _), (plain, _), (two, at) = (made[f"soak-{i}"] for i in (1, 2, 3))
    assert one.session is two.session and not one.session.streaming and plain.session is None
    assert one.finished() and at > 2, "the later turn came before the first one finished"
    assert list(two.origin_input_ids) == [1, 2, 3, 4, 5, *one.output_ids, 9, 9]


def test_a_session_turn_aborted_while_waiting_gives_back_the_slot_it_kept(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's request the adder turns down keeps its copy-on-write Mamba slot while it
    waits (SGLang frees any other's in that round), so the client's abort then releases it
    through `release_kv_cache` holding no KV: the early branch no other request reaches.
    The soak's Mamba history 8 reaches it at step 15, clean, SGLang silent; with the branch
    dropping the slot unfreed (bench/mutants.py's `mamba-early-release-keeps-slot`),
    kvcanary names the leak there."""
    from importlib import import_module

    from kvcanary_cli.capture.tree import kv_record
    from kvcanary_cli.soak.calls import holds_mamba

    common = import_module("sglang.srt.mem_cache.common")
    release = common.release_kv_cache
    early: list[Any] = []

    def counting(req: Any, tree_cache: Any, **kw: Any) -> Any:
        if kv_record(req).req_pool_idx is None and holds_mamba(req):
            early.append(req)
        return release(req, tree_cache, **kw)

    monkeypatch.setattr(common, "release_kv_cache", counting)
    clean = _soak_history(sglang, 8, max_steps=20)
    assert early and all(req.session is not None for req in early), "the branch was not reached"
    assert clean.failure is None and clean.sglang_counts == {}

    def dropping(req: Any, tree_cache: Any, **kw: Any) -> Any:
        if kv_record(req).req_pool_idx is None and holds_mamba(req):
            kv_record(req).mamba_pool_idx = None
            return None
        return release(req, tree_cache, **kw)

    monkeypatch.setattr(common, "release_kv_cache", dropping)
    leaked = _soak_history(sglang, 8, max_steps=20)
    assert leaked.failure is not None, "the dropped slot was not found"
    assert "mamba-slot-leaked" in leaked.failure.codes, leaked.failure.codes
