"""The `kvcanary` commands: each one's options written out (declared in `cli_options`) →
`api` → `render` → `output`, and its exit code (`cli_app`, which also builds, runs and ends the
app). `api` imports what a command runs when it runs, so `kvcanary --help` imports neither
torch nor triton."""

from __future__ import annotations

from collections.abc import Sequence

import typer

from kvcanary_cli import api, render
from kvcanary_cli import cli_options as opt
from kvcanary_cli.catalog import Severity
from kvcanary_cli.cli_app import ExitCode, check_exit, fail, make_app, run, timeline_exit
from kvcanary_cli.dump.files import check_targets
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.output import complain, deliver, tell, to_stdout
from kvcanary_cli.planners import PlannerChoice
from kvcanary_cli.render import OutputFormat
from kvcanary_cli.render.console import progress
from kvcanary_cli.results.cells import Space
from kvcanary_cli.safe_text import printable
from kvcanary_cli.soak import options as soak_opt

__all__ = ["ExitCode", "app", "main"]

app = make_app()


@app.command()
def check(
    ctx: typer.Context,
    dumps: opt.DumpsArg,
    group: opt.GroupsOpt = opt.ALL_GROUPS,
    kernel: opt.KernelOpt = PlannerChoice.TRITON,
    fail_on: opt.FailOnOpt = Severity.ERROR,
    jobs: opt.JobsOpt = None,
    quiet: opt.QuietOpt = False,
    max_rows: opt.FindingRowsOpt = 10,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    output: opt.OutputOpt = None,
    force: opt.ForceOpt = False,
    svg: opt.SvgOpt = None,
    swa_window_size: opt.SwaWindowOpt = None,
    verify_capacity: opt.VerifyCapacityOpt = None,
    write_req_capacity: opt.WriteCapacityOpt = None,
    kv_token_id_vs_position_offset: opt.TokenOffsetOpt = None,
    page_size: opt.PageSizeOpt = None,
    num_full_slots: opt.FullSlotsOpt = None,
    num_swa_slots: opt.SwaSlotsOpt = None,
) -> None:
    """Find every bad slot in a dump and say where it came from.

    Plans each group with SGLang's reference semantics (collecting every problem instead of
    raising at the first) and with the GPU kernel, compares them, and reports the diagnosis
    (causes, most likely first) and each finding with its provenance. Exit 0 clean, 1
    findings at or above --fail-on, 2 bad input.
    """
    with progress(f"checking {dumps[0]}", len(dumps)) as tick:
        report = api.check(
            dumps,
            kernel=kernel,
            groups=None if group == opt.ALL_GROUPS else [str(group)],
            overrides=opt.overrides(ctx),
            fail_on=fail_on,
            jobs=jobs,
            progress=tick,
        )
    view = render.render_check(
        report, output_format, max_rows=max_rows, quiet=quiet, to_stdout=to_stdout(output)
    )
    deliver(view, output, force=force, svg=svg, inputs=dumps)
    for unreadable in (dump.error for dump in report.dumps if dump.error is not None):
        complain(f"error: {unreadable}")
    raise typer.Exit(check_exit(report))


@app.command()
def provenance(
    ctx: typer.Context,
    dumps: opt.ProvenanceDumpsArg,
    slot: opt.SlotOpt = None,
    row: opt.RowOpt = None,
    space: opt.SpaceOpt = Space.FULL,
    group: opt.RoleGroupOpt = None,
    positions: opt.PositionsOpt = None,
    max_rows: opt.CellsOpt = 256,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    output: opt.OutputOpt = None,
    force: opt.ForceOpt = False,
    svg: opt.SvgOpt = None,
    swa_window_size: opt.SwaWindowOpt = None,
    verify_capacity: opt.VerifyCapacityOpt = None,
    write_req_capacity: opt.WriteCapacityOpt = None,
    kv_token_id_vs_position_offset: opt.TokenOffsetOpt = None,
    page_size: opt.PageSizeOpt = None,
    num_full_slots: opt.FullSlotsOpt = None,
    num_swa_slots: opt.SwaSlotsOpt = None,
) -> None:
    """Trace one slot (or map one pool row) through the whole req_to_token table.

    Shows every cell holding the slot with its role (verify, prefix, chain-prev,
    pending-write, stale-tail, idle-row), live cells first, radix sharing, the slot's SWA
    translation, allocator state when the dump has free lists, and the findings touching it.
    A row map marks the cells with findings and says which positions it leaves out.
    """
    overrides = opt.overrides(ctx)
    if len(dumps) > 1:  # the slot over the dumps
        history = api.slot_history(dumps, slot=slot, row=row, space=space, overrides=overrides)
        view = render.render_timeline(history, output_format)
        deliver(view, output, force=force, svg=svg, inputs=dumps)
        return
    answer = api.provenance(
        dumps[0],
        slot=slot,
        row=row,
        space=space.value,
        group=None if group is None else group.value,
        positions=opt.parse_positions(positions),
        max_cells=max_rows,
        overrides=overrides,
    )
    view = render.render_provenance(answer, output_format, max_rows=max_rows)
    deliver(view, output, force=force, svg=svg, inputs=dumps)


