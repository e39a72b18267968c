"""capture.tree's reads on stand-in objects (the real ones: tests/integration/
test_sglang_stack.py): free lists with and without `get_all_free_pages()` (releases before
0.5.20 keep `free_pages` and the staged `release_pages`), pages expanded to slots, the tree
found by its pool, and a broken object costing only its facts."""

from __future__ import annotations

import gc
import importlib
import logging
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import kvcanary_cli.capture.server as server
import kvcanary_cli.capture.tree as tree_capture
import kvcanary_cli.capture.triggers as triggers
from kvcanary_cli.capture import DUMP_DIR_ENV, install_from_env
from kvcanary_cli.capture.server import ORIGINAL_ATTR
from kvcanary_cli.capture.tree import free_slots, register_tree_cache, tree_for, tree_state
from tests.sglang_standin import forget_sglang, installed, write_standin
from tests.torch_extra import needs_torch


class _WithPages:
    def __init__(self, pages: list[int]) -> None:
        self.pages = pages

    def get_all_free_pages(self) -> np.ndarray:
        return np.array(self.pages)


def test_free_slots_from_get_all_free_pages_expands_pages() -> None:
    assert free_slots(_WithPages([2, 1]), 2).tolist() == [2, 3, 4, 5]


def test_free_slots_without_get_all_free_pages_reads_free_and_staged() -> None:
    old = SimpleNamespace(free_pages=np.array([3]), release_pages=np.array([1]))
    assert free_slots(old, 1).tolist() == [1, 3]
    assert free_slots(SimpleNamespace(), 1) is None


def test_free_slots_copies_what_it_reads() -> None:
    pages = np.array([5, 6])
    allocator = SimpleNamespace(free_pages=pages, release_pages=None)
    got = free_slots(allocator, 1)
    pages[0] = 99
    assert got.tolist() == [5, 6]


class _Tree:
    def __init__(self, table: object) -> None:
        self.req_to_token_pool = SimpleNamespace(req_to_token=table)


def test_tree_for_finds_the_tree_of_a_pool() -> None:
    table_a, table_b = object(), object()
    tree_a, tree_b = _Tree(table_a), _Tree(table_b)
    register_tree_cache(tree_a)
    register_tree_cache(tree_b)
    assert tree_for(table_b) is tree_b and tree_for(table_a) is tree_a
    assert tree_for(object()) is None  # two trees, neither reads it


def test_tree_state_records_rows_and_survives_a_broken_tree() -> None:
    allocator = SimpleNamespace(page_size=1, size=8, free_pages=np.array([4]), release_pages=None)
    running = [SimpleNamespace(kv=SimpleNamespace(req_pool_idx=2, kv_allocated_len=5))]

    class Broken:
        def all_values_flatten(self) -> None:
            raise RuntimeError("renamed")

    facts = tree_state(allocator=allocator, tree=Broken(), requests=running, rows=3)
    assert facts["num_full_slots"] == 9 and facts["free_full_slots"].tolist() == [4]
    assert "tree_full_slots" not in facts
    assert facts["req_pool_allocated_lens"].tolist() == [0, 0, 5]  # the rows still recorded


def test_rows_held_free_and_unknown() -> None:
    """Each running request's row once (a request on a session's record shares its kv), a
    session's idle record too, the request pool's free list as it is; requests not known:
    no row recorded as held (an empty list would call every row leaked)."""
    allocator = SimpleNamespace(page_size=1, size=8, free_pages=np.array([4]), release_pages=None)
    shared = SimpleNamespace(req_pool_idx=2, kv_allocated_len=5)
    idle = SimpleNamespace(req_pool_idx=3, kv_allocated_len=0)
    tree = SimpleNamespace(session_records=lambda: {"a": shared, "b": idle})
    running = [SimpleNamespace(kv=shared), SimpleNamespace(kv=SimpleNamespace(req_pool_idx=1))]
    facts = tree_state(allocator=allocator, tree=tree, requests=running, rows=5)
    assert sorted(facts["running_req_rows"].tolist()) == [1, 2, 3]
    assert "running_req_rows" not in tree_state(allocator=allocator, tree=tree, rows=5)
    pool = SimpleNamespace(req_to_token=np.zeros((5, 4), dtype=np.int32), free_slots=[4, 4])
    tensors, _ = tree_capture.capture_state(req_to_token_pool=pool, allocator=allocator)
    assert tensors["free_req_rows"].tolist() == [4, 4]
    assert "running_req_rows" not in tensors


def _session_tree(records: dict[str, Any]) -> SimpleNamespace:
    return SimpleNamespace(session_records=lambda: records)


def test_an_idle_streaming_session_holds_its_kv_up_to_its_allocated_length() -> None:
    """A streaming session keeps its turn's row and the KV of its cells between turns (0.5.22
    on: `session_records()`): with no request running, the row is held and its allocated
    length recorded, so the full pool's leak check counts its cells held (recorded as 0, the
    session's own KV read as leaked: the false alarm soak met on 0.5.23)."""
    allocator = SimpleNamespace(page_size=1, size=8, free_pages=np.array([4]), release_pages=None)
    session = SimpleNamespace(req_pool_idx=3, kv_allocated_len=7)
    closed = SimpleNamespace(req_pool_idx=None, kv_allocated_len=0)  # holds nothing
    tree = _session_tree({"a": session, "b": closed})
    facts = tree_state(allocator=allocator, tree=tree, requests=[], rows=5)
    assert facts["running_req_rows"].tolist() == [3]
    assert facts["req_pool_allocated_lens"].tolist() == [0, 0, 0, 7, 0]


