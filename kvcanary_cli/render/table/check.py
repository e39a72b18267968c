"""The terminal view of a check (the `kvcanary.check/2` record), and `--quiet`'s verdict lines.

Per dump: the verdict spelled out in words (the view reads the same without colour), identity,
diagnosis, groups, counts, and the findings under their causes.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvcanary_cli.catalog import Severity
from kvcanary_cli.render.console import plural
from kvcanary_cli.render.phrases.check import (
    FIRST_RAISE_MARK,
    CodeSection,
    cause_sections,
    code_cells,
    coverage_lines,
    differences_lines,
    failing_phrase,
    findings_per_count,
    legend,
    no_findings_phrase,
    severity_cells,
    severity_count,
    top_causes,
)
from kvcanary_cli.render.table.common import (
    FINDINGS_TABLE_WIDTH,
    SEVERITY_STYLE,
    ByWidth,
    cells,
    findings_view,
    identity_line,
    indented,
    shrunk_block,
)
from kvcanary_cli.render.table.common import cell as _t
from kvcanary_cli.render.table.pictures import FindingsMap, SlotAxis
from kvcanary_cli.results.check import CheckReport, DumpReport, GroupSummary, RequestSummary
from kvcanary_cli.safe_text import printable_record

__all__ = ["check_table", "verdict_lines"]

_VERDICT_STYLE = {
    "errors": "bold red",
    "warnings": "bold yellow",
    "clean": "bold green",
    "bad-input": "bold magenta",
}
_OVERALL_STYLE = {"findings": "bold red", "clean": "bold green", "bad-input": "bold magenta"}
_CONFIDENCE_STYLE = {"certain": "bold red", "likely": "bold yellow", "possible": "yellow"}


def _groups_view(groups: tuple[GroupSummary, ...]) -> RenderableType:
    """The groups table; where it has no room for the differences (80 columns), they follow
    it, one line per group."""
    differences = [differences_lines(g) for g in groups]
    lines = [
        (
            "-",
            Text(
                f"{g.group} differences: " + "; ".join(lines),
                style="bold red" if g.unexplained_differences or g.kernel_launch_error else "",
            ),
        )
        for g, lines in zip(groups, differences, strict=True)
    ]
    return ByWidth(
        wide=_groups_table(groups, differences),
        narrow=Group(_groups_table(groups, None), indented(lines)),
        min_width=FINDINGS_TABLE_WIDTH,
    )


def _groups_table(groups: tuple[GroupSummary, ...], differences: list[list[str]] | None) -> Table:
    """The groups, with each one's `differences` lines in a column (None: without it)."""
    with_differences = differences is not None
    table = Table(title="groups", title_justify="left")
    names = ["group", "window", "verify entries", "capacity", "enable", "kernel"]
    for name in [*names, "differences"] if with_differences else names:
        table.add_column(
            name,
            justify="right"
            if name in ("window", "verify entries", "capacity", "enable")
            else "left",
        )
    for i, g in enumerate(groups):
        style = "bold red" if g.unexplained_differences or g.kernel_launch_error else ""
        table.add_row(
            *cells(
                g.group,
                g.window,
                g.total_verify,
                g.verify_capacity,
                g.enable,
                g.kernel,
            ),
            *([Text("\n".join(differences[i]), style=style)] if differences is not None else []),
        )
    return table


def _counts_table(dump: DumpReport) -> Table:
    table = Table(title="findings by code", title_justify="left")
    for name in ("code", "severity", "group", "findings", "cells"):
        table.add_column(name, justify="right" if name in ("findings", "cells") else "left")
    for c, findings in zip(dump.counts, findings_per_count(dump), strict=True):
        style = SEVERITY_STYLE.get(c.severity, "")
        table.add_row(*cells(c.code, c.severity, style=style), *cells(c.group, findings, c.count))
    return table


def _code_blocks(sections: list[CodeSection]) -> list[RenderableType]:
    parts: list[RenderableType] = []
    for section in sections:
        style = SEVERITY_STYLE.get(section.severity, "")
        parts.append(
            Text(
                f"{section.code} ({section.severity}): {section.size}",
                style=f"bold {style}".strip(),
            )
        )
        if section.shown:
            parts.append(findings_view(section.shown))
        if section.total > len(section.shown):
            parts.append(Text(f"… and {section.total - len(section.shown)} more (--max-rows)"))
    return parts