@app.command()
def timeline(
    dumps: opt.SequenceArg,
    max_rows: opt.ChangeRowsOpt = 10,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    output: opt.OutputOpt = None,
    force: opt.ForceOpt = False,
    svg: opt.SvgOpt = None,
) -> None:
    """What changed between dumps of one rank, and when: requests, slot owners, LUT, SWA leak.

    Each event (use-after-free, double-allocation, prefix-rewritten, lut-rewritten, swa-leak)
    with its slots or pages, the steps it happened between and its cause; the dump each
    finding first appears in. Exit 0 no event and no error finding, 1 otherwise, 2 bad input.
    """
    found = api.timeline(dumps)
    view = render.render_timeline(found, output_format, max_rows)
    deliver(view, output, force=force, svg=svg, inputs=dumps)
    raise typer.Exit(timeline_exit(found))


@app.command()
def diff(
    old: opt.OldArg,
    new: opt.NewArg,
    max_rows: opt.ChangeRowsOpt = 10,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    output: opt.OutputOpt = None,
    force: opt.ForceOpt = False,
    svg: opt.SvgOpt = None,
) -> None:
    """What changed from OLD to NEW, two dumps of one rank: the timeline of two dumps.

    Per request born, grew, finished, row reused; per slot owner changes; the events."""
    found = api.diff(old, new)
    view = render.render_timeline(found, output_format, max_rows)
    deliver(view, output, force=force, svg=svg, inputs=[old, new])
    raise typer.Exit(timeline_exit(found))


@app.command()
def violations(
    ctx: typer.Context,
    sources: opt.SourcesArg,
    replay: opt.ReplayOpt = False,
    group: opt.ViolationGroupOpt = None,
    buffer: opt.BufferOpt = None,
    dump: opt.JoinDumpOpt = None,
    max_rows: opt.ViolationRowsOpt = 20,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    output: opt.OutputOpt = None,
    force: opt.ForceOpt = False,
    svg: opt.SvgOpt = None,
    swa_window_size: opt.SwaWindowOpt = None,
    verify_capacity: opt.VerifyCapacityOpt = None,
    write_req_capacity: opt.WriteCapacityOpt = None,
    kv_token_id_vs_position_offset: opt.TokenOffsetOpt = None,
    page_size: opt.PageSizeOpt = None,
    num_full_slots: opt.FullSlotsOpt = None,
    num_swa_slots: opt.SwaSlotsOpt = None,
) -> None:
    """Decode violation rings and kv_canary log lines, replay verify, explain each row.

    A SOURCE: a dump or log ('-': stdin). Exit 0 clean, 1 rows or unreadable lines, 2 bad input.
    """
    report = api.violations(
        sources, dump=dump, replay=replay, group=group, buffer=buffer, overrides=opt.overrides(ctx)
    )
    view = render.render_violations(report, output_format, max_rows=max_rows)
    deliver(view, output, force=force, svg=svg, inputs=[*sources, *([dump] if dump else [])])
    raise typer.Exit(ExitCode.FINDINGS if report.found else ExitCode.CLEAN)


@app.command()
def plan(
    ctx: typer.Context,
    dump: opt.DumpArg,
    group: opt.PlanGroupOpt = Group.FULL,
    backend: opt.BackendOpt = PlannerChoice.VECTORIZED,
    strict: opt.StrictOpt = False,
    out: opt.PlanOutOpt = None,
    force: opt.ForceOpt = False,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    max_rows: opt.RequestRowsOpt = 50,
    svg: opt.SvgOpt = None,
    swa_window_size: opt.SwaWindowOpt = None,
    verify_capacity: opt.VerifyCapacityOpt = None,
    write_req_capacity: opt.WriteCapacityOpt = None,
    kv_token_id_vs_position_offset: opt.TokenOffsetOpt = None,
    page_size: opt.PageSizeOpt = None,
    num_full_slots: opt.FullSlotsOpt = None,
    num_swa_slots: opt.SwaSlotsOpt = None,
) -> None:
    """Run one planner on one group and show the plan per request (or write it with --out).

    Exit 0 when planned; 1 when upstream would raise (--strict raises like SGLang's reference;
    without it the plan goes on and marks the values upstream leaves undefined), or when the
    GPU launch refuses the batch; 2 on bad input.
    """
    if svg is not None and out is not None:  # both checked before the plan file is written
        check_targets([out, svg], inputs=[dump], overwrite=force)
    # --strict: SGLang's raise propagates as UpstreamPlanError, exit 1 (cli_app)
    overrides = opt.overrides(ctx)
    planned = api.plan(
        dump, group.value, backend=backend, strict=strict, out=out, force=force, overrides=overrides
    )
    if planned.summary is not None:
        view = render.render_plan(planned.summary, output_format, max_rows=max_rows)
        deliver(view, None, force=force, svg=svg, inputs=[dump, *([out] if out else [])])
    if planned.problem is not None:
        fail(planned.problem, ExitCode.FINDINGS)


