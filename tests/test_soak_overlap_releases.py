"""soak's overlapped loop where releases differ (`soak.driver`, `soak.calls`), on stand-in
requests and batches: 0.5.22 on leave out of a decode the requests whose queued result
finishes them by length (`_reqs_finishing_inflight`), and skip the decode where memory is
short while they finish; 0.5.20 - 0.5.21 decode them too (allocating their next slot), and
retract where memory is short, finishing requests included."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kvcanary_cli.soak.calls import (
    lazy_checkpoint_flag,
    next_output_finishes_by_length,
    owned_len,
    skips_finishing_decode,
)


class _Older:
    """A request of 0.5.20 - 0.5.21: the fields soak reads, and no question of its own."""

    def __init__(self, outputs: int, max_new: int) -> None:
        self.output_ids = [1] * outputs
        self.sampling_params = SimpleNamespace(max_new_tokens=max_new)
        self.beam_group = None
        self.is_retracted = False


class _Asks(_Older):
    """A request of 0.5.22 on: it answers whether its next output finishes it by length."""

    def next_output_finishes_by_length(self) -> bool:
        return bool(len(self.output_ids) + 1 >= self.sampling_params.max_new_tokens)


def test_the_release_asks_whether_a_queued_result_finishes_a_request() -> None:
    """The loop leaves finishing requests out where the release's `Req` asks the question
    (0.5.22 on), not where it does not (0.5.20 - 0.5.21); soak's own reading of the question
    answers as SGLang's does, one output short of `max_new_tokens` and at it."""
    assert skips_finishing_decode(_Asks)
    assert not skips_finishing_decode(_Older)
    for outputs, max_new in ((3, 5), (4, 5), (5, 5), (0, 1), (0, 2)):
        asked = _Asks(outputs, max_new)
        assert next_output_finishes_by_length(asked) == asked.next_output_finishes_by_length()
        assert next_output_finishes_by_length(_Older(outputs, max_new)) == (outputs + 1 >= max_new)


def test_the_owned_length_a_release_keeps_in_each_shape() -> None:
    kv = SimpleNamespace(kv_committed_len=9)
    owned = SimpleNamespace(owned_kv_len=lambda: 7, kv=kv)
    effective = SimpleNamespace(effective_kv_committed_len=lambda: 8, kv=kv)  # 0.5.20
    assert (owned_len(owned), owned_len(effective), owned_len(SimpleNamespace(kv=kv))) == (7, 8, 9)


def test_the_lazy_checkpoint_flag_by_the_name_the_release_keeps() -> None:
    assert lazy_checkpoint_flag(SimpleNamespace(mamba_lazy_checkpoint=True)) == (
        "mamba_lazy_checkpoint"
    )
    assert lazy_checkpoint_flag(SimpleNamespace(mamba_lazy_is_insert=True)) == (
        "mamba_lazy_is_insert"
    )


class _Batch:
    """A running batch: SGLang's filter, memory check, retraction and decode preparation, as
    far as `update_running_batch` reads them."""

    def __init__(self, reqs: list[Any], fits: bool, retract: int = 0) -> None:
        self.reqs, self.fits, self.retract = list(reqs), fits, retract
        self.batch_is_full = True
        self.prepared: list[Any] | None = None
        self.retracted: list[Any] = []

    def batch_size(self) -> int:
        return len(self.reqs)

    def is_empty(self) -> bool:
        return not self.reqs

    def filter_batch(self, reqs_to_exclude: list[Any] | None = None) -> None:
        gone = {id(r) for r in reqs_to_exclude or []}
        self.reqs = [r for r in self.reqs if id(r) not in gone]

    def check_decode_mem(self) -> bool:
        return self.fits

    def retract_decode(self) -> tuple[list[Any], float, list[Any]]:
        """Retract the last `retract` requests (SGLang's order puts the longest last)."""
        self.retracted = self.reqs[len(self.reqs) - self.retract :]
        self.reqs = self.reqs[: len(self.reqs) - self.retract]
        for req in self.retracted:
            req.is_retracted = True
        return self.retracted, 0.5, []

    def prepare_for_decode(self) -> None:
        self.prepared = list(self.reqs)


