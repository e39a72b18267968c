"""A dump written when vLLM's own checks fire, and nothing else changed.

vLLM guards its block pool with a few local asserts (`get_new_blocks` wants `ref_cnt == 0`,
`popleft_n` wants its count) and the free queue's `RuntimeError`s; by the time one fires, the
bug that broke the pool happened steps earlier and the state that shows it is gone with the
engine. `watch_asserts(manager, folder)` wraps the manager's and its pool's entry points on
that instance only (its class, and every other manager, untouched): a call that raises one of
those exceptions out of vLLM's code first has the pool read (`capture.snapshot`) and written
as a new dump in `folder`, then the same exception object goes on, raised again from where it
was caught. When nothing raises, a call costs one extra Python frame and nothing is read
(`bench/vllm_hook.py`). The
hook never raises into the engine: a snapshot or a write that fails is logged and counted.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcanary_cli.dump.atomic import write_safetensors
from kvcanary_cli.engines.vllm.capture import snapshot
from kvcanary_cli.errors import PathExistsError

__all__ = ["FIRES_ON", "AssertHook", "raised_in", "watch_asserts"]

logger = logging.getLogger("kvcanary.capture")

#: What vLLM's block code raises when its own bookkeeping breaks: its asserts, the free
#: queue's "invalid block" and "no free blocks" complaints.
FIRES_ON: tuple[type[BaseException], ...] = (AssertionError, RuntimeError, ValueError)
#: The manager's entry points a scheduler calls, and the pool's it calls directly (deferred
#: frees, blocks released until reuse); the pool's other methods run inside these.
MANAGER_METHODS = (
    "get_computed_blocks",
    "allocate_slots",
    "free",
    "pop_blocks_for_free",
    "remove_skipped_blocks",
    "cache_blocks",
    "evict_blocks",
    "reset_prefix_cache",
)
POOL_METHODS = ("free_blocks", "unpin_blocks")
#: Dumps one hook writes at most (an engine that keeps going after an assert must not fill a
#: disk with them).
MAX_DUMPS = 8
_MAX_MESSAGE = 300


def raised_in(exc: BaseException) -> str | None:
    """The innermost frame of vLLM's code `exc` came out of (`vllm/...py:LINE in FUNC`);
    kvcanary's own frames (its `engines/vllm/` package) are not vLLM's."""
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        path = frame.filename.replace("\\", "/")
        if "/vllm/" in path and "/kvcanary_cli/" not in path:
            found = f"vllm/{path.rsplit('/vllm/', 1)[1]}:{frame.lineno} in {frame.name}"
    return found


@dataclass(eq=False)
class AssertHook:
    """The wrapped entry points of one manager, and what firing wrote."""

    manager: Any
    folder: Path
    requests: Mapping[str, Any] | None = None
    deferred_frees: Iterable[Any] = ()
    version: str | None = None
    #: more metadata for each dump, read when it fires (a step number, a model name).
    context: Callable[[], Mapping[str, str]] | None = None
    max_dumps: int = MAX_DUMPS
    #: log each dump and failure on `kvcanary.capture` (off: a caller that reports them itself)
    log: bool = True
    #: the dumps written, in order; the failures to write one, as text.
    written: list[Path] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _wrapped: list[tuple[Any, str]] = field(default_factory=list)
    _last: BaseException | None = None

    def install(self) -> AssertHook:
        """Wrap the entry points this instance has (once: a second install wraps nothing). A
        manager without a block pool (not vLLM's v1 manager as kvcanary knows it) is a
        logged note and nothing wrapped: the hook never raises into the engine."""
        pool = getattr(self.manager, "block_pool", None)
        if pool is None:
            note = f"{type(self.manager).__name__} has no block_pool to read"
            self.failures.append(note)
            logger.warning("kvcanary: not watching vLLM's asserts: %s", note)
            return self
        for owner, names in ((self.manager, MANAGER_METHODS), (pool, POOL_METHODS)):
            for name in names:
                original = getattr(owner, name, None)
                if callable(original) and name not in vars(owner):
                    setattr(owner, name, self._wrap(original, name))
                    self._wrapped.append((owner, name))
        return self

    def uninstall(self) -> None:
        """The instance's own methods back (its class's, as before `install`)."""
        for owner, name in reversed(self._wrapped):
            vars(owner).pop(name, None)
        self._wrapped.clear()

    def _wrap(self, original: Callable[..., Any], name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            except FIRES_ON as exc:
                if exc is not self._last:  # an outer entry point sees it again: one dump
                    self._last = exc
                    self._fired(exc, name)
                raise

        call.__wrapped__ = original  # type: ignore[attr-defined]
        call.__name__ = getattr(original, "__name__", name)
        return call

    def _fired(self, exc: BaseException, method: str) -> None:
        """Read and write the pool as it is now; any failure logged, never raised."""
        if len(self.written) >= self.max_dumps:
            return
        try:
            extra = {
                "kvcanary.trigger": "vllm-assert",
                "kvcanary.exception_type": type(exc).__name__,
                "kvcanary.exception_message": (str(exc).splitlines() or [""])[0][:_MAX_MESSAGE],
                "kvcanary.raised_in": raised_in(exc) or "",
                "kvcanary.entry_point": method,
                **(self.context() if self.context is not None else {}),
            }
            state = snapshot(
                self.manager,
                requests=self.requests,
                deferred_frees=self.deferred_frees,
                version=self.version,
                extra=extra,
            )
            tensors, meta = state.contents()
            self.folder.mkdir(parents=True, exist_ok=True)
            for n in range(len(self.written), len(self.written) + 1000):
                try:
                    path = write_safetensors(
                        self.folder / f"vllm-assert-{n}.safetensors", tensors, meta, overwrite=False
                    )
                except PathExistsError:
                    continue
                self.written.append(path)
                if self.log:
                    logger.warning(
                        "kvcanary: vLLM raised %s; its pool is in %s",
                        extra["kvcanary.exception_type"],
                        path,
                    )
                return
            raise FileExistsError(f"{self.folder}: no free vllm-assert-N name")
        except Exception as failure:  # noqa: BLE001 - the engine's exception matters, not ours
            self.failures.append(f"{type(failure).__name__}: {failure}"[:_MAX_MESSAGE])
            if self.log:
                logger.warning("kvcanary: no dump of vLLM's %s: %s", type(exc).__name__, failure)


def watch_asserts(
    manager: Any,
    folder: str | Path,
    *,
    requests: Mapping[str, Any] | None = None,
    deferred_frees: Iterable[Any] = (),
    version: str | None = None,
    context: Callable[[], Mapping[str, str]] | None = None,
    log: bool = True,
) -> AssertHook:
    """Install the hook on `manager` (a `KVCacheManager`): a dump of its pool in `folder`
    each time one of vLLM's checks raises out of it. `requests` and `deferred_frees` are the
    scheduler's live containers (read when it fires); `uninstall()` takes the hook off."""
    return AssertHook(
        manager,
        Path(folder),
        requests=requests,
        deferred_frees=deferred_frees,
        version=version,
        context=context,
        log=log,
    ).install()