def _findings_blocks(dump: DumpReport, max_rows: int) -> list[RenderableType]:
    """Symptoms under their causes, in diagnosis order."""
    parts: list[RenderableType] = []
    for number, block in enumerate(cause_sections(dump, max_rows), 1):
        title = (
            "findings no cause explains"
            if block.cause is None
            else f"cause {number}: {block.cause.cause} ({block.cause.confidence})"
        )
        parts.append(Text(f"── {title}", style="bold"))
        parts.extend(_code_blocks(block.sections))
    return parts


def _diagnosis_blocks(dump: DumpReport) -> list[RenderableType]:
    """The causes, most likely first: what went wrong, the evidence, the fix."""
    if not dump.diagnosis:
        return []
    parts: list[RenderableType] = [Text("diagnosis", style="bold")]
    for number, cause in enumerate(top_causes(dump), 1):
        style = _CONFIDENCE_STYLE.get(cause.confidence, "")
        head = Text(f"{cause.cause} ({cause.confidence})", style=style)
        head.append(f": {cause.headline or cause.summary}", style="")
        parts.append(indented([(f"{number}.", head)]))
        rows = [("-", Text(cause.summary))] if cause.headline else []
        rows += [("-", Text(fact)) for fact in cause.evidence]
        explains = code_cells(cause.explains)
        if explains:
            rows.append(("-", Text(f"explains {explains}")))
        rows.extend(("-", Text(line)) for line in cause.also_shows)
        rows.append(("-", Text(f"fix: {cause.fix}", style="bold")))
        if cause.next_command:
            rows.append(("-", Text(f"next: {cause.next_command}")))
        parts.append(indented(rows, indent=5))
    return parts


def _raise_blocks(dump: DumpReport) -> list[RenderableType]:
    """Where SGLang's reference raises first, and whether the dump's recorded error agrees."""
    rows: list[tuple[str, Text]] = []
    raised = dump.first_raise
    if raised is not None:
        rows.append(
            (
                "",
                Text(
                    f"SGLang's reference raises first in group {raised.group} at batch "
                    f"row {raised.batch_row}, position {raised.position} "
                    f"({raised.code}, marked '{FIRST_RAISE_MARK}' below): "
                    f"{raised.exception_type}: {raised.message}"
                ),
            )
        )
    recorded = dump.recorded_exception
    if recorded is not None and dump.recorded_exception_matches:
        rows.append(
            ("", Text(f"the dump's note records the same exception: {recorded}", style="green"))
        )
    elif recorded is not None:
        rows.append(
            (
                "",
                Text(
                    f"MISMATCH: the dump's note records {recorded!r}, but kvcanary's reference "
                    + ("raises something else first (above)" if raised else "does not raise at all")
                    + ": the dump may not be the state that failed, or kvcanary's model of SGLang "
                    "differs from the version that ran",
                    style="bold red",
                ),
            )
        )
    for a in dump.assumptions:
        decides = code_cells(a.decides)
        rows.append(
            (
                "",
                Text(
                    f"assumption: {a.scalar} = {a.value} ({a.source}) is not recorded; "
                    f"{decides} rest on it and are reported as info: {a.advice}",
                    style="yellow",
                ),
            )
        )
    return [indented(rows)] if rows else []


def _requests_table(requests: tuple[RequestSummary, ...]) -> Table:
    table = Table(title="requests with findings", title_justify="left")
    for name in ("batch row", "pool row", "P", "E", "first bad pos"):
        table.add_column(name, justify="right")
    table.add_column("cells with findings")
    for r in requests:
        counts = code_cells(r.counts)
        table.add_row(
            *cells(
                r.batch_row,
                r.pool_row,
                r.prefix_len,
                r.extend_len,
                r.first_bad_position,
                counts,
            )
        )
    return table


