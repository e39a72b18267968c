"""SGLang's HiCache storage tier (L3, `--hicache-storage-backend file`) behind soak's host tier:
its file backend writing pages into a folder soak makes and removes, the controller's four
storage threads run in soak's own thread, and what the scheduler does with the tier.

The threads (the controller's `prefetch_thread_func`, `prefetch_io_aux_func`,
`prefetch_sync_thread_func`, `backup_thread_func`) are built by SGLang and never started
(`park_storage_threads`); each step, before the tree's `check_hicache_events`, `StoragePump`
runs each one's own loop in soak's thread until its queue is empty (its stop event reads set
once the queue is), in the order the work flows: backups, hit queries, page reads, the
completion acks. So every step sees a storage that kept up with what was asked before it,
in one order for a seed, with no thread racing the scheduler.

The scheduler's part (SGLang 0.5.23's `Scheduler`): a request entering the waiting queue
asks storage for what follows its host match (`_prefetch_kvcache`: `request_prefetch`), the
paced retries after the events (`retry_prefetches`), and at admission a request whose
prefetch is in flight waits (`check_prefetch_progress`) and pops its loaded span
(`pop_prefetch_loaded_span`). The rest (the hit's host slots at the drain, the insert of
what was read, backups to storage at a write-through ack) is SGLang's own.

On several ranks (`soak --tp N`) each rank has its own tier, all in one folder as a server's
ranks share theirs, each rank's pages named for it (`backend_context`), and each rank's
threads pumped inside its own step. The controller's storage threads meet the other ranks'
in all-reduces of their own (MIN of the hit counts, of the completed tokens) over gloo
groups SGLang makes of the TP group; `join_storage_groups` makes them of the ranks'
in-process group. A rank's backups finish late by lags of its own (`LaggingBackups`), and a
rank's store refuses some page writes of its own (`refusing_writes`), as a full or failing
store does. Lags alone never part the ranks' storage where it is read: a node's host copy
stays locked until every rank's backup of it is acked (the tree MIN-reduces the backup acks),
and only what is off the host is asked of storage. A page one rank's store refused is missing
there for good, so the hit query's MIN decides.
"""

from __future__ import annotations

import importlib
import json
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from queue import Queue
from typing import Any

from kvcanary_cli.soak.calls import prefix_len
from kvcanary_cli.soak.environment import environment_set

__all__ = [
    "BACKEND",
    "PREFETCH_THRESHOLD",
    "WRITE_LAG",
    "WRITE_REFUSALS",
    "LaggingBackups",
    "StoragePump",
    "StorageTier",
    "has_storage",
    "imperfect_store",
    "join_storage_groups",
    "lagging_backups",
    "park_storage_threads",
    "refusing_writes",
    "request_prefetch",
    "retry_prefetches",
    "server_args_fields",
    "storage_folder",
    "wait_for_prefetch",
]

#: the storage backend soak runs: SGLang's `file` (pages as files; no service, no CUDA)
BACKEND = "file"
#: the shortest span a prefetch asks for, in tokens (SGLang's `prefetch_threshold`, 256 by
#: default, is longer than soak's prompts; SGLang raises it to a page where a page is longer)
PREFETCH_THRESHOLD = 8
#: the most steps a rank's backup to storage finishes after it was queued (`soak --tp N`): a
#: write to a file system or a remote store takes many decode steps, each rank's its own
WRITE_LAG = 8
#: the share of a rank's new page writes its store refuses (`soak --tp N`): the file backend
#: returns False where its evictor finds no room or the write raises (a full disk, a failing
#: remote store), and SGLang's backup stops at the refused batch and acks what it wrote
WRITE_REFUSALS = 0.1
#: where the file backend reads its folder ahead of its config: set to soak's own while the
#: backend is built, so a user's setting never sends soak's pages elsewhere
_FOLDER_ENV = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"
_CONTROLLER = "sglang.srt.managers.cache_controller"
#: the controller's storage threads, as (its attribute, the queue its loop drains), in the
#: order work flows through them
_THREADS = (
    ("backup_thread", "backup_queue"),
    ("prefetch_thread", "prefetch_queue"),
    ("prefetch_io_aux_thread", "prefetch_buffer"),
    ("prefetch_sync_thread", "prefetch_sync_queue"),
)
#: the tree's calls the scheduler makes with a storage tier (0.5.23's names)
_TREE_CALLS = (
    "prefetch_from_storage",
    "check_prefetch_progress",
    "pop_prefetch_loaded_span",
    "is_backuped",
    "get_last_hash_value",
)


