"""SGLang 0.5.23's HiCache on CPU: the real `UnifiedRadixCache.init_hicache` (its
`HostPoolGroup`, its `HybridCacheController`) on two of the stacks soak builds: the
hybrid-SWA one (an `MHATokenToKVPoolHost` anchor and the SWA host pool beside it) and the
Mamba one (the anchor and a `MambaPoolHost`), each driven through real backups
(write-through on insert, acks drained by `writing_check`), device evictions that leave
host-only nodes, a prefix split across a backed-up node, and a host eviction that stages
freed host slots in `release_slots`.

The CUDA-only calls are stood in for: `_cuda_host_register` (pinning the host buffer) and
the `sgl_kernel` copy kernels the MHA and Mamba host pools import only on CUDA
(`transfer_kv_direct` and its per-layer forms, the Mamba state's): the bookkeeping under
test never reads the copied bytes.

Capture records every host pool of the group from the live objects (its free list, size,
each node's host value and host lock count), a correct state checks clean, and faults
planted on the real objects are named with their pool: a held host slot freed through the
pool's own `free` (which SGLang's double-free assert lets pass, since the slot was
allocated; `MambaPoolHost.free` has no assert at all) and a free slot listed twice.
"""

from __future__ import annotations

import importlib
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvcanary_cli.api import check
from kvcanary_cli.capture.tree import capture_state
from kvcanary_cli.dump.writer import dump_contents, write_dump
from kvcanary_cli.soak.hicache import COPY_KERNELS
from tests.live_capture import loaded

torch = pytest.importorskip("torch")


def _hicache_stack(
    sglang: Any, patch: pytest.MonkeyPatch, core: str = "python", layout: str = "swa"
) -> Any:
    """The soak stack's pools under a HiCache tree: server args with HiCache published, a
    `UnifiedRadixCache` over the same pools, `init_hicache` as SGLang's registry calls it.
    The Mamba layout's host pool takes the page-first layouts only."""
    from kvcanary_cli.soak.mamba import CHUNK
    from kvcanary_cli.soak.stack import StackSpec, build_stack

    common = importlib.import_module("sglang.srt.mem_cache.pool_host.common")
    patch.setattr(common, "_cuda_host_register", lambda *args, **kwargs: None)
    for module in ("mha", "mamba"):
        host = importlib.import_module(f"sglang.srt.mem_cache.pool_host.{module}")
        for name in COPY_KERNELS:
            patch.setattr(host, name, lambda *args, **kwargs: None, raising=False)
    spec = StackSpec.pressured(1, core, layout)
    stack = build_stack(sglang, spec)
    mamba = layout == "mamba"
    args = sglang.server_args.ServerArgs(
        model_path="dummy",
        page_size=1,
        device="cpu",
        attention_backend="torch_native",
        chunked_prefill_size=spec.chunked_prefill_size,
        disable_overlap_schedule=True,
        enable_hierarchical_cache=True,
        hicache_ratio=2.0,
        hicache_io_backend="direct",
        hicache_mem_layout="page_first_direct" if mamba else "layer_first",
    )
    if mamba:
        args._mamba_cache_chunk_size = CHUNK  # as soak's Mamba stack sets it
    sglang.runtime_context.reset_context()
    sglang.runtime_context.publish(args, role="scheduler")
    kinds = sglang.component_type.ComponentType
    params = sglang.cache_init_params.CacheInitParams(
        disable=False,
        req_to_token_pool=stack.req_to_token_pool,
        token_to_kv_pool_allocator=stack.allocator,
        page_size=1,
        sliding_window_size=None if mamba else spec.window,
        chunked_prefill_size=spec.chunked_prefill_size,
        tree_components=(kinds.FULL, kinds.MAMBA if mamba else kinds.SWA),
        tree_core_backend=core,
    )
    stack.tree = sglang.unified_radix_cache.UnifiedRadixCache(params)
    stack.tree.init_hicache(args, params)
    return stack


def _nodes(stack: Any) -> list[Any]:
    """The Python tree core's nodes, root excluded."""
    found, todo = [], list(stack.tree.tree_core.root_node.children.values())
    while todo:
        node = todo.pop()
        todo.extend(node.children.values())
        found.append(node)
    return found


