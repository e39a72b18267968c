"""The options several `kvcanary` commands share, declared once as typer `Annotated` aliases
(`REPORT`: those of every command that reports), and the parsers typer is given for a choice,
an integer within its bounds (`option_values.Bounds`: the API checks the same numbers) and a
`--set NAME=VALUE`. Nothing here knows what a command does.
"""

from __future__ import annotations

from collections.abc import Iterable
from inspect import Parameter
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

import kvcanary_cli.option_values as values
from kvcanary_cli.dump.schema import SCALARS
from kvcanary_cli.dump.streams import write_standard_error
from kvcanary_cli.errors import OptionError
from kvcanary_cli.planners import PlannerChoice
from kvcanary_cli.render import DEFAULT_MAX_ROWS, OutputFormat

__all__ = ["REPORT", "argument", "choice_option", "integer_option", "overrides", "parse_positions"]

_Choice = TypeVar("_Choice", bound=str)


def choice_option(
    *names: str,
    among: Iterable[_Choice],
    help: str,
    aliases: dict[str, _Choice] | None = None,
    **more: Any,
) -> Any:
    """A `typer.Option` that takes one of `among` (strings, or members of one StrEnum).

    A parser of our own instead of typer's enum coercion (which takes a whole enum and words
    a wrong value in its validation library's terms): one enum serves several options with
    different subsets (`PlannerChoice`), and a wrong value reads "'x' is not one of a, b" in
    the one error line. An alias (an old name) is taken, with a note on stderr naming the
    choice it stands for.
    """
    by_value = {str(choice): choice for choice in among}
    aliases = aliases or {}

    def parse(text: str) -> _Choice:
        if text in aliases:
            new = aliases[text]
            write_standard_error(f"note: {names[0]} {text} is the old name of {names[0]} {new}")
            return new
        if text not in by_value:
            raise typer.BadParameter(f"{text!r} is not one of {', '.join(by_value)}")
        return by_value[text]

    def complete(incomplete: str) -> list[str]:  # a shell's TAB: the choices, as enums had
        return [value for value in by_value if value.startswith(incomplete)]

    metavar = "[" + "|".join(by_value) + "]"
    return typer.Option(
        *names, help=help, parser=parse, metavar=metavar, autocompletion=complete, **more
    )


def integer_option(
    *names: str, within: values.Bounds, help: str, metavar: str = "N", **more: Any
) -> Any:
    """A `typer.Option` that takes an integer `within` its bounds: the range in words at the
    end of the help (`0 to 2^31-1`, not click's `[0<=x<=2147483647]`), and a parser that
    refuses a value outside it in the one error line, in the words `api` refuses it in."""

    def parse(text: str | int) -> int:
        return _integer(text, within)

    said = f"{help} [{within}]" if str(within) else help
    return typer.Option(*names, help=said, parser=parse, metavar=metavar, **more)


def _assignment(text: str) -> str:
    """`--set NAME=VALUE`: NAME a scalar of the format, VALUE an integer within its range
    (dump/schema.py `SCALARS`), checked as it is parsed (`overrides` reads it back)."""
    name, sep, value = text.partition("=")
    if not sep:
        raise typer.BadParameter(f"{text!r} is not NAME=VALUE (e.g. page_size=16)")
    if (spec := SCALARS.get(name)) is None:
        raise typer.BadParameter(f"{name!r} is not one of {', '.join(SCALARS)}")
    try:
        _integer(value, values.Bounds(spec.minimum, spec.maximum))
    except typer.BadParameter as exc:
        raise typer.BadParameter(f"{name}: {exc.message}") from None
    return text


def _integer(text: str | int, within: values.Bounds) -> int:
    """`text` as an integer within its bounds, or the one error line saying why not."""
    try:
        value = int(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not an integer") from None
    if (refused := within.refusal(value)) is not None:
        raise typer.BadParameter(refused)
    return value


def overrides(assignments: list[str] | None) -> dict[str, int]:
    """`--set NAME=VALUE ...` as `api` takes it: each scalar once."""
    given: dict[str, int] = {}
    for name, _, value in (text.partition("=") for text in assignments or ()):
        if name in given:
            raise OptionError(f"{name} is given twice", option="overrides")
        given[name] = int(value)
    return given


def parse_positions(text: str | None) -> tuple[int, int] | None:
    """`START:END` -> (start, end); either side may be empty (the row's start or end). Their
    range is `api.provenance`'s to check."""
    if text is None:
        return None
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return (int(start) if start else 0, int(end) if end else 1 << 62)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not START:END (e.g. 3000:4000)") from None


def _image_file(value: Path | None) -> Path | None:
    """`--svg FILE`: an image is a file (`-`, standard output, is none)."""
    if value is not None and str(value) in ("", "-"):
        raise OptionError("writes an image file: name one", option="svg")
    return value


def argument(metavar: str, help: str) -> Any:
    """A positional argument shown by its metavar (`DUMP...`, never a Python type)."""
    return typer.Argument(help=help, metavar=metavar)


#: `--kernel` and `--backend` names of earlier versions: the vectorized planner ran on torch.
OLD_NAMES = {"torch": PlannerChoice.VECTORIZED}

# every command that reports
FormatOpt = Annotated[
    OutputFormat,
    choice_option(
        "--format",
        "-f",
        among=OutputFormat,
        help="table for a terminal, json for scripts, markdown for a bug report.",
    ),
]
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
        callback=_image_file,
    ),
]
RowsOpt = Annotated[
    int,
    integer_option(
        "--max-rows",
        within=values.POSITIVE,
        help="Rows of each table in table and markdown output (JSON lists them all).",
    ),
]
# every command that reads a dump's scalars
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="NAME=VALUE",
        parser=_assignment,
        help="Override a scalar of the dump (repeatable): "
        + ", ".join(SCALARS)
        + " (`kvcanary inspect` shows each and its source; docs/dump-format.md, the ranges).",
    ),
]
DumpArg = Annotated[Path, argument("DUMP", "A .safetensors dump (format: docs/dump-format.md).")]
SeedOpt = Annotated[int, integer_option("--seed", within=values.INDEX, help="Random seed.")]

_KEYWORD = Parameter.KEYWORD_ONLY
#: The options of every command that reports (`cli.reports` adds those it does not declare).
REPORT = [
    Parameter("max_rows", _KEYWORD, default=DEFAULT_MAX_ROWS, annotation=RowsOpt),
    Parameter("output_format", _KEYWORD, default=OutputFormat.TABLE, annotation=FormatOpt),
    Parameter("output", _KEYWORD, default=None, annotation=OutputOpt),
    Parameter("force", _KEYWORD, default=False, annotation=ForceOpt),
    Parameter("svg", _KEYWORD, default=None, annotation=SvgOpt),
]
