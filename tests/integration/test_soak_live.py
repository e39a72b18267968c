"""The live audit (soak.live) against the whole `check`, on SGLang 0.5.23's real stack: on
every audited state of a few histories, clean and with each planted fault, the live audit's
findings are `check`'s (it passes a state only where `check` finds nothing; where a fact
breaks, its findings are `check`'s own). The comparison is shown to catch a live rule made
too lenient. Skipped without the wheel (see conftest)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

#: (page size, core, fault): each fault where it shows, and clean twins of every page size
HISTORIES = [
    (1, "python", None),
    pytest.param(4, "rust", None, marks=pytest.mark.slow),
    pytest.param(16, "python", None, marks=pytest.mark.slow),
    (1, "rust", "unmapped-representative"),
    (4, "python", "double-free-group-end"),
    (16, "rust", "shared-boundary-page"),
]


def _history(
    sglang: Any,
    page_size: int,
    core: str,
    fault: str | None,
    mode: str,
    layout: str = "swa",
    *,
    lazy: bool = False,
) -> Any:
    from dataclasses import replace

    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec
    from kvcanary_cli.soak.workload import random_workload

    if core not in sglang.cores:
        pytest.skip(f"no {core} tree core in this SGLang")
    workload = random_workload(11, steps=40, requests=10, max_prompt=60, max_new=20)
    if lazy:  # unified memory's lazy compaction (its physical free lists), as soak draws it
        workload = replace(workload, lazy_compaction=True)
    spec = StackSpec.pressured(page_size, core, layout)
    return run_history(sglang, spec, workload, fault=fault, mode=mode)  # type: ignore[arg-type]


def _differences(result: Any) -> list[Any]:
    """The audited states where the live audit's findings are not `check`'s: it passed a
    state `check` flags (where a fact breaks, the audit's findings are `check`'s own)."""
    return [v for v in result.verdicts if v.broken is None and v.codes]


@pytest.mark.parametrize(("page_size", "core", "fault"), HISTORIES)
def test_live_audit_finds_what_check_finds(
    sglang: Any, page_size: int, core: str, fault: str | None
) -> None:
    result = _history(sglang, page_size, core, fault, "both")
    assert result.verdicts and _differences(result) == []
    if fault is None:
        assert result.failure is None and result.fallbacks == 0
    else:
        # the fault is found, and a fact broke where check flagged it
        assert result.failure is not None and result.failure.broken is not None
    live = _history(sglang, page_size, core, fault, "live")
    assert (live.steps, live.audited) == (result.steps, result.audited)
    if fault is None:
        assert live.failure is None and live.checked == 0  # no dump, no whole check
    else:
        seen, full = live.failure, result.failure
        assert seen is not None and full is not None
        assert (seen.step, seen.mode, seen.codes, seen.top_cause) == (
            full.step,
            full.mode,
            full.codes,
            full.top_cause,
        )


def test_the_comparison_catches_a_lenient_rule(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live audit that reads the full free list as a set (a slot freed twice counted
    once) misses the double free: the comparison names the states where it differs from
    `check`."""
    from dataclasses import replace

    import numpy as np

    from kvcanary_cli.soak.live import LiveAudit

    original = LiveAudit._full

    def lenient(self: LiveAudit, state: Any, idle: bool) -> str | None:
        return original(self, replace(state, free_full=np.unique(state.free_full)), idle)

    monkeypatch.setattr(LiveAudit, "_full", lenient)
    result = _history(sglang, 4, "python", "double-free-group-end", "both")
    missed = _differences(result)
    assert missed and "free-list-duplicate" in missed[0].codes


