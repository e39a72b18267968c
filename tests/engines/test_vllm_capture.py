"""`capture.snapshot` reads the prefix-cache map of both vLLM layouts it knows, by what the
loaded map holds: 0.33.0's (a key maps to its block, or to a dict of blocks by id) and
0.34.0's (a key maps to one block id; `_dup_ids` lists every id of a key several blocks carry),
and before 0.11.0 a plain dict of dicts by block id (before 0.10.2 keyed by named pairs).
The same pool read through either gives the same state, silent under `audit`. A map of
another make is one line naming what was found (never an AttributeError), and the assert
hook, which runs inside the engine, turns it into a logged note while vLLM's own exception
goes on unchanged. Small stand-ins of the manager's objects: no wheel needed."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np
import pytest

from kvcanary_cli.engines.vllm.capture import (
    VllmLayoutError,
    _split_key,
    _split_keys,
    snapshot,
)
from kvcanary_cli.engines.vllm.check import audit
from kvcanary_cli.engines.vllm.hook import watch_asserts


@dataclass(eq=False)
class _Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None
    is_null: bool = False
    prev_free_block: Any = None
    next_free_block: Any = None


class _Pool(SimpleNamespace):
    def free_blocks(self, blocks: Any) -> None:
        """vLLM's local assert, firing."""
        raise AssertionError("vLLM's own")


def _key(n: int) -> bytes:
    """A block hash with group id 0 in its last four bytes."""
    return bytes([n]) * 32 + (0).to_bytes(4, "big")


class _BlockHash(NamedTuple):
    """Before 0.10.2 a block's hash: an integer, with the block's tokens."""

    hash_value: int
    token_ids: tuple[int, ...]


class _KeyPair(NamedTuple):
    """Before 0.10.2 a `BlockHashWithGroupId`: the block's hash and the group id."""

    block_hash: _BlockHash
    group_id: int


def _pair(n: int) -> _KeyPair:
    """`_key(n)` as a named pair: the same 32 digest bytes as an integer, group 0."""
    return _KeyPair(_BlockHash(int.from_bytes(_key(n)[:-4], "big"), (n,)), 0)


def _manager(layout: str) -> Any:
    """Six blocks (0 the null block): r0 holds 1, 2 and r1 holds 1, 3; 4 and 5 are queued.
    Key A is block 1's; key B is carried by 3 (held) and 4 (queued, evictable). Before
    0.11.0 the map is a plain dict of dicts by block id, and before 0.10.2 its keys (and
    the blocks' hashes) named pairs."""
    blocks = [_Block(i) for i in range(6)]
    blocks[0].is_null = True
    blocks[1].ref_cnt, blocks[2].ref_cnt, blocks[3].ref_cnt = 2, 1, 1
    key: Any = _pair if layout == "0.10.1.1" else _key
    blocks[1].block_hash = key(1)
    blocks[3].block_hash = blocks[4].block_hash = key(2)
    head, tail = _Block(-1), _Block(-1)
    chain = [head, blocks[4], blocks[5], tail]
    for a, b in zip(chain, chain[1:], strict=False):
        a.next_free_block, b.prev_free_block = b, a
    queue = SimpleNamespace(fake_free_list_head=head, fake_free_list_tail=tail, num_free_blocks=2)
    table: Any
    if layout in ("0.10.1.1", "0.10.2"):
        table = {key(1): {1: blocks[1]}, key(2): {3: blocks[3], 4: blocks[4]}}
    elif layout == "0.33.0":
        table = SimpleNamespace(_cache={_key(1): blocks[1], _key(2): {3: blocks[3], 4: blocks[4]}})
    elif layout == "0.34.0":
        table = SimpleNamespace(
            _cache={_key(1): 1, _key(2): 3}, _dup_ids={_key(2): {3: None, 4: None}}
        )
    else:
        table = SimpleNamespace(_cache={_key(1): "block one", _key(2): 3})
    pool = _Pool(
        blocks=blocks,
        free_block_queue=queue,
        null_block=blocks[0],
        cached_block_hash_to_block=table,
        cached_block_hashes_by_block={},
    )
    group = type("FullAttentionManager", (), {})()
    group.block_size, group.kv_cache_spec = 16, SimpleNamespace()
    group.req_to_blocks = {"r0": [blocks[1], blocks[2]], "r1": [blocks[1], blocks[3]]}
    coordinator = SimpleNamespace(single_type_managers=[group])
    return SimpleNamespace(block_pool=pool, coordinator=coordinator)


