"""SGLang's kv-canary log lines: the exact violation message, and a streaming parser
(docs/canary.md §6).

`format_violation` writes the seven-line message SGLang's reporter logs for one ring row (its
first line is the frozen structured line). `scan_log` reads a log of any size line by line
(never whole), with a bound on line length, and finds each message whatever logging prefix
precedes its lines: the structured line gives the row; the lines after it confirm it and add
what the pump knew (write index, overflow, step). A message whose structured line is missing
is rebuilt from its other lines. `kv_canary_swa_divergence=` lines are collected too. Nothing
in a log is an error: lines that look like canary output but do not parse are counted.
"""

from __future__ import annotations

import json
import re
import sys
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np

from kvcanary_cli.canary.constants import (
    LaunchTag,
    canary_kind,
    has_token_check,
    hex64,
    is_write,
    reason_bits,
    reason_labels,
    tag_label,
    to_signed,
)
from kvcanary_cli.canary.ring_rows import RowOrigin, ViolationRows
from kvcanary_cli.catalog import plural
from kvcanary_cli.errors import PathError, os_refusal

__all__ = [
    "MAX_LINE_BYTES",
    "SWA_DIVERGENCE_KEYS",
    "LogScan",
    "SwaDivergence",
    "bounded_lines",
    "format_pump",
    "format_violation",
    "log_text",
    "scan_log",
    "scan_log_path",
]

#: longer lines are skipped (with a note): a violation message line is under 400 bytes.
MAX_LINE_BYTES = 1 << 16
#: bytes at the start of a log in which a NUL byte means "binary, not a log".
SNIFF_BYTES = 8192
#: line numbers kept per kind of note (the counts are always exact).
_KEPT_LINES = 5
SWA_DIVERGENCE_KEYS = (
    "forward_ct",
    "verify_full",
    "verify_swa",
    "swa_full_idx_divergence",
    "swa_out_of_window_tokens",
)
_INT64 = (-(1 << 63), (1 << 63) - 1)


# --- the message --------------------------------------------------------------------------


def format_violation(
    row: Sequence[int], *, total_violations: int, ring_overflow: bool, step_when_pumped: int
) -> str:
    """The seven lines SGLang logs for one ring row (joined by newlines, no final newline)."""
    kind, slot, position, token, expected, stored_hash, aux, bits = (int(v) for v in row)
    tag = tag_label(kind)
    labels = reason_labels(bits)
    if is_write(bits):
        body = [
            f"  actual:   token_id={token}   position={position} prev_hash={hex64(stored_hash)}",
            f"  expected: token_id={expected}   position={aux}",
        ]
    else:
        body = [
            f"  stored:   token_id={token}   position={position} prev_hash={hex64(stored_hash)}",
            f"  expected: token_id={expected} prev_hash={hex64(aux)}"
            if has_token_check(bits)
            else f"  expected: prev_hash={hex64(aux)}",
        ]
    return "\n".join(
        [
            f"kv_canary violation: launch_tag={tag} fail_reason={'+'.join(labels) or 'none'} "
            f"slot_idx={slot} position={position} stored_token={token} "
            f"expected_token={expected} stored_chain_hash={hex64(stored_hash)} "
            f"expected_aux={hex64(aux)}",
            f"KV cache canary violation detected (kernel_kind={tag}, slot_idx={slot}, "
            f"position={position})",
            f"canary_kind:       {canary_kind(kind)}",
            f"  fail_reasons: {' '.join(labels) or 'none'}",
            *body,
            f"  total_violations={total_violations} ring_overflow={ring_overflow} "
            f"step_when_pumped={step_when_pumped}",
        ]
    )


def format_pump(
    ring: np.ndarray, write_index: int, *, step_when_pumped: int, already_logged: int = 0
) -> list[str]:
    """The messages one pump of the reporter logs: ring rows `[already_logged, valid)`."""
    capacity = int(ring.shape[0])
    valid = min(max(write_index, 0), capacity)
    return [
        format_violation(
            ring[i].tolist(),
            total_violations=write_index,
            ring_overflow=write_index > capacity,
            step_when_pumped=step_when_pumped,
        )
        for i in range(min(already_logged, valid), valid)
    ]


