"""SGLang 0.5.13 - 0.5.21's own `StreamingSession` class (from each release's wheel) wrapping
a cache without streaming sessions, as `--enable-streaming-session` builds it for the
scheduler: the capture hook registers the cache and the wrapper, and a dump captured with the
running requests (`capture_state`, the `leak` trigger's read) records the idle session's row,
allocated length and locked prefix, so it checks clean. The cache alone (what `tree_for`
returned before) shows no session: the row read as `req-row-leaked`, its KV as
`full-page-leaked`, its prefix lock as `tree-lock-leaked`.

Only `streaming_session.py` is the release's; the modules it imports are empty stand-ins (the
wrapper's layout is what is read: its own `inner` and `slots`, the pool it forwards, every
other read forwarded to the cache inside)."""

from __future__ import annotations

import sys
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import kvcanary_cli.capture.server as server
import kvcanary_cli.capture.tree as tree_capture
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.dump.writer import save_dump
from tests.helpers import checked
from tests.sglang_wheel import missing_wheel, wheel_path

_MODULE = "sglang.srt.session.streaming_session"
#: what the releases' `streaming_session.py` imports from SGLang, stood in by empty modules
_IMPORTS = (
    "sglang",
    "sglang.srt",
    "sglang.srt.managers",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.mem_cache",
    "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.mem_cache.unified_cache",
    "sglang.srt.mem_cache.unified_cache.component_type",
    "sglang.srt.session",
    "sglang.srt.utils",
    "sglang.srt.utils.common",
)


class _Named(type):
    """A stand-in class whose every attribute is another stand-in class."""

    def __getattr__(cls, name: str) -> Any:
        return _Named(name, (), {})


def _empty(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []

    def named(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Named(attr, (), {})

    module.__getattr__ = named  # type: ignore[method-assign]
    return module


def _release_module(version: str) -> types.ModuleType:
    """The release's `streaming_session` module, run on stand-ins; `sys.modules` as it was
    (the module imports torch itself: without it, skipped)."""
    pytest.importorskip("torch", reason="the release's streaming_session.py imports torch")
    wheel = wheel_path(version)
    assert wheel is not None
    with zipfile.ZipFile(wheel) as archive:
        source = archive.read("sglang/srt/session/streaming_session.py").decode()
    saved = {n: sys.modules[n] for n in (*_IMPORTS, _MODULE) if n in sys.modules}
    module = types.ModuleType(_MODULE)
    try:
        sys.modules.update({name: _empty(name) for name in _IMPORTS})
        sys.modules[_MODULE] = module  # its dataclasses look their module up
        exec(compile(source, f"sglang-{version}/{_MODULE}", "exec"), module.__dict__)
    finally:
        for name in (*_IMPORTS, _MODULE):
            sys.modules.pop(name, None)
        sys.modules.update(saved)
    return module


def _release(version: str) -> Any:
    return pytest.param(
        version,
        marks=pytest.mark.skipif(wheel_path(version) is None, reason=missing_wheel(version)),
    )


@pytest.fixture
def trees(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(tree_capture, "_TREES", [])
    yield


class _RadixCache:
    """The cache inside: 8 slots of page size 1; slots 5 and 6 are its one node's, locked
    (the session's prefix); the session's row 3 holds them, then its own KV 7, 1."""

    def __init__(self, pool: Any) -> None:
        self.req_to_token_pool = pool

    def all_values_flatten(self) -> np.ndarray:
        return np.array([5, 6])


def _slot(version: str) -> Any:
    """An idle session's slot holding row 3 with 4 tokens allocated, as the release lays it
    out: the slot names the row and lengths (0.5.13 - 0.5.15), the row and a `kv` with the
    lengths (0.5.16 - 0.5.18), or keeps a `ReqKvInfo` (0.5.19 - 0.5.21)."""
    if version < "0.5.16":
        return SimpleNamespace(req_pool_idx=3, kv_allocated_len=4)
    if version < "0.5.19":
        return SimpleNamespace(req_pool_idx=3, kv=SimpleNamespace(kv_allocated_len=4))
    return SimpleNamespace(kv=SimpleNamespace(req_pool_idx=3, kv_allocated_len=4))


@pytest.mark.parametrize("version", [_release(v) for v in ("0.5.13", "0.5.16", "0.5.19", "0.5.21")])
def test_an_idle_session_of_the_releases_wrapper_checks_clean(
    version: str, trees: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = _release_module(version)
    cls = release.StreamingSession
    monkeypatch.setattr(cls, "__init__", vars(cls)["__init__"])  # unwatched after the test
    assert server.watch_tree_classes(release)
    table = np.zeros((5, 8), dtype=np.int32)
    table[3, :4] = [5, 6, 7, 1]
    pool = SimpleNamespace(req_to_token=table, free_slots=[0, 1, 2, 4])
    inner = _RadixCache(pool)
    tree_capture.register_tree_cache(inner)
    wrapper = cls(inner)  # the registry's `StreamingSession(cache)`
    wrapper.slots["s"] = _slot(version)
    assert tree_capture.tree_for(table) is wrapper

    class Walked:  # the tree's lock walk, read through the wrapper: nothing unlocked
        @staticmethod
        def walk_for_kv_canary(*, unlocked_only: bool, swa_resident_only: bool) -> Any:
            return SimpleNamespace(slot_indices=np.zeros(0, dtype=np.int64))

    inner.tree_core = Walked()  # type: ignore[attr-defined]
    allocator = SimpleNamespace(
        page_size=1, size=8, free_pages=np.array([2, 3, 4, 8]), release_pages=None
    )
    tensors, metadata = tree_capture.capture_state(
        req_to_token_pool=pool,
        allocator=allocator,
        tree=tree_capture.tree_for(table),
        requests=[],  # idle: no request runs
    )
    assert tensors["running_req_rows"].tolist() == [3]
    assert tensors["tree_locked_full_slots"].tolist() == [5, 6]
    leaks = {FindingCode.REQ_ROW_LEAKED, FindingCode.FULL_PAGE_LEAKED, FindingCode.TREE_LOCK_LEAKED}
    assert not _codes(tmp_path / "wrapper.safetensors", tensors, metadata, version) & leaks
    # the cache alone, as the hook read it before: the session's row, KV and lock nobody's
    alone, metadata = tree_capture.capture_state(
        req_to_token_pool=pool, allocator=allocator, tree=inner, requests=[]
    )
    assert _codes(tmp_path / "inner.safetensors", alone, metadata, version) >= leaks


def _codes(path: Path, tensors: dict[str, Any], metadata: dict[str, str], version: str) -> set[Any]:
    save_dump(path, metadata={**metadata, "sglang.version": version}, **tensors)
    return {f.code for f in checked(load_dump(path)).findings}
