"""Clean states from SGLang 0.5.23's own allocator: a hunt for false alarms.

Random serving histories (tests/allocator_histories.py) drive the wheel's real
`SWATokenToKVPoolAllocator`, `PagedTokenToKVPoolAllocator` and `TokenToKVPoolAllocator` on CPU
(tests/sglang_allocator.py), and every state is dumped from their real LUT and free lists.
Each state passes SGLang's own memory accounting (the driver checks it before dumping), so
any finding kvcanary raises on one is a false alarm. Skipped without the cached wheel.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvcanary_cli.analysis.check import run_check
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.results.check import DumpReport
from tests.allocator_histories import HistoryDump, HistorySpec, run_history, run_history_states
from tests.helpers import VECTORIZED
from tests.lanes import DEEP
from tests.sglang_allocator import SGLangAllocators, extract_allocators, load_allocators
from tests.sglang_standin import forget_sglang
from tests.sglang_wheel import MISSING_WHEEL, wheel_path

WHEEL = wheel_path()

pytestmark = pytest.mark.skipif(WHEEL is None, reason=MISSING_WHEEL)

#: Page sizes 1 and 4; full-only (window 0) and SWA windows below, at and off a page multiple;
#: with a radix cache (prefix sharing, tombstones) and without one.
SPECS = [
    HistorySpec(page_size=page_size, window=window, radix=radix)
    for page_size in (1, 4)
    for window in (0, 3, 8, 13)
    for radix in (True, False)
]
SEEDS_PER_SPEC = 30
#: The short runs: one seed each of page sizes 1 and 4, full-only and SWA, radix or not.
SHORT = [(spec, 1000 + index) for index, spec in enumerate(SPECS) if spec.window in (0, 8)]


def _spec_id(spec: HistorySpec) -> str:
    cache = "radix" if spec.radix else "nocache"
    return f"page{spec.page_size}-window{spec.window}-{cache}"


@pytest.fixture(scope="module")
def allocators(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangAllocators]:
    """The wheel's allocator classes, imported from a temporary tree."""
    assert WHEEL is not None
    root = extract_allocators(WHEEL, tmp_path_factory.mktemp("sglang-allocator"))
    yield load_allocators(root)
    forget_sglang()


def _check(state: HistoryDump, folder: Path) -> DumpReport:
    path = state.save(folder / f"{_spec_id(state.spec)}-seed{state.seed}.safetensors")
    return run_check(load_dump(path), planner=VECTORIZED, kernel=None)


def _assert_clean(state: HistoryDump, folder: Path) -> None:
    """No finding on the state, with `held_full_slots` recorded and without it (the leak
    accounting then counts every full slot off the free list as held)."""
    unrecorded = replace(
        state, tensors={k: v for k, v in state.tensors.items() if k != "held_full_slots"}
    )
    for dump in (state, unrecorded):
        report = _check(dump, folder)
        found = [
            f"{f.code.value} ({f.group.value}) row {f.pool_row} pos {f.position} slot "
            f"{f.slot}: {f.message}"
            for f in report.findings
        ]
        assert not found, f"false alarm on {state.metadata['note']}:\n" + "\n".join(found)


@pytest.mark.parametrize(("spec", "seed"), SHORT, ids=[_spec_id(s) for s, _ in SHORT])
def test_a_history_of_sglangs_allocator_is_clean(
    allocators: SGLangAllocators, spec: HistorySpec, seed: int, tmp_path: Path
) -> None:
    _assert_clean(run_history(allocators, spec, seed), tmp_path)


#: Seeds a spec runs in the suite; the deep lane runs the rest of `SEEDS_PER_SPEC`.
SUITE_SEEDS = 5


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "seeds"),
    [
        case
        for spec in SPECS
        for case in (
            pytest.param(spec, range(SUITE_SEEDS), id=_spec_id(spec)),
            pytest.param(
                spec, range(SUITE_SEEDS, SEEDS_PER_SPEC), id=f"{_spec_id(spec)}-more", marks=DEEP
            ),
        )
    ],
)
def test_histories_of_sglangs_allocator_are_clean(
    allocators: SGLangAllocators, spec: HistorySpec, seeds: range, tmp_path: Path
) -> None:
    for seed in seeds:
        _assert_clean(run_history(allocators, spec, seed), tmp_path)


def _a_live_cell(state: HistoryDump) -> int:
    """A full slot one of the step's batch rows verifies: the last cell of its prefix, which
    is inside the SWA window too."""
    table = state.tensors["req_to_token"]
    row, prefix = next((row, prefix) for row, prefix in state.live_rows if prefix > 0)
    return int(table[row, prefix - 1])


@pytest.mark.parametrize("group", ["full", "swa"])
def test_a_double_free_in_a_history_is_found(
    allocators: SGLangAllocators, group: str, tmp_path: Path
) -> None:
    """The hunt can fail: a live slot put back on a free list (a double free) in a clean
    state is reported as a use after free, at that slot, in that pool."""
    state = run_history(allocators, HistorySpec(page_size=4, window=8, radix=True), 7)
    slot = _a_live_cell(state)
    if group == "swa":
        slot = int(state.tensors["full_to_swa_index_mapping"][slot])
        assert slot > 0
    name = f"free_{group}_slots"
    state.tensors[name] = np.append(state.tensors[name], np.int64(slot))
    report = _check(state, tmp_path)
    found = {(f.code.value, f.group.value, f.slot) for f in report.findings}
    assert ("freed-slot-in-live-range", group, slot) in found, found


