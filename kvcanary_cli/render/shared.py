"""The few words every view says alike: a count with its noun, a cell's value, a byte count.

What a view says about its own command lives in `render.phrases`, one module per topic.
"""

from __future__ import annotations

__all__ = ["fmt_bytes", "plural", "shown"]


def plural(count: int, word: str) -> str:
    """`1 finding`, `2 findings`."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def shown(value: object) -> str:
    """A value as a cell shows it: `-` for None."""
    return "-" if value is None else str(value)


def fmt_bytes(count: int) -> str:
    """A byte count for people: `512 B`, `1.5 KiB`, ..., up to GiB."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(count)
