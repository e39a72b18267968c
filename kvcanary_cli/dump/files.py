"""Files the safe way: written atomically, never over an input or anything but a regular
file; small inputs (a soak's reproducer) read only from a regular file, within a bound.

Standard library only, so that the CLI can write reports without importing torch.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import BinaryIO

from kvcanary_cli.dump.streams import writing_to_standard_output
from kvcanary_cli.errors import PathError, PathExistsError, os_refusal

__all__ = [
    "STANDARD_INPUT",
    "Target",
    "check_targets",
    "read_small_text",
    "same_target",
    "sha256_of",
    "write_all_atomically",
    "write_atomically",
]


#: How a command names standard input among its inputs, as on its command line.
STANDARD_INPUT = "-"


def _file_id(source: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(device, inode) of an input; for `-`, of standard input's file when it is a regular one
    (`cmd - -o LOG < LOG` reads LOG as surely as `cmd LOG -o LOG`). None: nothing to protect."""
    try:
        if str(source) == STANDARD_INPUT:
            if sys.stdin is None:
                return None
            info = os.fstat(sys.stdin.fileno())
            if not stat.S_ISREG(info.st_mode):
                return None
        else:
            info = os.stat(source)
    except (OSError, ValueError):  # ValueError: a replaced stdin without a descriptor
        return None
    return info.st_dev, info.st_ino


def sha256_of(handle: BinaryIO) -> str:
    """The sha256 of a file's whole content (hex), read from its start in bounded chunks."""
    digest = hashlib.sha256()
    handle.seek(0)
    while chunk := handle.read(1 << 22):
        digest.update(chunk)
    return digest.hexdigest()


