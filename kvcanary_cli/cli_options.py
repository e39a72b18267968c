"""Command-line plumbing shared by every command: exit codes, choice types, the scalar
override options (from the format's schema) and the one-line error policy.

`cli` declares the commands with these; nothing here knows what a command does.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from enum import IntEnum, StrEnum
from inspect import Parameter, signature
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

from kvcanary_cli.dump.schema import SCALARS
from kvcanary_cli.errors import KvcanaryError

__all__ = ["ExitCode", "GroupChoice", "OneLineErrors", "Space", "fail", "with_scalar_overrides"]


class ExitCode(IntEnum):
    """Exit codes, as documented in the README and docs/findings.md."""

    CLEAN = 0
    FINDINGS = 1
    BAD_INPUT = 2
    INTERNAL = 3


class GroupChoice(StrEnum):
    """`--group` of check: one group, or every group the dump has."""

    FULL = "full"
    SWA = "swa"
    ALL = "all"


class Space(StrEnum):
    """`--space` / `--group` of provenance."""

    FULL = "full"
    SWA = "swa"


def fail(message: str, code: int) -> NoReturn:
    """Print one line on stderr and exit with `code`."""
    typer.echo(message, err=True)
    sys.exit(code)


def _usage_message(exc: Exception) -> str | None:
    """The one-line text of a click usage error (typer may vendor click: duck-typed)."""
    if not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")):
        return None
    context = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError" and context is not None:
        return str(context.get_help())
    where = f" (see '{context.command_path} --help')" if context is not None else ""
    message = str(exc.format_message()).replace("Value error, ", "")  # pydantic's prefix
    return f"error: {message}{where}"


class OneLineErrors(TyperGroup):
    """Every failure ends in one stderr line: usage errors and bad input exit 2, bugs exit 3."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        """Run the command; turn exceptions into one line and an exit code."""
        try:  # not standalone: exceptions come back here instead of being shown by click
            result = super().main(args, prog_name, complete_var, False, windows_expand_args,
                                  **extra)
        except KvcanaryError as exc:
            fail(f"error: {exc}", ExitCode.BAD_INPUT)
        except (typer.Abort, KeyboardInterrupt):
            fail("interrupted", 130)
        except Exception as exc:
            usage = _usage_message(exc)
            if usage is not None:
                fail(usage, ExitCode.BAD_INPUT)
            if os.environ.get("KVCANARY_DEBUG") == "1":
                traceback.print_exc()
            fail(f"internal error: {type(exc).__name__}: {exc} -- this is a kvcanary bug; "
                  "please report it with the output of `kvcanary inspect DUMP` "
                  "(KVCANARY_DEBUG=1 shows the traceback)", ExitCode.INTERNAL)
        sys.exit(result if isinstance(result, int) else ExitCode.CLEAN)


def _parameter(option: str) -> str:
    return option.removeprefix("--").replace("-", "_")


def with_scalar_overrides(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command one option per scalar of the format (dump/schema.py `SCALARS`), passed
    to it as one `overrides` dict keyed by scalar name; command-line values win over the dump.
    """
    declared = signature(command, eval_str=True)
    own = [p for p in declared.parameters.values() if p.name != "overrides"]
    extra = [
        Parameter(_parameter(spec.option), Parameter.KEYWORD_ONLY, default=None,
                  annotation=Annotated[int | None, typer.Option(
                      spec.option, rich_help_panel="Scalar overrides",
                      help=f"Override {spec.name}: {spec.meaning} (default: {spec.default}).")])
        for spec in SCALARS.values()
    ]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        overrides = {name: kwargs.pop(_parameter(spec.option)) for name, spec in SCALARS.items()}
        command(overrides=overrides, **kwargs)

    wrapper.__signature__ = declared.replace(parameters=own + extra)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in own + extra}
    return wrapper
