"""SGLang's memory-check messages as a release's own code words them, on stand-in pools.

`release_checker(version)` reads from that release's wheel (at run time, with zipfile) the
module that builds the messages, `srt/managers/scheduler_components/invariant_checker.py`, and
the few functions of other modules that word or raise them (`raise_error_or_warn`,
`ceil_align`, `ceil_div` of `srt/utils/common.py`; the page-interleave allocator's class
census and `page_interleave_shard_size` from 0.5.20; `is_swa_req_ring` from 0.5.20), and runs
them as they are, with our stand-ins for the rest of SGLang they import (the pools, the tree,
the environment switches). Nothing of SGLang is copied into this repository, and nothing but
these modules' text is read: no server, no torch kernels, milliseconds per release.

`Pools` is a state in counts (what SGLang's observer and tree would report); `Release` turns it
into what a user sees: the idle check's `ValueError` text, the busy check's assert and log
lines, the page checks' lines, the request pool's line, the allocator's census assert.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import logging
import re
import sys
import textwrap
import types
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from tests.sglang_wheel import wheel_path

__all__ = ["Pools", "Release", "release_checker"]

_CHECKER = "sglang/srt/managers/scheduler_components/invariant_checker.py"
_COMMON = "sglang/srt/utils/common.py"
_INTERLEAVE = "sglang/srt/mem_cache/allocator/page_interleave.py"
_SWA = "sglang/srt/mem_cache/allocator/swa.py"
_MEMORY_POOL = "sglang/srt/mem_cache/memory_pool.py"


class _Missing:
    """An SGLang name the checker imports and these cases never use: using it says which."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: object, **kwargs: object) -> Any:
        raise AssertionError(f"stand-in {self._name} was called: extend tests/sglang_checker.py")

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise AssertionError(f"stand-in {self._name}.{attr} used: extend tests/sglang_checker.py")


class _Mode(enum.Enum):
    """Stand-in of SGLang's DisaggregationMode (only NULL and DECODE are compared)."""

    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass
class _Switch:
    value: Any

    def get(self) -> Any:
        return self.value


class _Envs:
    """Stand-in of `sglang.srt.environ.envs`: the switches the checker reads."""

    def __init__(self) -> None:
        self.SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE = _Switch(True)
        self.SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY = _Switch(2)
        self.SGLANG_CHECK_KV_PAGE_INVARIANTS = _Switch(False)
        self.SGLANG_ENABLE_TREE_CACHE_SANITY_CHECK = _Switch(False)


def _read(archive: zipfile.ZipFile, member: str) -> str | None:
    try:
        return archive.read(member).decode()
    except KeyError:
        return None


def _definitions(
    source: str, names: tuple[str, ...], namespace: dict[str, Any], *, inside: str | None = None
) -> dict[str, Any]:
    """The top-level functions `names` of `source` (or those of its class `inside`), executed
    as they are into `namespace` (their globals); those it lacks are left out. Only their own
    lines are parsed (a module of SGLang's is thousands of lines)."""
    lines = source.splitlines()
    if inside is not None:
        head = [i for i, line in enumerate(lines) if re.match(rf"class {inside}\b", line)]
        lines = _block(lines, head[0]) if head else []
    found: dict[str, Any] = {}
    for name in names:
        at = [i for i, line in enumerate(lines) if re.match(rf"\s*def {name}\(", line)]
        if not at:
            continue
        text = textwrap.dedent("\n".join(_block(lines, at[0])))
        local: dict[str, Any] = {}
        exec(compile(text, f"<{name}>", "exec"), namespace, local)  # noqa: S102
        found[name] = local[name]
        namespace.setdefault(name, local[name])
    return found


def _block(lines: list[str], start: int) -> list[str]:
    """The lines of the definition starting at `start`: up to the next line indented no
    deeper (a closing bracket of its signature aside)."""
    depth = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines):
        line = lines[end]
        indent = len(line) - len(line.lstrip())
        if line.strip() and indent <= depth and not line.lstrip().startswith((")", "]")):
            break
        end += 1
    return lines[start:end]


class ClassedAllocator:
    """Stand-in of 0.5.20+'s PageInterleavePoolAllocator: the release's own census methods
    (`class_free_page_counts`, `aggregate_free_size`, `get_all_free_pages`,
    `debug_check_classes`) are set on a subclass per release."""

    def __init__(self, page_size: int, classes: list[list[int]]) -> None:
        self.page_size = page_size
        self.shard_size = len(classes)
        self.class_free_pages = [torch.tensor(c, dtype=torch.int64) for c in classes]
        self.class_release_pages = [torch.zeros(0, dtype=torch.int64) for _ in classes]
        self.size = 0


