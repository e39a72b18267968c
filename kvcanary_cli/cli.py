"""The `kvcanary` command line, wiring only: options → `api` → `render` → `output`, exit code.
Option declarations and the error policy live in `cli_options`. `api` imports what a command
runs when it runs, so `kvcanary --help` imports neither torch nor triton."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import typer

from kvcanary_cli import api, render
from kvcanary_cli import cli_options as opt
from kvcanary_cli.catalog import Severity
from kvcanary_cli.cli_options import ExitCode, GroupChoice, ReportTo, fail
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.output import deliver, tell
from kvcanary_cli.planners import PlannerChoice
from kvcanary_cli.render import OutputFormat
from kvcanary_cli.render.console import progress
from kvcanary_cli.results.cells import Space
from kvcanary_cli.safe_text import printable
from kvcanary_cli.soak import options as soak_opt

__all__ = ["ExitCode", "app", "main"]

app = opt.make_app()


@opt.command(app, overrides=True, svg=True, report=True, rows=(opt.FindingRowsOpt, 10))
def check(
    dumps: opt.DumpsArg,
    group: opt.GroupsOpt = GroupChoice.ALL,
    kernel: opt.KernelOpt = PlannerChoice.TRITON,
    fail_on: opt.FailOnOpt = Severity.ERROR,
    jobs: opt.JobsOpt = None,
    quiet: opt.QuietOpt = False,
    to: ReportTo = opt.STDOUT,
    overrides: opt.Overrides = None,
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
            groups=None if group is GroupChoice.ALL else [group.value],
            overrides=overrides,
            fail_on=fail_on,
            jobs=jobs,
            progress=tick,
        )
    rendered = render.render_check(
        report, to.fmt, max_rows=to.rows, quiet=quiet, to_stdout=opt.to_stdout(to.file)
    )
    deliver(rendered, to.file, force=to.force, inputs=dumps)
    raise typer.Exit(opt.check_exit(report))


@opt.command(app, overrides=True, svg=True, report=True, rows=(opt.CellsOpt, 256))
def provenance(
    dumps: opt.ProvenanceDumpsArg,
    slot: opt.SlotOpt = None,
    row: opt.RowOpt = None,
    space: opt.SpaceOpt = Space.FULL,
    group: opt.RoleGroupOpt = None,
    positions: opt.PositionsOpt = None,
    to: ReportTo = opt.STDOUT,
    overrides: opt.Overrides = None,
) -> None:
    """Trace one slot (or map one pool row) through the whole req_to_token table.

    Shows every cell holding the slot with its role (verify, prefix, chain-prev,
    pending-write, stale-tail, idle-row), live cells first, radix sharing, the slot's SWA
    translation, allocator state when the dump has free lists, and the findings touching it.
    A row map marks the cells with findings and says which positions it leaves out.
    """
    if len(dumps) > 1:  # the slot over the dumps
        history = api.slot_history(dumps, slot=slot, row=row, space=space, overrides=overrides)
        deliver(render.render_timeline(history, to.fmt), to.file, force=to.force, inputs=dumps)
        return
    answer = api.provenance(
        dumps[0],
        slot=slot,
        row=row,
        space=space.value,
        group=None if group is None else group.value,
        positions=opt.parse_positions(positions),
        max_cells=to.rows,
        overrides=overrides,
    )
    rendered = render.render_provenance(answer, to.fmt, max_rows=to.rows)
    deliver(rendered, to.file, force=to.force, inputs=dumps)


@opt.command(app, svg=True, report=True, rows=(opt.ChangeRowsOpt, 10))
def timeline(dumps: opt.SequenceArg, to: ReportTo = opt.STDOUT) -> None:
    """What changed between dumps of one rank, and when: requests, slot owners, LUT, SWA leak.

    Each event (use-after-free, double-allocation, prefix-rewritten, lut-rewritten, swa-leak)
    with its slots or pages, the steps it happened between and its cause; the dump each
    finding first appears in. Exit 0 no event and no error finding, 1 otherwise, 2 bad input.
    """
    found = api.timeline(dumps)
    deliver(render.render_timeline(found, to.fmt, to.rows), to.file, force=to.force, inputs=dumps)
    raise typer.Exit(opt.timeline_exit(found))


@opt.command(app, svg=True, report=True, rows=(opt.ChangeRowsOpt, 10))
def diff(old: opt.OldArg, new: opt.NewArg, to: ReportTo = opt.STDOUT) -> None:
    """What changed from OLD to NEW, two dumps of one rank: the timeline of two dumps.

    Per request born, grew, finished, row reused; per slot owner changes; the events."""
    found, inputs = api.diff(old, new), [old, new]
    deliver(render.render_timeline(found, to.fmt, to.rows), to.file, force=to.force, inputs=inputs)
    raise typer.Exit(opt.timeline_exit(found))


@opt.command(app, overrides=True, svg=True, report=True, rows=(opt.ViolationRowsOpt, 20))
def violations(
    sources: opt.SourcesArg,
    replay: opt.ReplayOpt = False,
    group: opt.ViolationGroupOpt = None,
    buffer: opt.BufferOpt = None,
    dump: opt.JoinDumpOpt = None,
    to: ReportTo = opt.STDOUT,
    overrides: opt.Overrides = None,
) -> None:
    """Decode violation rings and kv_canary log lines, replay verify, explain each row.

    A SOURCE: a dump or log ('-': stdin). Exit 0 clean, 1 rows or unreadable lines, 2 bad input.
    """
    report = api.violations(
        sources, dump=dump, replay=replay, group=group, buffer=buffer, overrides=overrides
    )
    rendered = render.render_violations(report, to.fmt, max_rows=to.rows)
    deliver(rendered, to.file, force=to.force, inputs=opt.input_files(sources, dump))
    raise typer.Exit(ExitCode.FINDINGS if report.found else ExitCode.CLEAN)


@opt.command(app, overrides=True, svg=True)
def plan(
    dump: opt.DumpArg,
    group: opt.PlanGroupOpt = Group.FULL,
    backend: opt.BackendOpt = PlannerChoice.VECTORIZED,
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
    # --strict: SGLang's raise propagates as UpstreamPlanError, exit 1 (cli_options)
    run = api.plan(
        dump, group.value, backend=backend, strict=strict, out=out, force=force, overrides=overrides
    )
    if run.summary is not None:
        rendered = render.render_plan(run.summary, output_format, max_rows=max_rows)
        deliver(rendered, None, force=force, inputs=[dump, *([out] if out else [])])
    if run.problem is not None:
        fail(run.problem, ExitCode.FINDINGS)


@opt.command(app, svg=True, report=True)
def inspect(dump: opt.DumpArg, to: ReportTo = opt.STDOUT) -> None:
    """Show what a dump holds: tensors, scalars (and their source), groups, batch, notes.

    Validates the file on the way: a malformed dump gets one error line, exit 2."""
    described = render.render_inspect(api.inspect(dump), to.fmt)
    deliver(described, to.file, force=to.force, inputs=[dump])


@opt.command(app, overrides=True)
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
    tell("\n".join(api.shrink(dump, out, overrides=overrides, force=force).summary_lines()))


@opt.command(app, sequence=True)
def synth(
    scenario: opt.ScenarioArg = None,
    out: opt.SynthOutOpt = None,
    seed: opt.SeedOpt = 0,
    size: opt.SizeOpt = "tiny",
    list_: opt.ListOpt = False,
    force: opt.ForceOpt = False,
    log: opt.SynthLogOpt = None,
    page_size: opt.SynthPageSizeOpt = None,
    sequence: Mapping[str, int | None] = opt.NO_SEQUENCE,
) -> None:
    """Generate a realistic dump: a clean serving state or one bug class of the canary.

    Its metadata names the findings `check` must report and the cause it must rank first.
    With --steps K: K dumps of one rank, one event planted (the truth in their metadata)."""
    if list_:
        tell("\n".join(api.scenarios()))
        return
    wrote = api.synth(
        scenario, out, seed=seed, size=size, log=log, force=force, page_size=page_size, **sequence
    )
    tell(printable(wrote), on_stderr=str(out) == "-")


@opt.command(app, svg=True, report=True)
def selftest(
    sglang: opt.SGLangOpt = False,
    size: opt.SelftestSizeOpt = "tiny",
    seed: opt.SeedOpt = 0,
    to: ReportTo = opt.STDOUT,
) -> None:
    """Compare kvcanary's planners (and, with --sglang, your SGLang) on every synth scenario.

    Per plan field and raise: the drift report to attach when kvcanary and your SGLang
    disagree. Exit 0 on full agreement, 1 on any difference.
    """
    report = api.selftest(sglang=sglang, size=size, seed=seed)
    deliver(render.render_selftest(report, to.fmt), to.file, force=to.force)
    raise typer.Exit(ExitCode.CLEAN if report.agree else ExitCode.FINDINGS)


soak_opt.register(app)  # `kvcanary soak` (kvcanary_cli/soak)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point (`cli_options.run`: the threads, the one-line errors)."""
    opt.run(app, argv)
