"""Writing capture dumps: a launcher call's inputs as format-1 contents, a fresh file name for
each dump, and the per-process budget that keeps a server's disk safe.

Every dump holds the whole `req_to_token` (2 GB in production), so one process writes at most
`KVCANARY_DUMP_LIMIT` dumps (default 4) and `KVCANARY_DUMP_MAX_BYTES` bytes (default 16 GiB),
whatever triggers them. A budget that is spent, or that cannot be read, closes capture before
anything is read off the device; a dump directory that cannot be written is retried with a
growing pause. Importing this module costs only the standard library.
"""

from __future__ import annotations

import logging
import operator
import os
import re
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvcanary_cli.dump.schema import (
    LAUNCHER_ARGUMENTS,
    LAUNCHER_OUTPUTS,
    SCALARS,
    required_tensors,
    spec_for,
)

__all__ = [
    "BUDGET",
    "DEFAULT_DUMP_LIMIT",
    "DEFAULT_MAX_BYTES",
    "PLAN_ARGUMENTS",
    "Budget",
    "admit",
    "capture_dump",
    "detect_rank",
    "dump_contents_of",
    "env_int",
    "estimated_bytes",
    "in_format",
    "read_bytes",
    "read_count",
    "save_plan_inputs",
    "short_note",
]

logger = logging.getLogger("kvcanary.capture")

#: The keyword arguments of `launch_canary_plan_kernels` (docs/semantics.md §1.1), in upstream
#: order; the dump format names its tensors and scalars after them.
PLAN_ARGUMENTS = LAUNCHER_ARGUMENTS
#: Without these the dump is unreadable.
_REQUIRED = required_tensors()
#: Launcher arguments stored as metadata scalars rather than tensors.
_SCALAR_ARGUMENTS = tuple(name for name in PLAN_ARGUMENTS if name in SCALARS)
_MAX_NOTE_CHARS = 2000
#: Most dumps one process writes; `KVCANARY_DUMP_LIMIT` changes it.
DEFAULT_DUMP_LIMIT = 4
#: Most bytes one process writes; `KVCANARY_DUMP_MAX_BYTES` changes it (K, M, G suffixes).
DEFAULT_MAX_BYTES = 16 << 30
#: Names tried for one dump before giving up on it.
_MAX_NAMES = 1000
#: Seconds a dump directory that could not be written is left alone, doubling per failure.
_FIRST_PAUSE = 1.0
_LONGEST_PAUSE = 300.0
#: The clock of those pauses (tests replace it).
_clock = time.monotonic


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

    return write_dump(path, dump_contents_of(kwargs, metadata, context))


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
    foreign = sorted(k for k in context or {} if k in PLAN_ARGUMENTS or not in_format(k))
    if foreign:
        raise TypeError(
            f"save_plan_inputs() context holds names that are not format fields "
            f"outside the call: {', '.join(map(repr, foreign))}"
        )