def _update_running(
    asks: bool, fits: bool, retract: int = 0, test: Any = None, forward_ct: int = 0
) -> tuple[Any, Any, Any, Any]:
    """The scheduler's `update_running_batch` over a running batch of a request its queued
    result finishes (one output short) and one it does not, both in that result's batch;
    a release whose request asks (`asks`) or not; SGLang's retraction test switch (`test`,
    a `driver.RetractTest`) on or off, after `forward_ct` forwards. The batch, the decode
    returned, the finishing request and the scheduler."""
    from kvcanary_cli.soak.driver import Counters, Scheduler, StepInfo

    make = _Asks if asks else _Older
    finishing, going_on = make(4, 5), make(1, 5)
    batch = _Batch([going_on, finishing], fits, retract)
    scheduler = SimpleNamespace(
        running=batch,
        inflight=(SimpleNamespace(reqs=[going_on, finishing]), "decode"),
        _overlap=True,
        _skip_finishing=skips_finishing_decode(make),
        _exclude="reqs_to_exclude",
        _retract_args=(),
        _lazy=False,
        _sessions=None,
        waiting=[],
        counters=Counters(),
        _ask_storage=lambda req, retracted=False: None,
        _retract_test=test,
        _forward_ct=forward_ct,
    )
    scheduler._finishing_inflight = lambda b: Scheduler._finishing_inflight(scheduler, b)  # type: ignore[arg-type]
    decode = Scheduler._update_running(scheduler, StepInfo(step=0, mode="idle"))  # type: ignore[arg-type]
    return batch, decode, finishing, scheduler


def test_a_decode_leaves_out_what_its_queued_result_finishes_where_the_release_does() -> None:
    """0.5.22 on: the finishing request leaves the decode (its queued result releases it);
    the other is prepared for."""
    batch, decode, finishing, scheduler = _update_running(asks=True, fits=True)
    assert decode is batch and finishing not in batch.prepared and len(batch.prepared) == 1
    counters = scheduler.counters
    assert (counters.finishing_inflight, counters.finishing_decoded) == (1, 0)


def test_an_older_decode_allocates_for_what_its_queued_result_finishes() -> None:
    """0.5.20 - 0.5.21: the finishing request stays in the decode, which prepares (allocates)
    its next slot; counted, never left out."""
    batch, decode, finishing, scheduler = _update_running(asks=False, fits=True)
    assert decode is batch and finishing in batch.prepared and len(batch.prepared) == 2
    counters = scheduler.counters
    assert (counters.finishing_inflight, counters.finishing_decoded) == (0, 1)


@pytest.mark.parametrize(("forward_ct", "retracts"), [(3, True), (4, False), (5, False)])
def test_sglang_s_retraction_switch_retracts_where_memory_fits(
    forward_ct: int, retracts: bool
) -> None:
    """SGLANG_TEST_RETRACT on (interval 3): a decode chosen after a multiple of 3 forwards
    retracts though memory fits, as `update_running_batch` does; between them, nothing."""
    from kvcanary_cli.soak.driver import RetractTest

    test = RetractTest(interval=3, no_prefill_bs=2**31)
    batch, decode, finishing, scheduler = _update_running(
        asks=False, fits=True, retract=1, test=test, forward_ct=forward_ct
    )
    assert batch.retracted == ([finishing] if retracts else [])
    assert scheduler.waiting == batch.retracted and decode is batch
    assert scheduler.counters.retractions == int(retracts)


def test_without_the_switch_memory_that_fits_retracts_nothing() -> None:
    batch, _, _, scheduler = _update_running(asks=False, fits=True, retract=1, forward_ct=3)
    assert batch.retracted == [] and scheduler.counters.retractions == 0


def test_short_memory_skips_the_decode_or_retracts_by_release() -> None:
    """Memory short while a request finishes: 0.5.22 on skip the decode for a step (the
    queued result frees it) and retract nothing; 0.5.20 - 0.5.21 retract, here the
    finishing request, which goes back to the waiting queue (its queued result passes over
    it), and decode the rest."""
    batch, decode, _, scheduler = _update_running(asks=True, fits=False, retract=1)
    counters = scheduler.counters
    assert decode is None and batch.retracted == [] and batch.prepared is None
    assert (counters.decode_skips, counters.retractions) == (1, 0)
    batch, decode, finishing, scheduler = _update_running(asks=False, fits=False, retract=1)
    counters = scheduler.counters
    assert decode is batch and batch.retracted == [finishing]
    assert scheduler.waiting == [finishing] and finishing not in batch.prepared
    assert (counters.decode_skips, counters.retractions) == (0, 1)
    assert (counters.finishing_retracted, counters.finishing_decoded) == (1, 0)