def _dump_blocks(
    dump: DumpReport, fail_on: str, max_rows: int, errors_on_stderr: bool
) -> list[RenderableType]:
    verdict = _verdict_text(dump, fail_on)
    if dump.error is not None and errors_on_stderr:  # the reason is said once, on stderr
        verdict.append("  (unreadable: the error line on stderr says why)")
    parts: list[RenderableType] = [verdict]
    if dump.identity or dump.error is None:
        parts.append(identity_line(dump.identity))
    if dump.error is not None:
        if not errors_on_stderr:
            parts.append(Text(f"  bad input: {dump.error}", style="magenta"))
    else:
        facts = [f"bs {dump.bs}"]
        if dump.kernel_mode:
            facts.append(f"kernel mode {dump.kernel_mode}")
        parts.append(Text("  " + " · ".join(facts)))
    if dump.shrunk is not None:
        parts.append(shrunk_block(dump.shrunk))
    if dump.notes:
        parts.append(indented([("", Text(f"note: {note}", style="dim")) for note in dump.notes]))
    covered = coverage_lines(dump)
    if covered:
        styles = ("", "yellow")  # what did not run stands out: the verdict does not cover it
        parts.append(
            indented(
                [
                    ("", Text(line, style=style))
                    for line, style in zip(covered, styles, strict=False)
                ]
            )
        )
    parts.extend(_diagnosis_blocks(dump))
    parts.extend(_raise_blocks(dump))
    if dump.groups:
        parts.append(_groups_view(dump.groups))
    if dump.counts:
        parts.append(_counts_table(dump))
        if len(dump.requests) >= 2:
            parts.append(_requests_table(dump.requests[:max_rows]))
            if len(dump.requests) > max_rows:
                more = plural(len(dump.requests) - max_rows, "more request")
                parts.append(Text(f"… and {more} with findings (--max-rows)"))
        for picture in (FindingsMap(dump, max_rows), SlotAxis(dump)):
            if picture.drawn:
                parts.append(picture)
        parts.extend(_findings_blocks(dump, max_rows))
    elif dump.error is None:
        parts.append(Text(f"  {no_findings_phrase(dump)}", style="green"))
    return parts


def _summary_table(report: CheckReport, errors_on_stderr: bool) -> Table:
    table = Table(title="summary", title_justify="left")
    names = ["dump", "verdict", "bs", "findings", "error cells", "warning cells"]
    for name in names if errors_on_stderr else [*names, "error"]:
        table.add_column(name, justify="left" if name in ("dump", "verdict", "error") else "right")
    for d in report.dumps:
        errors = severity_count(d.counts, Severity.ERROR)
        warnings = severity_count(d.counts, Severity.WARNING)
        table.add_row(
            _t(d.path),
            _t(d.verdict, _VERDICT_STYLE.get(d.verdict, "")),
            *cells(
                d.bs,
                d.findings_total,
                errors,
                warnings,
                *([] if errors_on_stderr else [d.error]),
            ),
        )
    return table


def verdict_lines(report: CheckReport) -> str:
    """`--quiet`: the verdict line of each dump (and the overall one for several), as text."""
    report = printable_record(report)
    lines = [_verdict_text(dump, report.fail_on).plain for dump in report.dumps]
    if len(report.dumps) >= 2:
        lines.append(failing_phrase(report.summary, report.fail_on))
    return "\n".join(lines) + "\n"


def _verdict_text(dump: DumpReport, fail_on: str) -> Text:
    verdict = dump.verdict
    head = Text(
        f"{verdict.upper().replace('-', ' ')}: {dump.path}",
        style=_VERDICT_STYLE.get(verdict, "bold"),
    )
    if dump.error is None:
        head.append(
            f"  ({severity_cells(dump.counts, dump.findings_total)}; "
            f"{'fails' if dump.fails else 'passes'} --fail-on {fail_on})"
        )
    return head


def check_table(
    report: CheckReport, *, max_rows: int = 10, errors_on_stderr: bool = False
) -> RenderableType:
    """Per dump: verdict, identity, groups, counts, then per code the first `max_rows` findings.

    A summary of all dumps follows when there are two or more. `errors_on_stderr`: the
    unreadable dumps' error lines go to the same terminal (`check` prints them on stderr),
    so the view names those dumps without repeating why.
    """
    report = printable_record(report)
    parts: list[RenderableType] = []
    if report.sglang_installed:
        parts.append(Text(f"SGLang installed here: {report.sglang_installed}", style="dim"))
    for i, dump in enumerate(report.dumps):
        if i:
            parts.append(Text(""))
        parts.extend(_dump_blocks(dump, report.fail_on, max_rows, errors_on_stderr))
    if len(report.dumps) >= 2:
        parts.append(Text(""))
        parts.append(_summary_table(report, errors_on_stderr))
        s = report.summary
        parts.append(
            Text(
                failing_phrase(s, report.fail_on),
                style=_OVERALL_STYLE.get(report.verdict, "bold"),
            )
        )
    paragraphs = legend(report.dumps)  # once per run, after every dump: not after each table
    if paragraphs:
        parts.append(Text(""))
        parts.extend(Text(paragraph, style="dim") for paragraph in paragraphs)
    if not parts:
        parts.append(Text("no dumps checked"))
    return Group(*parts)
