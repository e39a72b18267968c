"""What a parameter of an `api` function is on the command line, as data: `Arg` (positional)
and `Opt` (an option: flags, help, range or choices, how its text becomes the API's value);
`cli.command` makes typer's parameters of them, with the API function's default. Also the
options several commands share (`REPORT`: those of every command that reports) and the parsers
typer is given: a choice, an integer within its bounds (`option_values.Bounds`: the API checks
the same numbers), a `--set NAME=VALUE`. Nothing here knows what a command does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from inspect import Parameter
from pathlib import Path
from typing import Annotated, Any

import typer

import kvcanary_cli.option_values as values
from kvcanary_cli.dump.schema import SCALARS
from kvcanary_cli.dump.streams import write_standard_error
from kvcanary_cli.errors import OptionError
from kvcanary_cli.planners import PlannerChoice
from kvcanary_cli.render import DEFAULT_MAX_ROWS, OutputFormat

__all__ = ["DUMP", "OLD_NAMES", "REPORT", "SEED", "SET", "Arg", "Opt", "parse_positions"]

#: A default left to the API function's signature.
API_DEFAULT: Any = Parameter.empty


class Arg:
    """A positional argument, shown by its metavar (`DUMP...`, never a Python type); `many`:
    one or more."""

    def __init__(self, metavar: str, help: str, *, kind: Any = Path, many: bool = False) -> None:
        self.metavar, self.help, self.kind, self.many = metavar, help, kind, many

    def parameter(self, name: str, default: Any, panel: str | None = None) -> Parameter:
        """typer's parameter `name` (`default`: the API's; none: required; `panel`: an
        option's heading, none for an argument)."""
        kind = list[self.kind] if self.many else self.kind  # type: ignore[name-defined]
        return _typed(name, kind, default, typer.Argument(help=self.help, metavar=self.metavar))

    def value(self, given: Any) -> Any:
        """The parsed value, as the API takes it."""
        return given


class Opt:
    """An option: its help and flags (the long flag the API keyword's, `page_size` is
    `--page-size`, unless the first flag given is a long one), and what it takes: one of
    `among`, an integer `within` bounds, or a `kind` (str, Path, bool, list[str]: repeatable).
    `default` where the command line's is not the API's; `convert` makes the parsed value the
    API's; `more` goes to `typer.Option` as it is."""

    def __init__(
        self,
        help: str,
        *flags: str,
        among: Iterable[Any] | None = None,
        within: values.Bounds | None = None,
        kind: Any = str,
        metavar: str | None = None,
        default: Any = API_DEFAULT,
        convert: Callable[[Any], Any] | None = None,
        aliases: dict[str, Any] | None = None,
        **more: Any,
    ) -> None:
        self.help, self.flags, self.among, self.within = help, flags, among, within
        self.kind, self.metavar, self.default, self.convert = kind, metavar, default, convert
        self.aliases, self.more = aliases or {}, more

    def parameter(self, name: str, default: Any, panel: str | None = None) -> Parameter:
        """typer's parameter `name` (`default`: the API's, unless this option has its own;
        an option the API requires is None when not given, for the API to refuse), listed
        under the heading `panel` in `--help` (None: "Options")."""
        if self.default is not API_DEFAULT or default is Parameter.empty:
            default = None if self.default is API_DEFAULT else self.default
        long = () if self.flags[:1] and self.flags[0].startswith("--") else ("--" + name,)
        names = [flag.replace("_", "-") for flag in (*long, *self.flags)]
        more = {**self.more, "rich_help_panel": panel}
        kind: Any = str
        if self.among is not None:
            option = self._choice(names, more)
        elif self.within is not None:
            kind, option = int, self._integer(names, more)
        else:
            kind = bool if isinstance(default, bool) else self.kind
            option = typer.Option(*names, help=self.help, metavar=self.metavar, **more)
        return _typed(name, kind, default, option)

    def value(self, given: Any) -> Any:
        """The parsed value as the API takes it."""
        return given if self.convert is None else self.convert(given)

    def _choice(self, names: list[str], more: dict[str, Any]) -> Any:
        """A parser of our own instead of typer's enum coercion (which takes a whole enum and
        words a wrong value in its validation library's terms): one enum serves several
        options with different subsets (`PlannerChoice`), and a wrong value reads "'x' is not
        one of a, b" in the one error line. An alias (an old name) is taken, with a note on
        stderr naming the choice it stands for."""
        by_value = {str(choice): choice for choice in self.among or ()}

        def parse(text: str) -> Any:
            if text in self.aliases:
                new = self.aliases[text]
                write_standard_error(f"note: {names[0]} {text} is the old name of {names[0]} {new}")
                return new
            if text not in by_value:
                raise typer.BadParameter(f"{text!r} is not one of {', '.join(by_value)}")
            return by_value[text]

        def complete(incomplete: str) -> list[str]:  # a shell's TAB: the choices, as enums had
            return [value for value in by_value if value.startswith(incomplete)]

        return typer.Option(
            *names, help=self.help, parser=parse, metavar="[" + "|".join(by_value) + "]",
            autocompletion=complete, **more,
        )  # fmt: skip

    def _integer(self, names: list[str], more: dict[str, Any]) -> Any:
        """An integer within its bounds: the range in words at the end of the help (`0 to
        2^31-1`, not click's `[0<=x<=2147483647]`), and a value outside it refused in the one
        error line, in the words `api` refuses it in."""
        within = self.within or values.Bounds()
        said = f"{self.help} [{within}]" if str(within) else self.help
        return typer.Option(
            *names, help=said, parser=lambda text: _integer(text, within),
            metavar=self.metavar or "N", **more,
        )  # fmt: skip


