"""Rendering: pure functions from reports to rich renderables or strings (no printing).

`render_check`, `render_provenance`, `render_inspect`, `render_plan`, `render_selftest` and
`render_violations`
pick the view for an `OutputFormat`. A `str` result (JSON, Markdown) is written verbatim; a
renderable goes through a console (see `emit`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, assert_never

from rich.console import RenderableType

from kvcanary_cli.analysis.model import CheckReport, ProvenanceReport
from kvcanary_cli.render.console import OutputFormat, emit, make_console, to_json
from kvcanary_cli.render.inspect_view import inspect_markdown, inspect_table
from kvcanary_cli.render.json_report import check_json, provenance_json
from kvcanary_cli.render.markdown_report import check_markdown, provenance_markdown
from kvcanary_cli.render.plan_view import plan_markdown, plan_table
from kvcanary_cli.render.records import Record, provenance_record, to_record
from kvcanary_cli.render.selftest_view import selftest_markdown, selftest_table
from kvcanary_cli.render.table import check_table, provenance_table, verdict_lines

if TYPE_CHECKING:  # the violations view needs numpy: imported when used, not by --help
    from kvcanary_cli.analysis.violations.report import ViolationsReport

__all__ = [
    "OutputFormat",
    "emit",
    "make_console",
    "render_check",
    "render_inspect",
    "render_plan",
    "render_provenance",
    "render_selftest",
    "render_violations",
    "to_json",
]


def render_check(
    report: CheckReport, fmt: OutputFormat, *, max_rows: int = 10, quiet: bool = False
) -> str | RenderableType:
    """A check report in `fmt` (or, `quiet`, only the verdict lines, whatever `fmt`).

    JSON carries every finding; table and Markdown show the first `max_rows` findings per code
    and count the rest.
    """
    if quiet:
        return verdict_lines(report)
    match fmt:
        case OutputFormat.TABLE:
            return check_table(report, max_rows=max_rows)
        case OutputFormat.JSON:
            return check_json(report)
        case OutputFormat.MARKDOWN:
            return check_markdown(to_record(report), max_rows=max_rows)
        case _:
            assert_never(fmt)


def render_provenance(report: ProvenanceReport, fmt: OutputFormat) -> str | RenderableType:
    """A provenance answer (one slot, or one pool row) in `fmt`."""
    match fmt:
        case OutputFormat.TABLE:
            return provenance_table(report)
        case OutputFormat.JSON:
            return provenance_json(report)
        case OutputFormat.MARKDOWN:
            return provenance_markdown(provenance_record(report))
        case _:
            assert_never(fmt)


def render_inspect(record: Record, fmt: OutputFormat) -> str | RenderableType:
    """A `kvcanary.inspect/2` record (what a dump holds) in `fmt`."""
    match fmt:
        case OutputFormat.TABLE:
            return inspect_table(record)
        case OutputFormat.JSON:
            return to_json(record)
        case OutputFormat.MARKDOWN:
            return inspect_markdown(record)
        case _:
            assert_never(fmt)


def render_plan(record: Record, fmt: OutputFormat, *, max_rows: int = 50) -> str | RenderableType:
    """A `kvcanary.plan/1` record (one planner's plan, per request) in `fmt`.

    JSON carries every request; table and Markdown show the first `max_rows`.
    """
    match fmt:
        case OutputFormat.TABLE:
            return plan_table(record, max_rows=max_rows)
        case OutputFormat.JSON:
            return to_json(record)
        case OutputFormat.MARKDOWN:
            return plan_markdown(record, max_rows=max_rows)
        case _:
            assert_never(fmt)


def render_selftest(record: Record, fmt: OutputFormat) -> str | RenderableType:
    """A `kvcanary.selftest/1` record (the drift report) in `fmt`."""
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
    """A `kvcanary.violations/1` record (violation rows, replay, diagnoses) in `fmt`.

    JSON carries every row; table and Markdown show the first `max_rows`.
    """
    from kvcanary_cli.render.violations_view import (
        violations_markdown,
        violations_record,
        violations_table,
    )

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