def _data(node: Any, kind: str = "FULL") -> Any:
    """A node's `kind` component data (`value`, `host_value`, `host_lock_ref`)."""
    kinds = importlib.import_module("sglang.srt.mem_cache.unified_cache.component_type")
    return node.component_data[kinds.ComponentType[kind]]


def _insert(stack: Any, tokens: list[int]) -> None:
    """One prompt's KV inserted (a write-through backup to host issued, its ack pending)."""
    base = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
    radix = importlib.import_module("sglang.srt.mem_cache.radix_cache")
    value = stack.allocator.alloc(len(tokens))
    key = radix.RadixKey(array("q", tokens))  # the Rust core takes 8-byte token arrays
    # the Mamba layout: each insert leaves its request's state slot on its last node
    mamba = stack.spec.layout == "mamba"
    state = stack.req_to_token_pool.mamba_allocator.alloc(1) if mamba else None
    stack.tree.insert(base.InsertParams(key=key, value=value, mamba_value=state))


def _drive(stack: Any) -> None:
    """Three prompts inserted (each backed up to host on insert, the acks drained), the second
    splitting the first's backed-up node, then device eviction (host-only nodes), a host
    eviction (freed host slots staged in `release_slots`), a load-back of a host-only node
    left in flight (its node host-locked until the ack) and a fourth prompt's write-through
    left in flight (its ack never drained)."""
    base = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
    tree = stack.tree
    for tokens in (list(range(20)), [*range(10), *range(100, 110)], list(range(200, 220))):
        _insert(stack, tokens)
        tree.writing_check(write_back=True)
    tree.evict(base.EvictParams(num_tokens=30))
    assert tree.evict_host(10) > 0
    if stack.spec.core != "python":
        return  # the Rust core's nodes are out of Python's reach
    host_only = [
        node
        for node in _nodes(stack)
        if _data(node).value is None and _data(node).host_value is not None
    ]
    assert host_only and tree.load_back(host_only[0].id, mem_quota=1 << 20)  # left in flight
    _insert(stack, list(range(300, 330)))
    assert tree.ongoing_write_through and tree.ongoing_load_back


@contextmanager
def _driven(sglang: Any, layout: str) -> Iterator[Any]:
    with loaded(sglang) as modules, pytest.MonkeyPatch.context() as patch:
        built = _hicache_stack(modules, patch, layout=layout)
        _drive(built)
        yield built


@pytest.fixture(scope="module")
def stack(sglang: Any) -> Iterator[Any]:
    """One driven hybrid-SWA HiCache stack for the module (faults are planted and undone by
    each test)."""
    with _driven(sglang, "swa") as built:
        yield built


@pytest.fixture(scope="module")
def mamba_stack(sglang: Any) -> Iterator[Any]:
    """One driven Mamba HiCache stack for the module."""
    with _driven(sglang, "mamba") as built:
        yield built


#: each pool of a driven stack's group: (its name in the group and in findings, its records'
#: prefix, the tree component whose host values index it)
_POOLS = {"kv": ("", "FULL"), "swa": ("swa_", "SWA"), "mamba": ("mamba_", "MAMBA")}


def _host_pool(stack: Any, name: str = "kv") -> Any:
    """The group's pool named `name` (`PoolName` keys its entries; matched by value)."""
    group = stack.tree.cache_controller.mem_pool_host
    return next(e.host_pool for e in group.entries if e.name.value == name)


@contextmanager
def _restored(pool: Any) -> Iterator[Any]:
    """The host pool's free list and `slot_used` bits (where it keeps them: `MambaPoolHost`
    does not) put back after a planted fault."""
    saved = (pool.free_slots.clone(), list(pool.release_slots), pool.num_release_slots)
    used = getattr(pool, "slot_used", None)
    used = None if used is None else used.clone()
    try:
        yield pool
    finally:
        pool.free_slots, pool.release_slots, pool.num_release_slots = saved
        if used is not None:
            pool.slot_used = used