def log_text(messages: Sequence[str], *, prefix: str) -> bytes:
    """Messages as a logger writes them: `prefix` before the first line of each message."""
    return "".join(f"{prefix}{message}\n" for message in messages).encode("utf-8")


# --- parsing ------------------------------------------------------------------------------

_NUM = rb"(-?[0-9]{1,20})"
_HEX = rb"0x([0-9a-f]{16})(?![0-9a-fA-F])"
_STRUCTURED = re.compile(
    rb"kv_canary violation: +launch_tag=(\S+) +fail_reason=(\S+) +slot_idx="
    + _NUM
    + rb" +position="
    + _NUM
    + rb" +stored_token="
    + _NUM
    + rb" +expected_token="
    + _NUM
    + rb" +stored_chain_hash="
    + _HEX
    + rb" +expected_aux="
    + _HEX
)
_DETECTED = re.compile(
    rb"KV cache canary violation detected \(kernel_kind=(\S+), +slot_idx="
    + _NUM
    + rb", +position="
    + _NUM
    + rb"\)"
)
_KIND = re.compile(rb"canary_kind: +(\S+)")
# greedy to the line's end, trailing blanks stripped after: a lazy `(.*?)\s*$` retried the
# blanks at every character (a line of 65,000 blanks took 10 s)
_REASONS = re.compile(rb"fail_reasons: +(\S.*)")
_BODY = re.compile(
    rb"(stored|actual): +token_id=" + _NUM + rb" +position=" + _NUM + rb" +prev_hash=" + _HEX
)
_EXPECTED_WRITE = re.compile(rb"expected: +token_id=" + _NUM + rb" +position=" + _NUM)
_EXPECTED_TOKEN = re.compile(rb"expected: +token_id=" + _NUM + rb" +prev_hash=" + _HEX)
_EXPECTED_HASH = re.compile(rb"expected: +prev_hash=" + _HEX)
_PUMP = re.compile(
    rb"total_violations=" + _NUM + rb" +ring_overflow=(True|False) +step_when_pumped=" + _NUM
)
_SWA = re.compile(rb"kv_canary_swa_divergence=(\S+)")
_UNKNOWN_TAG = re.compile(rb"unknown\((-?[0-9]{1,20})\)")


@dataclass(frozen=True, kw_only=True)
class SwaDivergence:
    """The `kv_canary_swa_divergence=` samples of a log (int64 `[n, 5]`, keys in order)."""

    samples: np.ndarray
    lines: np.ndarray

    def __len__(self) -> int:
        return int(self.samples.shape[0])


@dataclass(frozen=True, kw_only=True)
class LogScan:
    """What a log holds: its violation rows and counts of everything else."""

    name: str
    lines: int
    rows: ViolationRows
    #: structured lines parsed, and messages (the lines after them) seen complete.
    structured: int = 0
    messages: int = 0
    #: rows rebuilt from a message whose structured line was missing.
    rebuilt: int = 0
    #: canary-looking lines that did not parse, and messages cut short.
    unparsed: int = 0
    unparsed_lines: tuple[int, ...] = ()
    incomplete: int = 0
    #: lines that begin a violation (a structured line, or a message's first line without
    #: one) but give no row: cut short (a collector's line limit) or garbled. Each is a
    #: violation that was logged and could not be read, never a clean log.
    unread: int = 0
    unread_lines: tuple[int, ...] = ()
    #: messages whose lines disagree with their structured line (the row is kept).
    inconsistent: int = 0
    overlong: int = 0
    overlong_lines: tuple[int, ...] = ()
    swa_divergence: SwaDivergence | None = None
    notes: tuple[str, ...] = ()


def _int(text: bytes) -> int | None:
    value = int(text)
    return value if _INT64[0] <= value <= _INT64[1] else None


def _tag(text: bytes) -> int | None:
    unknown = _UNKNOWN_TAG.fullmatch(text)
    if unknown:
        return _int(unknown.group(1))
    name = text.decode("ascii", "replace")
    return int(LaunchTag[name]) if name in LaunchTag.__members__ else None


def _hex(text: bytes) -> int:
    return to_signed(int(text, 16))


