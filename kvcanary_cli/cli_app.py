"""The `kvcanary` app itself: how it is built (no rich markup or tracebacks of typer's own),
run (standard streams, threads) and ended: the exit codes, computed from a command's result
without printing, and the one-line error policy (every failure one stderr line).

`cli` adds the commands (their options declared in `cli_options`); nothing here knows what a
command does.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback
from collections.abc import Sequence
from enum import IntEnum
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, NoReturn, get_args, get_origin

import typer
import typer.main
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from kvcanary_cli import __version__
from kvcanary_cli.dump.schema import SCALARS
from kvcanary_cli.dump.streams import (
    STANDARD_OUTPUT_NAME,
    prepare_standard_streams,
    standard_output_refusal,
    write_standard_error,
    writing_to_standard_output,
)
from kvcanary_cli.errors import (
    KvcanaryError,
    OptionError,
    Terminated,
    UpstreamPlanError,
    sigterm_unwinds,
    terminating,
)
from kvcanary_cli.output import complain
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.results.pool import PoolCheckReport
from kvcanary_cli.results.soak import SoakReport
from kvcanary_cli.results.timeline import TimelineReport

__all__ = ["Command", "ExitCode", "exit_code", "fail", "leave", "make_app", "run"]


class ExitCode(IntEnum):
    """Exit codes, as documented in docs/findings.md."""

    CLEAN = 0
    FINDINGS = 1
    BAD_INPUT = 2
    INTERNAL = 3
    #: the shell's 128 + SIGINT: a run stopped by Ctrl-C.
    INTERRUPTED = 130
    #: the shell's 128 + SIGTERM: a run stopped by `kill`, a supervisor or a timeout.
    TERMINATED = 143


def exit_code(result: object) -> ExitCode:
    """A command's exit code from its result, computed without printing: 2 for a `check` with
    an unreadable dump, 1 when it found something (each command's help says what), else 0."""
    from kvcanary_cli.results.leak import LeakReport  # numpy columns: the command ran by now
    from kvcanary_cli.results.plan import PlanRun
    from kvcanary_cli.results.pool_soak import PoolSoakReport
    from kvcanary_cli.results.pool_timeline import PoolTimelineReport
    from kvcanary_cli.results.ranks import RanksReport
    from kvcanary_cli.results.selftest import SelftestReport
    from kvcanary_cli.results.violations import ViolationsReport

    match result:
        case CheckReport(bad_input=True) | PoolCheckReport(bad_input=True):
            return ExitCode.BAD_INPUT
        case (
            CheckReport(failed=True)
            | PoolCheckReport(failed=True)
            | TimelineReport(slot=None, failed=True)
            | RanksReport(verdict="divergent")
            | ViolationsReport(found=True)
            | SoakReport(found=True)
            | PoolSoakReport(found=True)
            | PoolTimelineReport(failed=True)
            | SelftestReport(agree=False)
            | LeakReport(found=True)
            | PlanRun(problem=str())
        ):
            return ExitCode.FINDINGS
    return ExitCode.CLEAN


def fail(message: str, code: int) -> NoReturn:
    """`complain` (one escaped line on stderr) and exit with `code` (the line is lost with a
    closed stderr, the code never is)."""
    complain(message)
    sys.exit(code)


def internal_error(exc: Exception) -> NoReturn:
    """A bug: one line asking for a report, exit 3 (`KVCANARY_DEBUG=1`: the traceback too)."""
    if os.environ.get("KVCANARY_DEBUG") == "1":
        traceback.print_exception(exc)
    fail(
        f"internal error: {type(exc).__name__}: {exc} -- this is a kvcanary bug; "
        "please report it with the output of `kvcanary inspect DUMP` "
        "(KVCANARY_DEBUG=1 shows the traceback)",
        ExitCode.INTERNAL,
    )


def stopped(exc: BaseException | None = None) -> NoReturn:
    """A run stopped from outside: by SIGTERM (`Terminated`, exit 143) or Ctrl-C (exit 130).
    Click and typer hand the interrupt back wrapped (`Abort`) or as the exit code 130 (`exc`
    None): the handler's mark says which it was."""
    if terminating() or isinstance(exc, Terminated):
        fail("terminated", ExitCode.TERMINATED)
    fail("interrupted", ExitCode.INTERRUPTED)


def run(app: typer.Typer, args: Sequence[str] | None) -> None:
    """Run `app` as `kvcanary`. Typer builds the click command first (from the commands'
    signatures): a failure there is a bug too, and ends in the same one line, exit 3.

    One OpenMP thread (torch's, where SGLang's planners run) unless the user chose: on
    CPU-quota'd containers extra threads spin against each other (seen: a 121K-element arange
    50x slower with 2 threads than with 1). SIGTERM unwinds like Ctrl-C (`sigterm_unwinds`)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    prepare_standard_streams()
    with sigterm_unwinds():
        try:
            command = typer.main.get_command(app)
        except KeyboardInterrupt as exc:
            stopped(exc)
        except Exception as exc:
            internal_error(exc)
        command.main(args=args, prog_name="kvcanary")


def leave(code: str | int | None) -> NoReturn:
    """End this process with `code` (a `SystemExit`'s) as Python's own exit would, less its
    teardown: the `atexit` functions run and the standard streams are flushed, and then no
    module is unloaded and no object freed one by one. After a `check` that teardown is a
    collection of everything the command made (0.15 - 0.3 s: up to a fifth of a small dump's
    check), and nothing it does is seen.

    Python's own exit ends the process where something may need it: a thread still running
    (not a daemon), a stream that cannot be flushed, a message for `code`, and a program
    around the command (any caller below ours but the top level of a script or of
    `python -m`: a profiler, a debugger, a script of its own), which may have more to do."""
    others = [t for t in threading.enumerate() if t is not threading.main_thread()]
    if (
        not isinstance(code, int | None)
        or any(not thread.daemon for thread in others)
        or not _started_here(sys._getframe(1).f_back)
    ):
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code or 0)


def _started_here(frame: FrameType | None) -> bool:
    """Whether `frame` and every one under it is the interpreter's start: the top level of a
    script or module, or runpy's (`python -m`)."""
    while frame is not None:
        if frame.f_code.co_name != "<module>" and frame.f_globals.get("__name__") != "runpy":
            return False
        frame = frame.f_back
    return True


def show_version(value: bool) -> None:
    """`--version`: an eager option, so it answers before any command is looked for."""
    if value:
        with writing_to_standard_output():
            sys.stdout.write(f"kvcanary {__version__}\n")
        raise typer.Exit()


class Kvcanary(TyperGroup):
    """The `kvcanary` group. Every failure ends in one stderr line: usage errors and bad input
    exit 2, bugs exit 3.

    Click runs the command not standalone (`standalone_mode=False`), so each exception comes
    back here by its type instead of being shown by click: click's own errors (usage,
    parameters), kvcanary's (`KvcanaryError`: bad input or options; `UpstreamPlanError`:
    `plan --strict` met SGLang's raise), Ctrl-C and SIGTERM, and anything else, which is a bug.
    """

    def __init__(self, **attrs: Any) -> None:
        """Each command's summary its first paragraph whole, where click would cut it ("..."),
        and its arguments shown by their metavars (`_Argument`)."""
        super().__init__(**attrs)
        for command in self.commands.values():
            if command.help and not command.short_help:
                command.short_help = " ".join(command.help.split("\n\n")[0].split())
            for param in command.params:
                if type(param) is TyperArgument:
                    param.__class__ = _Argument

    def get_params(self, ctx: Any) -> list[Any]:
        """The group's options (`--version`, `--help`), their values made without pydantic."""
        return _lightly_coerced(super().get_params(ctx))

    def invoke(self, ctx: Any) -> Any:
        """Run the command; an `OptionError` from below names the API's keyword (`page_size`):
        here it gets the command line's flag (`--page-size`; a scalar: `--set page_size`)."""
        try:
            return super().invoke(ctx)
        except OptionError as exc:
            command = self.get_command(ctx, ctx.invoked_subcommand or "")
            exc.option = flag_of(command, exc.option)
            raise

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Run the command; turn exceptions into one line and an exit code."""
        try:
            result = super().main(*args, **{**kwargs, "standalone_mode": False})
        except KvcanaryError as exc:
            fail(f"error: {exc}", ExitCode.BAD_INPUT)
        except UpstreamPlanError as exc:
            fail(str(exc), ExitCode.FINDINGS)
        except (typer.Abort, KeyboardInterrupt) as exc:
            stopped(exc)
        except typer.TyperException as exc:  # click's errors: usage, bad parameters
            context = getattr(exc, "ctx", None)
            where = f" (see '{context.command_path} --help')" if context is not None else ""
            fail(f"error: {exc.format_message()}{_out_hint(exc)}{where}", ExitCode.BAD_INPUT)
        except OSError as exc:  # click's own writes (`--help`) to a full or closed stdout
            refused = standard_output_refusal(exc)
            if refused is None:
                internal_error(exc)
            fail(f"error: {STANDARD_OUTPUT_NAME}: {refused}", ExitCode.BAD_INPUT)
        except Exception as exc:
            internal_error(exc)
        if result == ExitCode.INTERRUPTED:  # typer turns Ctrl-C (and SIGTERM) into this code
            stopped()
        sys.exit(result if isinstance(result, int) else ExitCode.CLEAN)


def _out_hint(exc: Exception) -> str:
    """`-o` is a report's file in every command; one that has none but writes a file (`synth`,
    `shrink`) takes it as `--out`: say so where a user reached for `-o`."""
    command = getattr(getattr(exc, "ctx", None), "command", None)
    if getattr(exc, "option_name", None) != "-o" or command is None:
        return ""
    flags = {flag for param in command.params for flag in getattr(param, "opts", ())}
    return "; this command writes its file with --out" if "--out" in flags else ""


def flag_of(command: Any, keywords: str) -> str:
    """`slot/row` as the command line spells it (`--slot/--row`): each API keyword the flag
    or argument of that name, a scalar `--set NAME`, anything else as it is."""
    params = {param.name: param for param in command.params} if command else {}

    def one(keyword: str) -> str:
        param = params.get(keyword)
        if isinstance(param, TyperOption):
            return max(param.opts, key=len)
        if param is not None:
            return param.metavar or str(param.name).upper()
        return f"--set {keyword}" if keyword in SCALARS and "overrides" in params else keyword

    return "/".join(one(keyword) for keyword in keywords.split("/"))


class Command(TyperCommand):
    """A command whose options of a panel (typer's `rich_help_panel`: soak's engine, workload
    and serving options) are listed under that heading, before the rest ("Options"): typer
    groups them only in its rich help, which `kvcanary` leaves off. Its values are made
    without pydantic (`_Coercion`)."""

    def get_params(self, ctx: Any) -> list[Any]:
        """The command's parameters (`--help` too), their values made without pydantic."""
        return _lightly_coerced(super().get_params(ctx))

    def format_options(self, ctx: Any, formatter: Any) -> None:
        """The arguments, each panel's options under its heading, then the rest."""
        sections: dict[str, list[tuple[str, str]]] = {"Arguments": []}
        for param in self.get_params(ctx):
            if (record := param.get_help_record(ctx)) is not None:
                title = getattr(param, "rich_help_panel", None) or "Options"
                title = "Arguments" if param.param_type_name == "argument" else title
                sections.setdefault(title, []).append(record)
        sections["Options"] = sections.pop("Options", [])  # the rest, last
        for title, records in sections.items():
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)


