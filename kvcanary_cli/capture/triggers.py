"""When the capture hook writes a dump, besides a plan call that raises.

- **Violations** (on whenever the hook is): SGLang's `ViolationReporter` pumps the canary's
  violation ring one step after the device wrote it, and logs (`log` mode) or raises (`raise`
  mode) the new rows. On a CUDA device nothing else ever raises (the kernels clamp), so this is
  the trigger that works where SGLang is served.
- **Guard** (`KVCANARY_GUARD=1`): per launch, before the kernels clamp, the LUT's length
  against `num_full_slots + 1` (host integers) and its trailing -1 (one read per LUT, then
  remembered); with `KVCANARY_GUARD_EVERY=N`, every N-th launch also reads the batch's window
  cells against the LUT (one device sync and O(bs x window) work).
- **Snapshots**: every `KVCANARY_DUMP_EVERY` launches, on the signal `KVCANARY_DUMP_SIGNAL`
  (e.g. `USR2`), or when the file `KVCANARY_DUMP_TRIGGER` appears (it is removed once taken).

Every dump goes through one per-process budget (`store.BUDGET`). A trigger that fails to
capture logs it and never changes what SGLang does. Importing this module costs only the
standard library.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import kvcanary_cli.capture.builder as builder
import kvcanary_cli.capture.server as server
import kvcanary_cli.capture.store as store
from kvcanary_cli.catalog import plural

__all__ = [
    "SGLANG_REPORTER_MODULE",
    "Guard",
    "Settings",
    "capture_state",
    "install_signal",
    "settings",
    "snapshot_due",
    "watch_violation_reporter",
]

logger = logging.getLogger("kvcanary.capture")

#: SGLang 0.5.23's violation reporter: `ViolationReporter.log_or_raise_violation` pumps the ring.
SGLANG_REPORTER_MODULE = "sglang.srt.kv_canary.runner.violation_reporter"
SGLANG_REPORTER_CLASS = "ViolationReporter"
SGLANG_REPORTER_METHOD = "log_or_raise_violation"


@dataclass
class Settings:
    """Where dumps go and which optional triggers are on (from the environment)."""

    dump_dir: Path | None = None
    rank: int | None = None
    guard: bool = False
    guard_every: int = 0
    dump_every: int = 0
    trigger_file: Path | None = None
    #: set by the signal handler, taken by the next launch.
    signal_pending: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def from_env(cls, dump_dir: Path, rank: int | None) -> Settings:
        """The settings `KVCANARY_GUARD*`, `KVCANARY_DUMP_EVERY` and `..._TRIGGER` ask for.

        A count that cannot be read (`1.0`, `-3`, `one`) turns its trigger off, and an
        unreadable budget closes every trigger (`store.Budget.closed`): each says so in one
        log line, and none falls back to a default."""
        trigger = os.environ.get("KVCANARY_DUMP_TRIGGER", "").strip()
        counts = {}
        for name in ("KVCANARY_GUARD_EVERY", "KVCANARY_DUMP_EVERY"):
            value, problem = store.read_count(name)
            if problem is not None:
                store.BUDGET.warn_once(problem, "kvcanary: %s: that trigger is off", problem)
            counts[name] = value or 0
        limits = store.BUDGET.limits()
        if isinstance(limits, str):
            store.BUDGET.warn_once(
                "unreadable", "kvcanary: capture is disarmed, no dump is written: %s", limits
            )
        return cls(
            dump_dir=dump_dir,
            rank=rank,
            guard=os.environ.get("KVCANARY_GUARD", "").strip() not in ("", "0"),
            guard_every=counts["KVCANARY_GUARD_EVERY"],
            dump_every=counts["KVCANARY_DUMP_EVERY"],
            trigger_file=Path(os.path.expanduser(trigger)) if trigger else None,
        )


#: The process's settings; `launcher.install_sglang_hook` sets them.
_SETTINGS = [Settings()]


def settings() -> Settings:
    """The process's current settings."""
    return _SETTINGS[0]