def _typed(name: str, kind: Any, default: Any, info: Any) -> Parameter:
    """The keyword parameter typer reads: `kind` (or None, the default) annotated with `info`."""
    annotated: Any = Annotated  # built at run time, from a type typer reads
    kind = kind | None if default is None else kind
    return Parameter(
        name, Parameter.KEYWORD_ONLY, default=default, annotation=annotated[kind, info]
    )


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


def _overrides(assignments: list[str] | None) -> dict[str, int]:
    """`--set NAME=VALUE ...` as `api` takes it: each scalar once."""
    given: dict[str, int] = {}
    for name, _, value in (text.partition("=") for text in assignments or ()):
        if name in given:
            raise OptionError(f"{name} is given twice", option="overrides")
        given[name] = int(value)
    return given


def parse_positions(text: str) -> tuple[int, int]:
    """`START:END` -> (start, end); either side may be empty (the row's start or end). Their
    range is `api.provenance`'s to check."""
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


#: `--kernel` and `--backend` names of earlier versions: the vectorized planner ran on torch.
OLD_NAMES = {"torch": PlannerChoice.VECTORIZED}

#: The options of every command that reports (`cli.command` adds those it does not declare).
REPORT = {
    "max_rows": Opt(
        "Rows of each table in table and markdown output (JSON lists them all).",
        within=values.POSITIVE,
        default=DEFAULT_MAX_ROWS,
    ),
    "output_format": Opt(
        "table for a terminal, json for scripts, markdown for a bug report.",
        *("--format", "-f"),
        among=OutputFormat,
        default=OutputFormat.TABLE,
    ),
    "output": Opt(
        "Write the report to FILE instead of standard output (- is standard output).",
        *("--output", "-o"),
        kind=Path,
        metavar="FILE",
        default=None,
    ),
    "force": Opt("Overwrite an existing output file.", default=False),
    "svg": Opt(
        "Also save the report as an SVG image (in colour, as the terminal shows it), to attach "
        "to an issue.",
        kind=Path,
        metavar="FILE",
        default=None,
        callback=_image_file,
    ),
}
#: Every command that reads a dump's scalars.
SET = Opt(
    "Override a scalar of the dump (repeatable): "
    + ", ".join(SCALARS)
    + " (`kvcanary inspect` shows each and its source; docs/dump-format.md, the ranges).",
    "--set",
    kind=list[str],
    metavar="NAME=VALUE",
    parser=_assignment,
    convert=_overrides,
)
DUMP = Arg("DUMP", "A .safetensors dump (format: docs/dump-format.md).")
SEED = Opt("Random seed.", within=values.INDEX, default=0)
