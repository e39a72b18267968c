"""Command-line plumbing: exit codes, choice options, every option's declaration (the scalar
overrides generated from the format's schema) and the one-line error policy.

`cli` declares the commands with these; nothing here knows what a command does.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from inspect import Parameter, signature
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, NoReturn, TypeVar

import typer
import typer.main
from typer.core import TyperGroup

from kvcanary_cli import __version__
from kvcanary_cli.catalog import Severity
from kvcanary_cli.dump.files import check_targets
from kvcanary_cli.dump.schema import SCALARS, Group
from kvcanary_cli.dump.streams import (
    STANDARD_OUTPUT_NAME,
    prepare_standard_streams,
    standard_output_refusal,
    write_standard_error,
    writing_to_standard_output,
)
from kvcanary_cli.errors import KvcanaryError, OptionError, UpstreamPlanError
from kvcanary_cli.planners import BACKENDS, KERNELS, PlannerChoice
from kvcanary_cli.render.console import OutputFormat
from kvcanary_cli.render.image import SVG_TARGET
from kvcanary_cli.results.cells import Space
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.results.timeline import TimelineReport
from kvcanary_cli.safe_text import printable

__all__ = [
    "APP_HELP",
    "APP_SETTINGS",
    "NO_SEQUENCE",
    "STDOUT",
    "Buffer",
    "ExitCode",
    "GroupChoice",
    "OneLineErrors",
    "ReportTo",
    "check_exit",
    "command",
    "fail",
    "input_files",
    "make_app",
    "parse_positions",
    "root",
    "run",
    "timeline_exit",
    "to_stdout",
    "with_report_options",
    "with_scalar_overrides",
    "with_sequence_options",
    "with_svg",
]


APP_HELP = (
    "Diagnose KV-cache dumps of SGLang's kv canary: run the reference planner and the GPU "
    "kernel on a dump, compare them, and show every bad slot with where it came from.\n\n"
    "Exit codes: 0 clean, 1 findings, 2 bad input or usage, 3 internal error."
)


class ExitCode(IntEnum):
    """Exit codes, as documented in the README and docs/findings.md."""

    CLEAN = 0
    FINDINGS = 1
    BAD_INPUT = 2
    INTERNAL = 3
    #: the shell's 128 + SIGINT: a run stopped by Ctrl-C.
    INTERRUPTED = 130


class GroupChoice(StrEnum):
    """`--group` of check: one group, or every group the dump has."""

    FULL = "full"
    SWA = "swa"
    ALL = "all"


class Buffer(StrEnum):
    """`--buffer` of violations: a canary buffer of a group (sweeps read the tail ones)."""

    HEAD_K = "head.k"
    TAIL_K = "tail.k"
    HEAD_V = "head.v"
    TAIL_V = "tail.v"


_Choice = TypeVar("_Choice", bound=StrEnum)
_Command = TypeVar("_Command", bound=Callable[..., None])


def choice_of(
    *members: _Choice, option: str = "", aliases: dict[str, _Choice] | None = None
) -> dict[str, Any]:
    """`typer.Option` settings for an option that takes one of `members` (of one enum).

    A parser of our own instead of typer's enum coercion: one enum may serve several options
    with different subsets (`PlannerChoice`), and a wrong value reads "'x' is not one of a,
    b" in the one error line, without the validation library's wording around it. An alias
    (an old name) is taken, with a note on stderr naming the choice it stands for.
    """
    by_value = {member.value: member for member in members}
    aliases = aliases or {}

    def parse(text: str | _Choice) -> _Choice:
        if isinstance(text, StrEnum):  # the default, already a member
            return text  # type: ignore[return-value]
        if text in aliases:
            new = aliases[text].value
            write_standard_error(f"note: {option} {text} is the old name of {option} {new}")
            return aliases[text]
        if text not in by_value:
            raise typer.BadParameter(f"{text!r} is not one of {', '.join(by_value)}")
        return by_value[text]

    def complete(incomplete: str) -> list[str]:
        return [value for value in by_value if value.startswith(incomplete)]

    return {
        "parser": parse,
        "metavar": "[" + "|".join(by_value) + "]",
        "autocompletion": complete,  # a shell's TAB: the choices, as typer's enums had
    }


def _readable(value: int) -> str:
    """An integer as a person reads a bound: `2^31-1`, `-2^31`, `2^40`, or its digits."""
    magnitude = abs(value)
    for exact, suffix in ((magnitude, ""), (magnitude + 1, "-1")):
        bits = exact.bit_length() - 1
        if bits >= 16 and exact == 1 << bits:
            return f"{'-' if value < 0 else ''}2^{bits}{suffix}"
    return str(value)


def integer(
    help: str, minimum: int | None = None, maximum: int | None = None, metavar: str = "INT"
) -> dict[str, Any]:
    """`typer.Option` settings for an integer option in [minimum, maximum]: the range in
    words at the end of the help (`0 to 2^31-1`, not click's `[0<=x<=2147483647]`), and a
    parser that refuses a value outside it in the one error line."""
    if minimum is not None and maximum is not None:
        bounds = f"{_readable(minimum)} to {_readable(maximum)}"
    elif minimum is not None:
        bounds = f"at least {_readable(minimum)}"
    else:
        bounds = f"at most {_readable(maximum)}" if maximum is not None else ""

    def parse(text: str | int) -> int:
        try:
            value = text if isinstance(text, int) else int(text)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not an integer") from None
        both = f" ({bounds})" if minimum is not None and maximum is not None else ""
        if minimum is not None and value < minimum:
            raise typer.BadParameter(f"{value} is below {_readable(minimum)}{both}")
        if maximum is not None and value > maximum:
            raise typer.BadParameter(f"{value} is above {_readable(maximum)}{both}")
        return value

    return {"help": f"{help} [{bounds}]" if bounds else help, "parser": parse, "metavar": metavar}


def check_exit(report: CheckReport) -> ExitCode:
    """`check`'s exit code; each unreadable dump's error goes to stderr on the way."""
    for bad in report.dumps:
        if bad.error is not None:
            write_standard_error(printable(f"error: {bad.error}"))
    if report.bad_input:
        return ExitCode.BAD_INPUT
    return ExitCode.FINDINGS if report.failed else ExitCode.CLEAN


def timeline_exit(report: TimelineReport) -> ExitCode:
    """`timeline`'s and `diff`'s exit code: 1 on an event or an error finding."""
    return ExitCode.FINDINGS if report.failed else ExitCode.CLEAN


def input_files(sources: Sequence[str], dump: str | os.PathLike[str] | None) -> list[str]:
    """What a command read (`-`: standard input's file), which its `--output` may not replace."""
    return [*sources, *([os.fspath(dump)] if dump is not None else [])]


def fail(message: str, code: int) -> NoReturn:
    """Print one line on stderr and exit with `code` (the line is lost with a closed stderr,
    the code never is).

    The line is escaped (`printable`): it may quote a file name, a tensor name, an option value
    or an exception's text, none of which may reach the terminal as control characters.
    """
    write_standard_error(printable(message))
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


def run(app: typer.Typer, args: Sequence[str] | None) -> None:
    """Run `app` as `kvcanary`. Typer builds the click command first (from the commands'
    signatures): a failure there is a bug too, and ends in the same one line, exit 3.

    One OpenMP thread (torch's, where SGLang's planners run) unless the user chose: on
    CPU-quota'd containers extra threads spin against each other (seen: a 121K-element arange
    50x slower with 2 threads than with 1)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    prepare_standard_streams()
    try:
        command = typer.main.get_command(app)
    except Exception as exc:
        internal_error(exc)
    command.main(args=args, prog_name="kvcanary")


def show_version(value: bool) -> None:
    """`--version`: an eager option, so it answers before any command is looked for."""
    if value:
        with writing_to_standard_output():
            sys.stdout.write(f"kvcanary {__version__}\n")
        raise typer.Exit()


class OneLineErrors(TyperGroup):
    """Every failure ends in one stderr line: usage errors and bad input exit 2, bugs exit 3.

    Click runs the command not standalone (`standalone_mode=False`), so each exception comes
    back here by its type instead of being shown by click: click's own errors (usage,
    parameters), kvcanary's (`KvcanaryError`: bad input or options; `UpstreamPlanError`:
    `plan --strict` met SGLang's raise), Ctrl-C, and anything else, which is a bug.
    """

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the command; turn exceptions into one line and an exit code."""
        try:
            result = super().main(
                args, prog_name, complete_var, False, windows_expand_args, **extra
            )
        except KvcanaryError as exc:
            fail(f"error: {exc}", ExitCode.BAD_INPUT)
        except UpstreamPlanError as exc:
            fail(str(exc), ExitCode.FINDINGS)
        except (typer.Abort, KeyboardInterrupt):
            fail("interrupted", ExitCode.INTERRUPTED)
        except typer.TyperException as exc:  # click's errors: usage, bad parameters
            context = getattr(exc, "ctx", None)
            where = f" (see '{context.command_path} --help')" if context is not None else ""
            fail(f"error: {exc.format_message()}{where}", ExitCode.BAD_INPUT)
        except OSError as exc:  # click's own writes (`--help`) to a full or closed stdout
            refused = standard_output_refusal(exc)
            if refused is None:
                internal_error(exc)
            fail(f"error: {STANDARD_OUTPUT_NAME}: {refused}", ExitCode.BAD_INPUT)
        except Exception as exc:
            internal_error(exc)
        if result == ExitCode.INTERRUPTED:  # click turns Ctrl-C into this exit code
            fail("interrupted", ExitCode.INTERRUPTED)
        sys.exit(result if isinstance(result, int) else ExitCode.CLEAN)


#: How the `kvcanary` app is built (`make_app`): one-line errors, no rich markup or tracebacks
#: of typer's own, and `kvcanary` alone shows the help.
APP_SETTINGS: dict[str, Any] = {
    "name": "kvcanary",
    "cls": OneLineErrors,
    "invoke_without_command": True,
    "pretty_exceptions_enable": False,
    "pretty_exceptions_show_locals": False,
    "rich_markup_mode": None,
    "help": APP_HELP,
}


def make_app() -> typer.Typer:
    """The `kvcanary` app, before its commands: built with `APP_SETTINGS`, `root` its
    callback."""
    app = typer.Typer(**APP_SETTINGS)
    app.callback()(root)
    return app


def root(ctx: typer.Context, version: VersionOpt = False) -> None:
    """Diagnose KV-cache dumps of SGLang's kv canary (`kvcanary` alone: the help, as a usage
    error)."""
    if ctx.invoked_subcommand is None:
        write_standard_error(ctx.get_help())
        raise typer.Exit(ExitCode.BAD_INPUT)


def command(
    app: typer.Typer,
    *,
    overrides: bool = False,
    svg: bool = False,
    report: bool = False,
    rows: tuple[Any, int] | None = None,
    sequence: bool = False,
) -> Callable[[_Command], _Command]:
    """`@app.command()`, with what it asks for: `--format`, `--output`, `--force` and with
    `rows` an annotated `--max-rows` and its default (`with_report_options`), `--svg FILE`
    (`with_svg`), the scalar overrides (`with_scalar_overrides`), `synth`'s `--steps`, `--at`
    and `--every` (`with_sequence_options`)."""

    def register(function: _Command) -> _Command:
        wrapped: Callable[..., None] = function
        if report:
            wrapped = with_report_options(wrapped, rows)
        if sequence:
            wrapped = with_sequence_options(wrapped)
        if svg:
            wrapped = with_svg(wrapped)
        app.command()(with_scalar_overrides(wrapped) if overrides else wrapped)
        return function

    return register


@dataclass(frozen=True)
class ReportTo:
    """Where a command's report goes: its format, its file (None or `-`: standard output),
    whether an existing file may be replaced, and how many rows its table and Markdown views
    list (`with_report_options`)."""

    fmt: OutputFormat = OutputFormat.TABLE
    file: Path | None = None
    force: bool = False
    rows: int = 0


#: A report as a table on standard output: what a command called without options prints.
STDOUT = ReportTo()


def _with_parameters(
    command: Callable[..., None], added: list[Parameter], passed: Callable[[dict[str, Any]], Any]
) -> Callable[..., None]:
    """`command` with `added` options in its signature before `overrides` (or at its end);
    what `passed` makes of their values goes to it as its parameter `to` or `sequence`."""
    declared = signature(command, eval_str=True)
    names = {p.name for p in added}
    target = "to" if "to" in declared.parameters else "sequence"
    params = [p for p in declared.parameters.values() if p.name != target]
    at = next((i for i, p in enumerate(params) if p.name == "overrides"), len(params))
    params[at:at] = added

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        values = {name: kwargs.pop(name) for name in names}
        command(**{target: passed(values)}, **kwargs)

    wrapper.__signature__ = declared.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


def with_report_options(
    command: Callable[..., None], rows: tuple[Any, int] | None = None
) -> Callable[..., None]:
    """Give a reporting command `--format`, `--output` and `--force` (and with `rows`, an
    annotated `--max-rows` option and its default), passed to it as one `to: ReportTo`, as
    `with_scalar_overrides` gives the scalars."""
    kind = Parameter.POSITIONAL_OR_KEYWORD
    added = [
        Parameter("output_format", kind, default=OutputFormat.TABLE, annotation=FormatOpt),
        Parameter("output", kind, default=None, annotation=OutputOpt),
        Parameter("force", kind, default=False, annotation=ForceOpt),
    ]
    if rows is not None:
        added.insert(0, Parameter("max_rows", kind, default=rows[1], annotation=rows[0]))

    def to(values: dict[str, Any]) -> ReportTo:
        fmt, file, force = values["output_format"], values["output"], values["force"]
        return ReportTo(fmt, file, force, values.get("max_rows", 0))

    return _with_parameters(command, added, to)


def with_sequence_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give `synth` `--steps`, `--at` and `--every`, passed to it as one `sequence` dict of
    `api.synth`'s keyword arguments of the same names."""
    kind = Parameter.POSITIONAL_OR_KEYWORD
    added = [
        Parameter("steps", kind, default=None, annotation=StepsOpt),
        Parameter("at", kind, default=None, annotation=AtOpt),
        Parameter("every", kind, default=1, annotation=EveryOpt),
    ]
    return _with_parameters(command, added, dict)


#: `synth` without --steps: no sequence options.
NO_SEQUENCE: Mapping[str, int | None] = MappingProxyType({})


def with_svg(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command `--svg FILE`: the view it delivers is also saved as an SVG image there
    (`render.image.SVG_TARGET`, which `output.deliver` reads), by the rules of `-o`."""
    declared = signature(command, eval_str=True)
    params = list(declared.parameters.values())
    at = next((i for i, p in enumerate(params) if p.name == "overrides"), len(params))
    svg = Parameter("svg", Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=SvgOpt)
    params.insert(at, svg)

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        target = kwargs.pop("svg")
        if target is not None and str(target) in ("", "-"):
            raise OptionError("writes an image file: name one", option="--svg")
        if target is not None and kwargs.get("out") is not None:  # a file it writes itself
            inputs = [kwargs["dump"]] if kwargs.get("dump") is not None else []
            # checked with the image before either is written (`output.deliver` writes it)
            check_targets([kwargs["out"], target], inputs=inputs, overwrite=bool(kwargs["force"]))
        token = SVG_TARGET.set(None if target is None else str(target))
        try:
            command(**kwargs)
        finally:
            SVG_TARGET.reset(token)

    wrapper.__signature__ = declared.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


def to_stdout(output: str | os.PathLike[str] | None) -> bool:
    """Whether `--output` names standard output (unset or `-`) rather than a file."""
    return output is None or os.fspath(output) == "-"


def _parameter(option: str) -> str:
    return option.removeprefix("--").replace("-", "_")


def with_scalar_overrides(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command one option per scalar of the format (dump/schema.py `SCALARS`), passed
    to it as one `overrides` dict keyed by scalar name; command-line values win over the dump.

    Typer reads a command's options from its signature (`inspect.signature`, which honours
    `__signature__`): the wrapper declares the command's own parameters plus the scalars'.
    """
    declared = signature(command, eval_str=True)
    own = [p for p in declared.parameters.values() if p.name != "overrides"]
    extra = [
        Parameter(
            _parameter(spec.option),
            Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[
                int | None,
                typer.Option(
                    spec.option,
                    rich_help_panel="Scalar overrides",
                    **integer(
                        f"Override {spec.name}: {spec.meaning} (default: {spec.default}).",
                        spec.minimum,
                        spec.maximum,
                    ),
                ),
            ],
        )
        for spec in SCALARS.values()
    ]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        overrides = {name: kwargs.pop(_parameter(spec.option)) for name, spec in SCALARS.items()}
        command(overrides=overrides, **kwargs)

    wrapper.__signature__ = declared.replace(parameters=own + extra)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in own + extra}
    return wrapper


# --- the options of the commands, declared once -------------------------------------------

DumpArg = Annotated[
    Path,
    typer.Argument(
        help="A .safetensors dump (format: docs/dump-format.md).",
        show_default=False,
        metavar="DUMP",
    ),
]
DumpsArg = Annotated[
    list[Path],
    typer.Argument(
        help="One or more .safetensors dumps (one per rank, say).",
        show_default=False,
        metavar="DUMP",
    ),
]
SequenceArg = Annotated[
    list[Path],
    typer.Argument(
        help="Two or more dumps of one rank, in any order: they are read by their step.",
        show_default=False,
        metavar="DUMP",
    ),
]
OldArg = Annotated[
    Path,
    typer.Argument(help="The earlier dump.", show_default=False, metavar="OLD"),
]
NewArg = Annotated[
    Path,
    typer.Argument(help="The later dump, of the same rank.", show_default=False, metavar="NEW"),
]
ProvenanceDumpsArg = Annotated[
    list[Path],
    typer.Argument(
        help="A dump; or several of one rank, with --slot: the slot's owners over time.",
        show_default=False,
        metavar="DUMP",
    ),
]
ChangeRowsOpt = Annotated[
    int,
    typer.Option(
        "--max-rows",
        **integer(
            "Owner changes listed (diff) in table and markdown output (JSON lists them all).",
            1,
            metavar="N",
        ),
    ),
]
#: `--kernel` and `--backend` names of earlier versions: the vectorized planner ran on torch.
_OLD_NAMES = {"torch": PlannerChoice.VECTORIZED}
FormatOpt = Annotated[
    OutputFormat,
    typer.Option(
        "--format",
        "-f",
        help="table for a terminal, json for scripts, markdown for a bug report.",
        **choice_of(*OutputFormat),
    ),
]
GroupsOpt = Annotated[
    GroupChoice,
    typer.Option(
        "--group",
        "-g",
        help="Groups to plan (all: every group the dump has).",
        **choice_of(*GroupChoice),
    ),
]
KernelOpt = Annotated[
    PlannerChoice,
    typer.Option(
        "--kernel",
        "-k",
        help="What stands in for the production GPU path: triton (the kernels; compiled on CUDA, "
        "interpreted elsewhere), vectorized (same GPU semantics in numpy: fast), sglang (the "
        "installed SGLang's own launcher: its kernels on CUDA, its torch reference elsewhere), "
        "none (skip the comparison). torch: the old name of vectorized.",
        **choice_of(*KERNELS, option="--kernel", aliases=_OLD_NAMES),
    ),
]
FailOnOpt = Annotated[
    Severity,
    typer.Option(
        "--fail-on", help="Exit 1 when a finding is at least this severe.", **choice_of(*Severity)
    ),
]
FindingRowsOpt = Annotated[
    int,
    typer.Option(
        "--max-rows",
        **integer(
            "Rows of each table in table and markdown output: findings per code, requests "
            "(JSON lists them all).",
            1,
            metavar="N",
        ),
    ),
]
JobsOpt = Annotated[
    int | None,
    typer.Option(
        "--jobs",
        "-j",
        **integer(
            "Processes for several dumps (default: the cores; never more than the cores, the "
            "dumps, or what the available memory holds).",
            1,
            metavar="N",
        ),
    ),
]
SlotOpt = Annotated[
    int | None,
    typer.Option(
        "--slot",
        "-s",
        **integer(
            "Slot to trace: every req_to_token cell holding it.",
            -(1 << 63),
            (1 << 63) - 1,
            metavar="N",
        ),
    ),
]
RowOpt = Annotated[
    int | None,
    typer.Option(
        "--row",
        "-r",
        **integer(
            "Pool row to map instead: live prefix, window, pending writes, stale tail, bad "
            "cells marked.",
            0,
            (1 << 63) - 1,
            metavar="R",
        ),
    ),
]
SpaceOpt = Annotated[
    Space,
    typer.Option(
        "--space",
        help="Whether --slot is a full-pool slot or an SWA-pool slot.",
        **choice_of(*Space),
    ),
]


def parse_positions(text: str | None) -> tuple[int, int] | None:
    """`START:END` -> (start, end); either side may be empty (the row's start or end)."""
    if text is None:
        return None
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError
        span = (int(start) if start else 0, int(end) if end else 1 << 62)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not START:END (e.g. 3000:4000)") from None
    if not all(0 <= v < 1 << 63 for v in span):
        raise OptionError(f"{text!r}: positions must be in [0, 2^63)", option="--positions")
    return span


PositionsOpt = Annotated[
    str | None,
    typer.Option(
        "--positions",
        metavar="START:END",
        help="With --row: the positions to map, [START, END) (either side may be left out).",
    ),
]
CellsOpt = Annotated[
    int,
    typer.Option(
        "--max-rows",
        **integer(
            "Rows of each table: cells per slot for --slot, per row map for --row (marked "
            "cells first), and the findings touching it (JSON lists them all).",
            1,
            metavar="N",
        ),
    ),
]
RoleGroupOpt = Annotated[
    Group | None,
    typer.Option(
        "--group",
        "-g",
        help="Group whose window labels the roles (default: swa for --space swa, else full).",
        **choice_of(*Group),
    ),
]
PlanGroupOpt = Annotated[
    Group, typer.Option("--group", "-g", help="Group to plan.", **choice_of(*Group))
]
BackendOpt = Annotated[
    PlannerChoice,
    typer.Option(
        "--backend",
        "-b",
        help="reference: scalar, literal (slow); vectorized: numpy, same results; triton: the GPU "
        "kernels (compiled on CUDA, interpreted elsewhere; GPU semantics on bad input); sglang: "
        "the installed SGLang's own launcher (its kernels on CUDA, its torch reference "
        "elsewhere). torch: the old name of vectorized.",
        **choice_of(*BACKENDS, option="--backend", aliases=_OLD_NAMES),
    ),
]
StrictOpt = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="With --backend reference: raise (exit 1) exactly where SGLang's torch "
        "reference raises, with its message.",
    ),
]
PlanOutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        "-o",
        help="Write the plan (SGLang's field names, trimmed to what upstream "
        "defines) to this .safetensors file.",
    ),
]
RequestRowsOpt = Annotated[
    int, typer.Option("--max-rows", **integer("Batch rows shown in the table.", 1, metavar="N"))
]
ScenarioArg = Annotated[
    str | None,
    typer.Argument(help="Scenario name (see --list).", show_default=False, metavar="SCENARIO"),
]
SynthOutOpt = Annotated[
    Path | None,
    typer.Option("--out", "-o", help="Dump file to write (with --steps: a folder)."),
]
StepsOpt = Annotated[
    int | None,
    typer.Option(
        "--steps",
        **integer(
            "Write K dumps of one rank into the --out folder: SCENARIO is then a sequence "
            "(see --list), its event planted at --at.",
            2,
            64,
            metavar="K",
        ),
        show_default=False,
    ),
]
AtOpt = Annotated[
    int | None,
    typer.Option(
        "--at",
        **integer(
            "With --steps: the forward step the event happens at (default: the middle dump's).",
            1,
            metavar="STEP",
        ),
        show_default=False,
    ),
]
EveryOpt = Annotated[
    int,
    typer.Option(
        "--every",
        **integer("With --steps: forward steps between dumps.", 1, 64, metavar="N"),
    ),
]
ShrinkOutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        "-o",
        help="The small dump to write (.safetensors, format 1.2).",
        show_default=False,
    ),
]
SeedOpt = Annotated[
    int, typer.Option("--seed", **integer("Random seed.", 0, (1 << 63) - 1, metavar="N"))
]
SynthPageSizeOpt = Annotated[
    int | None,
    typer.Option(
        "--page-size",
        **integer(
            "Slots per page of both pools (default: the scenario's own; the SWA page "
            "scenarios use 16). Page faults need 2 or more.",
            1,
            4096,
            metavar="SLOTS",
        ),
        show_default=False,
    ),
]
SizeOpt = Annotated[
    str,
    typer.Option(
        "--size",
        metavar="tiny|small|medium|large",
        help="tiny/small for examples and tests; medium (2049 x 32772) and large (4097 x 131076) "
        "req_to_token for benchmarks.",
    ),
]
ListOpt = Annotated[bool, typer.Option("--list", help="List the scenarios.")]
OutputOpt = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        metavar="FILE",
        help="Write the report to FILE instead of standard output (- is standard output).",
    ),
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite an existing output file.")]
SvgOpt = Annotated[
    Path | None,
    typer.Option(
        "--svg",
        metavar="FILE",
        help="Also save the report as an SVG image (in colour, as the terminal shows it), to "
        "attach to an issue.",
        show_default=False,
    ),
]
QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-q", help="Print only the verdict line of each dump.")
]
VersionOpt = Annotated[
    bool,
    typer.Option(
        "--version", is_eager=True, callback=show_version, help="Print the version and exit."
    ),
]
SGLangOpt = Annotated[
    bool,
    typer.Option(
        "--sglang",
        help="Also run the installed SGLang's own plan launcher and compare it with kvcanary's "
        "model (exit 2 when SGLang is missing or its launcher's signature differs).",
    ),
]
SelftestSizeOpt = Annotated[
    str, typer.Option("--size", metavar="tiny|small", help="Size of the scenario dumps.")
]
SynthLogOpt = Annotated[
    Path | None,
    typer.Option(
        "--log",
        help="Also write the server log SGLang would print for the scenario's violation ring "
        "(canary scenarios).",
    ),
]
SourcesArg = Annotated[
    list[str],
    typer.Argument(
        help="Dumps (their violation_ring) or server logs; - reads a log from stdin.",
        show_default=False,
        metavar="SOURCE",
    ),
]
ReplayOpt = Annotated[
    bool,
    typer.Option(
        "--replay",
        help="Replay the dump's verify launches on its canary buffers (the rows SGLang would "
        "record) and compare them with the rows read.",
    ),
]
ViolationGroupOpt = Annotated[
    Group | None,
    typer.Option("--group", "-g", help="Only rows and replays of this group.", **choice_of(*Group)),
]
BufferOpt = Annotated[
    Buffer | None,
    typer.Option(
        "--buffer",
        help="Only rows and replays of this canary buffer (sweeps read tail.*).",
        **choice_of(*Buffer),
    ),
]
JoinDumpOpt = Annotated[
    Path | None,
    typer.Option("--dump", help="The dump to explain log rows against (and to replay)."),
]
ViolationRowsOpt = Annotated[
    int,
    typer.Option(
        "--max-rows",
        **integer("Rows shown in table and markdown output (JSON lists all).", 1, metavar="N"),
    ),
]
#: what `with_scalar_overrides` hands a command.
Overrides = dict[str, int | None] | None