def _misread(sglang: Any, core: str, monkeypatch: pytest.MonkeyPatch) -> tuple[set[str], int]:
    """Run a clean history; at every audited state compare the live audit's own readers
    (the tree walked once, the free lists unsorted, the rows and the batch by attribute)
    with what `capture.tree` records in a dump of the same objects: the facts they disagree
    on, and the states with a lock."""
    import numpy as np

    import kvcanary_cli.soak.audit as audit
    from kvcanary_cli.capture.tree import batch_state, tree_state
    from kvcanary_cli.soak.live import read_state as original

    differ: set[str] = set()
    locked_states = [0]

    def compared(scheduler: Any, batch: Any, requests: Any, readers: Any = None) -> Any:
        state = original(scheduler, batch, requests, readers)
        stack = scheduler.stack
        rows = state.table.shape[0]
        facts = tree_state(allocator=stack.allocator, tree=stack.tree, requests=requests, rows=rows)
        locked = state.locked
        if state.unlocked is not None:  # the Rust core's: held less unlocked, as capture does
            locked = np.setdiff1d(state.tree, state.unlocked)
        locked_states[0] += bool(locked is not None and locked.size)
        for name, mine in (
            ("free_full_slots", state.free_full),
            ("free_swa_slots", state.free_swa),
            ("tree_full_slots", state.tree),
            ("tree_swa_resident_slots", state.resident),
            ("tree_locked_full_slots", locked),
        ):
            if mine is None or not np.array_equal(np.sort(mine), np.sort(facts[name])):
                differ.add(name)
        if not np.array_equal(state.alloc_lens, facts["req_pool_allocated_lens"]):
            differ.add("req_pool_allocated_lens")
        if not np.array_equal(state.running_rows, facts["running_req_rows"]):
            differ.add("running_req_rows")
        recorded = None if batch is None else batch_state(batch)
        if (recorded is None) != (state.batch is None) or (
            recorded is not None
            and state.batch is not None
            and (
                recorded.keys() != state.batch.keys()
                or any(
                    not np.array_equal(value, state.batch[key]) for key, value in recorded.items()
                )
            )
        ):
            differ.add("batch")
        return state

    monkeypatch.setattr(audit, "read_state", compared)
    result = _history(sglang, 4, core, None, "live")
    assert result.audited > 0
    return differ, locked_states[0]


