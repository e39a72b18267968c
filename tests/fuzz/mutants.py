"""A corpus of broken dumps: deterministic mutations of valid safetensors dumps.

Standard library and numpy only, no kvcanary import: the mutations know the safetensors layout
and the format's tensor names, not how kvcanary reads them. Four families:

- `header`: JSON edits (dtypes, shapes, offsets, huge or negative numbers, duplicate keys, many
  tensors, many metadata keys, deep nesting, non-UTF-8 bytes) and the header length field;
- `data`: values inside tensors and scalars (negative, huge, int64 extremes, slots repeated
  across rows, LUT and free-list damage, violation rings);
- `length`: claimed sequence lengths far beyond the file (2^29, 2^40, 4e13, int64 extremes);
- `truncation`: the file cut at every structural boundary and at random points, or grown.

Every mutant has a `kind`, the class of damage (`length.extend_seq_lens.large`), so a test can
single out a class; the corpus of a seed and a family is the same on every run.
"""

from __future__ import annotations

import copy
import json
import random
import re
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["FAMILIES", "Mutant", "Seed", "Tensor", "corpus", "frame"]

FAMILIES = ("header", "data", "length", "truncation")
#: Besides the four families: `crowded`, valid files whose findings are many.

#: numpy dtypes of the integer safetensors dtypes (little-endian, as the format stores them).
#: Written out from the format, not imported from `dump.schema`: the corpus builds files the
#: way any producer would, so a mistake in the reader's table cannot hide in the mutants.
NP_DTYPES: dict[str, str] = {
    "U8": "<u1",
    "I8": "<i1",
    "I16": "<i2",
    "U16": "<u2",
    "I32": "<i4",
    "U32": "<u4",
    "I64": "<i8",
    "U64": "<u8",
}
_ST_DTYPES = {np.dtype(v).str: k for k, v in NP_DTYPES.items()}

I32_MAX, I32_MIN = 2**31 - 1, -(2**31)
I64_MAX, I64_MIN = 2**63 - 1, -(2**63)
#: lengths a corrupt dump may claim (the `length` family), each far beyond any real row.
CLAIMED_LENGTHS = (
    2**29,
    2**30,
    2**31 - 1,
    2**31,
    2**32,
    2**40,
    2**40 + 1,
    4 * 10**13,
    2**62,
    I64_MAX,
    I64_MIN,
    -(2**31),
    -(2**40),
)
#: scalar metadata values, from ordinary to absurd.
SCALAR_VALUES = (
    -1,
    0,
    1,
    2,
    3,
    I32_MAX,
    2**31,
    2**32,
    2**40,
    2**62,
    I64_MAX,
    2**63,
    10**22,
    -(10**22),
    10**30,
    I64_MIN,
)
SCALAR_KEYS = (
    "swa_window_size",
    "verify_capacity",
    "write_req_capacity",
    "kv_token_id_vs_position_offset",
    "page_size",
    "num_full_slots",
    "num_swa_slots",
)
PER_BATCH_ROW = (
    "req_pool_indices",
    "prefix_lens",
    "extend_seq_lens",
    "req_to_verify_expected_tokens_valid_lens",
)


@dataclass(frozen=True)
class Mutant:
    """One broken file: the class of damage, what exactly was done, and its bytes."""

    kind: str
    detail: str
    blob: bytes
    #: the file's name ends so: a server log is `.log` (a `.safetensors` name is a dump).
    suffix: str = ".safetensors"

    @property
    def family(self) -> str:
        """`header`, `data`, `length` or `truncation`."""
        return self.kind.split(".", 1)[0]


@dataclass(frozen=True)
class Tensor:
    """One tensor as stored: safetensors dtype, shape, raw little-endian bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes

    def array(self) -> np.ndarray:
        """A writable copy as a numpy array of the stored dtype."""
        values = np.frombuffer(self.data, dtype=NP_DTYPES[self.dtype])
        return values.reshape(self.shape).copy()

    @staticmethod
    def of(array: np.ndarray) -> Tensor:
        """The stored form of an integer array."""
        little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        return Tensor(_ST_DTYPES[little.dtype.str], tuple(little.shape), little.tobytes())


def frame(header: bytes, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A safetensors file: u64 header length, header (space-padded to 8 bytes), data."""
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header) if length is None else length) + header + data


