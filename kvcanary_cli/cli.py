"""The `kvcanary` commands: each one's options (the shared ones declared in `cli_options`) →
`api` → `render` → `output`, and its exit code (`cli_app`, which also builds, runs and ends the
app). `api` imports what a command runs when it runs, so `kvcanary --help` imports neither
torch, triton nor SGLang.

`-o/--output FILE` is the report of every command that has one; a dump, plan or folder a
command writes is its `--out`.

No `from __future__ import annotations` here: typer reads each command's options from its
signature's `Annotated` types, and string annotations are evaluated again each time the app
is built (every `app()` call), running every option's builder in `cli_options` anew; evaluated
at import, they are built once."""

import functools
from collections.abc import Callable, Sequence
from inspect import signature
from pathlib import Path
from typing import Annotated, Any

import typer

import kvcanary_cli.option_values as values
from kvcanary_cli import api, render
from kvcanary_cli import cli_options as opt
from kvcanary_cli.catalog import Severity
from kvcanary_cli.cli_app import ExitCode, exit_code, fail, make_app, run
from kvcanary_cli.cli_options import argument, choice_option, integer_option
from kvcanary_cli.dump.files import check_targets
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.output import complain, deliver, tell, to_stdout
from kvcanary_cli.planners import BACKENDS, KERNELS, PlannerChoice
from kvcanary_cli.render import DEFAULT_MAX_ROWS, OutputFormat
from kvcanary_cli.render.console import progress
from kvcanary_cli.results.cells import Space
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.results.pool import PoolCheckReport
from kvcanary_cli.safe_text import printable

__all__ = ["ExitCode", "app", "main"]

app = make_app()

_PLANNERS = (
    "triton: the GPU kernels (compiled on CUDA, interpreted elsewhere); vectorized: the same "
    "semantics in numpy, fast; sglang: the installed SGLang's own launcher (its kernels on "
    "CUDA, its torch reference elsewhere)"
)


def reports(*without: str) -> Callable[[Callable[..., Any]], Any]:
    """A command that returns its result: it gets the report options (`cli_options.REPORT`)
    it neither declares itself nor goes `without`, and its result is rendered, delivered
    (never over a file its command line names) and ends in its exit code. Typer reads the
    options from the wrapper's signature."""

    def decorate(command: Callable[..., Any]) -> Any:
        declared = signature(command)
        skip = {*without, *declared.parameters}
        added = [param for param in opt.REPORT if param.name not in skip]

        @functools.wraps(command)
        def reporting(**given: Any) -> None:
            result = command(**{name: given[name] for name in declared.parameters})
            output = given["output"]
            view = render.render(
                result,
                given["output_format"],
                max_rows=given.get("max_rows", DEFAULT_MAX_ROWS),
                quiet=given.get("quiet", False),
                to_stdout=to_stdout(output),
            )
            inputs = [
                path
                for name, value in given.items()
                if name not in ("output", "svg")
                for path in (value if isinstance(value, list) else [value])
                if isinstance(path, Path)
            ]
            checked = isinstance(result, CheckReport | PoolCheckReport)
            errors = [dump.error for dump in result.dumps if dump.error] if checked else []
            # every dump unreadable, a view for the terminal: the error lines on stderr say it all
            said = bool(errors) and len(errors) == len(result.dumps) and not given.get("quiet")
            said = said and given["output_format"] is not OutputFormat.JSON
            if not (said and given.get("svg") is None and to_stdout(output)):
                deliver(view, output, force=given["force"], svg=given.get("svg"), inputs=inputs)
            for unreadable in errors:  # after the report, which leaves them to stderr
                complain(f"error: {unreadable}")
            raise typer.Exit(exit_code(result))

        params = [*declared.parameters.values(), *added]
        reporting.__signature__ = declared.replace(parameters=params)  # type: ignore[attr-defined]
        reporting.__annotations__ = {param.name: param.annotation for param in params}
        return reporting

    return decorate


