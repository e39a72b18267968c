"""`timeline` against sequences with a planted event (synth/sequence.py): each event class is
named with its slot or page and the steps it happened between, on three seeds and on other
page sizes and dump spacings; every clean twin reports nothing; shrunk dumps tell the same
story (but the leak, which a shrunk dump cannot account); the dumps are read one at a time;
a mix of ranks, shapes or steps is refused."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import kvcanary_cli.analysis.timeline as timeline_module
from kvcanary_cli import api
from kvcanary_cli.analysis.bookkeeping import leaked_swa_pages
from kvcanary_cli.analysis.check import run_check
from kvcanary_cli.analysis.timeline import timeline
from kvcanary_cli.catalog import EventKind, FindingCode
from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.dump.writer import dump_contents, write_dump
from kvcanary_cli.errors import DumpError, OptionError
from kvcanary_cli.planners import PlannerChoice, make_planner
from kvcanary_cli.results.cells import Space
from kvcanary_cli.results.timeline import TimelineReport
from kvcanary_cli.synth.sequence import (
    EVENTS,
    PLANTED_KEY,
    SEQUENCES,
    synth_sequence,
    twin_of,
    write_sequence,
)
from tests.lanes import DEEP

PLANNER = make_planner(PlannerChoice.VECTORIZED)
SEEDS = (0, 1, 2)
#: (steps, every, page size, at, size): the default spacing, and sparser dumps with pages.
SHAPES = [(6, 1, 1, None, "tiny"), (5, 3, 4, 7, "tiny"), (4, 2, 16, 5, "small")]


def _write(tmp_path: Path, name: str, seed: int, shape: tuple[Any, ...]) -> list[Path]:
    steps, every, page, at, size = shape
    folder = tmp_path / f"{name}-{seed}-{steps}-{every}-{page}"
    return write_sequence(
        name, folder, steps=steps, seed=seed, every=every, page_size=page, at=at, size=size
    )


def _truth(paths: list[Path]) -> dict[str, Any]:
    truth: dict[str, Any] = json.loads(load_dump(paths[-1]).metadata[PLANTED_KEY])
    return truth


def _assert_names_the_event(report: TimelineReport, truth: dict[str, Any]) -> None:
    assert [e.kind for e in report.events] == [EventKind(truth["event"])], report.events
    event = report.events[0]
    assert (event.after_step, event.at_step) == (truth["after_step"], truth["at_step"])
    assert event.to_dump == truth["dump"]
    named = set(np.asarray(event.cells.slot).tolist())
    if event.kind is EventKind.SWA_LEAK:
        assert truth["pages"][0] in event.pages and set(event.pages) <= set(truth["pages"])
    else:  # the planted slots, and only those
        assert named and named <= set(truth["slots"])
        assert set(event.pages) == set(truth["pages"])
        assert event.space is Space.FULL


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "steps{}-every{}-page{}-at{}-{}".format(*s))
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", EVENTS)
def test_each_planted_event_is_named_with_its_slot_and_steps(
    tmp_path: Path, name: str, seed: int, shape: tuple[Any, ...]
) -> None:
    paths = _write(tmp_path, name, seed, shape)
    truth = _truth(paths)
    report = timeline(paths, planner=PLANNER)
    _assert_names_the_event(report, truth)
    assert report.failed
    # its twin runs the same loop without the plant: nothing at all
    twin = timeline(_write(tmp_path, twin_of(name), seed, shape), planner=PLANNER)
    assert twin.events == () and not twin.failed
    assert twin.findings == () and all(d.worst is None for d in twin.dumps)


@pytest.mark.parametrize("name", EVENTS)
def test_the_event_ties_to_the_findings_and_cause_of_its_dump(tmp_path: Path, name: str) -> None:
    paths = _write(tmp_path, name, 0, SHAPES[0])
    event = timeline(paths, planner=PLANNER).events[0]
    expected = {
        "use-after-free": ({FindingCode.FREED_SLOT_IN_LIVE_RANGE}, "use-after-free"),
        "swa-leak": ({FindingCode.SWA_PAGE_LEAKED}, "swa-leak"),
        # a mapping moved page and all: no single dump shows anything
        "lut-rewritten": (set(), "swa-mapping-rewritten"),
        # a page swapped in the row, the old one orphaned: every dump is clean on its own
        "prefix-rewritten": (set(), "radix-prefix-broken"),
    }
    if name in expected:
        codes, cause = expected[name]
        assert set(event.findings) == codes and event.cause == cause
    else:  # the newcomer's prefill writes into the victim's slot: check names that
        assert FindingCode.SLOT_SHARED_ACROSS_POSITIONS in event.findings


def test_the_leak_is_one_event_that_says_how_it_grows(tmp_path: Path) -> None:
    paths = write_sequence("swa-leak", tmp_path, steps=7, at=3)
    report = timeline(paths, planner=PLANNER)
    truth = _truth(paths)
    (event,) = report.events
    assert list(event.pages) == sorted(truth["pages"])
    assert "+1 page per step" in event.message  # not "+1 pages"
    leaked = [d.leaked_swa_pages for d in report.dumps]
    assert leaked == [0, 0] + list(range(1, 6))
    assert [i.leak_per_step for i in report.intervals] == [0.0] + [1.0] * 5
    assert [len(i.leak_new) for i in report.intervals] == [0] + [1] * 5


def test_each_dump_counts_its_swa_leaks_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`check` and the timeline's snapshot of one dump share its SWA leak count (a scan of the
    whole LUT): a timeline of N dumps works it out N times, not 2N. The pages come back
    read-only (two readers share them); a dump `replace` makes counts its own."""
    from collections import Counter
    from dataclasses import replace

    from kvcanary_cli.analysis import bookkeeping

    paths = write_sequence("swa-leak", tmp_path, steps=4, at=2)
    counted: Counter[Path] = Counter()
    real = bookkeeping._leaked_swa_pages

    def counting(
        dump: KvDump, mapped: tuple[np.ndarray, np.ndarray] | None
    ) -> tuple[np.ndarray | None, str | None]:
        counted[dump.path] += 1
        return real(dump, mapped)

    monkeypatch.setattr(bookkeeping, "_leaked_swa_pages", counting)
    report = timeline(paths, planner=PLANNER)
    assert [e.kind for e in report.events] == [EventKind.SWA_LEAK]
    assert dict(counted) == dict.fromkeys(paths, 1)
    dump = load_dump(paths[-1])
    pages, _ = leaked_swa_pages(dump)
    assert pages is not None and pages.size and not pages.flags.writeable
    assert leaked_swa_pages(dump)[0] is pages and counted[paths[-1]] == 2
    again, _ = leaked_swa_pages(replace(dump, free_swa_slots=np.zeros(0, dtype=np.int64)))
    assert counted[paths[-1]] == 3 and again is not None and again.size > pages.size