@dataclass
class _Message:
    """A message being read: its row so far and which line comes next (2..7)."""

    line: int
    next: int
    fields: list[int | None]
    rebuilt: bool
    consistent: bool = True
    reasons: list[str] = field(default_factory=list)
    pump: tuple[int, int, int] | None = None


class _Collector:
    """Accumulates rows in compact int64 arrays (a huge log must not become Python objects)."""

    def __init__(self) -> None:
        self.columns = [array("q") for _ in range(13)]
        self.counts = dict.fromkeys(
            (
                "structured",
                "messages",
                "rebuilt",
                "unparsed",
                "incomplete",
                "inconsistent",
                "unread",
            ),
            0,
        )
        self.unparsed_lines: list[int] = []
        self.unread_lines: list[int] = []
        self.last_unread = -1
        self.swa = array("q")
        self.swa_lines = array("q")

    def add(self, message: _Message) -> None:
        """Keep a message's row; count it as complete, cut short, rebuilt, inconsistent."""
        if message.rebuilt and any(v is None for v in message.fields):
            self.counts["incomplete"] += 1  # too little left to rebuild its row
            self.unread(message.line)
            return
        self.counts["rebuilt"] += int(message.rebuilt)
        if message.next > 7:
            self.counts["messages"] += 1
        elif message.rebuilt or message.next > 2:  # a first line alone is a row, not a cut
            self.counts["incomplete"] += 1
        if not message.consistent:
            self.counts["inconsistent"] += 1
        origin = RowOrigin.LOG_MESSAGE if message.rebuilt else RowOrigin.LOG
        values = [int(v) for v in message.fields if v is not None]
        extra = [int(origin), message.line, *(message.pump or (-1, -1, -1))]
        for column, value in zip(self.columns, values + extra, strict=True):
            column.append(value)

    def unparsed(self, number: int) -> None:
        self.counts["unparsed"] += 1
        if len(self.unparsed_lines) < _KEPT_LINES:
            self.unparsed_lines.append(number)

    def unread(self, number: int) -> None:
        """A violation began at line `number` and gave no row."""
        self.counts["unread"] += 1
        self.last_unread = number
        if len(self.unread_lines) < _KEPT_LINES:
            self.unread_lines.append(number)

    def read_after_all(self, number: int) -> None:
        """The violation that began at line `number` is read from the message after it."""
        self.counts["unread"] -= 1
        self.last_unread = -1
        if self.unread_lines and self.unread_lines[-1] == number:
            self.unread_lines.pop()

    def rows(self) -> ViolationRows:
        data = [
            np.frombuffer(c, dtype=np.int64) if len(c) else np.zeros(0, np.int64)
            for c in self.columns
        ]
        return ViolationRows.build(
            np.stack(data[:8], axis=1) if data[0].size else np.zeros((0, 8), np.int64),
            origin=data[8],
            index=data[9],
            total_violations=data[10],
            ring_overflow=data[11],
            step_when_pumped=data[12],
        )


def _structured(match: re.Match[bytes], number: int) -> _Message | None:
    tag = _tag(match.group(1))
    reasons = match.group(2).decode("ascii", "replace")
    bits = 0 if reasons == "none" else reason_bits(reasons.split("+"))
    numbers = [_int(match.group(i)) for i in range(3, 7)]
    if tag is None or bits is None or None in numbers:
        return None
    slot, position, token, expected = numbers
    return _Message(
        line=number,
        next=2,
        fields=[
            tag,
            slot,
            position,
            token,
            expected,
            _hex(match.group(7)),
            _hex(match.group(8)),
            bits,
        ],
        rebuilt=False,
    )


def _detected(match: re.Match[bytes], number: int) -> _Message | None:
    tag, slot, position = _tag(match.group(1)), _int(match.group(2)), _int(match.group(3))
    if tag is None or slot is None or position is None:
        return None
    return _Message(
        line=number,
        next=3,
        fields=[tag, slot, position, None, None, None, None, None],
        rebuilt=True,
    )


