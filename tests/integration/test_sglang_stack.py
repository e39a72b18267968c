"""SGLang 0.5.23's real memory-cache stack on CPU (pools, SWA allocator, UnifiedRadixCache with
either core), driven by kvcanary's soak scheduler; every audited state is recorded by
kvcanary's own capture code (capture.tree) and checked clean by kvcanary, with SGLang's own
checks silent on the same steps. Planted faults are named first, their clean twins silent.

Imported once per session (about 10-20 s); skipped without the wheel or its import-time
dependencies (`pip install -e '.[test]'` installs them).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from kvcanary_cli.results.check import DumpReport
from tests.lanes import DEEP
from tests.sglang_wheel import WHEEL_VERSION, wheel_path

torch = pytest.importorskip("torch")


def _spec(page_size: int, core: str) -> Any:
    from kvcanary_cli.soak.stack import StackSpec

    return StackSpec.pressured(page_size, core)


def _run(sglang: Any, page_size: int, core: str, seed: int, steps: int, **kw: Any) -> Any:
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.workload import random_workload

    if core not in sglang.cores:
        pytest.skip(f"no {core} tree core in this SGLang")
    workload = random_workload(seed, steps=steps, requests=steps // 4, max_prompt=60, max_new=20)
    return run_history(sglang, _spec(page_size, core), workload, **kw)


CASES = [(ps, core) for ps in (1, 4, 16) for core in ("python", "rust")]


def _assert_clean(result: Any) -> None:
    assert result.failure is None, (result.failure.codes, result.failure.sglang)
    assert result.sglang_counts == {}, result.sglang_first
    assert result.audited >= result.steps // 2  # plan-time and idle audits happened


def test_a_stack_runs_after_sglang_was_unloaded(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Something in the process dropped every `sglang` module (a test's stand-in, a caller's
    unload): SGLang's imports inside its own functions still resolve to the loaded tree."""
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    _assert_clean(_run(sglang, 1, "python", 7, 12))


def test_a_stack_builds_after_sglang_was_unloaded(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same, for a stack built outside a history (soak's `--coverage` builds one per
    shape to list its free paths): the runtime context SGLang publishes into imports more of
    the tree as it runs."""
    from kvcanary_cli.soak.stack import build_stack

    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    stack = build_stack(sglang, _spec(4, "python"))
    assert stack.tree is not None and stack.allocator is not None


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("page_size", "core"), CASES)
def test_clean_histories(sglang: Any, page_size: int, core: str, seed: int) -> None:
    """24 short histories: chunked prefills, decodes, finishes, window frees."""
    result = _run(sglang, page_size, core, 100 + seed, 40)
    _assert_clean(result)
    assert result.counters.extends > 0 and result.counters.decodes > 0
    assert result.counters.finishes > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "seed", [seed if seed < 4 else pytest.param(seed, marks=DEEP) for seed in range(34)]
)
@pytest.mark.parametrize(("page_size", "core"), CASES)
def test_clean_histories_slow(sglang: Any, page_size: int, core: str, seed: int) -> None:
    """204 longer histories (24 in the suite, the rest in the deep lane): pressure brings
    retractions, eviction and tombstones. kvcanary audits random plan calls (one in five,
    seeded) and every idle state, SGLang's checks run on every step: auditing every step
    quadruples the suite's time here and finds nothing more (the short histories and the
    bench audit every step)."""
    picks = random.Random(seed)
    result = _run(
        sglang, page_size, core, 1000 + seed, 100, audit=lambda step: picks.random() < 0.2
    )
    assert result.failure is None, (result.failure.codes, result.failure.sglang)
    assert result.sglang_counts == {}, result.sglang_first
    assert result.audited >= result.steps // 10


def test_pressure_reaches_retraction_and_tree_reuse(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workload really reaches what it is for: shared prefixes, retractions, and tombstone
    recovery (an insert bringing SWA back to a tombstoned node), with every audit clean."""
    from importlib import import_module

    component = import_module("sglang.srt.mem_cache.unified_cache.components.swa").SWAComponent
    original = component._recover_from_incoming
    recovered = [0]

    def counting(self: Any, **kwargs: Any) -> Any:
        recovered[0] += 1
        return original(self, **kwargs)

    monkeypatch.setattr(component, "_recover_from_incoming", counting)
    retracted = shared = 0
    for seed in range(6):
        result = _run(sglang, 1, "python", 500 + seed, 100, audit=lambda step: step % 10 == 0)
        assert result.failure is None and result.sglang_counts == {}
        retracted += result.counters.retractions
        shared += result.counters.shared_prefix_tokens
    assert shared > 0
    assert retracted > 0
    assert recovered[0] > 0


