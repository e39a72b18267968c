"""SGLang's violation messages (docs/canary.md §6): the exact text, and the streaming parser.

Round trip: rows -> the exact message text -> parsed rows are identical, whatever logging
prefix precedes the lines, for negative hashes, write rows and unknown tags. Hostile logs
(huge lines, control characters, binary data) are counted or refused, never a crash.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcanary_cli.canary.constants import FailReason, has_token_check, is_write
from kvcanary_cli.canary.logs import (
    MAX_LINE_BYTES,
    LogScan,
    format_pump,
    format_violation,
    scan_log,
)
from kvcanary_cli.canary.ring_rows import RowOrigin
from kvcanary_cli.errors import PathError

I64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
KNOWN_BITS = st.sets(st.sampled_from([int(b) for b in FailReason])).map(sum)
ROW = st.tuples(
    st.one_of(st.integers(0, 11), I64),
    I64,
    I64,
    I64,
    I64,
    I64,
    I64,
    KNOWN_BITS,
).map(list)
PREFIXES = st.sampled_from(
    ["", "[2025-06-01 12:00:00 TP0] ", "2025-06-01T12:00:00Z stderr F ", "RuntimeError: "]
)

EXAMPLE = (
    (
        "kv_canary violation: launch_tag=TAIL_K_FULL fail_reason=verify_chain_hash+verify_position "
        "slot_idx=17 position=5 stored_token=1234 expected_token=-1 "
        "stored_chain_hash=0xcd6d3fc64ab68b75 expected_aux=0x2c33b2a133749990\n"
    )
    + """\
