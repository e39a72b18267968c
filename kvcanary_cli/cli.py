"""The `kvcanary` command line: parse options, call the library, print, map to an exit code.

Nothing here decides anything about dumps; it only maps names to objects and wires
dump → planners/analysis → render. Heavy modules (torch) are imported inside the commands, so
`kvcanary --help` starts fast.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from kvcanary_cli import __version__
from kvcanary_cli.analysis.model import CheckReport, Severity
from kvcanary_cli.cli_options import (
    ExitCode,
    GroupChoice,
    OneLineErrors,
    Space,
    fail,
    with_scalar_overrides,
)
from kvcanary_cli.planners import Backend, Kernel, make_kernel, make_planner
from kvcanary_cli.render import (
    OutputFormat,
    emit,
    render_check,
    render_inspect,
    render_plan,
    render_provenance,
)
from kvcanary_cli.render.console import progress

__all__ = ["ExitCode", "app", "main"]


app = typer.Typer(
    name="kvcanary", cls=OneLineErrors, no_args_is_help=True, add_completion=False,
    pretty_exceptions_enable=False, pretty_exceptions_show_locals=False, rich_markup_mode=None,
    help="Diagnose KV-cache dumps of SGLang's kv canary: run the reference planner and the GPU "
         "kernel on a dump, compare them, and show every bad slot with where it came from.\n\n"
         "Exit codes: 0 clean, 1 findings, 2 bad input or usage, 3 internal error.",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvcanary {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")
        ] = False) -> None:
    """Diagnose KV-cache dumps of SGLang's kv canary."""


DumpArg = Annotated[Path, typer.Argument(
    help="A .safetensors dump (format: docs/dump-format.md).", show_default=False,
    metavar="DUMP")]
FormatOpt = Annotated[OutputFormat, typer.Option(
    "--format", "-f", help="table for a terminal, json for scripts, markdown for a bug report.")]


@app.command()
@with_scalar_overrides
def check(
    dumps: Annotated[list[Path], typer.Argument(
        help="One or more .safetensors dumps (one per rank, say).", show_default=False,
        metavar="DUMP")],
    group: Annotated[GroupChoice, typer.Option(
        "--group", "-g", help="Groups to plan (all: every group the dump has).")
    ] = GroupChoice.ALL,
    kernel: Annotated[Kernel, typer.Option(
        "--kernel", "-k",
        help="What stands in for the production GPU path: triton (the kernels; compiled on "
             "CUDA, interpreted elsewhere), torch (same GPU semantics, vectorized: fast), none "
             "(skip the comparison).")] = Kernel.TRITON,
    output_format: FormatOpt = OutputFormat.TABLE,
    fail_on: Annotated[Severity, typer.Option(
        "--fail-on", help="Exit 1 when a finding is at least this severe.")] = Severity.ERROR,
    max_rows: Annotated[int, typer.Option(
        "--max-rows", min=1, help="Findings shown per code in table and markdown output "
                                  "(JSON lists them all).")] = 10,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", min=1, help="Processes for several dumps (default: the cores).")] = None,
    overrides: dict[str, int | None] | None = None,
) -> None:
    """Find every bad slot in a dump and say where it came from.

    Plans each group with SGLang's reference semantics (collecting every problem instead of
    raising at the first) and with the GPU kernel, compares them, and reports each finding
    with its provenance. Exit 0 clean, 1 findings at or above --fail-on, 2 bad input.
    """
    from kvcanary_cli.analysis.check import check_dumps

    with progress(f"checking {dumps[0]}", len(dumps)) as tick:
        report = check_dumps(
            dumps, reference=make_planner(Backend.TORCH), kernel=make_kernel(kernel),
            overrides=overrides, groups=None if group is GroupChoice.ALL else [group.value],
            fail_on=fail_on, jobs=jobs, progress=tick)
    emit(render_check(report, output_format, max_rows=max_rows))
    raise typer.Exit(_check_exit(report))


def _check_exit(report: CheckReport) -> ExitCode:
    for bad in report.dumps:
        if bad.error is not None:
            typer.echo(f"error: {bad.error}", err=True)
    if report.bad_input:
        return ExitCode.BAD_INPUT
    return ExitCode.FINDINGS if report.failed else ExitCode.CLEAN


@app.command()
@with_scalar_overrides
def provenance(
    dump: DumpArg,
    slot: Annotated[int | None, typer.Option(
        "--slot", "-s", help="Slot to trace: every req_to_token cell holding it.")] = None,
    row: Annotated[int | None, typer.Option(
        "--row", "-r", help="Pool row to map instead: live prefix, window, pending writes, "
                            "stale tail, bad cells marked.")] = None,
    space: Annotated[Space, typer.Option(
        "--space", help="Whether --slot is a full-pool slot or an SWA-pool slot.")
    ] = Space.FULL,
    group: Annotated[Space | None, typer.Option(
        "--group", "-g", help="Group whose window labels the roles (default: swa for "
                              "--space swa, else full).")] = None,
    output_format: FormatOpt = OutputFormat.TABLE,
    overrides: dict[str, int | None] | None = None,
) -> None:
    """Trace one slot (or map one pool row) through the whole req_to_token table.

    Shows every cell holding the slot with its role (verify, prefix, chain-prev,
    pending-write, stale-tail, idle-row), radix sharing, the slot's SWA translation, allocator
    state when the dump has free lists, and the findings touching it.
    """
    from kvcanary_cli.analysis.check import run_check
    from kvcanary_cli.analysis.query import row_map, slot_query
    from kvcanary_cli.dump.loader import load_dump
    from kvcanary_cli.errors import OptionError

    if (slot is None) == (row is None):
        raise OptionError("give exactly one of --slot N or --row R", option="--slot/--row")
    loaded = load_dump(dump, overrides=overrides)
    report = run_check(loaded, reference=make_planner(Backend.TORCH), kernel=None)
    chosen = None if group is None else group.value
    answer = (slot_query(loaded, report, slot, space=space.value, group=chosen)
              if slot is not None else row_map(loaded, report, row or 0, group=chosen or "full"))
    emit(render_provenance(answer, output_format))


