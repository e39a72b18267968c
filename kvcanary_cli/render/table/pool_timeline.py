"""The terminal view of a block-pool timeline (`kvcanary.pool-timeline/1`)."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from kvcanary_cli.render.phrases.pool_timeline import (
    block_line,
    snapshot_lines,
    step_line,
    timeline_verdict,
)
from kvcanary_cli.results.pool_timeline import PoolTimelineReport
from kvcanary_cli.safe_text import printable_record

__all__ = ["pool_timeline_table"]


def pool_timeline_table(report: PoolTimelineReport) -> RenderableType:
    """The verdict, the snapshots, then each step with its changed blocks."""
    report = printable_record(report)
    lines = [timeline_verdict(report), *snapshot_lines(report)]
    for step in report.steps:
        lines.append(step_line(step))
        lines += [f"  {block_line(c)}" for c in step.blocks]
    return Text("\n".join(lines))