def _continue(message: _Message, line: bytes) -> bool:
    """Read `line` as the message's next line; False when it is not that line."""
    f = message.fields
    if message.next == 3:
        match = _KIND.search(line)
        if not match or f[0] is None:
            return False
        message.consistent &= match.group(1).decode("ascii", "replace") == canary_kind(f[0])
    elif message.next == 4:
        match = _REASONS.search(line)
        if not match:
            return False
        text = match.group(1).rstrip().decode("ascii", "replace")
        bits = 0 if text == "none" else reason_bits(text.split())
        if bits is None:
            return False
        if f[7] is None:
            f[7] = bits
        message.consistent &= f[7] == bits
    elif message.next == 5:
        match = _BODY.search(line)
        if not match or f[7] is None or (match.group(1) == b"actual") != is_write(f[7]):
            return False
        token, position = _int(match.group(2)), _int(match.group(3))
        if token is None or position is None:
            return False
        stored = _hex(match.group(4))
        if f[3] is None:
            f[3], f[5] = token, stored
        message.consistent &= (f[3], f[2], f[5]) == (token, position, stored)
    elif message.next == 6:
        if not _expected(message, line):
            return False
    elif message.next == 7:
        match = _PUMP.search(line)
        if not match:
            return False
        total, step = _int(match.group(1)), _int(match.group(3))
        if total is None or step is None:
            return False
        message.pump = (total, int(match.group(2) == b"True"), step)
    else:
        return False
    message.next += 1
    return True


def _expected(message: _Message, line: bytes) -> bool:
    f = message.fields
    assert f[7] is not None
    if is_write(f[7]):
        match = _EXPECTED_WRITE.search(line)
        if not match:
            return False
        token, aux = _int(match.group(1)), _int(match.group(2))
    elif has_token_check(f[7]):
        match = _EXPECTED_TOKEN.search(line)
        if not match:
            return False
        token, aux = _int(match.group(1)), _hex(match.group(2))
    else:
        match = _EXPECTED_HASH.search(line)
        if not match:
            return False
        # the message does not print an unchecked expected token: -1, as verify records it
        token, aux = (f[4] if f[4] is not None else -1), _hex(match.group(1))
    if token is None or aux is None:
        return False
    if f[4] is None:
        f[4], f[6] = token, aux
    message.consistent &= (f[4], f[6]) == (token, aux)
    return True


def bounded_lines(
    stream: BinaryIO, name: str, *, binary: str = "is not a text log (binary data)"
) -> Iterator[tuple[int, bytes | None]]:
    """(line number, line without its end) for each line of a log; None for an over-long line,
    which is skipped without being held in memory (a stream without a newline, `/dev/zero`,
    is endless). A NUL byte near the start means binary data: a `PathError` saying `binary`."""
    number = 0
    consumed = 0
    while True:
        line = stream.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        number += 1
        if consumed < SNIFF_BYTES and b"\x00" in line[: SNIFF_BYTES - consumed]:
            raise PathError(binary, path=name)
        consumed += len(line)
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while True:
                rest = stream.readline(MAX_LINE_BYTES)
                if not rest or rest.endswith(b"\n"):
                    break
            yield number, None
            continue
        yield number, line.rstrip(b"\r\n")


def scan_log(stream: BinaryIO, name: str) -> LogScan:
    """Read a log stream to its end and return its violation rows and counts."""
    out = _Collector()
    overlong: list[int] = []
    overlong_count = 0
    message: _Message | None = None
    lines = 0
    binary = "is neither a dump (no safetensors header) nor a text log (binary data)"
    for number, line in bounded_lines(stream, name, binary=binary):
        lines = number
        if line is None:
            overlong_count += 1
            if len(overlong) < _KEPT_LINES:
                overlong.append(number)
            continue
        if message is not None and message.next <= 7:
            if message.next == 2:
                detected = _DETECTED.search(line)
                if detected:
                    head = _detected(detected, number)
                    if head is not None and head.fields[:3] == message.fields[:3]:
                        message.next = 3
                        continue
            elif _continue(message, line):
                if message.next > 7:
                    out.add(message)
                    message = None
                continue
        if b"canary" not in line:
            continue
        if message is not None:
            out.add(message)
            message = None
        structured = _STRUCTURED.search(line)
        if structured:
            message = _structured(structured, number)
            if message is None:
                out.unparsed(number)
                out.unread(number)
            else:
                out.counts["structured"] += 1
            continue
        detected = _DETECTED.search(line)
        if detected:
            message = _detected(detected, number)
            if message is None:
                out.unparsed(number)
                out.unread(number)
            elif out.last_unread == number - 1:
                out.read_after_all(number - 1)  # its cut structured line: the message says it
            continue
        swa = _SWA.search(line)
        if swa:
            _swa_sample(swa.group(1), number, out)
            continue
        if _begins_a_violation(line):
            out.unparsed(number)
            out.unread(number)
    if message is not None:
        out.add(message)
    return _finish(name, lines, out, overlong, overlong_count)