def configure(new: Settings) -> None:
    pending = _SETTINGS[0].signal_pending
    new.signal_pending = pending  # a handler already installed keeps working
    _SETTINGS[0] = new


#: Signals no snapshot may take over: those that stop the server (Ctrl-C, a supervisor's
#: SIGTERM), those no process can catch, and faults, whose handler, once it returns, re-runs
#: the faulting instruction forever.
_NOT_FOR_SNAPSHOTS = frozenset(
    {
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGKILL,
        signal.SIGSTOP,
        signal.SIGSEGV,
        signal.SIGBUS,
        signal.SIGFPE,
        signal.SIGILL,
        signal.SIGABRT,
    }
)


def install_signal(name: str) -> bool:
    """Take a snapshot at the next launch after signal `name` (`USR2`, `SIGUSR2` or a number).
    Anything else (no such signal, one that stops the server or cannot be caught, a thread
    other than the main one, which alone can install a handler) is one warning, and no
    snapshot is taken on a signal: never an exception into the server."""
    number, problem = _snapshot_signal(name)
    if number is not None:
        try:
            signal.signal(number, lambda *_: settings().signal_pending.set())
        except (ValueError, OSError, OverflowError) as exc:
            problem = str(exc)
    if problem is not None:
        logger.warning(
            "kvcanary: KVCANARY_DUMP_SIGNAL=%r: %s; that trigger is off",
            name.strip()[:40],
            problem,
        )
        return False
    return True


def _snapshot_signal(name: str) -> tuple[int, None] | tuple[None, str]:
    """(the signal's number, None), or (None, why no snapshot may be taken on it)."""
    text = name.strip().upper()
    if text.isascii() and text.isdigit():
        number = int(text) if len(text) <= 3 else None
        if number is None or number not in signal.valid_signals():
            return None, "no signal has that number here"
    else:
        known = signal.Signals.__members__.get("SIG" + text.removeprefix("SIG"))
        if known is None:
            return None, "no signal has that name (e.g. USR2, SIGUSR2 or its number)"
        number = int(known)
    if number in _NOT_FOR_SNAPSHOTS:
        return None, f"{signal.Signals(number).name} must keep its own meaning; use USR1 or USR2"
    return number, None


def snapshot_due(step: int) -> str | None:
    """Why launch `step` should leave a snapshot (None: it should not)."""
    current = settings()
    if current.dump_every and step % current.dump_every == 0:
        return f"every {current.dump_every} launches (KVCANARY_DUMP_EVERY)"
    if current.signal_pending.is_set():
        current.signal_pending.clear()
        return "signal (KVCANARY_DUMP_SIGNAL)"
    trigger = current.trigger_file
    if trigger is not None and trigger.exists():
        try:
            trigger.unlink()
        except FileNotFoundError:
            pass  # another rank took it first: this one saw it too, and keeps watching
        except OSError as exc:  # cannot consume it: stop looking, not snapshot forever
            current.trigger_file = None
            logger.warning(
                "kvcanary: cannot remove the trigger file %s (%s); it is no longer watched",
                trigger,
                exc,
            )
        return f"trigger file {trigger} (KVCANARY_DUMP_TRIGGER)"
    return None


