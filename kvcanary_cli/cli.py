"""The `kvcanary` command line: parse options, call the library, print, map to an exit code.

Nothing here decides anything about dumps; it wires options → `api` (the library) → render →
`output`. Option declarations live in `cli_options`. Heavy modules (torch) are imported inside
the commands, so `kvcanary --help` starts fast.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

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
from kvcanary_cli.output import deliver
from kvcanary_cli.planners import Backend, Kernel
from kvcanary_cli.render import (
    OutputFormat,
    render_check,
    render_inspect,
    render_plan,
    render_provenance,
    render_selftest,
    render_violations,
)
from kvcanary_cli.render.console import progress
from kvcanary_cli.safe_text import printable

__all__ = ["ExitCode", "app", "main"]

app = typer.Typer(
    name="kvcanary",
    cls=OneLineErrors,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,
    help="Diagnose KV-cache dumps of SGLang's kv canary: run the reference planner and the GPU "
    "kernel on a dump, compare them, and show every bad slot with where it came from.\n\n"
    "Exit codes: 0 clean, 1 findings, 2 bad input or usage, 3 internal error.",
)


@app.callback()
def _root(version: opt.VersionOpt = False) -> None:
    """Diagnose KV-cache dumps of SGLang's kv canary."""
    if version:
        typer.echo(f"kvcanary {__version__}")
        raise typer.Exit()


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
    quiet: opt.QuietOpt = False,
    output: opt.OutputOpt = None,
    force: opt.ForceOpt = False,
    overrides: opt.Overrides = None,
) -> None:
    """Find every bad slot in a dump and say where it came from.

    Plans each group with SGLang's reference semantics (collecting every problem instead of
    raising at the first) and with the GPU kernel, compares them, and reports the diagnosis
    (causes, most likely first) and each finding with its provenance. Exit 0 clean, 1
    findings at or above --fail-on, 2 bad input.
    """
    from kvcanary_cli import api

    with progress(f"checking {dumps[0]}", len(dumps)) as tick:
        report = api.check(
            dumps,
            kernel=kernel,
            groups=None if group is GroupChoice.ALL else [group.value],
            overrides=overrides,
            fail_on=fail_on,
            jobs=jobs,
            progress=tick,
        )
    rendered = render_check(report, output_format, max_rows=max_rows, quiet=quiet)
    deliver(rendered, output, force=force, inputs=dumps)
    raise typer.Exit(check_exit(report))


@app.command()
@with_scalar_overrides
def provenance(
    dump: opt.DumpArg,
    slot: opt.SlotOpt = None,
    row: opt.RowOpt = None,
    space: opt.SpaceOpt = Space.FULL,
    group: opt.RoleGroupOpt = None,
    positions: opt.PositionsOpt = None,
    max_rows: opt.CellsOpt = 256,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    output: opt.OutputOpt = None,
    force: opt.ForceOpt = False,
    overrides: opt.Overrides = None,
) -> None:
    """Trace one slot (or map one pool row) through the whole req_to_token table.

    Shows every cell holding the slot with its role (verify, prefix, chain-prev,
    pending-write, stale-tail, idle-row), live cells first, radix sharing, the slot's SWA
    translation, allocator state when the dump has free lists, and the findings touching it.
    A row map marks the cells with findings and says which positions it leaves out.
    """
    from kvcanary_cli import api

    answer = api.provenance(
        dump,
        slot=slot,
        row=row,
        space=space.value,
        group=None if group is None else group.value,
        positions=opt.parse_positions(positions),
        max_cells=max_rows,
        overrides=overrides,
    )
    deliver(render_provenance(answer, output_format), output, force=force, inputs=[dump])


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
    output: opt.OutputOpt = None,
    force: opt.ForceOpt = False,
    overrides: opt.Overrides = None,
) -> None:
    """Decode violation rings and kv_canary log lines, replay verify, explain each row.

    A SOURCE is a dump or a server log ('-': stdin). Exit 0 no row, 1 rows, 2 bad input.
    """
    from kvcanary_cli import api

    report = api.violations(
        sources, dump=dump, replay=replay, group=group, buffer=buffer, overrides=overrides
    )
    readable: list[str | os.PathLike[str]] = [s for s in sources if s != "-"]
    readable += [dump] if dump is not None else []
    deliver(
        render_violations(report, output_format, max_rows=max_rows),
        output,
        force=force,
        inputs=readable,
    )
    raise typer.Exit(ExitCode.FINDINGS if len(report.rows) else ExitCode.CLEAN)


