"""The `kvcanary` command line: parse options, call the library, print, map to an exit code.

Nothing here decides anything about dumps; it only maps names to objects and wires
dump → planners/analysis → render. Heavy modules (torch) are imported inside the commands, so
`kvcanary --help` starts fast. Options are declared in `cli_options`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Annotated

import typer

from kvcanary_cli import __version__
from kvcanary_cli import cli_options as opt
from kvcanary_cli.analysis.model import Severity
from kvcanary_cli.cli_options import (
    ExitCode,
    GroupChoice,
    OneLineErrors,
    Space,
    check_exit,
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
    render_violations,
)
from kvcanary_cli.render.console import progress

__all__ = ["ExitCode", "app", "main"]

app = typer.Typer(
    name="kvcanary",
    cls=OneLineErrors,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,
    help="Diagnose KV-cache dumps of SGLang's kv canary: run the reference planner and the GPU "
    "kernel on a dump, compare them, and show every bad slot with where it came from.\n\n"
    "Exit codes: 0 clean, 1 findings, 2 bad input or usage, 3 internal error.",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvcanary {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Diagnose KV-cache dumps of SGLang's kv canary."""


@app.command()
@with_scalar_overrides
def check(
    dumps: opt.DumpsArg,
    group: opt.GroupsOpt = GroupChoice.ALL,
    kernel: opt.KernelOpt = Kernel.TRITON,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    fail_on: opt.FailOnOpt = Severity.ERROR,
    max_rows: opt.FindingRowsOpt = 10,
    jobs: opt.JobsOpt = None,
    overrides: opt.Overrides = None,
) -> None:
    """Find every bad slot in a dump and say where it came from.

    Plans each group with SGLang's reference semantics (collecting every problem instead of
    raising at the first) and with the GPU kernel, compares them, and reports each finding
    with its provenance. Exit 0 clean, 1 findings at or above --fail-on, 2 bad input.
    """
    from kvcanary_cli.analysis.check import check_dumps

    with progress(f"checking {dumps[0]}", len(dumps)) as tick:
        report = check_dumps(
            dumps,
            reference=make_planner(Backend.TORCH),
            kernel=make_kernel(kernel),
            overrides=overrides,
            groups=None if group is GroupChoice.ALL else [group.value],
            fail_on=fail_on,
            jobs=jobs,
            progress=tick,
        )
    emit(render_check(report, output_format, max_rows=max_rows))
    raise typer.Exit(check_exit(report))


@app.command()
@with_scalar_overrides
def provenance(
    dump: opt.DumpArg,
    slot: opt.SlotOpt = None,
    row: opt.RowOpt = None,
    space: opt.SpaceOpt = Space.FULL,
    group: opt.RoleGroupOpt = None,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    overrides: opt.Overrides = None,
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
    answer = (
        slot_query(loaded, report, slot, space=space.value, group=chosen)
        if slot is not None
        else row_map(loaded, report, row or 0, group=chosen or "full")
    )
    emit(render_provenance(answer, output_format))


@app.command()
@with_scalar_overrides
def violations(
    sources: opt.SourcesArg,
    replay: opt.ReplayOpt = False,
    group: opt.ViolationGroupOpt = None,
    buffer: opt.BufferOpt = None,
    dump: opt.JoinDumpOpt = None,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    max_rows: opt.ViolationRowsOpt = 20,
    overrides: opt.Overrides = None,
) -> None:
    """Decode violation rings and kv_canary log lines, replay verify, explain each row.

    A SOURCE is a dump or a server log ('-': stdin). Exit 0 no row, 1 rows, 2 bad input.
    """
    from kvcanary_cli.analysis.violations import violations_report

    report = violations_report(
        sources, dump=dump, replay=replay, group=group, buffer=buffer, overrides=overrides
    )
    emit(render_violations(report, output_format, max_rows=max_rows))
    raise typer.Exit(ExitCode.FINDINGS if len(report.rows) else ExitCode.CLEAN)


@app.command()
@with_scalar_overrides
def plan(
    dump: opt.DumpArg,
    group: opt.PlanGroupOpt = Space.FULL,
    backend: opt.BackendOpt = Backend.TORCH,
    strict: opt.StrictOpt = False,
    out: opt.PlanOutOpt = None,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    max_rows: opt.RequestRowsOpt = 50,
    overrides: opt.Overrides = None,
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
def inspect(dump: opt.DumpArg, output_format: opt.FormatOpt = OutputFormat.TABLE) -> None:
    """Show what a dump holds: tensors, scalars (and their source), groups, batch, notes.

    Validates the file on the way: a malformed dump is reported as one error line, exit 2.
    """
    from kvcanary_cli.dump.describe import describe_dump
    from kvcanary_cli.dump.loader import load_dump

    emit(render_inspect(describe_dump(load_dump(dump)), output_format))


@app.command()
def synth(
    scenario: opt.ScenarioArg = None,
    out: opt.SynthOutOpt = None,
    seed: opt.SeedOpt = 0,
    size: opt.SizeOpt = "tiny",
    list_: opt.ListOpt = False,
    log: opt.SynthLogOpt = None,
) -> None:
    """Generate a realistic dump: a clean serving state or one bug class of the canary.

    Each dump records the findings `kvcanary check` must report in its metadata
    (kvcanary.expected_findings), so you can see what the tool says about a known bug.
    """
    from kvcanary_cli.canary.logs import write_scenario_log
    from kvcanary_cli.dump.scenarios import make_scenario, scenario_lines
    from kvcanary_cli.errors import OptionError

    if list_:
        typer.echo("\n".join(scenario_lines()))
        return
    if scenario is None or out is None:
        raise OptionError("give a SCENARIO and --out DUMP (or --list)", option="synth")
    state = make_scenario(scenario, seed=seed, size=size)
    logged = "" if log is None else f" and {write_scenario_log(state, log)}"
    typer.echo(f"wrote {state.save(out)}{logged} ({scenario}, seed {seed}, size {size})")


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    # One intra-op torch thread unless the user chose: kvcanary's work is memory-bound gathers,
    # and on CPU-quota'd containers extra threads spin against each other (seen: a
    # 121K-element arange 50x slower with 2 threads than with 1). Read when torch starts.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    app(args=argv, prog_name="kvcanary")
