"""The standard streams, as kvcanary writes and reads them: closed, full, or unable to encode.

A report that cannot reach standard output (closed, a full disk, a reader gone) is the user's
setup, not a kvcanary bug: one error line, exit 2. An error line that cannot reach standard
error is lost, never the exit code. Standard library only.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from typing import IO

from kvcanary_cli.errors import PathError

__all__ = [
    "STANDARD_INPUT_NAME",
    "STANDARD_OUTPUT_NAME",
    "prepare_standard_streams",
    "standard_input_is_closed",
    "standard_output_on_standard_error",
    "standard_output_refusal",
    "write_standard_error",
    "writing_to_standard_output",
]

#: How error lines name the streams.
STANDARD_INPUT_NAME = "standard input"
STANDARD_OUTPUT_NAME = "standard output"


def prepare_standard_streams() -> None:
    """Once, when the command starts.

    A descriptor 0, 1 or 2 the shell closed (`2>&-`) gets /dev/null, so no file kvcanary opens
    later takes its number (and receives what a library writes to "standard error"); the
    Python stream stays None, so kvcanary still knows it was closed. Characters a stream's
    encoding lacks (`PYTHONIOENCODING=ascii` and a `·`) are written as their Python escapes
    (`\\xb7`), as kvcanary shows any character that does not print, instead of failing.
    """
    for fd, flags in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, flags)  # the lowest free number: fd, lower ones are open
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


def standard_input_is_closed() -> bool:
    """Whether there is no standard input to read (`<&-`)."""
    if sys.stdin is None or sys.stdin.closed:
        return True
    try:
        os.fstat(sys.stdin.fileno())
    except io.UnsupportedOperation:  # a stream without a descriptor (a test's): open
        return False
    except OSError:
        return True
    return False


def _discard(stream: IO[str]) -> None:
    """Point `stream`'s descriptor at /dev/null after a refused write: what is still buffered
    must not fail again when the interpreter flushes it at exit (which would turn the exit
    code into 120 and print a traceback-like warning)."""
    try:
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError):
        return
    os.dup2(null, fd)
    os.close(null)


@contextmanager
def writing_to_standard_output() -> Iterator[None]:
    """Write to standard output inside: a closed one, or one that refuses the writes (a full
    disk, a reader gone), raises `PathError` naming it."""
    stdout = sys.stdout
    if stdout is None:
        raise PathError("is closed", path=STANDARD_OUTPUT_NAME, hint="redirect it: > FILE")
    try:
        yield
        stdout.flush()
    except OSError as exc:
        _discard(stdout)
        reason = exc.strerror or type(exc).__name__
        raise PathError(f"cannot be written: {reason}", path=STANDARD_OUTPUT_NAME) from None


@contextmanager
def standard_output_on_standard_error() -> Iterator[None]:
    """Inside, what a library prints to standard output (`print`, or its descriptor written
    directly, as a native extension does) goes to standard error: a command whose data is on
    standard output (a JSON record) runs a library that talks there (SGLang, printing its
    radix tree on out-of-memory). Both are restored on the way out, however it ends."""
    for stream in (sys.stdout, sys.stderr):
        _flush(stream)
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no descriptor 1 or 2 to point: Python's own stream is moved still
        saved = None
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        _flush(sys.stderr)
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def _flush(stream: IO[str] | None) -> None:
    try:
        if stream is not None:
            stream.flush()
    except (OSError, ValueError):
        pass  # a refusing stream: what it says is lost, as write_standard_error loses it


def standard_output_refusal(exc: OSError) -> str | None:
    """Why standard output refused a write kvcanary did not make itself (click printing
    `--help` to a full disk or a gone reader): the error's innermost frame is click's `echo`.
    None for any other OSError, which stays a bug. A refusing stream is pointed at /dev/null,
    so the interpreter's exit does not fail on it too."""
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    code = None if frame is None else frame.tb_frame.f_code
    if code is None or code.co_name != "echo" or "click" not in code.co_filename:
        return None
    if sys.stdout is not None:
        _discard(sys.stdout)
    return f"cannot be written: {exc.strerror or type(exc).__name__}"


def write_standard_error(text: str) -> None:
    """Write `text` and a newline to standard error; a closed or refusing one loses it."""
    stderr = sys.stderr
    if stderr is None:
        return
    try:
        stderr.write(text + "\n")
        stderr.flush()
    except (OSError, ValueError):  # ValueError: a stream already closed
        _discard(stderr)
