"""Safetensors header parsing that trusts nothing: checked before any byte of data is touched.

A dump may be truncated, hand-edited or hostile. Every check here runs on the header alone
(a bounded read), so a bad file ends in one `CorruptDumpError` line, never in a crash or
an allocation the size of a lie. The header's own parse is bounded too: its length is capped,
and the JSON values in it are counted (a byte scan) before `json.loads` builds any of them.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from kvcanary_cli.dump.schema import (
    DTYPE_ITEMSIZE,
    ENGINE_KEY,
    POOL_ENGINES,
    SGLANG,
    engine_of,
    parse_integer,
)
from kvcanary_cli.errors import CorruptDumpError, DumpError
from kvcanary_cli.safe_text import excerpt

__all__ = [
    "FileState",
    "MAX_HEADER_BYTES",
    "MAX_HEADER_VALUES",
    "MAX_METADATA_KEYS",
    "MAX_RANK",
    "MAX_TENSORS",
    "HeaderEntry",
    "HeaderRead",
    "SafetensorsHeader",
    "dump_engine",
    "header_engine",
    "read_header",
    "read_header_and_step",
    "read_header_or_error",
    "refuse_other_engine",
    "unknown_engine",
]

#: A dump's header is a few KB (about 30 tensors, a few dozen metadata keys); safetensors
#: allows 100 MB. Longer headers are refused before they are read.
MAX_HEADER_BYTES = 16 * 1024 * 1024
#: Tensors one header may describe (a dump has about 30).
MAX_TENSORS = 4096
#: Keys `__metadata__` may hold (a dump has a few dozen).
MAX_METADATA_KEYS = 4096
#: numpy and torch stop at 64 dimensions; more is a hostile header (and a slow product).
MAX_RANK = 64
#: JSON values a header may hold, counted before parsing: room for `MAX_TENSORS` entries of
#: rank 2 (11 values each) and `MAX_METADATA_KEYS` keys (2 each). Bounds what `json.loads`
#: builds (about 20 MB at most, whatever the header's length).
MAX_HEADER_VALUES = 1 << 16
#: No tensor of a real dump comes near this; a larger byte count is an overflow or a lie.
_MAX_TENSOR_BYTES = 1 << 50
#: A JSON string (escapes included; unrolled, so linear), or one separator or opening bracket.
_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[,:\[{]')


@dataclass(frozen=True, kw_only=True)
class HeaderEntry:
    """One tensor as the header describes it; `offset` is absolute in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def numel(self) -> int:
        """Number of elements (1 for a 0-d tensor)."""
        return math.prod(self.shape)


@dataclass(frozen=True, kw_only=True)
class FileState:
    """Which file a path named, as it was when read: a file put in its place (an atomic
    replace) has another inode, one rewritten in place another size or modification time."""

    device: int
    inode: int
    size: int
    modified_ns: int

    @classmethod
    def of(cls, info: os.stat_result) -> FileState:
        """The state `os.stat`/`os.fstat` reported."""
        return cls(
            device=info.st_dev, inode=info.st_ino, size=info.st_size, modified_ns=info.st_mtime_ns
        )

    def same_file(self, other: FileState) -> bool:
        """One file (device and inode), whatever happened to its contents."""
        return (self.device, self.inode) == (other.device, other.inode)


@dataclass(frozen=True, kw_only=True)
class SafetensorsHeader:
    """The parsed header: tensor entries in file order and the `__metadata__` strings."""

    path: Path
    file_size: int
    #: the file the header was read from.
    state: FileState
    entries: dict[str, HeaderEntry]
    metadata: dict[str, str]


def _corrupt(path: Path, what: str, hint: str | None = None) -> CorruptDumpError:
    return CorruptDumpError(what, path=_show(str(path), 4096), hint=hint)


def _show(text: str, limit: int = 200) -> str:
    """`text` if it prints on one short line, else its repr cut to `limit` (hostile names)."""
    if text.isprintable() and len(text) <= limit:
        return text
    shown = repr(text)
    return shown if len(shown) <= limit else shown[:limit] + "..."


def _brief(value: object, limit: int = 120) -> str:
    """repr of a header value, cut short: a hostile header may hold megabytes in one field."""
    shown = repr(value)
    return shown if len(shown) <= limit else shown[:limit] + "..."


#: Bytes of a file that is not safetensors shown in its error line, when they are text.
_SNIFF_BYTES = 40


