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

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvcanary_cli.capture import leaks, server, triggers
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.dump.schema import LAYOUT_KEY, Layout
from tests.helpers import checked
from tests.live_capture import arm_hook, drive, live_scheduler, loaded

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def sglang(sglang: Any) -> Iterator[Any]:
    """The session's SGLang, its modules importable for this module's tests."""
    with loaded(sglang) as modules:
        yield modules


@pytest.fixture
def hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sglang: Any) -> Path:
    """The hook armed fresh, dumps to `tmp_path/dumps` (see `tests.live_capture`)."""
    return arm_hook(monkeypatch, sglang, tmp_path / "dumps")


def _scheduler(sglang: Any, page_size: int, seed: int, steps: int) -> Any:
    return live_scheduler(sglang, page_size, seed, steps, layout="unified")


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


@pytest.mark.parametrize("page_size", [1, 4])
def test_snapshots_of_a_correct_unified_history_record_its_layout_and_check_clean(
    sglang: Any, hook: Path, page_size: int
) -> None:
    scheduler = _scheduler(sglang, page_size, 100, 40)
    drive(scheduler, 60)
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
    drive(scheduler, 60, fault="tree-page-freed")
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
