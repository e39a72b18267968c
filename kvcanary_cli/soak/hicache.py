"""SGLang's host tier (HiCache, `--enable-hierarchical-cache`) on soak's stack: the tree's
`init_hicache` as SGLang's cache registry calls it (its `HostPoolGroup` and
`HybridCacheController`), and what the scheduler does with it each step.

Only the CUDA-only data movement is stood in for: `_cuda_host_register` (pinning the host
buffer), the `sgl_kernel` copy kernels the host pools import on CUDA, and the L2 transfer's
probe for events that time a copy, which a CPU's cannot (answered no, as SGLang's own probe
answers, without the warning it logs once a process: noise about soak's CPU on every soak's
stderr). The bookkeeping never reads the copied bytes, and on a CPU the controller's events
are complete when queried, so every ack is ready at the next step's poll, as on a GPU whose
copies kept up.
Every bookkeeping call (backup on insert, the acks, load-back at admission, host eviction
when a backup finds the host pool short, write-back at device eviction) is SGLang's own.

The scheduler's part (SGLang 0.5.23's `Scheduler`): `check_hicache_events` at the start of
each `get_next_batch_to_run` (write-through and load-back acks drained: a node's backup
lock and a load-back's locks released), and `ready_to_load_host_cache` on each new prefill
batch before `prepare_for_extend` (the load-backs its admissions queued start). The
admission itself (`PrefillAdder.add_one_req`: a host hit loaded back through
`init_load_back`) is SGLang's adder's, which soak already runs.

The tree holds locks of its own while a transfer is in flight: a write-through backup locks
its node until its ack (`ongoing_write_through`: node, receipt), a load-back its node and
its host copy (`ongoing_load_back`: node, receipt, host receipt). `inflight_locks` lists
them, so the audit counts them beside the requests' locks.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvcanary_cli.capture.tree import inflight_tree_locks
from kvcanary_cli.soak.workload import WRITE_POLICIES

__all__ = [
    "COPY_KERNELS",
    "HOST_RATIO",
    "WRITE_POLICIES",
    "InflightLock",
    "attach_hicache",
    "has_hicache",
    "inflight_locks",
    "join_rank_group",
    "lagging_acks",
    "server_args_fields",
    "stand_in_cuda",
    "unpin_host_pools",
]


#: host pool tokens per device pool token (`--hicache-ratio`): small enough that backups find
#: the host pool short and evict host-only nodes within a history
HOST_RATIO = 1.25

#: the copy kernels `pool_host/mha.py` and `pool_host/mamba.py` import on CUDA only
COPY_KERNELS = (
    "transfer_kv_direct",
    "transfer_kv_all_layer_direct_lf_pf",
    "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_per_layer_mla",
    "transfer_kv_mamba_lf_pf",
    "transfer_kv_mamba_pf_lf",
)
_HOST_POOLS = "sglang.srt.mem_cache.pool_host"
#: where older releases keep their host pools, beside `pool_host` (0.5.15)
_OLD_HOST_POOLS = "sglang.srt.mem_cache.memory_pool_host"
#: the host tier's transfer timing (0.5.23 on)
_L2_TRANSFER = "sglang.srt.mem_cache.l2_transfer"


def has_hicache(tree_class: Any) -> bool:
    """Whether a release's unified tree (`UnifiedRadixCache`) takes a host tier: its
    `init_hicache` and the scheduler's two entry points (`check_hicache_events`,
    `ready_to_load_host_cache`)."""
    names = ("init_hicache", "check_hicache_events", "ready_to_load_host_cache")
    return all(callable(getattr(tree_class, name, None)) for name in names)


def _noop(*args: object, **kwargs: object) -> None:
    """What a CUDA-only copy or pinning does on soak's CPU: nothing (no byte is read)."""


def stand_in_cuda() -> None:
    """Stand in for the CUDA-only calls of SGLang's host pools (see the module doc). Idempotent;
    the stand-ins stay for the process (a CPU has nothing they could do)."""
    for name in (f"{_HOST_POOLS}.common", _OLD_HOST_POOLS):
        try:
            module = importlib.import_module(name)
        except ImportError:  # a release without that module
            continue
        if hasattr(module, "_cuda_host_register"):
            setattr(module, "_cuda_host_register", _noop)  # noqa: B010  (SGLang's module)
    # the host pools: one module each (0.5.16 on), or all in one (older)
    for name in (f"{_HOST_POOLS}.mha", f"{_HOST_POOLS}.mamba", _OLD_HOST_POOLS):
        try:
            module = importlib.import_module(name)
        except ImportError:  # a release without that pool
            continue
        for kernel in COPY_KERNELS:
            setattr(module, kernel, _noop)
    try:  # 0.5.23 on: transfers timed where the device's events can be
        l2_transfer = importlib.import_module(_L2_TRANSFER)
    except ImportError:
        return
    if hasattr(l2_transfer, "_timing_events_supported"):
        setattr(l2_transfer, "_timing_events_supported", _untimed)  # noqa: B010


def _untimed() -> bool:
    """Whether the device's events can time a transfer: a CPU's cannot."""
    return False


def server_args_fields(policy: str, *, mamba: bool) -> dict[str, Any]:
    """The server args a HiCache server of `policy` sets: the direct I/O backend (no CUDA
    kernels), a layer-first host layout (a Mamba layout's host pool, with or without the
    extra buffer, takes page-first only)."""
    return {
        "enable_hierarchical_cache": True,
        "hicache_ratio": HOST_RATIO,
        "hicache_io_backend": "direct",
        "hicache_mem_layout": "page_first_direct" if mamba else "layer_first",
        "hicache_write_policy": policy,
    }