def _not_safetensors(head: bytes) -> str:
    """Why a file is not a dump, with its first words when it is text (a log, a README)."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:  # cut inside a character, or binary
        text = head[: len(head) - 3].decode("utf-8", errors="replace")
        if "\ufffd" in text:
            return "not a safetensors file (its first bytes are no safetensors header)"
    words = " ".join(text.split())
    if not words or not words.isprintable():
        return "not a safetensors file (its first bytes are no safetensors header)"
    return f"not a safetensors file: it starts with text ({words!r}...)"


def read_header(path: str | os.PathLike[str]) -> SafetensorsHeader:
    """Parse and bound-check a safetensors header; raise `DumpError` on anything odd."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise DumpError("no such file", path=_show(str(path), 4096)) from None
    except OSError as exc:
        raise DumpError(f"cannot read: {exc.strerror}", path=_show(str(path), 4096)) from None
    if stat.S_ISDIR(info.st_mode):
        raise DumpError(
            "is a directory, not a dump",
            path=_show(str(path), 4096),
            hint="pass one .safetensors file",
        ) from None
    if not stat.S_ISREG(info.st_mode):
        raise DumpError("is not a regular file", path=_show(str(path), 4096))
    size = info.st_size
    if size == 0:
        raise _corrupt(path, "file is empty")
    if size < 8:
        raise _corrupt(path, f"file is {size} bytes, too short to be safetensors")
    try:
        with path.open("rb") as handle:
            state = FileState.of(os.fstat(handle.fileno()))
            size = state.size  # the file opened, should another have taken the path since
            header_len = int.from_bytes(handle.read(8), "little")
            sane = 0 < header_len <= MAX_HEADER_BYTES and 8 + header_len <= size
            if not sane and handle.read(1) != b"{":
                # a safetensors header is a JSON object: a length that makes no sense with
                # no `{` after it is another kind of file, not a broken dump
                handle.seek(0)
                raise _corrupt(path, _not_safetensors(handle.read(_SNIFF_BYTES)))
            if header_len == 0 or header_len > MAX_HEADER_BYTES:
                raise _corrupt(
                    path,
                    f"not safetensors: header length {header_len} is absurd "
                    f"(expected 1..{MAX_HEADER_BYTES})",
                )
            if 8 + header_len > size:
                raise _corrupt(
                    path,
                    f"header length {header_len} runs past the end of the {size}-byte file",
                    hint="the file is truncated",
                )
            raw = handle.read(header_len)
    except PermissionError:
        raise DumpError("permission denied", path=_show(str(path), 4096)) from None
    except OSError as exc:
        raise DumpError(f"cannot read: {exc.strerror}", path=_show(str(path), 4096)) from None
    if len(raw) != header_len:  # the file was truncated since stat()
        raise _corrupt(
            path, "the file was truncated while kvcanary read it", hint="read a stable copy"
        )
    values = _count_values(raw)
    if values > MAX_HEADER_VALUES:
        raise _corrupt(
            path,
            f"the header holds more than {MAX_HEADER_VALUES} JSON values, far more than a "
            f"dump's (kvcanary reads at most {MAX_TENSORS} tensors and {MAX_METADATA_KEYS} "
            "metadata keys)",
        )
    try:
        parsed = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except _DuplicateKeyError as exc:
        raise _corrupt(
            path,
            f"the header names {_show(exc.key)} twice",
            hint="readers disagree on which one counts; the header is corrupt",
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise _corrupt(path, "not safetensors: the header is not JSON") from None
    except RecursionError:
        raise _corrupt(path, "not safetensors: the header JSON is nested absurdly deep") from None
    except ValueError:  # e.g. an integer of more than sys.get_int_max_str_digits() digits
        raise _corrupt(path, "not safetensors: the header holds an absurdly long number") from None
    if not isinstance(parsed, dict):
        raise _corrupt(path, "not safetensors: the header is not a JSON object")
    data_start = 8 + header_len
    metadata = _parse_metadata(path, parsed.pop("__metadata__", None))
    if len(parsed) > MAX_TENSORS:
        raise _corrupt(
            path, f"the header describes {len(parsed)} tensors; a dump has at most {MAX_TENSORS}"
        )
    entries: dict[str, HeaderEntry] = {}
    for name, entry in parsed.items():
        entries[name] = _parse_entry(name, entry, data_start, size)
    return SafetensorsHeader(
        path=path, file_size=size, state=state, entries=entries, metadata=metadata
    )


class _DuplicateKeyError(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """`json.loads` hook: an object, unless a key repeats (JSON keeps the last one silently;
    safetensors' own parser may keep another, so the two would read different tensors)."""
    parsed = dict(pairs)
    if len(parsed) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return parsed


def _count_values(raw: bytes) -> int:
    """An upper bound on the JSON values in `raw` without parsing it (each value but the first
    needs a separator or an opening bracket), counted up to `MAX_HEADER_VALUES + 1` at most."""
    rough = sum(raw.count(c) for c in (b",", b":", b"[", b"{")) + 1
    if rough <= MAX_HEADER_VALUES:  # strings included: an overestimate, and enough
        return rough
    count = 1  # again, outside strings only; one match at a time, and not past the limit
    for match in _JSON_TOKEN.finditer(raw):
        if match.end() - match.start() == 1:  # a separator or bracket, not a string
            count += 1
            if count > MAX_HEADER_VALUES:
                break
    return count


def _parse_metadata(path: Path, raw: object) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise _corrupt(path, "__metadata__ must map strings to strings")
    if len(raw) > MAX_METADATA_KEYS:
        raise _corrupt(
            path,
            f"__metadata__ holds {len(raw)} keys; a dump has at most {MAX_METADATA_KEYS}",
        )
    return dict(raw)


def _parse_entry(name: str, entry: object, data_start: int, file_size: int) -> HeaderEntry:
    name_shown = _show(name)
    data_size = file_size - data_start
    if not isinstance(entry, dict):
        raise CorruptDumpError("header entry is not an object", field=name_shown)
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_ITEMSIZE:
        raise CorruptDumpError(f"unknown dtype {_brief(dtype)} in the header", field=name_shown)
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in shape
    ):
        raise CorruptDumpError(f"shape {_brief(shape)} is not a list of integers", field=name_shown)
    if len(shape) > MAX_RANK:
        raise CorruptDumpError(
            f"shape has {len(shape)} dimensions, expected at most {MAX_RANK}", field=name_shown
        )
    if any(d < 0 for d in shape):
        raise CorruptDumpError(f"shape {_brief(shape)} has a negative dimension", field=name_shown)
    if any(d > _MAX_TENSOR_BYTES for d in shape):  # even beside a 0: numpy cannot hold it
        raise CorruptDumpError(
            f"shape {_brief(shape)} has a dimension beyond any real tensor (> 2^50)",
            field=name_shown,
        )
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        raise CorruptDumpError(
            f"data_offsets {_brief(offsets)} is not [begin, end]", field=name_shown
        )
    begin, end = offsets
    if begin < 0 or end < begin or end > data_size:
        raise CorruptDumpError(
            f"data offsets {_brief(offsets)} lie outside the file's {data_size} data bytes",
            field=name_shown,
            hint="the file is truncated or the header is corrupt",
        )
    nbytes = DTYPE_ITEMSIZE[dtype] * math.prod(shape)  # Python ints: no silent overflow
    if nbytes > _MAX_TENSOR_BYTES:
        raise CorruptDumpError(
            f"shape {_brief(shape)} overflows any real tensor size", field=name_shown
        )
    if nbytes != end - begin:
        raise CorruptDumpError(
            f"shape {shape} x {dtype} is {nbytes} bytes but data_offsets span {end - begin}",
            field=name_shown,
        )
    return HeaderEntry(
        name=name, dtype=dtype, shape=tuple(shape), offset=data_start + begin, nbytes=nbytes
    )


#: A header as read for a run: parsed, or the error that names why not (`read_header_or_error`).
HeaderRead = SafetensorsHeader | DumpError


def read_header_or_error(path: str | os.PathLike[str]) -> HeaderRead:
    """`read_header`, its error (naming the file) returned rather than raised: for a command
    that reads every dump's header once, up front, and raises a bad one's error where it
    comes to that dump."""
    try:
        return read_header(path)
    except DumpError as exc:
        exc.path = exc.path or str(path)
        return exc


def read_header_and_step(
    path: str | os.PathLike[str], header: HeaderRead | None = None
) -> tuple[SafetensorsHeader, int | None]:
    """A dump's header, and the step its metadata records (None: not recorded), for commands
    that order or match dumps before loading them. An error names the file; a step that is
    not an integer is bad input. `header`: the dump's header as this run read it already
    (`read_header_or_error`), not read again."""
    read = read_header_or_error(path) if header is None else header
    if isinstance(read, DumpError):
        raise read
    text = read.metadata.get("step")
    step = None if text is None else parse_integer(text)
    if text is not None and step is None:
        raise DumpError(
            f"metadata value {excerpt(text)} is not an integer", field="step", path=str(path)
        )
    return read, step


def dump_engine(path: str | os.PathLike[str]) -> str:
    """The engine a dump names (SGLang when it names none, or when its header is unreadable:
    the SGLang reader then says why)."""
    return header_engine(read_header_or_error(path))


def header_engine(header: HeaderRead) -> str:
    """`dump_engine` of a header this run read already."""
    return SGLANG if isinstance(header, DumpError) else engine_of(header.metadata)


def refuse_other_engine(
    metadata: dict[str, str], path: str | os.PathLike[str] | None = None
) -> None:
    """For a command that reads SGLang dumps only: another engine's dump is one error line
    naming the commands that read it (before any SGLang rule, which it may break)."""
    engine = engine_of(metadata)
    if engine != SGLANG and engine not in POOL_ENGINES:
        raise unknown_engine(engine, path)
    if engine != SGLANG:
        shown = {"vllm": "vLLM"}.get(engine, engine)
        raise DumpError(
            f"a {shown} dump: this command reads SGLang dumps only",
            field=ENGINE_KEY,
            path=None if path is None else str(path),
            hint=f"`check`, `inspect`, `provenance --block N`, `timeline`, `diff` and `shrink` "
            f"read {shown} dumps",
        )


def unknown_engine(engine: str, path: str | os.PathLike[str] | None) -> DumpError:
    """Why a dump naming an engine kvcanary does not read is refused, by every command."""
    return DumpError(
        f"engine {excerpt(engine)} is not one kvcanary reads",
        field=ENGINE_KEY,
        path=None if path is None else str(path),
        hint=f"this kvcanary reads {', '.join([SGLANG, *POOL_ENGINES])} dumps",
    )
