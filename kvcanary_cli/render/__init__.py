"""Rendering: pure functions from a command's typed result to rich renderables or strings (no
printing), organised by format.

`render_check`, `render_provenance`, `render_violations`, `render_inspect`, `render_plan`,
`render_selftest`, `render_timeline` and `render_soak` build the command's record once
(`render.records`, one module per command) and hand it to the view `fmt` asks for:
`render.json`, `render.table` or `render.markdown`.
The views only read records. A `str` result (JSON, Markdown) is written verbatim; a
renderable goes through a console (see `emit`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, assert_never

from rich.console import RenderableType

from kvcanary_cli.render.console import OutputFormat, emit, make_console
from kvcanary_cli.render.json import to_json
from kvcanary_cli.render.markdown.check import check_markdown
from kvcanary_cli.render.markdown.inspect import inspect_markdown
from kvcanary_cli.render.markdown.plan import plan_markdown
from kvcanary_cli.render.markdown.provenance import provenance_markdown
from kvcanary_cli.render.markdown.selftest import selftest_markdown
from kvcanary_cli.render.markdown.soak import soak_markdown
from kvcanary_cli.render.markdown.timeline import timeline_markdown
from kvcanary_cli.render.markdown.violations import violations_markdown
from kvcanary_cli.render.records.check import check_record
from kvcanary_cli.render.records.inspect import inspect_record
from kvcanary_cli.render.records.plan import plan_record
from kvcanary_cli.render.records.provenance import provenance_record
from kvcanary_cli.render.records.selftest import selftest_record
from kvcanary_cli.render.records.soak import soak_record
from kvcanary_cli.render.records.timeline import timeline_record
from kvcanary_cli.render.table.check import check_table, verdict_lines
from kvcanary_cli.render.table.inspect import inspect_table
from kvcanary_cli.render.table.plan import plan_table
from kvcanary_cli.render.table.provenance import provenance_table
from kvcanary_cli.render.table.selftest import selftest_table
from kvcanary_cli.render.table.soak import soak_table
from kvcanary_cli.render.table.timeline import timeline_table
from kvcanary_cli.render.table.violations import violations_table
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.results.provenance import ProvenanceReport
from kvcanary_cli.results.soak import SoakReport
from kvcanary_cli.results.timeline import TimelineReport

# These results' modules compute with numpy (and the violations record is built with it):
# imported when used, not by `kvcanary --help`.
if TYPE_CHECKING:
    from kvcanary_cli.results.inspect import DumpDescription
    from kvcanary_cli.results.plan import PlanSummary
    from kvcanary_cli.results.selftest import SelftestReport
    from kvcanary_cli.results.violations import ViolationsReport

__all__ = [
    "OutputFormat",
    "emit",
    "make_console",
    "render_check",
    "render_inspect",
    "render_plan",
    "render_provenance",
    "render_selftest",
    "render_soak",
    "render_timeline",
    "render_violations",
    "to_json",
]


def render_check(
    report: CheckReport,
    fmt: OutputFormat,
    *,
    max_rows: int = 10,
    quiet: bool = False,
    to_stdout: bool = False,
) -> str | RenderableType:
    """A check report in `fmt` (or, `quiet`, only the verdict lines, whatever `fmt`).

    JSON carries every finding; table and Markdown show the first `max_rows` findings per code
    and count the rest. `to_stdout`: the view goes where `check`'s error lines on stderr
    are read too, so the table does not repeat why a dump is unreadable (a file keeps it).
    """
    if quiet:  # counts only: no record per finding, whatever the number of cells
        return verdict_lines(check_record(report, findings=False))
    record = check_record(report)
    match fmt:
        case OutputFormat.TABLE:
            return check_table(record, max_rows=max_rows, errors_on_stderr=to_stdout)
        case OutputFormat.JSON:
            return to_json(record)
        case OutputFormat.MARKDOWN:
            return check_markdown(record, max_rows=max_rows)
        case _:
            assert_never(fmt)


def render_provenance(
    report: ProvenanceReport, fmt: OutputFormat, *, max_rows: int = 256
) -> str | RenderableType:
    """A provenance answer (one slot, or one pool row) in `fmt`.

    JSON carries every finding touching it; table and Markdown show the first `max_rows`.
    """
    record = provenance_record(report)
    match fmt:
        case OutputFormat.TABLE:
            return provenance_table(record, max_rows=max_rows)
        case OutputFormat.JSON:
            return to_json(record)
        case OutputFormat.MARKDOWN:
            return provenance_markdown(record, max_rows=max_rows)
        case _:
            assert_never(fmt)


def render_inspect(description: DumpDescription, fmt: OutputFormat) -> str | RenderableType:
    """What a dump holds (the `kvcanary.inspect/2` record) in `fmt`."""
    record = inspect_record(description)
    match fmt:
        case OutputFormat.TABLE:
            return inspect_table(record)
        case OutputFormat.JSON:
            return to_json(record)
        case OutputFormat.MARKDOWN:
            return inspect_markdown(record)
        case _:
            assert_never(fmt)


def render_plan(
    summary: PlanSummary, fmt: OutputFormat, *, max_rows: int = 50
) -> str | RenderableType:
    """One planner's plan, per request (the `kvcanary.plan/1` record) in `fmt`.

    JSON carries every request; table and Markdown show the first `max_rows`.
    """
    record = plan_record(summary)
    match fmt:
        case OutputFormat.TABLE:
            return plan_table(record, max_rows=max_rows)
        case OutputFormat.JSON:
            return to_json(record)
        case OutputFormat.MARKDOWN:
            return plan_markdown(record, max_rows=max_rows)
        case _:
            assert_never(fmt)


def render_selftest(report: SelftestReport, fmt: OutputFormat) -> str | RenderableType:
    """The drift report (the `kvcanary.selftest/1` record) in `fmt`."""
    record = selftest_record(report)
    match fmt:
        case OutputFormat.TABLE:
            return selftest_table(record)
        case OutputFormat.JSON:
            return to_json(record)
        case OutputFormat.MARKDOWN:
            return selftest_markdown(record)
        case _:
            assert_never(fmt)


def render_violations(
    report: ViolationsReport, fmt: OutputFormat, *, max_rows: int = 20
) -> str | RenderableType:
    """Violation rows, replay and diagnoses (the `kvcanary.violations/1` record) in `fmt`.

    JSON carries every row; table and Markdown show the first `max_rows` (and only those get a
    record each).
    """
    from kvcanary_cli.render.records.violations import violations_record

    match fmt:
        case OutputFormat.TABLE:
            return violations_table(violations_record(report, max_rows=max_rows), max_rows=max_rows)
        case OutputFormat.JSON:
            return to_json(violations_record(report))
        case OutputFormat.MARKDOWN:
            return violations_markdown(
                violations_record(report, max_rows=max_rows), max_rows=max_rows
            )
        case _:
            assert_never(fmt)


def render_timeline(
    report: TimelineReport, fmt: OutputFormat, max_rows: int = 10
) -> str | RenderableType:
    """What changed between dumps of one rank (the `kvcanary.timeline/1` record) in `fmt`.

    JSON carries every event cell and owner change; table and Markdown show the first few of
    each event and, for one interval (`diff`), the first `max_rows` owner changes."""
    record = timeline_record(report)
    match fmt:
        case OutputFormat.TABLE:
            return timeline_table(record, max_rows=max_rows)
        case OutputFormat.JSON:
            return to_json(record)
        case OutputFormat.MARKDOWN:
            return timeline_markdown(record, max_rows=max_rows)
        case _:
            assert_never(fmt)


def render_soak(report: SoakReport, fmt: OutputFormat) -> str:
    """What a soak ran and found (the `kvcanary.soak/1` record) in `fmt`."""
    record = soak_record(report)
    match fmt:
        case OutputFormat.TABLE:
            return soak_table(record)
        case OutputFormat.JSON:
            return to_json(record)
        case OutputFormat.MARKDOWN:
            return soak_markdown(record)
        case _:
            assert_never(fmt)