@app.command()
@reports()
def check(
    dumps: Annotated[list[Path], argument("DUMP", "One or more dumps (one per rank, say).")],
    group: Annotated[
        str, choice_option("--group", "-g", among=[*Group, "all"], help="Groups to plan.")
    ] = "all",
    kernel: Annotated[
        PlannerChoice,
        choice_option(
            "--kernel",
            "-k",
            among=KERNELS,
            aliases=opt.OLD_NAMES,
            help=f"What stands in for the production GPU path. {_PLANNERS}; none: no comparison.",
        ),
    ] = PlannerChoice.TRITON,
    fail_on: Annotated[
        Severity,
        choice_option("--fail-on", among=Severity, help="Exit 1 on a finding this severe."),
    ] = Severity.ERROR,
    jobs: Annotated[
        int | None,
        integer_option(
            "--jobs", "-j", within=values.POSITIVE, help="Processes (default: what fits here)."
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Verdict lines only.")] = False,
    overrides: opt.SetOpt = None,
) -> CheckReport | PoolCheckReport:
    """Find every bad slot in a dump and say where it came from.

    Plans each group with SGLang's reference semantics (collecting every problem instead of
    raising at the first) and with the GPU kernel, compares them, and reports the diagnosis
    (causes, most likely first) and each finding with its provenance. Exit 0 clean, 1
    findings at or above --fail-on, 2 bad input.
    """
    with progress(f"checking {dumps[0]}", len(dumps)) as tick:
        return api.check(
            dumps,
            kernel=kernel,
            groups=None if group == "all" else [group],
            overrides=opt.overrides(overrides),
            fail_on=fail_on,
            jobs=jobs,
            progress=tick,
        )


@app.command()
@reports()
def provenance(
    dumps: Annotated[
        list[Path], argument("DUMP", "A dump; or several of one rank: the slot over time.")
    ],
    slot: Annotated[
        int | None,
        integer_option("--slot", "-s", within=values.SLOT, help="The slot to trace."),
    ] = None,
    row: Annotated[
        int | None,
        integer_option("--row", "-r", within=values.INDEX, help="The pool row to map instead."),
    ] = None,
    space: Annotated[
        Space, choice_option("--space", among=Space, help="The pool --slot is a slot of.")
    ] = Space.FULL,
    group: Annotated[
        Group | None,
        choice_option(
            "--group", "-g", among=Group, help="The window for roles (default: --space's)."
        ),
    ] = None,
    positions: Annotated[
        str | None,
        typer.Option("--positions", metavar="START:END", help="With --row: the positions."),
    ] = None,
    block: Annotated[
        int | None,
        integer_option(
            "--block", "-b", within=values.INDEX, help="The block to trace (a vLLM dump)."
        ),
    ] = None,
    overrides: opt.SetOpt = None,
    max_rows: opt.RowsOpt = DEFAULT_MAX_ROWS,
) -> Any:
    """Trace one slot (or map one pool row) through the whole req_to_token table.

    Shows every cell holding the slot with its role (verify, prefix, chain-prev,
    pending-write, stale-tail, idle-row), live cells first, radix sharing, the slot's SWA
    translation, allocator state when the dump has free lists, and the findings touching it.
    A row map marks the cells with findings and says which positions it leaves out. On a
    vLLM dump, --block N: who holds the block, where it is in the free queue, its hash.
    """
    return api.provenance(
        dumps,
        slot=slot,
        row=row,
        block=block,
        space=space,
        group=group,
        positions=opt.parse_positions(positions),
        max_cells=max(max_rows, api.CELLS),  # JSON lists the cells the table leaves out
        overrides=opt.overrides(overrides),
    )


@app.command()
@reports()
def timeline(
    dumps: Annotated[list[Path], argument("DUMP", "Two or more dumps of one rank.")],
) -> Any:
    """What changed between dumps of one rank, and when.

    Requests, slot owners, LUT, SWA leak; each event (use-after-free, double-allocation,
    prefix-rewritten, lut-rewritten, swa-leak) with its slots or pages, the steps it happened
    between and its cause; the dump each finding first appears in. The dumps are read in step
    order. vLLM dumps: per step the blocks allocated, freed, rehomed or gone bad, and each
    snapshot's findings. Exit 0 no event and no error finding, 1 otherwise, 2 bad input.
    """
    return api.timeline(dumps)


@app.command()
@reports()
def diff(
    old: Annotated[Path, argument("OLD", "The earlier dump.")],
    new: Annotated[Path, argument("NEW", "The later dump, of the same rank.")],
) -> Any:
    """What changed from OLD to NEW, two dumps of one rank.

    The timeline of two dumps: per request born, grew, finished, row reused; per slot owner
    changes; the events."""
    return api.diff(old, new)


@app.command()
@reports()
def ranks(
    dumps: Annotated[list[Path], argument("DUMP", "One step's dumps, one per TP rank.")],
    overrides: opt.SetOpt = None,
) -> Any:
    """Compare one step's dumps of every tensor-parallel rank: they must hold the same
    bookkeeping.

    Each rank against the first (by rank): pool sizes, each batch row's request (pool row,
    prefix and extend lengths), the req_to_token cells the batch uses, free lists (and their
    order), the SWA LUT; names each rank's first divergence (batch row, pool row, position,
    page). Dumps of different steps or models are refused. Exit 0 identical, 1 a rank
    diverges, 2 bad input.
    """
    return api.ranks(dumps, overrides=opt.overrides(overrides))


@app.command()
@reports()
def violations(
    sources: Annotated[list[Path], argument("SOURCE", "Dumps or server logs (-: stdin).")],
    replay: Annotated[
        bool, typer.Option("--replay", help="Replay the dump's verify launches and compare.")
    ] = False,
    group: Annotated[
        Group | None,
        choice_option("--group", "-g", among=Group, help="Only this group (default: every one)."),
    ] = None,
    buffer: Annotated[
        str | None,
        choice_option("--buffer", among=values.BUFFER_CHOICES, help="Only this canary buffer."),
    ] = None,
    dump: Annotated[
        Path | None,
        typer.Option("--dump", metavar="DUMP", help="The dump to explain log rows against."),
    ] = None,
    overrides: opt.SetOpt = None,
) -> Any:
    """Decode violation rings and kv_canary log lines, replay verify, explain each row.

    Exit 0 clean, 1 rows or unreadable lines, 2 bad input."""
    return api.violations(
        sources,
        dump=dump,
        replay=replay,
        group=group,
        buffer=buffer,
        overrides=opt.overrides(overrides),
    )


@app.command()
@reports("svg")
def leak(
    line: Annotated[
        str | None,
        argument("LINE", "SGLang's message, quoted (with --sglang-log: leave it out)."),
    ] = None,
    dump: Annotated[Path | None, argument("DUMP", "A dump of the same moment.")] = None,
    log: Annotated[
        Path | None,  # a Path: the report may not replace it
        typer.Option(
            "--sglang-log", metavar="FILE", help="Read every such message of a log (-: stdin)."
        ),
    ] = None,
    overrides: opt.SetOpt = None,
) -> Any:
    """Do the arithmetic of SGLang's leak, double-free and use-after-free messages.

    LINE is one of SGLang's memory-check messages ('pool memory leak detected! [full]
    total=...', 'SWA Pool Mem Leak Detected! ...', 'KV double free: ...', 'KV page
    use-after-free: ...', 'req_to_token_pool memory leak detected!...'): what each count is,
    what the sum should be, by how much it is off. With DUMP (kvcanary leak LINE DUMP, or
    kvcanary leak --sglang-log FILE DUMP): a real leak (the pages owned by nobody), a double
    free, or SGLang's count wrong with every page owned, with the pages. Exit 0 when every sum
    holds, 1 otherwise, 2 bad input.
    """
    if log is not None and dump is None and line is not None:
        dump, line = Path(line), None  # `--sglang-log FILE DUMP`: the one argument is DUMP
    return api.leak(line, dump, log=log, overrides=opt.overrides(overrides))


@app.command()
def plan(
    dump: opt.DumpArg,
    group: Annotated[
        Group, choice_option("--group", "-g", among=Group, help="The group to plan.")
    ] = Group.FULL,
    backend: Annotated[
        PlannerChoice,
        choice_option(
            "--backend",
            "-b",
            among=BACKENDS,
            aliases=opt.OLD_NAMES,
            help=f"reference: SGLang's scalar reference, literal (slow); {_PLANNERS}.",
        ),
    ] = PlannerChoice.VECTORIZED,
    strict: Annotated[
        bool, typer.Option("--strict", help="With reference: raise where SGLang's raises.")
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option("--out", metavar="FILE", help="Also write the plan (.safetensors)."),
    ] = None,
    overrides: opt.SetOpt = None,
    max_rows: opt.RowsOpt = DEFAULT_MAX_ROWS,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    output: opt.OutputOpt = None,
    force: opt.ForceOpt = False,
    svg: opt.SvgOpt = None,
) -> None:
    """Run one planner on one group and show the plan per request.

    --out writes the plan (SGLang's field names, trimmed to what upstream defines). Exit 0
    when planned; 1 when upstream would raise (--strict raises like SGLang's reference;
    without it the plan goes on and marks the values upstream leaves undefined), or when the
    GPU launch refuses the batch; 2 on bad input.
    """
    reports = [p for p in (svg, None if to_stdout(output) else output) if p is not None]
    if out is not None and reports:  # all checked before the plan file is written
        check_targets([out, *reports], inputs=[dump], overwrite=force)
    planned = api.plan(  # --strict: SGLang's raise is an UpstreamPlanError, exit 1 (cli_app)
        dump, group.value, backend=backend, strict=strict, out=out, force=force,
        overrides=opt.overrides(overrides),
    )  # fmt: skip
    if planned.summary is not None:
        view = render.render(planned.summary, output_format, max_rows=max_rows)
        deliver(view, output, force=force, svg=svg, inputs=[dump, *([out] if out else [])])
    if planned.problem is not None:
        fail(planned.problem, ExitCode.FINDINGS)


@app.command()
@reports("max_rows")
def inspect(dump: opt.DumpArg) -> Any:
    """Show what a dump holds: tensors, scalars (and their source), groups, batch, notes.

    Validates the file on the way: a malformed dump gets one error line, exit 2."""
    return api.inspect(dump)


@app.command()
def shrink(
    dump: opt.DumpArg,
    out: Annotated[
        Path | None,
        typer.Option("--out", metavar="FILE", help="The small dump to write (.safetensors)."),
    ] = None,
    overrides: opt.SetOpt = None,
    force: opt.ForceOpt = False,
) -> None:
    """Write a small dump that tells the same story, to attach to a bug report.

    Keeps what the analysis of DUMP reads (the batch's rows, every cell a finding's provenance
    names, the LUT entries, free-list entries and canary records of those slots, the
    violation ring), in the original pool rows, positions and slots, and records the original's
    name, size and sha256 and what was dropped. `check` gives the same findings on it. On a
    vLLM dump: the blocks the findings name, their holders' tables and queue places.
    """
    shrunk = api.shrink(dump, out, overrides=opt.overrides(overrides), force=force)
    tell("\n".join(shrunk.summary_lines()))


@app.command()
def synth(
    scenario: Annotated[str | None, argument("SCENARIO", "Scenario name (see --list).")] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", metavar="FILE|DIR", help="The dump (with --steps: a folder)."),
    ] = None,
    seed: opt.SeedOpt = 0,
    size: Annotated[
        str,
        typer.Option(
            "--size",
            metavar="tiny|small|medium|large",
            help="medium (2049 x 32772) and large (4097 x 131076) are for benchmarks.",
        ),
    ] = "tiny",
    list_: Annotated[bool, typer.Option("--list", help="List the scenarios.")] = False,
    force: opt.ForceOpt = False,
    log: Annotated[
        Path | None,
        typer.Option("--log", metavar="FILE", help="Also write the server log of its ring."),
    ] = None,
    page_size: Annotated[
        int | None,
        integer_option(
            "--page-size",
            within=values.PAGE_SIZE,
            help="Slots per page (default: the scenario's).",
        ),
    ] = None,
    steps: Annotated[
        int | None,
        integer_option(
            "--steps",
            within=values.STEPS,
            metavar="K",
            help="Write K dumps of one rank into --out: a sequence (see --list).",
        ),
    ] = None,
    at: Annotated[
        int | None,
        integer_option(
            "--at",
            within=values.POSITIVE,
            metavar="STEP",
            help="With --steps: the event's step (default: the middle dump's).",
        ),
    ] = None,
    every: Annotated[
        int,
        integer_option("--every", within=values.EVERY, help="With --steps: steps between dumps."),
    ] = 1,
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
@reports("max_rows")
def selftest(
    sglang: Annotated[
        bool, typer.Option("--sglang", help="Also run the installed SGLang's plan launcher.")
    ] = False,
    size: Annotated[str, typer.Option("--size", metavar="tiny|small", help="Dump size.")] = "tiny",
    seed: opt.SeedOpt = 0,
) -> Any:
    """Compare kvcanary's planners (and, with --sglang, your SGLang) on every synth scenario.

    Per plan field and raise: the drift report to attach when kvcanary and your SGLang
    disagree. Exit 0 on full agreement, 1 on any difference, 2 when --sglang finds no SGLang
    or a launcher of another signature.
    """
    return api.selftest(sglang=sglang, size=size, seed=seed)


@app.command()
@reports("max_rows", "svg")
def soak(
    sglang_tree: Annotated[
        str | None,
        typer.Option("--sglang-tree", metavar="PATH", help="An SGLang tree or wheel to run."),
    ] = None,
    steps: Annotated[
        int, integer_option("--steps", within=values.Bounds(1, 10**7), help="Steps in all.")
    ] = 600,
    seed: opt.SeedOpt = 0,
    page_size: Annotated[
        int | None,
        integer_option(
            "--page-size", within=values.Bounds(1, 64), help="One page size (default: 1, 4, 16)."
        ),
    ] = None,
    core: Annotated[
        str | None,
        typer.Option("--core", metavar="python|rust", help="One tree core (default: each)."),
    ] = None,
    fault: Annotated[
        str | None,
        typer.Option(
            "--fault",
            metavar="NAME",
            help="Plant a known SGLang bug: unmapped-representative, double-free-group-end, "
            "shared-boundary-page, tree-page-freed, lock-leak or tree-mamba-slot-freed "
            "(--layout mamba).",
        ),
    ] = None,
    layout: Annotated[
        str | None,
        typer.Option(
            "--layout",
            metavar="swa|unified|mamba",
            help="Memory layout: hybrid SWA (paged allocators), unified memory, or hybrid "
            "Mamba (page size 1).",
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", metavar="DIR", help="Where a failure's files go.")
    ] = Path("kvcanary-soak"),
    replay: Annotated[
        Path | None,
        typer.Option(
            "--replay",
            metavar="FILE",
            help="Run a soak-reproducer.json again (its page size, core and fault); writes "
            "nothing.",
        ),
    ] = None,
    timings: Annotated[
        bool, typer.Option("--timings", help="Report the seconds (off: the same bytes each run).")
    ] = False,
    coverage: Annotated[
        bool,
        typer.Option(
            "--coverage",
            help="Say which SGLang memory-cache functions and free paths ran (slower).",
        ),
    ] = False,
    engine: Annotated[
        str, typer.Option("--engine", metavar="sglang|vllm", help="Whose KV cache runs.")
    ] = "sglang",
    vllm_tree: Annotated[
        str | None,
        typer.Option("--vllm-tree", metavar="PATH", help="A vLLM wheel or tree (--engine vllm)."),
    ] = None,
    output_format: opt.FormatOpt = OutputFormat.TABLE,
    force: opt.ForceOpt = False,
) -> Any:
    """Run SGLang's real memory cache on CPU under a seeded random workload, audited each step.

    --engine vllm runs vLLM's KVCacheManager instead (full and sliding-window models; faults:
    block-freed-twice, block-freed-while-held, leak, free-count), and says what vLLM's own
    asserts said.

    kvcanary checks a dump of every step and SGLang's own checks run on the same steps; on
    kvcanary's first finding (or SGLang's crash) the dump, the workload (seed, step) and a
    shrunk workload that still fails go to --out (checked before the soak: --force to replace
    earlier files). The report says what each side saw over the whole run, and who first.
    --replay runs a reproducer's workload again and says whether its finding came back.
    Exit 0 clean, 1 found (by kvcanary, SGLang's checks, or an SGLang crash), 2 bad input
    (not an SGLang tree, no kv canary, a missing dependency, an --out it may not write).
    """
    from kvcanary_cli.soak.command import run_soak  # SGLang, vLLM and torch: as a soak runs

    return run_soak(
        engine,
        sglang_tree=sglang_tree,
        vllm_tree=vllm_tree,
        steps=steps,
        seed=seed,
        page_size=page_size,
        core=core,
        fault=fault,
        layout=layout,
        out=out,
        force=force,
        timings=timings,
        replaying=replay,
        coverage=coverage,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point (`cli_app.run`: the threads, the one-line errors)."""
    run(app, argv)