def _map(state: Any) -> list[tuple[int, bytes]]:
    return sorted(
        (int(b), bytes(d)) for b, d in zip(state.map_block, state.map_digest, strict=True)
    )


@pytest.mark.parametrize(
    "keys",
    [
        [_key(1), _key(2), _key(1)[:-4] + (7).to_bytes(4, "big")],  # one length: one array
        [_key(1), b"\x05" * 20 + (3).to_bytes(4, "big")],  # lengths differ: padded
        [_pair(1), _pair(200)],  # before 0.10.2: named pairs
        [bytearray(_key(3)), _key(4)],  # not all bytes
        [b"\x01\x02", _key(5)[:3]],  # shorter than a group id
        [],
    ],
    ids=["one-length", "two-lengths", "named-pairs", "bytearray", "short", "none"],
)
def test_keys_split_together_as_one_by_one(keys: list[Any]) -> None:
    """Every step reads every cached block's key: split as one array where they are bytes of
    one length, key by key otherwise, the same groups and (zero-padded) digests either way."""
    groups, digests = _split_keys(keys)
    pairs = [_split_key(key) for key in keys]
    assert groups.dtype == np.int64 and list(groups) == [group for group, _ in pairs]
    assert [bytes(row).rstrip(b"\0") for row in digests] == [d.rstrip(b"\0") for _, d in pairs]
    assert digests.shape == (len(keys), max((len(d) for _, d in pairs), default=0))


def test_tables_are_read_in_group_request_index_order() -> None:
    """A second group's tables, one of them empty, and a request first seen in it: rows by
    group, then request (in the order the requests were met), then index."""
    manager = _manager("0.34.0")
    blocks = manager.block_pool.blocks
    second = type("SlidingWindowManager", (), {})()
    second.block_size, second.kv_cache_spec = 16, SimpleNamespace(sliding_window=32)
    second.req_to_blocks = {"r2": [blocks[5], blocks[2]], "r0": [], "r1": [blocks[3]]}
    manager.coordinator.single_type_managers.append(second)
    state = snapshot(manager)
    rows = np.stack([state.table_group, state.table_request, state.table_index, state.table_block])
    assert rows.T.tolist() == [
        [0, 0, 0, 1], [0, 0, 1, 2], [0, 1, 0, 1], [0, 1, 1, 3],
        [1, 1, 0, 3], [1, 2, 0, 5], [1, 2, 1, 2],
    ]  # fmt: skip
    assert state.request_ids == ("r0", "r1", "r2")


def test_both_layouts_of_the_prefix_cache_map_read_the_same() -> None:
    old, new = snapshot(_manager("0.33.0")), snapshot(_manager("0.34.0"))
    assert _map(new) == _map(old) == [(1, _key(1)[:-4]), (3, _key(2)[:-4]), (4, _key(2)[:-4])]
    assert np.array_equal(old.map_group, new.map_group)
    assert audit(old).findings == audit(new).findings == ()


@pytest.mark.parametrize("layout", ["0.10.1.1", "0.10.2"])
def test_a_plain_dict_map_of_named_pairs_or_bytes_reads_as_0_33s(layout: str) -> None:
    """Before 0.11.0 the map is a dict of dicts by block id, and before 0.10.2 a key is a
    named pair (the block's hash, an integer, and the group id): its digest is the integer's
    32 bytes, so the state is 0.33.0's, silent (was: a TypeError, refused)."""
    state = snapshot(_manager(layout))
    assert _map(state) == _map(snapshot(_manager("0.33.0")))
    assert list(state.map_group) == [0, 0, 0]
    assert np.array_equal(state.hash_digest, snapshot(_manager("0.33.0")).hash_digest)
    assert audit(state).findings == ()