def test_a_turn_running_on_its_session_record_is_one_holder() -> None:
    """The clean twin while a turn runs: the request borrows the session's record (one
    object), so its row is held once at the record's length."""
    allocator = SimpleNamespace(page_size=1, size=8, free_pages=np.array([4]), release_pages=None)
    record = SimpleNamespace(req_pool_idx=2, kv_allocated_len=9)
    turn = SimpleNamespace(kv=record, session=SimpleNamespace(session_id="a"))
    facts = tree_state(
        allocator=allocator, tree=_session_tree({"a": record}), requests=[turn], rows=4
    )
    assert facts["running_req_rows"].tolist() == [2]
    assert facts["req_pool_allocated_lens"].tolist() == [0, 0, 9, 0]


@pytest.mark.parametrize("release", ["0.5.13", "0.5.17", "0.5.21"])
def test_sessions_of_releases_without_session_records_are_read_from_their_slots(
    release: str,
) -> None:
    """Before 0.5.22 the tree has no `session_records()`: its embedded `StreamingSession`
    keeps the slots (`tree.session.slots`), each naming its row itself and its lengths itself
    (0.5.13 - 0.5.15) or in `kv` (0.5.16 - 0.5.18), or keeping a `ReqKvInfo` (0.5.19 -
    0.5.21). A turn of 0.5.13 - 0.5.18 copies the row onto itself while the slot keeps it:
    that row is the request's, held once, at the request's (current) length."""
    allocator = SimpleNamespace(page_size=1, size=8, free_pages=np.array([4]), release_pages=None)
    if release == "0.5.13":
        idle = SimpleNamespace(req_pool_idx=3, kv_allocated_len=6)
        lent = SimpleNamespace(req_pool_idx=1, kv_allocated_len=8)
    elif release == "0.5.17":
        idle = SimpleNamespace(req_pool_idx=3, kv=SimpleNamespace(kv_allocated_len=6))
        lent = SimpleNamespace(req_pool_idx=1, kv=SimpleNamespace(kv_allocated_len=8))
    else:
        idle = SimpleNamespace(kv=SimpleNamespace(req_pool_idx=3, kv_allocated_len=6))
        lent = SimpleNamespace(kv=SimpleNamespace(req_pool_idx=1, kv_allocated_len=8))
    slots = {"idle": idle, "lent": lent}
    tree = SimpleNamespace(session=SimpleNamespace(slots=slots))
    if release == "0.5.21":  # the turn borrows the slot's record itself
        turn = SimpleNamespace(kv=lent.kv, session=SimpleNamespace(session_id="lent"))
    else:  # the turn copied the row and its lengths onto itself (shorter now: trimmed)
        turn = SimpleNamespace(
            req_pool_idx=1,
            kv=SimpleNamespace(kv_allocated_len=5),
            session=SimpleNamespace(session_id="lent"),
        )
    facts = tree_state(allocator=allocator, tree=tree, requests=[turn], rows=5)
    assert sorted(facts["running_req_rows"].tolist()) == [1, 3]
    lens = facts["req_pool_allocated_lens"].tolist()
    assert lens == [0, 8 if release == "0.5.21" else 5, 0, 6, 0]


def test_a_wrapper_session_cache_is_read_as_its_own_slots() -> None:
    """0.5.13 - 0.5.21 wrap a tree without streaming support in `StreamingSession(cache)`:
    the wrapper (it has `inner`) keeps the slots itself."""
    slot = SimpleNamespace(kv=SimpleNamespace(req_pool_idx=2, kv_allocated_len=4))
    wrapper = SimpleNamespace(inner=object(), slots={"s": slot})
    assert tree_capture.session_records(wrapper) == {"s": slot.kv}
    assert tree_capture.session_slots(SimpleNamespace(session=object())) == {}


class _Wrapper:
    """SGLang's `StreamingSession` as 0.5.13 - 0.5.21 lay it out: its own `inner` and
    `slots`, the pool read from the cache inside, every other read forwarded to it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.slots: dict[str, Any] = {}

    @property
    def req_to_token_pool(self) -> Any:
        return self.inner.req_to_token_pool

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_radix_session_tags_are_counted_per_session_over_the_components() -> None:
    """A radix session's tags (`--enable-session-radix-cache`): the leaves each component
    indexes for it, summed, read through a wrapper too; a tree without them has none."""
    full = SimpleNamespace(_session_leaves={"a": {1, 2}, "b": set()})
    swa = SimpleNamespace(_session_leaves={"a": {3}, "c": {4}})
    tree = SimpleNamespace(session_refs=SimpleNamespace(components=(full, swa)))
    assert tree_capture.radix_session_leaves(tree) == {"a": 3, "c": 1}
    assert tree_capture.radix_session_leaves(_Wrapper(tree)) == {"a": 3, "c": 1}
    assert tree_capture.radix_session_leaves(SimpleNamespace()) == {}
    broken = SimpleNamespace(session_refs=SimpleNamespace(components=(object(),)))
    assert tree_capture.radix_session_leaves(broken) == {}


@pytest.mark.parametrize("release", ["0.5.13", "0.5.17", "0.5.21"])
def test_tree_for_reads_a_wrapped_cache_through_its_streaming_session(
    release: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0.5.13 - 0.5.21 wrap a cache without streaming sessions (`RadixCache`, the SWA tree)
    in `StreamingSession(cache)`; both register themselves. The tree for the pool is the
    wrapper (the scheduler's `tree_cache`): its idle session's row and allocated length are
    held, and the tree's slots still come from the cache inside. The cache alone would show
    no session: its row read as leaked, its locked prefix as a lock never released."""
    monkeypatch.setattr(tree_capture, "_TREES", [])
    table = object()
    inner = _Tree(table)
    inner.all_values_flatten = lambda: np.array([6, 5])  # type: ignore[attr-defined]
    wrapper = _Wrapper(inner)
    if release == "0.5.13":
        slot: Any = SimpleNamespace(req_pool_idx=3, kv_allocated_len=6)
    elif release == "0.5.17":
        slot = SimpleNamespace(req_pool_idx=3, kv=SimpleNamespace(kv_allocated_len=6))
    else:
        slot = SimpleNamespace(kv=SimpleNamespace(req_pool_idx=3, kv_allocated_len=6))
    wrapper.slots["s"] = slot
    register_tree_cache(inner)  # built first, registered first
    register_tree_cache(wrapper)
    assert tree_for(table) is wrapper
    allocator = SimpleNamespace(page_size=1, size=8, free_pages=np.array([4]), release_pages=None)
    facts = tree_state(allocator=allocator, tree=tree_for(table), requests=[], rows=5)
    assert facts["running_req_rows"].tolist() == [3]
    assert facts["req_pool_allocated_lens"].tolist() == [0, 0, 0, 6, 0]
    assert facts["tree_full_slots"].tolist() == [5, 6]


