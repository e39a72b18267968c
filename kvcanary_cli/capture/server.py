"""What the serving process knows besides a launcher call: its model runners (pool sizes,
page size, free lists), its canary managers (canary buffers, the violation ring), its radix
trees (each registers itself in `capture.tree` once `watch_tree_classes` wrapped its class)
and the last plan call it made.

Everything is held weakly or replaced each step, read best effort (an attribute another SGLang
version renamed costs that fact, never the dump), and copied off the device only when a dump
is written. Importing this module costs only the standard library.
"""

from __future__ import annotations

import functools
import itertools
import logging
import sys
import weakref
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

__all__ = [
    "ORIGINAL_ATTR",
    "SGLANG_TREE_CLASSES",
    "canary_state",
    "last_call",
    "last_step",
    "manager_for",
    "pool_size",
    "rebind",
    "register_canary_manager",
    "register_model_runner",
    "remember_call",
    "next_step",
    "runner_for",
    "release_metadata",
    "server_context",
    "sglang_version",
    "watch_model_runners",
    "watch_tree_classes",
]

logger = logging.getLogger("kvcanary.capture")

#: Where SGLang sets the canary up with the model runner, which holds the pools and allocators
#: the launcher's arguments lack (pool sizes, page size, free lists).
SGLANG_CANARY_MODULE = "sglang.srt.kv_canary.api"
SGLANG_INSTALL_FUNCTION = "install_canary"
#: Attribute on a wrapper pointing at the function it wraps (marks it, and makes reinstalling
#: replace the wrapper instead of stacking a second one).
ORIGINAL_ATTR = "__kvcanary_original__"

#: SGLang's radix caches, by the module that defines them: `UnifiedRadixCache` (0.5.21 on),
#: the SWA tree of the releases before it, and `RadixCache` (every release; the caches built
#: on it call its `__init__`). Each registers itself when built, once its module is watched.
#: With them `StreamingSession`: 0.5.13 - 0.5.21 wrap a cache without streaming sessions of
#: its own in one (`StreamingSession(cache)`, the scheduler's `tree_cache`), which keeps the
#: sessions' slots; `tree_for` reads the tree through it (`UnifiedRadixCache`'s own embedded
#: one, and 0.5.22's, which reads no pool, are never taken for the tree).
SGLANG_TREE_CLASSES = {
    "sglang.srt.mem_cache.unified_radix_cache": "UnifiedRadixCache",
    "sglang.srt.mem_cache.swa_radix_cache": "SWARadixCache",
    "sglang.srt.mem_cache.radix_cache": "RadixCache",
    "sglang.srt.session.streaming_session": "StreamingSession",
}

#: Model runners and canary managers this process set the canary up for (weakly held).
_RUNNERS: list[weakref.ref[Any]] = []
_MANAGERS: list[weakref.ref[Any]] = []
#: Per-process count of launcher calls through any installed wrapper: the dumps' `step`.
_calls = itertools.count()
_last_step = [-1]
#: The keyword arguments of the last plan call, and of the last one with a LUT (the SWA
#: group's, which plans both groups from one dump): what a dump taken between calls replays.
_LAST: dict[str, dict[str, Any]] = {}


def _register(registry: list[weakref.ref[Any]], item: object) -> None:
    registry[:] = [ref for ref in registry if ref() is not None and ref() is not item]
    try:
        registry.append(weakref.ref(item))
    except TypeError:  # not weak-referenceable: not one we can use
        logger.debug("kvcanary: cannot hold a weak reference to %r", type(item).__name__)


def register_model_runner(runner: object) -> None:
    """Remember (weakly) a model runner, so dumps record its pool sizes and free lists.

    The capture hook does this itself when SGLang sets up the canary (`install_canary`); call
    it yourself when the hook is installed after that.
    """
    _register(_RUNNERS, runner)


def register_canary_manager(manager: object) -> None:
    """Remember (weakly) a canary manager, so dumps record its canary buffers and violation
    ring (`install_canary` returns it; the hook registers it by itself)."""
    _register(_MANAGERS, manager)


