"""The leak trigger through SGLang 0.5.23's real invariant checker, on its real stack (pools,
SWA allocator, UnifiedRadixCache built by `kvcanary_cli.soak.stack` on the CPU).

A request's row is written and released without freeing its KV, the leak SGLang's idle check
reports as `pool memory leak detected! [full] total=..., available=..., ...`. With the hook
armed, the dump is on disk when SGLang's `raise_error_or_warn` is reached, SGLang then raises
exactly as before, and `check` names the leaked pages, who held them last, and reconciles the
counts SGLang printed. The busy check (`self_check_during_busy`, an assert) leaves its dump too.
A clean stack leaves none, and a dump of it checks clean. Skipped without the wheel or the
`sglang-cpu` extra.
"""

from __future__ import annotations

import importlib
import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from kvcanary_cli import api
from kvcanary_cli.capture import (
    DUMP_DIR_ENV,
    install_from_env,
    launcher,
    leaks,
    server,
    store,
    triggers,
)
from kvcanary_cli.catalog import CauseCode, FindingCode
from kvcanary_cli.cli import app as cli_app
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.soak import stack as soak_stack
from kvcanary_cli.soak.audit import SGLangChecks
from tests.helpers import checked
from tests.render.record_schema import RECORDS, validate
from tests.sglang_standin import forget_sglang
from tests.sglang_wheel import MISSING_WHEEL, wheel_path

WHEEL = wheel_path()
pytestmark = pytest.mark.skipif(WHEEL is None, reason=MISSING_WHEEL)

FULL_TOKENS, SWA_TOKENS = 256, 128


@pytest.fixture(scope="module")
def sglang() -> Iterator[Any]:
    """SGLang's memory-cache modules, loaded fresh for this module, forgotten after."""
    with pytest.MonkeyPatch.context() as patch:
        forget_sglang()
        patch.setattr(soak_stack, "_LOADED", {})
        try:
            modules = soak_stack.load_sglang(WHEEL)
        except soak_stack.SGLangUnavailableError as exc:
            pytest.skip(f"SGLang's stack does not load here: {exc}")
        yield modules
        forget_sglang()


def _checker(modules: Any, page_size: int) -> tuple[Any, Any]:
    """The stack and SGLang's own `SchedulerInvariantChecker` over it, as the scheduler
    builds them (no batch: an idle scheduler)."""
    spec = soak_stack.StackSpec(
        page_size=page_size, full_tokens=FULL_TOKENS, swa_tokens=SWA_TOKENS, max_reqs=8
    )
    built = soak_stack.build_stack(modules, spec)
    observers = importlib.import_module(
        "sglang.srt.managers.scheduler_components.pool_stats_observer"
    )
    disagg = importlib.import_module("sglang.srt.disaggregation.utils")
    observer = observers.SchedulerPoolStatsObserver(
        tree_cache=built.tree,
        token_to_kv_pool_allocator=built.allocator,
        req_to_token_pool=built.req_to_token_pool,
        session_controller=SimpleNamespace(sessions={}),
        hisparse_coordinator=None,
        is_hybrid_swa=True,
        is_hybrid_ssm=False,
        enable_hisparse=False,
        full_tokens_per_layer=FULL_TOKENS,
        swa_tokens_per_layer=SWA_TOKENS,
        max_total_num_tokens=FULL_TOKENS,
    )
    last: list[Any] = [None]
    checker = modules.invariant_checker.SchedulerInvariantChecker(
        is_hybrid_swa=True,
        is_hybrid_ssm=False,
        disaggregation_mode=disagg.DisaggregationMode.NULL,
        page_size=page_size,
        full_tokens_per_layer=FULL_TOKENS,
        swa_tokens_per_layer=SWA_TOKENS,
        max_total_num_tokens=FULL_TOKENS,
        tree_cache=built.tree,
        token_to_kv_pool_allocator=built.allocator,
        req_to_token_pool=built.req_to_token_pool,
        pool_stats_observer=observer,
        get_last_batch=lambda: last[0],
        get_running_batch=lambda: None,
        scheduler_stage_metrics=None,
    )
    return built, SimpleNamespace(checker=checker, last=last)


