"""Storage histories' returns (`random_workload`'s `returns`): requests that come back late to
an early request's prompt, so the storage tier serves what the host tier evicted by then.

Drawn apart: the workloads of every other history are those drawn before returns existed
(digests pinned from the commit before them), and a storage history's other arrivals too.
"""

from __future__ import annotations

import hashlib

import pytest

from kvcanary_cli.soak.command import STEM_RETURNS, history_workload
from kvcanary_cli.soak.workload import RETURN_MIN, Workload, random_workload


def _digest(workload: Workload) -> str:
    return hashlib.sha256(workload.to_json().encode()).hexdigest()[:16]


@pytest.mark.parametrize(
    ("workload", "digest"),
    [
        (lambda: history_workload(0, 0, 6), "5cf76e05c95f7b3f"),
        (lambda: history_workload(1, 4, 6, 4, hicache=True), "4509e36a1fb4b4c0"),
        (
            lambda: history_workload(7, 2, 1, 1, "mamba", path_cap=True, hicache=True),
            "8a231f67bf0df61f",
        ),
        (lambda: history_workload(0, 3, 6, 16, radix=True), "4136f8d23609b3f1"),
        (lambda: history_workload(0, 0, 1, storage=True), "5cf76e05c95f7b3f"),
        (
            lambda: random_workload(
                5, steps=80, requests=20, max_prompt=60, max_new=20, aborts=0.15, sessions=4
            ),
            "01fb59c21960e8b9",
        ),
    ],
    ids=["swa", "hicache", "mamba", "radix", "storage-without-host-tier", "random"],
)
def test_histories_without_the_storage_tier_draw_what_they_drew_before(
    workload: object, digest: str
) -> None:
    assert callable(workload)
    assert _digest(workload()) == digest


def test_a_storage_history_comes_back_late_to_early_prompts_and_keeps_its_other_arrivals() -> None:
    from dataclasses import replace

    workload = history_workload(0, 0, 1, hicache=True, storage=True)
    last = workload.steps * 3 // 4
    back = [a for a in workload.arrivals if a.step >= last]
    kept = [a for a in workload.arrivals if a.step < last]
    assert len(back) == STEM_RETURNS
    early = [a.prompt for a in kept if a.step < last // 3]
    for arrival in back:
        assert arrival.step < last + (workload.steps - last) // 2
        assert arrival.abort_after is None and arrival.session is None
        assert any(
            len(old) >= RETURN_MIN
            and arrival.prompt[:RETURN_MIN] == old[:RETURN_MIN]
            and arrival.prompt != old
            for old in early
        )
    # the other arrivals: those drawn before returns (the digest pinned before them)
    assert _digest(replace(workload, arrivals=tuple(kept))) == "601b94ac7fab9c25"
    assert Workload.from_json(workload.to_json()) == workload  # a reproducer replays them


def test_no_return_where_no_early_request_is_long_enough() -> None:
    drawn = random_workload(0, steps=80, requests=20, max_prompt=RETURN_MIN - 1, max_new=4)
    assert (
        random_workload(0, steps=80, requests=20, max_prompt=RETURN_MIN - 1, max_new=4, returns=4)
        == drawn
    )