def has_storage(tree_class: Any) -> bool:
    """Whether a release's unified tree takes a storage tier the way soak drives it."""
    return all(callable(getattr(tree_class, name, None)) for name in _TREE_CALLS)


def server_args_fields(folder: str, prefetch_policy: str) -> dict[str, Any]:
    """The server args a HiCache server with the file backend in `folder` sets, under
    `prefetch_policy` (`soak.workload.PREFETCH_POLICIES`)."""
    return {
        "hicache_storage_backend": BACKEND,
        "hicache_storage_backend_extra_config": json.dumps(
            {"prefetch_threshold": PREFETCH_THRESHOLD, "file_storage_path": folder}
        ),
        "hicache_storage_prefetch_policy": prefetch_policy,
    }


class _ParkedThread:
    """A storage thread SGLang builds and soak never starts: `StoragePump` runs its target."""

    def __init__(self, *args: Any, target: Any = None, **kwargs: Any) -> None:
        self.target = target
        self.name = getattr(target, "__name__", "parked")

    def start(self) -> None:
        """Not started: soak's pump runs the loop (see the module doc)."""

    def join(self, timeout: float | None = None) -> None:
        """Nothing to wait for."""

    def is_alive(self) -> bool:
        return False


class _Threading:
    """The `threading` module as SGLang's controller sees it under soak: every name its own,
    but `Thread` builds a parked thread."""

    Thread = _ParkedThread

    def __getattr__(self, name: str) -> Any:
        return getattr(threading, name)


def park_storage_threads() -> None:
    """SGLang's cache controller builds its storage threads parked (idempotent; for the
    process: only the storage tier's threads are built there)."""
    module = importlib.import_module(_CONTROLLER)
    if not isinstance(module.threading, _Threading):
        setattr(module, "threading", _Threading())  # noqa: B010  (SGLang's module)


def _has_work(queue: Any) -> bool:
    """Whether a storage thread's queue holds work due now (a `LaggingBackups` queue's head
    may not be due yet)."""
    due = getattr(queue, "due", None)
    return not queue.empty() and (due is None or bool(due()))


class _SetWhenEmpty:
    """A stop event that reads set once `queue` holds no work due: a storage thread's loop,
    run in soak's thread, drains its queue and returns."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def is_set(self) -> bool:
        return not _has_work(self.queue)


class LaggingBackups(Queue):  # type: ignore[type-arg]
    """A rank's backup queue whose writes to storage each finish `lag()` steps of its
    `clock` late, in order (one backup thread: a backup never finishes before the one
    queued before it). With several ranks the lags differ, as on a server whose ranks' writes
    finish when they do: the tree's MIN of the ranks' backup acks decides, and a node's host
    copy stays locked until the last rank's write of it lands."""

    def __init__(self, clock: Callable[[], int], lag: Callable[[], int]) -> None:
        super().__init__()
        self._clock, self._lag = clock, lag
        self._ready: deque[int] = deque()
        self._last = 0

    def _put(self, item: Any) -> None:
        self._last = max(self._last, self._clock() + self._lag())
        self._ready.append(self._last)
        super()._put(item)

    def _get(self) -> Any:
        self._ready.popleft()
        return super()._get()

    def due(self) -> bool:
        """Whether the backup at the head of the queue has finished by now."""
        with self.mutex:
            return not self._ready or self._ready[0] <= self._clock()


def lagging_backups(controller: Any, clock: Callable[[], int], lag: Callable[[], int]) -> None:
    """Give a rank's storage tier backups that finish late (`LaggingBackups`); what is
    queued already keeps its place, due at once."""
    queue = LaggingBackups(clock, lag)
    old = controller.backup_queue
    while not old.empty():
        queue.put(old.get_nowait())
    controller.backup_queue = queue