def _leak_a_row(built: Any, page_size: int, tokens: int) -> tuple[int, np.ndarray]:
    """Allocate `tokens` slots with SGLang's allocator, write them into a request row, then
    give the row back without freeing the KV (the leak)."""
    if page_size == 1:
        slots = built.allocator.alloc(tokens)
    else:
        zero, length = torch.tensor([0]), torch.tensor([tokens])
        slots = built.allocator.alloc_extend(zero, zero, length, length, torch.tensor([-1]), tokens)
    pool = built.req_to_token_pool
    row = pool.free_slots.pop(0)
    pool.write((row, slice(0, tokens)), slots.to(torch.int32))
    pool.free_slots.append(row)
    return row, slots.numpy().astype(np.int64)


@pytest.fixture
def armed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sglang: Any) -> Iterator[Any]:
    """The hook armed the way `KVCANARY_DUMP_DIR` arms it, with SGLang's checker already
    loaded; a spy under the wrapper records what was on disk when SGLang's own report ran."""
    monkeypatch.setenv(DUMP_DIR_ENV, str(tmp_path / "dumps"))
    for name in ("KVCANARY_DUMP_LIMIT", "KVCANARY_DUMP_MAX_BYTES", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(store, "BUDGET", store.Budget())
    monkeypatch.setattr(triggers, "_SETTINGS", [triggers.Settings()])
    monkeypatch.setattr(server, "_calls", itertools.count())
    monkeypatch.setattr(server, "_VERSION", [])
    module = sglang.invariant_checker
    report = module.raise_error_or_warn
    real = getattr(report, server.ORIGINAL_ATTR, report)
    seen: list[list[str]] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(sorted(p.name for p in (tmp_path / "dumps").glob("*.safetensors")))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "raise_error_or_warn", spy)
    busy = module.SchedulerInvariantChecker.self_check_during_busy
    monkeypatch.setattr(
        module.SchedulerInvariantChecker,
        "self_check_during_busy",
        getattr(busy, server.ORIGINAL_ATTR, busy),
    )
    before = list(sys.meta_path)
    assert install_from_env()
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, launcher._InstallOnImport)]
    assert sys.meta_path == before
    assert module.raise_error_or_warn is not spy  # wrapped around SGLang's report
    yield SimpleNamespace(dumps=tmp_path / "dumps", seen=seen)