KV cache canary violation detected (kernel_kind=TAIL_K_FULL, slot_idx=17, position=5)
canary_kind:       per_forward_tail_k_full
  fail_reasons: verify_chain_hash verify_position
  stored:   token_id=1234   position=5 prev_hash=0xcd6d3fc64ab68b75
  expected: prev_hash=0x2c33b2a133749990
  total_violations=3 ring_overflow=False step_when_pumped=42"""
)


def scan_text(text: str) -> LogScan:
    return scan_log(io.BytesIO(text.encode()), "test.log")


def test_the_message_is_sglangs_text() -> None:
    row = [2, 17, 5, 1234, -1, 0xCD6D3FC64AB68B75 - (1 << 64), 0x2C33B2A133749990, 3]
    text = format_violation(row, total_violations=3, ring_overflow=False, step_when_pumped=42)
    assert text == EXAMPLE


def test_write_rows_print_the_position_in_decimal() -> None:
    row = [8, 9, 7, 55, 66, -2414019407054260458, 7, 24]
    lines = format_violation(row, total_violations=1, ring_overflow=True, step_when_pumped=0).split(
        "\n"
    )
    assert lines[0] == (
        "kv_canary violation: launch_tag=TAIL_K_SWA fail_reason=write_token+write_position "
        "slot_idx=9 position=7 stored_token=55 expected_token=66 "
        "stored_chain_hash=0xde7fae23a9a1b716 expected_aux=0x0000000000000007"
    )
    assert lines[4:7] == [
        "  actual:   token_id=55   position=7 prev_hash=0xde7fae23a9a1b716",
        "  expected: token_id=66   position=7",
        "  total_violations=1 ring_overflow=True step_when_pumped=0",
    ]


def test_unknown_tags_and_bits() -> None:
    row = [-3, 1, 2, 3, 4, 5, 6, 64 | 32]
    lines = format_violation(
        row, total_violations=1, ring_overflow=False, step_when_pumped=1
    ).split("\n")
    assert "launch_tag=unknown(-3) fail_reason=verify_token " in lines[0]
    assert lines[2] == "canary_kind:       unknown(-3)"
    assert lines[5] == "  expected: token_id=4 prev_hash=0x0000000000000006"


@given(st.lists(ROW, min_size=1, max_size=8), PREFIXES, st.booleans(), st.integers(0, 1 << 40))
@pytest.mark.slow
def test_round_trip(rows: list[list[int]], prefix: str, every_line: bool, step: int) -> None:
    messages = [
        format_violation(
            r, total_violations=len(rows) + i, ring_overflow=i % 2 == 1, step_when_pumped=step
        )
        for i, r in enumerate(rows)
    ]
    if every_line:  # a collector that prefixes every line (docker, journald)
        text = "".join(prefix + line + "\n" for m in messages for line in m.split("\n"))
    else:  # Python logging: the prefix before the first line of a message only
        text = "".join(f"{prefix}{m}\nsome other log line\n" for m in messages)
    scan = scan_text(text)
    assert scan.rows.fields.tolist() == rows
    assert scan.rows.origin.tolist() == [int(RowOrigin.LOG)] * len(rows)
    assert scan.rows.total_violations.tolist() == [len(rows) + i for i in range(len(rows))]
    assert scan.rows.ring_overflow.tolist() == [i % 2 for i in range(len(rows))]
    assert scan.rows.step_when_pumped.tolist() == [step] * len(rows)
    assert (scan.structured, scan.messages, scan.unparsed, scan.incomplete) == (
        len(rows),
        len(rows),
        0,
        0,
    )
    assert scan.inconsistent == 0


@given(st.lists(ROW, min_size=1, max_size=6))
def test_messages_without_their_structured_line_are_rebuilt(rows: list[list[int]]) -> None:
    text = "".join(
        "\n".join(
            format_violation(r, total_violations=9, ring_overflow=False, step_when_pumped=1).split(
                "\n"
            )[1:]
        )
        + "\n"
        for r in rows
    )
    scan = scan_text(text)
    want = [r if is_write(r[7]) or has_token_check(r[7]) else [*r[:4], -1, *r[5:]] for r in rows]
    assert scan.rows.fields.tolist() == want
    assert scan.rebuilt == len(rows) and scan.rows.origin.tolist() == [
        int(RowOrigin.LOG_MESSAGE)
    ] * len(rows)


def test_structured_lines_alone_are_rows() -> None:  # e.g. a grep of the log
    text = "\n".join(line for line in EXAMPLE.split("\n")[:1] * 3) + "\n"
    scan = scan_text(text)
    assert len(scan.rows) == 3 and scan.incomplete == 0 and scan.messages == 0
    assert scan.rows.total_violations.tolist() == [-1, -1, -1]


def test_a_message_cut_short_keeps_its_row() -> None:
    lines = EXAMPLE.split("\n")
    scan = scan_text("\n".join(lines[:3] + ["kv_canary violation: garbage"] + lines) + "\n")
    assert len(scan.rows) == 2 and scan.incomplete == 1 and scan.unparsed == 1


def test_inconsistent_messages_are_counted() -> None:
    scan = scan_text(EXAMPLE.replace("token_id=1234", "token_id=999"))
    assert len(scan.rows) == 1 and scan.inconsistent == 1 and scan.rows.fields[0, 3] == 1234


def test_garbage_is_counted_not_fatal() -> None:
    text = (
        "kv_canary violation: launch_tag=NOPE fail_reason=verify_position slot_idx=1 position=2 "
        "stored_token=3 expected_token=4 stored_chain_hash=0x0000000000000001 "
        "expected_aux=0x0000000000000002\n"
        "kv_canary violation: launch_tag=HEAD_K_FULL fail_reason=made_up slot_idx=1 position=2 "
        "stored_token=3 expected_token=4 stored_chain_hash=0x0000000000000001 "
        "expected_aux=0x0000000000000002\n"
        "kv_canary violation: launch_tag=HEAD_K_FULL fail_reason=none "
        "slot_idx=99999999999999999999 position=2 stored_token=3 expected_token=4 "
        "stored_chain_hash=0x0000000000000001 "
        "expected_aux=0x0000000000000002\n"
        "kv_canary_swa_divergence={not json}\n"
        'kv_canary_swa_divergence={"forward_ct":true}\n'
        "\x1b[31mplain colourful line\x1b[0m\n"
    )
    scan = scan_text(text)
    assert len(scan.rows) == 0 and scan.unparsed == 5 and scan.lines == 6
    assert scan.unparsed_lines == (1, 2, 3, 4, 5)


def test_swa_divergence_samples() -> None:
    text = (
        '[x] kv_canary_swa_divergence={"forward_ct":20,"verify_full":100,"verify_swa":40,'
        '"swa_full_idx_divergence":3,"swa_out_of_window_tokens":7}\n'
    )
    scan = scan_text(text * 2)
    assert scan.swa_divergence is not None
    assert scan.swa_divergence.samples.tolist() == [[20, 100, 40, 3, 7]] * 2
    assert scan.swa_divergence.lines.tolist() == [1, 2]


def test_over_long_lines_are_skipped_with_a_note() -> None:
    huge = "x" * (3 * MAX_LINE_BYTES) + EXAMPLE.split("\n")[0]
    text = huge + "\n" + EXAMPLE + "\n" + huge
    scan = scan_text(text)
    assert len(scan.rows) == 1 and scan.overlong == 2 and scan.overlong_lines == (1, 9)
    assert any("longer than" in note for note in scan.notes)


def test_blank_runs_in_a_reasons_line_are_read_in_one_pass() -> None:
    # `fail_reasons: x` + 65,000 blanks + `y` took 10 s (the pattern retried the blanks at
    # every character); the crowded fuzz class `crowded.long-log-lines` guards the time.
    lines = EXAMPLE.split("\n")
    trailing = lines[:3] + ["  fail_reasons: verify_chain_hash verify_position \t  "] + lines[4:]
    scan = scan_text("\n".join(trailing) + "\n")
    assert scan.messages == 1 and scan.inconsistent == 0
    blanks = lines[:3] + ["  fail_reasons: x" + " " * 65_000 + "y"]
    scan = scan_text("\n".join(blanks * 8) + "\n")
    assert len(scan.rows) == 8 and scan.incomplete == 8 and scan.overlong == 0


def test_binary_data_is_neither_a_dump_nor_a_log() -> None:
    with pytest.raises(PathError, match="neither a dump"):
        scan_log(io.BytesIO(b"\x7fELF\x00\x00" + b"\n" * 10), "a\nb")


def test_format_pump_logs_the_rows_not_yet_logged() -> None:
    ring = np.arange(4 * 8, dtype=np.int64).reshape(4, 8)
    ring[:, 0] = 2
    ring[:, 7] = 2
    messages = format_pump(ring, 6, step_when_pumped=5, already_logged=1)
    assert len(messages) == 3
    assert messages[0].endswith("total_violations=6 ring_overflow=True step_when_pumped=5")


def test_stdin_is_read_streaming(tmp_path: Path) -> None:
    script = (
        "import sys\nfrom kvcanary_cli.canary.logs import scan_log_path\n"
        "scan = scan_log_path('-')\nprint(len(scan.rows), scan.lines)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=(EXAMPLE + "\n") * 50,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["50", "350"]
