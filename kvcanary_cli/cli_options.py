"""Every option of the `kvcanary` commands, declared once as a typer `Annotated` alias (a
command writes out the ones it takes), and the parsers typer is given for a choice and for an
integer within its bounds (`option_values.Bounds`: the API checks the same numbers).

`cli` declares the commands with these; nothing here knows what a command does.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

import kvcanary_cli.option_values as values
from kvcanary_cli.catalog import Severity
from kvcanary_cli.dump.schema import SCALARS, Group
from kvcanary_cli.dump.streams import write_standard_error
from kvcanary_cli.errors import OptionError
from kvcanary_cli.planners import BACKENDS, KERNELS, PlannerChoice
from kvcanary_cli.render.console import OutputFormat
from kvcanary_cli.results.cells import Space

__all__ = ["ALL_GROUPS", "choice_option", "integer_option", "overrides", "parse_positions"]

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
        try:
            value = int(text)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not an integer") from None
        if (refused := within.refusal(value)) is not None:
            raise typer.BadParameter(refused)
        return value

    said = f"{help} [{within}]" if str(within) else help
    return typer.Option(*names, help=said, parser=parse, metavar=metavar, **more)


def overrides(ctx: typer.Context) -> dict[str, int | None]:
    """A command's scalar overrides (its `--swa-window` ... options, its parameters named as the
    format's scalars), keyed by scalar name, as `api` takes them."""
    return {name: ctx.params[name] for name in SCALARS}


def _image_file(value: Path | None) -> Path | None:
    """`--svg FILE`: an image is a file (`-`, standard output, is none)."""
    if value is not None and str(value) in ("", "-"):
        raise OptionError("writes an image file: name one", option="--svg")
    return value


def _scalar(name: str) -> Any:
    """The option of scalar `name` of the format (dump/schema.py `SCALARS`, its range too): a
    value given wins over the dump's (`overrides`)."""
    spec = SCALARS[name]
    return integer_option(
        spec.option,
        within=values.Bounds(spec.minimum, spec.maximum),
        help=f"Override {spec.name}: {spec.meaning} (default: {spec.default}).",
        metavar="INT",
        rich_help_panel="Scalar overrides",
    )


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


def _argument(metavar: str, help: str) -> Any:
    return typer.Argument(help=help, show_default=False, metavar=metavar)


def _rows(help: str) -> Any:
    return integer_option("--max-rows", within=values.POSITIVE, help=help)


# --- the options of the commands, declared once -------------------------------------------

#: `check --group all`: every group the dump has.
ALL_GROUPS = "all"
#: `--kernel` and `--backend` names of earlier versions: the vectorized planner ran on torch.
_OLD_NAMES = {"torch": PlannerChoice.VECTORIZED}

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
        show_default=False,
        callback=_image_file,
    ),
]
DumpArg = Annotated[Path, _argument("DUMP", "A .safetensors dump (format: docs/dump-format.md).")]
SeedOpt = Annotated[int, integer_option("--seed", within=values.INDEX, help="Random seed.")]
#: the scalar overrides, one option a scalar of the format; a command taking them names its
#: parameters as the scalars (`overrides` reads them back)
SwaWindowOpt = Annotated[int | None, _scalar("swa_window_size")]
VerifyCapacityOpt = Annotated[int | None, _scalar("verify_capacity")]
WriteCapacityOpt = Annotated[int | None, _scalar("write_req_capacity")]
TokenOffsetOpt = Annotated[int | None, _scalar("kv_token_id_vs_position_offset")]
PageSizeOpt = Annotated[int | None, _scalar("page_size")]
FullSlotsOpt = Annotated[int | None, _scalar("num_full_slots")]
SwaSlotsOpt = Annotated[int | None, _scalar("num_swa_slots")]

# check
DumpsArg = Annotated[
    list[Path], _argument("DUMP", "One or more .safetensors dumps (one per rank, say).")
]
GroupsOpt = Annotated[
    str,
    choice_option(
        "--group",
        "-g",
        among=[*Group, ALL_GROUPS],
        help="Groups to plan (all: every group the dump has).",
    ),
]
KernelOpt = Annotated[
    PlannerChoice,
    choice_option(
        "--kernel",
        "-k",
        among=KERNELS,
        aliases=_OLD_NAMES,
        help="What stands in for the production GPU path: triton (the kernels; compiled on CUDA, "
        "interpreted elsewhere), vectorized (same GPU semantics in numpy: fast), sglang (the "
        "installed SGLang's own launcher: its kernels on CUDA, its torch reference elsewhere), "
        "none (skip the comparison). torch: the old name of vectorized.",
    ),
]
FailOnOpt = Annotated[
    Severity,
    choice_option(
        "--fail-on", among=Severity, help="Exit 1 when a finding is at least this severe."
    ),
]
JobsOpt = Annotated[
    int | None,
    integer_option(
        "--jobs",
        "-j",
        within=values.POSITIVE,
        help="Processes for several dumps (default: the cores; never more than the cores, the "
        "dumps, or what the available memory holds).",
    ),
]
QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-q", help="Print only the verdict line of each dump.")
]
FindingRowsOpt = Annotated[
    int,
    _rows(
        "Rows of each table in table and markdown output: findings per code, requests (JSON "
        "lists them all)."
    ),
]

