"""Narrow storage of a shrunk dump's sparse tensors (format 1.2).

A shrunk dump keeps slots that need some 22 bits in an int64 LUT, and run tables whose gaps
and lengths need a byte or two each in int64 pairs: most of its bytes were zeros. Format 1.2
stores each sparse tensor's kept elements in the narrowest integer dtype that holds them, and
records the dtype it had (`kvcanary.dtypes`), so that readers see the original dtype and
dtype findings read as on the original (docs/dump-format.md, "Shrunk dumps").
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

from kvcanary_cli.dump.schema import INTEGER_DTYPES, ORIGINAL_DTYPES_KEY, dtype_label
from kvcanary_cli.errors import MetadataError, TensorDtypeError

__all__ = [
    "RUN_DTYPES",
    "dtype_code",
    "narrowest_dtype",
    "narrowest_unsigned",
    "original_dtypes_text",
    "parse_original_dtypes",
]

#: Integer dtypes, narrowest first: the first that holds the values is the one stored.
_BY_WIDTH = ("U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64")
#: The dtypes a format-1.2 run table may have: its gaps and lengths are never negative.
RUN_DTYPES = ("U8", "U16", "U32", "U64")
_HINT = "the shrunk dump is damaged; shrink the original again"


def dtype_code(dtype: np.dtype) -> str:
    """The safetensors name (`I32`) of an integer numpy dtype."""
    wanted = np.dtype(dtype)
    for code, text in INTEGER_DTYPES.items():
        if np.dtype(text) == wanted:
            return code
    raise ValueError(f"{wanted} is not an integer dtype a dump stores")


def _holds(code: str, lo: int, hi: int) -> bool:
    info = np.iinfo(np.dtype(INTEGER_DTYPES[code]))
    return int(info.min) <= lo and hi <= int(info.max)


def _widens_to(stored: str, original: str) -> bool:
    """Every value of `stored` is a value of `original`."""
    return bool(
        np.can_cast(
            np.dtype(INTEGER_DTYPES[stored]), np.dtype(INTEGER_DTYPES[original]), casting="safe"
        )
    )


def narrowest_dtype(values: np.ndarray, original: str) -> str:
    """The narrowest dtype that holds every one of `values` and widens to `original` (so that
    a reader can hand the values back in `original`)."""
    lo, hi = (int(values.min()), int(values.max())) if values.size else (0, 0)
    return next(c for c in _BY_WIDTH if _widens_to(c, original) and _holds(c, lo, hi))


def narrowest_unsigned(values: np.ndarray) -> str:
    """The narrowest unsigned dtype that holds `values` (non-negative integers)."""
    hi = int(values.max()) if values.size else 0
    return next(c for c in RUN_DTYPES if _holds(c, 0, hi))


def original_dtypes_text(dtypes: Mapping[str, str]) -> str:
    """The `kvcanary.dtypes` value: tensor name -> original dtype, keys sorted (the writer is
    deterministic)."""
    return json.dumps(dict(sorted(dtypes.items())), separators=(",", ":"))


def _bad(what: str) -> MetadataError:
    return MetadataError(what, field=ORIGINAL_DTYPES_KEY, hint=_HINT)


def parse_original_dtypes(text: str | None, sparse: Mapping[str, str]) -> dict[str, str]:
    """The original dtype of each sparse tensor, from the `kvcanary.dtypes` value; `sparse`
    maps every tensor the file stores sparse to its stored dtype. It must name exactly those,
    each with an integer dtype its stored one widens to; `MetadataError` or
    `TensorDtypeError` otherwise."""
    if text is None:
        raise _bad("is required in a format 1.2 (shrunk) dump")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        raise _bad("is not JSON") from None
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise _bad("is not a JSON object mapping tensor names to dtype names")
    extra = sorted(set(raw) - set(sparse))
    if extra:
        raise _bad(f"names {extra[0][:80]!r}, which the dump does not store sparse")
    missing = sorted(set(sparse) - set(raw))
    if missing:
        raise _bad(f"does not give the original dtype of the sparse tensor {missing[0]!r}")
    for name, original in raw.items():
        if original not in INTEGER_DTYPES:
            raise _bad(f"gives {name!r} the dtype {original[:20]!r}, not an integer dtype")
        _check_stored(name, sparse[name], original)
    return dict(raw)


def _check_stored(name: str, stored: str, original: str) -> None:
    """`TensorDtypeError` unless the kept elements' dtype widens to the original one (a
    narrowed tensor never holds a value its original could not)."""
    if not _widens_to(stored, original):
        raise TensorDtypeError(
            f"stores its kept elements as {dtype_label(stored)}, which its original dtype "
            f"{dtype_label(original)} ({ORIGINAL_DTYPES_KEY}) cannot hold",
            field=name,
            hint=_HINT,
        )