class Guard:
    """Checks of a launch's LUT that cost O(1) host work and no device sync on the hot path.

    The trailing -1 is read once per LUT (its storage and length): a sliced LUT is a new
    length, so it is read at its first launch. Each check fails once per LUT storage: the
    seed's bug slices the same storage to a growing length every step, which must cost one
    dump and one device read, not one per step."""

    #: LUTs whose trailing entry is remembered (a serving process has one or two).
    _REMEMBERED = 256

    def __init__(self) -> None:
        self._sentinel_ok: dict[tuple[object, ...], bool] = {}
        self._reported: set[tuple[object, str]] = set()

    def failures(self, kwargs: Mapping[str, Any], step: int) -> list[str]:
        """What is wrong with launch `step`'s LUT that was not reported before."""
        lut = kwargs.get("full_to_swa_index_mapping")
        if lut is None or not hasattr(lut, "shape"):
            return []
        length = int(lut.shape[0])
        storage = (_storage(lut), str(getattr(lut, "device", "")))
        found: dict[str, str] = {}
        pool = server.pool_size(kwargs.get("req_to_token"))
        if pool is not None and length < pool + 1 and (storage, "length") not in self._reported:
            found["length"] = (
                f"full_to_swa_index_mapping has {length} entries, fewer than num_full_slots + 1 "
                f"= {pool + 1}: slots past its end will be clamped"
            )
        if (storage, "sentinel") not in self._reported:
            key = (*storage, length)
            if key not in self._sentinel_ok:
                if len(self._sentinel_ok) >= self._REMEMBERED:
                    self._sentinel_ok.clear()
                self._sentinel_ok[key] = length > 0 and int(lut[-1]) == -1
            if not self._sentinel_ok[key]:
                found["sentinel"] = (
                    "full_to_swa_index_mapping does not end in -1 (sliced, or its sentinel "
                    "overwritten): a clamped slot reads a real SWA slot"
                )
        every = settings().guard_every
        if every and step % every == 0 and (storage, "window") not in self._reported:
            window = _window_cells(kwargs, length)
            if window is not None:
                found["window"] = window
        self._reported.update((storage, check) for check in found)
        return list(found.values())


#: The process's guard (its memory of LUTs read and failures reported).
GUARD = Guard()


def _storage(tensor: Any) -> object:
    """Where a tensor's data lives (its pointer; numpy's `ctypes.data`), to know it again."""
    pointer = getattr(tensor, "data_ptr", None)
    if callable(pointer):
        return pointer()
    return getattr(getattr(tensor, "ctypes", None), "data", id(tensor))


def _window_cells(kwargs: Mapping[str, Any], lut_length: int) -> str | None:
    """The batch's verify-window cells whose slots the LUT cannot translate: `bs x window`
    cells gathered on the call's device and one sync (the fuller guard, off by default)."""
    try:
        import torch

        table = kwargs["req_to_token"]
        rows = kwargs["req_pool_indices"].to(torch.int64)
        prefix = kwargs["prefix_lens"].to(torch.int64).clamp(min=0)
        extend = kwargs.get("extend_seq_lens")
        ends = prefix + (0 if extend is None else extend.to(torch.int64).clamp(min=0))
        window = int(kwargs.get("swa_window_size") or 0)
        if window <= 0 or rows.numel() == 0:
            return None
        width = min(window, int(table.shape[1]))
        positions = ends[:, None] - width + torch.arange(width, device=ends.device)[None, :]
        inside = (positions >= 0) & (positions < ends[:, None]) & (rows[:, None] >= 0)
        inside &= rows[:, None] < table.shape[0]
        cells = table[
            rows.clamp(0, table.shape[0] - 1)[:, None], positions.clamp(0, table.shape[1] - 1)
        ]
        bad = inside & ((cells < 0) | (cells >= lut_length - 1))
        count = int(bad.sum())  # the one sync
    except Exception as exc:  # the guard never costs the launch
        logger.debug("kvcanary: the window guard failed (%s: %s)", type(exc).__name__, exc)
        return None
    if not count:
        return None
    return (
        f"{count} window cells hold slots the LUT of {lut_length} entries cannot translate "
        "(KVCANARY_GUARD_EVERY)"
    )