class RingAllocator:
    """Stand-in of the SWA allocator in its per-request ring mode (0.5.20+)."""

    swa_req_ring = True
    page_size = 1


class FlatAllocator:
    """Stand-in of a paged allocator: its free and release lists (pages)."""

    def __init__(self, page_size: int, size: int, free: list[int]) -> None:
        self.page_size = page_size
        self.size = size
        self.free_pages = torch.tensor(free, dtype=torch.int64)
        self.release_pages = torch.zeros(0, dtype=torch.int64)

    def get_all_free_pages(self) -> torch.Tensor:
        return torch.cat((self.free_pages, self.release_pages))


@dataclass
class Pools:
    """A state in the counts SGLang's observer and tree report (slots; `None`: not this
    model's pool). `free_pages` / `row_pages`: the full pool's free list and one running
    request's row, for the page checks; `classes`: a page-interleave allocator's free lists
    by class; `ring`: an SWA ring allocator; `dcp`: decode-context parallelism on."""

    total: int | None = 64
    available: int = 64
    evictable: int = 0
    protected: int = 0
    session_held: int = 0
    swa_total: int | None = None
    swa_available: int = 0
    swa_evictable: int = 0
    swa_protected: int = 0
    mamba_total: int | None = None
    mamba_available: int = 0
    mamba_evictable: int = 0
    mamba_protected: int = 0
    mamba_free: list[int] = field(default_factory=list)
    int8_slots: int | None = None
    int8_available: int = 0
    page_size: int = 1
    free_pages: list[int] | None = None
    row_pages: list[int] = field(default_factory=list)
    tree_pages: list[int] = field(default_factory=list)
    classes: list[list[int]] | None = None
    ring: bool = False
    dcp: bool = False
    rows_free: int = 8
    rows: int = 8


