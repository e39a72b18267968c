"""`kvcanary leak` on the memory-check messages of every SGLang release with kv canary, each
message made by that release's own code (`tests/sglang_checker.py`: the release's
`invariant_checker.py` from its wheel, run on stand-in pools whose counts we choose).

The releases word their messages differently: 0.5.13 and 0.5.14 print `total=None` for a
hybrid-SWA model without full layers, 0.5.15 on an empty full line instead; 0.5.14 adds the
int8 Mamba pools, 0.5.15 the page checks (`KV double free`, `KV page use-after-free`) and DCP's
allowed slack, 0.5.19 the byte report, 0.5.20 the SWA ring line and the page-interleave
allocator's census assert, 0.5.21 that allocator's class watermark and unaligned counts. Each
case sets a state whose sums we know, has the release print what it prints, and checks what
`leak` reads: the counts, the difference, the verdict. The suite runs the oldest and the newest
release and those that change a message, every release with KVCANARY_EVERY_RELEASE=1.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvcanary_cli.analysis.leak import leak_report
from kvcanary_cli.dump.releases import parse_release
from kvcanary_cli.errors import OptionError
from kvcanary_cli.results.leak import LeakMessage, LeakReport
from tests.sglang_checker import Pools, Release, release_checker
from tests.sglang_wheel import RELEASES, WHEEL_VERSION, missing_wheel, wheel_path

VERSIONS = (*RELEASES, WHEEL_VERSION)
#: The oldest and the newest release.
_ENDS = (VERSIONS[0], VERSIONS[-1])
#: The releases whose checker words a message as no earlier one does (see above), in the
#: whole suite; the others (the post releases' and 0.5.16 - 0.5.18's and 0.5.22's checkers
#: word every message as the release before them) with KVCANARY_EVERY_RELEASE=1.
_CHANGED = ("0.5.14", "0.5.15", "0.5.19", "0.5.20", "0.5.21")
_EVERY = os.environ.get("KVCANARY_EVERY_RELEASE") == "1"
_RUN = tuple(v for v in VERSIONS if _EVERY or v in _ENDS or v in _CHANGED)


def _release(version: str) -> pytest.param:  # type: ignore[valid-type]
    missing = pytest.mark.skipif(wheel_path(version) is None, reason=missing_wheel(version))
    return pytest.param(version, marks=[missing])


@pytest.fixture(params=[_release(v) for v in _RUN], scope="module")
def release(request: pytest.FixtureRequest) -> Iterator[Release]:
    loaded = release_checker(request.param)
    assert loaded is not None
    yield loaded


def _since(release: Release, version: str) -> bool:
    mine, since = parse_release(release.version), parse_release(version)
    assert mine is not None and since is not None
    return mine >= since


def _read(text: str) -> LeakReport:
    """What `kvcanary leak LINE` makes of one message."""
    return leak_report(text)


def _one(texts: list[str]) -> LeakMessage:
    assert len(texts) == 1, texts
    report = _read(texts[0])
    [message] = report.messages
    return message


def _sums(message: LeakMessage) -> dict[str, tuple[int, str]]:
    return {p.pool: (p.difference, p.reading) for p in message.pools}


# --- the idle check ------------------------------------------------------------------------


def test_a_short_full_pool_is_read_with_its_difference(release: Release) -> None:
    texts = release.idle(Pools(available=40, evictable=16))
    message = _one(texts)
    assert message.kind == "idle-pools" and message.faulty
    [full] = message.pools
    assert (full.total, full.accounted, full.difference, full.reading) == (64, 56, 8, "short")
    assert _read(texts[0]).verdict == "undecided"


def test_an_over_swa_pool_beside_a_balanced_full_pool(release: Release) -> None:
    message = _one(release.idle(Pools(swa_total=32, swa_available=40)))
    assert _sums(message) == {"full": (0, "balanced"), "swa": (-8, "over")}


def test_the_mamba_pool_and_the_slots_sglang_names(release: Release) -> None:
    state = Pools(
        mamba_total=8, mamba_available=5, mamba_free=[1, 2, 3, 4, 5], free_pages=[*range(1, 65)]
    )
    message = _one(release.idle(state))
    assert _sums(message) == {"full": (0, "balanced"), "mamba": (3, "short")}
    said = " ".join(message.arithmetic)
    assert "Mamba slots neither free nor the tree's (leaked_mamba_pages): 3 (6, 7, 8)" in said
    if not _since(release, "0.5.19") or "leaked_full_pages" in message.text[-1]:
        assert "would be among them): none" in said  # every full page is free


def test_the_int8_mamba_pools_are_two_sums(release: Release) -> None:
    if not _since(release, "0.5.14"):
        pytest.skip("int8 Mamba checkpoints came in 0.5.14")
    state = Pools(
        mamba_total=8, mamba_available=8, mamba_free=[*range(1, 9)], int8_slots=4, int8_available=2
    )
    message = _one(release.idle(state))
    assert _sums(message) == {
        "full": (0, "balanced"),
        "mamba-active": (0, "balanced"),
        "mamba-int8": (2, "short"),
    }


def test_the_request_pool_line(release: Release) -> None:
    message = _one(release.idle(Pools(rows_free=6)))
    assert message.kind == "req-pool"
    assert (message.rows_available, message.rows_session_held, message.rows_total) == (6, 0, 8)
    assert message.faulty


def test_a_clean_state_prints_nothing(release: Release) -> None:
    assert release.idle(Pools(swa_total=32, swa_available=32)) == []


def test_the_swa_ring_is_read_as_skipped(release: Release) -> None:
    if not _since(release, "0.5.20"):
        pytest.skip("the SWA ring came in 0.5.20")
    message = _one(release.idle(Pools(ring=True, available=60, swa_total=32, swa_available=10)))
    assert _sums(message) == {"full": (4, "short"), "swa": (22, "skipped")}


# --- the busy check ------------------------------------------------------------------------


def test_the_busy_assert_and_its_log_lines(release: Release) -> None:
    logged, raised = release.busy(Pools(available=60))
    assert len(logged) == 1 and len(raised) == 1
    line, assertion = _one(logged), _one(raised)
    assert line.kind == "busy-log" and assertion.kind == "busy-assert"
    assert _sums(line) == _sums(assertion) == {"full": (4, "short")}
    logged, raised = release.busy(Pools(swa_total=32, swa_available=30))
    assert _sums(_one(raised)) == {"swa": (2, "short")}
    assert [_sums(_one([text])) for text in logged] == [
        {"full": (0, "balanced")},
        {"swa": (2, "short")},
    ]


# --- the page checks -----------------------------------------------------------------------


def test_the_page_checks(release: Release) -> None:
    doubled = release.page_checks(Pools(page_size=2, free_pages=[3, 3, 4], row_pages=[5, 6]))
    used = release.page_checks(Pools(page_size=2, free_pages=[3, 4, 5], row_pages=[5, 6]))
    if not _since(release, "0.5.15"):
        assert doubled == used == []  # 0.5.13 and 0.5.14 have no page checks
        return
    double = _one(doubled)
    assert (double.kind, double.sub_pool, double.count) == ("kv-double-free", 0, 1)
    assert _read(doubled[0]).verdict == "freed-twice"
    after = _one(used)
    assert (after.kind, after.count, after.sample_pages) == ("kv-use-after-free", 2, (5,))
    assert _read(used[0]).verdict == "freed-while-used"


# --- a log of them all ---------------------------------------------------------------------


def test_a_log_of_the_releases_messages_reads_every_one(release: Release, tmp_path: Path) -> None:
    """Every message the release prints, in one server log (each first line after a logging
    prefix, the idle report's pool lines on lines of their own): each is read, with its kind
    and its sums, and only those without counts are set aside."""
    said = [
        *release.idle(Pools(available=40, evictable=16)),
        *release.idle(Pools(swa_total=32, swa_available=40)),
        *release.busy(Pools(available=60))[1],
        *release.idle(Pools(rows_free=6)),
        *release.busy(Pools(total=None, swa_total=32, swa_available=32))[0][:1],
        *release.mamba_freed_twice(),
        *release.page_checks(Pools(page_size=2, free_pages=[3, 3, 4], row_pages=[5, 6])),
    ]
    kinds = ["idle-pools", "idle-pools", "busy-assert", "req-pool", "mamba-double-free"]
    sums = [8, 0, -8, 4]
    if _since(release, "0.5.15"):
        kinds.append("kv-double-free")
    else:  # `[full] total=None`: SGLang's assert too, a message with nothing to add up
        said.insert(
            5, _one_text(release.busy(Pools(total=None, swa_total=32, swa_available=32))[1])
        )
        kinds.insert(4, "busy-assert")
    if _since(release, "0.5.20"):
        said.append(_one_text(release.census(Pools(page_size=2, classes=[[2, 2], [1]]))))
        said.append(_one_text(release.census(Pools(page_size=2, classes=[[1], [3]]))))
        kinds.append("class-double-free")
    log = tmp_path / "server.log"
    log.write_text(
        "".join(f"[2026-12-05 18:00:00 TP0] {text.rstrip()}\nnext line\n" for text in said)
    )
    report = leak_report(None, log=log)
    assert [m.kind for m in report.messages] == kinds
    assert [p.difference for m in report.messages for p in m.pools] == sums
    assert report.unread == (1 if _since(release, "0.5.20") else 0)  # the misfiled page
    assert report.balanced_busy_lines == 1  # the line without a full pool: nothing to add up
    assert report.verdict == "freed-twice"


def test_an_unknown_line_is_still_refused(release: Release) -> None:
    with pytest.raises(OptionError):
        _read("nothing of SGLang's")


# --- page-interleave sharding (0.5.21 on) ---------------------------------------------------


def _classed(release: Release) -> None:
    if not _since(release, "0.5.21"):
        pytest.skip("the page-interleave checks came in 0.5.21")


def test_the_class_watermark_is_read_beside_the_sum(release: Release) -> None:
    _classed(release)
    # classes of a 2-way interleave: pages 2 and 4 owned by class 0, page 1 by class 1
    message = _one(release.idle(Pools(page_size=2, total=16, available=0, classes=[[2, 4], [1]])))
    [full] = message.pools
    assert (full.available, full.difference, full.reading) == (6, 10, "short")
    assert full.class_free_pages == (2, 1) and full.unaligned == ()
    assert any("2 + 1 = 3 free pages" in line for line in message.arithmetic)


def test_counts_that_are_not_whole_pages_are_sglangs_finding_though_the_sum_holds(
    release: Release,
) -> None:
    _classed(release)
    state = Pools(
        page_size=2, total=16, available=0, evictable=5, protected=5, classes=[[2, 4], [1]]
    )
    [text] = release.idle(state)
    report = _read(text)
    [message] = report.messages
    [full] = message.pools
    assert (full.difference, full.reading) == (0, "balanced")
    assert full.unaligned == ("evictable", "protected") and message.faulty
    assert report.verdict == "undecided" and report.found
    said = " ".join(message.arithmetic)
    assert "evictable 5" in said and "protected 5" in said and "page size 2" in said
    assert "not whole pages" in report.summary
    _, raised = release.busy(state)
    assert _one(raised).faulty and _one(raised).pools[0].unaligned == ("evictable", "protected")


def test_whole_pages_with_a_holding_sum_print_nothing(release: Release) -> None:
    _classed(release)
    assert (
        release.idle(Pools(page_size=2, total=16, available=0, evictable=10, classes=[[2, 4], [1]]))
        == []
    )


# --- decode-context parallelism's slack (0.5.15 on) ----------------------------------------


def test_the_slack_sglang_allows_under_dcp_is_no_finding(release: Release) -> None:
    state = Pools(page_size=4, dcp=True, available=40, evictable=20)
    logged, raised = release.busy(state)
    if not _since(release, "0.5.15"):
        assert raised  # before 0.5.15 DCP had no slack: the same sums fail the busy check
        return
    assert raised == []
    report = _read(logged[0])
    [message] = report.messages
    [full] = message.pools
    assert (full.difference, full.reading, full.tolerated) == (4, "short", True)
    assert not message.faulty and report.verdict == "balanced" and not report.found
    assert any("lets this difference pass" in line for line in message.arithmetic)
    # beside a pool that is off, the idle report carries the allowed line too
    both = _read(
        _one_text(release.idle(Pools(**{**vars(state), "swa_total": 32, "swa_available": 30})))
    )
    assert {p.pool: p.tolerated for p in both.messages[0].pools} == {"full": True, "swa": False}
    assert both.verdict == "undecided"


def _one_text(texts: list[str]) -> str:
    assert len(texts) == 1, texts
    return texts[0]


# --- a hybrid-SWA model without full-attention layers ---------------------------------------


def test_a_model_without_a_full_pool_has_nothing_to_add_up_there(release: Release) -> None:
    report = _read(_one_text(release.idle(Pools(total=None, swa_total=32, swa_available=20))))
    [message] = report.messages
    assert _sums(message) == {"swa": (12, "short")} and report.verdict == "undecided"
    if not _since(release, "0.5.15"):  # `[full] total=None, ...`: SGLang flags it every time
        assert any("total=None" in w and "nothing to add up" in w for w in message.arithmetic)
    logged, raised = release.busy(Pools(total=None, swa_total=32, swa_available=32))
    assert len(raised) == (0 if _since(release, "0.5.15") else 1)
    for text in (*logged, *raised):
        read = _read(text)
        assert read.verdict == "balanced" and not read.found
    [first] = _read(logged[0]).messages
    assert first.pools == () and "nothing to add up" in " ".join(first.arithmetic)


# --- the pools' own checks ------------------------------------------------------------------


def test_the_interleaved_allocators_census(release: Release) -> None:
    if not _since(release, "0.5.20"):
        pytest.skip("the page-interleave allocator came in 0.5.20")
    # class 0 of a 2-way interleave lists page 2 twice: a double free
    doubled = _read(_one_text(release.census(Pools(page_size=2, classes=[[2, 2, 4], [1]]))))
    [message] = doubled.messages
    assert (message.kind, message.page_class, message.faulty) == ("class-double-free", 0, True)
    assert doubled.verdict == "freed-twice" and "nothing to add up" in message.arithmetic[0]
    # page 1 (class 1's) on class 0's list: no count to add up, said in one line
    misfiled = _one_text(release.census(Pools(page_size=2, classes=[[2, 1], [3]])))
    with pytest.raises(OptionError, match="nothing to add up"):
        _read(misfiled)
    assert release.census(Pools(page_size=2, classes=[[2, 4], [1, 3]])) == []


def test_a_mamba_slot_freed_twice(release: Release) -> None:
    report = _read(_one_text(release.mamba_freed_twice()))
    [message] = report.messages
    assert message.kind == "mamba-double-free" and message.faulty
    assert report.verdict == "freed-twice" and "nothing to add up" in message.arithmetic[0]
    assert "Mamba slot freed a second time" in report.summary


def test_the_byte_report_is_said_in_one_line(release: Release) -> None:
    if not _since(release, "0.5.19"):
        pytest.skip("the byte report came in 0.5.19")
    said = release.report("pool-bytes", "[joint] stale available_size memo: cached=1, actual=2")
    with pytest.raises(OptionError, match="nothing to add up"):
        _read(_one_text(said))
