"""The leak trigger: a dump at SGLang's own memory checks, before they raise or warn.

SGLang's scheduler checks its pools with `SchedulerInvariantChecker` (0.5.23:
`srt/managers/scheduler_components/invariant_checker.py`): at idle `_check_all_pools` then
`_report_leak` (`pool memory leak detected! [full] total=..., available=..., evictable=...,
protected=..., session_held=..., uncached=...`), `_check_req_pool`, and when busy
`self_check_during_busy` (an `assert`: `Full Pool Mem Leak Detected! ...`,
`SWA Pool Mem Leak Detected! ...`) with `_check_kv_page_invariants` (`KV double free: sub-pool 1
has 7 duplicate pages.`, `KV page use-after-free: ...`). Every report but the assert goes
through the module's `raise_error_or_warn` (strict: `ValueError`; else a warning).

`watch_invariant_checker` wraps that function and the busy check: the report's message is
parsed for the counts SGLang printed (metadata `sglang.check.<pool>.<count>`), a batch-less
dump of the checker's own objects is written (the table, the LUT, both free lists, what the
tree holds and the running requests' allocated lengths, by `capture.tree`), and SGLang then
raises or warns exactly as before. The budget is the other triggers' (`store.BUDGET`), and
nothing here raises into SGLang.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

import kvcanary_cli.capture.builder as builder
import kvcanary_cli.capture.server as server
import kvcanary_cli.capture.store as store
import kvcanary_cli.capture.triggers as triggers
from kvcanary_cli.dump.schema import CHECK_COUNTS, CHECK_COUNTS_PREFIX

__all__ = [
    "SGLANG_CHECKER_MODULE",
    "capture_leak",
    "printed_counts",
    "watch_invariant_checker",
]

logger = logging.getLogger("kvcanary.capture")

#: SGLang 0.5.23's scheduler invariant checker.
SGLANG_CHECKER_MODULE = "sglang.srt.managers.scheduler_components.invariant_checker"
SGLANG_CHECKER_CLASS = "SchedulerInvariantChecker"
_REPORT = "raise_error_or_warn"
_BUSY = "self_check_during_busy"
#: One pool's counts as `_check_pool_invariant` prints them.
_COUNTS = re.compile(
    r"\[(full|swa|mamba)\] total=(\d{1,18}), available=(\d{1,18}), evictable=(\d{1,18}), "
    r"protected=(\d{1,18}), session_held=(\d{1,18}), uncached=(\d{1,18})"
)


def printed_counts(message: str) -> dict[str, int]:
    """The counts of every pool line in one of SGLang's memory-check messages, by their
    metadata names (`sglang.check.full.total`, ...); empty when it prints none."""
    counts: dict[str, int] = {}
    for match in _COUNTS.finditer(message[:20000]):
        pool = match.group(1)
        for name, value in zip(CHECK_COUNTS, match.groups()[1:], strict=True):
            counts[f"{CHECK_COUNTS_PREFIX}{pool}.{name}"] = int(value)
    return counts


def watch_invariant_checker(module: ModuleType) -> bool:
    """Wrap `module.raise_error_or_warn` (for the checker's reports) and
    `SchedulerInvariantChecker.self_check_during_busy` (its asserts) so that each leak report
    first leaves a dump; what SGLang does with the report is unchanged."""
    cls = getattr(module, SGLANG_CHECKER_CLASS, None)
    report = getattr(module, _REPORT, None)
    if not isinstance(cls, type) or not callable(report):
        return False
    original: Callable[..., Any] = getattr(report, server.ORIGINAL_ATTR, report)

    @functools.wraps(original)
    def report_with_capture(obj: Any, strict: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(obj, cls):
            message = args[1] if len(args) > 1 else kwargs.get("message", "")
            capture_leak(obj, str(message), raised=bool(strict))
        return original(obj, strict, *args, **kwargs)

    setattr(report_with_capture, server.ORIGINAL_ATTR, original)
    setattr(module, _REPORT, report_with_capture)
    busy = getattr(cls, _BUSY, None)
    if callable(busy):
        original_busy: Callable[..., Any] = getattr(busy, server.ORIGINAL_ATTR, busy)

        @functools.wraps(original_busy)
        def busy_with_capture(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return original_busy(self, *args, **kwargs)
            except AssertionError as exc:
                if "Leak Detected" in str(exc):
                    capture_leak(self, str(exc), raised=True)
                raise

        setattr(busy_with_capture, server.ORIGINAL_ATTR, original_busy)
        setattr(cls, _BUSY, busy_with_capture)
    return True


def capture_leak(checker: object, message: str, *, raised: bool) -> None:
    """Write the dump of one leak report (logged, never raised)."""
    current = triggers.settings()
    if current.dump_dir is None:
        return
    try:
        pool = getattr(checker, "req_to_token_pool", None)
        table = getattr(pool, "req_to_token", None)
        allocator = getattr(checker, "token_to_kv_pool_allocator", None)
        if table is None or allocator is None:
            return
        dump = builder.pending_dump(current.dump_dir, current.rank, server.last_step(), "leak")
        if dump is None or not dump.admit({"req_to_token": table}):
            return  # nothing was read
        import kvcanary_cli.capture.tree as tree_capture

        requests = _requests(checker)
        tree = getattr(checker, "tree_cache", None)
        tensors, facts = tree_capture.capture_state(
            req_to_token_pool=pool,
            allocator=allocator,
            tree=tree,
            requests=requests,
            window=_window(tree),
        )
        inputs = {k: v for k, v in tensors.items() if k in store.PLAN_ARGUMENTS}
        context: dict[str, object] = {
            k: v for k, v in tensors.items() if k not in store.PLAN_ARGUMENTS
        }
        if "swa_window_size" in facts:
            inputs["swa_window_size"] = int(facts.pop("swa_window_size"))
        for name in tree_capture.SCALAR_FACTS:
            if name in facts:
                context[name] = int(facts.pop(name))
        first = message.strip().splitlines()[0] if message.strip() else "a memory check"
        extra: dict[str, object] = {
            f"{CHECK_COUNTS_PREFIX}message": store.short_note(message),
            f"{CHECK_COUNTS_PREFIX}raised": "yes" if raised else "warned",
            **facts,
            **printed_counts(message),
        }
        path = dump.write(
            inputs, context, f"captured at SGLang's memory check: {first}", extra=extra
        )
    except Exception as exc:  # the report goes on as SGLang wrote it
        logger.warning("kvcanary: could not write the leak dump (%s: %s)", type(exc).__name__, exc)
        return
    if path is not None:
        logger.warning(
            "kvcanary: SGLang's memory check reported a leak; state saved to %s "
            "(run `kvcanary check %s`)",
            path,
            path,
        )


def _requests(checker: object) -> list[Any] | None:
    """The requests owning pool rows, as the checker counts them (best effort); None when
    the checker cannot say (then no row is recorded as held: an empty list would call every
    row leaked)."""
    owners = getattr(checker, "_requests_owning_rows", None)
    try:
        return list(owners()) if callable(owners) else _batch_requests(checker)
    except Exception as exc:
        logger.debug(
            "kvcanary: reading the running requests failed (%s: %s)", type(exc).__name__, exc
        )
        return None


#: The checker's getters of what holds rows while requests run (0.5.20 on): the last batch,
#: the running batch, and the chunked request parked between chunks, which is in neither.
_ROW_GETTERS = ("get_last_batch", "get_running_batch", "get_chunked_req")


def _batch_requests(checker: object) -> list[Any] | None:
    """The requests of the checker's last and running batches and its chunked request, each
    once (0.5.20 - 0.5.21, whose checker has the getters but not `_requests_owning_rows`,
    which reads the same three from 0.5.22 on); None without a getter for the chunked request
    (0.5.13 - 0.5.19: a chunk between chunks sits in neither batch, and its row would read as
    leaked)."""
    getters: list[Callable[[], Any]] = []
    for name in _ROW_GETTERS:
        get = getattr(checker, name, None)
        if not callable(get):
            return None
        getters.append(get)
    last, running, chunked = (get() for get in getters)
    found: dict[int, Any] = {}
    for batch in (last, running):
        for req in getattr(batch, "reqs", None) or []:
            found.setdefault(id(req), req)
    if chunked is not None:
        found.setdefault(id(chunked), chunked)
    return list(found.values())


def _window(tree: object) -> int | None:
    """The SWA window the tree keeps (`UnifiedRadixCache.sliding_window_size`), if it says."""
    for name in ("sliding_window_size", "_sliding_window_size"):
        try:
            value = getattr(tree, name, None)
        except Exception:  # a property that needs state the tree lacks
            value = None
        if isinstance(value, int) and value > 0:
            return value
    return None
