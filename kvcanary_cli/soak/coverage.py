"""Which of SGLang's memory-cache functions a soak ran (`kvcanary soak --coverage`).

A workload finds a bug only in code it runs: a planted bug in a free path no step calls is
invisible to every audit. `Tracer` records each function of SGLang's `srt/mem_cache/` files
that is called: a `sys.settrace` hook that answers call events only and never traces lines
(Python 3.11 has no `sys.monitoring`). `free_paths` lists the functions that give memory back
(free, release or evict in the name; size queries and predicates are not) of the objects a
stack built: the method each of its allocators, pools, tree, tree components and the tree's
streaming sessions (`srt/session/streaming_session.py`, traced too) resolves to, and the
functions of `mem_cache/common.py` and `allocation.py` (the scheduler's frees). What runs
inside the Rust tree core is not Python and is not seen.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvcanary_cli.results.soak import SoakCoverage

__all__ = ["Tracer", "free_paths", "stack_objects", "summary"]

#: A function that gives memory back.
_FREE = re.compile(r"free|release|evict")
#: ... unless it only asks (a size, a predicate, a getter, a text, an ordering, metrics): the
#: tracer also sees kvcanary's own audit read SGLang (`get_all_free_pages`), never a free.
_QUERY = re.compile(r"size|_str$|^_?(has|can|tracks|get)_|priority|strategy|metrics")
#: Free paths of what soak does not drive: CUDA; a host tier's (HiCache) unless it ran one
#: (`summary(hicache=True)`); radix sessions' (the components' `release_session` is theirs)
#: unless it ran them (`summary(radix=True)`, `--session-radix-cache`);
#: Mamba's outside the Mamba layout (`summary(mamba=True)`: there they are this layout's own);
#: streaming sessions' where no history opened one (`summary(streaming=False)`: the Mamba
#: layout's sessions are client sessions, whose close frees nothing).
_ELSEWHERE = r"(?<!none)_cuda|hisparse"
_HOST = r"host|unevict"
_RADIX = r"radix_session|component\.release_session"
_MAMBA = re.compile(r"mamba")
_SESSION = re.compile(r"session")


class Tracer:
    """Code objects of the files of `folder` (and of `also`) called while `tracing()` runs."""

    def __init__(self, folder: Path, *also: Path) -> None:
        self.prefix = tuple(str(f.resolve()) + "/" for f in (folder, *also))
        self.called: set[types.CodeType] = set()
        self._mine: dict[str, bool] = {}

    def _on_call(self, frame: types.FrameType, event: str, arg: Any) -> None:
        code = frame.f_code
        mine = self._mine.get(code.co_filename)
        if mine is None:
            mine = self._mine[code.co_filename] = code.co_filename.startswith(self.prefix)
        if mine:
            self.called.add(code)
        # None: no line events in this frame

    @contextmanager
    def tracing(self) -> Iterator[None]:
        """Record calls inside; the trace function set before is set again after."""
        before = sys.gettrace()
        sys.settrace(self._on_call)
        try:
            yield
        finally:
            sys.settrace(before)


def stack_objects(stack: Any) -> list[Any]:
    """The objects of a soak's stack whose methods free memory: the allocator and its two
    sides, the pools, the tree and its components, and the tree's streaming sessions
    (`StreamingSession`, embedded in the tree)."""
    allocator = stack.allocator
    found = [allocator, stack.req_to_token_pool, stack.kv_pool, stack.tree]
    for side in ("full_attn_allocator", "swa_attn_allocator"):
        inner = getattr(allocator, side, None)
        if inner is not None:
            found.append(inner)
    components = getattr(stack.tree, "components", None)
    if isinstance(components, dict):
        found.extend(components.values())
    # the host tier's: its controller and each host pool of its group
    controller = getattr(stack.tree, "cache_controller", None)
    if controller is not None:
        found.append(controller)
        group = getattr(stack.tree, "host_pool_group", None)
        found.extend(entry.host_pool for entry in getattr(group, "entries", None) or ())
    session = getattr(stack.tree, "session", None)
    if isinstance(getattr(session, "slots", None), dict):
        found.append(session)
    return found


def _function(value: Any) -> types.FunctionType | None:
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    return value if isinstance(value, types.FunctionType) else None


def _frees(name: str) -> bool:
    return bool(_FREE.search(name)) and not _QUERY.search(name) and not name.startswith("__")


def free_paths(
    objects: Iterable[Any], modules: Iterable[types.ModuleType], folder: Path, *also: Path
) -> dict[str, types.CodeType]:
    """`Class.method` (the class defining what the object resolves to) or `module.function`
    for every free path of `objects` and of `modules` (their own functions) in the files of
    `folder` (and of `also`)."""
    prefix = tuple(str(f.resolve()) + "/" for f in (folder, *also))
    paths: dict[str, types.CodeType] = {}
    for obj in objects:
        mro = type(obj).__mro__
        for name in filter(_frees, dir(type(obj))):
            owner = next(cls for cls in mro if name in vars(cls))
            function = _function(vars(owner)[name])
            if function is not None and function.__code__.co_filename.startswith(prefix):
                paths[function.__qualname__] = function.__code__
    for module in modules:
        short = module.__name__.rpartition(".")[2]
        for name, value in vars(module).items():
            function = _function(value)
            if function is not None and _frees(name) and function.__module__ == module.__name__:
                paths[f"{short}.{name}"] = function.__code__
    return paths


def summary(
    tracer: Tracer,
    paths: dict[str, types.CodeType],
    *,
    mamba: bool = False,
    hicache: bool = False,
    streaming: bool = False,
    radix: bool = False,
) -> SoakCoverage:
    """What ran of `paths`, sorted by name, the ones serving other features apart (a Mamba
    path is another feature's unless the soak ran the Mamba layout, a host tier's unless it
    ran the host tier, a radix session's unless it ran radix sessions, another session's
    unless it ran a layout whose histories open streaming sessions)."""
    parts = [_ELSEWHERE, *(() if hicache else (_HOST,)), *(() if radix else (_RADIX,))]
    others = re.compile("|".join(parts))
    own = re.compile(_RADIX) if radix else None
    names = sorted(paths)
    missed = [name for name in names if paths[name] not in tracer.called]

    def other(name: str) -> bool:
        lowered = name.lower()
        return (
            bool(others.search(lowered))
            or (not mamba and bool(_MAMBA.search(lowered)))
            or (
                not streaming
                and bool(_SESSION.search(lowered))
                and not (own is not None and own.search(lowered))
            )
        )

    return SoakCoverage(
        functions_run=len(tracer.called),
        reached=tuple(name for name in names if paths[name] in tracer.called),
        not_reached=tuple(name for name in missed if not other(name)),
        other_features=tuple(name for name in missed if other(name)),
    )
