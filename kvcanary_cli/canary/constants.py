"""The canary's vocabulary: launch tags, fail-reason bits, the chain anchor, record layout,
buffer names, and the labels SGLang prints for them (docs/canary.md §1, §6).

Standard library and `dump.schema` only (the launch tags are part of the dump format: field 0
of a `violation_ring` row): the synthesizer stamps records and rings with it, and the renderers
label rows with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntFlag

from kvcanary_cli.dump.schema import LaunchTag

__all__ = [
    "BUFFERS",
    "CHAIN_ANCHOR",
    "MASK64",
    "RECORD_BYTES",
    "VIOLATION_FIELDS",
    "FailReason",
    "LaunchTag",
    "buffer_of_tag",
    "buffer_tensor_name",
    "canary_kind",
    "group_of_tag",
    "has_token_check",
    "hex64",
    "is_write",
    "reason_bits",
    "reason_labels",
    "tag_for",
    "tag_label",
    "to_signed",
]

MASK64 = (1 << 64) - 1
#: the value the chain starts from; its splitmix64 image is the hash entering position 0.
CHAIN_ANCHOR = 0xC0FFEE1234567890
#: bytes of one slot record: four little-endian int64 (token, position, prev_hash, real_kv_hash).
RECORD_BYTES = 32
#: the eight int64 fields of a violation-ring row, in ring order.
VIOLATION_FIELDS = (
    "kernel_kind",
    "slot_idx",
    "position",
    "stored_token",
    "expected_token",
    "stored_chain_hash",
    "expected_aux",
    "fail_reason_bits",
)
#: canary buffers of a group, in launch order within a stage (K before V).
BUFFERS = ("head.k", "head.v", "tail.k", "tail.v")


class FailReason(IntFlag):
    """Bits of ring field 7 (docs/canary.md §4)."""

    VERIFY_CHAIN_HASH_MISMATCH = 1
    VERIFY_POSITION_MISMATCH = 2
    VERIFY_REAL_KV_HASH_MISMATCH = 4
    WRITE_TOKEN_MISMATCH = 8
    WRITE_POSITION_MISMATCH = 16
    VERIFY_TOKEN_MISMATCH = 32


_REASON_LABELS = {
    int(bit): str(bit.name).lower().removesuffix("_mismatch") for bit in sorted(FailReason, key=int)
}
_LABEL_BITS = {label: bit for bit, label in _REASON_LABELS.items()}
_WRITE_BITS = int(FailReason.WRITE_TOKEN_MISMATCH | FailReason.WRITE_POSITION_MISMATCH)
_TOKEN_BITS = int(FailReason.WRITE_TOKEN_MISMATCH | FailReason.VERIFY_TOKEN_MISMATCH)


def to_signed(value: int) -> int:
    """A 64-bit pattern as a signed int64 (two's complement)."""
    value &= MASK64
    return value - (1 << 64) if value >> 63 else value


def hex64(value: int) -> str:
    """`0x` and 16 lowercase hex digits of the value's 64-bit pattern (SGLang's log format)."""
    return f"{value & MASK64:#018x}"


def _tag(value: int) -> LaunchTag | None:
    return LaunchTag(value) if 0 <= value < len(LaunchTag) else None


def tag_label(value: int) -> str:
    """The tag's name, or `unknown(N)` for a value that is not a tag."""
    tag = _tag(value)
    return tag.name if tag is not None else f"unknown({value})"


def canary_kind(value: int) -> str:
    """`sweep_k_full` for sweep tags, `per_forward_<name>` for the others, else `unknown(N)`."""
    tag = _tag(value)
    if tag is None:
        return f"unknown({value})"
    name = tag.name.lower()
    return name if name.startswith("sweep") else f"per_forward_{name}"


def group_of_tag(value: int) -> str | None:
    """`full` or `swa` (which slot space the row's slot is in); None for an unknown tag."""
    tag = _tag(value)
    if tag is None:
        return None
    return "swa" if tag.name.endswith("_SWA") else "full"


def buffer_of_tag(value: int) -> str | None:
    """The buffer the launch reads (`head.k`, `tail.v`, ...; a sweep reads the tail buffer)."""
    tag = _tag(value)
    if tag is None:
        return None
    stage, half, _ = tag.name.lower().split("_")
    return f"{'head' if stage == 'head' else 'tail'}.{half}"


def tag_for(group: str, buffer: str) -> LaunchTag:
    """The tag of a per-forward verify of `buffer` (`head.k`, ...) in `group`."""
    stage, half = buffer.split(".")
    return LaunchTag[f"{stage.upper()}_{half.upper()}_{group.upper()}"]


def buffer_tensor_name(group: str, buffer: str) -> str:
    """The dump's tensor name of a canary buffer: `canary.<group>.<head|tail>.<k|v>`."""
    return f"canary.{group}.{buffer}"


def reason_labels(bits: int) -> list[str]:
    """Labels of the known bits, in ascending bit order; unknown bits are ignored."""
    return [label for bit, label in _REASON_LABELS.items() if bits & bit]


def reason_bits(labels: Iterable[str]) -> int | None:
    """The bits of reason labels (None when one is not a reason)."""
    bits = 0
    for label in labels:
        if label not in _LABEL_BITS:
            return None
        bits |= _LABEL_BITS[label]
    return bits


def is_write(bits: int) -> bool:
    """A write-kernel row (its field 6 is a position, not a hash)."""
    return bool(bits & _WRITE_BITS)


def has_token_check(bits: int) -> bool:
    """A row whose expected token the log prints."""
    return bool(bits & _TOKEN_BITS)