@pytest.mark.parametrize(("page_size", "core"), [(1, "python"), (4, "rust")])
def test_sorted_free_lists_are_merged_and_audited_clean(
    sglang: Any, monkeypatch: pytest.MonkeyPatch, page_size: int, core: str
) -> None:
    """A need_sort history (the allocators as prefill-decode disaggregation builds them):
    freed slots wait staged until an allocation runs short and SGLang merges them back sorted;
    kvcanary counts the staged ones free (no finding) and SGLang's checks stay silent."""
    from dataclasses import replace
    from importlib import import_module

    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.workload import random_workload

    if core not in sglang.cores:
        pytest.skip(f"no {core} tree core in this SGLang")
    name = "token.TokenToKVPoolAllocator" if page_size == 1 else "paged.PagedTokenToKVPoolAllocator"
    module, _, cls = name.rpartition(".")
    side = getattr(import_module(f"sglang.srt.mem_cache.allocator.{module}"), cls)
    original = side.merge_and_sort_free
    merged = [0]

    def counting(self: Any) -> Any:
        staged = self.release_pages if page_size == 1 else self.staged_pages
        merged[0] += len(staged) > 0
        return original(self)

    monkeypatch.setattr(side, "merge_and_sort_free", counting)
    workload = random_workload(11, steps=60, requests=15, max_prompt=60, max_new=20)
    result = run_history(sglang, _spec(page_size, core), replace(workload, need_sort=True))
    _assert_clean(result)
    assert merged[0] > 0


def test_capture_records_tree_and_rows(sglang: Any, tmp_path: Path) -> None:
    """capture.tree records the tree's slots (tombstoned ones too) and the running rows: the
    tree's SWA-resident part is inside what it holds, and SGLang's evictable counts agree."""
    import numpy as np

    from kvcanary_cli.capture.tree import capture_state
    from kvcanary_cli.soak.driver import Scheduler
    from kvcanary_cli.soak.stack import build_stack
    from kvcanary_cli.soak.workload import random_workload

    stack = build_stack(sglang, _spec(4, "python"))
    scheduler = Scheduler(
        stack, random_workload(7, steps=60, requests=15, max_prompt=60, max_new=20)
    )
    for _ in range(30):
        scheduler.step()
    reqs = list(scheduler.running.reqs)
    tensors, metadata = capture_state(
        req_to_token_pool=stack.req_to_token_pool,
        allocator=stack.allocator,
        tree=stack.tree,
        requests=reqs,
        window=16,
    )
    tree = tensors["tree_full_slots"]
    resident = tensors["tree_swa_resident_slots"]
    assert tree.size == int(stack.tree.full_evictable_size() + stack.tree.full_protected_size())
    assert np.isin(resident, tree).all()
    lens = tensors["req_pool_allocated_lens"]
    assert lens.sum() == sum(r.kv.kv_allocated_len for r in reqs)
    locked = tensors["tree_locked_full_slots"]  # the locked part: what SGLang counts protected
    assert locked.size == int(stack.tree.full_protected_size()) > 0 and np.isin(locked, tree).all()
    assert metadata["page_size"] == "4" and metadata["forward_mode"] == "idle"


def _first(result: Any) -> tuple[str | None, list[str]]:
    assert result.fault_acted > 0, "the planted fault never acted"
    assert result.failure is not None, "the planted fault was not found"
    return result.failure.top_cause, result.failure.codes


@pytest.mark.parametrize("page_size", [1, 4])
def test_unmapped_representative_named_first(sglang: Any, page_size: int) -> None:
    """PR #38519: a tree node's SWA pairs freed while it keeps its SWA value, then an SWA
    eviction: the reserved page lands on the SWA free list."""
    result = _run(sglang, page_size, "python", 3, 60, fault="unmapped-representative")
    cause, codes = _first(result)
    assert cause == "reserved-slot-freed", codes
    assert codes[0] == "reserved-slot-in-use"
    # SGLang's own checks are wired to the same steps: here they see a leak (counts only)
    assert any("SWA Pool Mem Leak" in said.message for said in result.failure.sglang)


