"""The `kvcanary` command line: parse options, call the library, print, map to an exit code.

Nothing here decides anything about dumps; it only wires dump → planners/analysis → render.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from enum import IntEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from kvcanary_cli import __version__
from kvcanary_cli.errors import KvcanaryError

__all__ = ["ExitCode", "app", "main"]


class ExitCode(IntEnum):
    """Exit codes, as documented in the README and findings.md."""

    CLEAN = 0
    FINDINGS = 1
    BAD_INPUT = 2
    INTERNAL = 3


app = typer.Typer(
    name="kvcanary",
    help=(
        "Diagnose KV-cache dumps of SGLang's kv canary: run the reference planner and the GPU "
        "kernel on a dump, compare them, and show every bad slot with where it came from.\n\n"
        "Exit codes: 0 clean, 1 findings, 2 bad input or usage, 3 internal error."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvcanary {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True,
                           help="Print the version and exit.")
    ] = False,
) -> None:
    """Diagnose KV-cache dumps of SGLang's kv canary."""


@contextmanager
def guarded() -> Iterator[None]:
    """Turn user mistakes into one stderr line + exit 2, and crashes into exit 3."""
    try:
        yield
    except (typer.Exit, typer.Abort, SystemExit):
        raise
    except KvcanaryError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(130) from None
    except Exception as exc:
        if os.environ.get("KVCANARY_DEBUG") == "1":
            traceback.print_exc()
        typer.echo(
            f"internal error: {type(exc).__name__}: {exc} -- this is a kvcanary bug; please "
            "report it with the output of `kvcanary inspect DUMP` (KVCANARY_DEBUG=1 shows the "
            "traceback)",
            err=True,
        )
        raise typer.Exit(ExitCode.INTERNAL) from None


DumpArg = Annotated[
    Path, typer.Argument(help="A .safetensors dump (see README: dump format v1).",
                         show_default=False)
]


def _emit(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@app.command()
def inspect(
    dump: DumpArg,
    output_format: Annotated[
        str, typer.Option("--format", "-f", help="table or json.", metavar="table|json")
    ] = "table",
) -> None:
    """Show what a dump holds: tensors, scalars (and their source), groups, batch, notes.

    Validates the file on the way: a malformed dump is reported as one error line, exit 2.
    """
    with guarded():
        from kvcanary_cli.dump import load_dump
        from kvcanary_cli.dump.describe import describe_dump
        from kvcanary_cli.render import OutputFormat, make_console, to_json
        from kvcanary_cli.render.inspect_view import inspect_table

        fmt = _parse_format(output_format, (OutputFormat.TABLE, OutputFormat.JSON))
        record = describe_dump(load_dump(dump))
        if fmt is OutputFormat.JSON:
            _emit(to_json(record))
        else:
            make_console().print(inspect_table(record))


def _parse_format(value: str, allowed: tuple[Any, ...]) -> Any:
    for choice in allowed:
        if value == choice.value:
            return choice
    from kvcanary_cli.errors import UsageError

    names = ", ".join(c.value for c in allowed)
    raise UsageError(f"unknown format {value!r} (choose one of: {names})", tensor="--format")


def main() -> None:
    """Console-script entry point."""
    app(prog_name="kvcanary")