@pytest.mark.parametrize("name", [*EVENTS, "clean", "clean-swa"])
def test_leak_accounting_agrees_with_check(tmp_path: Path, name: str) -> None:
    """Two implementations of SGLang's memory check: the timeline's and check's finding."""
    for path in write_sequence(name, tmp_path, steps=5, page_size=4):
        dump = load_dump(path)
        pages, note = leaked_swa_pages(dump)
        found = [
            f  # a dump of its own: one dump works its leaks out once, for both
            for f in run_check(load_dump(path), planner=PLANNER, kernel=None).findings
            if f.code is FindingCode.SWA_PAGE_LEAKED
        ]
        if dump.full_to_swa_index_mapping is None:
            assert pages is None and note is None and not found
            continue
        assert pages is not None and note is None
        checked = found[0].cells.extra["page"].tolist() if found and found[0].cells else []
        assert pages.tolist() == checked


@pytest.mark.parametrize("name", SEQUENCES)
def test_shrunk_dumps_tell_the_same_story(tmp_path: Path, name: str) -> None:
    paths = write_sequence(name, tmp_path / "full", steps=5, seed=1)
    small = []
    for path in paths:
        api.shrink(path, tmp_path / f"small-{path.name}")
        small.append(tmp_path / f"small-{path.name}")
    full, shrunk = timeline(paths, planner=PLANNER), timeline(small, planner=PLANNER)
    assert all(d.shrunk for d in shrunk.dumps)
    assert [(i.born, i.grew, i.finished, i.reused) for i in shrunk.intervals] == [
        (i.born, i.grew, i.finished, i.reused) for i in full.intervals
    ]
    if name == "swa-leak":  # a shrunk dump does not account leaks, and says so
        assert shrunk.events == () and all(d.leaked_swa_pages is None for d in shrunk.dumps)
        assert any("SWA leaks not accounted" in n for n in shrunk.notes)
        return
    if name == "prefix-rewritten":  # nor what is held: the orphaned old page is not proved
        # orphaned, and the rewrite is a note (issue 43), dated as the event was
        (event,) = full.events
        assert shrunk.events == () and not shrunk.failed
        (note,) = [n for n in shrunk.notes if "tree_full_slots" in n]
        size = event.cells.slot.size  # type: ignore[union-attr]
        assert note.startswith(f"{size} written cell{'' if size == 1 else 's'} ")
        assert f"between dumps {event.from_dump} and {event.to_dump}" in note
        return
    strip = [(e.kind, e.after_step, e.at_step, e.cells.slot.tolist()) for e in full.events]  # type: ignore[union-attr]
    assert [
        (e.kind, e.after_step, e.at_step, e.cells.slot.tolist())  # type: ignore[union-attr]
        for e in shrunk.events
    ] == strip


def test_requests_born_grown_finished_and_rows_reused(tmp_path: Path) -> None:
    paths = write_sequence("clean", tmp_path, steps=8, seed=3)
    report = timeline(paths, planner=None)
    assert not report.checked and report.findings == ()
    for interval, (a, b) in zip(
        report.intervals, zip(report.dumps, report.dumps[1:], strict=False), strict=True
    ):
        # every request of the older dump grew, finished, or lost its row to another
        assert len(interval.grew) + interval.unchanged + len(interval.finished) + len(
            interval.reused
        ) >= a.requests - len(interval.reused)
        assert (
            len(interval.grew)
            + interval.unchanged
            + len(interval.born)
            + len(interval.reused)
            + len(interval.resumed)
            == b.requests
        )
        assert interval.tokens_added == len(interval.grew)  # a decode token each
    assert any(i.born for i in report.intervals) and any(i.reused for i in report.intervals)


def test_a_request_missing_from_one_batch_is_resumed_not_born(tmp_path: Path) -> None:
    """A prefill-only step leaves the running requests out of its batch: they come back."""
    paths = write_sequence("clean", tmp_path, steps=3, seed=0)
    middle = load_dump(paths[1])
    contents = dump_contents(
        middle.metadata,
        {
            "req_to_token": middle.req_to_token.array(),
            "req_pool_indices": middle.req_pool_indices[:1],
            "prefix_lens": middle.prefix_lens[:1],
            "extend_seq_lens": middle.extend_seq_lens[:1],
            "free_full_slots": middle.free_full_slots,
        },
    )
    write_dump(paths[1], contents)
    kept = int(middle.req_pool_indices[0])
    del middle
    report = timeline(paths, planner=PLANNER)
    first, second = report.intervals
    assert set(second.resumed) == set(first.finished) and kept not in first.finished
    assert second.born == () and report.events == ()