def test_a_named_pair_key_whose_block_lost_its_hash_is_a_stale_entry() -> None:
    manager = _manager("0.10.1.1")
    manager.block_pool.blocks[4].block_hash = None
    [finding] = audit(snapshot(manager)).findings
    assert (finding.code.value, finding.block) == ("hash-entry-stale", 4)


def test_a_0_34_key_whose_block_lost_its_hash_is_a_stale_entry() -> None:
    """The id form still names the block: a map entry its block does not carry is found."""
    manager = _manager("0.34.0")
    manager.block_pool.blocks[4].block_hash = None
    [finding] = audit(snapshot(manager)).findings
    assert (finding.code.value, finding.block) == ("hash-entry-stale", 4)


def test_a_map_of_another_make_is_one_line_naming_what_it_holds() -> None:
    with pytest.raises(VllmLayoutError) as caught:
        snapshot(_manager("other"))
    [line] = str(caught.value).splitlines()
    assert "prefix-cache map" in line and "str" in line and "0.34.0" in line


def test_the_hook_notes_an_unreadable_map_and_vllms_exception_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = _manager("other")
    hook = watch_asserts(manager, tmp_path / "dumps")
    with caplog.at_level(logging.WARNING, "kvcanary.capture"), pytest.raises(AssertionError) as c:
        manager.block_pool.free_blocks([])
    assert c.value.args == ("vLLM's own",)
    assert hook.written == [] and not (tmp_path / "dumps").exists()
    [failure] = hook.failures
    assert failure.startswith("VllmLayoutError: ") and "prefix-cache map" in failure
    assert "prefix-cache map" in caplog.text


def test_the_hook_on_a_manager_without_a_pool_is_a_note_not_a_raise(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = SimpleNamespace(coordinator=None)
    with caplog.at_level(logging.WARNING, "kvcanary.capture"):
        hook = watch_asserts(manager, tmp_path)
    assert hook.failures == ["SimpleNamespace has no block_pool to read"]
    assert "not watching vLLM's asserts" in caplog.text and vars(manager) == {"coordinator": None}


def test_the_requests_tokens_in_flight_and_their_stale_share_are_read_where_counted() -> None:
    """A release's `Request` counts its tokens in flight from 0.26.0 and their stale share from
    0.27.0: the snapshot records what the requests have, the share only where every request
    counts it (0.26.0: not recorded, `check` reads its windows from the tokens computed), and
    nothing of either without the requests."""
    manager = _manager("0.33.0")

    def request(**counts: int) -> Any:
        return SimpleNamespace(num_tokens=40, num_computed_tokens=36, **counts)

    counted = {
        "r0": request(num_in_flight_tokens=3, num_stale_output_tokens=1),
        "r1": request(num_in_flight_tokens=0, num_stale_output_tokens=0),
    }
    state = snapshot(manager, requests=counted)
    assert state.request_ids == ("r0", "r1")
    assert state.request_num_in_flight is not None
    assert state.request_num_stale_in_flight is not None
    assert state.request_num_in_flight.tolist() == [3, 0]
    assert state.request_num_stale_in_flight.tolist() == [1, 0]
    older = snapshot(manager, requests={"r0": request(num_in_flight_tokens=2), "r1": request()})
    assert older.request_num_in_flight is not None
    assert older.request_num_in_flight.tolist() == [2, 0]
    assert older.request_num_stale_in_flight is None
    unread = snapshot(manager)
    assert unread.request_num_in_flight is None and unread.request_num_stale_in_flight is None
    assert audit(state).findings == audit(older).findings == ()
