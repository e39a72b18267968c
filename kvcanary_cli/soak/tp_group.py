"""The tensor-parallel group's all-reduce in one process (`soak --tp N --hicache`).

With the host tier, SGLang's ranks meet inside a step: each step's `check_hicache_events`
MIN-reduces the counts of finished write-throughs and load-backs over the TP group
(`torch.distributed.all_reduce` on the tree's `tp_group`), so every rank takes the same
number of acks however its own copies went. A rank cannot finish its step before the others
have reached that point, so soak cannot run rank 0's step whole and then rank 1's.

`RankGroup.run` runs one step of every rank, each in a thread of its own, one at a time, in
rank order: a rank runs until it reaches a collective (or ends its step), then the next rank
runs; once every rank has reached the collective, the reduced value is written into each
rank's tensor, as the all-reduce does, and rank 0 runs on. Only one thread runs at any time,
so each rank's process-wide counters (`tp.RankGlobals`) are swapped at each hand-over.
A rank that ends its step while another waits at a collective (a server's ranks would hang)
raises `RanksParted` in the waiting rank.

A collective belongs to a group: the tree's `tp_group` (`"tp"`), or one SGLang makes of it
(with a storage tier, the controller's gloo groups for its prefetch hit queries and
completions: `soak.storage.join_storage_groups`). In a server each group is a communicator
of its own, matched by the order each rank made it in: ranks waiting at all-reduces of
different groups never meet, so that too raises `RanksParted`. Each group's collectives are
counted (`met`), and those the reduction decided (`decided_in`).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["TP", "GroupHandle", "RankGroup", "RanksParted"]

T = TypeVar("T")


class RanksParted(Exception):
    """A rank waits at a collective that another rank ended its step without entering."""


#: the name of the tree's own group (`GroupHandle.name`)
TP = "tp"


@dataclass(frozen=True)
class GroupHandle:
    """What a rank's tree (or controller) holds as a process group: the ranks' group, the
    rank's place in it, and which of the group's communicators it is (`name`: `TP`, or one
    made of it, `RankGroup.made`)."""

    group: RankGroup
    rank: int
    name: str = TP


class _Rank(Generic[T]):
    """One rank's thread for one step, with the hand-over events."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.back = threading.Event()
        self.ended = False
        self.result: T | None = None
        self.error: BaseException | None = None
        #: the tensor, op and communicator this rank waits at a collective with
        self.waiting: tuple[Any, Any, str] | None = None
        self.parted: str | None = None