@app.command()
@with_scalar_overrides
def plan(
    dump: opt.DumpArg,
    group: opt.PlanGroupOpt = Space.FULL,
    backend: opt.BackendOpt = Backend.TORCH,
    strict: opt.StrictOpt = False,
    out: opt.PlanOutOpt = None,
    force: opt.ForceOpt = False,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    max_rows: opt.RequestRowsOpt = 50,
    overrides: opt.Overrides = None,
) -> None:
    """Run one planner on one group and show the plan per request (or write it with --out).

    Exit 0 when planned; 1 when upstream would raise (--strict raises like SGLang's reference;
    without it the plan goes on and marks the values upstream leaves undefined), or when the
    GPU launch refuses the batch; 2 on bad input.
    """
    from kvcanary_cli import api
    from kvcanary_cli.errors import UpstreamPlanError
    from kvcanary_cli.planners.plan_file import save_plan, upstream_raise

    try:
        loaded, result, record = api.plan(
            dump, group=group.value, backend=backend, strict=strict, overrides=overrides
        )
    except UpstreamPlanError as exc:
        fail(str(exc), ExitCode.FINDINGS)
    if result.skipped is not None:  # nothing to write or show entry by entry
        fail(f"not planned: {result.skipped}", ExitCode.FINDINGS)
    if out is not None and result.launch_error is None:
        save_plan(out, result, dump=loaded, overwrite=force)
    deliver(render_plan(record, output_format, max_rows=max_rows), None)
    if result.launch_error is not None:
        fail(f"{result.launch_error_type}: {result.launch_error}", ExitCode.FINDINGS)
    if (raised := upstream_raise(result)) is not None:
        marked = f"; {out} marks them in kvcanary.verify_undefined" if out else ""
        fail(f"SGLang's reference raises here: {raised} (planned on past it{marked})", 1)


@app.command()
def inspect(
    dump: opt.DumpArg,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    output: opt.OutputOpt = None,
    force: opt.ForceOpt = False,
) -> None:
    """Show what a dump holds: tensors, scalars (and their source), groups, batch, notes.

    Validates the file on the way: a malformed dump is reported as one error line, exit 2.
    """
    from kvcanary_cli import api

    deliver(render_inspect(api.inspect(dump), output_format), output, force=force, inputs=[dump])


@app.command()
@with_scalar_overrides
def shrink(
    dump: opt.DumpArg,
    out: opt.ShrinkOutOpt = None,
    force: opt.ForceOpt = False,
    overrides: opt.Overrides = None,
) -> None:
    """Write a small dump that tells the same story, to attach to a bug report.

    Keeps what the analysis of DUMP reads (the batch's rows, every cell a finding's provenance
    names, the LUT entries, free-list entries and canary records of those slots, the
    violation ring), in the original pool rows, positions and slots, and records the original's
    name, size and sha256 and what was dropped. `check` gives the same findings on it.
    """
    from kvcanary_cli import api
    from kvcanary_cli.errors import OptionError

    if out is None or str(out) == "-":
        raise OptionError("give the small dump's file: -o SMALL.safetensors", option="--out")
    result = api.shrink(dump, out, overrides=overrides, force=force)
    typer.echo("\n".join(result.summary_lines()))


@app.command()
def synth(
    scenario: opt.ScenarioArg = None,
    out: opt.SynthOutOpt = None,
    seed: opt.SeedOpt = 0,
    size: opt.SizeOpt = "tiny",
    list_: opt.ListOpt = False,
    force: opt.ForceOpt = False,
    log: opt.SynthLogOpt = None,
) -> None:
    """Generate a realistic dump: a clean serving state or one bug class of the canary.

    Each dump records the findings `kvcanary check` must report and the cause it must rank
    first in its metadata (kvcanary.expected_findings, kvcanary.expected_diagnosis).
    """
    from kvcanary_cli.canary.logs import write_scenario_log
    from kvcanary_cli.dump.scenarios import make_scenario, scenario_lines
    from kvcanary_cli.errors import OptionError

    if list_:
        typer.echo("\n".join(scenario_lines()))
        return
    if scenario is None or out is None:
        raise OptionError("give a SCENARIO and --out DUMP (or --list)", option="synth")
    if log is not None and str(log) == str(out):
        raise OptionError("names the dump's own file; give the log another name", option="--log")
    state = make_scenario(scenario, seed=seed, size=size)
    path = state.save(out, overwrite=force)
    logged = "" if log is None else f" and {write_scenario_log(state, log, overwrite=force)}"
    wrote = f"wrote {path}{logged} ({scenario}, seed {seed}, size {size})"
    typer.echo(printable(wrote), err=str(out) == "-")


@app.command()
def selftest(
    sglang: opt.SGLangOpt = False,
    size: opt.SelftestSizeOpt = "tiny",
    seed: opt.SeedOpt = 0,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    output: opt.OutputOpt = None,
    force: opt.ForceOpt = False,
) -> None:
    """Compare kvcanary's planners (and, with --sglang, your SGLang) on every synth scenario.

    Per plan field and raise: the drift report to attach when kvcanary and your SGLang
    disagree. Exit 0 on full agreement, 1 on any difference.
    """
    from kvcanary_cli import api

    record = api.selftest(sglang=sglang, size=size, seed=seed)
    deliver(render_selftest(record, output_format), output, force=force)
    raise typer.Exit(ExitCode.CLEAN if record["verdict"] == "agree" else ExitCode.FINDINGS)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    # One intra-op torch thread unless the user chose: kvcanary's work is memory-bound gathers,
    # and on CPU-quota'd containers extra threads spin against each other (seen: a
    # 121K-element arange 50x slower with 2 threads than with 1). Read when torch starts.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    app(args=argv, prog_name="kvcanary")