def test_slot_history_follows_the_owners(tmp_path: Path) -> None:
    paths = write_sequence("double-allocation", tmp_path, steps=5, seed=2)
    truth = _truth(paths)
    slot = truth["slots"][0]
    report = timeline(paths, planner=None, focus=(slot, Space.FULL))
    assert report.slot is not None
    states = [m.state for m in report.slot.moments]
    shown = truth["dump"]
    assert states[:shown] == ["held"] * shown and states[shown:] == ["held twice"] * (5 - shown)
    owners = {(o.pool_row, o.position) for o in report.slot.moments[-1].owners}
    assert owners == {
        (truth["pool_row"], truth["positions"][0]),
        (truth["other_pool_row"], truth["other_positions"][0]),
    }
    assert [e.kind for e in report.events] == [EventKind.DOUBLE_ALLOCATION]
    # a slot no event touches: held, then gone or back on the free list; no event listed
    other = timeline(paths, planner=None, focus=(slot + 1, Space.FULL))
    assert other.events == ()


def test_swa_slot_history(tmp_path: Path) -> None:
    paths = write_sequence("lut-rewritten", tmp_path, steps=4, seed=0)
    truth = _truth(paths)
    report = timeline(paths, planner=None, focus=(truth["new_swa_page"], Space.SWA))
    assert report.slot is not None and [e.kind for e in report.events] == [EventKind.LUT_REWRITTEN]
    moments = report.slot.moments
    assert moments[truth["dump"]].owners[0].full_slot == truth["slots"][0]
    with pytest.raises(OptionError, match="no LUT"):
        timeline(
            write_sequence("clean", tmp_path / "full", steps=2), planner=None, focus=(1, Space.SWA)
        )