def imperfect_store(controller: Any, clock: Callable[[], int], seed: int, rank: int) -> None:
    """Rank `rank`'s storage tier as a server's is (`soak --tp N`): its backups finishing
    0 to `WRITE_LAG` steps of `clock` late (`LaggingBackups`) and a `WRITE_REFUSALS` share of
    its new page writes refused (`refusing_writes`), each drawn from the workload's `seed`
    and the rank, so every rank's store differs from the others' in its own way."""
    import numpy as np

    lags = np.random.default_rng([seed, 0x5703, rank])
    refusals = np.random.default_rng([seed, 0x5EF, rank])
    lagging_backups(controller, clock, lambda: int(lags.integers(0, WRITE_LAG + 1)))
    refusing_writes(controller, lambda: bool(refusals.random() < WRITE_REFUSALS))


def refusing_writes(controller: Any, refused: Callable[[], bool]) -> None:
    """A rank's store that refuses a new page's write where `refused()` says so, as the file
    backend's `set` does before it writes (its evictor finding no room); a page already
    stored is never asked (`set` answers it stored first). The ranks' stores then differ for
    good in the pages refused, as a server's do."""
    backend = controller.storage_backend
    write = backend.set

    def set_page(key: str, value: Any = None, *args: Any, **kwargs: Any) -> bool:
        if not backend.exists(key) and refused():
            return False
        return bool(write(key, value, *args, **kwargs))

    backend.set = set_page


@dataclass
class StoragePump:
    """Runs the controller's parked storage threads to quiescence (see the module doc)."""

    controller: Any
    #: passes of each thread's loop that found work, by thread attribute
    runs: dict[str, int] = field(default_factory=dict)

    def run(self) -> None:
        """Each thread's loop while its queue holds work, over and over until none does."""
        controller = self.controller
        busy = True
        while busy:
            busy = False
            for thread_name, queue_name in _THREADS:
                queue = getattr(controller, queue_name, None)
                thread = getattr(controller, thread_name, None)
                if queue is None or thread is None or not _has_work(queue):
                    continue
                busy = True
                stop = controller.storage_stop_event
                controller.storage_stop_event = _SetWhenEmpty(queue)
                try:
                    thread.target()
                finally:
                    controller.storage_stop_event = stop
                self.runs[thread_name] = self.runs.get(thread_name, 0) + 1


@dataclass
class StorageTier:
    """A rank's storage tier: its folder (removed by `close`; the ranks of a history share
    one, as a server's do), its pump, and its place among the history's ranks."""

    folder: tempfile.TemporaryDirectory[str]
    pump: StoragePump | None = None
    rank: int = 0
    ranks: int = 1

    def close(self) -> None:
        """Remove the folder and every page in it (once: a rank after another finds it gone)."""
        self.folder.cleanup()


def storage_folder() -> tempfile.TemporaryDirectory[str]:
    """A fresh folder for one history's pages, in the system's temporary folder (never the
    user's working folder); removed at `StorageTier.close`, or when the process ends."""
    return tempfile.TemporaryDirectory(prefix="kvcanary-hicache-storage-")


@contextmanager
def backend_context(folder: str, rank: int = 0, ranks: int = 1) -> Iterator[None]:
    """While SGLang builds the backend: the file backend's folder variable names `folder`,
    and the process is rank `rank` of `ranks` where SGLang's runtime context asks (0.5.23
    reads the ranks to name its files: each rank's pages carry `_{rank}_{ranks}`, so ranks
    sharing one folder never read or write each other's)."""
    with environment_set(_FOLDER_ENV, folder), _placed(rank, ranks):
        yield


@contextmanager
def _placed(rank: int, ranks: int) -> Iterator[None]:
    """The runtime context's ranks as a plain tensor-parallel server's rank `rank` of
    `ranks` has them: attention and MoE split as wide as the TP group, one pipeline stage."""
    try:
        context = importlib.import_module("sglang.srt.runtime_context")
    except ImportError:
        yield
        return
    parallel = getattr(context, "get_parallel", None)
    override = getattr(parallel(), "override", None) if callable(parallel) else None
    if override is None:
        yield
        return
    wider = (
        {}
        if ranks == 1
        else {
            "tp_size": ranks,
            "attn_tp_rank": rank,
            "attn_tp_size": ranks,
            "moe_tp_rank": rank,
            "moe_tp_size": ranks,
        }
    )
    with override(tp_rank=rank, pp_rank=0, **wider):
        yield


