"""The terminal views of a block-pool check (`kvcanary.pool-check/1`) and of one block's
provenance (`kvcanary.pool-provenance/1`)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from kvcanary_cli.render.phrases.pool import (
    check_lines,
    dump_header,
    finding_lines,
    provenance_lines,
    verdict_line,
)
from kvcanary_cli.results.pool import PoolCheckReport, PoolProvenance
from kvcanary_cli.safe_text import printable_record

__all__ = ["pool_check_table", "pool_provenance_table", "pool_verdict_lines"]


def pool_verdict_lines(report: PoolCheckReport) -> RenderableType:
    """One verdict line per dump (`check --quiet`)."""
    return Text("\n".join(check_lines(printable_record(report))))


def pool_check_table(report: PoolCheckReport, *, max_rows: int) -> RenderableType:
    """Per dump: its verdict, the pool's shape, the diagnosis (story and fix per fault), then
    each finding with its blocks and holders."""
    report = printable_record(report)
    parts: list[RenderableType] = []
    for d in report.dumps:
        bad = d.error is not None or bool(d.findings)
        parts.append(Text(verdict_line(d), style="bold red" if bad else "bold green"))
        if d.error is not None:
            continue
        parts += [Text("  " + line) for line in dump_header(d)]
        for c in d.diagnosis:
            parts.append(Text(f"  cause {c.cause}: {c.story}", style="bold"))
            parts.append(Text(f"    fix: {c.fix}"))
        for f in d.findings[:max_rows]:
            first, *rest = finding_lines(f, max_rows)
            parts.append(Text("  " + first, style="red"))
            parts += [Text("    " + line) for line in rest]
        if len(d.findings) > max_rows:
            parts.append(Text(f"  … {len(d.findings) - max_rows} more findings (JSON has all)"))
    return Group(*parts)


def pool_provenance_table(p: PoolProvenance, *, max_rows: int) -> RenderableType:
    """One block's story, a line a fact."""
    first, *rest = provenance_lines(printable_record(p), max_rows)
    return Group(Text(first, style="bold"), *(Text(line) for line in rest))
