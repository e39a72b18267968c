"""Where a soak's finding goes: `--out` checked before anything runs, and the finding's files
written by the same rules as every other kvcanary output (`dump.files`): never through a
link or over a non-regular file, no overwrite without `--force`, all of them or none.

A finding's dumps are recorded in a private scratch folder first (a temporary directory, gone
with the `with` that made it, however it ends), then copied into staged files beside their
targets, which get their names together: a Ctrl-C leaves neither one dump alone nor a hidden
folder in `--out`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from kvcanary_cli.dump.files import Target, check_targets, read_small_text, write_all_atomically
from kvcanary_cli.errors import PathError
from kvcanary_cli.results.soak import SOAK_FILES, SoakFile

__all__ = [
    "RECORDED_CHARACTERS",
    "REPLAY_LIMIT",
    "check_out",
    "read_reproducer_text",
    "restamp_step",
    "scratch",
    "write_outputs",
]

#: What `--replay` reads at most: a reproducer (or workload) soak writes is a few kilobytes,
#: one history's arrivals.
REPLAY_LIMIT = 16 << 20
#: A reproducer's recorded finding and release, in characters at most: a cause's code (or
#: `crash` and an exception's type) and a version, which a replay's report repeats.
RECORDED_CHARACTERS = 200


def read_reproducer_text(path: Path, *, hint: str) -> str:
    """The text of a file `--replay` names: a regular file within `REPLAY_LIMIT`, else one
    error line (`PathError`)."""
    return read_small_text(path, limit=REPLAY_LIMIT, what="a soak reproducer", hint=hint)


def check_out(out: Path, *, force: bool) -> None:
    """Refuse `--out` before a step runs: not a folder (nor to be one), not writable, or
    holding a file soak may not replace (a link, a non-regular file, or without `force` any
    file)."""
    if out.is_dir():
        check_targets([out / name for name in SOAK_FILES.values()], overwrite=force)
        _writable(out, out)
        return
    hint = "name a folder; it is created on a finding"
    if out.exists() or out.is_symlink():
        raise PathError(
            "is not a directory; soak writes its files into one", path=str(out), hint=hint
        )
    above = out.parent
    while not above.exists() and not above.is_symlink() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise PathError(f"cannot be created: {above} is not a directory", path=str(out), hint=hint)
    _writable(above, out)


def _writable(folder: Path, out: Path) -> None:
    """Refuse a folder where no file (or folder) can be created."""
    if not os.access(folder, os.W_OK | os.X_OK):
        where = "" if folder == out else f" in {folder}"
        raise PathError(f"cannot be written: permission denied{where}", path=str(out))


@contextmanager
def scratch() -> Iterator[Path]:
    """A private folder for the finding's dumps while they are recorded, removed on exit."""
    with tempfile.TemporaryDirectory(prefix="kvcanary-soak-") as folder:
        yield Path(folder)


def restamp_step(dump: Path, step: int) -> Path:
    """`dump` (a scratch dump of ours) with its metadata's `step` set to `step`; the tensors'
    bytes are kept as they are."""
    import json
    import struct

    raw = dump.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    header.setdefault("__metadata__", {})["step"] = str(step)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the tensors stay 8-byte aligned, as safetensors writes
    staged = dump.with_name(dump.name + ".step")
    staged.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + size :])
    staged.replace(dump)
    return dump


def write_outputs(
    out: Path, contents: Mapping[SoakFile, Path | bytes], *, force: bool
) -> dict[SoakFile, str]:
    """Write each of `contents` (by its `SOAK_FILES` name: a recorded file to copy, or bytes)
    into `out`, all or none; the paths written, by name. A folder made here for them is
    removed again when the files are not written."""
    made = _make_folder(out)
    targets: list[Target] = [
        (out / SOAK_FILES[name], _writer(content)) for name, content in contents.items()
    ]
    try:
        write_all_atomically(targets, overwrite=force)
    except BaseException:
        for folder in made:
            try:
                folder.rmdir()
            except OSError:
                break  # not empty (someone else's file) or gone: leave it
        raise
    return {name: str(out / SOAK_FILES[name]) for name in contents}


def _make_folder(out: Path) -> list[Path]:
    """Create `out` and its missing parents; the ones made, deepest first."""
    missing = [folder for folder in (out, *out.parents) if not folder.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PathError(f"cannot be created: {exc.strerror}", path=str(out)) from None
    return missing


def _writer(content: Path | bytes) -> Callable[[BinaryIO], object]:
    if isinstance(content, bytes):
        return lambda handle: handle.write(content)

    def copy(handle: BinaryIO) -> None:
        with content.open("rb") as source:
            shutil.copyfileobj(source, handle)

    return copy