@app.command()
def inspect(
    dump: opt.DumpArg,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    output: opt.OutputOpt = None,
    force: opt.ForceOpt = False,
    svg: opt.SvgOpt = None,
) -> None:
    """Show what a dump holds: tensors, scalars (and their source), groups, batch, notes.

    Validates the file on the way: a malformed dump gets one error line, exit 2."""
    view = render.render_inspect(api.inspect(dump), output_format)
    deliver(view, output, force=force, svg=svg, inputs=[dump])


@app.command()
def shrink(
    ctx: typer.Context,
    dump: opt.DumpArg,
    out: opt.ShrinkOutOpt = None,
    force: opt.ForceOpt = False,
    swa_window_size: opt.SwaWindowOpt = None,
    verify_capacity: opt.VerifyCapacityOpt = None,
    write_req_capacity: opt.WriteCapacityOpt = None,
    kv_token_id_vs_position_offset: opt.TokenOffsetOpt = None,
    page_size: opt.PageSizeOpt = None,
    num_full_slots: opt.FullSlotsOpt = None,
    num_swa_slots: opt.SwaSlotsOpt = None,
) -> None:
    """Write a small dump that tells the same story, to attach to a bug report.

    Keeps what the analysis of DUMP reads (the batch's rows, every cell a finding's provenance
    names, the LUT entries, free-list entries and canary records of those slots, the
    violation ring), in the original pool rows, positions and slots, and records the original's
    name, size and sha256 and what was dropped. `check` gives the same findings on it.
    """
    shrunk = api.shrink(dump, out, overrides=opt.overrides(ctx), force=force)
    tell("\n".join(shrunk.summary_lines()))


@app.command()
def synth(
    scenario: opt.ScenarioArg = None,
    out: opt.SynthOutOpt = None,
    seed: opt.SeedOpt = 0,
    size: opt.SizeOpt = "tiny",
    list_: opt.ListOpt = False,
    force: opt.ForceOpt = False,
    log: opt.SynthLogOpt = None,
    page_size: opt.SynthPageSizeOpt = None,
    steps: opt.StepsOpt = None,
    at: opt.AtOpt = None,
    every: opt.EveryOpt = 1,
) -> None:
    """Generate a realistic dump: a clean serving state or one bug class of the canary.

    Its metadata names the findings `check` must report and the cause it must rank first.
    With --steps K: K dumps of one rank, one event planted (the truth in their metadata)."""
    if list_:
        tell("\n".join(api.scenarios()))
        return
    wrote = api.synth(
        scenario,
        out,
        seed=seed,
        size=size,
        log=log,
        force=force,
        page_size=page_size,
        steps=steps,
        at=at,
        every=every,
    )
    tell(printable(wrote), on_stderr=str(out) == "-")


@app.command()
def selftest(
    sglang: opt.SGLangOpt = False,
    size: opt.SelftestSizeOpt = "tiny",
    seed: opt.SeedOpt = 0,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    output: opt.OutputOpt = None,
    force: opt.ForceOpt = False,
    svg: opt.SvgOpt = None,
) -> None:
    """Compare kvcanary's planners (and, with --sglang, your SGLang) on every synth scenario.

    Per plan field and raise: the drift report to attach when kvcanary and your SGLang
    disagree. Exit 0 on full agreement, 1 on any difference.
    """
    report = api.selftest(sglang=sglang, size=size, seed=seed)
    deliver(render.render_selftest(report, output_format), output, force=force, svg=svg)
    raise typer.Exit(ExitCode.CLEAN if report.agree else ExitCode.FINDINGS)


soak_opt.register(app)  # `kvcanary soak` (kvcanary_cli/soak)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point (`cli_app.run`: the threads, the one-line errors)."""
    run(app, argv)