def _checked(stack: Any, tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    tensors, metadata = capture_state(
        req_to_token_pool=stack.req_to_token_pool,
        allocator=stack.allocator,
        tree=stack.tree,
        window=stack.spec.window,
    )
    path = write_dump(tmp_path / "hicache.safetensors", dump_contents(metadata, tensors))
    return check([path], kernel="none").dumps[0], tensors


def _held_node(stack: Any, kind: str = "FULL") -> Any:
    """A node of the tree whose `kind` component holds a host value."""
    return next(n for n in _nodes(stack) if _data(n, kind).host_value is not None)


def _placed(stack: Any, tensors: dict[str, Any], name: str) -> tuple[Any, Any]:
    """Pool `name`'s recorded (held, free), each recorded slot checked as placed once: the
    recorded records agree in length, and held and free make up the whole pool (nothing in
    flight in the driven state)."""
    prefix = _POOLS[name][0]
    held, free = tensors[f"tree_{prefix}host_slots"], tensors[f"{prefix}host_free_slots"]
    pool = _host_pool(stack, name)
    assert held.size + free.size == pool.logical_size
    nodes, locks = tensors[f"tree_{prefix}host_nodes"], tensors[f"tree_{prefix}host_lock_refs"]
    assert nodes.size == held.size == locks.size
    return held, free


@pytest.mark.parametrize(("fixture", "side"), [("stack", "swa"), ("mamba_stack", "mamba")])
def test_capture_records_every_host_pool_and_a_correct_state_is_clean(
    request: pytest.FixtureRequest, tmp_path: Path, fixture: str, side: str
) -> None:
    """The driven state: some host slots of each pool held by nodes (host-only ones among
    them, one being loaded back, one being written through), some free, some staged for
    release; the anchor and the side pool both recorded, and every HiCache family, the
    leak check among them, runs clean mid-load-back and mid-write-through."""
    built = request.getfixturevalue(fixture)
    report, tensors = _checked(built, tmp_path)
    assert report.error is None and report.findings == (), report.findings
    status = {c.check: c.status for c in report.coverage}
    assert status["HiCache host free list"] == status["HiCache host slots"] == "ran"
    assert status["HiCache host slot leaks"] == "ran"  # the capture vouched: no storage...
    for name in ("kv", side):
        held, _ = _placed(built, tensors, name)
        pool = _host_pool(built, name)
        assert held.size > 0 and pool.num_release_slots > 0, name  # backups, host eviction
    assert tensors["tree_host_lock_refs"].max() == 1  # the node whose load-back is in flight
    other = ({"swa", "mamba"} - {side}).pop()
    assert f"{other}_host_free_slots" not in tensors  # a pool the group does not have


@pytest.mark.parametrize(
    ("fixture", "name"), [("stack", "kv"), ("stack", "swa"), ("mamba_stack", "mamba")]
)
def test_a_held_host_slot_freed_is_named(
    request: pytest.FixtureRequest, tmp_path: Path, fixture: str, name: str
) -> None:
    """The pool's own `free` of a slot a node still holds as its host value (SGLang's assert
    passes: the slot was allocated; `MambaPoolHost` has none): named with its pool and node.
    The other pools' slots with the same ids are no fault."""
    built = request.getfixturevalue(fixture)
    pool = _host_pool(built, name)
    kind = _POOLS[name][1]
    node = _held_node(built, kind)
    host_value = _data(node, kind).host_value
    with _restored(pool):
        pool.free(host_value[:2])
        report, _ = _checked(built, tmp_path)
    assert [f.code.value for f in report.findings] == ["host-slot-free-and-held"]
    [finding] = report.findings
    assert finding.details["pool"] == name
    assert finding.details["host_slots"] == sorted(int(s) for s in host_value[:2])
    assert finding.details["nodes"] == [int(node.id)]
    assert report.diagnosis[0].code.value == "host-slot-freed-while-held"


@pytest.mark.parametrize(
    ("fixture", "name"), [("stack", "kv"), ("stack", "swa"), ("mamba_stack", "mamba")]
)
def test_host_slots_allocated_and_dropped_are_named_leaked(
    request: pytest.FixtureRequest, tmp_path: Path, fixture: str, name: str
) -> None:
    """The pool's own `alloc` whose slots never reach a node nor go back: leaked, in that
    pool, where nothing else can hold a host slot (no storage, no buffer mode, no
    disaggregated decode, nothing in flight to storage)."""
    built = request.getfixturevalue(fixture)
    pool = _host_pool(built, name)
    with _restored(pool):
        dropped = pool.alloc(2)
        report, _ = _checked(built, tmp_path)
    assert [f.code.value for f in report.findings] == ["host-slot-leaked"]
    [finding] = report.findings
    assert finding.details["pool"] == name
    assert finding.details["host_slots"] == sorted(int(s) for s in dropped)
    assert report.diagnosis[0].code.value == "host-slot-leak"


def _prefetch_in_flight(stack: Any, patch: pytest.MonkeyPatch) -> None:
    """A storage prefetch tracked in flight (its slots are the ones allocated here)."""
    patch.setitem(stack.tree.ongoing_prefetch, "a request", object())


def _storage_on(stack: Any, patch: pytest.MonkeyPatch) -> None:
    patch.setattr(stack.tree.cache_controller, "enable_storage", True)


def _disaggregated_decode(stack: Any, patch: pytest.MonkeyPatch) -> None:
    """A decode server of prefill-decode disaggregation (its retraction backups and host
    receives are held by requests in its own queues)."""
    context = importlib.import_module("sglang.srt.runtime_context")
    bag = SimpleNamespace(disaggregation_mode="decode")
    patch.setattr(context, "get_disagg", lambda: bag)


@pytest.mark.parametrize("holder", [_prefetch_in_flight, _storage_on, _disaggregated_decode])
def test_slots_a_holder_in_flight_may_own_are_no_leak(
    stack: Any, tmp_path: Path, holder: Any
) -> None:
    """The leak's twins: the same dropped `alloc` while something the capture cannot read
    could own its slots (a prefetch in flight, a storage tier, a decode server's retraction
    backups): silent, and the leak check says why it did not run."""
    pool = _host_pool(stack)
    with _restored(pool), pytest.MonkeyPatch.context() as patch:
        holder(stack, patch)
        pool.alloc(2)
        report, _ = _checked(stack, tmp_path)
    assert report.error is None and report.findings == (), report.findings
    [leaks] = [c for c in report.coverage if c.check == "HiCache host slot leaks"]
    assert leaks.status == "not-run" and "in flight" in (leaks.reason or "")


def test_a_host_slot_freed_twice_is_named(stack: Any, tmp_path: Path) -> None:
    """A free slot pushed onto `free_slots` again (around `free`, whose own assert refuses a
    second free: shown first): named as freed twice."""
    pool = _host_pool(stack)
    with _restored(pool):
        with pytest.raises(AssertionError, match="Double-free detected"):
            pool.free(pool.free_slots[:1])
        pool.free_slots = torch.cat([pool.free_slots, pool.free_slots[:3]])
        report, _ = _checked(stack, tmp_path)
    assert [f.code.value for f in report.findings] == ["host-slot-freed-twice"]
    assert report.diagnosis[0].code.value == "host-slot-double-free"
    # and undone: the same stack checks clean again
    assert _checked(stack, tmp_path)[0].findings == ()


def test_rust_tree_core_runs_the_free_list_checks_and_says_what_it_cannot_read(
    sglang: Any, tmp_path: Path
) -> None:
    """The Rust tree core keeps its nodes, host values included, out of Python's reach: the
    host free lists (the anchor's and the SWA pool's) are still recorded and checked, and
    the tree's host checks say they did not run for lack of `tree_host_slots` (never a
    false alarm)."""
    with loaded(sglang) as modules, pytest.MonkeyPatch.context() as patch:
        if "rust" not in modules.cores:
            pytest.skip("this SGLang has no Rust tree core")
        built = _hicache_stack(modules, patch, core="rust")
        _drive(built)
        report, tensors = _checked(built, tmp_path)
    assert report.error is None and report.findings == (), report.findings
    assert "tree_host_slots" not in tensors and tensors["host_free_slots"].size > 0
    assert "tree_swa_host_slots" not in tensors and tensors["swa_host_free_slots"].size > 0
    status = {c.check: (c.status, c.missing) for c in report.coverage}
    assert status["HiCache host free list"] == ("ran", ())
    assert status["HiCache host slots"] == ("not-run", ("tree_host_slots",))
    assert status["HiCache host slot leaks"] == ("not-run", ("tree_host_slots",))