class RankGroup:
    """N ranks' steps in lockstep threads, meeting at each all-reduce (see module)."""

    def __init__(
        self, size: int, enter: Callable[[int], None], leave: Callable[[int], None]
    ) -> None:
        self.size = size
        self._enter, self._leave = enter, leave
        self._ranks: list[_Rank[Any]] = []
        #: collectives met (every rank took part), per communicator (`GroupHandle.name`)
        self.met: dict[str, int] = {}
        #: of those, where the ranks brought different values (the reduction decided)
        self.decided_in: dict[str, int] = {}

    @property
    def collectives(self) -> int:
        """Collectives met so far, on every communicator."""
        return sum(self.met.values())

    @property
    def decided(self) -> int:
        """Of those, the ones the reduction decided."""
        return sum(self.decided_in.values())

    def handle(self, rank: int) -> GroupHandle:
        """What rank `rank`'s tree holds as its group."""
        return GroupHandle(self, rank)

    def made(self, rank: int, name: str) -> GroupHandle:
        """Rank `rank`'s handle on a communicator SGLang makes of the group (`new_group`,
        its `create_custom_parallel_group`), named by what it is for: every rank must make
        the same ones, in the same order, or its all-reduces meet none of the others'."""
        return GroupHandle(self, rank, name)

    # -- inside a rank's thread --------------------------------------------------------------

    def _park(self, rank: int) -> None:
        """Hand the turn back to the coordinator and wait for this rank's next one."""
        state = self._ranks[rank]
        self._leave(rank)
        state.go.clear()
        state.back.set()
        state.go.wait()
        self._enter(rank)

    def all_reduce(self, rank: int, tensor: Any, op: Any, name: str = TP) -> None:
        """Rank `rank`'s part of an all-reduce on communicator `name`: wait for every
        rank's, then take the reduced value in place."""
        state = self._ranks[rank]
        state.waiting = (tensor, op, name)
        self._park(rank)
        state.waiting = None
        if state.parted is not None:
            raise RanksParted(state.parted)

    # -- the coordinator (the soak's own thread) ---------------------------------------------

    def _resume(self, rank: int) -> None:
        state = self._ranks[rank]
        state.back.clear()
        state.go.set()
        state.back.wait()

    def _reduce(self) -> None:
        import torch

        waiting = [state.waiting for state in self._ranks if state.waiting is not None]
        tensors = [tensor for tensor, _, _ in waiting]
        ops = {str(op) for _, op, _ in waiting}
        names = sorted({name for _, _, name in waiting})
        shapes = {(tuple(t.shape), t.dtype) for t in tensors}
        parted = len(tensors) != self.size or len(ops) != 1 or len(shapes) != 1 or len(names) != 1
        if parted:
            ended = [str(i) for i, state in enumerate(self._ranks) if state.waiting is None]
            why = (
                f"rank(s) {', '.join(ended)} ended the step without the all-reduce the others "
                "wait at"
                if ended
                else f"the ranks wait at all-reduces of different groups ({', '.join(names)})"
                if len(names) != 1
                else "the ranks' all-reduces differ in op or shape"
            )
            for state in self._ranks:
                if state.waiting is not None:
                    state.parted = why
            return
        op = self._ranks[0].waiting[1]  # type: ignore[index]
        stacked = torch.stack([t.clone() for t in tensors])
        if op == torch.distributed.ReduceOp.MIN:
            reduced = stacked.min(dim=0).values
        elif op == torch.distributed.ReduceOp.MAX:
            reduced = stacked.max(dim=0).values
        else:
            reduced = stacked.sum(dim=0).to(tensors[0].dtype)
        decided = int(any(not torch.equal(t, reduced) for t in tensors))
        for t in tensors:
            t.copy_(reduced)
        name = names[0]
        self.met[name] = self.met.get(name, 0) + 1
        self.decided_in[name] = self.decided_in.get(name, 0) + decided

    def run(self, steps: Sequence[Callable[[], T]]) -> list[T | None]:
        """Each rank's `steps[rank]()`, in lockstep (see module); what each returned."""
        self._ranks = [_Rank() for _ in steps]
        threads = []
        for rank, step in enumerate(steps):
            context = contextvars.copy_context()  # what the soak's thread set, as each rank's

            def main(rank: int = rank, step: Callable[[], T] = step, ctx: Any = context) -> None:
                state = self._ranks[rank]
                state.go.wait()
                self._enter(rank)
                try:
                    state.result = ctx.run(step)
                except BaseException as exc:  # handed to the soak's thread
                    state.error = exc
                finally:
                    self._leave(rank)
                    state.ended = True
                    state.back.set()

            thread = threading.Thread(target=main, name=f"kvcanary-rank-{rank}", daemon=True)
            thread.start()
            threads.append(thread)
        live = list(range(len(steps)))
        while live:
            for rank in live:
                self._resume(rank)
            live = [rank for rank in live if not self._ranks[rank].ended]
            if live:
                self._reduce()
        for thread in threads:
            thread.join()
        for state in self._ranks:
            if state.error is not None:
                raise state.error
        return [state.result for state in self._ranks]


@contextmanager
def collectives_in_process() -> Iterator[None]:
    """`torch.distributed`'s all-reduce, barrier, world size, rank and a group's ranks
    answered by a `RankGroup` for a group that is a `GroupHandle` (any other group: torch's
    own)."""
    import torch.distributed as dist

    saved = {name: getattr(dist, name) for name in _PATCHED}

    def all_reduce(tensor: Any, op: Any = dist.ReduceOp.SUM, group: Any = None, **kw: Any) -> Any:
        if isinstance(group, GroupHandle):
            group.group.all_reduce(group.rank, tensor, op, group.name)
            return None
        return saved["all_reduce"](tensor, op=op, group=group, **kw)

    def barrier(group: Any = None, **kw: Any) -> Any:
        if isinstance(group, GroupHandle):
            import torch

            group.group.all_reduce(group.rank, torch.zeros(1), dist.ReduceOp.SUM, group.name)
            return None
        return saved["barrier"](group=group, **kw)

    def get_world_size(group: Any = None) -> int:
        if isinstance(group, GroupHandle):
            return group.group.size
        return int(saved["get_world_size"](group=group))

    def get_rank(group: Any = None) -> int:
        if isinstance(group, GroupHandle):
            return group.rank
        return int(saved["get_rank"](group=group))

    def get_process_group_ranks(group: Any) -> list[int]:
        if isinstance(group, GroupHandle):
            return list(range(group.group.size))
        return list(saved["get_process_group_ranks"](group))

    stand_ins = {
        "all_reduce": all_reduce,
        "barrier": barrier,
        "get_world_size": get_world_size,
        "get_rank": get_rank,
        "get_process_group_ranks": get_process_group_ranks,
    }
    for name, value in stand_ins.items():
        setattr(dist, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(dist, name, value)


_PATCHED = ("all_reduce", "barrier", "get_world_size", "get_rank", "get_process_group_ranks")
