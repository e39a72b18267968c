"""`soak.tp_group`: the tensor-parallel group's all-reduce stood in for in one process (each
rank's step in a thread, one at a time, meeting at each collective), and `soak.hicache`'s
late copies (each rank's acks ready when its own copies finish). No SGLang needed.

Clean twin: ranks that bring the same value take it unchanged, and a step with no collective
runs each rank whole, in rank order. Caught: ranks that bring different counts take the MIN;
a rank that ends its step without the collective another waits at parts the ranks.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import pytest

torch = pytest.importorskip("torch")

from kvcanary_cli.soak.hicache import LateEvent, join_rank_group, lagging_acks  # noqa: E402
from kvcanary_cli.soak.tp_group import (  # noqa: E402
    GroupHandle,
    RankGroup,
    RanksParted,
    collectives_in_process,
)


def _group(log: list[str], size: int = 2) -> RankGroup:
    return RankGroup(size, lambda r: log.append(f"enter {r}"), lambda r: log.append(f"leave {r}"))


def _reducing_step(group: RankGroup, rank: int, value: int, log: list[str]) -> Any:
    def step() -> int:
        log.append(f"{rank} before")
        tensor = torch.tensor([value, -value], dtype=torch.int64)
        torch.distributed.all_reduce(
            tensor, op=torch.distributed.ReduceOp.MIN, group=group.handle(rank)
        )
        log.append(f"{rank} after")
        return int(tensor[0])

    return step


def test_ranks_take_the_min_and_run_one_at_a_time_in_rank_order() -> None:
    log: list[str] = []
    group = _group(log)
    with collectives_in_process():
        got = group.run([_reducing_step(group, r, v, log) for r, v in ((0, 3), (1, 1))])
    assert got == [1, 1]
    steps = [line for line in log if not line.startswith(("enter", "leave"))]
    assert steps == ["0 before", "1 before", "0 after", "1 after"]
    # each hand-over swaps the rank's counters: out before the next rank's come in
    assert log[:4] == ["enter 0", "0 before", "leave 0", "enter 1"]
    assert (group.collectives, group.decided) == (1, 1)


def test_equal_values_come_back_unchanged() -> None:
    log: list[str] = []
    group = _group(log)
    with collectives_in_process():
        got = group.run([_reducing_step(group, r, 2, log) for r in (0, 1)])
    assert got == [2, 2]
    assert (group.collectives, group.decided) == (1, 0)


def _ran(log: list[str], rank: int) -> int:
    log.append(f"{rank} ran")
    return rank


def test_a_step_with_no_collective_runs_each_rank_whole() -> None:
    log: list[str] = []
    group = _group(log, size=3)
    got = group.run([partial(_ran, log, r) for r in range(3)])
    assert got == [0, 1, 2]
    assert [line for line in log if "ran" in line] == ["0 ran", "1 ran", "2 ran"]
    assert group.collectives == 0


def test_a_rank_that_skips_the_collective_parts_the_ranks() -> None:
    log: list[str] = []
    group = _group(log)
    parted: list[str] = []

    def waiting() -> None:
        try:
            _reducing_step(group, 0, 1, log)()
        except RanksParted as exc:
            parted.append(str(exc))

    with collectives_in_process():
        group.run([waiting, lambda: None])
    assert len(parted) == 1 and "rank(s) 1 ended the step" in parted[0]
    assert group.collectives == 0


def _reduce_on(handle: GroupHandle, value: int) -> int:
    tensor = torch.tensor([value], dtype=torch.int32)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MIN, group=handle)
    return int(tensor[0])


def test_ranks_meet_on_a_made_group_and_part_across_two() -> None:
    """A group SGLang makes of the TP group (a storage tier's gloo group) is met on its own and
    counted under its name; a rank at the TP group's all-reduce while the other waits at the
    made group's parts the ranks, as two communicators in a server never meet."""
    group = _group([])
    with collectives_in_process():
        got = group.run(
            [partial(_reduce_on, group.made(r, "prefetch-hits"), 4 - r) for r in (0, 1)]
        )
    assert got == [3, 3]
    assert (group.met, group.decided_in) == ({"prefetch-hits": 1}, {"prefetch-hits": 1})
    parted: list[str] = []

    def waiting(handle: GroupHandle) -> None:
        try:
            _reduce_on(handle, 1)
        except RanksParted as exc:
            parted.append(str(exc))

    with collectives_in_process():
        group.run([partial(waiting, group.handle(0)), partial(waiting, group.made(1, "hits"))])
    assert len(parted) == 2 and "different groups (hits, tp)" in parted[0]
    assert group.collectives == 1


def test_an_error_in_a_rank_reaches_the_caller() -> None:
    group = _group([])

    def broken() -> None:
        raise ValueError("rank 1's own")

    with pytest.raises(ValueError, match="rank 1's own"):
        group.run([lambda: None, broken])


def test_torch_gets_its_own_collectives_back() -> None:
    real = torch.distributed.all_reduce
    with collectives_in_process():
        assert torch.distributed.all_reduce is not real
        handle = GroupHandle(_group([]), 1)
        assert torch.distributed.get_world_size(group=handle) == 2
        assert torch.distributed.get_rank(group=handle) == 1
        assert torch.distributed.get_process_group_ranks(handle) == [0, 1]
    assert torch.distributed.all_reduce is real


# -- each rank's copies finishing late -----------------------------------------------------


class _Event:
    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class _Ack(NamedTuple):
    start_event: Any
    finish_event: Any
    node_ids: list[int]


class _Controller:
    def __init__(self) -> None:
        self.ack_write_queue: list[Any] = []
        self.ack_load_queue: list[Any] = []


class _Tree:
    def __init__(self) -> None:
        self.cache_controller = _Controller()
        self.tp_group: Any = None
        self.tp_world_size = 1


def test_an_ack_is_ready_its_lag_after_the_next_poll_and_in_order() -> None:
    clock = [0]
    lags = iter([2, 0])
    tree = _Tree()
    lagging_acks(tree, lambda: clock[0], lambda: next(lags))
    queue = tree.cache_controller.ack_write_queue
    queue.append(_Ack(_Event(), _Event(), [1]))
    queue.append(_Ack(_Event(), _Event(), [2]))  # no lag, but behind the first on its stream
    ready = []
    for clock[0] in range(4):
        ready.append([ack.finish_event.query() for ack in queue])
    assert ready == [[False, False], [False, False], [False, False], [True, True]]
    assert queue[0].node_ids == [1]  # the ack is the controller's, its event alone is late


def test_a_synchronised_event_is_done_at_once() -> None:
    event = LateEvent(_Event(), ready_at=10, clock=lambda: 0)
    assert not event.query()
    event.synchronize()
    assert event.query()


def test_joining_a_group_sets_what_the_tree_reads() -> None:
    tree = _Tree()
    handle = GroupHandle(_group([]), 1)
    join_rank_group(tree, handle, 2)
    assert (tree.tp_group, tree.tp_world_size) == (handle, 2)