@pytest.mark.parametrize("page_size", [1, 4])
def test_faults_replayed_on_sglangs_allocator_state_name_their_mechanism(
    allocators: SGLangAllocators, page_size: int, tmp_path: Path
) -> None:
    """The audit on the real allocator's state: a page freed twice, a full page freed with
    part of its LUT entries left (SGLang PR #27779) or all of them, a live page's mapping
    replaced by a page then freed (PR #36135), an SWA page unmapped but never freed (issue
    #27789); each reported under its own cause, first."""
    spec = HistorySpec(page_size=page_size, window=8, radix=True)
    state = run_history(allocators, spec, 3)
    lut = state.tensors["full_to_swa_index_mapping"]
    free_full = state.tensors["free_full_slots"]
    free_swa = state.tensors["free_swa_slots"]
    held = state.tensors["held_full_slots"]

    headlines: dict[str, str] = {}

    def first_cause(tensors: dict[str, np.ndarray]) -> str:
        broken = HistoryDump(
            spec=state.spec,
            seed=state.seed,
            tensors={**state.tensors, **tensors},
            metadata=state.metadata,
            live_rows=state.live_rows,
        )
        first = _check(broken, tmp_path).diagnosis[0]
        headlines[first.code.value] = first.headline or ""
        return first.code.value

    def slots(values: np.ndarray) -> str:  # as a headline names a run of slots
        lo, hi = int(values.min()), int(values.max())
        return f"slot {lo}" if lo == hi else f"slots {lo}..{hi}"

    page = free_full[:page_size]  # the first free page, whole
    assert first_cause({"free_full_slots": np.concatenate([free_full, page])}) == "double-free"
    assert f"full {slots(page)}" in headlines["double-free"], headlines
    stale = lut.copy()
    stale[page[0]] = free_swa[0]  # a token of a free page still maps into a free SWA page
    partial = "partial-page-free" if page_size > 1 else "stale-swa-mapping"
    assert first_cause({"full_to_swa_index_mapping": stale}) == partial
    if page_size > 1:  # the page, how much of it still maps, and into which SWA page
        said = headlines[partial]
        assert f"full page {int(page[0]) // page_size} ({slots(page)})" in said, said
        assert (
            f"1 of its {page_size} still maps into SWA page {int(free_swa[0]) // page_size}" in said
        )
    stale[page] = free_swa[:page_size]  # the whole page: a mapping kept, not a page cut
    assert first_cause({"full_to_swa_index_mapping": stale}) == "stale-swa-mapping"
    assert f"full {slots(page)}" in headlines["stale-swa-mapping"], headlines
    # SGLang PR #36135: a live page's mapping replaced by a page that then went back free
    live = _a_live_cell(state) // page_size * page_size + np.arange(page_size)
    live = live[lut[live] > 0]
    replaced = lut.copy()
    replaced[live] = free_swa[:page_size][live % page_size]
    assert first_cause({"full_to_swa_index_mapping": replaced}) == "swa-freed-while-live"
    table = state.tensors["req_to_token"]
    row = next(r for r, _ in state.live_rows if np.isin(live, table[r]).any())
    said = headlines["swa-freed-while-live"]
    assert f"SWA {slots(free_swa[:page_size][live % page_size])}" in said, said
    assert f"pool row {row}" in said, said
    # an SWA page mapped only from held full slots no batch row reads in its window
    table = state.tensors["req_to_token"]
    windows = np.concatenate(
        [
            table[row, max(0, prefix - spec.window - page_size) : prefix + 1]
            for row, prefix in state.live_rows
        ]
    )
    pages = lut[held[lut[held] > 0]] // page_size
    read = set((lut[windows[windows > 0]] // page_size).tolist())
    quiet = [int(x) for x in pages if int(x) not in read and x > 0]
    if not quiet:
        pytest.skip("every mapped SWA page is read by the batch in this history")
    leaked = lut.copy()
    leaked[(lut // page_size == quiet[0]) & (lut > 0)] = 0  # unmapped, never freed
    assert first_cause({"full_to_swa_index_mapping": leaked}) == "swa-leak"
    where = f"SWA page {quiet[0]} " if page_size > 1 else f"SWA slot {quiet[0]} "
    assert headlines["swa-leak"].startswith(where), headlines


@pytest.mark.parametrize(("spec", "seed"), SHORT, ids=[_spec_id(s) for s, _ in SHORT])
def test_a_timeline_of_sglangs_allocator_reports_no_rewritten_prefix(
    allocators: SGLangAllocators, spec: HistorySpec, seed: int, tmp_path: Path
) -> None:
    """Consecutive states of SGLang's own allocator (radix reuse of cached prefixes, rows
    handed back and reused, SWA eviction): a live request's written cells never change, so
    the timeline names no `prefix-rewritten` (issue 35, part 5: its false-alarm hunt)."""
    from kvcanary_cli.analysis.timeline import timeline
    from kvcanary_cli.catalog import EventKind

    states = run_history_states(allocators, spec, seed, 8)
    paths = [s.save(tmp_path / f"step{i}.safetensors") for i, s in enumerate(states)]
    report = timeline(paths, planner=None)
    rewritten = [e.message for e in report.events if e.kind is EventKind.PREFIX_REWRITTEN]
    assert not rewritten, rewritten
    assert sum(len(i.grew) for i in report.intervals) > 0  # requests ran on through it
