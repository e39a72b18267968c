"""The capture hook around SGLang's plan launcher, and the import hook that installs it.

`install_sglang_hook` wraps `launch_canary_plan_kernels`: every call is remembered (for dumps
taken between calls), a call that raises leaves a dump before its exception continues
unchanged, and the optional guard and snapshots (`triggers`) run around the launch. The
import hook wraps the launcher, SGLang's `install_canary`, its violation reporter, its
invariant checker and its radix cache classes (`server.watch_tree_classes`: every tree built
registers itself, so dumps record what it holds) as soon as SGLang loads them, so bindings
made later (`kernel_launcher` imports the launcher from the `plan` package) get the wrapper;
SGLang itself is never imported early.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import kvcanary_cli.capture.builder as builder
import kvcanary_cli.capture.leaks as leaks
import kvcanary_cli.capture.server as server
import kvcanary_cli.capture.store as store
import kvcanary_cli.capture.triggers as triggers
from kvcanary_cli.dump.releases import PLAN_MODULES
from kvcanary_cli.dump.schema import LAUNCHER_FUNCTION, LAUNCHER_MODULE

__all__ = [
    "DUMP_DIR_ENV",
    "SGLANG_PLAN_FUNCTION",
    "SGLANG_PLAN_MODULE",
    "SGLANG_PLAN_MODULES",
    "install_from_env",
    "install_sglang_hook",
]

logger = logging.getLogger("kvcanary.capture")

#: Environment variable naming the directory dumps go to; setting it enables the hook.
DUMP_DIR_ENV = "KVCANARY_DUMP_DIR"
#: Module and function of SGLang's plan launcher (`kernels/ops/kv_canary/plan/api.py`).
SGLANG_PLAN_MODULE = LAUNCHER_MODULE
SGLANG_PLAN_FUNCTION = LAUNCHER_FUNCTION
#: The launcher's module in every release with kv canary: 0.5.17 on, then 0.5.13 .. 0.5.16
#: (`jit_kernel/kv_canary/plan/api.py`).
SGLANG_PLAN_MODULES = PLAN_MODULES


def install_sglang_hook(
    dump_dir: str | os.PathLike[str],
    *,
    module: ModuleType | None = None,
    rank: int | None = None,
) -> bool:
    """Wrap SGLang's plan launcher so that a call that raises leaves a dump in `dump_dir`.

    The dump is `kvcanary-rank{rank}-step{n:06d}.safetensors`, n counting launcher calls in this
    process (SGLang plans once per KV group per forward step; `-pid{pid}`, then `-pid{pid}-2`...
    added when the name is taken: an existing dump is never replaced), with the exception's
    type and message in the metadata keys `sglang.exception.type` and `.message` (and its text
    in `note`). The original exception is then re-raised as the same object
    with its traceback; a failure to write the dump is logged (logger `kvcanary.capture`) and
    never replaces it. The violation trigger, guard and snapshots (`triggers`, from the
    environment) write into the same directory.

    `module` is the module holding `launch_canary_plan_kernels` (default: import
    `sglang.kernels.ops.kv_canary.plan.api`, else 0.5.13 .. 0.5.16's
    `sglang.jit_kernel.kv_canary.plan.api`). `rank` defaults, at dump time, to `$RANK`, else
    the torch.distributed rank when initialised, else `$LOCAL_RANK`, else 0. Installing again
    replaces the wrapper (the new `dump_dir` and `rank` apply) instead of stacking a second one;
    other modules already holding the launcher under that name (the `plan` package,
    `kernel_launcher`) are rebound too. Returns False, without raising, when SGLang cannot be
    imported or lacks the launcher.
    """
    if module is None:
        module = _import_plan_module()
        if module is None:
            return False
    current = getattr(module, SGLANG_PLAN_FUNCTION, None)
    if not callable(current):
        logger.warning(
            "kvcanary: %s has no callable %s; hook not installed",
            getattr(module, "__name__", module),
            SGLANG_PLAN_FUNCTION,
        )
        return False
    directory = Path(os.path.expanduser(dump_dir))
    triggers.configure(triggers.Settings.from_env(directory, rank))
    original: Callable[..., Any] = getattr(current, server.ORIGINAL_ATTR, current)
    wrapper = _wrap(original)
    setattr(module, SGLANG_PLAN_FUNCTION, wrapper)
    server.rebind(current, wrapper, SGLANG_PLAN_FUNCTION)
    reporter = sys.modules.get(triggers.SGLANG_REPORTER_MODULE)
    if reporter is not None:
        triggers.watch_violation_reporter(reporter)
    checker = sys.modules.get(leaks.SGLANG_CHECKER_MODULE)
    if checker is not None:
        leaks.watch_invariant_checker(checker)
    for name in server.SGLANG_TREE_CLASSES:  # trees built from now on register themselves
        cache = sys.modules.get(name)
        if cache is not None:
            server.watch_tree_classes(cache)
    return True


def _import_plan_module() -> ModuleType | None:
    """The launcher's module of the installed SGLang, whichever release layout it has."""
    for name in SGLANG_PLAN_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            logger.debug("kvcanary: %s is not importable", name)
        except Exception as exc:  # importing SGLang must never break the host program
            logger.warning(
                "kvcanary: importing %s failed (%s: %s); hook not installed",
                name,
                type(exc).__name__,
                exc,
            )
            return None
    return None


