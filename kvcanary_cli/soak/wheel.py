"""A release wheel unpacked into kvcanary's cache, for soak to import SGLang from.

A wheel is untrusted input until its tree is checked, so:
- the cache is keyed by a hash of the wheel's bytes, never its file name: another wheel under
  the same name never runs the first one's code (a process hashes one file once: again only
  where its identity, size or times changed; a vLLM wheel is 240 - 440 MB);
- only the members the caller wants are unpacked (soak: the `sglang` package without the
  native extensions it never loads, and the version in the dist-info), stored or deflated,
  never encrypted;
- what they declare unpacked is bounded by the wheel's real size on disk (`INFLATE_BOUND`
  times; what soak takes of SGLang 0.5.23's wheel declares 2.05 times it), so a zip bomb is
  refused before a byte is written, and no member may inflate past what it declares;
- everything goes to a hidden staging folder in the cache, renamed into place only once the
  caller has checked the tree; the staging folder is removed on any failure and on Ctrl-C
  (and on SIGTERM, which the command line turns into the same unwinding: `errors.Terminated`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from kvcanary_cli.dump.files import sha256_of

__all__ = ["INFLATE_BOUND", "WheelRefusedError", "download_hint", "not_there", "unpack_wheel"]

#: The most the unpacked members may declare, in times the wheel's size on disk. Python source
#: deflates 4 to 5 times (SGLang 0.5.23's modules alone: 4.1); a deflate bomb reaches 1000.
INFLATE_BOUND = 16
#: Written last into a staged tree: a cached folder without it was never completed.
MARKER = ".kvcanary-unpacked"
_CHUNK = 1 << 16
#: What a damaged archive raises while it is read: a broken deflate stream (zlib.error), a
#: stream cut short (EOFError), a bad CRC or header (BadZipFile), the rest of zipfile's own.
_UNREADABLE = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    EOFError,
    NotImplementedError,
    RuntimeError,
    ValueError,
    OSError,
)


#: Digests this process computed, by the file's identity, size and times (`_identity`): a
#: process that builds a stack per history (the tests, bench) hashed a vLLM wheel's 336 MB
#: each time, 0.4 s of CPU. A rewrite changes the change time (file times tick by the
#: kernel's clock, a few ms: a rewrite at the same size within the tick of the hash would
#: run the tree of the bytes hashed, which were checked); a few wheels per process.
_DIGESTS: dict[tuple[int, ...], str] = {}
_DIGESTS_KEPT = 64


def _identity(info: os.stat_result) -> tuple[int, ...]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _digest(handle: BinaryIO, info: os.stat_result) -> str:
    """The sha256 of the open wheel, computed once per identity (`_DIGESTS`)."""
    key = _identity(info)
    if (known := _DIGESTS.get(key)) is not None:
        return known
    digest = sha256_of(handle)
    if len(_DIGESTS) >= _DIGESTS_KEPT:
        _DIGESTS.clear()
    _DIGESTS[key] = digest
    return digest


class WheelRefusedError(Exception):
    """The wheel cannot be unpacked safely; the message says why (the caller names the file)."""


def not_there(given: str) -> str:
    """Why a tree path the user gave is not there: a shell leaves a pattern that matched
    nothing as it was typed (`wheels/sglang-0.5.23-*.whl` before the wheel was fetched)."""
    if any(mark in given for mark in "*?["):
        return "no file matches this pattern"
    return "no such file or folder"


def download_hint(project: str, version: str, given: str | None = None) -> str:
    """How to fetch `project`'s release wheel from the package index (never installed): into
    the folder of the wheel path the user gave, else `wheels`."""
    folder = "wheels"
    if given is not None and given.endswith(".whl"):
        folder = os.path.dirname(given) or "."
    return f"pip download {project}=={version} --no-deps -d {folder} fetches its release wheel"


def unpack_wheel(
    wheel: Path, cache: Path, *, wanted: Callable[[str], bool], check: Callable[[Path], object]
) -> Path:
    """The folder in `cache` holding `wheel`'s `wanted` members, unpacked once per content.

    `check(folder)` sees the staged folder before it is kept and raises to refuse it: a refused
    or damaged wheel leaves nothing in `cache`. Raises WheelRefusedError (see the module)."""
    try:
        handle = wheel.open("rb")
    except OSError as exc:
        raise WheelRefusedError(f"cannot read it ({exc.strerror or exc})") from None
    with handle:
        try:
            info = os.fstat(handle.fileno())
            size, digest = info.st_size, _digest(handle, info)
            handle.seek(0)
        except OSError as exc:
            raise WheelRefusedError(f"cannot read it ({exc.strerror or exc})") from None
        target = cache / f"wheel-{digest[:32]}"
        if (target / MARKER).is_file():
            return target
        return _stage(handle, size, target, wanted, check)


def _stage(
    handle: BinaryIO,
    size: int,
    target: Path,
    wanted: Callable[[str], bool],
    check: Callable[[Path], object],
) -> Path:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=target.parent))
    except OSError as exc:
        raise WheelRefusedError(f"cannot write to the cache {target.parent} ({exc})") from None
    try:
        try:
            with zipfile.ZipFile(handle) as archive:
                members = _members(archive, size, wanted)
                for info in members:
                    _extract(archive, info, staging)
        except _UNREADABLE as exc:
            name = "zlib.error" if isinstance(exc, zlib.error) else type(exc).__name__
            raise WheelRefusedError(f"{name}: {exc}") from None
        check(staging)
        try:
            (staging / MARKER).write_text("ok\n")
            _keep(staging, target)
        except OSError as exc:
            raise WheelRefusedError(f"cannot write to the cache {target.parent} ({exc})") from None
        return target
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _keep(staging: Path, target: Path) -> None:
    """The staged tree renamed into place (one rename: never half there)."""
    try:
        staging.rename(target)
    except OSError:
        if not (target / MARKER).is_file():
            raise
        shutil.rmtree(staging)  # another kvcanary unpacked the same wheel meanwhile


def _members(
    archive: zipfile.ZipFile, size: int, wanted: Callable[[str], bool]
) -> list[zipfile.ZipInfo]:
    """The wanted members, each safe to write and to inflate, and their declared total within
    the bound the wheel's size sets."""
    members = [info for info in archive.infolist() if not info.is_dir() and wanted(info.filename)]
    for info in members:
        name = info.filename
        parts = name.split("/")
        if name.startswith("/") or "\\" in name or "\0" in name or {"", ".", ".."} & set(parts):
            raise WheelRefusedError(f"member {name!r} is not a plain relative path")
        if info.flag_bits & 0x1:
            raise WheelRefusedError(f"member {name} is encrypted")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise WheelRefusedError(
                f"member {name} uses compression method {info.compress_type} "
                "(a wheel's members are stored or deflated)"
            )
    declared = sum(info.file_size for info in members)
    if declared > INFLATE_BOUND * size:
        raise WheelRefusedError(
            f"its members declare {declared:,} bytes unpacked from {size:,} bytes, more than "
            f"{INFLATE_BOUND} times the wheel's size (a zip bomb?)"
        )
    return members


def _extract(archive: zipfile.ZipFile, info: zipfile.ZipInfo, staging: Path) -> None:
    """One member, never inflated past the size it declares."""
    path = staging.joinpath(*info.filename.split("/"))
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with archive.open(info) as source, path.open("xb") as sink:
        while chunk := source.read(_CHUNK):
            written += len(chunk)
            if written > info.file_size:
                break
            sink.write(chunk)
    if written != info.file_size:
        raise WheelRefusedError(
            f"member {info.filename} does not inflate to the {info.file_size:,} bytes it declares"
        )