@app.command()
@with_scalar_overrides
def plan(
    dump: DumpArg,
    group: Annotated[Space, typer.Option("--group", "-g", help="Group to plan.")] = Space.FULL,
    backend: Annotated[Backend, typer.Option(
        "--backend", "-b",
        help="reference: scalar, literal (slow); torch: vectorized, same results; triton: the "
             "GPU kernels (compiled on CUDA, interpreted elsewhere; GPU semantics on bad input).",
    )] = Backend.TORCH,
    strict: Annotated[bool, typer.Option(
        "--strict", help="With --backend reference: raise (exit 1) exactly where SGLang's "
                         "torch reference raises, with its message.")] = False,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Write the plan (SGLang's field names, trimmed to what upstream "
                            "defines) to this .safetensors file.")] = None,
    output_format: FormatOpt = OutputFormat.TABLE,
    max_rows: Annotated[int, typer.Option("--max-rows", help="Batch rows shown in the table.",
                                          min=1)] = 50,
    overrides: dict[str, int | None] | None = None,
) -> None:
    """Run one planner on one group and show the plan per request (or write it with --out).

    Exit 0 when planned; 1 when the planner raises like upstream would (--strict, or the GPU
    launch refusing the batch); 2 on bad input.
    """
    from kvcanary_cli.analysis.plan_summary import plan_record
    from kvcanary_cli.dump.loader import load_dump
    from kvcanary_cli.errors import UpstreamPlanError
    from kvcanary_cli.planners.plan_file import save_plan

    planner = make_planner(backend, strict=strict)
    loaded = load_dump(dump, overrides=overrides)
    try:
        result = planner.plan(loaded, group.value)
    except UpstreamPlanError as exc:
        fail(str(exc), ExitCode.FINDINGS)
    if out is not None and result.launch_error is None:
        save_plan(out, result, source=str(dump))
    emit(render_plan(plan_record(loaded, result), output_format, max_rows=max_rows))
    if result.launch_error is not None:
        fail(f"ValueError: {result.launch_error}", ExitCode.FINDINGS)


@app.command()
def inspect(dump: DumpArg, output_format: FormatOpt = OutputFormat.TABLE) -> None:
    """Show what a dump holds: tensors, scalars (and their source), groups, batch, notes.

    Validates the file on the way: a malformed dump is reported as one error line, exit 2.
    """
    from kvcanary_cli.dump.describe import describe_dump
    from kvcanary_cli.dump.loader import load_dump

    emit(render_inspect(describe_dump(load_dump(dump)), output_format))


@app.command()
def synth(
    scenario: Annotated[str | None, typer.Argument(
        help="Scenario name (see --list).", show_default=False, metavar="SCENARIO")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Dump file to write.")] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Random seed.")] = 0,
    size: Annotated[str, typer.Option(
        "--size", metavar="tiny|small|medium|large",
        help="tiny/small for examples and tests; medium (2049 x 32772) and large "
             "(4097 x 131076) req_to_token for benchmarks.")] = "tiny",
    list_: Annotated[bool, typer.Option("--list", help="List the scenarios.")] = False,
) -> None:
    """Generate a realistic dump: a clean serving state or one bug class of the canary.

    Each dump records the findings `kvcanary check` must report in its metadata
    (kvcanary.expected_findings), so you can see what the tool says about a known bug.
    """
    from kvcanary_cli.dump.scenarios import SCENARIOS, make_scenario
    from kvcanary_cli.errors import OptionError

    if list_:
        width = max(len(name) for name in SCENARIOS)
        for name, item in SCENARIOS.items():
            codes = ", ".join(item.expected) or "none (clean)"
            typer.echo(f"{name:<{width}}  {item.summary}  [{codes}]")
        return
    if scenario is None or out is None:
        raise OptionError("give a SCENARIO and --out DUMP (or --list)", option="synth")
    path = make_scenario(scenario, seed=seed, size=size).save(out)
    typer.echo(f"wrote {path} ({scenario}, seed {seed}, size {size})")


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    # One intra-op torch thread unless the user chose: kvcanary's work is memory-bound gathers,
    # and on CPU-quota'd containers extra threads spin against each other (seen: a
    # 121K-element arange 50x slower with 2 threads than with 1). Read when torch starts.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    app(args=argv, prog_name="kvcanary")
