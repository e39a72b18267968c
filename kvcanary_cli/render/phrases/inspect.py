"""What a dump holds in words, as `inspect`'s table and Markdown views say it: its metadata,
its tensors' roles and its batch."""

from __future__ import annotations

from kvcanary_cli.results.inspect import BatchDescription, DumpDescription, TensorDescription

__all__ = ["batch_facts", "inspect_metadata", "tensor_role"]


def tensor_role(t: TensorDescription) -> str:
    """A tensor's role; for a sparse one (a shrunk dump), how much of it is kept."""
    role = t.role or "(ignored)"
    if t.kept is None:
        return role
    total = 1
    for dim in t.shape:
        total *= dim
    return f"{role} (sparse: {t.kept:,} of {total:,} kept)"


def inspect_metadata(dump: DumpDescription) -> dict[str, str]:
    """Identity keys, the SGLang installed here (when it is), then other metadata."""
    installed = dump.sglang_installed
    here = {"sglang installed here": installed} if installed else {}
    return {**dump.identity, **here, **dump.other_metadata}


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