class _Argument(TyperArgument):
    """A positional argument shown as click shows one (`DUMP...`, `[SCENARIO]`), without the
    Python type typer adds (`DUMP <list[Path]>`) or its braces (`{DUMP}...`)."""

    def _shown(self) -> str:
        return (self.metavar or str(self.name).upper()) + ("..." if self.nargs != 1 else "")

    def get_usage_pieces(self, ctx: Any) -> list[str]:
        return [self._shown() if self.required else f"[{self._shown()}]"]

    def get_help_record(self, ctx: Any) -> tuple[str, str]:
        return self._shown(), (self.help or "") + ("  [required]" if self.required else "")


class _Coercion:
    """What typer makes of a parameter's text, for the kinds kvcanary's parameters are
    (`cli_options`: a parser's value, a path, a string, a flag, a list of those): typer (0.29
    on) builds a pydantic adapter per parameter for it, and importing pydantic to do so was
    0.25 s of every command's start (a tenth of `kvcanary check`). The same values and
    refusals: a path's `Path` (an existing one unreadable refused, as typer refuses it), a
    string's text, a parser's value, a flag's bool."""

    def __init__(self, kind: Any, parser: Any) -> None:
        self.kind, self.parser = kind, parser

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        many = param.multiple or param.nargs == -1
        if value is None:
            return () if many else None
        if not many:
            return self._one(value, param, ctx)
        if isinstance(value, str):
            raise typer.BadParameter("Value must be an iterable.", ctx=ctx, param=param)
        return [self._one(item, param, ctx) for item in value]

    def _one(self, value: Any, param: Any, ctx: Any) -> Any:
        if self.parser is not None:
            return self.parser(value)
        if self.kind is bool:
            word = value if isinstance(value, bool) else str(value).strip().lower()
            if word not in _FLAGS:
                said = "Input should be a valid boolean, unable to interpret input"  # typer's
                raise typer.BadParameter(said, ctx=ctx, param=param)
            return _FLAGS[word]
        if self.kind is str:
            return value if isinstance(value, str) else os.fsdecode(value)
        path = value if isinstance(value, Path) else Path(os.fsdecode(value))
        if os.path.exists(path) and not os.access(path, os.R_OK):
            raise typer.BadParameter(f"Path {str(value)!r} is not readable.", ctx=ctx, param=param)
        return path