def attach_hicache(tree: Any, server_args: Any, params: Any, storage: Any = None) -> None:
    """`init_hicache` on a built tree, as SGLang's registry calls it; with `storage` (a
    `soak.storage.StorageTier`), its storage tier built into the tier's folder, its threads
    parked for the tier's pump."""
    stand_in_cuda()
    if storage is None:
        tree.init_hicache(server_args, params)
        return
    from kvcanary_cli.soak.storage import StoragePump, backend_context, park_storage_threads

    park_storage_threads()
    with backend_context(storage.folder.name, storage.rank, storage.ranks):
        tree.init_hicache(server_args, params)
    if not tree.enable_storage:
        raise RuntimeError("the tree's storage tier did not start (enable_storage is off)")
    unpin_host_pools(tree.cache_controller)
    storage.pump = StoragePump(tree.cache_controller)


def unpin_host_pools(controller: Any) -> None:
    """The host pools' own `pin_memory` off: a storage read builds its page buffer pinned
    (`get_dummy_flat_data_page`), which only CUDA can do; the host buffers themselves were
    built before (their pinning stood in for by `stand_in_cuda`). No bookkeeping reads it."""
    group = controller.mem_pool_host
    pools = [entry.host_pool for entry in getattr(group, "entries", None) or ()] or [group]
    for pool in pools:
        if getattr(pool, "pin_memory", False):
            pool.pin_memory = False


@dataclass(frozen=True)
class InflightLock:
    """A lock the tree holds for a transfer in flight, shaped as a request's `TreeLock`
    (`soak.calls.held_lock` reads it): its anchor node, its receipt, never released early."""

    node: Any
    receipt: Any
    swa_released: bool = False


@dataclass(frozen=True)
class _Holder:
    """Something holding a tree lock (`lock`), as a request does."""

    lock: InflightLock


@dataclass(frozen=True)
class _OlderHolder:
    """A lock holder shaped as 0.5.14 - 0.5.19's request, whose lock lives in its fields
    (`soak.calls.held_lock`): the anchor, the SWA boundary, the nodes the lock skipped."""

    last_node: Any
    swa_uuid_for_lock: Any
    skip_lock_node_ids: Any
    swa_prefix_lock_released: bool = False


def inflight_locks(tree: Any) -> list[Any]:
    """The tree's own locks of transfers in flight (`capture.tree.inflight_tree_locks`),
    each as a lock holder shaped as a request of the release, for the audit's lock replay:
    a receipt that names the components it skipped (0.5.20 on) as a `TreeLock`, an older
    one (its SWA boundary and the nodes it skipped) as an older request's fields. Empty
    without HiCache."""
    held: list[Any] = []
    for node, receipt in inflight_tree_locks(tree):
        if hasattr(receipt, "skipped_lock_components"):
            held.append(_Holder(InflightLock(node, receipt)))
        else:
            held.append(_OlderHolder(node, receipt.swa_uuid_for_lock, receipt.skip_lock_node_ids))
    return held


#: the most polls a rank's copy may finish after the one its ack was first polled at, with
#: several ranks (`soak --tp N`): enough that the ranks' ready counts differ and the group's
#: MIN decides, not so much that backups stay locked through a history
ACK_LAG = 2


class LateEvent:
    """A copy's finish event that reports done only from poll `ready_at` of its rank's
    clock on (or once synchronised: a wait completes it); the rest is the event's own."""

    def __init__(self, event: Any, ready_at: int, clock: Callable[[], int]) -> None:
        self._event, self._ready_at, self._clock = event, ready_at, clock
        self._waited = False

    def query(self) -> bool:
        return (self._waited or self._clock() >= self._ready_at) and bool(self._event.query())

    def synchronize(self) -> None:
        self._event.synchronize()
        self._waited = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._event, name)


class _LaggingAcks(list):  # type: ignore[type-arg]
    """A controller's ack queue whose acks' copies finish `lag()` polls late, in order (one
    copy stream: a copy never finishes before the one queued before it)."""

    def __init__(self, acks: list[Any], clock: Callable[[], int], lag: Callable[[], int]) -> None:
        super().__init__(acks)
        self._clock, self._lag = clock, lag
        self._last = 0

    def append(self, ack: Any) -> None:
        fields = getattr(ack, "_fields", ())
        if "finish_event" in fields:
            self._last = max(self._last, self._clock() + 1 + self._lag())
            ack = ack._replace(finish_event=LateEvent(ack.finish_event, self._last, self._clock))
        super().append(ack)


def lagging_acks(tree: Any, clock: Callable[[], int], lag: Callable[[], int]) -> None:
    """Give a rank's controller copies that finish late: each write-through's and
    load-back's ack is ready `lag()` polls after the next one (`clock`: the rank's step), as
    a rank's own GPU copies finish when they do. A lone history's acks are all ready at the
    next poll; with several ranks the lags differ, so the group's MIN is what each takes."""
    controller = tree.cache_controller
    for name in ("ack_write_queue", "ack_load_queue"):
        setattr(controller, name, _LaggingAcks(getattr(controller, name), clock, lag))


def join_rank_group(tree: Any, group: Any, size: int) -> None:
    """Make a rank's tree one of `size` tensor-parallel ranks whose collectives go to
    `group` (`tp_group.GroupHandle`), as `CacheInitParams.tp_cache_group` makes it in a
    server (the tree reads the group's size once, at construction)."""
    tree.tp_group = group
    tree.tp_world_size = size
