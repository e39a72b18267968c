"""`kvcanary soak` on the older releases it drives (0.5.21 down to 0.5.13: by default the
four where soak's reading of the tree changes, `SOAKED`), each from its own release wheel in a
process of its own (`tests.release_soak`; one SGLang per process, forked by one server per
test process that imports what every release imports besides SGLang once), skipped
with the download hint where the wheel is not cached.

On each: clean histories on every layout (page sizes 1, 4 and 16, both tree cores) are silent
on both sides and the live accounting never falls back to the whole `check` (soak models the
release's requests, locks and frees exactly); a planted lock leak is kvcanary's finding, and a
planted double free is seen by SGLang's own checks too (they run on the release); the
unmapped-representative fault is kvcanary's finding, or refused in one line where the release
has no SWA segment frees (0.5.13 - 0.5.19: their `free_swa` skips unmapped slots).

The exceptions are SGLang's own, on unified memory: the busy check of 0.5.17 to 0.5.20 prices
the available full tokens in the byte-coordinated view against the static capacity (fixed in
0.5.21), so where the two views part it reports a leak kvcanary's exact accounting does not
have; 0.5.17 and 0.5.18 crash (AttributeError) where their SWA component recovers a tombstone
under a locked full value (it writes `full_to_swa_index_mapping`, which the unified allocator
has not): 0.5.17 in this history, at step 25 (0.5.15 and 0.5.16 as well). soak reports both
as SGLang's, never as kvcanary's. 0.5.19 to 0.5.21 crash (`Out of memory`) where the eviction
for an allocation stops short, each side's view counting the same shared bytes: 0.5.21's
shipped reproducer replays to that crash, kvcanary silent, and its twin (the allocator's plan
handed to the tree as quotas, as 0.5.22 does) runs clean.

0.5.19's busy check (0.5.13 - 0.5.19's) leaves a chunked request parked between chunks out of
its sum, so a correct state where one is parked reads as leaked; soak's histories park one
only with streaming sessions, which those releases run without. Its shipped reproducer
replays to that complaint, kvcanary silent, and its twin (the check counting the parked
request, as 0.5.20's does) is silent.

0.5.17 - 0.5.19's streaming session slot takes over its first turn's lock but not that turn's
early release of the lock's SWA part, so the session's close drops the SWA part again: its
shipped reproducer closes such a session while another request's lock holds the same node,
the close takes that request's count, and a prefill evicts the node's SWA values from the
window that request still reads (kvcanary's finding at its next decode); its twin (the slot
keeping the flag, as 0.5.20's does) is silent, and 0.5.20 replays it clean.

0.5.13 and 0.5.14 have no unified memory (that layout is refused in one line), and their
hybrid SWA layout has a defect of its own that kvcanary finds in every clean history (SGLang's
checks silent): where an insert recovers an SWA tombstone, their SWA component frees the
node's full value even while a running request's lock holds it (0.5.15 keeps a locked full
value: `_restore_device_value_with_locked_full`), so that request's prefix slots are free
(`use-after-free`) and handed out again (`cross-request-aliasing`), named at that step while
the request is outside the batch; the planted lock leak comes after it, and the planted
double free in the same step (SGLang's busy check sees it; kvcanary's top cause is the
defect's).

0.5.21 runs soak's overlapped loop (`--overlap`), whose decode allocates for the requests its
queued result finishes (no `_reqs_finishing_inflight`): two histories under it are silent on
both sides (0.5.20's, the same loop, and 0.5.22's, 0.5.23's loop, in the deep lane). The host
tier's host-slot leak check runs on 0.5.19 - 0.5.22 as on 0.5.23 (the same holders of host
slots; 0.5.19 - 0.5.21's tree allocates a storage hit's itself): a clean history vouched for
on every state is silent, a planted host eviction leak is named (0.5.19 in the suite, the
others in the deep lane).
"""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lanes import DEEP
from tests.sglang_wheel import missing_wheel, wheel_path

pytest.importorskip("torch")