#: how a violation's first line begins (its structured line, or the message's own first line
#: when the structured one is missing), and the least of it that still says so.
_HEADS = (b"kv_canary violation", b"KV cache canary violation detected")
_LEAST = len(b"kv_canary v")


def _begins_a_violation(line: bytes) -> bool:
    """Whether a line that parsed as nothing else is a violation's first line, however short
    it was cut: it holds a head, or ends in the head's beginning (`... kv_canary viol`)."""
    if any(head in line for head in _HEADS):
        return True
    tail = line.rstrip()[-len(_HEADS[1]) :]
    return any(tail.endswith(head[:cut]) for head in _HEADS for cut in range(_LEAST, len(head) + 1))


def _swa_sample(text: bytes, number: int, out: _Collector) -> None:
    try:
        sample = json.loads(text)
    except (ValueError, RecursionError):
        out.unparsed(number)
        return
    found = [sample.get(k) for k in SWA_DIVERGENCE_KEYS] if isinstance(sample, dict) else []
    values = [
        v
        for v in found
        if isinstance(v, int) and not isinstance(v, bool) and _INT64[0] <= v <= _INT64[1]
    ]
    if len(values) != len(SWA_DIVERGENCE_KEYS):
        out.unparsed(number)
        return
    out.swa.extend(values)
    out.swa_lines.append(number)


def _finish(
    name: str, lines: int, out: _Collector, overlong: list[int], overlong_count: int
) -> LogScan:
    notes: list[str] = []
    c = out.counts
    if c["unparsed"]:
        notes.append(
            f"{c['unparsed']} canary-looking lines did not parse (first at lines "
            f"{', '.join(map(str, out.unparsed_lines))})"
        )
    if overlong_count:
        notes.append(
            f"{overlong_count} lines longer than {MAX_LINE_BYTES} bytes were skipped (first at "
            f"lines {', '.join(map(str, overlong))})"
        )
    if c["unread"]:
        notes.append(
            f"{plural(c['unread'], 'violation')} logged but not readable, cut short or garbled "
            f"(first at lines {', '.join(map(str, out.unread_lines))}): the log does not show "
            "them clean"
        )
    if c["incomplete"]:
        notes.append(f"{c['incomplete']} violation messages were cut short")
    if c["inconsistent"]:
        notes.append(f"{c['inconsistent']} messages disagree with their structured line")
    if c["rebuilt"]:
        notes.append(
            f"{c['rebuilt']} rows were rebuilt from messages without their structured line"
        )
    swa = None
    if len(out.swa_lines):
        swa = SwaDivergence(
            samples=np.frombuffer(out.swa, dtype=np.int64).reshape(-1, 5).copy(),
            lines=np.frombuffer(out.swa_lines, dtype=np.int64).copy(),
        )
    return LogScan(
        name=name,
        lines=lines,
        rows=out.rows(),
        structured=c["structured"],
        messages=c["messages"],
        rebuilt=c["rebuilt"],
        unparsed=c["unparsed"],
        unparsed_lines=tuple(out.unparsed_lines),
        incomplete=c["incomplete"],
        unread=c["unread"],
        unread_lines=tuple(out.unread_lines),
        inconsistent=c["inconsistent"],
        overlong=overlong_count,
        overlong_lines=tuple(overlong),
        swa_divergence=swa,
        notes=tuple(notes),
    )


def scan_log_path(path: str) -> LogScan:
    """Scan a log file, or stdin for `-`, streaming."""
    if path == "-":
        return scan_log(sys.stdin.buffer, "-")
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise PathError(os_refusal(exc, "a server log"), path=path) from None
    with handle:
        return scan_log(handle, path)
