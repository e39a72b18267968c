"""Hostile values of the capture's budget and trigger counts, as an operator's environment
might hold them: each must close what it configures, never fall back to a default."""

from __future__ import annotations

__all__ = ["HOSTILE_BYTE_COUNTS", "HOSTILE_COUNTS", "READABLE_BYTE_COUNTS"]

#: Values `KVCANARY_DUMP_LIMIT` and the `..._EVERY` counts must refuse: fractions, exponents,
#: other bases, signs, words, separators, digits of other scripts that `int()` reads, lengths
#: `int()` refuses, control characters (an environment holds no NUL).
HOSTILE_COUNTS = (
    "1.0",
    "1e2",
    "0x10",
    "0b11",
    "0o7",
    "-1",
    "-0",
    "+3",
    "one",
    "four dumps",
    "1_000",
    "1 000",
    "4,",
    "\u0663",  # ARABIC-INDIC DIGIT THREE: int() reads it as 3
    "\uff14",  # FULLWIDTH DIGIT FOUR
    "inf",
    "nan",
    "9" * 19,  # past the 18 digits a count may have
    "9" * 5000,  # past int()'s default digit limit
    "4\x1b[0m",
    "4\n5",
)

#: Values `KVCANARY_DUMP_MAX_BYTES` must refuse.
HOSTILE_BYTE_COUNTS = (
    "0.5K",
    "1e2",
    "1E9",
    "0x10",
    "-5",
    "-5G",
    "+5G",
    "16 G",
    "16GiBB",
    "16iB",
    "G",
    "KiB",
    "16P",
    "1_000",
    "\u0663M",
    "inf",
    "9" * 19 + "G",
    "9" * 5000,
    "16G\x1b[0m",
)

#: Values it reads, with the bytes they mean (case does not matter).
READABLE_BYTE_COUNTS = (
    ("0", 0),
    ("4096", 4096),
    ("4096b", 4096),
    ("2KiB", 2048),
    ("2kib", 2048),
    ("512M", 512 << 20),
    ("16GB", 16 << 30),
    (" 16G ", 16 << 30),
    ("1T", 1 << 40),
)