def test_tree_for_never_takes_a_trees_embedded_streaming_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The clean twin: `UnifiedRadixCache` builds its own `StreamingSession(inner=self)`
    inside its `__init__` (registered before the tree itself): the tree for the pool is the
    tree, whose `session` keeps the slots; and a pool with no wrapper keeps its tree."""
    monkeypatch.setattr(tree_capture, "_TREES", [])
    table, plain_table = object(), object()
    tree = _Tree(table)
    tree.session = _Wrapper(tree)  # type: ignore[attr-defined]
    register_tree_cache(tree.session)  # type: ignore[attr-defined]
    register_tree_cache(tree)
    plain = _Tree(plain_table)
    register_tree_cache(plain)
    assert tree_for(table) is tree and tree_for(plain_table) is plain


# --- the hook finds SGLang's tree by itself (issue 43) ---------------------------------------


@pytest.fixture
def armed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The capture hook armed by `KVCANARY_DUMP_DIR` with a fresh registry of trees; the
    import hook and every `sglang` module gone afterwards."""
    monkeypatch.setenv(DUMP_DIR_ENV, str(tmp_path / "dumps"))
    monkeypatch.setattr(tree_capture, "_TREES", [])
    monkeypatch.setattr(triggers, "_SETTINGS", [triggers.Settings()])
    before = list(sys.meta_path)
    try:
        yield tmp_path
    finally:
        sys.meta_path[:] = before
        forget_sglang()


def _params(held: list[int] | None) -> tuple[object, SimpleNamespace]:
    table = object()
    return table, SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=table), held=held)


