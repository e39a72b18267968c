"""A shrunk dump in words, as every view says it: where it came from, what it dropped per
tensor, and the command that made it (a check or provenance report on it, and `inspect`)."""

from __future__ import annotations

from kvcanary_cli.render.console import fmt_bytes
from kvcanary_cli.results.shrink import ShrinkSummary, Shrunk

__all__ = ["CUT_COLUMNS", "cut_rows", "shrink_facts", "shrunk_lines"]

#: The columns of a shrunk dump's cut table.
CUT_COLUMNS = ["tensor", "original shape", "kept", "dropped", "dropped bytes", "table rows kept"]


def shrunk_lines(shrunk: Shrunk) -> list[str]:
    """A shrunk dump's facts in words: where it came from, what it dropped, how to redo it."""
    source = shrunk.source
    return [
        f"shrunk from {shrunk.source_file} ({source.bytes:,} bytes, sha256 "
        f"{source.sha256[:16]}…): {shrunk.dropped_bytes:,} bytes of tensor data dropped",
        shrunk.note,
    ]


def cut_rows(shrink: ShrinkSummary) -> list[list[str]]:
    """Per tensor the shrink cut: original shape, kept, dropped, bytes dropped, rows kept."""
    return [
        [
            t.name,
            "x".join(map(str, t.shape)) or "[]",
            f"{t.kept:,}",
            f"{t.dropped:,}",
            fmt_bytes(t.dropped_bytes),
            "-" if t.rows is None else f"{t.kept_rows:,} of {t.rows:,}",
        ]
        for t in shrink.tensors
    ]


def shrink_facts(shrink: ShrinkSummary) -> list[str]:
    """Where a shrunk dump came from, what it dropped and the command that made it."""
    source = shrink.source
    return [
        f"shrunk from {shrink.source_file}: {source.bytes:,} bytes, sha256 {source.sha256}",
        f"{fmt_bytes(shrink.dropped_bytes)} of tensor data dropped; reports on this dump "
        "cover the kept cells only",
        f"made with: {shrink.command}",
    ]