def test_unmapped_representative_after_page_zero_is_reused(sglang: Any) -> None:
    """PR #38519 seen late: audits start at step 12, after SGLang handed SWA slots 1-3 of the
    reserved page 0 to live pages (page size 4): still named as the reserved page, not only as
    swa-shared-owner (it was, while only slot 0 was reserved)."""
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.workload import random_workload

    workload = random_workload(3, steps=60, requests=15, max_prompt=60, max_new=20)
    result = run_history(
        sglang,
        _spec(4, "python"),
        workload,
        fault="unmapped-representative",
        audit=lambda step: step >= 12,
    )
    cause, codes = _first(result)
    assert cause == "reserved-slot-freed", codes


@pytest.mark.parametrize("page_size", [1, 4])
def test_double_free_group_end_named_first(sglang: Any, page_size: int) -> None:
    """A free group flushed twice: its full slots go on the free list again (seen right
    after the result, before an allocation hands a slot out twice)."""
    result = _run(sglang, page_size, "python", 3, 80, fault="double-free-group-end")
    cause, codes = _first(result)
    assert cause == "double-free", codes
    assert codes[0] == "free-list-duplicate"
    assert any("double free" in said.message for said in result.failure.sglang)


@pytest.mark.parametrize("page_size", [4, 16])
def test_shared_boundary_page_named_first(sglang: Any, page_size: int) -> None:
    """PR #36457: a finished request's tail free from its first unkept token frees the whole
    boundary page the head free releases too."""
    result = _run(sglang, page_size, "python", 3, 80, fault="shared-boundary-page")
    cause, codes = _first(result)
    assert cause == "double-free", codes
    assert codes[0] == "free-list-duplicate"


def test_fault_clean_twins_are_silent(sglang: Any) -> None:
    """The faults' workloads without the fault: nothing found, SGLang silent (and a patched
    module is restored after its history). At page size 1 a tail free starts on a page
    boundary, so shared-boundary-page never acts: counted 0, nothing found."""
    untouched = _run(sglang, 1, "python", 3, 80, fault="shared-boundary-page")
    assert untouched.fault_acted == 0 and untouched.failure is None
    _run(sglang, 4, "python", 3, 80, fault="shared-boundary-page")
    for page_size in (1, 4, 16):
        _assert_clean(_run(sglang, page_size, "python", 3, 80))


def _cli(*args: str) -> Any:
    """A `kvcanary` command in this process."""
    from typer.testing import CliRunner

    from kvcanary_cli.cli import app

    return CliRunner().invoke(app, list(args))


def _soak_here(*args: str) -> tuple[int, str, str]:
    """`kvcanary soak` in this process (SGLang is imported once per session; a refusal before
    any import needs no process of its own)."""
    from typer.testing import CliRunner

    from kvcanary_cli.cli import app

    result = CliRunner().invoke(app, ["soak", *args])
    return result.exit_code, result.stdout, result.stderr


def test_soak_finds_planted_fault_and_shrinks(sglang: Any, tmp_path: Path) -> None:
    """Within the default budget; the reproducer has fewer requests and still fails."""
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec
    from kvcanary_cli.soak.workload import Workload

    code, out, err = _soak_here(
        "--sglang-tree",
        str(wheel_path()),
        "--fault",
        "unmapped-representative",
        "--out",
        str(tmp_path),
        "--format",
        "json",
    )
    assert code == 1, err
    report = json.loads(out)
    assert report["schema"] == "kvcanary.soak/2"
    assert report["found"] and report["failure"]["top_cause"] == "reserved-slot-freed"
    assert report["kvcanary_found"] and report["failure"]["crash"] is None
    assert report["fault"] == "unmapped-representative" and report["fault_acted"] > 0
    # SGLang's pool check sees a leak in that history too: who saw it first, by how much
    # (kvcanary at plan time, SGLang's busy check once the step's result is processed)
    seen = report["seen"]
    assert (seen["kvcanary_step"], seen["kvcanary_when"]) == (report["failure"]["step"], "plan")
    assert seen["sglang_when"] == "after-result" and seen["sglang_step"] >= seen["kvcanary_step"]
    assert seen["first"] == "kvcanary"
    assert seen["lead"] == seen["sglang_step"] - seen["kvcanary_step"]
    before, after = report["shrunk_arrivals"]
    assert after < before
    saved = json.loads((tmp_path / "soak-reproducer.json").read_text())
    assert (tmp_path / "soak-dump.safetensors").is_file()
    workload = Workload.from_json(json.dumps(saved["workload"]))
    assert len(workload.arrivals) == after
    again = run_history(sglang, StackSpec(**saved["spec"]), workload, fault=saved["fault"])
    assert again.failure is not None and again.failure.top_cause == "reserved-slot-freed"
    # the clean twin: the same reproducer without the fault
    assert run_history(sglang, StackSpec(**saved["spec"]), workload).failure is None
    from kvcanary_cli import api
    from kvcanary_cli.dump.header import read_header_and_step

    checked = api.check([tmp_path / "soak-shrunk-dump.safetensors"], kernel="none")
    assert checked.failed
    # the reproducer says where the shrunk workload fails, and its dump is that step's
    assert read_header_and_step(tmp_path / "soak-shrunk-dump.safetensors")[1] == saved["step"]


