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
    required_tensors,
)

__all__ = [
    "DUMP_DIR_ENV",
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
_written = itertools.count()
#: Most dumps one process writes; `KVCANARY_DUMP_LIMIT` changes it.
DEFAULT_DUMP_LIMIT = 4


def save_plan_inputs(
    path: str | os.PathLike[str],
    *,
    metadata: Mapping[str, object] | None = None,
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
    given. Returns the path written.

    Raises TypeError for an argument `launch_canary_plan_kernels` does not take, or when
    `req_pool_indices`, `prefix_lens` or `req_to_token` is missing; dump errors (a float
    tensor, say) propagate from `kvcanary_cli.dump.save_dump`.
    """
    unknown = sorted(set(kwargs) - set(PLAN_ARGUMENTS))
    if unknown:
        names = ", ".join(repr(name) for name in unknown)
        plural = "s" if len(unknown) > 1 else ""
        raise TypeError(f"save_plan_inputs() got unexpected keyword argument{plural} {names}")
    missing = [name for name in _REQUIRED if kwargs.get(name) is None]
    if missing:
        names = ", ".join(repr(name) for name in missing)
        raise TypeError(f"save_plan_inputs() missing required keyword argument(s): {names}")

    from kvcanary_cli.dump.writer import save_dump  # deferred: keeps `import capture` light

    tensors: dict[str, Any] = {
        name: value for name, value in kwargs.items() if name not in LAUNCHER_OUTPUTS
    }
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
    return save_dump(path, metadata=meta, **tensors)


def install_sglang_hook(
    dump_dir: str | os.PathLike[str],
    *,
    module: ModuleType | None = None,
    rank: int | None = None,
) -> bool:
    """Wrap SGLang's plan launcher so that a call that raises leaves a dump in `dump_dir`.

    The dump is `kvcanary-rank{rank}-step{n:06d}.safetensors`, n counting launcher calls in this
    process (SGLang plans once per KV group per forward step), with the exception text in the
    metadata key `note`. The original exception is then re-raised as the same object with its
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
    wrapper = _wrap(original, Path(dump_dir), rank)
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
    loaded = sys.modules.get(SGLANG_PLAN_MODULE)
    if loaded is not None:
        return install_sglang_hook(dump_dir, module=loaded)
    if not any(isinstance(finder, _InstallOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _InstallOnImport(dump_dir))
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
    if next(_written) >= limit:
        if limit > 0:
            logger.debug("kvcanary: dump limit %d reached; not capturing step %d", limit, step)
        return
    try:
        rank = _detect_rank() if rank is None else rank
        note = f"captured on {type(exc).__name__}: {exc}"
        if len(note) > _MAX_NOTE_CHARS:
            note = note[: _MAX_NOTE_CHARS - 3] + "..."
        unknown = sorted(set(kwargs) - set(PLAN_ARGUMENTS))
        if unknown:
            note += f" (arguments not saved: {', '.join(unknown)})"
        inputs = {name: value for name, value in kwargs.items() if name in PLAN_ARGUMENTS}
        path = _free_path(dump_dir / f"kvcanary-rank{rank}-step{step:06d}.safetensors")
        save_plan_inputs(path, metadata={"rank": rank, "step": step, "note": note}, **inputs)
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


def _free_path(path: Path) -> Path:
    """`path`, or a pid-suffixed sibling when another process (same rank and step) wrote it."""
    if not path.exists():
        return path
    return path.with_name(f"{path.stem}-pid{os.getpid()}{path.suffix}")


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
    """A Python int for int-like scalars (numpy ints, one-element tensors); else unchanged."""
    if isinstance(value, int):
        return int(value)
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
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


def _rebind(old: object, new: Callable[..., Any]) -> None:
    """Point every loaded module's `launch_canary_plan_kernels` that is `old` at `new`."""
    for mod in list(sys.modules.values()):
        try:
            namespace = vars(mod)
        except TypeError:
            continue
        if namespace.get(SGLANG_PLAN_FUNCTION) is old:
            try:
                setattr(mod, SGLANG_PLAN_FUNCTION, new)
            except (AttributeError, TypeError):
                pass


class _InstallOnImport(importlib.abc.MetaPathFinder):
    """Import hook: wrap the launcher as soon as SGLang's plan module has been executed."""

    def __init__(self, dump_dir: str) -> None:
        self.dump_dir = dump_dir

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != SGLANG_PLAN_MODULE:
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


class _InstallingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then installs the hook and steps out of the way."""

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
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        try:
            install_sglang_hook(self.finder.dump_dir, module=module)
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
