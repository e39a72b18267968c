"""Which requests a leak dump counts as holding rows, by what the release's checker offers:
0.5.22 on its own `_requests_owning_rows`; 0.5.20 - 0.5.21 its three getters (the last batch,
the running batch, the chunked request), each request once; 0.5.13 - 0.5.19, whose checker
has no getter for the chunked request, none (no row recorded as held: a chunk parked between
chunks sits in neither batch, and its row would read as leaked). The real checkers' dumps are
tested on the wheels (`tests/integration/test_soak_releases.py`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kvcanary_cli.capture.leaks import _requests


def _batch(*reqs: Any) -> Any:
    return SimpleNamespace(reqs=list(reqs))


A, B, CHUNK = object(), object(), object()


def test_the_getters_give_each_request_once_and_the_parked_chunk() -> None:
    decode = _batch(A, B)  # after a decode the running batch is the last batch
    checker = SimpleNamespace(
        get_last_batch=lambda: decode,
        get_running_batch=lambda: decode,
        get_chunked_req=lambda: CHUNK,
    )
    assert _requests(checker) == [A, B, CHUNK]


def test_a_prefill_step_gives_both_batches_and_no_chunk_twice() -> None:
    checker = SimpleNamespace(
        get_last_batch=lambda: _batch(CHUNK, B),
        get_running_batch=lambda: _batch(A),
        get_chunked_req=lambda: CHUNK,
    )
    assert _requests(checker) == [CHUNK, B, A]


def test_no_batch_and_no_chunk_is_no_request() -> None:
    checker = SimpleNamespace(
        get_last_batch=lambda: None, get_running_batch=lambda: None, get_chunked_req=lambda: None
    )
    assert _requests(checker) == []


def test_without_a_getter_for_the_chunked_request_nothing_is_listed() -> None:
    checker = SimpleNamespace(get_last_batch=lambda: _batch(A), get_running_batch=lambda: None)
    assert _requests(checker) is None


def test_the_checkers_own_list_comes_first() -> None:
    checker = SimpleNamespace(
        _requests_owning_rows=lambda: [B],
        get_last_batch=lambda: _batch(A),
        get_running_batch=lambda: None,
        get_chunked_req=lambda: None,
    )
    assert _requests(checker) == [B]