def test_soak_clean_exits_zero(sglang: Any, tmp_path: Path) -> None:
    """The release: exit 0, and "silent" is said because SGLang's checks ran and said nothing
    (the twin of the row leak, the row count and the crash below)."""
    args = ("--sglang-tree", str(wheel_path()), "--steps", "120", "--out", str(tmp_path))
    code, out, err = _soak_here(*args)
    assert code == 0, out + err
    assert "clean" in out and "120 of 120 steps" in out
    assert "SGLang's own checks silent on every audited step" in out
    assert not any(tmp_path.iterdir())  # nothing written when nothing is found
    code, out, err = _soak_here(*args, "--format", "json")
    assert code == 0, err
    record = json.loads(out)
    assert record["schema"] == "kvcanary.soak/2"
    assert record["audited_steps"] > 0 and record["sglang_checks"] == []
    assert record["failure"] is None and record["seen"] is None
    assert not record["found"] and not record["sglang_found"]


def test_a_finding_after_a_result_keeps_that_steps_dump_and_replays(
    sglang: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A double free found once a step's result is processed: the dump records that step
    (it was recorded after the step, under the next one's number), and `--replay` of the
    reproducer finds it again, exit 1; the reproducer without its fault replays clean, exit 0
    (the twin)."""
    from kvcanary_cli.dump.header import read_header_and_step

    _no_shrinking(monkeypatch)
    wheel = str(wheel_path())
    options = ("--sglang-tree", wheel, "--steps", "80", "--page-size", "1", "--core", "python")
    out = tmp_path / "out"
    code, text, err = _soak_here(*options, "--fault", "double-free-group-end", "--out", str(out))
    assert code == 1, text + err
    # the dump of the shrunk workload is no smaller (the same pools), and the report says so
    assert "(its dump records the same pools: no smaller than the first)" in text
    failure = json.loads((out / "soak-workload.json").read_text())
    assert failure["when"] == "after-result" and failure["top_cause"] == "double-free"
    for name in ("soak-dump.safetensors", "soak-shrunk-dump.safetensors"):
        assert read_header_and_step(out / name)[1] == failure["step"]
    reproducer = out / "soak-reproducer.json"
    saved = json.loads(reproducer.read_text())
    assert (saved["step"], saved["top_cause"]) == (failure["step"], "double-free")
    assert saved["sglang_version"] == WHEEL_VERSION  # the release it was recorded on

    code, text, err = _soak_here("--sglang-tree", wheel, "--replay", str(reproducer))
    assert code == 1, text + err
    assert f"replayed {reproducer}: its finding (double-free) came back\n" in text
    code, text, err = _soak_here(
        "--sglang-tree", wheel, "--replay", str(reproducer), "--format", "json"
    )
    record = json.loads(text)
    assert record["replay"] == {
        "reproducer": str(reproducer),
        "recorded": "double-free",
        "reproduced": True,
        "recorded_on": WHEEL_VERSION,
    }
    assert record["failure"]["step"] == failure["step"] and record["histories"] == 1
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "soak-dump.safetensors",
            "soak-shrunk-dump.safetensors",
            "soak-workload.json",
            "soak-reproducer.json",
        ]
    )  # a replay writes nothing

    twin = tmp_path / "twin.json"
    twin.write_text(json.dumps({**saved, "fault": None, "sglang_version": "0.5.21"}))
    code, text, err = _soak_here("--sglang-tree", wheel, "--replay", str(twin))
    assert code == 0, text + err
    assert (
        "its finding (double-free) did not come back: kvcanary found nothing (recorded on "
        f"SGLang 0.5.21, replayed on {WHEEL_VERSION})"
    ) in text


def test_replay_of_no_reproducer_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "soak-reproducer.json"
    bad.write_text('{"spec": {"page_size": 1}, "workload": []}')
    code, out, err = _soak_here("--replay", str(bad), "--out", str(tmp_path / "out"))
    assert code == 2, out + err
    assert err.strip().count("\n") == 0 and "is not a soak reproducer" in err


#: SGLang's own module whose request-row pool the two planted faults below patch
_POOLS = "sglang.srt.mem_cache.memory_pool"


def _one_history_kind(out: Path) -> tuple[str, ...]:
    """Two histories of one page size and core (a planted fault behaves alike in each)."""
    options = {"--sglang-tree": str(wheel_path()), "--steps": "160", "--page-size": "1"}
    options |= {"--core": "python", "--out": str(out)}
    return tuple(part for option in options.items() for part in option)


def _no_shrinking(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the failing workload as it is: the finding is what these tests read, and
    shrinking (test_soak_finds_planted_fault_and_shrinks's subject) reruns it many times."""
    monkeypatch.setattr(
        "kvcanary_cli.soak.run.shrink_workload", lambda workload, fails, **_: workload
    )


def _leak_first_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """A req_to_token row leak: the first row handed out is never given back."""
    from importlib import import_module

    pool = import_module(_POOLS).ReqToTokenPool
    original = pool.free

    def leaky_free(self: Any, req: Any) -> None:
        if req.kv.req_pool_idx == self.size:  # the first row alloc pops
            req.kv.req_pool_idx = None
            return
        original(self, req)

    monkeypatch.setattr(pool, "free", leaky_free)


def test_a_leaked_row_is_named_before_sglangs_idle_check(
    sglang: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row leak SGLang's `_check_req_pool` counts at idle: kvcanary names the row
    (`req-row-leaked`) as soon as its request is gone, busy or idle, first."""
    _leak_first_row(monkeypatch)
    code, out, err = _soak_here(*_one_history_kind(tmp_path), "--format", "json")
    assert code == 1, out + err
    record = json.loads(out)
    failure = record["failure"]
    assert failure["codes"] == ["req-row-leaked"] and failure["top_cause"] == "req-row-leak"
    assert record["kvcanary_found"] and record["seen"]["first"] == "kvcanary"
    from kvcanary_cli import api

    [dump] = api.check([Path(record["files"]["dump"])], kernel="none").dumps
    assert isinstance(dump, DumpReport)
    [leak] = [f for f in dump.findings if f.code.value == "req-row-leaked"]
    assert leak.details["rows"] == [leak.pool_row]


@pytest.mark.slow
def test_a_lock_never_released_is_named(
    sglang: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first finish that holds a tree lock drops it unreleased (its `unlock` skipped):
    the nodes stay locked with no request on them, `tree-lock-leaked` names their slots."""
    from importlib import import_module

    common = import_module("sglang.srt.mem_cache.common")
    original = common.release_kv_cache
    done: list[bool] = []

    def keep_lock(req: Any, tree: Any, **kw: Any) -> None:
        if not done and req.lock is not None:
            req.lock = None  # the lock is lost, never released
            done.append(True)
        original(req, tree, **kw)

    monkeypatch.setattr(common, "release_kv_cache", keep_lock)
    _no_shrinking(monkeypatch)
    code, out, err = _soak_here(*_one_history_kind(tmp_path), "--format", "json")
    assert code == 1, out + err
    record = json.loads(out)
    failure = record["failure"]
    assert failure["codes"] == ["tree-lock-leaked"] and failure["top_cause"] == "tree-lock-leak"
    assert record["kvcanary_found"] and done


@pytest.mark.slow
def test_a_row_freed_twice_is_named(
    sglang: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first row freed goes on the request pool's free list twice: named at once
    (`req-row-handed-out-twice`), before it is handed to two requests."""
    from importlib import import_module

    pool = import_module(_POOLS).ReqToTokenPool
    original = pool.free_rows
    done: list[bool] = []

    def free_twice(self: Any, indices: list[int]) -> None:
        original(self, indices if done else [*indices, *indices])
        done.append(True)

    monkeypatch.setattr(pool, "free_rows", free_twice)
    _no_shrinking(monkeypatch)
    code, out, err = _soak_here(*_one_history_kind(tmp_path), "--format", "json")
    assert code == 1, out + err
    failure = json.loads(out)["failure"]
    assert failure["codes"][0] == "req-row-handed-out-twice", failure
    assert failure["top_cause"] == "req-row-double-free"


def test_a_row_count_only_sglang_sees_exits_1_and_says_so(
    sglang: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's `_check_req_pool` complains at idle (its session count is off by one: a
    session holds no row here) and kvcanary, whose rows all add up, sees nothing. The soak
    runs its whole budget, exits 1, and says what SGLang said beside "kvcanary: nothing".
    It keeps the first complaint: the state it was said of, where `kvcanary leak` finds every
    row free or held, each once, and names the count that is wrong, and a reproducer that
    replays it."""
    from importlib import import_module

    observer = import_module(
        "sglang.srt.managers.scheduler_components.pool_stats_observer"
    ).SchedulerPoolStatsObserver
    monkeypatch.setattr(observer, "session_held_req_count", lambda self: 1)
    args = _one_history_kind(tmp_path)
    code, out, err = _soak_here(*args, "--format", "json")
    assert code == 1, out + err
    record = json.loads(out)
    assert record["failure"] is None  # kvcanary found nothing
    assert record["steps"] == 160  # not stopped: SGLang's complaints do not end a soak
    files = record["files"]
    assert sorted(files) == ["dump", "reproducer", "shrunk_dump", "workload"]
    kept = json.loads(Path(files["reproducer"]).read_text())
    kept_first = json.loads(Path(files["workload"]).read_text())
    assert (kept["sglang_check"], kept["codes"], kept["when"]) == ("_check_req_pool", [], "idle")
    assert record["shrunk_arrivals"][1] <= record["shrunk_arrivals"][0]
    reading = record["reading"]  # what `kvcanary leak` says of the kept complaint, in the report
    assert (reading["check"], reading["verdict"]) == ("_check_req_pool", "miscount"), reading
    assert (reading["step"], reading["when"]) == (kept_first["step"], "idle"), reading
    leak = _cli("leak", kept["sglang_message"], files["shrunk_dump"], "--format", "json")
    told = json.loads(leak.stdout)
    assert (told["verdict"], told["cause"]) == ("miscount", "sglang-miscount"), leak.stdout
    rows = told["rows"]
    assert (rows["leaked"], rows["twice"], rows["held"], rows["busy"]) == (0, 0, 0, False)
    assert "session_held 1, the dump's sessions hold 0 rows" in told["summary"]
    replayed = _soak_here("--replay", files["reproducer"], "--sglang-tree", str(wheel_path()))
    assert replayed[0] == 1 and "came back" in replayed[1], replayed
    assert record["found"] and record["sglang_found"] and not record["kvcanary_found"]
    [check] = record["sglang_checks"]
    assert check["check"] == "_check_req_pool"
    assert 1 <= check["histories"] <= record["histories"]
    assert check["steps"] >= 2
    first = check["first"][0]
    assert "req_to_token_pool memory leak" in first["message"]
    assert first["when"] == "idle"
    seen = record["seen"]
    assert (seen["first"], seen["kvcanary_step"], seen["lead"]) == ("sglang", None, None)
    assert (seen["sglang_step"], seen["sglang_when"]) == (first["step"], "idle")
    assert seen["seed"] == first["seed"]
    code, table, err = _soak_here(*args, "--force")
    assert code == 1, table + err
    assert "kvcanary: nothing" in table and "_check_req_pool" in table
    assert "kvcanary leak on _check_req_pool's complaint and the dump of step" in table
    assert "miscount [sglang-miscount]: SGLang's count is wrong" in " ".join(table.split())
    assert "req_to_token_pool memory leak" in table and "silent" not in table


@pytest.mark.slow
def test_an_sglang_crash_exits_1_with_its_exception(
    sglang: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of memory raised inside SGLang's allocation when a third request takes a row: a
    finding with its exception, the step, where in SGLang it came out, and the dump of the
    last state kvcanary audited before it (clean: the crash is SGLang's)."""
    from importlib import import_module

    from kvcanary_cli import api

    pool = import_module(_POOLS).ReqToTokenPool
    original = pool.alloc

    def failing_alloc(self: Any, reqs: list[Any]) -> Any:
        if len(self.free_slots) - len(reqs) < self.size - 2:
            raise torch.OutOfMemoryError("CPU out of memory (planted by the test)")
        return original(self, reqs)

    monkeypatch.setattr(pool, "alloc", failing_alloc)
    args = _one_history_kind(tmp_path)
    code, out, err = _soak_here(*args, "--format", "json")
    assert code == 1, out + err
    record = json.loads(out)
    failure = record["failure"]
    assert failure["when"] == "crash" and failure["codes"] == []
    crash = failure["crash"]
    assert crash["exception"] == "OutOfMemoryError"
    assert crash["message"] == "CPU out of memory (planted by the test)"
    assert crash["raised_in"].startswith("sglang/srt/mem_cache/")
    assert 0 <= crash["state_step"] <= failure["step"] and crash["state_when"] is not None
    assert record["sglang_found"] and not record["kvcanary_found"]
    seen = record["seen"]
    assert (seen["first"], seen["sglang_step"], seen["sglang_when"]) == (
        "sglang",
        failure["step"],
        "crash",
    )
    before = api.check([Path(record["files"]["dump"])], kernel="none")
    assert not before.failed  # the state just before the crash is sound
    code, table, err = _soak_here(*args, "--force")
    assert code == 1, table + err
    assert "SGLang crashed at step" in table and "OutOfMemoryError" in table
    assert "kvcanary: nothing" in table


def test_kvcanarys_plan_time_finding_stands_when_sglang_then_crashes(
    sglang: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kvcanary flags a step at plan time (the planted unmapped representative) and SGLang
    raises later in that step, processing its result: the failure is kvcanary's finding (codes,
    cause, dump; the shrink and the replay keep it), SGLang's crash at that step said beside
    it, not in its place."""
    from importlib import import_module

    from kvcanary_cli.soak.audit import audit_step

    flagged = [False]  # kvcanary's last audit of the running history flagged its state

    def watched(*args: Any, **kwargs: Any) -> Any:
        verdict = audit_step(*args, **kwargs)
        flagged[0] = verdict.kvcanary_found
        return verdict

    req = import_module("sglang.srt.managers.schedule_batch").Req
    original = req._check_vocab_boundary_finish

    def crashing(self: Any, tokens: list[int]) -> bool:
        if flagged[0]:  # called by Req.update_finish_state, once the forward ran
            raise AssertionError("planted by the test")
        return bool(original(self, tokens))

    monkeypatch.setattr("kvcanary_cli.soak.run.audit_step", watched)
    monkeypatch.setattr(req, "_check_vocab_boundary_finish", crashing)
    args = (*_one_history_kind(tmp_path), "--fault", "unmapped-representative")
    code, out, err = _soak_here(*args, "--format", "json")
    assert code == 1, out + err
    record = json.loads(out)
    failure = record["failure"]
    assert (failure["when"], failure["top_cause"]) == ("plan", "reserved-slot-freed"), failure
    assert failure["codes"] and failure["crash"] is None
    assert record["kvcanary_found"] and record["sglang_found"]
    crash = failure["crash_after"]
    assert (crash["exception"], crash["message"]) == ("AssertionError", "planted by the test")
    assert crash["raised_in"].startswith("sglang/srt/managers/schedule_batch.py")
    assert (crash["state_step"], crash["state_when"]) == (failure["step"], "plan")
    seen = record["seen"]
    assert (seen["kvcanary_step"], seen["kvcanary_when"]) == (failure["step"], "plan")
    assert (seen["sglang_step"], seen["sglang_when"]) == (failure["step"], "crash")
    assert (seen["first"], seen["lead"]) == ("kvcanary", 0)
    from kvcanary_cli import api

    assert api.check([Path(record["files"]["dump"])], kernel="none").failed  # the flagged state
    before, after = record["shrunk_arrivals"]  # shrunk, still failing with kvcanary's cause
    reproducer = tmp_path / "soak-reproducer.json"
    assert after < before and json.loads(reproducer.read_text())["top_cause"] == (
        "reserved-slot-freed"
    )
    code, table, err = _soak_here(*args, "--force")
    assert code == 1, table + err
    assert "reserved-slot-in-use" in table and "kvcanary: nothing" not in table
    assert "SGLang crashed too, in the same step: AssertionError: planted by the test" in table
    code, out, err = _soak_here("--replay", str(reproducer), "--format", "json")
    assert code == 1, out + err
    replayed = json.loads(out)
    assert replayed["replay"]["reproduced"] and replayed["failure"]["crash_after"] is not None


def test_soak_runs_its_budget_and_prints_the_same_record_twice(sglang: Any, tmp_path: Path) -> None:
    """`--steps 1` runs one step (not a whole history), and the same soak prints the same
    bytes: its `kvcanary.soak/2` record carries no wall-clock time."""
    args = ("--sglang-tree", str(wheel_path()), "--steps", "1", "--out", str(tmp_path / "o"))
    code, first, err = _soak_here(*args, "--format", "json")
    assert code == 0, err
    record = json.loads(first)
    assert record["schema"] == "kvcanary.soak/2"
    assert (record["steps"], record["histories"], record["budget"]) == (1, 1, 1)
    code, second, err = _soak_here(*args, "--format", "json")
    assert code == 0, err
    assert second == first


def test_soak_bad_tree_is_one_line_exit_2(tmp_path: Path) -> None:
    code, _, err = _soak_here("--sglang-tree", str(tmp_path), "--out", str(tmp_path / "o"))
    assert code == 2
    assert err.strip().count("\n") == 0
    assert "not an SGLang tree" in err


def test_soak_tree_without_kv_canary_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "sglang" / "srt").mkdir(parents=True)
    code, _, err = _soak_here("--sglang-tree", str(tmp_path), "--out", str(tmp_path / "o"))
    assert code == 2
    assert err.strip().count("\n") == 0
    assert "no kv canary" in err


def test_soak_unknown_fault_is_one_line_exit_2(tmp_path: Path) -> None:
    code, _, err = _soak_here("--fault", "no-such-bug", "--out", str(tmp_path))
    assert code == 2
    assert "--fault" in err and err.strip().count("\n") == 0


def test_soak_on_a_release_it_does_not_drive_is_one_line_exit_2(
    sglang: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release whose `Req` lacks what soak's driver reads (here: a stand-in reader asking
    for an attribute no release has) is an error line naming the difference, not a finding
    and not a traceback. (0.5.21, refused so before, is soaked now: test_soak_releases.)"""
    from operator import attrgetter

    from kvcanary_cli.soak import driver

    # (a C reader: the attribute is missed in the driver's own frame, as a real one is)
    monkeypatch.setattr(driver, "prefix_len", attrgetter("prefix_of_a_later_release"))
    code, out, err = _soak_here(
        "--sglang-tree", str(wheel_path()), "--steps", "40", "--out", str(tmp_path)
    )
    assert code == 2, out
    assert err.strip().count("\n") == 0
    assert "differ from those soak drives" in err and "prefix_of_a_later_release" in err


def test_coverage_reaches_the_abort_window_and_prefix_lock_frees(
    sglang: Any, tmp_path: Path
) -> None:
    """The workload's knobs reach what the plain workload never called (an abort's release,
    decode's window eviction, the prefill's SWA lock dropped past the window), all clean; the
    report's three lists partition the layout's free paths."""
    from kvcanary_cli.soak.command import soak

    report = soak(
        sglang_tree=str(wheel_path()),
        steps=170,
        seed=0,
        page_size=4,
        core="python",
        out=tmp_path / "out",
        coverage=True,
    )
    assert not report.found, (report.failure, report.sglang_checks)
    covered = report.coverage
    assert covered is not None and covered.functions_run > 100
    for name in (
        "UnifiedRadixCache.release_aborted_request",
        "BasePrefixCache.evict_sliding_windows",
        "UnifiedRadixCache.release_swa_prefix_lock",
        "SWAComponent.release_window_lock",
        "common.release_kv_cache",
        "SWATokenToKVPoolAllocator.free_swa_segment",
    ):
        assert name in covered.reached, name
    lists = [covered.reached, covered.not_reached, covered.other_features]
    names = [name for listed in lists for name in listed]
    assert len(names) == len(set(names))
    assert "UnifiedRadixCache.evict_host" in covered.other_features