def _text(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True)
class Seed:
    """A valid dump taken apart: header, metadata and tensors in file order."""

    name: str
    blob: bytes
    header_len: int
    header: dict[str, Any]
    metadata: dict[str, str]
    tensors: dict[str, Tensor]
    #: the families mutated from it (a seed added for its values alone skips the others).
    families: tuple[str, ...] = FAMILIES

    @staticmethod
    def parse(name: str, blob: bytes) -> Seed:
        """Take a valid safetensors file apart (raises on anything but a clean file)."""
        (length,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8 : 8 + length])
        data = blob[8 + length :]
        metadata = dict(header.get("__metadata__", {}))
        entries = sorted(
            ((k, v) for k, v in header.items() if k != "__metadata__"),
            key=lambda item: int(item[1]["data_offsets"][0]),
        )
        tensors = {
            k: Tensor(
                v["dtype"], tuple(v["shape"]), data[v["data_offsets"][0] : v["data_offsets"][1]]
            )
            for k, v in entries
        }
        return Seed(name, blob, length, header, metadata, tensors)

    @property
    def data(self) -> bytes:
        """The data section."""
        return self.blob[8 + self.header_len :]

    def array(self, name: str) -> np.ndarray:
        """A writable copy of one tensor."""
        return self.tensors[name].array()

    def rebuild(
        self,
        tensors: Mapping[str, Tensor] | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> bytes:
        """A clean file with these tensors (fresh offsets, file order kept) and metadata."""
        tensors = self.tensors if tensors is None else tensors
        metadata = self.metadata if metadata is None else metadata
        header: dict[str, Any] = {"__metadata__": dict(metadata)}
        chunks: list[bytes] = []
        offset = 0
        for name, tensor in tensors.items():
            end = offset + len(tensor.data)
            header[name] = {
                "dtype": tensor.dtype,
                "shape": list(tensor.shape),
                "data_offsets": [offset, end],
            }
            chunks.append(tensor.data)
            offset = end
        return frame(_text(header).encode(), b"".join(chunks))

    def put(self, name: str, array: np.ndarray, **more: np.ndarray) -> bytes:
        """A clean file with `name` (and the tensors in `more`) replaced."""
        tensors = dict(self.tensors)
        for key, value in {name: array, **more}.items():
            tensors[key] = Tensor.of(value)
        return self.rebuild(tensors)

    def with_metadata(self, **changes: str | None) -> bytes:
        """A clean file whose metadata has `changes` applied (None removes a key)."""
        metadata = dict(self.metadata)
        for key, value in changes.items():
            if value is None:
                metadata.pop(key, None)
            else:
                metadata[key] = value
        return self.rebuild(metadata=metadata)

    def with_header(self, header: object, data: bytes | None = None) -> bytes:
        """This file's data under another header (a JSON value, or raw header bytes)."""
        raw = header if isinstance(header, bytes) else _text(header).encode()
        return frame(raw, self.data if data is None else data)

    def with_pairs(self, pairs: Sequence[tuple[str, object]]) -> bytes:
        """A header written from key/value pairs, in order: duplicate keys allowed."""
        body = ",".join(f"{_text(key)}:{_text(value)}" for key, value in pairs)
        return frame(("{" + body + "}").encode(), self.data)

    def header_copy(self) -> dict[str, Any]:
        """A deep copy of the header, to edit."""
        return copy.deepcopy(self.header)

    @property
    def sparse(self) -> bool:
        """A shrunk dump (format 1.2): its tables are stored as kept runs (`NAME.runs`)."""
        return "req_to_token.runs" in self.tensors

    def table(self) -> np.ndarray:
        """`req_to_token` as a dense array (a sparse one expanded: cells not kept read 0)."""
        if not self.sparse:
            return self.array("req_to_token")
        shape = tuple(int(d) for d in self.array("req_to_token.shape").reshape(-1))
        values = self.array("req_to_token").reshape(-1)
        dense = np.zeros(int(np.prod(shape)), dtype=np.int64)
        at = end = 0
        for gap, length in self.array("req_to_token.runs").reshape(-1, 2).tolist():
            start, end = end + gap, end + gap + length  # format 1.2: (gap, length) pairs
            dense[start:end] = values[at : at + length]
            at += length
        return dense.reshape(shape)

    def live_cells(self) -> list[tuple[int, int]]:
        """(pool row, position) of the cells the batch reads or writes: [0, P+E) of its rows."""
        rows, cols = self.table().shape
        pool = self.array("req_pool_indices").tolist()
        prefix = self.array("prefix_lens").tolist()
        extend = (
            self.array("extend_seq_lens").tolist()
            if "extend_seq_lens" in self.tensors
            else [0] * len(pool)
        )
        cells: list[tuple[int, int]] = []
        for row, p, e in zip(pool, prefix, extend, strict=True):
            if 0 < row < rows:
                cells.extend((row, pos) for pos in range(max(0, min(p + e, cols))))
        return cells

    def padding_rows(self) -> list[int]:
        """Batch rows that point at pool row 0 (CUDA-graph padding)."""
        return [i for i, row in enumerate(self.array("req_pool_indices").tolist()) if row == 0]

    def live_rows(self) -> list[int]:
        """Batch rows that point at a real pool row."""
        return [i for i, row in enumerate(self.array("req_pool_indices").tolist()) if row != 0]


def corpus(seeds: Sequence[Seed], family: str) -> Iterator[Mutant]:
    """Every mutant of `family` for each seed, in a fixed order (seeded per family and seed).

    `crowded` (valid files built to make findings many) is one set, from the first seed only.
    """
    make = _GENERATORS[family]
    for seed in seeds[:1] if family == "crowded" else seeds:
        if family in seed.families or family == "crowded":
            yield from make(seed, random.Random(f"{family}/{seed.name}"))


# --- header -------------------------------------------------------------------------------

_DTYPES: list[object] = [
    "F32",
    "F16",
    "BF16",
    "F64",
    "BOOL",
    "U64",
    "U32",
    "U16",
    "U8",
    "I8",
    "I16",
    "I32",
    "I64",
    "F8_E4M3",
    "C64",
    "Q7",
    "",
    "i64",
    " I64",
    7,
    None,
    ["I64"],
    {"d": 1},
]
_BAD_SHAPES: list[object] = [
    [],
    [0],
    [1],
    [-1],
    [3, -1],
    [2**31],
    [2**50],
    [2**63],
    [2**64],
    [2**70],
    [1.5],
    ["3"],
    [True],
    [None],
    7,
    None,
    "x",
    [[1]],
    {"a": 1},
    [1] * 65,
    [1] * 64,
    [2**40, 2**40],
    [2**62, 2**62, 0],
    [0, 2**70],
]
_NUMBERS = (
    "-1",
    "2147483648",
    "4294967296",
    str(2**53 + 1),
    str(2**63),
    str(2**64),
    "-" + str(2**63),
    "1" + "0" * 30,
    "1e5",
    "1.0",
    "1e400",
    "-1e400",
    "NaN",
    "Infinity",
    "-Infinity",
    "-0",
    "00",
    "0x10",
    "9" * 5000,
    "true",
    "null",
    '"8"',
)
_INT_TOKEN = re.compile(r"(?<=[\[:,])-?[0-9]+(?=[\],}])")
_BAD_UTF8 = (b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\x80", b"\xf8\x88\x80\x80\x80", b"\xfe\xfe")
_ODD_TEXT = (
    "\ud800",
    "\udfff",
    "\u0000",
    "\x1b[2J\x1b[HCLEAN",
    "\x1b]52;c;aGk=\x07",
    "\u202e",
    "\r",
    "\x9b",
    "[/x]",
    "[link=http://x]y[/link]",
    "`",
    "x" * 100_000,
    "",
)


def _header_mutants(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    yield from _length_field(seed)
    names = list(seed.tensors)
    for _ in range(30):
        name, dtype = rng.choice(names), rng.choice(_DTYPES)
        header = seed.header_copy()
        header[name]["dtype"] = dtype
        yield Mutant("header.dtype", f"{name} dtype {dtype!r}", seed.with_header(header))
    for _ in range(24):
        name, shape = rng.choice(names), rng.choice(_BAD_SHAPES)
        header = seed.header_copy()
        header[name]["shape"] = shape
        yield Mutant("header.shape", f"{name} shape {_short(shape)}", seed.with_header(header))
    yield from _empty_shapes(seed, rng)
    yield from _reshapes(seed, rng)
    yield from _offsets(seed, rng)
    text = _text(seed.header)
    tokens = list(_INT_TOKEN.finditer(text))
    for _ in range(24):
        token, number = rng.choice(tokens), rng.choice(_NUMBERS)
        edited = text[: token.start()] + number + text[token.end() :]
        yield Mutant(
            "header.number",
            f"integer at {token.start()} ({token.group()}) -> {number[:24]}",
            seed.with_header(edited.encode()),
        )
    yield from _duplicates(seed, rng)
    yield from _many(seed, rng)
    yield from _nesting(seed, rng)
    yield from _encoding(seed, rng)
    yield from _structure(seed, rng)
    yield from _renames(seed, rng)
    yield from _metadata_text(seed, rng)


def _short(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:40] + "..."


def _length_field(seed: Seed) -> Iterator[Mutant]:
    n, size, body = seed.header_len, len(seed.blob), seed.blob[8:]
    for length in (
        0,
        1,
        7,
        n - 8,
        n - 1,
        n + 1,
        n + 7,
        n + 8,
        size - 8,
        size - 7,
        size,
        2**31,
        2**32,
        2**63,
        2**64 - 1,
        16 * 2**20 + 1,
        100 * 2**20 + 1,
    ):
        yield Mutant(
            "header.length-field",
            f"header length {length} (true {n})",
            struct.pack("<Q", length) + body,
        )


#: claimed dimensions beside a zero: nothing is stored, but a reader looping over the claim
#: would run forever.
_CLAIMED_DIMS = (0, 1, 7, 2**20, 2**31, 2**40, 2**50)


def _empty_shapes(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    def empty(name: str, shape: tuple[int, ...]) -> bytes:
        tensors = dict(seed.tensors)
        tensors[name] = Tensor(seed.tensors[name].dtype, shape, b"")
        return seed.rebuild(tensors)

    def kind(shape: tuple[int, ...]) -> str:
        return "header.empty-claimed-huge" if max(shape) >= 2**20 else "header.empty"

    for dim in _CLAIMED_DIMS:
        for claimed in ((dim, 0), (0, dim)):
            yield Mutant(
                kind(claimed),
                f"req_to_token shape {list(claimed)}",
                empty("req_to_token", claimed),
            )
    others = [n for n in seed.tensors if n != "req_to_token"]
    for _ in range(10):
        name = rng.choice(others)
        rank = len(seed.tensors[name].shape)
        dim = rng.choice(_CLAIMED_DIMS)
        shape: tuple[int, ...] = (dim, 0) if rng.random() < 0.5 else (0, dim)
        if rank < 2:
            shape = (0,)
        yield Mutant(kind(shape), f"{name} shape {list(shape)}", empty(name, shape))
    # bs = 0: every per-batch-row tensor empty together (legal, and easy to divide by).
    tensors = dict(seed.tensors)
    for name in PER_BATCH_ROW:
        if name in tensors:
            tensors[name] = Tensor(tensors[name].dtype, (0,), b"")
    yield Mutant("header.empty", "bs 0", seed.rebuild(tensors))


def _reshapes(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    """Shapes and dtypes that still match the bytes: the file loads, its geometry is odd."""
    options: list[tuple[str, Tensor]] = []
    for name, tensor in seed.tensors.items():
        count = int(np.prod(tensor.shape))
        shapes: list[tuple[int, ...]] = [(count,), (1, count), (count, 1)]
        if len(tensor.shape) == 2:
            rows, cols = tensor.shape
            shapes += [(cols, rows)]
            if count % 2 == 0:
                shapes.append((count // 2, 2))
        for shape in shapes:
            if shape != tensor.shape:
                options.append((name, Tensor(tensor.dtype, shape, tensor.data)))
        width = np.dtype(NP_DTYPES[tensor.dtype]).itemsize
        for other in ("U8", "I32", "I64", "U64", "I16"):
            other_width = np.dtype(NP_DTYPES[other]).itemsize
            last = tensor.shape[-1] if tensor.shape else 1
            if other == tensor.dtype or (last * width) % other_width:
                continue
            shape = (*tensor.shape[:-1], last * width // other_width)
            options.append((name, Tensor(other, shape, tensor.data)))
    for name, tensor in rng.sample(options, min(24, len(options))):
        tensors = dict(seed.tensors)
        tensors[name] = tensor
        yield Mutant(
            "header.reshape",
            f"{name} read as {tensor.dtype} {list(tensor.shape)}",
            seed.rebuild(tensors),
        )


def _offsets(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    size = len(seed.data)
    names = list(seed.tensors)
    for _ in range(24):
        name = rng.choice(names)
        begin, end = seed.header[name]["data_offsets"]
        width = end - begin
        offsets = rng.choice(
            [
                [0, 0],
                [end, begin],
                [begin + 1, end + 1],
                [begin - 1, end - 1],
                [begin + 8, end + 8],
                [-1, end],
                [begin, -1],
                [begin, 2**64],
                [10**30, 10**30 + width],
                [begin, end, 0],
                [begin],
                [],
                "x",
                [float(begin), end],
                [begin, end + 1],
                [begin, end - 1],
                [0, width],
                [size - width, size],
                [size, size + width],
                [2**63, 2**63],
                [I64_MIN, I64_MIN + width],
            ]
        )
        header = seed.header_copy()
        header[name]["data_offsets"] = offsets
        yield Mutant(
            "header.offsets", f"{name} data_offsets {_short(offsets)}", seed.with_header(header)
        )


def _entries(seed: Seed) -> list[tuple[str, object]]:
    return [(k, v) for k, v in seed.header.items()]


def _duplicates(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    pairs = _entries(seed)
    names = list(seed.tensors)
    for _ in range(4):
        first, second = rng.sample(names, 2)
        # `first` named twice: once with its own entry, once with another tensor's bytes.
        twin = (first, seed.header[second])
        at = rng.randrange(len(pairs) + 1)
        yield Mutant(
            "header.duplicate-key",
            f"{first} twice (second copy: {second}'s entry)",
            seed.with_pairs([*pairs[:at], twin, *pairs[at:]]),
        )
    name = rng.choice(names)
    yield Mutant(
        "header.duplicate-key",
        f"{name} twice, same entry",
        seed.with_pairs([*pairs, (name, seed.header[name])]),
    )
    metadata = dict(seed.metadata)
    other = {**metadata, "page_size": "4", "swa_window_size": "1"}
    yield Mutant(
        "header.duplicate-key",
        "__metadata__ twice",
        seed.with_pairs([*pairs, ("__metadata__", other)]),
    )
    # A key twice inside one object: written out by hand.
    entry = seed.header[name]
    body = _text(entry)[:-1] + ',"dtype":"F32","shape":[1]}'
    text = _text(seed.header).replace(_text(name) + ":" + _text(entry), _text(name) + ":" + body, 1)
    yield Mutant(
        "header.duplicate-key", f"{name}: dtype and shape twice", seed.with_header(text.encode())
    )
    meta = _text(seed.metadata)
    if len(meta) > 2:
        text = _text(seed.header).replace(meta, meta[:-1] + ',"page_size":"7"}', 1)
        yield Mutant(
            "header.duplicate-key", "a metadata key twice", seed.with_header(text.encode())
        )


#: extra entries given to a header: kvcanary's cap is 4096 tensors and 4096 metadata keys;
#: 70,000 is past what it counts before parsing.
_MANY = (64, 4096, 4097, 70_000)


def _many(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    text = _text(seed.header)
    for count in _MANY:  # written as text: building 70,000 dicts is slow
        extra = ",".join(
            f'"x{i}":{{"dtype":"I64","shape":[0],"data_offsets":[0,0]}}' for i in range(count)
        )
        edited = text[:-1] + "," + extra + "}"
        yield Mutant(
            "header.many-tensors", f"{count} extra empty tensors", seed.with_header(edited.encode())
        )
    metadata = _text(seed.metadata)
    for count in _MANY:
        extra = ",".join(f'"k{i}":"{i}"' for i in range(count))
        edited = text.replace(metadata, metadata[:-1] + "," + extra + "}", 1)
        yield Mutant(
            "header.many-metadata",
            f"{count} extra metadata keys",
            seed.with_header(edited.encode()),
        )
    huge = {**seed.metadata, "note": "x" * (1 << 20)}
    yield Mutant("header.many-metadata", "a 1 MiB metadata value", seed.rebuild(metadata=huge))
    values: list[object] = [[], "x", 5, None, {"a": 1}, {"a": None}, {"a": ["x"]}, {"b": {}}]
    for value in values:
        header = seed.header_copy()
        header["__metadata__"] = value
        yield Mutant(
            "header.metadata-type", f"__metadata__ = {_short(value)}", seed.with_header(header)
        )
    del rng


def _nesting(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    text = _text(seed.header)
    name = rng.choice(list(seed.tensors))
    for depth in (50, 1000, 100_000):
        arrays, objects = "[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth
        for what, nested in (("arrays", arrays), ("objects", objects)):
            edited = text[:-1] + f',"deep":{nested}}}'
            yield Mutant(
                "header.nesting",
                f"{depth} nested {what} as an entry",
                seed.with_header(edited.encode()),
            )
        shape = _text(seed.header[name]["shape"])
        edited = text.replace(f'"shape":{shape}', f'"shape":{arrays}', 1)
        yield Mutant(
            "header.nesting", f"{depth} nested arrays as a shape", seed.with_header(edited.encode())
        )


def _encoding(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    raw = _text(seed.header).encode()
    targets = [_text(n).encode() for n in seed.tensors] + [
        _text(v).encode() for v in seed.metadata.values() if v
    ]
    for _ in range(12):
        target, bad = rng.choice(targets), rng.choice(_BAD_UTF8)
        at = raw.find(target)
        cut = at + 1 + rng.randrange(max(1, len(target) - 2))
        yield Mutant(
            "header.encoding",
            f"bytes {bad!r} inside {target[:30]!r}",
            seed.with_header(raw[:cut] + bad + raw[cut:]),
        )
    gaps = [m.end() for m in re.finditer(rb"[,:]", raw)]
    for _ in range(4):
        at = rng.choice(gaps)
        bad = rng.choice(_BAD_UTF8)
        yield Mutant(
            "header.encoding",
            f"bytes {bad!r} between tokens",
            seed.with_header(raw[:at] + bad + raw[at:]),
        )


def _structure(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    text = _text(seed.header)
    for body in ("[]", '"x"', "5", "null", "true", "{}", '{"__metadata__":{}}', "  ", "{", "}"):
        yield Mutant("header.structure", f"header {body!r}", seed.with_header(body.encode()))
    raw = text.encode()
    for label, blob in (
        ("a UTF-8 BOM first", b"\xef\xbb\xbf" + raw),
        ("leading whitespace", b"\n\t " + raw),
        ("trailing garbage", raw + b"xyz"),
        ("trailing second object", raw + b"{}"),
        ("NUL padding", raw + b"\0" * 8),
        ("cut JSON", raw[: len(raw) // 2]),
        ("cut by one", raw[:-1]),
    ):
        yield Mutant("header.structure", label, seed.with_header(blob))
    names = list(seed.tensors)
    for _ in range(10):
        name = rng.choice(names)
        header = seed.header_copy()
        entry = header[name]
        change = rng.choice(
            ["no dtype", "no shape", "no offsets", "extra field", "list", "null", "text"]
        )
        if change.startswith("no "):
            del entry[
                {"no dtype": "dtype", "no shape": "shape", "no offsets": "data_offsets"}[change]
            ]
        elif change == "extra field":
            entry["extra"] = {"nested": [1, 2, 3]}
        else:
            header[name] = {"list": [entry], "null": None, "text": "x"}[change]
        yield Mutant("header.structure", f"{name}: {change}", seed.with_header(header))


def _renames(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    names = list(seed.tensors)
    known = [
        "req_to_token",
        "req_pool_indices",
        "prefix_lens",
        "extend_seq_lens",
        "full_to_swa_index_mapping",
        "req_to_verify_expected_tokens",
        "req_to_verify_expected_tokens_valid_lens",
        "out_cache_loc",
        "input_ids",
        "positions",
        "free_full_slots",
        "free_swa_slots",
        "violation_ring",
        "violation_write_index",
        "canary.full.head.k",
        "canary.swa.tail.v",
        "real_kv.full.k",
        "page_size",
        "swa_window_size",
        "verify_capacity",
    ]
    for _ in range(8):  # drop one tensor
        name = rng.choice(names)
        tensors = {k: v for k, v in seed.tensors.items() if k != name}
        yield Mutant("header.drop", f"without {name}", seed.rebuild(tensors))
    for _ in range(10):  # a tensor under another format name (swapped if both exist)
        source, target = rng.choice(names), rng.choice(known)
        if source == target:
            continue
        tensors = {}
        for key, tensor in seed.tensors.items():
            new = target if key == source else source if key == target else key
            tensors[new] = tensor
        yield Mutant("header.rename", f"{source} saved as {target}", seed.rebuild(tensors))
    for _ in range(8):  # odd text in tensor names
        name, odd = rng.choice(names), rng.choice(_ODD_TEXT)
        tensors = {(k + odd if k == name else k): v for k, v in seed.tensors.items()}
        yield Mutant("header.odd-text", f"{name} + {odd[:12]!r}", seed.rebuild(tensors))


def _metadata_text(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    odd_numbers = (
        "",
        " ",
        "+5",
        "1e3",
        "0x10",
        "\u0661\u0662",
        "-0",
        "1_0",
        " 7 ",
        "\t3\n",
        "9" * 4301,
        "9" * 20_000,
        "-" + "9" * 5000,
        "3.0",
    )
    for _ in range(12):
        key, value = rng.choice(SCALAR_KEYS), rng.choice(odd_numbers)
        yield Mutant(
            "header.metadata-text", f"{key} = {value[:16]!r}", seed.with_metadata(**{key: value})
        )
    for value in (
        "",
        ",",
        "full,full",
        "swa,full",
        "all,full",
        "FULL",
        "full, swa ,",
        "mamba",
        "swa",
    ):
        yield Mutant(
            "header.metadata-text", f"groups = {value!r}", seed.with_metadata(groups=value)
        )
    for value in ("1 ", "01", "1.0", "", "2", "\ud800"):
        yield Mutant(
            "header.metadata-text",
            f"kvcanary.format = {value!r}",
            seed.with_metadata(**{"kvcanary.format": value}),
        )
    keys = ["note", "model", "sglang.version", "rank", "step", "forward_mode", "captured_at"]
    for _ in range(8):
        key, odd = rng.choice(keys), rng.choice(_ODD_TEXT)
        yield Mutant(
            "header.odd-text", f"metadata {key} = {odd[:12]!r}", seed.with_metadata(**{key: odd})
        )
    for _ in range(3):
        odd = rng.choice(_ODD_TEXT)
        yield Mutant(
            "header.odd-text", f"metadata key {odd[:12]!r}", seed.with_metadata(**{odd: "x"})
        )


# --- data ---------------------------------------------------------------------------------


def _data_mutants(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    if seed.sparse:  # a shrunk dump: its sparse parts (the rest is the dense seeds' business)
        yield from _sparse_parts(seed, rng)
        return
    yield from _slot_values(seed, rng)
    yield from _wide_slots(seed, rng)
    yield from _pool_rows(seed, rng)
    yield from _moderate_lengths(seed, rng)
    if "full_to_swa_index_mapping" in seed.tensors:
        yield from _lut(seed, rng)
    for name in ("free_full_slots", "free_swa_slots"):
        if name in seed.tensors:
            yield from _free_list(seed, rng, name)
    for name in ("out_cache_loc", "input_ids", "positions", "req_to_verify_expected_tokens"):
        if name in seed.tensors:
            yield from _plain_values(seed, rng, name)
    if "violation_ring" in seed.tensors:
        yield from _ring(seed, rng)
    canary = [n for n in seed.tensors if n.startswith(("canary.", "real_kv."))]
    for _ in range(6 if canary else 0):
        name = rng.choice(canary)
        values = seed.array(name)
        flat = values.reshape(-1)
        how = rng.choice(["random", "zero", "ff"])
        picks = rng.sample(range(flat.size), min(flat.size, 64))
        flat[picks] = (
            [rng.randrange(256) for _ in picks]
            if how == "random"
            else (0 if how == "zero" else 255)
        )
        yield Mutant("data.canary-bytes", f"{name}: {how} bytes", seed.put(name, values))
    yield from _scalars(seed, rng)
    if any(n.startswith("real_kv.") for n in seed.tensors):  # a stream of its own: the
        # classes above draw what they always drew
        yield from _real_kv(seed, random.Random(f"real-kv/{seed.name}"))


#: metadata of real-KV sources, from ordinary to what upstream refuses (docs/canary.md §3).
REAL_KV_METADATA: dict[str, tuple[str, ...]] = {
    "real_kv.mode": ("none", "partial", "all", "sometimes", ""),
    "real_kv.page_size": ("1", "2", "3", "16", str(2**40), str(2**62), "0", "-1", "x"),
    "real_kv.num_bytes_per_token": ("16", "24", "32", str(2**40), str(2**62), "0"),
    "real_kv.read_bytes": ("16", "32", "48", str(2**62), "-16"),
}


def _real_kv(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    """Real-KV sources of other sizes (no rows, a row of 64 KiB, 4 KiB per token), read on
    every byte (mode all), and source metadata from ordinary to absurd."""
    names = sorted(n for n in seed.tensors if n.startswith("real_kv."))
    shapes = [(0, 32), (1, 16), (2, 65_536), (3, 4_096), (64, 1_024), (545, 48)]
    for rows, width in shapes:
        name = rng.choice(names)
        count = rows * width
        pattern = [rng.randrange(256) for _ in range(min(count, 4096))]
        values = np.resize(np.asarray(pattern, dtype=np.uint8), count).reshape(rows, width)
        tensors = {**seed.tensors, name: Tensor.of(values)}
        metadata = {**seed.metadata, "real_kv.mode": "all"}
        yield Mutant(
            "data.real-kv.width",
            f"{name} [{rows}, {width}], mode all",
            seed.rebuild(tensors, metadata),
        )
    for _ in range(16):
        changes = {
            key: rng.choice(values)
            for key, values in REAL_KV_METADATA.items()
            if rng.random() < 0.6
        }
        changes.setdefault("real_kv.mode", "all")
        yield Mutant(
            "data.real-kv.metadata",
            ", ".join(f"{k} = {v}" for k, v in sorted(changes.items())),
            seed.with_metadata(**changes),
        )


def _fit(values: np.ndarray, *numbers: int) -> np.ndarray:
    """`values` widened to int64 when a number does not fit its dtype (int64 is accepted)."""
    info = np.iinfo(values.dtype)
    if all(info.min <= n <= info.max for n in numbers):
        return values
    return values.astype(np.int64)


def _slot_values(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    cells = seed.live_cells()
    table = seed.array("req_to_token")
    pool = int(seed.metadata.get("num_full_slots", "0") or 0) or int(table.max()) + 1
    for _ in range(24):
        value = rng.choice([-1, -7, I32_MIN, I32_MAX, pool, pool + 1, 0, 1, 2**24])
        count = rng.choice([1, 3, len(cells)])
        values = table.copy()
        for row, pos in rng.sample(cells, min(count, len(cells))):
            values[row, pos] = value
        yield Mutant(
            "data.req_to_token", f"{count} live cells = {value}", seed.put("req_to_token", values)
        )
    rows, cols = table.shape
    # One slot at many positions: across every row, within one row, everywhere.
    slot = int(table[cells[0]]) if cells else 1
    values = table.copy()
    for row in range(rows):
        values[row, row % cols] = slot
    yield Mutant(
        "data.req_to_token.shared",
        f"slot {slot} in every row at different positions",
        seed.put("req_to_token", values),
    )
    values = table.copy()
    values[cells[0][0], :] = slot if cells else 1
    yield Mutant(
        "data.req_to_token.shared",
        f"slot {slot} at every position of one row",
        seed.put("req_to_token", values),
    )
    values = np.full_like(table, slot)
    yield Mutant(
        "data.req_to_token.shared", f"slot {slot} in every cell", seed.put("req_to_token", values)
    )
    for _ in range(6):
        values = table.copy()
        for _ in range(rng.choice([2, 5, 20])):
            (r1, p1), (r2, p2) = rng.sample(cells, 2)
            values[r2, p2] = values[r1, p1]
        yield Mutant(
            "data.req_to_token.shared",
            "slots copied between live cells",
            seed.put("req_to_token", values),
        )
    values = np.asarray(rng.choices(range(-3, pool + 3), k=table.size), dtype=table.dtype)
    yield Mutant(
        "data.req_to_token", "random table", seed.put("req_to_token", values.reshape(table.shape))
    )


def _wide_slots(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    """int64 `req_to_token` (an accepted dtype) holding slots that only int64 can hold."""
    cells = seed.live_cells()
    table = seed.array("req_to_token").astype(np.int64)
    for _ in range(6):
        value = rng.choice([I64_MAX, I64_MIN, 2**62, -(2**62), 2**32, 2**40, -(2**40)])
        values = table.copy()
        for row, pos in rng.sample(cells, min(3, len(cells))):
            values[row, pos] = value
        yield Mutant(
            "data.req_to_token.int64",
            f"int64 live cells = {value}",
            seed.put("req_to_token", values),
        )
    # Collisions of packed keys: row r holds s + 2^40 where row r+1 holds s (row*2^40 + slot);
    # and s, s + 2^32 in two rows (slot << 32 overflows).
    by_row: dict[int, list[int]] = {}
    for row, pos in cells:
        by_row.setdefault(row, []).append(pos)
    rows = sorted(by_row)
    for shift in (2**40, 2**32, 2**31, 2**48):
        values = table.copy()
        for a, b in zip(rows, rows[1:], strict=False):
            pos = by_row[a][0]
            values[a, pos] = values[b, by_row[b][0]] + shift
        yield Mutant(
            "data.req_to_token.int64-collide",
            f"slot + {shift} in the row before",
            seed.put("req_to_token", values),
        )
        values = table.copy()
        row = rows[0]
        values[row, by_row[row][-1]] = values[row, by_row[row][0]] + shift
        yield Mutant(
            "data.req_to_token.int64-collide",
            f"slot and slot + {shift} in one row",
            seed.put("req_to_token", values),
        )
    del rng


def _pool_rows(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    indices = seed.array("req_pool_indices")
    rows = seed.tensors["req_to_token"].shape[0]
    for value in (-1, I64_MIN, I64_MAX, rows, rows + 1, 2**31, I32_MIN):
        values = _fit(indices, value).copy()
        values[rng.randrange(values.size)] = value
        yield Mutant(
            "data.req_pool_indices", f"a pool row = {value}", seed.put("req_pool_indices", values)
        )
    values = indices.copy()
    live = seed.live_rows()
    if len(live) >= 2:
        values[live[1]] = values[live[0]]
        yield Mutant(
            "data.req_pool_indices",
            "two batch rows on one pool row",
            seed.put("req_pool_indices", values),
        )
    yield Mutant(
        "data.req_pool_indices",
        "every row padding",
        seed.put("req_pool_indices", np.zeros_like(indices)),
    )
    yield Mutant(
        "data.req_pool_indices",
        "every row on pool row 1",
        seed.put("req_pool_indices", np.ones_like(indices)),
    )


def _moderate_lengths(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    cols = seed.tensors["req_to_token"].shape[1]
    names = [
        n
        for n in ("prefix_lens", "extend_seq_lens", "req_to_verify_expected_tokens_valid_lens")
        if n in seed.tensors
    ]
    for _ in range(18):
        name = rng.choice(names)
        value = rng.choice([-1, -7, 0, cols - 1, cols, cols + 1, 2 * cols, 1000, 10_000])
        values = seed.array(name)
        row = rng.randrange(values.size)
        values[row] = value
        yield Mutant(f"data.lens.{name}", f"{name}[{row}] = {value}", seed.put(name, values))


def _lut(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    name = "full_to_swa_index_mapping"
    lut = seed.array(name)
    for _ in range(10):
        value = rng.choice([-1, -2, I32_MAX, 2**31, I64_MAX, I64_MIN, 0, lut.size, 10**12])
        values = lut.copy()
        picks = rng.sample(range(lut.size), rng.choice([1, 5, lut.size]))
        values[picks] = value
        yield Mutant("data.lut", f"{len(picks)} LUT entries = {value}", seed.put(name, values))
    for label, values in (
        ("LUT all -1", np.full_like(lut, -1)),
        ("LUT all 0", np.zeros_like(lut)),
        ("LUT all 1 (every slot on one SWA slot)", np.ones_like(lut)),
        ("LUT of 1 entry", lut[:1]),
        ("LUT of 2 entries", lut[:2]),
        ("LUT cut in half", lut[: lut.size // 2]),
        ("LUT without its sentinel", lut[:-1]),
        ("LUT 1000 entries longer", np.concatenate([lut, np.full(1000, -1, dtype=lut.dtype)])),
        ("LUT as int32", lut.astype(np.int32)),
    ):
        yield Mutant("data.lut", label, seed.put(name, values))
    del rng


def _free_list(seed: Seed, rng: random.Random, name: str) -> Iterator[Mutant]:
    free = seed.array(name)
    live = sorted({int(seed.array("req_to_token")[c]) for c in seed.live_cells()})
    for label, values in (
        ("every live slot added", np.concatenate([free, np.asarray(live, dtype=free.dtype)])),
        ("negative entries", np.concatenate([free, np.asarray([-1, -5], dtype=free.dtype)])),
        ("int64 extremes", np.concatenate([free, np.asarray([I64_MIN, I64_MAX], dtype=np.int64)])),
        ("huge entries", np.concatenate([free, np.asarray([2**40, 2**31], dtype=np.int64)])),
        ("every entry twice", np.concatenate([free, free])),
        ("empty", free[:0]),
        ("100,000 entries", np.arange(100_000, dtype=free.dtype)),
        ("all the same slot", np.full_like(free, live[0] if live else 1)),
    ):
        yield Mutant(f"data.free.{name}", label, seed.put(name, values))
    del rng


def _plain_values(seed: Seed, rng: random.Random, name: str) -> Iterator[Mutant]:
    values = seed.array(name)
    for value in (-1, I64_MIN, I64_MAX, 2**31, 2**40):
        edited = _fit(values, value).copy()
        flat = edited.reshape(-1)
        flat[rng.randrange(flat.size)] = value
        yield Mutant(f"data.values.{name}", f"an entry = {value}", seed.put(name, edited))
    if values.ndim == 1 and values.size > 1:
        edited = values.copy()
        edited[:] = edited[0]
        yield Mutant(f"data.values.{name}", "every entry the same", seed.put(name, edited))


def _ring(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    ring = seed.array("violation_ring")
    index = seed.array("violation_write_index")
    capacity = ring.shape[0]
    for _ in range(8):
        values = ring.copy()
        for row in rng.sample(range(capacity), rng.choice([1, 4, capacity])):
            values[row] = [rng.getrandbits(64) - 2**63 for _ in range(values.shape[1])]
        yield Mutant("data.ring", "random ring rows", seed.put("violation_ring", values))
    for value in (-1, I64_MIN, I64_MAX, 2**32):
        values = ring.copy()
        values[rng.randrange(capacity), rng.randrange(values.shape[1])] = value
        yield Mutant("data.ring", f"a ring cell = {value}", seed.put("violation_ring", values))
    yield Mutant("data.ring", "ring all -1", seed.put("violation_ring", np.full_like(ring, -1)))
    for value in (
        -1,
        0,
        1,
        capacity,
        capacity + 1,
        10 * capacity,
        I32_MAX,
        I32_MIN,
        2**62,
        I64_MIN,
    ):
        values = _fit(index, value).copy()
        values.reshape(-1)[0] = value
        yield Mutant(
            "data.ring-index",
            f"violation_write_index = {value}",
            seed.put("violation_write_index", values),
        )
    for rows in (0, 1, 4096):
        values = np.zeros((rows, 8), dtype=np.int64)
        yield Mutant("data.ring", f"a ring of {rows} rows", seed.put("violation_ring", values))


#: the smallest value of each scalar the format allows (docs/dump-format.md).
SCALAR_MINIMUMS = {
    "verify_capacity": 0,
    "write_req_capacity": 0,
    "page_size": 1,
    "num_full_slots": 0,
    "num_swa_slots": 0,
}


def _scalar_kind(seed: Seed, key: str, value: int) -> str:
    if key in SCALAR_MINIMUMS and value < SCALAR_MINIMUMS[key]:
        return "data.scalar.below-minimum"
    # With a LUT the swa group must be planned with the window: one no SGLang could have used
    # (beyond [-2^31, 2^40], docs/dump-format.md) leaves nothing to plan with.
    if key == "swa_window_size" and "full_to_swa_index_mapping" in seed.tensors:
        if not I32_MIN <= value <= 2**40:
            return "data.scalar.window-unplannable"
    return "data.scalar.big" if not I32_MIN <= value <= I32_MAX else "data.scalar.small"


def _scalars(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    # Every key with every value on seeds with a LUT (every scalar matters there); a sample
    # on the others.
    pairs = [(key, value) for key in SCALAR_KEYS for value in SCALAR_VALUES]
    if "full_to_swa_index_mapping" not in seed.tensors:
        pairs = rng.sample(pairs, 24)
    for key, value in pairs:
        yield Mutant(
            _scalar_kind(seed, key, value),
            f"{key} = {value}",
            seed.with_metadata(**{key: str(value)}),
        )
    for _ in range(4):  # a scalar stored as a tensor instead
        key = rng.choice(SCALAR_KEYS)
        value = rng.choice([v for v in SCALAR_VALUES if I64_MIN <= v <= I64_MAX])
        tensors = dict(seed.tensors)
        tensors[key] = Tensor.of(np.asarray([value], dtype=np.int64))
        metadata = {k: v for k, v in seed.metadata.items() if k != key}
        yield Mutant(
            _scalar_kind(seed, key, value),
            f"{key} = {value} as a tensor",
            seed.rebuild(tensors, metadata),
        )


def _crowded(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    """Small files whose findings are many and far-reaching (one corpus, whatever the seed):
    slots shared by a thousand rows, a row full of one slot, a long ring over many slots, a
    wide slot read by every entry, a log of long lines, thousands of batch rows each reading
    a stale tail, a shrunk production-wide pool whose every row is live."""
    del rng

    def dump(table: np.ndarray, prefix: int, **more: np.ndarray) -> bytes:
        rows = table.shape[0] - 1
        batch = {
            "req_to_token": table,
            "req_pool_indices": np.arange(1, rows + 1, dtype=np.int64),
            "prefix_lens": np.full(rows, prefix, dtype=np.int64),
            "extend_seq_lens": np.zeros(rows, dtype=np.int64),
            **more,
        }
        tensors = {name: Tensor.of(values) for name, values in batch.items()}
        return seed.rebuild(tensors, {"num_full_slots": "64"})

    rows, width = 2048, 8
    table = np.zeros((rows + 1, width), dtype=np.int32)
    for k in range(width):  # slot k + 1 sits at position (row + k) % width of each row
        table[np.arange(1, rows + 1), (np.arange(1, rows + 1) + k) % width] = k + 1
    yield Mutant(
        "crowded.shared-slots",
        f"{width} slots, each at a different position in each of {rows} rows",
        dump(table, width),
    )
    length = 4000
    table = np.zeros((2, length), dtype=np.int32)
    table[1, :] = 7
    yield Mutant(
        "crowded.duplicate-row", f"slot 7 at all {length} positions of one row", dump(table, length)
    )
    rows, width, capacity = 64, 8, 20_000
    table = np.zeros((rows + 1, width), dtype=np.int32)
    table[1:] = 1000 + np.arange(width, dtype=np.int32)  # slot 1000 + k at position k of each
    ring = np.zeros((capacity, 8), dtype=np.int64)  # row: beyond the 64-slot pool
    ring[:, 1] = 1000 + np.arange(capacity) % width
    ring[:, 2] = np.arange(capacity) % width
    ring[:, 7] = 1
    yield Mutant(
        "crowded.ring",
        f"a {capacity}-row violation ring over {width} slots, each in {rows} finding cells",
        dump(
            table,
            width,
            violation_ring=ring,
            violation_write_index=np.asarray([capacity], dtype=np.int32),
        ),
    )
    yield _one_wide_slot(seed)
    yield _long_log_lines()
    yield _cut_violation_lines()
    rows, prefix, tail = 3000, 8, 4  # every batch row reads a stale tail of freed slots
    table = np.zeros((rows + 1, prefix + 1), dtype=np.int32)
    slots = 1 + np.arange(rows * prefix, dtype=np.int32).reshape(rows, prefix)
    table[1:, :prefix] = slots
    batch: dict[str, np.ndarray] = {
        "req_to_token": table,
        "req_pool_indices": np.arange(1, rows + 1, dtype=np.int64),
        "prefix_lens": np.full(rows, prefix, dtype=np.int64),
        "extend_seq_lens": np.zeros(rows, dtype=np.int64),
        "free_full_slots": slots[:, prefix - tail :].reshape(-1).astype(np.int64),
    }
    yield Mutant(
        "crowded.stale-rows",
        f"{rows} batch rows, each with the last {tail} of its {prefix} cells freed",
        seed.rebuild(
            {name: Tensor.of(values) for name, values in batch.items()},
            {"num_full_slots": str(rows * prefix + 16)},
        ),
    )
    yield _wide_shrunk_pool(seed)


def _wide_shrunk_pool(seed: Seed) -> Mutant:
    """A shrunk dump of a production-wide pool (2049 x 131,076 cells) whose 2048 batch rows
    are all live, only their cells stored: more rows than the Triton kernels are staged
    dense for, in a 100 KB file."""
    from tests.helpers import wide_shrunk_contents

    tensors, metadata = wide_shrunk_contents()
    return Mutant(
        "crowded.wide-shrunk-pool",
        "a 2049 x 131,076 shrunk table, every one of its 2048 batch rows live",
        seed.rebuild({name: Tensor.of(values) for name, values in tensors.items()}, metadata),
    )


def _one_wide_slot(seed: Seed) -> Mutant:
    """Every verify entry of a row reads slot 1, whose TAIL record is checked on 16 KiB of KV
    bytes (`real_kv.mode` all): entries x bytes is what a replay must never allocate."""
    entries, width = 8000, 16384
    table = np.zeros((2, entries), dtype=np.int32)
    table[1] = 1
    records = np.zeros((2, 32), dtype=np.uint8)
    records[1, 8] = 1  # written, at position 1: every entry but one fails its position check
    batch: dict[str, np.ndarray] = {
        "req_to_token": table,
        "req_pool_indices": np.ones(1, dtype=np.int64),
        "prefix_lens": np.full(1, entries, dtype=np.int64),
        "extend_seq_lens": np.zeros(1, dtype=np.int64),
        "canary.full.tail.k": records,
        "real_kv.full.k": np.random.default_rng(0).integers(0, 256, (2, width), dtype=np.uint8),
    }
    tensors = {name: Tensor.of(values) for name, values in batch.items()}
    return Mutant(
        "crowded.real-kv-one-slot",
        f"{entries} verify entries of one slot with {width} bytes of real KV",
        seed.rebuild(tensors, {"num_full_slots": "64", "real_kv.mode": "all"}),
    )


def _long_log_lines() -> Mutant:
    """A server log (not a dump: `violations` reads either) whose messages' `fail_reasons:`
    lines hold 65,000 blanks between two words, just under the longest line kvcanary reads."""
    head = [
        "kv_canary violation: launch_tag=TAIL_K_FULL fail_reason=verify_position slot_idx=5 "
        "position=3 stored_token=7 expected_token=7 stored_chain_hash=0x000000000000000b "
        "expected_aux=0x000000000000000c",
        "KV cache canary violation detected (kernel_kind=TAIL_K_FULL, slot_idx=5, position=3)",
        "canary_kind:       per_forward_tail_k_full",
        "  fail_reasons: x" + " " * 65_000 + "y",
    ]
    return Mutant(
        "crowded.long-log-lines",
        "3 messages whose fail_reasons line is x, 65,000 blanks, y",
        ("\n".join(head * 3) + "\n").encode(),
        ".log",
    )


def _cut_violation_lines() -> Mutant:
    """A server log whose violation lines a log collector cut at its line limit: the
    structured line cut at every length from `kv_canary v` to one character short, and a
    message's first line cut the same way, each between ordinary lines. No row can be read,
    and every line is a violation logged: never a clean log (exit 1)."""
    structured = (
        "[2025-06-01 12:00:00 TP0] kv_canary violation: launch_tag=TAIL_K_FULL "
        "fail_reason=verify_position slot_idx=5 position=3 stored_token=7 expected_token=7 "
        "stored_chain_hash=0x000000000000000b expected_aux=0x000000000000000c"
    )
    detected = (
        "KV cache canary violation detected (kernel_kind=TAIL_K_FULL, slot_idx=5, position=3)"
    )
    ordinary = "[2025-06-01 12:00:01 TP0] Decode batch. #running-req: 4, #token: 96"
    lines = []
    for line in (structured, detected):
        start = line.index("canary v") + len("canary v")
        for cut in range(start, len(line)):
            lines += [line[:cut], ordinary]
    return Mutant(
        "crowded.cut-violation-lines",
        f"{len(lines) // 2} violation lines cut short, every length, no row readable",
        ("\n".join(lines) + "\n").encode(),
        ".log",
    )


def _sparse_parts(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    """The parts of a shrunk dump's sparse tensors: original shapes that claim the moon, runs
    (gap, length) that skip past the shape or the stored values, run backwards or are signed,
    original dtypes that are no dtype or cannot hold what is stored."""
    names = [n[: -len(".runs")] for n in seed.tensors if n.endswith(".runs")]
    for _ in range(24):
        name = rng.choice(names)
        shape = seed.array(name + ".shape")
        claims = [
            [2**50, 1],
            [2**25, 2**25],
            [0, 0],
            [-1, 5],
            [I64_MAX, I64_MAX],
            [I64_MIN, 1],
            [int(shape[0]) + 1, *shape[1:].tolist()],
            [int(shape[0]) - 1, *shape[1:].tolist()],
            [2**40],
            [1, 1, 1],
        ]
        claim = rng.choice(claims)
        values = np.asarray(claim, dtype=np.int64)
        yield Mutant(
            "data.sparse.shape", f"{name}.shape = {claim}", seed.put(name + ".shape", values)
        )
    for _ in range(32):
        name = rng.choice(names)
        runs = seed.array(name + ".runs").reshape(-1, 2).astype(np.uint64)
        how = rng.choice(
            [
                "touching",
                "signed",
                "beyond shape",
                "long",
                "reversed",
                "extreme",
                "empty",
                "more than stored",
                "zero length",
            ]
        )
        edited: np.ndarray = runs.copy()
        if runs.size == 0 and how not in ("extreme", "long"):
            continue
        if how == "touching":  # every run right after the one before: other cells kept
            edited[1:, 0] = 0
        elif how == "signed":  # a signed run table, one gap negative
            edited = runs.astype(np.int64)
            edited[0, 0] = -1
        elif how == "beyond shape":
            edited[-1, 0] = 2**48
        elif how == "long":
            edited = np.asarray([[0, 2**40]], dtype=np.uint64)
        elif how == "reversed":
            edited = edited[::-1].copy()
        elif how == "extreme":
            edited = np.asarray([[2**64 - 1, 2**64 - 1], [0, 1]], dtype=np.uint64)
        elif how == "empty":
            edited = edited[:0]
        elif how == "more than stored":
            edited[-1, 1] += 1000
        elif how == "zero length":
            edited[0, 1] = 0
        yield Mutant("data.sparse.runs", f"{name}.runs: {how}", seed.put(name + ".runs", edited))
    dtypes = json.loads(seed.metadata.get("kvcanary.dtypes", "{}"))
    odd: list[tuple[str | None, object]] = [
        (rng.choice(names), "F32"),
        (rng.choice(names), "I8"),  # narrower than what is stored, or not the format's
        (rng.choice(names), 7),
        ("prefix_lens", "I64"),
        (None, None),
    ]
    for target, original in odd:
        recorded: dict[str, object] = dict(dtypes)
        if target is None:
            recorded.pop(rng.choice(names), None)
        else:
            recorded[target] = original
        yield Mutant(
            "data.sparse.dtypes",
            f"kvcanary.dtypes: {target} = {original!r}",
            seed.with_metadata(**{"kvcanary.dtypes": json.dumps(recorded)}),
        )
    for _ in range(8):
        name = rng.choice(names)
        values = seed.array(name)
        if values.size == 0:
            continue
        at, extreme = rng.randrange(values.size), rng.choice([I64_MIN, I64_MAX, -1])
        if name.startswith(("canary.", "real_kv.")):  # bytes (uint8 is their one dtype)
            edited = values.copy()
            edited[at] = 0 if extreme == I64_MIN else 255
        else:
            edited = _fit(values, I64_MIN, I64_MAX).copy()
            edited[at] = extreme
        # an original that held such a value was int64 (a value, not the structure, is odd)
        widened = {**dtypes, name: "I64"} if edited.dtype == np.int64 else dtypes
        tensors = {**seed.tensors, name: Tensor.of(edited)}
        blob = seed.rebuild(tensors, {**seed.metadata, "kvcanary.dtypes": json.dumps(widened)})
        yield Mutant("data.sparse.values", f"{name}: an extreme kept value", blob)
    yield from _sparse_real_kv(seed)


def _sparse_real_kv(seed: Seed) -> Iterator[Mutant]:
    """A shrunk dump's real-KV sources claiming rows of up to 2^44 bytes, or far more rows,
    read in every mode: work must follow the bytes stored, never the claim."""
    names = [n[: -len(".runs")] for n in seed.tensors if n.startswith("real_kv.") and ".runs" in n]
    for name in names:
        rows, width = (int(d) for d in seed.array(name + ".shape"))
        for claim in ([rows, 2**40], [rows, 2**44], [rows, width * 2**20], [2**40, width]):
            if claim[0] * claim[1] > 2**50:  # more than any real tensor: bad input, not this
                continue
            for mode in ("all", "partial"):
                tensors = {**seed.tensors, name + ".shape": Tensor.of(np.asarray(claim))}
                metadata = {**seed.metadata, "real_kv.mode": mode}
                yield Mutant(
                    "data.sparse.real-kv-shape",
                    f"{name}.shape = {claim}, mode {mode}",
                    seed.rebuild(tensors, metadata),
                )


# --- length -------------------------------------------------------------------------------


def _length_bucket(value: int) -> str:
    if abs(value) > 2**40:
        return "absurd"
    return "negative" if value < 0 else "large"


def _length_mutants(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    if seed.sparse:
        return
    names = [
        n
        for n in ("prefix_lens", "extend_seq_lens", "req_to_verify_expected_tokens_valid_lens")
        if n in seed.tensors
    ]
    live, padding = seed.live_rows(), seed.padding_rows()
    for name in names:
        base = seed.array(name)
        for value in CLAIMED_LENGTHS:
            for where in ("live", "padding", "every"):
                values = base.copy()
                if where == "every":
                    values[:] = value
                else:
                    rows = live if where == "live" else padding
                    if not rows:
                        continue
                    values[rng.choice(rows)] = value
                short = name.replace("req_to_verify_expected_tokens_", "")
                yield Mutant(
                    f"length.{short}.{_length_bucket(value)}",
                    f"{name} = {value} on {where} row(s)",
                    seed.put(name, values),
                )


# --- truncation ---------------------------------------------------------------------------


def _truncation_mutants(seed: Seed, rng: random.Random) -> Iterator[Mutant]:
    blob = seed.blob
    start = 8 + seed.header_len
    header_cuts = set(range(0, 17)) | {start - 9, start - 8, start - 1, 8 + seed.header_len // 2}
    tensor_cuts = {start, start + 1}
    for entry in seed.header.values():
        if isinstance(entry, dict) and "data_offsets" in entry:
            begin, end = (start + o for o in entry["data_offsets"])
            tensor_cuts |= {begin, begin + 1, (begin + end) // 2, end - 1}
    random_cuts = {rng.randrange(len(blob)) for _ in range(24)}
    for kind, cuts in (
        ("truncation.header", header_cuts),
        ("truncation.tensor-boundary", tensor_cuts - header_cuts),
        ("truncation.random", random_cuts - header_cuts - tensor_cuts),
    ):
        for cut in sorted(c for c in cuts if 0 <= c < len(blob)):
            yield Mutant(kind, f"cut to {cut} of {len(blob)} bytes", blob[:cut])
    for extra in (b"\0", b"\0" * 7, b"\0" * 8, bytes(rng.getrandbits(8) for _ in range(4096))):
        yield Mutant("truncation.grown", f"{len(extra)} bytes appended", blob + extra)


_GENERATORS: dict[str, Callable[[Seed, random.Random], Iterator[Mutant]]] = {
    "header": _header_mutants,
    "data": _data_mutants,
    "length": _length_mutants,
    "truncation": _truncation_mutants,
    "crowded": _crowded,
}
