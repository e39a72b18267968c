"""Capture a dump from a live SGLang process at the moment its kv-canary plan fails.

A plan failure (`ValueError: kv-canary: SWA slot ...`) is only diagnosable with the exact inputs
of that call, and those are gone once the process dies. This module saves them as a format-v1
dump, either where the user calls it (`save_plan_inputs`) or automatically, by wrapping SGLang's
`launch_canary_plan_kernels` so that a call that raises writes a dump before the original
exception propagates unchanged (`install_sglang_hook`).

Enabling the hook without touching SGLang's code: set `KVCANARY_DUMP_DIR` and make every
interpreter import this module at start-up, which SGLang's worker processes (spawned, not
forked) inherit through the environment. Either

* put a `sitecustomize.py` containing the line ``import kvcanary_cli.capture`` in a directory
  on `PYTHONPATH` (it shadows any other `sitecustomize` on the path), or
* put a file `kvcanary-capture.pth` containing the same line in `site-packages`.

Then ``KVCANARY_DUMP_DIR=/tmp/kvcanary-dumps python -m sglang.launch_server ...``. Importing this
module costs only the standard library; with the variable set it arms an import hook that wraps
the launcher as soon as SGLang loads it (SGLang itself is not imported early), so even
``from ... import launch_canary_plan_kernels`` bindings made later get the wrapper.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import itertools
import logging
import operator
import os
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from kvcanary_cli.dump.schema import (
    LAUNCHER_ARGUMENTS,
    LAUNCHER_FUNCTION,
    LAUNCHER_MODULE,
    LAUNCHER_OUTPUTS,
    SCALARS,
    TENSORS,
    required_tensors,
)

__all__ = [
    "DUMP_DIR_ENV",
    "SGLANG_CANARY_MODULE",
    "register_model_runner",
    "server_context",
    "watch_model_runners",
    "PLAN_ARGUMENTS",
    "SGLANG_PLAN_FUNCTION",
    "SGLANG_PLAN_MODULE",
    "install_from_env",
    "install_sglang_hook",
    "save_plan_inputs",
]

logger = logging.getLogger("kvcanary.capture")

#: Environment variable naming the directory dumps go to; setting it enables the hook.
DUMP_DIR_ENV = "KVCANARY_DUMP_DIR"
#: Module and function of SGLang's plan launcher (`kernels/ops/kv_canary/plan/api.py`).
SGLANG_PLAN_MODULE = LAUNCHER_MODULE
SGLANG_PLAN_FUNCTION = LAUNCHER_FUNCTION
#: Where SGLang sets the canary up with the model runner, which holds the pools and allocators
#: the launcher's arguments lack (pool sizes, page size, free lists).
SGLANG_CANARY_MODULE = "sglang.srt.kv_canary.api"
SGLANG_INSTALL_FUNCTION = "install_canary"

#: The keyword arguments of `launch_canary_plan_kernels` (docs/semantics.md §1.1), in upstream
#: order; the dump format names its tensors and scalars after them.
PLAN_ARGUMENTS = LAUNCHER_ARGUMENTS
#: Without these the dump is unreadable.
_REQUIRED = required_tensors()
#: Launcher arguments stored as metadata scalars rather than tensors.
_SCALAR_ARGUMENTS = tuple(name for name in PLAN_ARGUMENTS if name in SCALARS)

#: Attribute on a wrapper pointing at the function it wraps (marks it, and makes reinstalling
#: replace the wrapper instead of stacking a second one).
_ORIGINAL_ATTR = "__kvcanary_original__"
_MAX_NOTE_CHARS = 2000

#: Per-process count of launcher calls through any installed wrapper: the dump's `step`.
_calls = itertools.count()
#: Dumps written by this process. Each one holds all of `req_to_token` (GBs in production),
#: so a server that catches the error and keeps going must not fill the disk.
_written = [0]  # a list, so the wrapper can count without a `global`
#: Most dumps one process writes; `KVCANARY_DUMP_LIMIT` changes it.
DEFAULT_DUMP_LIMIT = 4
#: Model runners this process set the canary up for (weakly held: never kept alive by us).
_RUNNERS: list[weakref.ref[Any]] = []


def save_plan_inputs(
    path: str | os.PathLike[str],
    *,
    metadata: Mapping[str, object] | None = None,
    context: Mapping[str, object] | None = None,
    **kwargs: object,
) -> Path:
    """Write the keyword arguments of one `launch_canary_plan_kernels` call as a dump.

    Pass the call's arguments unchanged (CUDA or CPU tensors, Python ints, None), e.g.
    `save_plan_inputs(path, **plan_kwargs)` right before or around the failing call. Only the
    inputs are stored: of `verify_plan_out` / `write_plan_out` just their capacities
    (`verify_capacity`, `write_req_capacity = len(write_plan_out.write_seed_slot_indices)`), since
    their contents are outputs. Without a LUT the dump plans the full group only; with one,
    `swa_window_size` is recorded and the format's default groups apply. `metadata` adds
    provenance keys (`rank`, `step`, `model`, `note`...); `captured_at` is filled in unless
    given. `context` adds what the server knew besides the call's arguments, by the format's
    names (`num_full_slots`, `num_swa_slots`, `page_size`, `free_full_slots`, `free_swa_slots`,
    `out_cache_loc`, ...): the diagnosis needs them (docs/dump-format.md). Returns the path
    written.

    Raises TypeError for an argument `launch_canary_plan_kernels` does not take, or when
    `req_pool_indices`, `prefix_lens` or `req_to_token` is missing; dump errors (a float
    tensor, say) propagate from `kvcanary_cli.dump.save_dump`.
    """
    from kvcanary_cli.dump.writer import write_dump  # deferred: keeps `import capture` light

    return write_dump(path, _dump_contents(kwargs, metadata, context))


def _check_arguments(kwargs: Mapping[str, object], context: Mapping[str, object] | None) -> None:
    """The TypeErrors of `save_plan_inputs`, raised before anything is converted."""
    unknown = sorted(set(kwargs) - set(PLAN_ARGUMENTS))
    if unknown:
        names = ", ".join(repr(name) for name in unknown)
        plural = "s" if len(unknown) > 1 else ""
        raise TypeError(f"save_plan_inputs() got unexpected keyword argument{plural} {names}")
    missing = [name for name in _REQUIRED if kwargs.get(name) is None]
    if missing:
        names = ", ".join(repr(name) for name in missing)
        raise TypeError(f"save_plan_inputs() missing required keyword argument(s): {names}")
    foreign = sorted(k for k in context or {} if k in PLAN_ARGUMENTS or not _in_format(k))
    if foreign:
        raise TypeError(
            f"save_plan_inputs() context holds names that are not format fields "
            f"outside the call: {', '.join(map(repr, foreign))}"
        )


def _dump_contents(
    kwargs: Mapping[str, object],
    metadata: Mapping[str, object] | None,
    context: Mapping[str, object] | None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The checked arrays and metadata of the dump of one call (see `save_plan_inputs`)."""
    from kvcanary_cli.dump.atomic import host_array
    from kvcanary_cli.dump.writer import dump_contents

    _check_arguments(kwargs, context)

    tensors: dict[str, Any] = {
        name: value for name, value in kwargs.items() if name not in LAUNCHER_OUTPUTS
    }
    tensors.update(context or {})
    for name, value in tensors.items():  # torch tensors (CUDA or CPU) to numpy, here
        try:
            array = host_array(value)
        except TypeError:  # a dtype numpy lacks: save_dump refuses it by name
            continue
        if array is not None:
            tensors[name] = array
    for name in _SCALAR_ARGUMENTS:
        if tensors.get(name) is not None:
            tensors[name] = _as_int(tensors[name])
    if tensors.get("verify_capacity") is None:
        tensors["verify_capacity"] = _capacity(kwargs.get("verify_plan_out"), "verify_slot_indices")
    tensors["write_req_capacity"] = _capacity(
        kwargs.get("write_plan_out"), "write_seed_slot_indices"
    )

    meta: dict[str, object] = {"captured_at": datetime.now(UTC).isoformat(timespec="seconds")}
    meta.update(metadata or {})
    if tensors.get("full_to_swa_index_mapping") is None:
        # Upstream plans the full group for this call; an SWA group needs the LUT anyway.
        meta.setdefault("groups", "full")
    return dump_contents(meta, tensors)