def _idle_check(checker: Any) -> None:
    """What the scheduler runs when idle (`Scheduler.on_idle`, 0.5.23)."""
    has_leak, messages = checker._check_all_pools(checker.pool_stats_observer.get_pool_stats())
    if has_leak:
        checker._report_leak("pool", "\n".join(messages))


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_idle_leak_report_leaves_a_dump_first_and_check_reconciles_its_counts(
    page_size: int, sglang: Any, armed: Any
) -> None:
    built, ctx = _checker(sglang, page_size)
    row, slots = _leak_a_row(built, page_size, tokens=10)
    with pytest.raises(ValueError, match="pool memory leak detected") as raised:
        _idle_check(ctx.checker)
    [path] = sorted(armed.dumps.glob("*.safetensors"))
    assert armed.seen == [[path.name]]  # on disk before SGLang's report raised
    printed = str(raised.value)
    dump = load_dump(path)
    assert dump.metadata["kvcanary.trigger"] == "leak"
    assert dump.metadata["sglang.version"] == "0.5.23"
    assert dump.bs == 0 and dump.metadata["forward_mode"] == "idle"  # no batch
    counts = leaks.printed_counts(printed)
    assert counts and all(dump.metadata[k] == str(v) for k, v in counts.items())
    full = {k.rsplit(".", 1)[1]: v for k, v in counts.items() if ".full." in k}
    unaccounted = full["total"] - sum(v for k, v in full.items() if k != "total")

    report = checked(dump, kernel="vectorized")
    by_code = {f.code: f for f in report.findings}
    assert set(by_code) == {FindingCode.FULL_PAGE_LEAKED, FindingCode.SWA_PAGE_LEAKED}
    leaked = by_code[FindingCode.FULL_PAGE_LEAKED]
    assert leaked.cells is not None and leaked.cells.slot is not None
    pages = np.unique(slots // page_size)
    expected = (pages[:, None] * page_size + np.arange(page_size)[None, :]).reshape(-1)
    assert leaked.cells.slot.tolist() == expected.tolist()  # whole pages, as SGLang allocates
    assert leaked.cells.slot.size == unaccounted  # exactly the difference SGLang printed
    assert leaked.details["sglang_counts"] == full
    first = leaked.provenance[0]
    assert first.slot == int(slots[0])
    assert [(c.pool_row, c.position) for c in first.cells] == [(row, 0)]  # who held it last
    [note] = [n for n in report.notes if "[full]" in n]
    assert f"{unaccounted} slots unaccounted" in note and "exactly the difference" in note
    [swa_note] = [n for n in report.notes if "[swa]" in n]
    assert "exactly the difference" in swa_note
    assert report.diagnosis[0].code.value in {"full-leak", "swa-leak"}


def test_the_busy_check_assert_leaves_its_dump_and_still_raises(sglang: Any, armed: Any) -> None:
    built, ctx = _checker(sglang, 1)
    _leak_a_row(built, 1, tokens=6)
    ctx.last[0] = SimpleNamespace(reqs=[])  # a step ran: the busy check runs
    with pytest.raises(AssertionError, match="Full Pool Mem Leak Detected"):
        ctx.checker.self_check_during_busy()
    [path] = sorted(armed.dumps.glob("*.safetensors"))
    dump = load_dump(path)
    assert dump.metadata["sglang.check.raised"] == "yes"
    assert dump.metadata["sglang.check.full.available"] == str(FULL_TOKENS - 6)
    codes = {f.code for f in checked(dump, kernel="vectorized").findings}
    assert FindingCode.FULL_PAGE_LEAKED in codes


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_clean_stack_leaves_no_dump_and_its_state_checks_clean(
    page_size: int, sglang: Any, armed: Any
) -> None:
    built, ctx = _checker(sglang, page_size)
    _idle_check(ctx.checker)  # no leak: SGLang says nothing, the hook writes nothing
    assert armed.seen == [] and not list(armed.dumps.glob("*.safetensors"))
    # the same capture of the clean state, with the counts SGLang computes for it
    stats = ctx.checker.pool_stats_observer.get_pool_stats()
    _, messages = ctx.checker._check_all_pools(stats)
    leaks.capture_leak(ctx.checker, "\n".join(messages), raised=False)
    [path] = sorted(armed.dumps.glob("*.safetensors"))
    report = checked(load_dump(path), kernel="vectorized")
    assert report.findings == ()
    [note] = [n for n in report.notes if "[full]" in n]
    assert "0 slots unaccounted" in note and "none leaked" in note
    # `kvcanary leak` on the same counts and state: nothing is off
    told = api.leak("\n".join(messages), path)
    assert told.verdict == "balanced" and told.cause is None and not told.found
    assert [p.verdict for p in told.pools] == ["balanced", "balanced"]


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_double_free_is_named_and_is_exactly_sglangs_excess(
    page_size: int, sglang: Any, armed: Any
) -> None:
    """Pages freed twice on the full side: SGLang's idle sum comes out above its total
    (available counts the list's entries); the dump names the pages listed twice and says
    they are the excess."""
    built, ctx = _checker(sglang, page_size)
    if page_size == 1:
        slots = built.allocator.alloc(8)
    else:
        zero, length = torch.tensor([0]), torch.tensor([8])
        slots = built.allocator.alloc_extend(zero, zero, length, length, torch.tensor([-1]), 8)
    built.allocator.free(slots)
    built.allocator.full_attn_allocator.free(slots)  # the second free
    with pytest.raises(ValueError, match="pool memory leak detected"):
        _idle_check(ctx.checker)
    [path] = sorted(armed.dumps.glob("*.safetensors"))
    report = checked(load_dump(path), kernel="vectorized")
    assert {f.code for f in report.findings} == {FindingCode.FREE_LIST_DUPLICATE}
    assert report.diagnosis[0].code.value == "double-free"
    [note] = [n for n in report.notes if "[full]" in n]
    assert "-8 slots unaccounted" in note and "8 listed more than once" in note
    assert "exactly SGLang's excess" in note


# --- `kvcanary leak`: SGLang's line and the dump its report left -------------------------------


def _insert(sglang: Any, built: Any, tokens: list[int], slots: torch.Tensor) -> None:
    """One node of SGLang's real tree holding `slots` for `tokens` (`UnifiedRadixCache.insert`,
    as a request's cache insert calls it)."""
    from array import array

    params = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache").InsertParams
    key = importlib.import_module("sglang.srt.mem_cache.radix_cache").RadixKey
    built.tree.insert(params(key=key(array("q", tokens)), value=slots.clone()))


def _leak_run(message: str, dump: Path) -> Any:
    result = CliRunner().invoke(cli_app, ["leak", message, str(dump), "-f", "json"])
    assert result.exit_code == 1, result.stderr
    record = json.loads(result.stdout)
    assert validate(record, RECORDS["kvcanary.leak/1"]) == []
    return record


def test_two_tree_nodes_sharing_a_page_are_sglangs_miscount_with_every_page_owned(
    sglang: Any, armed: Any
) -> None:
    """Two nodes of SGLang's real tree hold one page: its idle check sums the page twice
    (evictable counts node by node) and raises, though every page is free or the tree's.
    `kvcanary leak LINE DUMP` says nothing leaked and names the shared page."""
    page = 4
    built, ctx = _checker(sglang, page)
    zero, length = torch.tensor([0]), torch.tensor([12])
    slots = built.allocator.alloc_extend(zero, zero, length, length, torch.tensor([-1]), 12)
    _insert(sglang, built, list(range(1, 9)), slots[:8])
    _insert(sglang, built, list(range(100, 108)), slots[4:])  # the middle page in both
    with pytest.raises(ValueError, match="pool memory leak detected") as raised:
        _idle_check(ctx.checker)
    [path] = sorted(armed.dumps.glob("*.safetensors"))
    message = str(raised.value)

    alone = api.leak(message)
    assert alone.verdict == "undecided" and alone.cause is None
    assert [p.difference for p in alone.messages[0].pools] == [-page, -page]  # one page over

    record = _leak_run(message, path)
    assert record["verdict"] == "miscount" and record["cause"] == CauseCode.SGLANG_MISCOUNT
    full, swa = record["pools"]
    shared = int(slots[4]) // page
    assert full["verdict"] == "miscount" and full["shared_pages"] == [shared]
    assert full["leaked_pages"] == [] and full["double_freed_pages"] == []
    assert full["tree_listed_twice"] == page
    assert full["printed_difference"] == full["expected_difference"] == -page
    lut = built.allocator.full_to_swa_index_mapping
    assert swa["verdict"] == "miscount" and swa["leaked_pages"] == []
    assert swa["shared_pages"] == [int(lut[slots[4]]) // page]
    assert swa["printed_difference"] == swa["expected_difference"] == -page


def test_a_real_leak_is_named_by_its_pages(sglang: Any, armed: Any) -> None:
    """The twin: a row released without freeing its KV. The same command calls it a leak and
    lists the pages owned by nobody, exactly SGLang's shortfall."""
    page = 4
    built, ctx = _checker(sglang, page)
    _, slots = _leak_a_row(built, page, tokens=10)
    with pytest.raises(ValueError, match="pool memory leak detected") as raised:
        _idle_check(ctx.checker)
    [path] = sorted(armed.dumps.glob("*.safetensors"))
    record = _leak_run(str(raised.value), path)
    assert record["verdict"] == "leak" and record["cause"] == CauseCode.FULL_LEAK
    full, swa = record["pools"]
    assert full["leaked_pages"] == np.unique(slots // page).tolist()
    assert full["shared_pages"] == [] and full["double_freed_pages"] == []
    assert full["printed_difference"] == full["expected_difference"] == 12  # whole pages
    assert swa["verdict"] == "leak" and swa["printed_difference"] == swa["expected_difference"]


def test_a_mamba_double_free_at_the_idle_check_is_named_from_its_dump(
    sglang: Any, armed: Any
) -> None:
    """The Mamba layout through the leak trigger: a free Mamba slot freed again makes SGLang's
    idle count check report a leak (one slot too many available); the dump it leaves names
    the layout and carries the Mamba records, and `check` names the slot freed twice. The
    trigger knows no waiting queue, so no request's Mamba slot is recorded and the Mamba leak
    check says it did not run (a waiting request's copy-on-write slot is no leak)."""
    spec = soak_stack.StackSpec(full_tokens=FULL_TOKENS, max_reqs=8, layout="mamba")
    built = soak_stack.build_stack(sglang, spec)
    scheduler = SimpleNamespace(
        stack=built,
        last_batch=None,
        running=None,
        chunked_req=None,
        waiting=[],
        session_controller=SimpleNamespace(sessions={}),  # (no session opened)
    )
    # SGLang's checker as a Mamba model's scheduler builds it (is_hybrid_ssm); the stand-in
    # scheduler has what it reads
    checker = SGLangChecks(scheduler).checker  # type: ignore[arg-type]
    allocator = built.req_to_token_pool.mamba_allocator
    allocator.free(allocator.free_slots[:1].clone())  # slot 1 freed a second time
    with pytest.raises(ValueError, match=r"\[mamba\] total="):
        _idle_check(checker)
    [path] = sorted(armed.dumps.glob("*.safetensors"))
    dump = load_dump(path)
    assert dump.layout == "hybrid-mamba" and dump.metadata["kvcanary.trigger"] == "leak"
    assert dump.scalars["num_mamba_slots"].value == allocator.size + 1
    assert dump.req_index_to_mamba_index_mapping is not None and dump.req_mamba_slots is None
    report = checked(dump, kernel="vectorized")
    assert [f.code for f in report.findings] == [FindingCode.MAMBA_SLOT_FREED_TWICE]
    assert report.findings[0].details["mamba_slots"] == [1]
    status = {c.check: c.status for c in report.coverage}
    assert status["Mamba slots"] == "ran" and status["Mamba slot leaks"] == "not-run"


# --- the request pool's check: rows, not pages -------------------------------------------------


def _req_pool_check(checker: Any) -> str:
    """SGLang's `_check_req_pool` as the idle scheduler runs it; the message it raised."""
    with pytest.raises(ValueError, match="req_to_token_pool memory leak detected") as raised:
        checker._check_req_pool()
    return str(raised.value)


def test_a_row_never_given_back_is_named_by_leak_from_the_dump_sglangs_check_left(
    sglang: Any, armed: Any
) -> None:
    """A request's row taken from SGLang's request pool and never given back: its idle
    request-pool check counts one row short and raises; the capture's dump names the row."""
    built, ctx = _checker(sglang, 1)
    row = built.req_to_token_pool.alloc_rows(1)[0]  # SGLang's own allocation, never freed
    message = _req_pool_check(ctx.checker)
    [path] = sorted(armed.dumps.glob("*.safetensors"))
    record = _leak_run(message, path)
    assert (record["verdict"], record["cause"]) == ("leak", CauseCode.REQ_ROW_LEAK)
    rows = record["rows"]
    assert (rows["leaked_rows"], rows["leaked"], rows["twice"]) == ([row], 1, 0)
    assert rows["rows"] == built.req_to_token_pool.size and not rows["busy"]


def test_a_session_count_off_by_one_is_sglangs_miscount_with_every_row_owned(
    sglang: Any, armed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The twin: every row free, and SGLang's session count says one is kept (broken on
    purpose). Its check raises the same message shape; the dump says nothing leaked and
    which count is wrong."""
    built, ctx = _checker(sglang, 1)
    observer = ctx.checker.pool_stats_observer
    monkeypatch.setattr(type(observer), "session_held_req_count", lambda self: 1)
    message = _req_pool_check(ctx.checker)
    [path] = sorted(armed.dumps.glob("*.safetensors"))
    record = _leak_run(message, path)
    assert (record["verdict"], record["cause"]) == ("miscount", CauseCode.SGLANG_MISCOUNT)
    rows = record["rows"]
    assert (rows["leaked"], rows["twice"], rows["held"]) == (0, 0, 0)
    assert rows["free"] == built.req_to_token_pool.size
    assert "SGLang printed session_held 1, the dump's sessions hold 0 rows" in record["summary"]