# provenance
ProvenanceDumpsArg = Annotated[
    list[Path],
    _argument("DUMP", "A dump; or several of one rank, with --slot: the slot's owners over time."),
]
SlotOpt = Annotated[
    int | None,
    integer_option(
        "--slot",
        "-s",
        within=values.SLOT,
        help="Slot to trace: every req_to_token cell holding it.",
    ),
]
RowOpt = Annotated[
    int | None,
    integer_option(
        "--row",
        "-r",
        within=values.INDEX,
        metavar="R",
        help="Pool row to map instead: live prefix, window, pending writes, stale tail, bad "
        "cells marked.",
    ),
]
SpaceOpt = Annotated[
    Space,
    choice_option(
        "--space", among=Space, help="Whether --slot is a full-pool slot or an SWA-pool slot."
    ),
]
RoleGroupOpt = Annotated[
    Group | None,
    choice_option(
        "--group",
        "-g",
        among=Group,
        help="Group whose window labels the roles (default: swa for --space swa, else full).",
    ),
]
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
    _rows(
        "Rows of each table: cells per slot for --slot, per row map for --row (marked cells "
        "first), and the findings touching it (JSON lists them all)."
    ),
]

# timeline, diff
SequenceArg = Annotated[
    list[Path],
    _argument("DUMP", "Two or more dumps of one rank, in any order: they are read by their step."),
]
OldArg = Annotated[Path, _argument("OLD", "The earlier dump.")]
NewArg = Annotated[Path, _argument("NEW", "The later dump, of the same rank.")]
ChangeRowsOpt = Annotated[
    int, _rows("Owner changes listed (diff) in table and markdown output (JSON lists them all).")
]

# violations
SourcesArg = Annotated[
    list[str],
    _argument("SOURCE", "Dumps (their violation_ring) or server logs; - reads a log from stdin."),
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
    choice_option("--group", "-g", among=Group, help="Only rows and replays of this group."),
]
BufferOpt = Annotated[
    str | None,
    choice_option(
        "--buffer",
        among=values.BUFFER_CHOICES,
        help="Only rows and replays of this canary buffer (sweeps read tail.*).",
    ),
]
JoinDumpOpt = Annotated[
    Path | None,
    typer.Option("--dump", help="The dump to explain log rows against (and to replay)."),
]
ViolationRowsOpt = Annotated[
    int, _rows("Rows shown in table and markdown output (JSON lists all).")
]

# plan
PlanGroupOpt = Annotated[Group, choice_option("--group", "-g", among=Group, help="Group to plan.")]
BackendOpt = Annotated[
    PlannerChoice,
    choice_option(
        "--backend",
        "-b",
        among=BACKENDS,
        aliases=_OLD_NAMES,
        help="reference: scalar, literal (slow); vectorized: numpy, same results; triton: the GPU "
        "kernels (compiled on CUDA, interpreted elsewhere; GPU semantics on bad input); sglang: "
        "the installed SGLang's own launcher (its kernels on CUDA, its torch reference "
        "elsewhere). torch: the old name of vectorized.",
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
RequestRowsOpt = Annotated[int, _rows("Batch rows shown in the table.")]

# shrink
ShrinkOutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        "-o",
        help="The small dump to write (.safetensors, format 1.2).",
        show_default=False,
    ),
]

# synth
ScenarioArg = Annotated[str | None, _argument("SCENARIO", "Scenario name (see --list).")]
SynthOutOpt = Annotated[
    Path | None,
    typer.Option("--out", "-o", help="Dump file to write (with --steps: a folder)."),
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
SynthLogOpt = Annotated[
    Path | None,
    typer.Option(
        "--log",
        help="Also write the server log SGLang would print for the scenario's violation ring "
        "(canary scenarios).",
    ),
]
SynthPageSizeOpt = Annotated[
    int | None,
    integer_option(
        "--page-size",
        within=values.PAGE_SIZE,
        metavar="SLOTS",
        show_default=False,
        help="Slots per page of both pools (default: the scenario's own; the SWA page "
        "scenarios use 16). Page faults need 2 or more.",
    ),
]
StepsOpt = Annotated[
    int | None,
    integer_option(
        "--steps",
        within=values.STEPS,
        metavar="K",
        show_default=False,
        help="Write K dumps of one rank into the --out folder: SCENARIO is then a sequence "
        "(see --list), its event planted at --at.",
    ),
]
AtOpt = Annotated[
    int | None,
    integer_option(
        "--at",
        within=values.POSITIVE,
        metavar="STEP",
        show_default=False,
        help="With --steps: the forward step the event happens at (default: the middle dump's).",
    ),
]
EveryOpt = Annotated[
    int,
    integer_option(
        "--every", within=values.EVERY, help="With --steps: forward steps between dumps."
    ),
]

# selftest
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