def capture_state(
    trigger: str,
    note: str,
    *,
    step: int,
    call: Mapping[str, Any] | None = None,
    device_state: object = None,
    extra: Mapping[str, object] | None = None,
) -> Path | None:
    """Write a dump of the serving state now: the plan call's arguments (`call`, else the last
    one), what the model runner knows, the canary buffers and the violation ring. Logged,
    never raised: a capture that fails leaves SGLang as it was."""
    current = settings()
    try:
        dump = builder.pending_dump(current.dump_dir, current.rank, step, trigger)
        if dump is None:
            return None
        inputs = dict(call if call is not None else server.last_call() or {})
        if not dump.admit(inputs):
            return None  # nothing was read off the device
        table = inputs.get("req_to_token")
        manager = server.manager_for(device_state=device_state, req_to_token=table)
        if table is None:
            bare = _table_only(manager)
            if bare is None:
                logger.warning("kvcanary: no plan call and no canary manager to dump (%s)", trigger)
                return None
            inputs, table = bare, bare["req_to_token"]
        context = server.server_context(table)
        context.update(server.canary_state(manager=manager, device_state=device_state))
        from kvcanary_cli.capture.tree import METADATA_FACTS

        for key in METADATA_FACTS:  # metadata strings, not tensors
            if key in context:
                extra = {**(extra or {}), key: str(context.pop(key))}
        for name in [n for n in context if n in store.PLAN_ARGUMENTS]:
            # unified memory's LUT is read from its page tables; the call's own LUT wins
            value = context.pop(name)
            if inputs.get(name) is None:
                inputs[name] = value
        path = dump.write(inputs, context, note, extra=extra)
    except Exception as exc:
        logger.warning(
            "kvcanary: could not write the %s dump (%s: %s)", trigger, type(exc).__name__, exc
        )
        return None
    if path is not None:
        logger.warning(
            "kvcanary: %s; state saved to %s (run `kvcanary check %s`)", note, path, path
        )
    return path


def _table_only(manager: object) -> dict[str, Any] | None:
    """A call of no request over the manager's table: the dump still holds the table, the
    canary buffers and the ring, which `kvcanary violations` explains."""
    table = getattr(getattr(manager, "_req_to_token_pool", None), "req_to_token", None)
    if table is None:
        return None
    import torch

    empty = torch.zeros(0, dtype=torch.int64, device=table.device)
    return {"req_to_token": table, "req_pool_indices": empty, "prefix_lens": empty}


def watch_violation_reporter(module: ModuleType) -> bool:
    """Wrap `ViolationReporter.log_or_raise_violation` so that a pump that finds new violation
    rows (either mode) leaves a dump; the pump itself runs unchanged."""
    cls = getattr(module, SGLANG_REPORTER_CLASS, None)
    current = getattr(cls, SGLANG_REPORTER_METHOD, None)
    if not callable(current):
        return False
    original: Callable[..., Any] = getattr(current, server.ORIGINAL_ATTR, current)

    @functools.wraps(original)
    def pump_with_capture(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = _logged(self)
        try:
            return original(self, *args, **kwargs)
        finally:
            after = _logged(self)
            if after > before:
                _capture_violations(self, before, after, kwargs.get("outer_step_counter"))

    setattr(pump_with_capture, server.ORIGINAL_ATTR, original)
    setattr(cls, SGLANG_REPORTER_METHOD, pump_with_capture)
    return True


def _logged(reporter: object) -> int:
    value = getattr(reporter, "_last_logged_write_index", 0)
    return value if isinstance(value, int) else 0


def _capture_violations(reporter: object, first: int, stop: int, pumped: object) -> None:
    """The dump of a pump that reported ring rows `first .. stop - 1`."""
    pumped_step = pumped if isinstance(pumped, int) else None
    rows = f"ring rows {first}..{stop - 1}" if stop - first > 1 else f"ring row {first}"
    note = f"captured on {plural(stop - first, 'new kv-canary violation')} ({rows})"
    extra: dict[str, object] = {}
    if pumped_step is not None:
        # SGLang stages the device check at one step and drains it at the next
        note += f", pumped at forward step {pumped_step}"
        extra["violations_pumped_step"] = pumped_step
        extra["violations_made_step"] = pumped_step - 1
    capture_state(
        "violations",
        note,
        step=server.last_step(),
        device_state=getattr(reporter, "_device_state", None),
        extra=extra,
    )