def dump_contents_of(
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


class Budget:
    """What this process has written, against `KVCANARY_DUMP_LIMIT` (dumps) and
    `KVCANARY_DUMP_MAX_BYTES` (bytes), read at each dump so a test or operator can change
    them. Only dumps written count: a write that fails leaves the budget as it was, and its
    directory is left alone for a pause that doubles with each failure in a row.

    Each reason to refuse is logged once per process (then at debug level): a server whose
    budget is spent pays one warning, not one per due trigger."""

    def __init__(self) -> None:
        self.dumps = 0
        self.bytes = 0
        self._warned: set[str] = set()
        #: directory -> (failures in a row, clock time before which it is not tried again)
        self._failed: dict[Path, tuple[int, float]] = {}

    def limits(self) -> tuple[int, int] | str:
        """(dump limit, byte cap) from the environment, or why they cannot be read."""
        limit, bad_limit = read_count("KVCANARY_DUMP_LIMIT")
        cap, bad_cap = read_bytes("KVCANARY_DUMP_MAX_BYTES")
        problems = [problem for problem in (bad_limit, bad_cap) if problem is not None]
        if problems:
            return "; ".join(problems)
        return (
            DEFAULT_DUMP_LIMIT if limit is None else limit,
            DEFAULT_MAX_BYTES if cap is None else cap,
        )

    def closed(self) -> tuple[str, str] | None:
        """(kind, why) no dump at all may be written now; None: one may. Host integers and
        the environment only: this runs before anything is read off the device."""
        limits = self.limits()
        if isinstance(limits, str):
            return "unreadable", f"capture is disarmed: {limits}"
        limit, cap = limits
        if self.dumps >= limit:
            return "limit", (
                f"the dump limit of {limit} is reached (KVCANARY_DUMP_LIMIT): "
                "this process writes no more dumps"
            )
        if self.bytes >= cap:
            return "bytes", (
                f"the {cap}-byte budget is spent ({self.bytes} written; "
                "KVCANARY_DUMP_MAX_BYTES): this process writes no more dumps"
            )
        return None

    def refusal(self, size: int) -> str | None:
        """Why a dump of about `size` bytes must not be written (None: it may)."""
        closed = self.closed()
        if closed is not None:
            return closed[1]
        limits = self.limits()
        assert not isinstance(limits, str)  # closed() would have said so
        cap = limits[1]
        if self.bytes + size > cap:
            return (
                f"{size} more bytes would pass the {cap}-byte budget "
                f"({self.bytes} written; KVCANARY_DUMP_MAX_BYTES)"
            )
        return None

    def spend(self, size: int) -> None:
        """Count a dump written (its size on disk)."""
        self.dumps += 1
        self.bytes += size

    def warn_once(self, kind: str, message: str, *args: object) -> None:
        """Log `message` as a warning the first time `kind` is refused, later at debug level."""
        if kind in self._warned:
            logger.debug(message, *args)
            return
        self._warned.add(kind)
        logger.warning(message, *args)

    def pausing(self, directory: Path) -> bool:
        """Whether `directory` failed lately and its pause is not over."""
        failed = self._failed.get(directory)
        return failed is not None and _clock() < failed[1]

    def write_failed(self, directory: Path) -> float:
        """Note a failed write into `directory`; return the seconds it is now left alone."""
        count = self._failed.get(directory, (0, 0.0))[0] + 1
        pause = min(_LONGEST_PAUSE, _FIRST_PAUSE * (1 << min(count - 1, 30)))
        self._failed[directory] = (count, _clock() + pause)
        return pause

    def write_succeeded(self, directory: Path) -> None:
        """A write into `directory` worked: its failures are forgotten."""
        self._failed.pop(directory, None)


#: The process's budget (replaced, not mutated, by tests that need a fresh process).
BUDGET = Budget()


def estimated_bytes(values: Mapping[str, object]) -> int:
    """The bytes the tensors among `values` hold, from their shapes alone (nothing is copied
    off the device to know it)."""
    total = 0
    for value in values.values():
        numel, element = getattr(value, "numel", None), getattr(value, "element_size", None)
        if callable(numel) and callable(element):  # a torch tensor
            total += int(numel()) * int(element())
        elif isinstance(getattr(value, "nbytes", None), int):  # a numpy array
            total += int(value.nbytes)  # type: ignore[attr-defined]
    return total


def admit(dump_dir: Path, stem: str, inputs: Mapping[str, object] | None = None) -> bool:
    """Whether a trigger may go on to gather and write dump `stem`: the budget is open and
    `dump_dir` is not pausing after a failed write (with `inputs`, also that their bytes fit).
    Reads host integers and the environment only, so a trigger refused here has read nothing
    off the device; the refusal is logged once per kind."""
    closed = BUDGET.closed()
    if closed is not None:
        BUDGET.warn_once(closed[0], "kvcanary: not writing %s: %s", stem, closed[1])
        return False
    if BUDGET.pausing(dump_dir):
        logger.debug("kvcanary: not writing %s: %s failed lately", stem, dump_dir)
        return False
    if inputs is not None:
        refused = BUDGET.refusal(estimated_bytes(inputs))
        if refused is not None:
            BUDGET.warn_once("bytes", "kvcanary: not writing %s: %s", stem, refused)
            return False
    return True


def capture_dump(
    dump_dir: Path,
    stem: str,
    inputs: Mapping[str, object],
    metadata: Mapping[str, object],
    context: Mapping[str, object],
) -> Path | None:
    """Write one dump as `dump_dir/{stem}.safetensors` (a fresh name when taken) within the
    budget; None, logged, when the budget refuses it. A write that fails (an `OSError`)
    starts a pause of `dump_dir` (`admit`) and propagates, as do other errors: each trigger
    logs them its own way and never lets them reach SGLang."""
    size = estimated_bytes({**inputs, **context})
    refused = BUDGET.refusal(size)
    if refused is not None:
        BUDGET.warn_once("bytes", "kvcanary: not writing %s: %s", stem, refused)
        return None
    from kvcanary_cli.dump.writer import write_dump  # deferred: keeps `import capture` light

    try:
        dump_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(dump_dir, os.W_OK | os.X_OK):  # before anything is copied
            raise PermissionError(f"{dump_dir} is not writable")
        contents = dump_contents_of(inputs, metadata, context)
        path = _write_new(dump_dir / f"{stem}.safetensors", contents, write_dump)
    except OSError:
        pause = BUDGET.write_failed(dump_dir)
        logger.warning(
            "kvcanary: writing into %s failed; it is left alone for %.0f s", dump_dir, pause
        )
        raise
    BUDGET.write_succeeded(dump_dir)
    BUDGET.spend(path.stat().st_size)
    return path


def _write_new(path: Path, contents: tuple[dict[str, Any], dict[str, str]], write: Any) -> Path:
    """Write the dump as a new file: `path`, else `-pid{pid}`, else `-pid{pid}-2`, ... .

    Each name is created exclusively: another process of the same rank and step (a restarted
    server, whose PID may be 1 again in its container) never replaces earlier evidence.
    """
    from kvcanary_cli.errors import PathExistsError

    suffixed = f"{path.stem}-pid{os.getpid()}"
    names = [path.name, f"{suffixed}{path.suffix}"]
    names += (f"{suffixed}-{n}{path.suffix}" for n in range(2, _MAX_NAMES))
    for name in names:
        try:
            written: Path = write(path.with_name(name), contents, overwrite=False)
            return written
        except PathExistsError:
            continue
    raise FileExistsError(f"{path} and {_MAX_NAMES - 1} suffixed names exist")


def short_note(text: str) -> str:
    """`text` cut to the note's size (an exception message can be megabytes)."""
    if len(text) > _MAX_NOTE_CHARS:
        return text[: _MAX_NOTE_CHARS - 3] + "..."
    return text


def detect_rank() -> int:
    """`$RANK`, else the initialised torch.distributed rank, else `$LOCAL_RANK`, else 0."""
    rank = env_int("RANK")
    if rank is not None:
        return rank
    dist = sys.modules.get("torch.distributed")  # only if the host already imported it
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # a half-torn-down process group must not cost the dump
        pass
    local = env_int("LOCAL_RANK")
    return 0 if local is None else local


def env_int(name: str) -> int | None:
    """An integer environment variable (None: unset or not an integer): the rank variables,
    which torch's launchers set."""
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


#: What a count (`KVCANARY_DUMP_LIMIT`, `..._EVERY`) may be: decimal digits (at most 18),
#: nothing else.
_COUNT = re.compile(r"[0-9]{1,18}")
#: What a byte count may be: digits, then optionally K, M, G or T, an `i` after it and a `B`
#: (any case): `4096`, `4096B`, `512M`, `2KiB`, `16GB`.
_BYTE_COUNT = re.compile(r"([0-9]{1,18})(?:([KMGT])I?)?B?")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def read_count(name: str) -> tuple[int | None, str | None]:
    """(the count, None) for a variable of digits, (None, None) when unset or blank, or
    (None, why) for anything else: `1.0`, `1e2`, `0x10`, `-1`, `one` are not counts."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None, None
    if _COUNT.fullmatch(text) is None:
        return None, f"{name}={text[:40]!r} is not a count (digits only, e.g. 4)"
    return int(text), None


def read_bytes(name: str) -> tuple[int | None, str | None]:
    """(the byte count, None) for `4096`, `512M`, `2KiB`, `16GB`...; (None, None) when unset
    or blank; (None, why) for anything else (`0.5K`, `1e2`, `0x10`, `-1`)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None, None
    match = _BYTE_COUNT.fullmatch(text.upper())
    if match is None:
        return None, (
            f"{name}={text[:40]!r} is not a byte count "
            "(digits with an optional K, M, G or T suffix, e.g. 512M or 16GiB)"
        )
    return int(match.group(1)) * _UNITS[match.group(2) or ""], None


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


def in_format(name: str) -> bool:
    """Whether the dump format defines `name` (a tensor or a scalar)."""
    return spec_for(name) is not None or name in SCALARS