def watch_model_runners(module: ModuleType) -> bool:
    """Wrap `module.install_canary` so that every model runner it sets up, and the canary
    manager it returns, are registered."""
    current = getattr(module, SGLANG_INSTALL_FUNCTION, None)
    if not callable(current):
        return False
    original: Callable[..., Any] = getattr(current, ORIGINAL_ATTR, current)

    @functools.wraps(original)
    def install_and_register(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("model_runner") is not None:
            register_model_runner(kwargs["model_runner"])
        manager = original(*args, **kwargs)
        if manager is not None:
            register_canary_manager(manager)
        return manager

    setattr(install_and_register, ORIGINAL_ATTR, original)
    setattr(module, SGLANG_INSTALL_FUNCTION, install_and_register)
    rebind(current, install_and_register, SGLANG_INSTALL_FUNCTION)
    return True


def watch_tree_classes(module: ModuleType) -> bool:
    """Wrap the `__init__` of the radix cache class `module` defines (`SGLANG_TREE_CLASSES`)
    so that every tree built registers itself; the construction itself is unchanged, and a
    tree that cannot be registered is only logged. Watching again replaces the wrapper
    instead of stacking a second one. False when the module has no such class."""
    cls = getattr(module, SGLANG_TREE_CLASSES.get(getattr(module, "__name__", ""), ""), None)
    init = vars(cls).get("__init__") if isinstance(cls, type) else None
    if not callable(init):
        return False
    original: Callable[..., Any] = getattr(init, ORIGINAL_ATTR, init)

    @functools.wraps(original)
    def init_and_register(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            from kvcanary_cli.capture.tree import register_tree_cache

            register_tree_cache(self)
        except Exception as exc:  # the tree is built: registering it must not undo that
            logger.debug("kvcanary: could not register the tree (%s: %s)", type(exc).__name__, exc)

    setattr(init_and_register, ORIGINAL_ATTR, original)
    try:
        cls.__init__ = init_and_register  # type: ignore[misc]  # wrapping it is the point
    except (AttributeError, TypeError) as exc:  # a class that refuses new attributes
        logger.warning(
            "kvcanary: cannot watch %s for its radix tree (%s: %s); dumps will not record it",
            getattr(module, "__name__", module),
            type(exc).__name__,
            exc,
        )
        return False
    return True


def rebind(old: object, new: Callable[..., Any], name: str) -> None:
    """Point every loaded module's attribute `name` that is `old` at `new`."""
    for mod in list(sys.modules.values()):
        try:
            namespace = vars(mod)
        except TypeError:
            continue
        if namespace.get(name) is old:
            try:
                setattr(mod, name, new)
            except (AttributeError, TypeError):
                pass


def remember_call(kwargs: Mapping[str, Any]) -> None:
    """Keep the arguments of this plan call (references only: nothing is copied)."""
    call = dict(kwargs)
    _LAST["any"] = call
    if call.get("full_to_swa_index_mapping") is not None:
        _LAST["lut"] = call


def next_step() -> int:
    """Number this launcher call (SGLang plans once per KV group per forward step)."""
    step = next(_calls)
    _last_step[0] = step
    return step


def last_step() -> int:
    """The number of the last launcher call (0 before any: a dump still gets a name)."""
    return max(0, _last_step[0])


def last_call() -> dict[str, Any] | None:
    """The last plan call's arguments, preferring the last one with a LUT (None: no call)."""
    return _LAST.get("lut") or _LAST.get("any")


def _alive(registry: list[weakref.ref[Any]]) -> list[Any]:
    return [item for item in (ref() for ref in registry) if item is not None]


def runner_for(req_to_token: object) -> Any:
    """The registered model runner whose ReqToTokenPool holds `req_to_token` (or the only one)."""
    alive = _alive(_RUNNERS)
    for runner in alive:
        pool = getattr(runner, "req_to_token_pool", None)
        if getattr(pool, "req_to_token", None) is req_to_token:
            return runner
    return alive[0] if len(alive) == 1 else None


def manager_for(*, device_state: object = None, req_to_token: object = None) -> Any:
    """The registered canary manager owning `device_state` (a reporter's), or reading
    `req_to_token`, or the only one."""
    alive = _alive(_MANAGERS)
    for manager in alive:
        if device_state is not None and getattr(manager, "_device_state", None) is device_state:
            return manager
        pool = getattr(manager, "_req_to_token_pool", None)
        if req_to_token is not None and getattr(pool, "req_to_token", None) is req_to_token:
            return manager
    return alive[0] if len(alive) == 1 else None


def pool_size(req_to_token: object) -> int | None:
    """`num_full_slots` of the runner behind `req_to_token`, from host attributes only (a
    guard reads it every launch: no device access)."""
    runner = runner_for(req_to_token)
    allocator = getattr(runner, "token_to_kv_pool_allocator", None)
    try:
        page = int(getattr(allocator, "page_size", None) or getattr(runner, "page_size", 1) or 1)
        from kvcanary_cli.capture.tree import virtual_slots

        virtual = virtual_slots(allocator, page)  # unified memory: ids are virtual
        if virtual is not None:
            return virtual
        full = getattr(allocator, "_size_full", None) or getattr(allocator, "size", None)
        return None if full is None else int(full) + page
    except (TypeError, ValueError):
        return None


def server_context(req_to_token: object) -> dict[str, object]:
    """What the model runner behind a call knows that the call does not carry.

    Pool sizes (`num_full_slots`/`num_swa_slots` = size + page_size, the rows of the KV
    buffers), `page_size`, the allocators' free lists expanded from pages to slots (in every
    release: `capture.tree` reads them), what a registered radix tree holds, and the Mamba
    layout's records where the runner's request pool is a `HybridReqToTokenPool`. Each fact is
    best effort: an attribute SGLang renamed costs that fact, never the dump.
    """
    runner = runner_for(req_to_token)
    if runner is None:
        return {}
    allocator = getattr(runner, "token_to_kv_pool_allocator", None)
    if allocator is None:
        return {}
    from kvcanary_cli.capture.tree import tree_for, tree_state

    pool = getattr(runner, "req_to_token_pool", None)
    return dict(tree_state(allocator=allocator, tree=tree_for(req_to_token), req_pool=pool))


_VERSION: list[str | None] = []


def sglang_version() -> str | None:
    """The serving SGLang's version (`sglang.version`, else its package metadata), read once
    per process at the first dump; None when neither says."""
    if not _VERSION:
        found: str | None = None
        module = sys.modules.get("sglang.version")
        if module is None and "sglang" in sys.modules:  # SGLang is loaded: a tiny module
            try:
                import importlib

                module = importlib.import_module("sglang.version")
            except Exception:
                module = None
        text = getattr(module, "__version__", None)
        if isinstance(text, str):
            found = text
        else:
            try:
                import importlib.metadata

                found = importlib.metadata.version("sglang")
            except Exception:  # no metadata (a source tree): the dump just lacks the key
                found = None
        _VERSION.append(found)
    return _VERSION[0]


def release_metadata() -> dict[str, object]:
    """The dump metadata naming the serving SGLang release (`sglang.version`), when known."""
    from kvcanary_cli.dump.releases import METADATA_KEY

    version = sglang_version()
    return {} if version is None else {METADATA_KEY: version}


#: Canary buffers of a buffer group, by (head|tail, k|v): SGLang 0.5.23's
#: `CanaryBufferGroup` field names.
_BUFFERS = (
    ("head", "k", "k_head"),
    ("tail", "k", "k_tail"),
    ("head", "v", "v_head"),
    ("tail", "v", "v_tail"),
)


def canary_state(*, manager: object = None, device_state: object = None) -> dict[str, object]:
    """The canary buffers (`canary.<group>.<head|tail>.<k|v>`) of a canary manager's buffer
    groups, and the violation ring and write index of its (or the given) device state, by the
    format's names. References only: `capture_dump` copies them to the host."""
    facts: dict[str, object] = {}
    try:
        for group in getattr(manager, "_buffer_groups", None) or ():
            kind = str(getattr(getattr(group, "kind", None), "name", "")).lower()
            if kind not in ("full", "swa"):
                continue
            for end, half, field in _BUFFERS:
                buffer = getattr(group, field, None)
                if buffer is not None:
                    facts[f"canary.{kind}.{end}.{half}"] = buffer
        state = (
            device_state if device_state is not None else getattr(manager, "_device_state", None)
        )
        log = getattr(state, "violation_log", None)
        ring = getattr(log, "violation_ring", None)
        index = getattr(log, "violation_write_index", None)
        if ring is not None and index is not None:
            facts["violation_ring"] = ring
            facts["violation_write_index"] = index
    except Exception as exc:  # a changed canary must not cost the dump
        logger.debug("kvcanary: reading the canary state failed (%s: %s)", type(exc).__name__, exc)
    return facts
