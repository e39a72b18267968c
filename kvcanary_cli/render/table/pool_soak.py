"""The terminal view of a block-pool soak (`kvcanary.pool-soak/1`)."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from kvcanary_cli.render.phrases.pool_soak import (
    fault_line,
    history_lines,
    replay_line,
    soak_verdict,
)
from kvcanary_cli.results.pool_soak import PoolSoakReport
from kvcanary_cli.safe_text import printable_record

__all__ = ["pool_soak_table"]


def pool_soak_table(report: PoolSoakReport) -> RenderableType:
    """The verdict, then each history's lines."""
    report = printable_record(report)
    lines = [soak_verdict(report)]
    planted = fault_line(report)
    if planted is not None:
        lines.append(planted)
    for h in report.histories:
        lines += history_lines(h, report.engine)
    lines += [f"  {name}: {path}" for name, path in report.files.items()]
    replay = replay_line(report)
    if replay is not None:
        lines.append(replay)
    return Text("\n".join(lines))
