"""What a dump holds in words, as `inspect`'s table and Markdown views say it: its metadata,
its tensors' roles and its batch."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from kvcanary_cli.results.inspect import BatchDescription, DumpDescription, TensorDescription

__all__ = ["batch_facts", "inspect_metadata", "shown_metadata", "shown_tensors", "tensor_role"]

_Tensor = TypeVar("_Tensor")


def shown_tensors(
    tensors: Sequence[_Tensor], ignored: Callable[[_Tensor], bool], max_rows: int
) -> tuple[list[_Tensor], str | None]:
    """Every tensor of the format, and the first `max_rows` a reader ignores (a file may hold
    any number of those); the line counting the rest (None: none left out)."""
    shown: list[_Tensor] = []
    extras = left = 0
    for t in tensors:
        if ignored(t):
            extras += 1
            if extras > max_rows:
                left += 1
                continue
        shown.append(t)
    return shown, (f"… {left} more ignored tensors (JSON lists every one)" if left else None)


def shown_metadata(
    known: Mapping[str, str], other: Mapping[str, str], max_rows: int
) -> tuple[dict[str, str], str | None]:
    """The `known` keys, and the first `max_rows` `other` ones (a file may hold any number);
    the line counting the rest (None: none left out)."""
    kept = dict(list(other.items())[:max_rows]) if len(other) > max_rows else dict(other)
    left = len(other) - len(kept)
    return {**known, **kept}, (
        f"… {left} more metadata keys (JSON lists every one)" if left else None
    )


def tensor_role(t: TensorDescription) -> str:
    """A tensor's role; for a sparse one (a shrunk dump), how much of it is kept."""
    role = t.role or "(ignored)"
    if t.kept is None:
        return role
    total = 1
    for dim in t.shape:
        total *= dim
    return f"{role} (sparse: {t.kept:,} of {total:,} kept)"


def inspect_metadata(dump: DumpDescription, max_rows: int) -> tuple[dict[str, str], str | None]:
    """Identity keys, the SGLang installed here (when it is), then the first `max_rows` other
    metadata keys; the line counting the rest (`shown_metadata`)."""
    installed = dump.sglang_installed
    here = {"sglang installed here": installed} if installed else {}
    return shown_metadata({**dump.identity, **here}, dump.other_metadata, max_rows)


def batch_facts(batch: BatchDescription) -> list[tuple[str, int | None]]:
    """The batch summary's rows, in the order both views show them."""
    return [
        ("bs", batch.bs),
        ("active batch rows", batch.active_rows),
        ("padding batch rows", batch.padding_rows),
        ("total prefix tokens", batch.total_prefix_tokens),
        ("total extend tokens", batch.total_extend_tokens),
        ("max reqs", batch.max_reqs),
        ("max seq len", batch.max_seq_len),
        ("lut len", batch.lut_len),
    ]
