"""Which engine a dump describes, and a dump read whole as named integer arrays.

A dump names its engine in `kvcanary.engine` (absent: SGLang, every dump before vLLM's). A
block-pool dump (vLLM's) is a handful of small arrays read whole: this reader checks the
header first (`read_header`, bounded), takes integer tensors only, and leaves what they mean
to the engine's package.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvcanary_cli.dump.header import FileState, HeaderEntry, read_header
from kvcanary_cli.dump.schema import INTEGER_DTYPES, dtype_label, engine_of
from kvcanary_cli.errors import CorruptDumpError, DumpError, TensorDtypeError

__all__ = ["StoredArrays", "read_arrays"]


@dataclass(frozen=True, kw_only=True)
class StoredArrays:
    """A dump's tensors (integer arrays, read into memory) and its metadata strings."""

    path: Path
    arrays: dict[str, np.ndarray]
    metadata: dict[str, str]
    #: the file as it was read (`shrink` checks it unchanged before hashing it).
    file_state: FileState | None = None
    #: the tensors left unread (none of the engine's), as the header describes them
    unread: dict[str, HeaderEntry] = field(default_factory=dict)

    @property
    def engine(self) -> str:
        """The engine the dump describes."""
        return engine_of(self.metadata)


def read_arrays(
    path: str | os.PathLike[str], keep: Callable[[str], bool] | None = None
) -> StoredArrays:
    """Every tensor of a dump `keep` names (default: every one) as a numpy array; a
    `DumpError` naming the file on bad input. The others are left unread (`unread`): a file's
    extras cost neither their size in memory nor a refusal of their dtype."""
    try:
        header = read_header(path)
        try:
            handle = header.path.open("rb")
        except OSError as exc:
            raise DumpError(f"cannot read: {exc.strerror}") from None
        arrays: dict[str, np.ndarray] = {}
        unread: dict[str, HeaderEntry] = {}
        with handle:
            state = FileState.of(os.fstat(handle.fileno()))
            if not state.same_file(header.state):
                raise CorruptDumpError("another file took its place while kvcanary read it")
            for name, entry in header.entries.items():
                if keep is not None and not keep(name):
                    unread[name] = entry
                    continue
                if entry.dtype not in INTEGER_DTYPES:
                    raise TensorDtypeError(
                        f"dtype {dtype_label(entry.dtype)} is not an integer dtype", field=name
                    )
                array = np.empty(entry.shape, dtype=np.dtype(INTEGER_DTYPES[entry.dtype]))
                handle.seek(entry.offset)
                if entry.nbytes and handle.readinto(array.reshape(-1).view(np.uint8).data) != (
                    entry.nbytes
                ):
                    raise CorruptDumpError("the file was truncated while kvcanary read it")
                arrays[name] = array
        return StoredArrays(
            path=header.path,
            arrays=arrays,
            metadata=dict(header.metadata),
            file_state=state,
            unread=unread,
        )
    except DumpError as exc:
        if exc.path is None:
            exc.path = str(path)
        raise