#: the controller's groups for its storage threads' all-reduces, in the order its
#: `attach_storage_backend` makes them (each of the TP group's ranks, as a gloo group)
SYNC_GROUPS = ("prefetch_hits_sync_groups", "prefetch_completion_sync_groups")
_PARALLEL_STATE = "sglang.srt.distributed.parallel_state"
_MAKE_GROUP = "create_custom_parallel_group"


def join_storage_groups(controller: Any, handle: Any) -> None:
    """Make a rank's storage tier one of the ranks' (`handle`: its `tp_group.GroupHandle`):
    the controller's TP group is the rank's, and its storage threads' sync groups are made
    again by SGLang's own `_create_sync_groups`, as `attach_storage_backend` makes them when
    the TP group is wider than one (built on one rank, they are none). Each group SGLang makes
    (`create_custom_parallel_group`: a world collective in a server) is the ranks' group under
    that sync group's name, so each meets only itself, as a communicator of its own does."""
    from kvcanary_cli.soak.tp_group import collectives_in_process

    module = importlib.import_module(_PARALLEL_STATE)
    real = getattr(module, _MAKE_GROUP)
    controller.tp_group = handle
    try:
        with collectives_in_process():
            for name in SYNC_GROUPS:

                def made(group_ranks: Any, backend: str = "gloo", name: str = name) -> Any:
                    return handle.group.made(handle.rank, name)

                setattr(module, _MAKE_GROUP, made)
                setattr(controller, name, controller._create_sync_groups())
    finally:
        setattr(module, _MAKE_GROUP, real)


def request_prefetch(tree: Any, req: Any, storage_hit_end: int | None = None) -> None:
    """What SGLang's scheduler does as a request enters the waiting queue with a storage tier
    (`_prefetch_kvcache`): match it (no Mamba copy-on-write yet), and where its host match ends
    on a node backed up to host (or at the root), ask storage for the rest of its prompt."""
    req.init_next_round_input(tree, cow_mamba=False)
    host = req.last_host_node
    matched = prefix_len(req) + req.host_hit_length
    req.storage_prefetch_last_match_len = matched
    if not (tree.is_backuped(host) or tree.is_root(host)):
        return
    ids = req.full_untruncated_fill_ids
    end = req._compute_max_prefix_len(len(ids))
    prefix_keys = (
        tree.get_prefix_hash_values(host) if tree.hicache_storage_pass_prefix_keys else None
    )
    tree.prefetch_from_storage(
        req.cache_request_handle,
        host,
        ids[matched:end],
        tree.get_last_hash_value(host),
        prefix_keys,
        matched_prefix_tokens=ids[:matched],
        extra_key=req.extra_key,
        cache_salt=req.cache_salt,
        storage_hit_end=storage_hit_end,
    )


def retry_prefetches(tree: Any, waiting: list[Any], server_args: Any) -> int:
    """The scheduler's paced retries after the events (`_process_storage_prefetch_retries`):
    each due request asks storage again, its attempts counted. Returns how many asked."""
    retries = getattr(tree, "storage_prefetch_retries", None)
    if retries is None:
        return 0
    due = retries.pop_ready(
        waiting,
        server_args.hicache_storage_prefetch_retry_poll_interval,
        server_args.hicache_storage_prefetch_retry_max_attempts,
    )
    for req, storage_hit_end in due:
        req.storage_prefetch_retry_attempts += 1
        request_prefetch(tree, req, storage_hit_end)
    return len(due)


def wait_for_prefetch(tree: Any, req: Any) -> tuple[bool, int]:
    """At admission (the scheduler's `check_prefetch_progress`): whether the request may be
    admitted now (False: its prefetch is still in flight and the policy waits), and the
    tokens storage loaded for it (`pop_prefetch_loaded_span`), which SGLang notes on the
    request."""
    handle = req.cache_request_handle
    if not tree.check_prefetch_progress(handle):
        return False, 0
    loaded, start = tree.pop_prefetch_loaded_span(handle)
    if loaded > 0:
        req.storage_hit_length = loaded
        req.storage_hit_start = start
        req.host_hit_is_storage = False
    return True, int(loaded)