class Release:
    """One release's checker, loaded on stand-ins (see the module's docstring)."""

    def __init__(self, version: str, wheel: Path) -> None:
        self.version = version
        with zipfile.ZipFile(wheel) as archive:
            checker = _read(archive, _CHECKER)
            common = _read(archive, _COMMON)
            interleave = _read(archive, _INTERLEAVE)
            swa = _read(archive, _SWA)
            memory_pool = _read(archive, _MEMORY_POOL)
        assert checker is not None and common is not None, f"{wheel}: no invariant checker"
        self.envs = _Envs()
        self.parallel = SimpleNamespace(dcp_enabled=False)
        name = f"_kvcanary_sglang_{version.replace('.', '_')}_checker"
        self.logger = logging.getLogger(name)
        helpers: dict[str, Any] = {"logger": self.logger, "math": __import__("math")}
        _definitions(common, ("ceil_div", "ceil_align", "raise_error_or_warn"), helpers)
        self.classed: type[ClassedAllocator] | None = None
        standins: dict[str, Any] = {
            "envs": self.envs,
            "DisaggregationMode": _Mode,
            "raise_error_or_warn": helpers["raise_error_or_warn"],
            "ceil_align": helpers["ceil_align"],
            "get_parallel": lambda: self.parallel,
            "scheduler_stage_method": lambda stage: lambda method: method,
            "UnifiedMambaSWATokenToKVPoolAllocator": type("NeverThis", (), {}),
        }
        if interleave is not None:
            census = (
                "class_free_page_counts",
                "aggregate_free_size",
                "get_all_free_pages",
                "debug_check_classes",
            )
            found = _definitions(
                interleave, census, {"torch": torch}, inside="PageInterleavePoolAllocator"
            )
            self.classed = type("Classed", (ClassedAllocator,), found)
            classed: dict[str, Any] = {"PageInterleavePoolAllocator": self.classed}
            standins.update(_definitions(interleave, ("page_interleave_shard_size",), classed))
        if swa is not None:
            ring: dict[str, Any] = {"SWATokenToKVPoolAllocator": RingAllocator}
            standins.update(_definitions(swa, ("is_swa_req_ring",), ring))
        found = _definitions(
            memory_pool or "", ("free_mamba_cache",), {}, inside="HybridReqToTokenPool"
        )
        self.free_mamba_cache = found.get("free_mamba_cache")
        self.module = _module(name, checker, standins)
        self.cls = self.module.SchedulerInvariantChecker

    # --- the checker over a state ---------------------------------------------------------

    def checker(self, pools: Pools, *, busy: bool = False) -> Any:
        """SGLang's SchedulerInvariantChecker over stand-ins of `pools` (busy: a last batch
        with one running request holding `row_pages`, else none)."""
        page = pools.page_size
        hybrid_swa = pools.swa_total is not None or pools.ring
        hybrid_ssm = pools.mamba_total is not None
        self.parallel.dcp_enabled = pools.dcp
        allocator: Any
        if pools.classes is not None:
            assert self.classed is not None, f"{self.version} has no page-interleave allocator"
            allocator = self.classed(page, pools.classes)
        elif pools.ring:
            allocator = RingAllocator()
        else:
            free = pools.free_pages if pools.free_pages is not None else []
            allocator = FlatAllocator(page, pools.total or 0, free)
        if hybrid_swa and not pools.ring:
            allocator.full_attn_allocator = FlatAllocator(page, pools.total or 0, [])
            allocator.full_attn_allocator.free_pages = allocator.free_pages
        req_pool = _ReqPool(pools)
        tree = _Tree(pools)
        observer = _Observer(pools)
        kv = SimpleNamespace(
            holds_kv=True,
            req_pool_idx=0,
            kv_committed_len=len(pools.row_pages) * page,
            kv_allocated_len=len(pools.row_pages) * page,
            cache_protected_len=0,
            swa_evicted_seqlen=0,
        )
        req = SimpleNamespace(
            rid="r0",
            kv=kv,
            beam_group=None,
            kv_committed_freed=False,
            kv_overallocated_freed=False,
            **{k: v for k, v in vars(kv).items() if k != "holds_kv"},
        )
        if pools.row_pages:
            row = [p * page + i for p in pools.row_pages for i in range(page)]
            req_pool.req_to_token[0, : len(row)] = torch.tensor(row)
        batch = SimpleNamespace(reqs=[req] if busy and pools.row_pages else [])
        batch.is_empty = lambda: not batch.reqs
        given = {
            "is_hybrid_swa": hybrid_swa,
            "is_hybrid_ssm": hybrid_ssm,
            "disaggregation_mode": _Mode.NULL,
            "page_size": page,
            "full_tokens_per_layer": pools.total if hybrid_swa else None,
            "swa_tokens_per_layer": pools.swa_total,
            "max_total_num_tokens": pools.total,
            "server_args": SimpleNamespace(dcp_size=2 if pools.dcp else 1),
            "tree_cache": tree,
            "token_to_kv_pool_allocator": allocator,
            "req_to_token_pool": req_pool,
            "pool_stats_observer": observer,
            "get_last_batch": lambda: batch if busy else None,
            "get_running_batch": lambda: None,
            "get_chunked_req": lambda: None,
            "scheduler_stage_metrics": None,
        }
        names = {f.name for f in dataclasses.fields(self.cls)}
        made = self.cls(**{k: v for k, v in given.items() if k in names})
        observer.stats = SimpleNamespace(
            full_available_size=pools.available,
            full_evictable_size=pools.evictable,
            full_capacity=pools.total,
            swa_available_size=pools.swa_available,
            swa_evictable_size=pools.swa_evictable,
            swa_capacity=pools.swa_total,
            mamba_available_size=pools.mamba_available,
            mamba_evictable_size=pools.mamba_evictable,
        )
        return made

    # --- what the user sees ----------------------------------------------------------------

    def idle(self, pools: Pools) -> list[str]:
        """The idle check as the scheduler runs it (its pools' lines joined into one report
        when one is off, then the request pool's), strict: each raised message's text."""
        checker = self.checker(pools)
        said: list[str] = []
        leaked, lines = checker._check_all_pools(checker.pool_stats_observer.get_pool_stats())
        if leaked:
            said += _raised(lambda: checker._report_leak("pool", "\n".join(lines)))
        said += _raised(checker._check_req_pool)
        return said

    def busy(self, pools: Pools) -> tuple[list[str], list[str]]:
        """The busy check (verbose): (its log lines, the assert's text if it fails)."""
        checker = self.checker(pools, busy=True)
        with self._logged() as logged:
            raised = _raised(checker.self_check_during_busy, AssertionError)
        return logged, raised

    def page_checks(self, pools: Pools) -> list[str]:
        """The page checks (double free, use after free) over a running request's row."""
        checker = self.checker(pools, busy=True)
        if not hasattr(checker, "_check_kv_page_invariants"):
            return []
        self.envs.SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE.value = False
        try:
            with self._logged() as logged:
                checker._check_kv_page_invariants()
        finally:
            self.envs.SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE.value = True
        return logged

    def census(self, pools: Pools) -> list[str]:
        """The page-interleave allocator's own census (its debug mode's assert)."""
        assert pools.classes is not None
        checker = self.checker(pools)
        return _raised(checker.token_to_kv_pool_allocator.debug_check_classes, AssertionError)

    def mamba_freed_twice(self) -> list[str]:
        """The hybrid request pool's own check, freeing a request's Mamba slot a second time
        (the first free left its index None)."""
        assert self.free_mamba_cache is not None, f"{self.version}: no free_mamba_cache"
        kv = SimpleNamespace(mamba_pool_idx=None)
        req = SimpleNamespace(kv=kv, mamba_pool_idx=None)
        free = self.free_mamba_cache
        return _raised(lambda: free(SimpleNamespace(), req), AssertionError)

    def report(self, head: str, text: str) -> list[str]:
        """`_report_leak(head, text)` as the scheduler calls it (the byte report)."""
        checker = self.checker(Pools())
        return _raised(lambda: checker._report_leak(head, text))

    @contextmanager
    def _logged(self) -> Iterator[list[str]]:
        lines: list[str] = []
        handler = _Collect(lines)
        self.logger.addHandler(handler)
        self.logger.setLevel(logging.INFO)
        checker_logger = logging.getLogger(self.module.__name__)
        checker_logger.addHandler(handler)
        checker_logger.setLevel(logging.INFO)
        try:
            yield lines
        finally:
            self.logger.removeHandler(handler)
            checker_logger.removeHandler(handler)


