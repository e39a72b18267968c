"""The Markdown view of a block-pool timeline (`kvcanary.pool-timeline/1`)."""

from __future__ import annotations

from kvcanary_cli.render.markdown.blocks import text
from kvcanary_cli.render.phrases.pool_timeline import (
    block_line,
    snapshot_lines,
    step_line,
    timeline_verdict,
)
from kvcanary_cli.results.pool_timeline import PoolTimelineReport
from kvcanary_cli.safe_text import printable_record

__all__ = ["pool_timeline_markdown"]


def pool_timeline_markdown(report: PoolTimelineReport) -> str:
    """The verdict as a heading, the snapshots and the steps as lists."""
    report = printable_record(report)
    out = [f"## Timeline: {text(timeline_verdict(report))}", ""]
    out += [f"- {text(line)}" for line in snapshot_lines(report)]
    for step in report.steps:
        out.append(f"- {text(step_line(step))}")
        out += [f"  - {text(block_line(c))}" for c in step.blocks]
    return "\n".join(out) + "\n"