#: A flag's values, as typer reads them (an environment variable's text included).
_FLAGS: dict[Any, bool] = {
    True: True, False: False, "": False,
    **dict.fromkeys(("1", "true", "t", "yes", "y", "on"), True),
    **dict.fromkeys(("0", "false", "f", "no", "n", "off"), False),
}  # fmt: skip


def _lightly_coerced(params: list[Any]) -> list[Any]:
    """`params`, each of a kind `_Coercion` makes given it in place of typer's adapter; any
    other parameter, or a typer laid out otherwise, keeps typer's own."""
    for param in params:
        descriptor = getattr(param, "type_descriptor", None)
        info = getattr(descriptor, "parameter_info", None)
        if info is None or getattr(param, "_runtime_param", False) is not None:
            continue
        kind = getattr(descriptor, "annotation", None)
        if get_origin(kind) is list:
            kind = get_args(kind)[0]
        parser = getattr(info, "parser", None)
        if parser is not None or kind in (str, Path, bool):
            param._runtime_param = _Coercion(kind, parser)
    return params


def make_app() -> typer.Typer:
    """The `kvcanary` app, before its commands: one-line errors, no rich markup or tracebacks
    of typer's own, and `kvcanary` alone shows the help."""
    app = typer.Typer(
        name="kvcanary",
        cls=Kvcanary,
        invoke_without_command=True,
        pretty_exceptions_enable=False,
        pretty_exceptions_show_locals=False,
        rich_markup_mode=None,
        help="Diagnose KV-cache dumps of SGLang's kv canary: run the reference planner and the "
        "GPU kernel on a dump, compare them, and show every bad slot with where it came from. "
        "On vLLM dumps: the block pool's invariants, each fault with its blocks and holders."
        "\n\nExit codes: 0 clean, 1 findings, 2 bad input or usage, 3 internal error, "
        "130 stopped by Ctrl-C, 143 by SIGTERM.",
    )
    app.callback()(root)
    return app


def root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=show_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Diagnose KV-cache dumps of SGLang's kv canary (`kvcanary` alone: the help, as a usage
    error)."""
    if ctx.invoked_subcommand is None:
        write_standard_error(ctx.get_help())
        raise typer.Exit(ExitCode.BAD_INPUT)