class _Collect(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _raised(call: Callable[[], object], kind: type[BaseException] = ValueError) -> list[str]:
    try:
        call()
    except kind as exc:
        return [str(exc)]
    return []


class _Tree:
    def __init__(self, pools: Pools) -> None:
        self.pools = pools

    def protected_size(self) -> int:
        return self.pools.protected

    def full_protected_size(self) -> int:
        return self.pools.protected

    def swa_protected_size(self) -> int:
        return self.pools.swa_protected

    def mamba_protected_size(self) -> int:
        return self.pools.mamba_protected

    def mamba_evictable_size(self) -> int:
        return self.pools.mamba_evictable

    def supports_mamba(self) -> bool:
        return self.pools.mamba_total is not None

    def swa_transient_size(self) -> int:
        return 0

    def session_records(self) -> dict[str, Any]:
        return {}

    def all_values_flatten(self) -> torch.Tensor:
        page = self.pools.page_size
        return torch.tensor([p * page for p in self.pools.tree_pages], dtype=torch.int64)

    def all_mamba_values_flatten(self) -> torch.Tensor:
        return torch.zeros(0, dtype=torch.int64)


class _Observer:
    def __init__(self, pools: Pools) -> None:
        self.pools = pools
        self.stats: Any = None

    def get_pool_stats(self) -> Any:
        return self.stats

    def session_held_tokens(self) -> int:
        return self.pools.session_held

    def session_held_full_tokens(self) -> int:
        return self.pools.session_held

    def session_held_swa_tokens(self) -> int:
        return 0

    def session_held_mamba_slots(self) -> int:
        return 0

    def session_held_req_count(self) -> int:
        return 0


class _ReqPool:
    def __init__(self, pools: Pools) -> None:
        self.size = pools.rows
        self.pre_alloc_size = 0
        self.free_slots = list(range(pools.rows_free))
        self.req_to_token = torch.zeros((pools.rows, 64), dtype=torch.int64)
        if pools.mamba_total is not None:
            self.mamba_pool = SimpleNamespace(size=pools.mamba_total)
            self.mamba_allocator = SimpleNamespace(
                size=pools.mamba_total,
                free_slots=torch.tensor(pools.mamba_free, dtype=torch.int64),
            )
        if pools.int8_slots is not None:
            available = pools.int8_available
            self.mamba_ckpt_pool = SimpleNamespace(
                num_slots=pools.int8_slots, available_size=lambda: available
            )

    def schedulable_token_capacity(self, size: int) -> int:
        return size


def _module(name: str, source: str, standins: dict[str, Any]) -> types.ModuleType:
    """`source` executed as module `name`, its imports of SGLang bound to `standins` (names
    not there: `_Missing`)."""
    tree = ast.parse(source)
    bound: dict[str, Any] = {}
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang"):
            for alias in node.names:
                local = alias.asname or alias.name
                bound[local] = standins.get(local, _Missing(local))
            continue
        body.append(node)
    module = types.ModuleType(name)
    module.__dict__.update(bound)
    sys.modules[name] = module  # dataclasses look the module up while the class is built
    try:
        code = compile(ast.Module(body=body, type_ignores=[]), f"<sglang {name}>", "exec")
        exec(code, module.__dict__)  # noqa: S102
    finally:
        sys.modules.pop(name, None)
    return module


_LOADED: dict[str, Release] = {}


def release_checker(version: str) -> Release | None:
    """The release's checker on stand-ins (loaded once per process); None without its wheel."""
    if version not in _LOADED:
        wheel = wheel_path(version)
        if wheel is None:
            return None
        _LOADED[version] = Release(version, wheel)
    return _LOADED[version]