def install_from_env() -> bool:
    """Enable the hook when `KVCANARY_DUMP_DIR` is set; return whether it is installed or armed.

    Modules of SGLang already loaded are wrapped now; the others right after SGLang loads
    them, so SGLang is never imported early by this call. `$RANK` etc. name the rank (see
    `install_sglang_hook`); `KVCANARY_DUMP_SIGNAL` installs the snapshot signal handler.
    Called by `import kvcanary_cli.capture` when the variable is set.
    """
    dump_dir = os.environ.get(DUMP_DIR_ENV, "").strip()
    if not dump_dir:
        return False
    triggers.configure(triggers.Settings.from_env(Path(os.path.expanduser(dump_dir)), None))
    name = os.environ.get("KVCANARY_DUMP_SIGNAL", "").strip()
    if name:
        triggers.install_signal(name)
    watched = (
        server.SGLANG_CANARY_MODULE,
        triggers.SGLANG_REPORTER_MODULE,
        leaks.SGLANG_CHECKER_MODULE,
        *server.SGLANG_TREE_CLASSES,
    )
    for loaded in (sys.modules.get(module) for module in watched):
        if loaded is not None:
            _watch(loaded, dump_dir)
    plan = next((sys.modules[m] for m in SGLANG_PLAN_MODULES if m in sys.modules), None)
    if plan is None or any(module not in sys.modules for module in watched):
        if not any(isinstance(finder, _InstallOnImport) for finder in sys.meta_path):
            sys.meta_path.insert(0, _InstallOnImport(dump_dir))
    if plan is not None:
        return install_sglang_hook(dump_dir, module=plan)
    return True


def _watch(module: ModuleType, dump_dir: str) -> None:
    """Wrap what a freshly loaded SGLang module holds."""
    if module.__name__ in SGLANG_PLAN_MODULES:
        install_sglang_hook(dump_dir, module=module)
    elif module.__name__ == server.SGLANG_CANARY_MODULE:
        server.watch_model_runners(module)
    elif module.__name__ == triggers.SGLANG_REPORTER_MODULE:
        triggers.watch_violation_reporter(module)
    elif module.__name__ == leaks.SGLANG_CHECKER_MODULE:
        leaks.watch_invariant_checker(module)
    elif module.__name__ in server.SGLANG_TREE_CLASSES:
        server.watch_tree_classes(module)


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def launch_with_capture(*args: Any, **kwargs: Any) -> Any:
        step = server.next_step()
        guarded = _before_launch(kwargs, step)
        try:
            result = original(*args, **kwargs)
        except Exception as exc:
            if not guarded:  # the guard's dump already holds this call's inputs
                _dump_failed_call(exc, kwargs, step=step)
            raise
        _after_launch(kwargs, step)
        return result

    setattr(launch_with_capture, server.ORIGINAL_ATTR, original)
    return launch_with_capture