def test_the_dumps_are_read_one_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most one dump is loaded at a time (memory: two dumps' live cells, one table's
    pages); freed by reference counting alone, as soon as its snapshot is taken."""
    loaded: list[weakref.ref[KvDump]] = []

    def load(path: Path, **kwargs: Any) -> KvDump:
        assert all(ref() is None for ref in loaded)
        dump = load_dump(path, **kwargs)
        loaded.append(weakref.ref(dump))
        return dump

    monkeypatch.setattr(timeline_module, "load_dump", load)
    gc.disable()
    try:
        timeline(write_sequence("swa-leak", tmp_path, steps=5), planner=PLANNER)
    finally:
        gc.enable()
    assert len(loaded) == 5


# --- refusals ------------------------------------------------------------------------------


def _rewrite(path: Path, **metadata: str | None) -> None:
    dump = load_dump(path)
    meta = {k: v for k, v in dump.metadata.items() if k not in metadata}
    meta.update({k: v for k, v in metadata.items() if v is not None})
    tensors = {
        "req_to_token": dump.req_to_token.array(),
        "req_pool_indices": dump.req_pool_indices,
        "prefix_lens": dump.prefix_lens,
        "extend_seq_lens": dump.extend_seq_lens,
    }
    del dump
    write_dump(path, dump_contents(meta, tensors))


@pytest.fixture
def three(tmp_path: Path) -> list[Path]:
    return write_sequence("clean", tmp_path, steps=3)


def test_a_mix_of_ranks_is_refused(three: list[Path]) -> None:
    _rewrite(three[1], rank="1")
    with pytest.raises(DumpError, match="records rank '1', .* rank '0': a timeline reads one rank"):
        timeline(three, planner=None)


def test_a_mix_of_shapes_is_refused(three: list[Path], tmp_path: Path) -> None:
    other = write_sequence("clean", tmp_path / "small", steps=2, size="small")
    _rewrite(other[0], step="9")
    with pytest.raises(DumpError, match=r"req_to_token: is \[64, 512\], .*'s is \[12, 64\]"):
        timeline([*three, other[0]], planner=None)
    paged = write_sequence("clean", tmp_path / "paged", steps=2, page_size=2)
    _rewrite(paged[0], step="9")
    with pytest.raises(DumpError, match="page_size: is 2, .*'s is 1"):
        timeline([*three, paged[0]], planner=None)


def test_steps_must_order_the_dumps(three: list[Path]) -> None:
    with pytest.raises(DumpError, match="two dumps of one step"):
        timeline([three[0], three[1], three[1]], planner=None)
    with pytest.raises(DumpError, match="give the older dump first"):
        timeline([three[1], three[0]], planner=None, keep_order=True)
    shuffled = timeline([three[2], three[0], three[1]], planner=None)
    assert [d.step for d in shuffled.dumps] == [1, 2, 3]
    _rewrite(three[1], step=None)
    with pytest.raises(DumpError, match="records no step"):
        timeline(three, planner=None)
    _rewrite(three[1], step="two")
    with pytest.raises(DumpError, match="not an integer"):
        timeline(three, planner=None)
    with pytest.raises(OptionError, match="two dumps or more"):
        api.timeline(three[:1], check=False)


def test_dumps_without_steps_are_read_as_given(three: list[Path]) -> None:
    for path in three:
        _rewrite(path, step=None, rank=None)
    report = timeline([three[0], three[2]], planner=None)
    assert [d.step for d in report.dumps] == [None, None] and report.rank is None
    assert any("no dump records its step" in n for n in report.notes)
    assert report.intervals[0].after_step is None


# --- properties ----------------------------------------------------------------------------


@settings(max_examples=12)
@given(
    name=st.sampled_from(["clean", "clean-swa"]),
    seed=st.integers(0, 10_000),
    every=st.integers(1, 4),
    page=st.sampled_from([1, 2, 4, 8]),
    size=st.sampled_from(["tiny", "small"]),
)
def test_clean_sequences_never_report_an_event(
    tmp_path_factory: pytest.TempPathFactory, name: str, seed: int, every: int, page: int, size: str
) -> None:
    folder = tmp_path_factory.mktemp("clean")
    paths = write_sequence(name, folder, steps=4, seed=seed, every=every, page_size=page, size=size)
    report = timeline(paths, planner=PLANNER)
    assert report.events == () and report.findings == () and not report.failed


@settings(max_examples=10)
@given(seed=st.integers(0, 10_000), shuffle=st.integers(0, 2**32 - 1))
@example(seed=1737, shuffle=0)  # a newcomer shared every complete page of the victim's
def test_the_batch_order_does_not_matter(
    tmp_path_factory: pytest.TempPathFactory, seed: int, shuffle: int
) -> None:
    """Permuting the batch rows of a dump (with their lengths and writes) changes nothing."""
    folder = tmp_path_factory.mktemp("order")
    paths = write_sequence("use-after-free", folder, steps=4, seed=seed)
    before = timeline(paths, planner=None)
    rng = np.random.default_rng(shuffle)
    for path in paths:
        dump = load_dump(path)
        order = rng.permutation(dump.bs)
        contents = dump_contents(
            dump.metadata,
            {
                "req_to_token": dump.req_to_token.array(),
                "req_pool_indices": dump.req_pool_indices[order],
                "prefix_lens": dump.prefix_lens[order],
                "extend_seq_lens": dump.extend_seq_lens[order],
                "free_full_slots": dump.free_full_slots,
            },
        )
        del dump
        write_dump(path, contents)
    after = timeline(paths, planner=None)
    assert [(e.kind, e.after_step, e.cells.slot.tolist()) for e in after.events] == [  # type: ignore[union-attr]
        (e.kind, e.after_step, e.cells.slot.tolist())  # type: ignore[union-attr]
        for e in before.events
    ]
    assert [(i.born, i.grew, i.finished, i.reused) for i in after.intervals] == [
        (i.born, i.grew, i.finished, i.reused) for i in before.intervals
    ]


def test_the_truth_is_in_every_dump() -> None:
    """Dumps before the event hold the plan; from the one that shows it on, the whole truth."""
    dumps = list(synth_sequence("use-after-free", steps=4, every=2, at=5))
    truths = [json.loads(d.metadata[PLANTED_KEY]) for d in dumps]
    assert [int(d.metadata["step"]) for d in dumps] == [2, 4, 6, 8]
    for truth in truths:
        assert truth["event"] == "use-after-free" and truth["step"] == 5
        assert (truth["after_step"], truth["at_step"], truth["dump"]) == (4, 6, 2)
    assert "slots" not in truths[1] and truths[2] == truths[3] and truths[2]["slots"]
    clean = [json.loads(d.metadata[PLANTED_KEY]) for d in synth_sequence("clean", steps=2)]
    assert clean == [{"event": None}] * 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": 1}, "2 dumps or more"),
        ({"steps": 4, "at": 1}, "not after the first dump"),
        ({"steps": 4, "at": 5}, "at or before the last"),
        ({"steps": 60}, "do not fit a row"),
        ({"steps": 3, "every": 8, "name": "swa-leak"}, "skip past the window"),
        ({"steps": 3, "size": "large"}, "is not one of tiny, small, medium"),
        ({"steps": 3, "name": "nope"}, "unknown sequence"),
    ],
)
def test_sequence_options_are_checked(kwargs: dict[str, Any], message: str) -> None:
    name = kwargs.pop("name", "clean")
    with pytest.raises(OptionError, match=message):
        list(synth_sequence(name, **kwargs))


# --- hand-made pairs -----------------------------------------------------------------------


def _pair_dump(
    path: Path,
    step: int,
    rows: dict[int, list[int]],
    free: list[int] | None,
    *,
    window: int | None = None,
    mode: str | None = None,
    **extra: Any,
) -> Path:
    """A dump whose batch is `rows` (pool row -> its slots, all cached: E = 0); `extra` adds or
    replaces tensors, `window` records an SWA window, `mode` a forward mode."""
    table = np.zeros((8, 16), dtype=np.int32)
    for row, slots in rows.items():
        table[row, : len(slots)] = slots
    tensors: dict[str, Any] = {
        "req_to_token": table,
        "req_pool_indices": np.array(list(rows), dtype=np.int64),
        "prefix_lens": np.array([len(s) for s in rows.values()], dtype=np.int64),
        "free_full_slots": None if free is None else np.array(free, dtype=np.int64),
        **extra,
    }
    meta = {"rank": "0", "step": str(step), "num_full_slots": "64"}
    if window is not None:
        meta["swa_window_size"] = str(window)
    if mode is not None:
        meta["forward_mode"] = mode
    write_dump(path, dump_contents(meta, {k: v for k, v in tensors.items() if v is not None}))
    return path


def test_owner_changes_and_allocations(tmp_path: Path) -> None:
    old = _pair_dump(tmp_path / "a.safetensors", 10, {1: [10, 11, 12], 2: [20, 21]}, [22, 30, 31])
    new = _pair_dump(
        tmp_path / "b.safetensors", 12, {2: [20, 21, 22], 3: [10, 11, 31]}, [12, 30, 40]
    )
    report = timeline([old, new], planner=PLANNER, keep_order=True)
    (interval,) = report.intervals
    assert (interval.born, interval.grew, interval.finished) == ((3,), (2,), (1,))
    assert interval.reused == () and interval.tokens_added == 1
    changes = interval.owner_changes
    assert changes.slot is not None and changes.slot.tolist() == [10, 11]
    assert changes.pool_row.tolist() == [3, 3] and changes.position.tolist() == [0, 1]
    assert changes.extra["old_pool_row"].tolist() == [1, 1]
    assert changes.extra["old_position"].tolist() == [0, 1]
    # 22 and 31 came from the free list; 40 is free now, 12 went back: no event
    assert (interval.allocated_from_free, interval.allocated_unseen) == (2, 0)
    assert report.events == () and not report.failed


def test_a_second_owner_without_free_lists_is_a_double_allocation(tmp_path: Path) -> None:
    old = _pair_dump(tmp_path / "a.safetensors", 1, {1: [10, 11, 12]}, None)
    new = _pair_dump(tmp_path / "b.safetensors", 2, {1: [10, 11, 12, 13], 2: [5, 11]}, None)
    (event,) = timeline([old, new], planner=PLANNER).events
    assert event.kind is EventKind.DOUBLE_ALLOCATION and event.cells.slot.tolist() == [11]  # type: ignore[union-attr]
    assert (event.cells.pool_row.tolist(), event.cells.position.tolist()) == ([1], [1])
    assert event.cells.extra["other_pool_row"].tolist() == [2]
    assert event.cells.extra["other_position"].tolist() == [1]
    # one position, another slot before it: check calls it a copy, not radix sharing
    assert event.findings == (FindingCode.SLOT_SHARED_WITHOUT_PREFIX,)


def test_a_freed_slot_handed_out_again_is_a_use_after_free(tmp_path: Path) -> None:
    """Freed while held (already so in the first dump: its check finding says it), then
    handed to another request while the first still holds it: the second stage is an event."""
    old = _pair_dump(tmp_path / "a.safetensors", 1, {1: [10, 11, 12]}, [11, 20])
    new = _pair_dump(tmp_path / "b.safetensors", 2, {1: [10, 11, 12], 2: [11]}, [20])
    report = timeline([old, new], planner=PLANNER)
    (event,) = report.events
    assert event.kind is EventKind.USE_AFTER_FREE and "handed out again" in event.message
    assert event.cells.slot.tolist() == [11]  # type: ignore[union-attr]
    first = {f.code: f.first_dump for f in report.findings}
    assert first[FindingCode.FREED_SLOT_IN_LIVE_RANGE] == 0


def test_radix_sharing_is_one_owner(tmp_path: Path) -> None:
    """A new request sharing another's cached prefix (same slots at the same positions) is
    no second owner; a copy of one slot to another position is."""
    old = _pair_dump(tmp_path / "a.safetensors", 1, {1: [10, 11, 12]}, [13, 14, 15])
    shared = _pair_dump(tmp_path / "b.safetensors", 2, {1: [10, 11, 12], 2: [10, 11, 14]}, [15])
    assert timeline([old, shared], planner=PLANNER).events == ()
    copied = _pair_dump(tmp_path / "c.safetensors", 3, {1: [10, 11, 12], 2: [10, 12, 14]}, [15])
    (event,) = timeline([old, copied], planner=PLANNER).events
    assert event.kind is EventKind.DOUBLE_ALLOCATION and event.cells.slot.tolist() == [12]  # type: ignore[union-attr]


# --- hostile dumps -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_seeds(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    from tests.fuzz.seeds import load_seeds, write_seeds

    folder = tmp_path_factory.mktemp("seeds")
    write_seeds(folder)
    return load_seeds(folder)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "start"),
    [
        *(("data", 0), ("length", 0), ("crowded", 0)),
        *(pytest.param(family, 4, marks=DEEP) for family in ("data", "length", "crowded")),
    ],
)
def test_corrupt_values_between_two_dumps(
    tmp_path: Path, fuzz_seeds: list[Any], family: str, start: int
) -> None:
    """A seed, then one of its mutants whose values only are corrupt (every eighth of the
    corpus from `start`: the suite's half of every fourth, the deep lane's the other): the
    timeline reports (its checks find what is wrong) or refuses the mutant with bad input
    exactly when checking it does; it never fails otherwise."""
    from tests.fuzz.mutants import Seed, corpus, frame

    runs = [(seed, mutant) for seed in fuzz_seeds for mutant in corpus([seed], family)]
    for seed, mutant in runs[start::8]:
        try:
            step = Seed.parse("mutant", mutant.blob).metadata.get("step")
        except ValueError:  # not a dump at all (a crowded log): not for a timeline
            continue
        first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
        header = json.loads(json.dumps(seed.header))
        header["__metadata__"].pop("step", None)
        if step is not None:  # the seed one step before its mutant
            header["__metadata__"]["step"] = str(int(step) - 1)
        first.write_bytes(frame(json.dumps(header).encode(), seed.data))
        second.write_bytes(mutant.blob)
        try:
            run_check(load_dump(second), planner=PLANNER, kernel=None)
        except DumpError:
            with pytest.raises(DumpError):
                timeline([first, second], planner=PLANNER)
            continue
        try:
            report = timeline([first, second], planner=PLANNER)
        except DumpError as exc:  # another pool than the seed's: one line, as documented
            assert "a timeline reads one rank's pools" in str(exc), (mutant.kind, exc)
            continue
        assert len(report.dumps) == 2, mutant.kind


def test_a_batch_of_padding_rows_only(tmp_path: Path) -> None:
    """No live cell in a dump (a padding-only batch): nothing to compare, nothing breaks."""
    empty = _pair_dump(tmp_path / "a.safetensors", 1, {0: []}, [5, 6])
    full = _pair_dump(tmp_path / "b.safetensors", 2, {1: [5, 6], 2: [6]}, [5])
    again = _pair_dump(tmp_path / "c.safetensors", 3, {0: []}, [])
    report = timeline([empty, full, again], planner=PLANNER)
    first, second = report.intervals
    assert first.born == (1, 2) and second.finished == (1, 2)
    # slot 6 held twice, 5 held and listed free: both handed out since the empty dump
    assert {e.kind for e in report.events} == {
        EventKind.USE_AFTER_FREE,
        EventKind.DOUBLE_ALLOCATION,
    }


# --- a live request's written cells rewritten (issue 35, part 5) ----------------------------


@pytest.mark.parametrize(
    ("free", "other", "fate", "word"),
    [
        ([30], {}, 0, "orphaned"),  # 11 is neither free nor held
        ([11, 30], {}, 1, "free"),  # 11 went back to the free list
        ([30], {3: [5, 11]}, 2, "held by a live cell"),  # another request holds 11 at 1
        (None, {}, -1, "no free list"),  # no free list: free and orphaned look alike
    ],
    ids=["orphaned", "free", "held", "unknown"],
)
def test_a_rewritten_written_cell_is_an_event_with_the_old_slots_fate(
    tmp_path: Path, free: list[int] | None, other: dict[int, list[int]], fate: int, word: str
) -> None:
    """Row 1 holds 10 11 12, then 10 40 12 13: position 1 changed while the request grew (its
    later written position unchanged), which SGLang never does while it keeps the row. The
    later dump records the tree (10 12), which does not hold 40: no de-duplication."""
    old = _pair_dump(tmp_path / "a.safetensors", 1, {1: [10, 11, 12], 2: [20, 21]}, free and [40])
    rows = {1: [10, 40, 12, 13], 2: [20, 21, 22], **other}
    tree = np.array([10, 12], dtype=np.int64)
    new = _pair_dump(tmp_path / "b.safetensors", 2, rows, free, tree_full_slots=tree)
    for report in (
        timeline([old, new], planner=PLANNER),
        api.diff(old, new),  # diff reads the same intervals
    ):
        assert isinstance(report, TimelineReport)
        kinds = [e.kind for e in report.events]
        assert EventKind.PREFIX_REWRITTEN in kinds and report.failed
        event = report.events[kinds.index(EventKind.PREFIX_REWRITTEN)]
        assert (event.after_step, event.at_step, event.to_dump) == (1, 2, 1)
        cells = event.cells
        assert cells.slot is not None and cells.slot.tolist() == [40]
        assert (cells.pool_row.tolist(), cells.position.tolist()) == ([1], [1])
        assert cells.extra["old_slot"].tolist() == [11]
        assert cells.extra["old_slot_fate"].tolist() == [fate]
        assert word in event.message
        (interval,) = report.intervals
        assert 1 in interval.grew and 1 not in interval.reused  # the same request


def test_a_rewritten_cell_is_reported_once(tmp_path: Path) -> None:
    tree = np.array([10], dtype=np.int64)
    a = _pair_dump(tmp_path / "a.safetensors", 1, {1: [10, 11, 12]}, [40, 41])
    b = _pair_dump(tmp_path / "b.safetensors", 2, {1: [10, 40, 12, 13]}, [41], tree_full_slots=tree)
    c = _pair_dump(
        tmp_path / "c.safetensors", 3, {1: [10, 40, 12, 13, 14]}, [41], tree_full_slots=tree
    )
    report = timeline([a, b, c], planner=PLANNER)
    assert [(e.kind, e.to_dump) for e in report.events] == [(EventKind.PREFIX_REWRITTEN, 1)]


@pytest.mark.parametrize(
    "rows",
    [
        {1: [10, 31, 32, 33]},  # another request took the row, sharing the cached slot 10
        {1: [30, 31, 32]},  # another request took the row, nothing shared
        {1: [10, 11, 12, 13]},  # the request grew
        {1: [10, 11]},  # shorter: another request sharing a prefix (no growth)
    ],
    ids=["reused-sharing-a-prefix", "reused", "grew", "shorter"],
)
def test_a_reused_row_or_a_grown_request_is_no_rewrite(
    tmp_path: Path, rows: dict[int, list[int]]
) -> None:
    """The clean twins: a new request in the row differs from the old one from some position
    on (a shared cached prefix comes first); nothing later is unchanged, so nothing was
    rewritten."""
    old = _pair_dump(tmp_path / "a.safetensors", 1, {1: [10, 11, 12], 2: [20]}, [30, 31, 32, 33])
    new = _pair_dump(tmp_path / "b.safetensors", 2, {**rows, 2: [20]}, [11, 12])
    report = timeline([old, new], planner=PLANNER)
    assert EventKind.PREFIX_REWRITTEN not in [e.kind for e in report.events]


def test_the_rewrite_check_is_vectorized_over_a_big_pool(tmp_path: Path) -> None:
    """Many rows, one rewritten cell each: the event names every one (no loop per cell or row:
    sorts and gathers; this only checks the answer at a size a loop would make slow)."""
    rows, width = 2000, 64
    table = np.arange(1, rows * width + 1, dtype=np.int64).reshape(rows, width) + 100
    table[0] = 0
    later = table.copy()
    later[1:, 5] += 10_000_000  # position 5 of every row: a slot never seen
    batch = np.arange(1, rows, dtype=np.int64)
    paths = []
    for step, (t, n) in enumerate([(table, 40), (later, 41)], start=1):
        tensors = {
            "req_to_token": t,
            "req_pool_indices": batch,
            "prefix_lens": np.full(batch.size, n, dtype=np.int64),
            "tree_full_slots": np.array([101], dtype=np.int64),  # not the new slots
        }
        meta = {"rank": "0", "step": str(step), "num_full_slots": str(20_000_000)}
        paths.append(write_dump(tmp_path / f"{step}.safetensors", dump_contents(meta, tensors)))
    (event,) = [
        e for e in timeline(paths, planner=None).events if e.kind is EventKind.PREFIX_REWRITTEN
    ]
    assert event.cells.slot is not None and event.cells.slot.size == rows - 1
    assert set(event.cells.position.tolist()) == {5}
    assert set(event.cells.extra["old_slot_fate"].tolist()) == {-1}


# --- SGLang's own rewrites and re-prefills are no events (issue 43, items 1 and 2) ------------


def _dedup_pair(
    tmp_path: Path,
    *,
    tree: list[int] | None,
    free: list[int] | None,
    other: list[int],
    held: list[int] | None = None,
) -> TimelineReport:
    """Row 1 holds 10 11 12 13 14 (written), then 10 11 50 51 14 15: the radix cache inserted
    the request's tokens, found those at 2 and 3 cached as 50 51 (another request's), wrote the
    tree's slots over the request's own (UnifiedRadixCache's unfinished-request caching:
    `req_to_token[row, protected:len] = tree slots`) and freed its duplicates."""
    old = _pair_dump(tmp_path / "a.safetensors", 1, {1: [10, 11, 12, 13, 14]}, [15, 50, 51, 60])
    extra: dict[str, Any] = {}
    if tree is not None:
        extra["tree_full_slots"] = np.array(tree, dtype=np.int64)
    if held is not None:
        extra["held_full_slots"] = np.array(held, dtype=np.int64)
    rows = {1: [10, 11, 50, 51, 14, 15], **({2: other} if other else {})}
    new = _pair_dump(tmp_path / "b.safetensors", 2, rows, free, **extra)
    return timeline([old, new], planner=PLANNER)


def test_the_radix_caches_deduplication_is_no_rewrite(tmp_path: Path) -> None:
    """The new slots are the tree's (the later dump's record says it holds them), the old ones
    went back to the free list: de-duplication, no event, and the request grew."""
    report = _dedup_pair(tmp_path, tree=[10, 11, 14, 50, 51], free=[12, 13, 60], other=[])
    assert report.events == () and not report.failed
    (interval,) = report.intervals
    assert interval.grew == (1,) and interval.reused == ()


def test_the_old_slot_still_held_by_the_tree_is_accounted(tmp_path: Path) -> None:
    """The old slots still in the tree (another node holds them) are accounted too."""
    report = _dedup_pair(tmp_path, tree=[10, 11, 12, 13, 14, 50, 51], free=[60], other=[])
    assert report.events == ()


@pytest.mark.parametrize(
    ("tree", "free"),
    [
        ([10, 11, 14], [12, 13, 60]),  # 50 51 are no slots the tree holds: a rewrite
        ([10, 11, 14, 50, 51], [60]),  # 12 13 neither free, held nor the tree's: orphaned
        ([10, 11, 14, 50, 51], [12, 13, 50, 51, 60]),  # the tree's, and listed free
    ],
    ids=["new-slot-not-the-trees", "old-slot-orphaned", "new-slot-listed-free"],
)
def test_a_rewrite_the_tree_does_not_account_for_is_still_an_event(
    tmp_path: Path, tree: list[int] | None, free: list[int]
) -> None:
    """The twins of de-duplication: the event stays for every cell the later dump's tree and
    free list do not account for."""
    report = _dedup_pair(tmp_path, tree=tree, free=free, other=[])
    (event,) = [e for e in report.events if e.kind is EventKind.PREFIX_REWRITTEN]
    assert event.cells.slot is not None and event.cells.slot.tolist() == [50, 51]
    assert event.cells.extra["old_slot"].tolist() == [12, 13]


def test_without_a_tree_record_a_prefix_another_request_shares_is_the_trees(
    tmp_path: Path,
) -> None:
    """A dump that records no tree (a snapshot of a server whose tree is not registered): the
    new slots are the radix cache's when another live request holds them at the same positions
    after the same slot (one owner: the shared cached prefix), and the old ones are free."""
    report = _dedup_pair(tmp_path, tree=None, free=[12, 13, 60], other=[10, 11, 50, 51, 70])
    assert EventKind.PREFIX_REWRITTEN not in [e.kind for e in report.events]
    # the same picture with the old slots orphaned (neither free nor held, as the dump's
    # `held_full_slots` says) stays an event
    held = [10, 11, 14, 15, 50, 51, 70]
    report = _dedup_pair(tmp_path, tree=None, free=[60], other=[10, 11, 50, 51, 70], held=held)
    assert EventKind.PREFIX_REWRITTEN in [e.kind for e in report.events]


@pytest.mark.parametrize(
    ("free", "held"),
    [
        ([60], None),  # 12 13 not free: the tree may keep them (a request retracted, then
        # prefilled again with 50 51 fresh from the free list)
        ([12, 13, 60], None),  # 12 13 freed, 50 51 fresh: the tree may have taken them over
        (None, None),  # no free list either
        ([12, 13, 60], [10, 11, 14, 15, 50, 51]),  # held recorded, but 12 13 are free
        ([60], [10, 11, 12, 13, 14, 15, 50, 51]),  # held recorded, and it holds 12 13
    ],
    ids=["old-not-free", "old-free", "no-free-list", "held-old-free", "held-old-held"],
)
def test_without_a_tree_record_a_rewrite_it_cannot_tell_apart_is_a_note(
    tmp_path: Path, free: list[int] | None, held: list[int] | None
) -> None:
    """Issue 43: dumps without the tree's record, a few plans apart, show a request retracted
    and prefilled again in its row between them as a rewrite (its old slots kept or freed by
    the tree, its new ones fresh from the free list): no dump of the pair tells it from a
    fault. No event, then, but a note that says so and what would decide it."""
    report = _dedup_pair(tmp_path, tree=None, free=free, other=[], held=held)
    assert report.events == () and not report.failed
    (note,) = [n for n in report.notes if "tree_full_slots" in n]
    assert (
        note.startswith("2 written cells of live requests hold ")
        and "between dumps 0 and 1" in note
    )
    assert "retracted and prefilled again" in note and "record the tree" in note
    (interval,) = report.intervals
    assert interval.grew == (1,)


def test_without_a_tree_record_an_orphaned_old_slot_is_still_an_event(tmp_path: Path) -> None:
    """The twin: the dump's own bookkeeping (`held_full_slots` and the free list) proves the old
    slots orphaned: neither free nor held by anyone, the tree included. An event, no note."""
    report = _dedup_pair(tmp_path, tree=None, free=[60], other=[], held=[10, 11, 14, 15, 50, 51])
    (event,) = report.events
    assert event.kind is EventKind.PREFIX_REWRITTEN
    assert event.cells.extra["old_slot"].tolist() == [12, 13]
    assert event.cells.extra["old_slot_fate"].tolist() == [0, 0]
    assert not [n for n in report.notes if "tree_full_slots" in n]


def _lut(mapped: dict[int, int]) -> np.ndarray:
    lut = np.zeros(65, dtype=np.int64)
    lut[-1] = -1
    for full, swa in mapped.items():
        lut[full] = swa
    return lut


def test_a_request_prefilled_again_in_its_row_is_a_new_occupancy(tmp_path: Path) -> None:
    """Row 1 decodes at position 5 (10..15, mapped to SWA 20..25), is retracted, and is
    prefilled again in the same row: prefix 2 (the tree kept 10 11), an extend of 6 that gets
    its old full slots 12..15 back (a last-freed-first free list) with new SWA slots. Its prefix
    shrank: a new request in the row, whose pending writes are no rewritten mapping."""
    old = _pair_dump(
        tmp_path / "a.safetensors",
        1,
        {1: [10, 11, 12, 13, 14, 15]},
        [16, 17, 40],
        prefix_lens=np.array([5]),
        extend_seq_lens=np.array([1]),
        window=8,
        full_to_swa_index_mapping=_lut({s: s + 10 for s in range(10, 16)}),
    )
    new = _pair_dump(
        tmp_path / "b.safetensors",
        2,
        {1: [10, 11, 12, 13, 14, 15, 16, 17]},
        [40],
        prefix_lens=np.array([2]),
        extend_seq_lens=np.array([6]),
        window=8,
        full_to_swa_index_mapping=_lut({10: 20, 11: 21, **{s: s + 30 for s in range(12, 18)}}),
    )
    for report in (timeline([old, new], planner=PLANNER), api.diff(old, new)):
        assert isinstance(report, TimelineReport)
        assert [e.kind for e in report.events] == []
        (interval,) = report.intervals
        assert interval.reused == (1,) and interval.grew == () and interval.tokens_added == 0


def test_a_continuing_request_whose_mapping_moved_is_still_an_event(tmp_path: Path) -> None:
    """The twin: the request keeps its prefix (5, then 6) and a written cell's mapping moves."""
    lut = {s: s + 10 for s in range(10, 16)}
    old = _pair_dump(
        tmp_path / "a.safetensors",
        1,
        {1: [10, 11, 12, 13, 14, 15]},
        [16, 40],
        prefix_lens=np.array([5]),
        extend_seq_lens=np.array([1]),
        window=8,
        full_to_swa_index_mapping=_lut(lut),
    )
    new = _pair_dump(
        tmp_path / "b.safetensors",
        2,
        {1: [10, 11, 12, 13, 14, 15, 16]},
        [],
        prefix_lens=np.array([6]),
        extend_seq_lens=np.array([1]),
        window=8,
        full_to_swa_index_mapping=_lut({**lut, 13: 40, 16: 26}),
    )
    report = timeline([old, new], planner=None)
    (event,) = report.events
    assert event.kind is EventKind.LUT_REWRITTEN and event.cells.position.tolist() == [3]
    assert report.intervals[0].grew == (1,)