def install_sglang_hook(
    dump_dir: str | os.PathLike[str],
    *,
    module: ModuleType | None = None,
    rank: int | None = None,
) -> bool:
    """Wrap SGLang's plan launcher so that a call that raises leaves a dump in `dump_dir`.

    The dump is `kvcanary-rank{rank}-step{n:06d}.safetensors`, n counting launcher calls in this
    process (SGLang plans once per KV group per forward step; `-pid{pid}`, then `-pid{pid}-2`...
    added when the name is taken: an existing dump is never replaced), with the exception text
    in the metadata key `note`. The original exception is then re-raised as the same object with its
    traceback; a failure to write the dump is logged (logger `kvcanary.capture`) and never
    replaces it. Successful calls only pay one counter increment.

    `module` is the module holding `launch_canary_plan_kernels` (default: import
    `sglang.kernels.ops.kv_canary.plan.api`). `rank` defaults, at dump time, to `$RANK`, else
    the torch.distributed rank when initialised, else `$LOCAL_RANK`, else 0. Installing again
    replaces the wrapper (the new `dump_dir` and `rank` apply) instead of stacking a second one;
    other modules already holding the launcher under that name are rebound too. Returns False,
    without raising, when SGLang cannot be imported or lacks the launcher.
    """
    if module is None:
        try:
            module = importlib.import_module(SGLANG_PLAN_MODULE)
        except ImportError:
            logger.debug("kvcanary: %s is not importable; hook not installed", SGLANG_PLAN_MODULE)
            return False
        except Exception as exc:  # importing SGLang must never break the host program
            logger.warning(
                "kvcanary: importing %s failed (%s: %s); hook not installed",
                SGLANG_PLAN_MODULE,
                type(exc).__name__,
                exc,
            )
            return False
    current = getattr(module, SGLANG_PLAN_FUNCTION, None)
    if not callable(current):
        logger.warning(
            "kvcanary: %s has no callable %s; hook not installed",
            getattr(module, "__name__", module),
            SGLANG_PLAN_FUNCTION,
        )
        return False
    original: Callable[..., Any] = getattr(current, _ORIGINAL_ATTR, current)
    wrapper = _wrap(original, Path(os.path.expanduser(dump_dir)), rank)
    setattr(module, SGLANG_PLAN_FUNCTION, wrapper)
    _rebind(current, wrapper)
    return True