def _before_launch(kwargs: Mapping[str, Any], step: int) -> bool:
    """Remember the call and run the guard (when on); True when the guard wrote a dump."""
    try:
        server.remember_call(kwargs)
        if not triggers.settings().guard or store.BUDGET.closed() is not None:
            return False  # a guard that could not write its dump reads nothing
        failed = triggers.GUARD.failures(kwargs, step)
        if not failed:
            return False
        note = "guard before the launch: " + "; ".join(failed)
        return triggers.capture_state("guard", note, step=step, call=kwargs) is not None
    except Exception as exc:  # the hook never changes what the launch does
        logger.debug("kvcanary: the guard failed (%s: %s)", type(exc).__name__, exc)
        return False


def _after_launch(kwargs: Mapping[str, Any], step: int) -> None:
    try:
        why = triggers.snapshot_due(step)
        if why is not None:
            triggers.capture_state("snapshot", f"snapshot: {why}", step=step, call=kwargs)
    except Exception as exc:
        logger.debug("kvcanary: the snapshot failed (%s: %s)", type(exc).__name__, exc)


def _dump_failed_call(exc: Exception, kwargs: Mapping[str, Any], *, step: int) -> None:
    """Best effort: any failure here is logged, so the caller's exception stays the one seen."""
    current = triggers.settings()
    try:
        dump = builder.pending_dump(current.dump_dir, current.rank, step, builder.RAISE)
        if dump is None:
            return
        inputs = {name: value for name, value in kwargs.items() if name in store.PLAN_ARGUMENTS}
        if not dump.admit(inputs):
            return  # the exception continues; nothing was read off the device
        path = dump.write(
            inputs,
            server.server_context(kwargs.get("req_to_token")),
            f"captured on {type(exc).__name__}: {exc}",
            unsaved=sorted(set(kwargs) - set(store.PLAN_ARGUMENTS)),
            extra=builder.exception_metadata(exc),
        )
    except Exception as dump_exc:
        logger.warning(
            "kvcanary: could not write a dump for the failed %s call (%s: %s)",
            SGLANG_PLAN_FUNCTION,
            type(dump_exc).__name__,
            dump_exc,
        )
        return
    if path is None:
        return
    logger.warning(
        "kvcanary: %s raised %s; inputs saved to %s (run `kvcanary check %s`)",
        SGLANG_PLAN_FUNCTION,
        type(exc).__name__,
        path,
        path,
    )


class _InstallOnImport(importlib.abc.MetaPathFinder):
    """Import hook: wrap the launcher (in either release layout), `install_canary`, the
    violation reporter, the scheduler's invariant checker and the radix cache classes (so each
    tree registers itself) as soon as SGLang loads them. It steps out of `sys.meta_path` once
    all are loaded (one launcher module is enough: a release has only one); a module the
    release lacks keeps it there, at the cost of one set lookup per first import of a module."""

    def __init__(self, dump_dir: str) -> None:
        self.dump_dir = dump_dir
        watched = {*SGLANG_PLAN_MODULES, server.SGLANG_CANARY_MODULE, *server.SGLANG_TREE_CLASSES}
        watched.update((triggers.SGLANG_REPORTER_MODULE, leaks.SGLANG_CHECKER_MODULE))
        self.pending = watched - set(sys.modules)
        if any(name in sys.modules for name in SGLANG_PLAN_MODULES):
            self.pending -= set(SGLANG_PLAN_MODULES)

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
        if module.__name__ in SGLANG_PLAN_MODULES:
            self.pending -= set(SGLANG_PLAN_MODULES)
        if not self.pending and self in sys.meta_path:
            sys.meta_path.remove(self)
        _watch(module, self.dump_dir)


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