def _lut_pair(
    tmp_path: Path,
    old: tuple[list[int], int, int, dict[int, int]],
    new: tuple[list[int], int, int, dict[int, int]],
    *,
    mode: str = "extend",
    window: int = 8,
) -> TimelineReport:
    """Row 1 in two dumps: (slots, prefix, extend, LUT) each; `mode` is the first's."""
    paths = []
    for step, (slots, prefix, extend, lut) in enumerate((old, new), start=1):
        paths.append(
            _pair_dump(
                tmp_path / f"{step}.safetensors",
                step,
                {1: slots},
                [],
                window=window,
                mode=mode if step == 1 else "decode",
                prefix_lens=np.array([prefix]),
                extend_seq_lens=np.array([extend]),
                full_to_swa_index_mapping=_lut(lut),
            )
        )
    return timeline(paths, planner=None)


def test_pending_writes_not_covered_by_the_next_prefix_are_a_new_request(tmp_path: Path) -> None:
    """A prefill of 6 (prefix 0), then prefix 4 in the row: had the request kept its row, its
    prefix would cover all 6. Another request (or the same one prefilled again) took the row
    and got slots 14 15 back with new SWA slots: no event, the row `reused`."""
    lut = {s: s + 10 for s in range(10, 16)}
    report = _lut_pair(
        tmp_path,
        ([10, 11, 12, 13, 14, 15], 0, 6, lut),
        ([10, 11, 12, 13, 14, 15, 16], 4, 3, {**lut, 14: 40, 15: 41, 16: 42}),
    )
    assert report.events == ()
    assert report.intervals[0].reused == (1,)


