"""One story per fault (issue 45): end states where one event still read as two unrelated
causes. Each is a clean paged SWA state broken the way the event leaves it; the report must
name one top-level cause, the mechanism, with the other nested under it (`explained_by` in
the record, an `also shows` line in every view, one fix)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from kvcanary_cli.catalog import CauseCode
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.render.markdown.check import check_markdown
from kvcanary_cli.render.table.check import check_table
from kvcanary_cli.results.check import CheckReport, DumpReport
from kvcanary_cli.synth.scenarios import make_scenario
from kvcanary_cli.synth.state import LiveRequest, SynthDump
from tests.helpers import checked
from tests.render.record_schema import record_of

P = 4


def _base(seed: int) -> SynthDump:
    return make_scenario("clean-swa-paged", seed=seed, page_size=P)


def _lut(d: SynthDump) -> np.ndarray:
    lut: np.ndarray = d.tensors["full_to_swa_index_mapping"]
    return lut


def _page(n: int) -> np.ndarray:
    return n * P + np.arange(P, dtype=np.int64)


def _free_swa(d: SynthDump, *pages: int) -> None:
    """SWA pages back on the SWA free list (as the allocator keeps it: sorted)."""
    back = np.concatenate([_page(q) for q in pages])
    d.tensors["free_swa_slots"] = np.sort(np.r_[d.tensors["free_swa_slots"], back])


def _straddling(d: SynthDump, offset: int = 1) -> Iterator[tuple[LiveRequest, int, int]]:
    """(request, window start, full page) where the window starts at least `offset` slots
    into a fully mapped full page of the request."""
    window = int(d.metadata["swa_window_size"])
    lut = _lut(d)
    for lr in d.live:
        start = lr.prefix_len - window
        if start > 0 and start % P >= offset:
            page = int(lr.slots[start]) // P
            if (lut[_page(page)] > 0).all() and int(lr.slots[start - start % P]) == page * P:
                yield lr, start, page


def _window_pages(d: SynthDump, other_than: int = -1) -> Iterator[tuple[LiveRequest, int]]:
    """(request, full page) of fully mapped whole pages inside a request's window."""
    window = int(d.metadata["swa_window_size"])
    lut = _lut(d)
    for lr in d.live:
        if lr.batch_row == other_than:
            continue
        for pos in range(max(0, lr.prefix_len - window), lr.prefix_len - P + 1):
            if pos % P == 0 and (lut[_page(int(lr.slots[pos]) // P)] > 0).all():
                yield lr, int(lr.slots[pos]) // P


def _reissue(d: SynthDump, swa_page: int, other_than: int) -> None:
    """The allocator hands SWA page `swa_page` to another request's in-window full page (the
    page that request held before was never taken: it is free)."""
    _, page = next(_window_pages(d, other_than))
    lut = _lut(d)
    before = int(lut[page * P]) // P
    lut[_page(page)] = _page(swa_page)
    _free_swa(d, before)


def reissued_page_with_collision(seed: int) -> SynthDump:
    """A free cleared one token of a page straddling a live window's start and released the
    SWA page whole; it went to another request. The old page keeps an out-of-window token
    (a stale owner) and its in-window tokens (live: a collision) in the reissued page."""
    d = _base(seed)
    lr, _, page = next(_straddling(d, offset=2))
    swa_page = int(_lut(d)[page * P]) // P
    _lut(d)[page * P] = 0
    _reissue(d, swa_page, lr.batch_row)
    return d


def cleared_mapping_with_shared_owner(seed: int) -> SynthDump:
    """The eviction cleared the in-window tokens of a page straddling the window's start (it
    ran past the window's start) and released its SWA page whole; the page went to another
    request, and the page's out-of-window tokens still map into it."""
    d = _base(seed)
    lr, start, page = next(_straddling(d))
    swa_page = int(_lut(d)[page * P]) // P
    _lut(d)[_page(page)[start % P :]] = 0
    _reissue(d, swa_page, lr.batch_row)
    return d


def reserved_page_with_cleared_mapping(seed: int) -> SynthDump:
    """The reserved SWA page 0, freed, handed to a live in-window full page: its first token
    maps to SWA slot 0, which reads as unmapped (a mapping cleared in the window)."""
    d = _base(seed)
    _, page = next(_window_pages(d))
    before = int(_lut(d)[page * P]) // P
    _lut(d)[_page(page)] = np.arange(P)
    _free_swa(d, before)
    return d


def tombstone_freed_live_page_and_write(seed: int) -> SynthDump:
    """A tombstone freed two live in-window SWA pages of one request; this step's allocation
    took one of them for another request's write, the other is still free."""
    d = _base(seed)
    lut, loc = _lut(d), d.tensors["out_cache_loc"]
    rpi, extend = d.tensors["req_pool_indices"], d.tensors["extend_seq_lens"]
    writes = np.cumsum(np.where((rpi != 0) & (extend > 0), extend, 0))
    i = next(
        i
        for i in range(loc.size - P + 1)
        if int(loc[i]) % P == 0 and int(loc[i + P - 1]) == int(loc[i]) + P - 1
    )
    writer = int(np.searchsorted(writes, i, side="right"))
    by_row: dict[int, list[int]] = {}
    for lr, page in _window_pages(d, writer):
        by_row.setdefault(lr.batch_row, []).append(page)
    first, second = next(pages for pages in by_row.values() if len(pages) >= 2)[:2]
    taken, still_free = int(lut[first * P]) // P, int(lut[second * P]) // P
    before = int(lut[int(loc[i])]) // P
    lut[loc[i : i + P]] = _page(taken)
    _free_swa(d, still_free, before)
    return d


def partial_free_then_double_free(seed: int) -> SynthDump:
    """A partial-page free left half a free full page mapped into its SWA page, released
    whole; a later free of those stale tokens put the SWA page on the free list again."""
    d = make_scenario("partial-page-free", seed=seed, page_size=P)
    swa_page = d.truth["swa_slot"] // P
    d.tensors["free_swa_slots"] = np.r_[d.tensors["free_swa_slots"], _page(swa_page)]
    return d


#: end state -> (the mechanism, the cause it used to be listed beside)
STORIES: dict[Callable[[int], SynthDump], tuple[CauseCode, CauseCode]] = {
    reissued_page_with_collision: (CauseCode.SWA_PAGE_REISSUED, CauseCode.SWA_MAPPING_COLLISION),
    cleared_mapping_with_shared_owner: (
        CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW,
        CauseCode.SWA_SHARED_OWNER,
    ),
    reserved_page_with_cleared_mapping: (
        CauseCode.RESERVED_SLOT_FREED,
        CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW,
    ),
    tombstone_freed_live_page_and_write: (
        CauseCode.SWA_FREED_WHILE_LIVE,
        CauseCode.SWA_WRITE_INTO_LIVE_SLOT,
    ),
    partial_free_then_double_free: (CauseCode.PARTIAL_PAGE_FREE, CauseCode.DOUBLE_FREE),
}


def _check(d: SynthDump, path: Path) -> DumpReport:
    return checked(load_dump(d.save(path)), kernel="vectorized")


def _table_text(report: CheckReport) -> str:
    console = Console(file=io.StringIO(), record=True, width=120, color_system=None)
    console.print(check_table(report))
    return console.export_text()


@pytest.mark.parametrize("build", list(STORIES), ids=lambda b: b.__name__)
def test_one_event_is_one_top_level_cause_with_its_symptom_nested(
    build: Callable[[int], SynthDump], tmp_path: Path
) -> None:
    mechanism, symptom = STORIES[build]
    for seed in (0, 1):
        report = _check(build(seed), tmp_path / f"{build.__name__}-{seed}.safetensors")
        causes = {c.code: c for c in report.diagnosis}
        label = (seed, [(c.code.value, c.explained_by) for c in report.diagnosis])
        assert report.diagnosis[0].code is mechanism, label
        top = [c.code for c in report.diagnosis if c.explained_by is None]
        assert top == [mechanism], label
        nested = [c.code for c in report.diagnosis if c.explained_by is mechanism]
        assert nested, label
        if symptom in causes:  # the symptom that stood beside it now stands under it
            assert causes[symptom].explained_by is mechanism, label
        whole = CheckReport(dumps=(report,))
        record = record_of(whole)["dumps"][0]
        by_code = {c["cause"]: c for c in record["diagnosis"]}
        assert by_code[mechanism.value]["explained_by"] is None
        for code in nested:
            assert by_code[code.value]["explained_by"] == mechanism.value
            also = " ".join(by_code[mechanism.value]["also_shows"])
            assert f"({code.value}:" in also, also
            assert code.value in by_code[mechanism.value]["nests"]
        text = _table_text(whole)
        assert text.count("fix:") == 1 and "also shows" in text, text
        markdown = check_markdown(whole)
        assert markdown.count("**fix:**") == 1 and "also shows" in markdown
