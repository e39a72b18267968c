"""Error types: every user mistake becomes one `KvcanaryError` line and exit code 2.

Three kinds of mistake, three types, each naming what is at fault so that `str(err)` is the
whole line the CLI prints (escaped by `safe_text.printable`: a file name, a tensor name or a
parser's message from a hostile dump cannot reach the terminal as control characters):

- `DumpError`: the file cannot be read as a dump; names the file and the tensor or key;
- `OptionError`: an option (or option combination) is unusable; names it by its keyword in
  the API (`page_size`, `slot/row`), which the command line replaces with its flag;
- `PathError`: a path kvcanary was asked to read or write is unusable; names the path.

And one that is no error: `Terminated`, the SIGTERM a run turns into an unwinding while
inside `sigterm_unwinds` (the CLI runs every command there).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from kvcanary_cli.safe_text import printable

__all__ = [
    "CorruptDumpError",
    "DumpError",
    "EngineUnavailableError",
    "FileChangedError",
    "KvcanaryError",
    "MetadataError",
    "MissingTensorError",
    "OptionError",
    "PathError",
    "PathExistsError",
    "PlanTooLargeError",
    "PlannerUnavailableError",
    "TORCH_HINT",
    "TensorDtypeError",
    "TensorShapeError",
    "Terminated",
    "UpstreamPlanError",
    "os_refusal",
    "sigterm_unwinds",
    "terminating",
]


class KvcanaryError(Exception):
    """A problem the user can fix: bad input, bad options, a missing backend."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def subject(self) -> str | None:
        """What the message is about (file, tensor, option...), printed before it."""
        return None

    def __str__(self) -> str:
        subject = self.subject()
        text = f"{subject}: {self.message}" if subject else self.message
        return printable(f"{text} ({self.hint})" if self.hint else text)


class DumpError(KvcanaryError):
    """The file cannot be used as a kvcanary dump.

    `field` is the tensor or metadata key at fault (None: the file as a whole); `path` is the
    dump, filled in by the loader when a lower layer raised without knowing it.
    """

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        path: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.field = field
        self.path = path

    def subject(self) -> str | None:
        """`path: field`, either part omitted when unknown."""
        parts = [part for part in (self.path, self.field) if part]
        return ": ".join(parts) or None


class CorruptDumpError(DumpError):
    """The file is not a readable safetensors file (truncated, hostile header, bad offsets)."""


class FileChangedError(CorruptDumpError):
    """The file is no longer the one its header was read from, unchanged (`load_dump` given a
    header read earlier): another file took its place, or it was rewritten since."""


class MissingTensorError(DumpError):
    """A tensor the format requires is absent."""


class TensorDtypeError(DumpError):
    """A tensor has a dtype the format does not accept (float, bool, ...)."""


class TensorShapeError(DumpError):
    """A tensor has the wrong rank or a length that disagrees with the batch size."""


class MetadataError(DumpError):
    """A scalar in `__metadata__` (or given twice) is not a usable integer."""


class PlanTooLargeError(DumpError):
    """The lengths ask for more verify entries than kvcanary will materialize in memory."""


class OptionError(KvcanaryError):
    """An option that is unknown, out of range, or contradicts another option or the dump."""

    def __init__(self, message: str, *, option: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.option = option

    def subject(self) -> str | None:
        """The option: the API's keyword, or (set by the command line) its flag."""
        return self.option


class PlannerUnavailableError(OptionError):
    """A planner backend was asked for but cannot run here (e.g. triton not installed)."""


class PathError(KvcanaryError):
    """A path that cannot be read or written as asked (missing, a directory, not regular...)."""

    def __init__(self, message: str, *, path: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.path = path

    def subject(self) -> str | None:
        """The path."""
        return self.path


def os_refusal(exc: OSError, what: str) -> str:
    """Why a file an `open` refused cannot be read, in the words every command uses for its
    inputs (a dump's reader says the same): `what` is what the file should have been."""
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, IsADirectoryError):
        return f"is a directory, not {what}"
    return f"cannot be read: {exc.strerror or type(exc).__name__}"


#: What installs torch for an engine's code run here (no engine extra does: the user's own build
#: stays). A plain torch from the package index is the CUDA build; the CPU build goes first.
TORCH_HINT = "pip install 'kvcanary[torch]'; without a GPU, torch's CPU build first"


class EngineUnavailableError(KvcanaryError):
    """An engine's code (an SGLang or vLLM tree or wheel) that cannot run here; one line,
    exit 2, naming the tree or wheel at fault when one was named."""

    def __init__(self, message: str, *, source: str | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.source = source

    def subject(self) -> str | None:
        """The tree or wheel at fault, when one was named."""
        return self.source


class PathExistsError(PathError):
    """The file to write exists and may not be replaced: a caller that must never replace
    one (the capture hook) picks another name on this error."""


class UpstreamPlanError(Exception):
    """Raised by the strict reference planner exactly where SGLang's torch reference raises.

    Not a `KvcanaryError`: the dump is readable, and the message is upstream's, verbatim,
    so it reads like the failure the user saw in their server log.
    """

    def __init__(self, message: str, *, exception_type: str = "ValueError") -> None:
        super().__init__(message)
        self.message = message
        self.exception_type = exception_type

    def __str__(self) -> str:
        return f"{self.exception_type}: {self.message}"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised by `sigterm_unwinds`' handler so that the run unwinds as for Ctrl-C: every
    `finally` runs (staged files removed, worker processes ended, the terminal restored).

    A `KeyboardInterrupt`, so that whatever stops cleanly on Ctrl-C stops the same way here,
    and no `except Exception` swallows it; only the exit code differs (143, not 130).
    """


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    """SIGTERM's handler: raise `Terminated` once; a second SIGTERM while the first unwinds is
    ignored, so that it cannot cut the clean-up short (SIGKILL still ends the process)."""
    if _TERMINATING.is_set():
        return
    _TERMINATING.set()
    raise Terminated


_TERMINATING = threading.Event()


def terminating() -> bool:
    """Whether SIGTERM started the unwinding (typer hands Ctrl-C and SIGTERM back alike)."""
    return _TERMINATING.is_set()


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While inside: SIGTERM unwinds the run as Ctrl-C does (see `Terminated`); the previous
    handler is back after. Only the main thread can install a handler, and a process started
    with SIGTERM ignored (`nohup`-like parents) keeps ignoring it."""
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or previous == signal.SIG_IGN:
        yield
        return
    _TERMINATING.clear()
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:  # None: a handler not installed from Python, which cannot be put back
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