@pytest.mark.parametrize("core", ["python", "rust"])
def test_live_readers_read_what_a_dump_records(
    sglang: Any, core: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    differ, locked = _misread(sglang, core, monkeypatch)
    assert differ == set() and locked > 0


def test_the_reader_comparison_catches_a_misread_lock(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Python-core walk that reads no node as locked is named by the comparison (both
    walks: the SWA layout's unrolled one and the general one)."""
    import kvcanary_cli.soak.live as live

    def unlocked_by(original: Any) -> Any:
        def unlocked(*args: Any) -> Any:
            held, resident, _, unlocked, counts = original(*args)
            return held, resident, held[:0], unlocked, counts

        return unlocked

    for walk in ("_walk_full_swa", "_walk_python_core"):
        monkeypatch.setattr(live, walk, unlocked_by(getattr(live, walk)))
    differ, _ = _misread(sglang, "python", monkeypatch)
    assert differ == {"tree_locked_full_slots"}


def test_the_reader_comparison_catches_a_misread_row_or_batch(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row reader that records each allocation one short, and a batch reader that reads
    a write one slot off, are named by the comparison."""
    import kvcanary_cli.soak.live as live

    rows_of, batch_of = live._rows_of, live._batch_of

    def short(*args: Any) -> Any:
        lens, running = rows_of(*args)
        return (lens - 1).clip(0), running

    def off(batch: Any) -> Any:
        facts = batch_of(batch)
        if "out_cache_loc" in facts:
            facts["out_cache_loc"] = facts["out_cache_loc"] + 1
        return facts

    monkeypatch.setattr(live, "_rows_of", short)
    monkeypatch.setattr(live, "_batch_of", off)
    differ, _ = _misread(sglang, "rust", monkeypatch)
    assert differ == {"req_pool_allocated_lens", "batch"}


def _planted(monkeypatch: pytest.MonkeyPatch, bug: str) -> None:
    """Plant one of bench/mutants.py's layout bugs the live audit once passed although `check`
    flagged it: a unified sub-allocator's free that leaves the freed virtual pages bound
    (`unified-free-keeps-binding`), a Mamba free list that starts at the reserved slot 0
    (`mamba-slot-zero-handed-out`)."""
    from importlib import import_module

    import torch

    if bug == "unified-free-keeps-binding":
        cls = import_module("sglang.srt.mem_cache.allocator.unified_sub_pool").MultiEndedAllocator
        free = cls.free

        def keeps_binding(self: Any, index: Any, *, _pages: Any = None) -> None:
            pages = _pages
            if pages is None and index is not None and index.numel():
                pages = torch.unique(index.to(torch.int64) // self.page_size)
            bound = None if pages is None else self.virtual_to_physical[pages].clone()
            free(self, index, _pages=_pages)
            if bound is not None and self.free_group is None:
                self.virtual_to_physical[pages] = bound

        monkeypatch.setattr(cls, "free", keeps_binding)
    else:
        cls = import_module("sglang.srt.mem_cache.allocator.mamba").MambaSlotAllocator
        clear = cls.clear

        def with_slot_zero(self: Any) -> None:
            clear(self)
            self.free_slots = torch.cat((torch.zeros(1, dtype=torch.int64), self.free_slots))

        monkeypatch.setattr(cls, "clear", with_slot_zero)


@pytest.mark.parametrize(
    ("layout", "page_size", "bug"),
    [
        pytest.param("unified", 1, None, marks=pytest.mark.slow),
        ("unified", 4, None),
        ("unified", 4, "unified-free-keeps-binding"),
        ("mamba", 1, None),
        ("mamba", 1, "mamba-slot-zero-handed-out"),
    ],
)
def test_live_audit_finds_what_check_finds_on_each_layout(
    sglang: Any, monkeypatch: pytest.MonkeyPatch, layout: str, page_size: int, bug: str | None
) -> None:
    """Unified memory's page tables and the Mamba layout's reserved slot are the live audit's
    facts too: on a clean history of each layout it never falls back, and with the bug
    planted it breaks where `check` flags the state (before, it passed those states: the
    soak missed both mutants)."""
    if bug is not None:
        _planted(monkeypatch, bug)
    result = _history(sglang, page_size, "python", None, "both", layout)
    assert result.verdicts and _differences(result) == []
    if bug is None:
        assert result.failure is None and result.fallbacks == 0
    else:
        assert result.failure is not None and result.failure.broken is not None


def _tombstone_freed_again(monkeypatch: pytest.MonkeyPatch, sglang: Any) -> None:
    """bench/mutants.py's `unified-tombstoned-swa-freed-again`: a row segment whose SWA pages
    are tombstoned is released on both sides, so each tombstone's -1 joins the SWA side's
    physical free list (and the next allocation binds a virtual page to physical page -1)."""
    from importlib import import_module

    import torch

    module = "sglang.srt.mem_cache.allocator.unified_hybrid_swa"
    cls = import_module(module).UnifiedSWATokenToKVPoolAllocator

    def both_sides(self: Any, index: Any, *, start_pos: int) -> None:
        if index is not None and index.numel():
            reps = self.full_attn_allocator._page_reps(index.to(torch.int64), start_pos)
            if self.free_page_reps_group is None:
                self._release_page_reps((reps,), ())
            else:
                self.free_page_reps_group.append(reps)

    monkeypatch.setattr(cls, "free_full_segment", both_sides)


def test_a_tombstone_freed_again_is_named_at_its_step(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tombstoned SWA page freed again (lazily compacted, page size 1): named at the step
    SGLang's busy SWA count first complains, as the -1 bound to a virtual page (the SWA
    `physical_to_virtual` sentinel overwritten); before, the live audit broke there but
    `check` found nothing, and the soak named it steps later (an unmapped window cell)."""
    _tombstone_freed_again(monkeypatch, sglang)
    result = _history(sglang, 1, "python", None, "both", "unified", lazy=True)
    assert result.verdicts and _differences(result) == []
    seen = result.failure
    assert seen is not None and seen.top_cause == "physical-page-double-free", seen
    assert "page-table-sentinel-overwritten" in seen.codes
    assert [said.check for said in seen.sglang] == ["self_check_during_busy"]


def test_a_minus_one_on_the_physical_free_list_breaks_the_live_audit(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tombstone freed again as a step's last free: the -1 waits on the SWA side's
    physical free list (`_free_phys_pages`) for the next allocation, and SGLang's span
    check still balances (its live count is one short). The live audit reads the holes, so
    it breaks at that state and `check` names it; before, it passed it (a state `check`
    flags)."""
    import torch

    from kvcanary_cli.soak.driver import Scheduler

    step = Scheduler.step

    def then_free_again(self: Scheduler, *args: Any, **kwargs: Any) -> Any:
        info = step(self, *args, **kwargs)
        if self.step_no == 6:  # step 5 has run
            swa = self.stack.allocator.swa_attn_allocator
            swa._free_phys_pages = torch.cat((swa._free_phys_pages, torch.tensor([-1])))
            swa.live_page_count -= 1
        return info

    monkeypatch.setattr(Scheduler, "step", then_free_again)
    result = _history(sglang, 4, "python", None, "both", "unified", lazy=True)
    assert _differences(result) == []
    seen = result.failure
    assert seen is not None and seen.broken is not None, seen
    assert (seen.step, seen.codes) == (5, ["physical-hole-invalid"])
    assert seen.top_cause == "physical-page-double-free"


def _leak_history(sglang: Any, fault: str | None, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A history whose abort or retraction at step 26 is released without caching (seed 10,
    aborts on): its result, the steps a planted leak happened at, and the audits whose
    running requests held a lock below the root."""
    import kvcanary_cli.soak.live as live
    from kvcanary_cli.soak.driver import Scheduler
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import StackSpec
    from kvcanary_cli.soak.workload import random_workload

    leaked: list[int] = []
    step, counts = Scheduler.step, live.LiveAudit._lock_counts
    held = [0]

    def stepped(self: Any, on_plan: Any = None) -> Any:
        info = step(self, on_plan)
        if self.stack.fault_acted and not leaked:
            leaked.append(info.step)
        return info

    def compared(self: Any, state: Any, *args: Any) -> Any:
        held[0] += any(map(len, state.lock_expected))  # the Python core's: per component
        return counts(self, state, *args)

    monkeypatch.setattr(Scheduler, "step", stepped)
    monkeypatch.setattr(live.LiveAudit, "_lock_counts", compared)
    workload = random_workload(10, steps=40, requests=10, max_prompt=60, max_new=20, aborts=0.3)
    result = run_history(sglang, StackSpec.pressured(1, "python"), workload, fault=fault)
    return result, leaked, held[0]


def test_lock_counts_find_a_lock_leak_at_its_step(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request released without caching never unlocks its prefix (`lock-leak`): a node's
    lock count then exceeds the running requests' locks through it, found at the plan audit
    of the step it happened, where the locked slots alone still lie in running rows (they
    see it a step later). The clean twin: every count matches, with locks held."""
    clean, _, held = _leak_history(sglang, None, monkeypatch)
    assert clean.failure is None and clean.fallbacks == 0 and held > 0
    result, leaked, _ = _leak_history(sglang, "lock-leak", monkeypatch)
    found = result.failure
    assert leaked and found is not None
    assert (found.step, found.mode) == (leaked[0], "plan")
    assert (found.codes, found.top_cause) == (["tree-lock-leaked"], "tree-lock-leak")
    assert found.broken == "a node's lock count is not its requests' locks"
    monkeypatch.setattr("kvcanary_cli.soak.live.LiveAudit._lock_counts", lambda *args: None)
    later = _leak_history(sglang, "lock-leak", monkeypatch)[0].failure
    assert later is not None and later.step > found.step


def test_paged_free_reader_expands_pages_as_the_arithmetic_does() -> None:
    """Pages expanded by look-up (`free_reader` with the pools' sizes) are the slots the
    arithmetic gives; a page past the end reads as slots out of range, a negative page as
    page 0's slots (which no domain holds), never as another real page."""
    from types import SimpleNamespace

    import numpy as np
    import torch

    from kvcanary_cli.soak.live import free_reader

    def side(pages: list[int]) -> Any:
        return SimpleNamespace(get_all_free_pages=lambda: torch.tensor(pages, dtype=torch.int64))

    page, full_n, swa_n = 4, 40, 20
    full, swa = [3, 1, 9, 2], [4, 1]
    allocator = SimpleNamespace(page_size=page, full_attn_allocator=side(full))
    allocator.swa_attn_allocator = side(swa)
    plain, paged = free_reader(allocator), free_reader(allocator, (full_n, swa_n))
    assert plain is not None and paged is not None
    for mine, theirs in zip(plain(), paged(), strict=True):
        assert np.array_equal(mine, theirs)
    bad = SimpleNamespace(page_size=page, full_attn_allocator=side([-1, 2, 10, 99]))
    bad.swa_attn_allocator = side([-3, 5, 6])
    reader = free_reader(bad, (full_n, swa_n))
    assert reader is not None
    slots, swa_slots = reader()
    assert slots[:4].tolist() == [0, 1, 2, 3]  # page 0: in no domain
    assert slots[4:8].tolist() == [8, 9, 10, 11]
    assert (slots[8:] >= full_n).all()  # past the end: out of range, as 40..43 and 396..399
    assert swa_slots[:4].tolist() == [0, 1, 2, 3] and (swa_slots[4:] >= swa_n).all()


def test_a_negative_free_page_breaks_the_live_audit(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A free list that lists a negative page from some step on: every state the live audit
    reads from then on breaks (page 0 is in no domain), so none passes unchecked."""
    from importlib import import_module

    import torch

    cls = import_module("sglang.srt.mem_cache.allocator.paged").PagedTokenToKVPoolAllocator
    census = cls.get_all_free_pages
    calls = [0]

    def listed(self: Any) -> Any:
        calls[0] += 1
        pages = census(self)
        return pages if calls[0] < 40 else torch.cat((pages, torch.tensor([-1])))

    monkeypatch.setattr(cls, "get_all_free_pages", listed)
    result = _history(sglang, 4, "python", None, "both")
    broken = [v.broken is not None for v in result.verdicts]
    assert True in broken and all(broken[broken.index(True) :])
    assert _differences(result) == []
