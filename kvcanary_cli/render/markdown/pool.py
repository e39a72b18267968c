"""The Markdown views of a block-pool check and of one block's provenance."""

from __future__ import annotations

from kvcanary_cli.render.phrases.pool import (
    dump_header,
    finding_lines,
    provenance_lines,
    verdict_line,
)
from kvcanary_cli.results.pool import PoolCheckReport, PoolProvenance
from kvcanary_cli.safe_text import printable_record

__all__ = ["pool_check_markdown", "pool_provenance_markdown"]


def _code(text: str) -> str:
    return text.replace("`", "'")


def pool_check_markdown(report: PoolCheckReport, *, max_rows: int) -> str:
    """Per dump: a heading with its verdict, the pool, the causes and the findings."""
    report = printable_record(report)
    out = ["# kvcanary check (block pools)", ""]
    for d in report.dumps:
        out += [f"## {_code(verdict_line(d))}", ""]
        if d.error is not None:
            continue
        out += [f"- {_code(line)}" for line in dump_header(d)] + [""]
        if d.diagnosis:
            out += ["### Diagnosis", ""]
            out += [f"- **{c.cause}**: {_code(c.story)} — fix: {c.fix}" for c in d.diagnosis]
            out.append("")
            out += ["### Findings", ""]
        for f in d.findings[:max_rows]:
            first, *rest = finding_lines(f, max_rows)
            out.append(f"- `{_code(first)}`")
            out += [f"  - {_code(line)}" for line in rest]
        if len(d.findings) > max_rows:
            out.append(f"- … {len(d.findings) - max_rows} more findings (JSON has all)")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def pool_provenance_markdown(p: PoolProvenance, *, max_rows: int) -> str:
    """One block's story as a list."""
    first, *rest = provenance_lines(printable_record(p), max_rows)
    lines = [f"# {_code(first)}", ""] + [f"- {_code(line.strip())}" for line in rest]
    return "\n".join(lines) + "\n"