#: the older releases soak drives
RELEASES = (
    *("0.5.21", "0.5.20", "0.5.19", "0.5.18", "0.5.17"),
    *("0.5.16", "0.5.15", "0.5.14", "0.5.13"),
)
#: Set to 1, every one of them is soaked; otherwise those where soak's reading of the tree
#: changes (0.5.20: the tree core chosen by the environment, the busy check's view gap;
#: 0.5.19: the Rust core with the older locks; 0.5.17: no Rust core; 0.5.16: no tree core,
#: the tree holding its nodes and locks without their skips), 5 s of CPU each (forked by a
#: warm server; its first run 10 s). 0.5.21 and 0.5.18 repeat their neighbours' paths, 0.5.15
#: 0.5.16's, and 0.5.14 - 0.5.13 the same with the older scheduler objects and their SWA
#: defect (and bench/soak_release.py soaks every release at length).
EVERY_RELEASE_ENV = "KVCANARY_EVERY_RELEASE"
SOAKED = (
    RELEASES
    if os.environ.get(EVERY_RELEASE_ENV) == "1"
    else tuple(v for v in RELEASES if v not in ("0.5.21", "0.5.18", "0.5.15", "0.5.14", "0.5.13"))
)
#: Of those, the deep lane's: the suite soaks 0.5.20 (the core chosen by the environment) on
#: every layout, and runs 0.5.19's older locks on the Rust core, the Python tree core of
#: 0.5.17 - 0.5.18 and a release without a tree core (0.5.14) in its other tests here (a
#: session close, a leak dump, the busy check, the SWA defect).
DEEP_RELEASES = ("0.5.19", "0.5.17", "0.5.16")
#: what SGLang's own checks say on a clean history of a release, by layout (see above)
OWN_COMPLAINTS = {
    ("0.5.20", "unified"): ["self_check_during_busy"],
    ("0.5.19", "unified"): ["self_check_during_busy"],
    ("0.5.18", "unified"): ["self_check_during_busy"],
}
#: where SGLang crashes on a clean history of a release, by layout (see above)
CRASHES = {
    ("0.5.17", "unified"): "crash AttributeError",
    ("0.5.16", "unified"): "crash AttributeError",
    ("0.5.15", "unified"): "crash AttributeError",
}
#: the releases without the Rust tree core, and those without SWA segment frees
PYTHON_CORE_ONLY = ("0.5.18", "0.5.17", "0.5.16", "0.5.15", "0.5.14", "0.5.13")
NO_SEGMENT_FREES = ("0.5.19", "0.5.18", "0.5.17", "0.5.16", "0.5.15", "0.5.14", "0.5.13")
#: the releases without unified memory, and those whose hybrid SWA layout frees a locked
#: full value (see above): what kvcanary finds there on a clean workload
NO_UNIFIED = ("0.5.14", "0.5.13")
SWA_DEFECT = {v: {"use-after-free", "cross-request-aliasing"} for v in ("0.5.14", "0.5.13")}


ROOT = Path(__file__).resolve().parents[2]
#: seconds a run may take (a release's soak takes about 10 s of CPU)
RUN_TIMEOUT = 600

#: `soak(WHEEL, ...)`: the JSON lines of `python -m tests.release_soak WHEEL ...`
Soak = Callable[..., list[dict[str, Any]]]


