"""Rendering: pure functions from a command's typed result to rich renderables or strings (no
printing), organised by format.

`render(result, fmt)` is the one entry: it reads the result's `SCHEMA` and hands the result to
the view `fmt` asks for. JSON is the result's record (`results.record.to_record`) for every
command; `render.table` and `render.markdown` hold one view module per command, imported when
used (`kvcanary --help` loads none of them). A `str` result (JSON, Markdown) is written
verbatim, a streamed `JsonText` too, a piece at a time; a renderable goes through a console
(see `emit`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, assert_never

from rich.console import RenderableType

from kvcanary_cli.render.console import OutputFormat, emit, make_console
from kvcanary_cli.render.json import JsonText, to_json

if TYPE_CHECKING:
    from kvcanary_cli.results.record import Result

__all__ = [
    "DEFAULT_MAX_ROWS",
    "JsonText",
    "OutputFormat",
    "emit",
    "make_console",
    "render",
    "to_json",
]

#: Rows a table or Markdown view shows of each list before it counts the rest.
DEFAULT_MAX_ROWS = 20


def render(
    result: Result,
    fmt: OutputFormat,
    *,
    max_rows: int = DEFAULT_MAX_ROWS,
    quiet: bool = False,
    to_stdout: bool = False,
    streamed: bool = False,
) -> str | JsonText | RenderableType:
    """A command's result in `fmt`, chosen by the result's `SCHEMA`.

    JSON carries everything (`streamed`: as a `JsonText`, the record made into text as it is
    written, never held whole; `str(view)` is the text); table and Markdown show the first
    `max_rows` of each list and count the rest. For a check, `quiet` keeps only the verdict
    lines (whatever `fmt`), and `to_stdout` says the view goes where `check`'s error lines on
    stderr are read too, so the table and Markdown do not repeat why a dump is unreadable (a
    file keeps it).
    """
    schema = result.SCHEMA.split("/")[0].removeprefix("kvcanary.")
    table: Any
    markdown: Any
    rows = {"max_rows": max_rows}
    match schema:
        case "check":
            from kvcanary_cli.render.markdown.check import check_markdown
            from kvcanary_cli.render.table.check import check_table, verdict_lines

            if quiet:  # counts only: no finding read, whatever the number of cells
                return verdict_lines(result)  # type: ignore[arg-type]

            def table(r: Any, **kw: Any) -> RenderableType:
                return check_table(r, errors_on_stderr=to_stdout, **kw)

            def markdown(r: Any, **kw: Any) -> str:
                return check_markdown(r, errors_on_stderr=to_stdout, **kw)
        case "pool-check":
            from kvcanary_cli.render.markdown.pool import pool_check_markdown as markdown
            from kvcanary_cli.render.table.pool import pool_check_table as table
            from kvcanary_cli.render.table.pool import pool_verdict_lines

            if quiet:
                return pool_verdict_lines(result)  # type: ignore[arg-type]
        case "pool-inspect":
            from kvcanary_cli.render.markdown.pool_inspect import (
                pool_inspect_markdown as markdown,
            )
            from kvcanary_cli.render.table.pool_inspect import pool_inspect_table as table
        case "pool-provenance":
            from kvcanary_cli.render.markdown.pool import pool_provenance_markdown as markdown
            from kvcanary_cli.render.table.pool import pool_provenance_table as table
        case "provenance":
            from kvcanary_cli.render.markdown.provenance import provenance_markdown as markdown
            from kvcanary_cli.render.table.provenance import provenance_table as table
        case "violations":
            from kvcanary_cli.render.markdown.violations import violations_markdown as markdown
            from kvcanary_cli.render.table.violations import violations_table as table
        case "timeline":
            from kvcanary_cli.render.markdown.timeline import timeline_markdown as markdown
            from kvcanary_cli.render.table.timeline import timeline_table as table
        case "inspect":
            from kvcanary_cli.render.markdown.inspect import inspect_markdown as markdown
            from kvcanary_cli.render.table.inspect import inspect_table as table
        case "plan":
            from kvcanary_cli.render.markdown.plan import plan_markdown as markdown
            from kvcanary_cli.render.table.plan import plan_table as table
        case "selftest":
            from kvcanary_cli.render.markdown.selftest import selftest_markdown as markdown
            from kvcanary_cli.render.table.selftest import selftest_table as table

            rows = {}
        case "ranks":
            from kvcanary_cli.render.markdown.ranks import ranks_markdown as markdown
            from kvcanary_cli.render.table.ranks import ranks_table as table
        case "leak":
            from kvcanary_cli.render.markdown.leak import leak_markdown as markdown
            from kvcanary_cli.render.table.leak import leak_table as table
        case "pool-timeline":
            from kvcanary_cli.render.markdown.pool_timeline import (
                pool_timeline_markdown as markdown,
            )
            from kvcanary_cli.render.table.pool_timeline import pool_timeline_table as table

            rows = {}
        case "pool-soak":
            from kvcanary_cli.render.markdown.pool_soak import pool_soak_markdown as markdown
            from kvcanary_cli.render.table.pool_soak import pool_soak_table as table

            rows = {}
        case "soak":
            from kvcanary_cli.render.markdown.soak import soak_markdown as markdown
            from kvcanary_cli.render.table.soak import soak_table as table

            rows = {}
        case _:
            raise TypeError(f"no view of a {result.SCHEMA} record")
    match fmt:
        case OutputFormat.JSON:
            from kvcanary_cli.results.record import to_record

            view = JsonText(to_record(result))
            return view if streamed else str(view)
        case OutputFormat.TABLE:
            return table(result, **rows)  # type: ignore[no-any-return]
        case OutputFormat.MARKDOWN:
            return markdown(result, **rows)  # type: ignore[no-any-return]
        case _:
            assert_never(fmt)