def read_small_text(path: str | os.PathLike[str], *, limit: int, what: str, hint: str) -> str:
    """The UTF-8 text of a file at most `limit` bytes long, which a command reads whole: `what`
    (a soak reproducer) is a few kilobytes. Anything else is a `PathError` naming the file,
    read no further: a device (`/dev/zero`) is endless, a FIFO blocks, a huge file fills
    memory."""
    shown = os.fspath(path)

    def refused(why: str) -> PathError:
        return PathError(why, path=shown, hint=hint)

    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise refused(f"is a directory, not {what}")
        if not stat.S_ISREG(mode):  # before `open`, which a FIFO blocks
            raise refused("is not a regular file")
        # non-blocking: a FIFO put in its place since would block the open, not be read
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(handle, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise refused("is not a regular file")
            if size > limit:
                raise refused(f"is {size / (1 << 20):.1f} MiB; {what} is at most {limit >> 20} MiB")
            data = file.read(limit + 1)
    except OSError as exc:
        raise refused(os_refusal(exc, what)) from None
    if len(data) > limit:  # grown since its size was read
        raise refused(f"is over {limit >> 20} MiB; {what} is at most that")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise refused("is not UTF-8 text") from None


def same_target(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths to write name one file, however spelled (`x.st`, `./x.st`,
    `/abs/x.st`, a directory reached through a link), or are one existing file."""
    if str(a) == str(b):
        return True
    if "-" in (str(a), str(b)):  # `-` to write to is standard output, no file
        return False
    a_id = _file_id(a)
    if a_id is not None and a_id == _file_id(b):
        return True
    return _entry(a) == _entry(b)


def _entry(path: str | os.PathLike[str]) -> Path:
    """The directory entry `path` names: its directory resolved, its own name as given."""
    named = Path(path)
    return Path(os.path.realpath(named.parent)) / named.name


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomically(
    path: str | os.PathLike[str],
    write: Callable[[BinaryIO], object],
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
    overwrite: bool = True,
) -> Path:
    """Write a file through `write(handle)`: all of it or nothing, and only where it is safe.

    `-` is standard output. Otherwise the target must be a regular file or not exist yet, in
    an existing directory: a directory, FIFO, device, socket or symbolic link is never
    replaced, nor one of `inputs` (the files the caller read, `-` for standard input: kvcanary
    never replaces the evidence it was given, however it was named), nor an existing file
    unless `overwrite`. The data goes to a temporary file beside it, renamed over the target
    when complete, so no reader sees half a file. Without `overwrite` the complete file takes
    the name only if the name is still free then (two runs writing one target: one writes it,
    the other is told it exists). The file gets the replaced file's mode, or the umask's for a
    new one.
    """
    if str(path) == "-":
        with writing_to_standard_output():
            write(sys.stdout.buffer)
            sys.stdout.buffer.flush()
        return Path("-")
    [written] = write_all_atomically([(path, write)], inputs=inputs, overwrite=overwrite)
    return written


#: One file to write: its path and what writes its bytes to a handle.
Target = tuple[str | os.PathLike[str], Callable[[BinaryIO], object]]


def write_all_atomically(
    targets: Sequence[Target],
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
    overwrite: bool = True,
) -> list[Path]:
    """Write several files by the rules of `write_atomically`, all of them or none.

    Every target is checked before any is written (one named twice, however spelled, is
    refused), each is written to a temporary file beside it, and only then are they given
    their names in turn; when one cannot be, those already published are taken back (a
    replaced file gets its old content again), so a refused run leaves nothing behind and
    its rerun is not told that its own half-output exists. No target may be `-`.
    """
    paths = [Path(path) for path, _ in targets]
    modes = check_targets(paths, inputs=inputs, overwrite=overwrite)
    staged: list[Path] = []
    try:
        for path, mode, (_, write) in zip(paths, modes, targets, strict=True):
            staged.append(_stage(path, mode, write))
        _publish_all(paths, staged, overwrite=overwrite)
    finally:
        for tmp in staged:
            tmp.unlink(missing_ok=True)
    return paths


def check_targets(
    paths: Sequence[str | os.PathLike[str]],
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
    overwrite: bool = True,
) -> list[int]:
    """Refuse, before anything is written, targets that `write_all_atomically` would refuse
    (one named twice, however spelled; an input; an existing file without `overwrite`...);
    the modes their files get. For a command whose outputs are written by two writers."""
    inputs = list(inputs)
    named = [Path(path) for path in paths]
    for i, path in enumerate(named):
        if not str(path) or str(path) == "-":
            raise PathError("is not a file to write; name one", path=repr(str(path)))
        for other in named[:i]:
            if same_target(other, path):
                raise PathError(
                    f"is the same file given twice (also as {other}); give each output its own"
                    " file",
                    path=str(path),
                )
    return [_checked_target(path, inputs=inputs, overwrite=overwrite) for path in named]


def _checked_target(path: Path, *, inputs: list[str | os.PathLike[str]], overwrite: bool) -> int:
    """Refuse `path` where it may not be written; the mode its file gets."""
    shown = str(path)
    try:
        info = path.lstat()
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise PathError(f"cannot be examined: {exc.strerror}", path=shown) from None
    if info is not None:
        if stat.S_ISLNK(info.st_mode):
            raise PathError(
                "is a symbolic link; refusing to replace it",
                path=shown,
                hint="write to the file it points to, or another path",
            )
        if stat.S_ISDIR(info.st_mode):
            raise PathError(
                "is a directory; refusing to replace it",
                path=shown,
                hint=f"name a file in it: {Path(shown, 'NAME')}",
            )
        if not stat.S_ISREG(info.st_mode):
            raise PathError("is not a regular file; refusing to replace it", path=shown)
        if (info.st_dev, info.st_ino) in {_file_id(source) for source in inputs}:
            raise PathError(
                "is an input of this command; refusing to overwrite it",
                path=shown,
                hint="write to another path",
            )
        if not overwrite:
            raise _exists(shown)
    if not path.parent.is_dir():
        raise PathError(
            "is in a directory that does not exist", path=shown, hint="create the directory first"
        )
    return stat.S_IMODE(info.st_mode) if info is not None else 0o666 & ~_umask()


def _stage(path: Path, mode: int, write: Callable[[BinaryIO], object]) -> Path:
    """`write` into a complete temporary file beside `path`, with `mode`."""
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise PathError(f"cannot be written: {exc.strerror}", path=str(path)) from None
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.chmod(tmp, mode)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise PathError(f"cannot be written: {exc.strerror}", path=str(path)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _publish_all(paths: list[Path], staged: list[Path], *, overwrite: bool) -> None:
    """Give each staged file its name; on a failure, take back the ones published."""
    published: list[tuple[Path, Path | None]] = []  # (path, the old file kept aside, if any)
    try:
        for path, tmp in zip(paths, staged, strict=True):
            kept = _keep_aside(path) if overwrite and len(paths) > 1 else None
            try:
                if overwrite:
                    os.replace(tmp, path)
                else:
                    _publish_new(tmp, path)
            except BaseException:
                if kept is not None:
                    kept.unlink(missing_ok=True)
                raise
            published.append((path, kept))
    except FileExistsError:
        _take_back(published)
        raise _exists(str(path)) from None
    except OSError as exc:
        _take_back(published)
        raise PathError(f"cannot be written: {exc.strerror}", path=str(path)) from None
    except BaseException:
        _take_back(published)
        raise
    for _, kept in published:
        if kept is not None:
            kept.unlink(missing_ok=True)


def _keep_aside(path: Path) -> Path | None:
    """A second name for the file at `path` (a hard link), so that it can be put back."""
    if not path.exists():
        return None
    aside = Path(tempfile.mktemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
    try:
        os.link(path, aside)
    except OSError:
        return None  # no hard links here: a rollback then removes the new file
    return aside


def _take_back(published: list[tuple[Path, Path | None]]) -> None:
    """Undo published files, newest first: the old file back where there was one."""
    for path, kept in reversed(published):
        try:
            if kept is not None:
                os.replace(kept, path)
            else:
                path.unlink(missing_ok=True)
        except OSError:
            pass  # best effort: the error being raised is the one to report


def _exists(shown: str) -> PathExistsError:
    return PathExistsError("exists", path=shown, hint="pass --force to overwrite it")


#: Why a hard link may fail on a file system that has no hard links (FAT, some FUSE mounts).
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS}


def _publish_new(tmp: Path, path: Path) -> None:
    """Give the complete `tmp` the name `path` only if no file has it: a hard link fails on
    an existing name (FileExistsError) where a rename would replace it."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        # No hard links here: claim the name with an empty file, then rename over it.
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        try:
            os.replace(tmp, path)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return
    tmp.unlink()