def test_a_speculative_steps_rejected_drafts_are_no_rewrite(tmp_path: Path) -> None:
    """The twin, after a verify step: only the accepted drafts are kept, so prefix 4 is the
    same request; the rejected drafts' slots (14 15, mapped anew) are no event, a moved
    mapping in its accepted cells is."""
    lut = {s: s + 10 for s in range(10, 16)}
    later = {**lut, 14: 40, 15: 41, 16: 42}
    report = _lut_pair(
        tmp_path,
        ([10, 11, 12, 13, 14, 15], 2, 4, lut),
        ([10, 11, 12, 13, 14, 15, 16], 4, 3, later),
        mode="target_verify",
    )
    assert report.events == () and report.intervals[0].grew == (1,)
    report = _lut_pair(
        tmp_path,
        ([10, 11, 12, 13, 14, 15], 2, 4, lut),
        ([10, 11, 12, 13, 14, 15, 16], 4, 3, {**later, 13: 43}),
        mode="target_verify",
    )
    (event,) = report.events
    assert event.kind is EventKind.LUT_REWRITTEN and event.cells.position.tolist() == [3]


def test_a_mapping_behind_the_window_may_come_back_with_other_slots(tmp_path: Path) -> None:
    """Behind its window a request reads no SWA: the tree's SWA side of a cached slot there
    is freed (a tombstone) and comes back with other slots when another request caches the
    same tokens. Only a cell in the window (position 8 here, window 4) is an event."""
    slots = list(range(10, 20))
    lut = {s: s + 10 for s in slots}
    back = {**lut, 10: 50, 11: 51}  # positions 0 and 1, far behind the window
    report = _lut_pair(tmp_path, (slots, 9, 1, lut), ([*slots, 20], 10, 1, back), window=4)
    assert report.events == ()
    report = _lut_pair(
        tmp_path, (slots, 9, 1, lut), ([*slots, 20], 10, 1, {**back, 18: 52}), window=4
    )
    (event,) = report.events
    assert event.kind is EventKind.LUT_REWRITTEN and event.cells.position.tolist() == [8]