@pytest.fixture(scope="module")
def soak(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Soak]:
    """Runs of `tests.release_soak` in processes its server forks (see its docstring), each
    run's exit 0 asserted."""
    folder = tmp_path_factory.mktemp("release-soaks")
    errors = folder / "server.err"
    with errors.open("w") as stderr:
        server = subprocess.Popen(
            [sys.executable, "-m", "tests.release_soak", "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=ROOT,
            start_new_session=True,  # its runs in its process group, killed with it
        )
    assert server.stdin is not None and server.stdout is not None
    runs = itertools.count()

    def lines(*args: str) -> list[dict[str, Any]]:
        assert server.stdin is not None and server.stdout is not None
        out = folder / f"run-{next(runs)}.jsonl"
        server.stdin.write(json.dumps({"args": list(args), "out": str(out)}) + "\n")
        server.stdin.flush()
        ready, _, _ = select.select([server.stdout], [], [], RUN_TIMEOUT)
        if not ready:
            os.killpg(server.pid, signal.SIGKILL)
            pytest.fail(f"tests.release_soak {' '.join(args)} ran past {RUN_TIMEOUT} s")
        answer = server.stdout.readline()
        assert answer, f"the server ended: {errors.read_text()[-2000:]}"
        assert json.loads(answer) == {"exit": 0}, Path(f"{out}.err").read_text()[-2000:]
        return [json.loads(line) for line in out.read_text().splitlines()]

    try:
        yield lines
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _release(version: str) -> pytest.param:  # type: ignore[valid-type]
    """A release's case: a soak process of about 5 s of CPU (10 s for the server's first);
    the deep lane's where the release's tree repeats another's (`DEEP_RELEASES`)."""
    wheel = wheel_path(version)
    missing = pytest.mark.skipif(wheel is None, reason=missing_wheel(version))
    lane = DEEP if version in DEEP_RELEASES else (pytest.mark.slow,)
    return pytest.param(version, marks=[missing, *lane])


@pytest.mark.parametrize("version", [_release(v) for v in SOAKED])
def test_release_soaks_clean_and_catches_planted_faults(version: str, soak: Soak) -> None:
    first, *lines = soak(str(wheel_path(version)))
    cores = first["cores"]
    assert "rust" not in cores["python"]
    if version in PYTHON_CORE_ONLY:
        assert list(cores) == ["python"]
        assert any("has no Rust tree core" in note for note in first["notes"]), first
    else:
        assert cores["rust"].endswith("rust_tree_core.adapter")
    clean = [h for h in lines if h["fault"] is None and "refused" not in h]
    refused = [h for h in lines if h["fault"] is None and "refused" in h]
    expected = {
        ("swa", 1),
        ("swa", 4),
        ("swa", 16),
        ("unified", 4),
        ("mamba", 1),
        ("mamba-extra", 1),
    }
    if version in NO_UNIFIED:
        (unified,) = refused
        assert "has no unified memory" in unified["refused"], unified
        expected.remove(("unified", 4))
    else:
        assert refused == []
    assert {(h["layout"], h["page_size"]) for h in clean} == expected
    assert {h["core"] for h in clean} == set(cores)
    defect = SWA_DEFECT.get(version, set())
    for history in clean:
        if history["layout"] == "swa" and defect:
            # the release's own defect, kvcanary's finding, SGLang's checks silent
            assert history["found"] in defect and history["sglang"] == [], history
            continue
        crash = CRASHES.get((version, history["layout"]))
        assert history["steps"] >= (20 if crash else 80), history
        said = OWN_COMPLAINTS.get((version, history["layout"]), [])
        assert (history["found"], history["sglang"], history["fallbacks"]) == (crash, said, 0)
    faults = {h["fault"]: h for h in lines if h["fault"] is not None}
    assert faults["lock-leak"]["found"] in (defect or {"tree-lock-leak"})
    double = faults["double-free-group-end"]
    # 0.5.13 - 0.5.14: the planted double free and the defect's first free share step 25
    assert double["found"] in {"double-free"} | defect and double["sglang"], double
    unmapped = faults["unmapped-representative"]
    if version in NO_SEGMENT_FREES:
        assert "needs SWA segment frees" in unmapped["refused"], unmapped
    else:
        assert unmapped["found"] == "reserved-slot-freed", unmapped


@pytest.mark.parametrize("version", [_release("0.5.14")])
def test_the_swa_defect_is_named_at_its_first_free(version: str, soak: Soak) -> None:
    """0.5.14's SWA defect is kvcanary's finding at the step its first free of a held full
    value happens (the live audit never falls back to a `check` that finds nothing): a
    running request outside the batch holds the freed slots (page size 1: on the free list),
    or they were handed to another request in that step (16: in two rows, not the tree's)."""
    lines = soak(str(wheel_path(version)), "onset")
    assert lines == [
        {"page_size": 1, "step": 25, "found": "use-after-free", "fallbacks": 0,
         "codes": ["full-slot-free-and-held"]},
        {"page_size": 16, "step": 24, "found": "cross-request-aliasing", "fallbacks": 0,
         "codes": ["full-slot-held-twice"]},
    ]  # fmt: skip


@pytest.mark.parametrize("version", [_release("0.5.19")])
def test_the_busy_check_reads_a_parked_chunk_as_leaked_before_0_5_20(
    version: str, soak: Soak
) -> None:
    """SGLang 0.5.19's busy check sums the uncached KV of the last and running batches only:
    at the shipped reproducer's decode step a chunked request sits parked (the prefill adder's
    hybrid-SWA early return: no SWA room, as the sessions hold theirs), and the check comes
    short by exactly that request's uncached tokens, kvcanary silent. The twin: the same loop
    and history with the check counting the parked request too (what 0.5.20 added): silent."""
    as_is, counted = soak(str(wheel_path(version)), "parked")
    assert as_is["parked"], as_is  # a chunk sat out a decode step
    assert as_is["found"] is None and as_is["sglang"] == {"self_check_during_busy": 1}, as_is
    ((step, uncached),) = as_is["parked"]
    assert as_is["busy"] == [{"step": step, "short": uncached}]
    assert counted["parked"] == as_is["parked"]
    assert (counted["found"], counted["sglang"]) == (None, {}), counted


@pytest.mark.parametrize("version", [_release("0.5.19"), _release("0.5.18")])
def test_a_session_close_takes_another_requests_swa_lock_before_0_5_20(
    version: str, soak: Soak
) -> None:
    """The shipped reproducer's streaming session first turn released its SWA lock early;
    its close drops the SWA part again, taking the count of the request whose lock holds the
    same node, and a prefill then evicts that node's SWA values out of the window the
    request reads: kvcanary's `swa-mapping-cleared-in-window` at the request's next decode,
    SGLang's checks silent, the live audit falling back (a count below its locks, which the
    whole `check` cannot see) only between the close and the eviction. The twin (the slot
    keeping the flag, the close leaving the SWA part alone): the same close takes nothing,
    and the history is silent on both sides without a fallback."""
    (as_is,) = soak(str(wheel_path(version)), "session-unlock")
    assert as_is["closes"] == [{"taken": 1, "others": 1}], as_is
    assert (as_is["found"], as_is["when"]) == ("swa-mapping-cleared-in-window", "plan"), as_is
    assert as_is["codes"] == ["swa-unmapped-in-window"] and as_is["sglang"] == {}, as_is
    assert as_is["fallbacks"] > 0, as_is
    (twin,) = soak(str(wheel_path(version)), "session-unlock", "twin")
    assert twin["closes"] == [{"taken": 0, "others": 1}], twin
    assert (twin["found"], twin["sglang"], twin["fallbacks"]) == (None, {}, 0), twin


@pytest.mark.parametrize("version", [_release("0.5.20")])
def test_the_session_close_reproducer_replays_clean_from_0_5_20(version: str, soak: Soak) -> None:
    """0.5.20's slot keeps its first turn's early SWA release and closes without it: the
    shipped reproducer runs clean on both sides, the live audit exact throughout."""
    (line,) = soak(str(wheel_path(version)), "session-unlock")
    assert (line["found"], line["sglang"], line["fallbacks"]) == (None, {}, 0), line


@pytest.mark.deep
@pytest.mark.parametrize("version", [_release("0.5.20"), _release("0.5.21")])
def test_the_storage_tier_sanity_check_reproducer_complains_on_0_5_20_alone(
    version: str, soak: Soak
) -> None:
    """The reproducer a soak kept where only SGLang complained (0.5.20, the storage tier, seed
    1, shrunk from 24 requests to 6): 0.5.20's `sanity_check` counts host-locked nodes
    against the SWA host LRU list a host lock takes them out of, at idle step 83, kvcanary
    silent; 0.5.21's check leaves host-locked nodes out, and the same history is silent."""
    (line,) = soak(str(wheel_path(version)), "host-locked")
    assert line["found"] is None, line
    if version == "0.5.20":
        assert line["sglang"] == {"sanity_check": 1}, line
        assert (line["sglang_step"], line["sglang_when"]) == (83, "idle"), line
        assert "Swa host LRU mismatch" in line["said"][0] and "host_only=true" in line["said"][0]
    else:
        assert line["sglang"] == {}, line


@pytest.mark.parametrize("version", [_release("0.5.21")])
def test_the_unified_allocator_evicts_short_of_its_own_plan_on_0_5_21(
    version: str, soak: Soak
) -> None:
    """SGLang 0.5.21's unified allocator plans the eviction an allocation needs in the shared
    byte budget (`reclaim_plan`), then hands the tree that plan as capacity targets
    (`evict_for_alloc`): each side's view counts the bytes the other's evictions free, so the
    tree stops once both views read the target, short of the plan, full tokens still
    evictable, and the allocation raises `Out of memory`; kvcanary silent. The twin: the same
    loop and history with the plan handed over as quotas (`evict`, as 0.5.22 does): every
    eviction meets its plan, the allocation fits, the history runs clean."""
    as_is, quotas = soak(str(wheel_path(version)), "evict-short")
    assert as_is["found"] == "crash RuntimeError" and as_is["sglang"] == {}, as_is
    assert "alloc_token_slots" in as_is["raised_in"], as_is
    *_, (asked, plan_full, _, full, _, available, left) = as_is["evictions"]
    assert full < plan_full and available < asked and left > 0, as_is
    assert (quotas["found"], quotas["sglang"]) == (None, {}), quotas
    assert quotas["evictions"], quotas
    for asked, plan_full, _, full, _, available, _ in quotas["evictions"]:
        assert full >= plan_full and available >= asked, quotas


@pytest.mark.parametrize(
    ("version", "rows"),
    [
        pytest.param(v, rows, marks=_release(v).marks)  # type: ignore[attr-defined]
        for v, rows in (("0.5.21", True), ("0.5.19", False))
    ],
)
def test_a_leak_dump_records_the_rows_the_checkers_requests_hold(
    version: str, rows: bool, soak: Soak, tmp_path: Path
) -> None:
    """The capture hook's leak dump at a decode step with a chunked request parked (streaming
    sessions on): 0.5.20 - 0.5.21's checker lists its requests by its getters (the last and
    running batches, the chunked request), so the dump records their rows and checks clean;
    0.5.13 - 0.5.19's has no getter for the chunked request, so it records none and the
    checks that need them stay off (clean too). Recorded from the batches alone, the parked
    request's row reads as leaked, with its KV: why those releases record nothing."""
    (line,) = soak(str(wheel_path(version)), "leak-rows", str(tmp_path))
    assert line["history"] is not None, line  # a chunk parked within 12 histories
    assert (line["rows_recorded"], line["chunk_row_in_rows"]) == (rows, rows), line
    assert line["codes"] == [], line
    assert {"req-row-leaked", "full-page-leaked"} <= set(line["batches_alone_codes"]), line


@pytest.mark.parametrize(
    "version",
    [
        pytest.param("0.5.22", marks=[*_release("0.5.22").marks, *DEEP]),  # type: ignore[attr-defined]
        _release("0.5.21"),
        pytest.param("0.5.20", marks=[*_release("0.5.20").marks, *DEEP]),  # type: ignore[attr-defined]
        # its lock without a receipt: the suite's, though its tree repeats others elsewhere
        pytest.param("0.5.19", marks=[*_release("0.5.19").marks[:1], pytest.mark.slow]),  # type: ignore[attr-defined]
        *(
            pytest.param(v, marks=[*_release(v).marks, *DEEP])  # type: ignore[attr-defined]
            for v in ("0.5.17", "0.5.16", "0.5.15")
        ),
    ],
)
def test_the_overlapped_loop_runs_clean_on_older_releases(version: str, soak: Soak) -> None:
    """`soak --overlap` models the overlapped loop of 0.5.22 as of 0.5.23 (the same loop,
    `_reqs_finishing_inflight` included), and 0.5.13 - 0.5.21's, whose decode allocates for
    the requests its queued result finishes (no `_reqs_finishing_inflight`): two histories
    of each under it (page sizes 1 and 4; consecutive prefills overlapped, then synced),
    every state audited live and by the whole `check`, are silent on both sides, and the
    loop's own paths ran: on 0.5.22 requests left out of a decode, on the older ones
    decoded, each then released holding the slot that decode allocated, nothing freed as
    over-allocated. The suite runs 0.5.21's and 0.5.19's (its lock without a receipt), the
    deep lane 0.5.22's (0.5.23's loop, which tests/integration/test_soak_overlap.py runs in
    process), 0.5.20's (0.5.21's), 0.5.17's and 0.5.16's (before and after the tree core) and
    0.5.15's (the KV lengths on the request itself; 0.5.13 - 0.5.14's swa histories meet the
    release's own SWA defect first)."""
    lines = soak(str(wheel_path(version)), "overlap")
    assert [line["page_size"] for line in lines] == [1, 4]
    for line in lines:
        assert line["found"] is None and line["sglang"] == [], line
    totals = {k: sum(line["counters"][k] for line in lines) for k in lines[0]["counters"]}
    assert totals["overlapped"] > 50 and totals["synced"] > 0, totals
    assert totals["stale_rows"] > 0 and totals["overallocated_freed"] == 0, totals
    if version == "0.5.22":
        assert totals["finishing_inflight"] > 0 and totals["finishing_decoded"] == 0, totals
    else:
        assert totals["finishing_inflight"] == totals["decode_skips"] == 0, totals
        assert totals["finishing_decoded"] > 10, totals
        assert totals["released_ahead"] >= totals["finishing_decoded"], totals


#: where the planted host eviction leak is named in `tests.release_soak`'s host tier history
#: of each release (the step it acts at)
HOST_LEAK_STEPS = {"0.5.19": 37, "0.5.20": 27, "0.5.21": 27, "0.5.22": 25}


def _host_release(version: str) -> pytest.param:  # type: ignore[valid-type]
    """0.5.19's case in the suite (the oldest tree the host-slot leak check reads, its
    components of the older names), the others' in the deep lane (the same holders, read
    through the same objects; 0.5.23's runs in process: tests/integration/test_soak_hicache.py)."""
    wheel = wheel_path(version)
    missing = pytest.mark.skipif(wheel is None, reason=missing_wheel(version))
    lane = (pytest.mark.slow,) if version == "0.5.19" else DEEP
    return pytest.param(version, marks=[missing, *lane])


@pytest.mark.parametrize("version", [_host_release(v) for v in HOST_LEAK_STEPS])
def test_the_host_slot_leak_check_runs_on_the_releases_before_0_5_23(
    version: str, soak: Soak
) -> None:
    """0.5.19 - 0.5.22's host tier keeps its host slots where 0.5.23's does but for the
    KV-sharded host pool, which none of them has (and 0.5.19 - 0.5.21's tree, not its
    controller, allocates a storage hit's, into the same records): the capture vouches
    that only the free lists and the nodes hold one on every state of a clean history, which
    stays silent, and a host eviction that forgets its host frees is named at the step it
    acts (before, the fact was left out on these releases, and the fault acted unseen)."""
    clean, planted = soak(str(wheel_path(version)), "hicache")
    assert (clean["found"], clean["sglang"], clean["steps"]) == (None, [], 60), clean
    assert clean["vouched"] == clean["audits"] > 0, clean
    assert planted["acted"] == 1 and planted["sglang"] == [], planted
    assert (planted["found"], planted["codes"]) == ("host-slot-leak", ["host-slot-leaked"])
    assert planted["step"] == HOST_LEAK_STEPS[version] and planted["vouched"] > 0, planted