def install_from_env() -> bool:
    """Enable the hook when `KVCANARY_DUMP_DIR` is set; return whether it is installed or armed.

    If SGLang's plan module is already loaded it is wrapped now; otherwise an import hook wraps
    it right after SGLang loads it, so SGLang is never imported early by this call. `$RANK` etc.
    name the rank (see `install_sglang_hook`). Called by `import kvcanary_cli.capture` when the
    variable is set.
    """
    dump_dir = os.environ.get(DUMP_DIR_ENV, "").strip()
    if not dump_dir:
        return False
    canary = sys.modules.get(SGLANG_CANARY_MODULE)
    if canary is not None:
        watch_model_runners(canary)
    loaded = sys.modules.get(SGLANG_PLAN_MODULE)
    if loaded is not None and canary is not None:
        return install_sglang_hook(dump_dir, module=loaded)
    if not any(isinstance(finder, _InstallOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _InstallOnImport(dump_dir))
    if loaded is not None:
        return install_sglang_hook(dump_dir, module=loaded)
    return True


def register_model_runner(runner: object) -> None:
    """Remember (weakly) a model runner, so dumps record its pool sizes and free lists.

    The capture hook does this itself when SGLang sets up the canary (`install_canary`); call
    it yourself when the hook is installed after that.
    """
    _RUNNERS[:] = [ref for ref in _RUNNERS if ref() is not None and ref() is not runner]
    try:
        _RUNNERS.append(weakref.ref(runner))
    except TypeError:  # not weak-referenceable: not a model runner we can use
        logger.debug("kvcanary: cannot hold a weak reference to %r", type(runner).__name__)


def watch_model_runners(module: ModuleType) -> bool:
    """Wrap `module.install_canary` so that every model runner it sets up is registered."""
    current = getattr(module, SGLANG_INSTALL_FUNCTION, None)
    if not callable(current):
        return False
    original: Callable[..., Any] = getattr(current, _ORIGINAL_ATTR, current)

    @functools.wraps(original)
    def install_and_register(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("model_runner") is not None:
            register_model_runner(kwargs["model_runner"])
        return original(*args, **kwargs)

    setattr(install_and_register, _ORIGINAL_ATTR, original)
    setattr(module, SGLANG_INSTALL_FUNCTION, install_and_register)
    _rebind(current, install_and_register, SGLANG_INSTALL_FUNCTION)
    return True


def _wrap(original: Callable[..., Any], dump_dir: Path, rank: int | None) -> Callable[..., Any]:
    @functools.wraps(original)
    def launch_with_capture(*args: Any, **kwargs: Any) -> Any:
        step = next(_calls)
        try:
            return original(*args, **kwargs)
        except Exception as exc:
            _dump_failed_call(exc, kwargs, dump_dir=dump_dir, rank=rank, step=step)
            raise

    setattr(launch_with_capture, _ORIGINAL_ATTR, original)
    return launch_with_capture


def _dump_failed_call(
    exc: Exception, kwargs: Mapping[str, Any], *, dump_dir: Path, rank: int | None, step: int
) -> None:
    """Best effort: any failure here is logged, so the caller's exception stays the one seen."""
    limit = _env_int("KVCANARY_DUMP_LIMIT")
    limit = DEFAULT_DUMP_LIMIT if limit is None else limit
    if _written[0] >= limit:
        if limit > 0:
            logger.debug("kvcanary: dump limit %d reached; not capturing step %d", limit, step)
        return
    try:
        dump_dir.mkdir(parents=True, exist_ok=True)
        rank = _detect_rank() if rank is None else rank
        note = f"captured on {type(exc).__name__}: {exc}"
        if len(note) > _MAX_NOTE_CHARS:
            note = note[: _MAX_NOTE_CHARS - 3] + "..."
        unknown = sorted(set(kwargs) - set(PLAN_ARGUMENTS))
        if unknown:
            note += f" (arguments not saved: {', '.join(unknown)})"
        inputs = {name: value for name, value in kwargs.items() if name in PLAN_ARGUMENTS}
        context = server_context(kwargs.get("req_to_token"))
        contents = _dump_contents(inputs, {"rank": rank, "step": step, "note": note}, context)
        path = _write_new(dump_dir / f"kvcanary-rank{rank}-step{step:06d}.safetensors", contents)
        _written[0] += 1  # only dumps written count against the limit
    except Exception as dump_exc:
        logger.warning(
            "kvcanary: could not write a dump for the failed %s call (%s: %s)",
            SGLANG_PLAN_FUNCTION,
            type(dump_exc).__name__,
            dump_exc,
        )
        return
    logger.warning(
        "kvcanary: %s raised %s; inputs saved to %s (run `kvcanary check %s`)",
        SGLANG_PLAN_FUNCTION,
        type(exc).__name__,
        path,
        path,
    )


#: Names tried for one dump before giving up on it.
_MAX_NAMES = 1000


def _write_new(path: Path, contents: tuple[dict[str, Any], dict[str, str]]) -> Path:
    """Write the dump as a new file: `path`, else `-pid{pid}`, else `-pid{pid}-2`, ... .

    Each name is created exclusively: another process of the same rank and step (a restarted
    server, whose PID may be 1 again in its container) never replaces earlier evidence.
    """
    from kvcanary_cli.dump.writer import write_dump
    from kvcanary_cli.errors import PathExistsError

    suffixed = f"{path.stem}-pid{os.getpid()}"
    names = [path.name, f"{suffixed}{path.suffix}"]
    names += (f"{suffixed}-{n}{path.suffix}" for n in range(2, _MAX_NAMES))
    for name in names:
        try:
            return write_dump(path.with_name(name), contents, overwrite=False)
        except PathExistsError:
            continue
    raise FileExistsError(f"{path} and {_MAX_NAMES - 1} suffixed names exist")


def _detect_rank() -> int:
    """`$RANK`, else the initialised torch.distributed rank, else `$LOCAL_RANK`, else 0."""
    rank = _env_int("RANK")
    if rank is not None:
        return rank
    dist = sys.modules.get("torch.distributed")  # only if the host already imported it
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # a half-torn-down process group must not cost the dump
        pass
    local = _env_int("LOCAL_RANK")
    return 0 if local is None else local


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _as_int(value: object) -> object:
    """A Python int for int-like scalars (numpy ints, one-element integer arrays of any rank,
    as torch's one-element tensors were); else unchanged."""
    if isinstance(value, int):
        return int(value)
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        pass
    size, dtype = getattr(value, "size", None), getattr(value, "dtype", None)
    if size == 1 and getattr(dtype, "kind", None) in ("i", "u"):
        return int(value.reshape(-1)[0])  # type: ignore[attr-defined]
    return value


def _capacity(plan: object, field: str) -> int | None:
    """Length of a plan-output tensor field, or None when the plan does not have it."""
    tensor = getattr(plan, field, None)
    if tensor is None:
        return None
    try:
        return len(tensor)
    except TypeError:
        return None


def _rebind(old: object, new: Callable[..., Any], name: str = SGLANG_PLAN_FUNCTION) -> None:
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


def _in_format(name: str) -> bool:
    return name in TENSORS or name in SCALARS


def _runner_for(req_to_token: object) -> Any:
    """The registered model runner whose ReqToTokenPool holds `req_to_token` (or the only one)."""
    alive = [runner for runner in (ref() for ref in _RUNNERS) if runner is not None]
    for runner in alive:
        pool = getattr(runner, "req_to_token_pool", None)
        if getattr(pool, "req_to_token", None) is req_to_token:
            return runner
    return alive[0] if len(alive) == 1 else None


def server_context(req_to_token: object) -> dict[str, object]:
    """What the model runner behind a call knows that the call does not carry.

    Pool sizes (`num_full_slots`/`num_swa_slots` = size + page_size, the rows of the KV
    buffers), `page_size`, and the allocators' free lists expanded from pages to slots. Each
    fact is best effort: an attribute SGLang renamed costs that fact, never the dump.
    """
    runner = _runner_for(req_to_token)
    if runner is None:
        return {}
    allocator = getattr(runner, "token_to_kv_pool_allocator", None)
    facts: dict[str, object] = {}
    try:
        page = int(getattr(allocator, "page_size", None) or getattr(runner, "page_size", 1) or 1)
        facts["page_size"] = page
        full = getattr(allocator, "_size_full", None) or getattr(allocator, "size", None)
        if full is not None:
            facts["num_full_slots"] = int(full) + page
        swa = getattr(allocator, "_size_swa", None)
        if swa is not None:
            facts["num_swa_slots"] = int(swa) + page
        for name, sub in (
            ("free_full_slots", getattr(allocator, "full_attn_allocator", allocator)),
            ("free_swa_slots", getattr(allocator, "swa_attn_allocator", None)),
        ):
            free = _free_slots(sub, page)
            if free is not None:
                facts[name] = free
    except Exception as exc:  # a changed allocator must not cost the dump
        logger.debug("kvcanary: reading the allocator failed (%s: %s)", type(exc).__name__, exc)
    return facts


def _free_slots(allocator: object, page_size: int) -> Any:
    """The allocator's free pages (free and pending release) as sorted slot ids, on the CPU."""
    get_pages = getattr(allocator, "get_all_free_pages", None)
    if not callable(get_pages):
        return None
    pages = get_pages()
    if pages is None:
        return None
    import numpy as np

    from kvcanary_cli.dump.atomic import host_array

    array = host_array(pages)  # a torch tensor on the server's device, usually
    slots = np.asarray(pages if array is None else array).astype(np.int64).reshape(-1)
    if page_size > 1:
        offsets = np.arange(page_size, dtype=np.int64)
        slots = (slots[:, None] * page_size + offsets[None, :]).reshape(-1)
    return np.sort(slots)


class _InstallOnImport(importlib.abc.MetaPathFinder):
    """Import hook: wrap the launcher, and watch `install_canary`, as soon as SGLang loads them.

    It steps out of `sys.meta_path` once both modules are loaded.
    """

    def __init__(self, dump_dir: str) -> None:
        self.dump_dir = dump_dir
        self.pending = {SGLANG_PLAN_MODULE, SGLANG_CANARY_MODULE} - set(sys.modules)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _InstallingLoader(spec.loader, self)
        return spec

    def loaded(self, module: ModuleType) -> None:
        """Wrap what `module` holds, and leave once nothing is pending."""
        self.pending.discard(module.__name__)
        if not self.pending and self in sys.meta_path:
            sys.meta_path.remove(self)
        if module.__name__ == SGLANG_PLAN_MODULE:
            install_sglang_hook(self.dump_dir, module=module)
        else:
            watch_model_runners(module)


class _InstallingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then lets the finder wrap the module."""

    def __init__(self, loader: importlib.abc.Loader, finder: _InstallOnImport) -> None:
        self.loader = loader
        self.finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        try:
            self.finder.loaded(module)
        except Exception as exc:  # never fail SGLang's own import
            logger.warning(
                "kvcanary: installing the capture hook failed (%s: %s)", type(exc).__name__, exc
            )

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "finder"):  # not yet set (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


if os.environ.get(DUMP_DIR_ENV, "").strip():
    install_from_env()