def test_each_tree_sglang_builds_after_the_hook_is_armed_registers_itself(
    armed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing calls `register_tree_cache` on a real server: the hook wraps the radix cache
    classes as SGLang loads their modules (never earlier), and each tree built after is
    found by its pool, read into the dump's facts, and held weakly."""
    root = write_standin(armed / "tree", trees=("unified", "radix"), launcher=False)
    with installed(monkeypatch, root):
        assert install_from_env()
        assert "sglang.srt.mem_cache.unified_radix_cache" not in sys.modules  # not imported early
        unified = importlib.import_module("sglang.srt.mem_cache.unified_radix_cache")
        radix = importlib.import_module("sglang.srt.mem_cache.radix_cache")
        table, params = _params([7, 3, 5])
        other_table, other = _params([9])
        built = unified.UnifiedRadixCache(params)
        second = radix.RadixCache(other)
        assert tree_for(table) is built and tree_for(other_table) is second
        allocator = SimpleNamespace(page_size=1, size=16, free_pages=np.array([1]))
        facts = tree_state(allocator=allocator, tree=tree_for(table))
        assert facts["tree_full_slots"].tolist() == [3, 5, 7]
        assert built.held == [7, 3, 5]  # built as SGLang built it
        del built, second
        gc.collect()
        assert tree_for(table) is None  # weakly held: a server's tree is never kept alive


def _module(name: str, cls: type) -> types.ModuleType:
    module = types.ModuleType(name)
    setattr(module, cls.__name__, cls)
    return module


def test_the_hook_registers_sglangs_streaming_session_wrapper(armed: Path) -> None:
    """0.5.13 - 0.5.21's scheduler holds `StreamingSession(cache)`, not the cache its
    registry built: the hook watches the wrapper's class as it watches the radix caches, so
    a dump reads the pool's tree through the wrapper and the sessions it keeps."""

    class RadixCache:
        def __init__(self, params: SimpleNamespace) -> None:
            self.req_to_token_pool = params.req_to_token_pool

    class StreamingSession(_Wrapper):
        def __init__(self, inner: object) -> None:  # its own, as SGLang's class has
            super().__init__(inner)

    assert server.watch_tree_classes(_module("sglang.srt.mem_cache.radix_cache", RadixCache))
    module = _module("sglang.srt.session.streaming_session", StreamingSession)
    assert server.watch_tree_classes(module)
    table, params = _params([2])
    inner = RadixCache(params)
    assert tree_for(table) is inner
    wrapper = StreamingSession(inner)
    assert tree_for(table) is wrapper and wrapper.inner is inner  # built as SGLang built it


def test_watching_a_tree_class_never_changes_what_sglang_does(
    armed: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The wrapped `__init__` builds what the original builds and raises what it raises;
    watching twice wraps once; a tree that cannot be held weakly, a module without the class
    and a class that refuses the wrapper cost the record, never SGLang's work."""
    name = "sglang.srt.mem_cache.unified_radix_cache"

    class UnifiedRadixCache:
        def __init__(self, params: SimpleNamespace) -> None:
            if params.held is None:
                raise ValueError("needs its slots")
            self.req_to_token_pool = params.req_to_token_pool

    module = _module(name, UnifiedRadixCache)
    assert server.watch_tree_classes(module) and server.watch_tree_classes(module)
    wrapped = vars(UnifiedRadixCache)["__init__"]
    assert getattr(wrapped, ORIGINAL_ATTR).__qualname__.endswith("UnifiedRadixCache.__init__")
    table, params = _params(None)
    with pytest.raises(ValueError, match="needs its slots"):
        UnifiedRadixCache(params)
    assert tree_for(table) is None  # a tree that was not built is not registered
    table, params = _params([1])
    built = UnifiedRadixCache(params)
    assert tree_for(table) is built and len(tree_capture._TREES) == 1

    class Slotted:  # no weak reference possible: built all the same, not recorded
        __slots__ = ("req_to_token_pool",)

        def __init__(self, params: SimpleNamespace) -> None:
            self.req_to_token_pool = params.req_to_token_pool

    Slotted.__name__ = "RadixCache"
    assert server.watch_tree_classes(_module("sglang.srt.mem_cache.radix_cache", Slotted))
    table, params = _params([1])
    assert Slotted(params).req_to_token_pool.req_to_token is table
    assert [ref() for ref in tree_capture._TREES] == [built]

    assert not server.watch_tree_classes(types.ModuleType(name))  # the release has no such class
    assert not server.watch_tree_classes(_module("sglang.srt.other", UnifiedRadixCache))

    class Frozen(type):
        def __setattr__(cls, key: str, value: object) -> None:
            raise TypeError("frozen class")

    class SWARadixCache(metaclass=Frozen):
        def __init__(self) -> None:
            pass

    with caplog.at_level(logging.WARNING, logger="kvcanary.capture"):
        assert not server.watch_tree_classes(
            _module("sglang.srt.mem_cache.swa_radix_cache", SWARadixCache)
        )
    assert "cannot watch sglang.srt.mem_cache.swa_radix_cache" in caplog.text
    SWARadixCache()  # unchanged


def test_a_tree_of_another_pool_is_never_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """One tree registered (the server's), a dump of another pool: not its tree (its slots
    would read as that pool's leaks)."""
    monkeypatch.setattr(tree_capture, "_TREES", [])
    table = object()
    only = _Tree(table)
    register_tree_cache(only)
    assert tree_for(table) is only and tree_for(object()) is None


def test_the_locked_part_is_what_the_unlocked_walk_leaves_out() -> None:
    """Locked slots: all the tree holds less the core's walk of unlocked nodes; a core whose
    walk fails costs that record only."""
    allocator = SimpleNamespace(page_size=1, size=8, free_pages=np.array([7]), release_pages=None)

    def walk(*, unlocked_only: bool, swa_resident_only: bool) -> SimpleNamespace:
        slots = [1, 2] if unlocked_only else [1, 2, 3, 4, 5]
        return SimpleNamespace(slot_indices=np.array(slots))

    tree = SimpleNamespace(all_values_flatten=lambda: np.array([5, 1, 4, 2, 3]), tree_core=None)
    tree.tree_core = SimpleNamespace(walk_for_kv_canary=walk)
    assert tree_state(allocator=allocator, tree=tree)["tree_locked_full_slots"].tolist() == [
        3,
        4,
        5,
    ]

    def broken(*, unlocked_only: bool, swa_resident_only: bool) -> SimpleNamespace:
        if unlocked_only:
            raise RuntimeError("renamed")
        return walk(unlocked_only=False, swa_resident_only=swa_resident_only)

    tree.tree_core = SimpleNamespace(walk_for_kv_canary=broken)
    facts = tree_state(allocator=allocator, tree=tree)
    assert "tree_locked_full_slots" not in facts and facts["tree_full_slots"].size == 5


def test_a_lock_the_tree_holds_for_a_transfer_in_flight_is_no_request_lock() -> None:
    """HiCache: a write-through backup locks its node until its ack, a load-back until its
    own (`ongoing_write_through`, `ongoing_load_back`); no request holds those, so their
    paths' slots are left out of the locked part (else `tree-lock-leaked` at idle on a
    correct state); a lock outside those paths stays, and a write-back's (no receipt) is no
    lock. A path that cannot be read leaves the locks unrecorded (the check then says it did
    not run), never recorded as none locked."""
    allocator = SimpleNamespace(page_size=1, size=8, free_pages=np.array([7]), release_pages=None)

    def walk(*, unlocked_only: bool, swa_resident_only: bool) -> SimpleNamespace:
        return SimpleNamespace(slot_indices=np.array([1] if unlocked_only else [1, 2, 3, 4, 5]))

    paths = {10: np.array([2, 3]), 11: np.array([2, 3, 4])}
    tree = SimpleNamespace(
        all_values_flatten=lambda: np.array([5, 1, 4, 2, 3]),
        tree_core=SimpleNamespace(walk_for_kv_canary=walk),
        ongoing_write_through={10: (10, "receipt", [10]), 12: (12, None, [12])},
        ongoing_load_back={},
        path_device_indices=lambda node: paths[node],
    )
    locked = tree_state(allocator=allocator, tree=tree)["tree_locked_full_slots"]
    assert locked.tolist() == [4, 5]
    tree.ongoing_load_back = {11: (11, "receipt", "host receipt")}
    assert tree_state(allocator=allocator, tree=tree)["tree_locked_full_slots"].tolist() == [5]
    tree.path_device_indices = None
    assert "tree_locked_full_slots" not in tree_state(allocator=allocator, tree=tree)
    tree.ongoing_write_through = tree.ongoing_load_back = {}
    assert tree_state(allocator=allocator, tree=tree)["tree_locked_full_slots"].size == 4


def test_a_transfer_lock_of_a_tree_without_a_core_pins_its_nodes_path() -> None:
    """0.5.14 - 0.5.16: the tree holds its nodes itself and its in-flight records name the
    node, not its id: the pinned path is read up the node's parents (FULL values)."""
    import enum

    Kind = enum.IntEnum("Kind", {"FULL": 0, "SWA": 1})
    root = SimpleNamespace(parent=None)

    def node(parent: Any, full: list[int] | None) -> SimpleNamespace:
        data = {Kind.FULL: SimpleNamespace(value=None if full is None else np.array(full))}
        return SimpleNamespace(parent=parent, component_data=data)

    top = node(root, [1, 2])
    tombstone = node(top, None)
    leaf = node(tombstone, [5])
    tree = SimpleNamespace(
        components={Kind.FULL: None, Kind.SWA: None},
        root_node=root,
        ongoing_write_through={},
        ongoing_load_back={9: (leaf, "receipt", "host receipt")},
    )
    assert sorted(tree_capture.inflight_locked_slots(tree).tolist()) == [1, 2, 5]


def test_a_tree_without_a_core_is_walked_by_its_nodes() -> None:
    """0.5.13 - 0.5.16: no tree core, no walk; the tree holds its nodes, each with a record
    per component: SWA-resident slots are the full values of nodes whose SWA value is not
    None (a tombstone's are not), locked ones those whose FULL lock count is not 0 (a lock on
    the SWA part alone leaves them unlocked), as the later core's walk gives them."""
    import enum

    Kind = enum.IntEnum("Kind", {"FULL": 0, "SWA": 1})
    allocator = SimpleNamespace(page_size=1, size=16, free_pages=np.array([9]), release_pages=None)

    def node(node_id: int, full: list[int], swa: bool, locks: tuple[int, int], *kids: Any) -> Any:
        data = [
            SimpleNamespace(value=np.array(full), lock_ref=locks[0]),
            SimpleNamespace(value=np.array(full) if swa else None, lock_ref=locks[1]),
        ]
        return SimpleNamespace(id=node_id, component_data=data, children={k.id: k for k in kids})

    tomb = node(1, [1, 2], False, (1, 0), node(2, [3, 4], True, (1, 1)))
    root = SimpleNamespace(id=0, children={1: tomb, 5: node(5, [5, 6], True, (0, 1))})
    root.component_data = []
    tree = SimpleNamespace(
        all_values_flatten=lambda: np.array([1, 2, 3, 4, 5, 6]),
        root_node=root,
        components={Kind.FULL: object(), Kind.SWA: object()},
    )
    facts = tree_state(allocator=allocator, tree=tree)
    assert facts["tree_swa_resident_slots"].tolist() == [3, 4, 5, 6]
    assert facts["tree_locked_full_slots"].tolist() == [1, 2, 3, 4]
    # another make of tree (no component records): those two facts are absent, not guessed
    plain = SimpleNamespace(all_values_flatten=tree.all_values_flatten, root_node=object())
    facts = tree_state(allocator=allocator, tree=plain)
    assert "tree_swa_resident_slots" not in facts and "tree_locked_full_slots" not in facts


def _mamba_pool(rows: int = 4) -> SimpleNamespace:
    """A stand-in `HybridReqToTokenPool`: its Mamba allocator (slot 0 reserved) and row map."""
    import torch

    return SimpleNamespace(
        req_to_token=torch.zeros((rows, 8), dtype=torch.int32),
        mamba_allocator=SimpleNamespace(size=6, free_slots=torch.tensor([4, 5, 6])),
        req_index_to_mamba_index_mapping=torch.tensor([0, 1, 2, 0], dtype=torch.int32),
    )


def test_a_mamba_pool_records_its_layout_at_a_guard_trigger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guard and snapshot triggers read the runner's request pool: a Mamba one adds the
    layout, its size, row map, free list and the tree's Mamba slots; with no request known,
    no request's Mamba slot is recorded (its absence, not an empty list: nothing is leaked)."""
    torch = needs_torch()

    pool = _mamba_pool()
    tree = SimpleNamespace(
        req_to_token_pool=pool, all_mamba_values_flatten=lambda: torch.tensor([3])
    )
    allocator = SimpleNamespace(page_size=1, size=32, free_pages=np.arange(1, 33))
    runner = SimpleNamespace(req_to_token_pool=pool, token_to_kv_pool_allocator=allocator)
    monkeypatch.setattr(server, "runner_for", lambda table: runner)
    monkeypatch.setattr(tree_capture, "tree_for", lambda table: tree)
    facts: dict[str, Any] = server.server_context(pool.req_to_token)
    assert facts["layout"] == "hybrid-mamba" and facts["num_mamba_slots"] == 7
    assert facts["free_mamba_slots"].tolist() == [4, 5, 6]
    assert facts["tree_mamba_slots"].tolist() == [3]
    assert facts["req_index_to_mamba_index_mapping"].tolist() == [0, 1, 2, 0]
    assert "req_mamba_slots" not in facts
    plain = SimpleNamespace(req_to_token=pool.req_to_token)  # a ReqToTokenPool: nothing more
    assert "layout" not in tree_state(allocator=allocator, req_pool=plain)


def test_every_live_request_known_records_each_ones_mamba_slots() -> None:
    """Running and waiting requests (a waiting one holds its copy-on-write slot, no row);
    a request listed twice holds its slot once."""
    torch = needs_torch()

    running = SimpleNamespace(
        kv=SimpleNamespace(req_pool_idx=1, kv_allocated_len=3, mamba_pool_idx=torch.tensor(1))
    )
    waiting = SimpleNamespace(kv=SimpleNamespace(req_pool_idx=None, mamba_pool_idx=torch.tensor(2)))
    allocator = SimpleNamespace(page_size=1, size=32, free_pages=np.arange(1, 33))
    facts = tree_state(
        allocator=allocator,
        requests=[running, running],
        rows=4,
        req_pool=_mamba_pool(),
        waiting=[waiting],
    )
    assert facts["req_mamba_slots"].tolist() == [1, 2]
    assert facts["req_mamba_rows"].tolist() == [1, -1]


def _host_node(node_id: int, host: list[int] | None, lock: int, *children: Any) -> Any:
    """A node of an older `HiRadixCache` (`host_value`, `host_ref_counter` on the node)."""
    value = None if host is None else np.array(host)
    return SimpleNamespace(
        id=node_id,
        host_value=value,
        host_ref_counter=lock,
        children={c.id: c for c in children},
    )


def _host_tree(pool: Any) -> Any:
    root = _host_node(0, None, 0, _host_node(1, [0, 1], 1, _host_node(2, [2], 0)))
    return SimpleNamespace(root_node=root, token_to_kv_pool_host=pool)


def test_host_pool_of_an_older_hiradix_cache_is_recorded() -> None:
    """The host pool's free list (free slots, then the staged release chunks) and size, and
    each node's host value with its id and host lock count, by the older tree's names."""
    import threading

    pool = SimpleNamespace(
        free_slots=np.array([5, 3]),
        release_slots=[np.array([4])],
        size=6,
        lock=threading.RLock(),
    )
    facts = tree_state(allocator=SimpleNamespace(page_size=1), tree=_host_tree(pool))
    assert facts["host_free_slots"].tolist() == [5, 3, 4] and facts["num_host_slots"] == 6
    order = np.argsort(facts["tree_host_slots"])
    assert facts["tree_host_slots"][order].tolist() == [0, 1, 2]
    assert facts["tree_host_nodes"][order].tolist() == [1, 1, 2]
    assert facts["tree_host_lock_refs"][order].tolist() == [1, 1, 0]


def test_a_host_pool_held_by_another_thread_is_not_read() -> None:
    """A pool whose lock another thread holds (mid-merge, its free list may list a slot
    twice) records nothing of the host pool, rather than a false double free."""
    free = SimpleNamespace(acquire=lambda timeout: True, release=lambda: None)
    busy = SimpleNamespace(acquire=lambda timeout: False)  # the wait for it timed out
    recorded = []
    for lock in (free, busy):
        pool = SimpleNamespace(free_slots=np.array([1]), release_slots=[], size=4, lock=lock)
        facts = tree_state(allocator=SimpleNamespace(page_size=1), tree=_host_tree(pool))
        recorded.append(sorted(n for n in facts if "host" in n))
    assert recorded == [
        ["host_free_slots", "num_host_slots", "tree_host_lock_refs", "tree_host_nodes",
         "tree_host_slots"],
        [],
    ]  # fmt: skip


class _Delegating:
    """A host pool facade like SGLang's `PageInterleaveHostPool`: its own classed allocator,
    every other attribute (a `free_slots` it never allocates from among them) its native
    pool's."""

    def __init__(self, native: Any) -> None:
        self.host_pool = native
        self._slots = SimpleNamespace()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["host_pool"], name)


def test_a_host_pool_that_keeps_no_free_slots_of_its_own_is_not_read() -> None:
    """A facade answering `free_slots` from the pool it wraps would record a free list no
    `alloc` takes from (every held slot on it): nothing of the host pool is recorded."""
    native = SimpleNamespace(free_slots=np.arange(6), release_slots=[], size=6)
    facts = tree_state(allocator=SimpleNamespace(page_size=1), tree=_host_tree(_Delegating(native)))
    assert not any("host" in name for name in facts)
    facts = tree_state(allocator=SimpleNamespace(page_size=1), tree=_host_tree(native))
    assert facts["host_free_slots"].tolist() == list(range(6))


def test_side_host_pools_are_recorded_each_from_its_component() -> None:
    """A 0.5.23-shaped tree (component data indexed by kind): the Mamba component's host pool
    is recorded with the Mamba host values, beside the anchor's; an SWA component whose host
    pool is the anchor itself, or one keeping no free list of its own, adds nothing."""
    import enum

    Kind = enum.IntEnum("Kind", {"FULL": 0, "SWA": 1, "MAMBA": 2})

    def pool(free: list[int], size: int) -> Any:
        return SimpleNamespace(free_slots=np.array(free), release_slots=[], size=size)

    def data(host: list[int] | None, lock: int = 0) -> Any:
        value = None if host is None else np.array(host)
        return SimpleNamespace(host_value=value, host_lock_ref=lock)

    def node(node_id: int, full: list[int], mamba: list[int] | None, *children: Any) -> Any:
        return SimpleNamespace(
            id=node_id,
            component_data=[data(full), data([99]), data(mamba, 1)],
            children={c.id: c for c in children},
        )

    anchor, mamba = pool([4, 5], 6), pool([1], 3)
    leaf = node(2, [2, 3], [2])
    root = SimpleNamespace(id=0, children={}, component_data=[])
    root.children = {1: node(1, [0, 1], None, leaf)}
    facade = type("Facade", (), {"free_slots": property(lambda self: np.array([0]))})()
    for swa in (anchor, facade):  # the anchor itself; a facade answering another's list
        tree = SimpleNamespace(
            tree_core=SimpleNamespace(root_node=root),
            components={
                Kind.FULL: SimpleNamespace(),
                Kind.SWA: SimpleNamespace(_swa_kv_pool_host=swa),
                Kind.MAMBA: SimpleNamespace(_mamba_pool_host=mamba),
            },
            cache_controller=SimpleNamespace(
                mem_pool_host=SimpleNamespace(anchor_entry=SimpleNamespace(host_pool=anchor))
            ),
        )
        facts = tree_state(allocator=SimpleNamespace(page_size=1), tree=tree)
        assert sorted(facts["tree_host_slots"].tolist()) == [0, 1, 2, 3]
        assert facts["mamba_host_free_slots"].tolist() == [1]
        assert facts["num_mamba_host_slots"] == 3
        assert facts["tree_mamba_host_slots"].tolist() == [2]
        assert facts["tree_mamba_host_nodes"].tolist() == [2]
        assert facts["tree_mamba_host_lock_refs"].tolist() == [1]
        assert not [name for name in facts if "swa_host" in name]


def test_host_slots_are_vouched_for_only_from_the_main_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`host_slots_accounted` needs every holder seen idle from the scheduler's thread: a
    tree with nothing in flight is vouched for from the main thread, and the same tree read
    from another thread (which could catch a backup between `alloc` and `commit_backup`) is
    not."""
    import threading

    from kvcanary_cli.capture import tree as capture

    tree = _host_tier_tree(monkeypatch, is_kv_sharded=False)
    elsewhere: dict[str, Any] = {}
    reader = threading.Thread(target=capture._accounted_facts, args=(elsewhere, tree))
    reader.start()
    reader.join()
    here: dict[str, Any] = {}
    capture._accounted_facts(here, tree)
    assert (here, elsewhere) == ({"host_slots_accounted": 1}, {})


def _storage_tree(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A 0.5.23-shaped tree with a storage tier whose threads are parked (as soak steps
    them) and nothing in flight: each test puts one holder back in."""
    import sys
    from queue import Queue

    disagg = SimpleNamespace(disaggregation_mode="null")
    context = SimpleNamespace(get_disagg=lambda: disagg)
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", context)
    group = SimpleNamespace()
    parked = SimpleNamespace(is_alive=lambda: False)
    controller = SimpleNamespace(
        mem_pool_host=group,
        enable_storage=True,
        is_kv_sharded=False,
        host_mem_release_queue=Queue(),
        extra_host_mem_release_queues={},
        prefetch_thread=parked,
        prefetch_io_aux_thread=parked,
        prefetch_sync_thread=parked,
        backup_thread=parked,
        pp_prefetch_command_thread=None,
        prefetch_buffer=Queue(),
        prefetch_sync_queue=Queue(),
        ack_prefetch_queue=Queue(),
        pp_prefetch_states={},
    )
    return SimpleNamespace(
        cache_controller=controller,
        host_pool_group=group,
        enable_storage=True,
        ongoing_prefetch={},
        ongoing_backup={7: ("node", "lock")},  # a backup reads its node's own slots
        buffer_pipeline=None,
        host_memory_mode="cache",
        linker=None,
    )


def _in_flight(host: Any = None, staged: Any = None) -> Any:
    return SimpleNamespace(
        host_indices=host, comp_xfers={"SWA": [SimpleNamespace(host_indices=staged)]}
    )


def test_a_storage_tier_with_nothing_in_flight_is_vouched_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The clean twin: storage on, its threads parked, a backup to storage in flight and a
    prefetch still asking storage (no host slot yet): every host slot is a node's or free."""
    from kvcanary_cli.capture import tree as capture

    tree = _storage_tree(monkeypatch)
    tree.ongoing_prefetch["asking"] = _in_flight()
    facts: dict[str, Any] = {}
    capture._accounted_facts(facts, tree)
    assert facts == {"host_slots_accounted": 1}


@pytest.mark.parametrize(
    "holder",
    [
        "prefetch-staging",
        "component-staging",
        "read-queued",
        "ack-queued",
        "release-queued",
        "thread-running",
        "pipeline-state",
    ],
)
def test_a_storage_tier_holding_a_host_slot_in_flight_leaves_the_fact_out(
    monkeypatch: pytest.MonkeyPatch, holder: str
) -> None:
    """Each place a storage tier holds host slots outside the free lists and the nodes, or
    one the read cannot see into (a thread running), leaves `host_slots_accounted` out."""
    import numpy as np

    from kvcanary_cli.capture import tree as capture

    tree = _storage_tree(monkeypatch)
    controller = tree.cache_controller
    if holder == "prefetch-staging":
        tree.ongoing_prefetch["hit"] = _in_flight(host=np.arange(4))
    elif holder == "component-staging":
        tree.ongoing_prefetch["hit"] = _in_flight(staged=np.arange(2))
    elif holder == "read-queued":
        controller.prefetch_buffer.put("operation")
    elif holder == "ack-queued":
        controller.ack_prefetch_queue.put("ack")
    elif holder == "release-queued":
        controller.host_mem_release_queue.put(np.arange(1))
    elif holder == "thread-running":
        controller.prefetch_io_aux_thread = SimpleNamespace(is_alive=lambda: True)
    else:
        controller.pp_prefetch_states = {"rid": "state"}
    facts: dict[str, Any] = {}
    capture._accounted_facts(facts, tree)
    assert facts == {}


@pytest.mark.parametrize("missing", ["backup_thread", "prefetch_buffer"])
def test_a_storage_tier_missing_a_thread_or_queue_is_not_vouched_for(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    """A controller that says storage is on but lacks one of the tier's threads or queues is
    not a tier this reading knows: the fact is left out."""
    from kvcanary_cli.capture import tree as capture

    tree = _storage_tree(monkeypatch)
    setattr(tree.cache_controller, missing, None)
    facts: dict[str, Any] = {}
    capture._accounted_facts(facts, tree)
    assert facts == {}


def _host_tier_tree(monkeypatch: pytest.MonkeyPatch, **controller: Any) -> Any:
    """A tree of the host tier, no storage, nothing in flight, its controller's fields
    `controller` (as each release has them)."""
    import sys

    disagg = SimpleNamespace(disaggregation_mode="null")
    context = SimpleNamespace(get_disagg=lambda: disagg)
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", context)
    group = SimpleNamespace()
    return SimpleNamespace(
        cache_controller=SimpleNamespace(
            mem_pool_host=group,
            enable_storage=False,
            host_mem_release_queue=None,
            extra_host_mem_release_queues={},
            **controller,
        ),
        host_pool_group=group,
        enable_storage=False,
        ongoing_prefetch={},
        ongoing_backup={},
        buffer_pipeline=None,
        host_memory_mode="cache",
        linker=None,
    )


def _allocates(*args: Any, **kwargs: Any) -> None:
    """A controller's `allocate_storage_hit` (0.5.22 on), never called by the reading."""


@pytest.mark.parametrize(
    ("controller", "vouched"),
    [
        # 0.5.23: the controller says its host KV pool is whole
        ({"is_kv_sharded": False, "allocate_storage_hit": _allocates}, True),
        # 0.5.23 with a page-interleaved (sharded) host pool
        ({"is_kv_sharded": True, "allocate_storage_hit": _allocates}, False),
        # 0.5.22: no flag (no sharded host pool at all), the storage hit allocated by the
        # controller, as 0.5.23's does
        ({"allocate_storage_hit": _allocates}, True),
        # 0.5.21: no flag either, the storage hit allocated by the tree itself (into the
        # same records), a pipeline-parallel prefetch's thread and state as 0.5.22's
        ({"pp_prefetch_command_thread": None, "pp_prefetch_states": {}}, True),
        # 0.5.19 and 0.5.20: no pipeline-parallel prefetch at all
        ({}, True),
    ],
    ids=["0.5.23", "0.5.23-sharded", "0.5.22", "0.5.21", "0.5.19-0.5.20"],
)
def test_host_slots_are_vouched_for_on_the_releases_whose_holders_are_read(
    monkeypatch: pytest.MonkeyPatch, controller: dict[str, Any], vouched: bool
) -> None:
    """0.5.19 - 0.5.22's host tier has 0.5.23's holders, but for the KV-sharded host pool,
    which they do not have (no flag on their controller): vouched for there as on 0.5.23,
    whoever allocates a storage hit (0.5.22's controller, or 0.5.19 - 0.5.21's tree). A
    sharded pool is not."""
    from kvcanary_cli.capture import tree as capture

    facts: dict[str, Any] = {}
    capture._accounted_facts(facts, _host_tier_tree(monkeypatch, **controller))
    assert facts == ({"host_slots_accounted": 1} if vouched else {})


@pytest.mark.parametrize(
    ("owner", "missing"),
    [
        ("tree", "buffer_pipeline"),
        ("tree", "host_memory_mode"),
        ("tree", "linker"),
        ("controller", "host_mem_release_queue"),
        ("controller", "extra_host_mem_release_queues"),
    ],
)
def test_a_tree_older_than_0_5_19_is_not_vouched_for(
    monkeypatch: pytest.MonkeyPatch, owner: str, missing: str
) -> None:
    """0.5.18 and older keep no buffer pipeline, host memory mode, linker or release queues:
    where their host slots wait is not read, so a tree or controller without one of those
    objects is not vouched for (and the read does not fail on it); its twin with every object
    is."""
    from kvcanary_cli.capture import tree as capture

    whole = _host_tier_tree(monkeypatch)
    older = _host_tier_tree(monkeypatch)
    delattr(older if owner == "tree" else older.cache_controller, missing)
    facts: dict[str, Any] = {}
    capture._accounted_facts(facts, whole)
    assert facts == {"host_slots_accounted": 1}
    facts = {}
    capture._accounted_facts(facts, older)
    assert facts == {}


def _older_storage_tree(monkeypatch: pytest.MonkeyPatch, release: str, holder: str) -> Any:
    """`_storage_tree` shaped as `release`'s (no `is_kv_sharded`; 0.5.19's and 0.5.20's
    controller without the pipeline-parallel thread and state), a prefetch still asking
    storage, and `holder` (or nothing, "") holding the slots of a storage hit."""
    import numpy as np

    tree = _storage_tree(monkeypatch)
    controller = tree.cache_controller
    del controller.is_kv_sharded
    if release == "0.5.19-0.5.20":
        del controller.pp_prefetch_command_thread, controller.pp_prefetch_states
    tree.ongoing_prefetch["asking"] = _in_flight()  # still asking storage: no slot yet
    if holder == "hit-recorded":
        tree.ongoing_prefetch["hit"] = _in_flight(host=np.arange(4))
    elif holder == "hit-queued":
        controller.prefetch_buffer.put(SimpleNamespace(host_indices=np.arange(4)))
    elif holder == "staging-failed":
        controller.host_mem_release_queue.put(np.arange(4))
    elif holder == "component-staging":
        tree.ongoing_prefetch["hit"] = _in_flight(staged=np.arange(2))
    return tree


@pytest.mark.parametrize("release", ["0.5.21", "0.5.19-0.5.20"])
def test_a_storage_tier_before_0_5_22_is_read_as_0_5_22s(
    monkeypatch: pytest.MonkeyPatch, release: str
) -> None:
    """0.5.19 - 0.5.21's storage tier, whose tree allocates a storage hit's host slots itself
    and in the same call records them in the request's in-flight prefetch and queues its
    read (or queues them for release where a component's staging fails): with nothing in
    flight it is vouched for (no flag, no `allocate_storage_hit`), and each place such a hit
    or a component's staging waits leaves the fact out."""
    from kvcanary_cli.capture import tree as capture

    seen: dict[str, dict[str, Any]] = {}
    for holder in ("", "hit-recorded", "hit-queued", "staging-failed", "component-staging"):
        facts: dict[str, Any] = {}
        capture._accounted_facts(facts, _older_storage_tree(monkeypatch, release, holder))
        seen[holder] = facts
    assert seen.pop("") == {"host_slots_accounted": 1}
    assert seen == dict.fromkeys(seen, {}), seen
