"""Texts that contradicted their evidence (issue 45): a free that released its SWA slot is
not one that "skipped the SWA side", a mapping dropped without a free is not "freed", a fix
for page 0 freed twice must not hide the second free, and where one end state has two
mechanisms the cause names both with what would tell them apart."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvcanary_cli.catalog import CauseCode, FindingCode
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.results.check import DumpReport
from kvcanary_cli.synth.scenarios import make_scenario
from kvcanary_cli.synth.state import SynthDump
from tests.helpers import checked

P = 4


def _check(d: SynthDump, path: Path) -> DumpReport:
    return checked(load_dump(d.save(path)), kernel="vectorized")


def _still_mapped(report: DumpReport) -> str:
    [f] = [f for f in report.findings if f.code is FindingCode.FREE_SLOT_STILL_MAPPED]
    return f.message


def test_a_free_that_released_its_swa_slot_did_not_skip_the_swa_side(tmp_path: Path) -> None:
    d = make_scenario("stale-swa-mapping", seed=0, page_size=P)  # the SWA page is free
    message = _still_mapped(_check(d, tmp_path / "free.safetensors"))
    assert "skipped" not in message and "released the SWA slots" in message, message
    # the SWA page handed out again: a live in-window page of a request maps into it
    swa_page = d.truth["swa_slot"] // P
    lut = d.tensors["full_to_swa_index_mapping"]
    window = int(d.metadata["swa_window_size"])
    lr = next(lr for lr in d.live if lr.prefix_len >= window + P)
    start = (lr.prefix_len - window + P - 1) // P * P
    page = int(lr.slots[start]) // P
    before = int(lut[page * P]) // P
    lut[page * P + np.arange(P)] = swa_page * P + np.arange(P)
    free = d.tensors["free_swa_slots"]
    free = free[free // P != swa_page]
    d.tensors["free_swa_slots"] = np.sort(np.r_[free, before * P + np.arange(P)])
    message = _still_mapped(_check(d, tmp_path / "reissued.safetensors"))
    assert "skipped" not in message and "handed out again" in message, message


def test_a_free_that_kept_its_swa_page_skipped_the_swa_side(tmp_path: Path) -> None:
    d = make_scenario("stale-swa-mapping", seed=0, page_size=P)
    swa_page = d.truth["swa_slot"] // P
    free = d.tensors["free_swa_slots"]
    d.tensors["free_swa_slots"] = free[free // P != swa_page]  # neither free nor reissued
    message = _still_mapped(_check(d, tmp_path / "kept.safetensors"))
    assert "skipped the SWA side" in message, message


def test_page_zero_freed_twice_is_not_fixed_by_hiding_the_second_free(tmp_path: Path) -> None:
    d = make_scenario("reserved-swa-page-freed-twice", seed=0, page_size=P)
    first = _check(d, tmp_path / "d.safetensors").diagnosis[0]
    assert first.code is CauseCode.RESERVED_SLOT_FREED
    assert "filter slot 0 before" not in first.fix, first.fix
    assert "second free" in first.fix, first.fix


def test_a_mapping_dropped_without_a_free_is_not_told_as_freed(tmp_path: Path) -> None:
    """A clear of in-window entries whose SWA page leaked: the headline says cleared, and the
    fix names both mechanisms that leave it, each with what would decide."""
    d = make_scenario("clean-swa-paged", seed=0, page_size=P)
    lut = d.tensors["full_to_swa_index_mapping"]
    window = int(d.metadata["swa_window_size"])
    lr = next(lr for lr in d.live if lr.prefix_len > window + 8)
    page = int(lr.slots[lr.prefix_len - 5]) // P
    lut[page * P + np.arange(P)] = 0  # cleared, the SWA page never freed
    report = _check(d, tmp_path / "d.safetensors")
    first = report.diagnosis[0]
    assert first.code is CauseCode.SWA_MAPPING_CLEARED_IN_WINDOW
    assert any("dropped without a free" in line for line in first.also_shows), first.also_shows
    assert "freed" not in first.summary, first.summary
    assert first.headline and "freed" not in first.headline, first.headline
    unmapped = [f for f in report.findings if f.code is FindingCode.SWA_UNMAPPED_IN_WINDOW]
    assert unmapped and all("freed" not in f.message for f in unmapped), unmapped[0].message
    assert "timeline" in first.fix and "tree" in first.fix, first.fix


def test_a_cleared_boundary_page_names_both_mechanisms(tmp_path: Path) -> None:
    d = make_scenario("swa-boundary-page-cleared", seed=0, page_size=P)
    evidence = " ".join(_check(d, tmp_path / "d.safetensors").diagnosis[0].evidence)
    assert "a page two nodes share" in evidence and "one page past the window" in evidence
    assert "snapshot one step earlier" in evidence, evidence


def test_a_slot_live_in_two_requests_names_the_evicted_locked_node(tmp_path: Path) -> None:
    """A node a running request locks, evicted and its slots handed to another request,
    leaves the same end state as a slot copied between requests: the fix names both, with
    what decides (the tree's locks, a timeline), not only "prefix-cache match, reuse"."""
    d = make_scenario("cross-request-aliasing", seed=0)
    first = _check(d, tmp_path / "d.safetensors").diagnosis[0]
    assert first.code is CauseCode.CROSS_REQUEST_ALIASING
    assert "evict" in first.fix and "lock" in first.fix, first.fix
    assert "copied" in first.fix and "timeline" in first.fix, first.fix


def _not_cleared(tmp_path: Path, *, in_window: bool) -> DumpReport:
    """Two full pages of a live request map to SWA pages on the SWA free list: out of the
    window (a window free that released the SWA pages and left the LUT entries) or in it."""
    d = make_scenario("clean-swa-paged", seed=0, page_size=P)
    lut = d.tensors["full_to_swa_index_mapping"]
    window = int(d.metadata["swa_window_size"])
    lr = next(lr for lr in d.live if lr.prefix_len > window + 3 * P)
    start = lr.prefix_len - window
    cells = lr.slots[start + P : lr.prefix_len] if in_window else lr.slots[: start - P]
    pages = sorted({int(s) // P for s in cells})[:2]
    free = d.tensors["free_swa_slots"]
    free_pages = sorted({int(s) // P for s in free if s > 0})[-2:]
    for full, swa in zip(pages, free_pages, strict=True):
        lut[full * P + np.arange(P)] = swa * P + np.arange(P)
    return _check(d, tmp_path / f"{'in' if in_window else 'out'}.safetensors")


def test_a_mapping_not_cleared_on_a_window_free_is_a_stale_mapping(tmp_path: Path) -> None:
    """SGLang's free_swa without its LUT clear: cells outside the window keep entries into
    the SWA pages the window free released. Their KV is never read; the fault is the entry
    left behind, so the cause says stale mapping (was: swa-freed-while-live only)."""
    report = _not_cleared(tmp_path, in_window=False)
    first = report.diagnosis[0]
    assert first.code is CauseCode.STALE_SWA_MAPPING, [c.code for c in report.diagnosis]
    said = " ".join(first.evidence)
    assert "outside the window" in said and "not cleared" in said, said
    assert CauseCode.SWA_FREED_WHILE_LIVE not in {c.code for c in report.diagnosis}
    # the clean twin of the reading: inside the window it is a free while live
    inside = _not_cleared(tmp_path, in_window=True)
    assert inside.diagnosis[0].code is CauseCode.SWA_FREED_WHILE_LIVE
