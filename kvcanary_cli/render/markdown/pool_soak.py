"""The Markdown view of a block-pool soak (`kvcanary.pool-soak/1`)."""

from __future__ import annotations

from kvcanary_cli.render.markdown.blocks import code, text
from kvcanary_cli.render.phrases.pool_soak import (
    fault_line,
    history_lines,
    replay_line,
    soak_verdict,
)
from kvcanary_cli.results.pool_soak import PoolSoakReport
from kvcanary_cli.safe_text import printable_record

__all__ = ["pool_soak_markdown"]


def pool_soak_markdown(report: PoolSoakReport) -> str:
    """The verdict as a heading, each history as a list."""
    report = printable_record(report)
    out = [f"## Soak: {soak_verdict(report)}", ""]
    planted = fault_line(report)
    if planted is not None:
        out += [text(planted), ""]
    for h in report.histories:
        first, *rest = history_lines(h, report.engine)
        out.append(f"- {first}")
        out += [f"  - {line.strip()}" for line in rest]
    out += [f"- {text(name)}: {code(path, cell=False)}" for name, path in report.files.items()]
    replay = replay_line(report)
    if replay is not None:
        out.append(f"- {text(replay)}")
    return "\n".join(out) + "\n"
