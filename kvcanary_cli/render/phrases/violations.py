"""Violation reports in words, as `violations`' table and Markdown views say them: what each
source gave, a slot's cells, and the replay against the rows read."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcanary_cli.render.console import plural

if TYPE_CHECKING:  # the violations results hold numpy columns: `--help` does not import them
    from kvcanary_cli.results.cells import SlotProvenance
    from kvcanary_cli.results.violations import ReplayComparison, SourceSummary

__all__ = [
    "REPLAY_NOTE",
    "reasons_text",
    "replay_comparison_line",
    "slot_cells_text",
    "source_detail",
]

#: How to read a replay table: what each column counts.
REPLAY_NOTE = (
    "entries: verify entries planned; checked: entries verified; slot 0: entries skipped, "
    "their slot being 0; no chain check: entries checked without a chain check (prev slot "
    "0); real KV: zero (a HEAD buffer must hold 0), checked (a TAIL buffer, against the real "
    "KV fingerprint the dump records) or skipped (the dump records no real_kv.mode); `rows`: "
    "the violation rows the replay gives"
)


def reasons_text(reasons: tuple[str, ...]) -> str:
    """A row's fail reasons as both views show them: `chain_hash, position` (the `verify_`
    every label of SGLang's starts with, left out), or `none`."""
    return ", ".join(label.removeprefix("verify_") for label in reasons) or "none"


def source_detail(source: SourceSummary) -> str:
    """What a source gave: a ring's state, what the log parser met, or why neither."""
    ring = source.ring
    if ring is not None:
        detail = (
            f"ring: {ring.valid} of {ring.capacity} ring rows valid, write index {ring.write_index}"
        )
        return detail + (" (overflow)" if ring.overflow else "")
    log = source.log
    if log is not None:
        detail = (
            f"{plural(log.lines, 'line')}: {plural(log.structured, 'violation line')}, "
            f"{plural(log.messages, 'full message')}, {log.unparsed} unparsed"
        )
        if log.unread_violations:
            detail += f", {plural(log.unread_violations, 'violation')} unreadable (cut short?)"
        swa = log.swa_divergence
        if swa is not None:
            detail += (
                f"; {plural(swa.samples, 'SWA divergence sample')} (peak index divergence "
                f"{swa.peak_swa_full_idx_divergence}, out of window "
                f"{swa.peak_swa_out_of_window_tokens})"
            )
        return detail
    # neither read: the source says why (no ring in the dump, a file named twice)
    return source.notes[0] if source.notes else "no violation ring"


def slot_cells_text(prov: SlotProvenance) -> str:
    """A slot's first cells, condensed: `(pool row 9, pos 13) verify; +2 more`."""
    cells = [f"(pool row {c.pool_row}, pos {c.position}) {c.role}" for c in prov.cells[:3]]
    more = prov.cells_total - len(cells)
    if more > 0:
        cells.append(f"+{more} more")
    return "; ".join(cells) or "none"


def replay_comparison_line(comparison: ReplayComparison) -> str:
    """Replayed rows against the rows read, in words."""
    return (
        f"replay vs observed violation rows (as multisets): {comparison.matched} matched, "
        f"{comparison.observed_only} only observed, {comparison.replayed_only} only replayed"
    )
