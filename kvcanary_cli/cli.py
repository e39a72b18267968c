"""The `kvcanary` commands. Each is one `api` function, its one signature (types, defaults)
given flags and help here (`cli_options.Arg`/`Opt`), and run by `command`: the function's
result rendered, delivered (`output`) and ended in its exit code (`cli_app`, which also builds,
runs and ends the app). `api` imports what a command runs when it runs, so `kvcanary --help`
imports neither torch, triton nor SGLang.

`-o/--output FILE` is the report of every command that has one; a dump, plan or folder a
command writes is its `--out`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from inspect import Parameter, signature
from pathlib import Path
from typing import Any, NoReturn

import typer

import kvcanary_cli.option_values as values
from kvcanary_cli import api, render
from kvcanary_cli.catalog import Severity
from kvcanary_cli.cli_app import Command, ExitCode, exit_code, leave, make_app, run
from kvcanary_cli.cli_options import DUMP, OLD_NAMES, REPORT, SEED, SET, Arg, Opt, parse_positions
from kvcanary_cli.dump.files import check_targets
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.errors import OptionError
from kvcanary_cli.output import complain, deliver, tell, to_stdout
from kvcanary_cli.planners import BACKENDS, KERNELS
from kvcanary_cli.render import OutputFormat
from kvcanary_cli.render.console import progress
from kvcanary_cli.results.cells import Space
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.results.pool import PoolCheckReport
from kvcanary_cli.safe_text import printable
from kvcanary_cli.soak.command import run_soak

__all__ = ["ExitCode", "app", "console", "main"]

app = make_app()

#: A value the API takes that is no option of its own: computed from the options given.
Derived = Callable[[dict[str, Any]], Any]


def command(
    run: Callable[..., Any],
    help: str,
    *,
    name: str | None = None,
    without: Sequence[str] = (),
    writes: str | None = None,
    says: Callable[[Any], str] | None = None,
    panels: dict[str, list[str]] | None = None,
    **params: Arg | Opt | Derived,
) -> None:
    """Add `run` as the command `name` (its own): `params` are its arguments and options by
    the API's keyword, in the order `--help` lists them, with the API's types and defaults.

    A command that reports also gets the report options (`REPORT`) it neither declares nor goes
    `without`; its result is rendered, delivered (never over a file its command line names;
    the reports are checked with the file `writes` names before `run` writes it) and ends in its
    exit code. One that `says` prints that line of its result instead (on stderr when its
    `--out` is standard output). `panels`: headings of `--help` and the options under each
    (`cli_app.Command`), the others under "Options"."""
    declared = signature(run).parameters
    report = {} if says else {k: v for k, v in REPORT.items() if k not in without}
    options = {**params, **{k: v for k, v in report.items() if k not in params}}

    def invoke(**given: Any) -> None:
        args = {
            key: spec.value(given[key]) if isinstance(spec, Arg | Opt) else spec(given)
            for key, spec in options.items()
            if key in declared
        }
        if says is not None:
            tell(says(run(**args)), on_stderr=str(given.get("out")) == "-")
            return
        output, svg, force = given["output"], given.get("svg"), given["force"]
        if given.get("quiet") and given["output_format"] is OutputFormat.JSON:
            raise OptionError(
                "--quiet prints verdict lines, not JSON",
                option="quiet/output_format",
                hint="drop --quiet: each JSON record has its `verdict`",
            )
        inputs = [
            path
            for key, value in given.items()
            if key not in ("output", "svg")
            for path in (value if isinstance(value, list) else [value])
            if isinstance(path, Path)
        ]
        reports = [p for p in (svg, None if to_stdout(output) else output) if p is not None]
        if writes is not None and given[writes] is not None and reports:
            check_targets([given[writes], *reports], inputs=inputs, overwrite=force)
        if "progress" in declared:  # check: a bar over the dumps, on a terminal
            paths = given["paths"]
            with progress(f"checking {paths[0]}", len(paths)) as tick:
                result = run(**args, progress=tick)
        else:
            result = run(**args)
        view, complaints = _shown(result, given)
        if view is not None:
            fmt, quiet = given["output_format"], given.get("quiet", False)
            shown = {"max_rows": given.get("max_rows", render.DEFAULT_MAX_ROWS), "quiet": quiet}
            shown["to_stdout"] = to_stdout(output)
            rendered = render.render(view, fmt, **shown, streamed=True)
            # the image: what a terminal shows, the table (a picture of JSON helps nobody)
            table = fmt is OutputFormat.TABLE or svg is None
            drawn = None if table else render.render(view, OutputFormat.TABLE, **shown)
            deliver(rendered, output, force=force, svg=svg, drawn=drawn, inputs=inputs)
        for line in complaints:  # after the report, which leaves them to stderr
            complain(line)
        raise typer.Exit(exit_code(result))

    invoke.__name__ = invoke.__qualname__ = name or run.__name__
    invoke.__doc__ = help
    heading = {key: title for title, keys in (panels or {}).items() for key in keys}
    typed = [
        spec.parameter(
            k, declared[k].default if k in declared else Parameter.empty, panel=heading.get(k)
        )
        for k, spec in options.items()
        if isinstance(spec, Arg | Opt)
    ]
    invoke.__signature__ = signature(invoke).replace(parameters=typed)  # type: ignore[attr-defined]
    invoke.__annotations__ = {p.name: p.annotation for p in typed}
    app.command(cls=Command)(invoke)


def _shown(result: Any, given: dict[str, Any]) -> tuple[Any, list[str]]:
    """What of `result` the report shows (None: nothing), and the lines for stderr after it:
    `check`'s unreadable dumps, `plan`'s problem."""
    from kvcanary_cli.results.plan import PlanRun  # planners' numpy: a command has run by now

    if isinstance(result, PlanRun):
        return result.summary, [result.problem] if result.problem else []
    if not isinstance(result, CheckReport | PoolCheckReport):
        return result, []
    errors = [f"error: {dump.error}" for dump in result.dumps if dump.error]
    # every dump unreadable, a view for the terminal: the error lines on stderr say it all
    said = bool(errors) and len(errors) == len(result.dumps) and not given.get("quiet")
    said = said and given["output_format"] is not OutputFormat.JSON
    return (
        None if said and given["svg"] is None and to_stdout(given["output"]) else result
    ), errors


_PLANNERS = (
    "triton: the GPU kernels (compiled on CUDA, interpreted elsewhere); vectorized: the same "
    "semantics in numpy, fast; sglang: the installed SGLang's own launcher (its kernels on "
    "CUDA, its torch reference elsewhere)"
)

command(
    api.check,
    """Find every bad slot in a dump and say where it came from.

    Plans each group with SGLang's reference semantics (collecting every problem instead of
    raising at the first) and with the GPU kernel, compares them, and reports the diagnosis
    (causes, most likely first) and each finding with its provenance. Exit 0 clean, 1
    findings at or above --fail-on, 2 bad input.
    """,
    paths=Arg("DUMP", "One or more dumps (one per rank, say).", many=True),
    groups=Opt(
        "Groups to plan.",
        *("--group", "-g"),
        among=[*Group, "all"],
        default="all",
        convert=lambda group: None if group == "all" else [group],
    ),
    kernel=Opt(
        f"What stands in for the production GPU path. {_PLANNERS}; none: no comparison.",
        "-k",
        among=KERNELS,
        aliases=OLD_NAMES,
    ),
    fail_on=Opt("Exit 1 on a finding this severe.", among=Severity),
    jobs=Opt("Processes (default: what fits here).", "-j", within=values.POSITIVE),
    quiet=Opt("Verdict lines only.", "-q", default=False),
    overrides=SET,
)
command(
    api.provenance,
    """Trace one slot (or map one pool row) through the whole req_to_token table.

    Shows every cell holding the slot with its role (verify, prefix, chain-prev,
    pending-write, stale-tail, idle-row), live cells first, radix sharing, the slot's SWA
    translation, allocator state when the dump has free lists, and the findings touching it.
    A row map marks the cells with findings and says which positions it leaves out. On a
    vLLM dump, --block N: who holds the block, where it is in the free queue, its hash.
    """,
    paths=Arg("DUMP", "A dump; or several of one rank: the slot over time.", many=True),
    slot=Opt("The slot to trace.", "-s", within=values.SLOT),
    row=Opt("The pool row to map instead.", "-r", within=values.INDEX),
    space=Opt("The pool --slot is a slot of.", among=Space),
    group=Opt("The window for roles (default: --space's).", "-g", among=Group),
    positions=Opt("With --row: the positions.", metavar="START:END", parser=parse_positions),
    block=Opt("The block to trace (a vLLM dump).", "-b", within=values.INDEX),
    overrides=SET,
    # JSON lists the cells the table leaves out
    max_cells=lambda given: max(given["max_rows"], api.CELLS),
)
command(
    api.timeline,
    """What changed between dumps of one rank, and when.

    Requests, slot owners, LUT, SWA leak; each event (use-after-free, double-allocation,
    prefix-rewritten, lut-rewritten, swa-leak) with its slots or pages, the steps it happened
    between and its cause; the dump each finding first appears in. The dumps are read in step
    order. vLLM dumps: per step the blocks allocated, freed, rehomed or gone bad, and each
    snapshot's findings. Exit 0 no event and no error finding, 1 otherwise, 2 bad input.
    """,
    paths=Arg("DUMP", "Two or more dumps of one rank.", many=True),
)
command(
    api.diff,
    """What changed from OLD to NEW, two dumps of one rank.

    The timeline of two dumps: per request born, grew, finished, row reused; per slot owner
    changes; the events.""",
    old=Arg("OLD", "The earlier dump."),
    new=Arg("NEW", "The later dump, of the same rank."),
)
command(
    api.ranks,
    """Compare one step's dumps of every tensor-parallel rank: they must hold the same
    bookkeeping.

    Each rank against the first (by rank): pool sizes, each batch row's request (pool row,
    prefix and extend lengths), the req_to_token cells the batch uses, free lists (and their
    order), the SWA LUT; names each rank's first divergence (batch row, pool row, position,
    page). Dumps of different steps or models are refused. Exit 0 identical, 1 a rank
    diverges, 2 bad input.
    """,
    paths=Arg("DUMP", "One step's dumps, one per TP rank.", many=True),
    overrides=SET,
)
command(
    api.violations,
    """Decode violation rings and kv_canary log lines, replay verify, explain each row.

    Exit 0 clean, 1 rows or unreadable lines, 2 bad input.""",
    sources=Arg("SOURCE", "Dumps or server logs (-: stdin).", many=True),
    replay=Opt("Replay the dump's verify launches and compare."),
    group=Opt("Only this group (default: every one).", "-g", among=Group),
    buffer=Opt("Only this canary buffer.", among=values.BUFFER_CHOICES),
    dump=Opt("The dump to explain log rows against.", kind=Path, metavar="DUMP"),
    overrides=SET,
)
command(
    api.leak,
    """Do the arithmetic of SGLang's leak, double-free and use-after-free messages.

    LINE is one of SGLang's memory-check messages ('pool memory leak detected! [full]
    total=...', 'SWA Pool Mem Leak Detected! ...', 'KV double free: ...', 'KV page
    use-after-free: ...', 'req_to_token_pool memory leak detected!...'): what each count is,
    what the sum should be, by how much it is off. With DUMP (kvcanary leak LINE DUMP, or
    kvcanary leak --sglang-log FILE DUMP): a real leak (pages or rows owned by nobody), a
    double free, or SGLang's count wrong with all owned, with the pages or rows. Exit 0 when
    every sum holds, 1 otherwise, 2 bad input.
    """,
    without=["svg"],
    line=Arg("LINE", "SGLang's message, quoted (with --sglang-log: leave it out).", kind=str),
    dump=Arg("DUMP", "A dump of the same moment."),
    # a Path: the report may not replace it
    log=Opt(
        "Read every such message of a log (-: stdin).", "--sglang-log", kind=Path, metavar="FILE"
    ),
    overrides=SET,
)
command(
    api.plan,
    """Run one planner on one group and show the plan per request.

    --out writes the plan (SGLang's field names, trimmed to what upstream defines). Exit 0
    when planned; 1 when upstream would raise (--strict raises like SGLang's reference;
    without it the plan goes on and marks the values upstream leaves undefined), or when the
    GPU launch refuses the batch; 2 on bad input.
    """,
    writes="out",
    path=DUMP,
    group=Opt("The group to plan.", "-g", among=Group),
    backend=Opt(
        f"reference: SGLang's scalar reference, literal (slow); {_PLANNERS}.",
        "-b",
        among=BACKENDS,
        aliases=OLD_NAMES,
    ),
    strict=Opt("With reference: raise where SGLang's raises."),
    out=Opt("Also write the plan (.safetensors).", kind=Path, metavar="FILE"),
    overrides=SET,
)
command(
    api.inspect,
    """Show what a dump holds: tensors, scalars (and their source), groups, batch, notes.

    On a vLLM dump: the block pool, its KV-cache groups, the requests' tables (--max-rows of
    them in a table), the tensors. Validates the file on the way: a malformed dump gets one
    error line, exit 2.""",
    path=DUMP,
)
command(
    api.shrink,
    """Write a small dump that tells the same story, to attach to a bug report.

    Keeps what the analysis of DUMP reads (the batch's rows, every cell a finding's provenance
    names, the LUT entries, free-list entries and canary records of those slots, the
    violation ring), in the original pool rows, positions and slots, and records the original's
    name, size and sha256 and what was dropped. `check` gives the same findings on it. On a
    vLLM dump: the blocks the findings name, their holders' tables and queue places.
    """,
    says=lambda shrunk: "\n".join(shrunk.summary_lines()),
    path=DUMP,
    out=Opt("The small dump to write (.safetensors).", kind=Path, metavar="FILE"),
    overrides=SET,
    force=REPORT["force"],
)


def _list_scenarios(listing: bool) -> None:
    """`synth --list`: an eager option, answered before the scenario is looked for."""
    if listing:
        tell("\n".join(api.scenarios()))
        raise typer.Exit()


command(
    api.synth,
    """Generate a realistic dump: a clean serving state or one bug class of the canary.

    Its metadata names the findings `check` must report and the cause it must rank first.
    With --steps K: K dumps of one rank, one event planted (the truth in their metadata).""",
    says=printable,
    scenario=Arg("SCENARIO", "Scenario name (see --list).", kind=str),
    out=Opt("The dump (with --steps: a folder).", kind=Path, metavar="FILE|DIR"),
    seed=SEED,
    size=Opt(
        "medium (2049 x 32772) and large (4097 x 131076) are for benchmarks.",
        metavar="tiny|small|medium|large",
    ),
    listing=Opt(
        "List the scenarios.",
        "--list",
        default=False,
        callback=_list_scenarios,
        is_eager=True,
        expose_value=False,
    ),
    force=REPORT["force"],
    log=Opt("Also write the server log of its ring.", kind=Path, metavar="FILE"),
    page_size=Opt("Slots per page (default: the scenario's).", within=values.PAGE_SIZE),
    steps=Opt(
        "Write K dumps of one rank into --out: a sequence (see --list).",
        within=values.STEPS,
        metavar="K",
    ),
    at=Opt(
        "With --steps: the event's step (default: the middle dump's).",
        within=values.POSITIVE,
        metavar="STEP",
    ),
    every=Opt("With --steps: steps between dumps.", within=values.EVERY),
)
command(
    api.selftest,
    """Compare kvcanary's planners (and, with --sglang, your SGLang) on every synth scenario.

    Per plan field and raise: the drift report to attach when kvcanary and your SGLang
    disagree. Exit 0 on full agreement, 1 on any difference, 2 when --sglang finds no SGLang
    or a launcher of another signature.
    """,
    without=["max_rows"],
    sglang=Opt("Also run the installed SGLang's plan launcher."),
    size=Opt("Dump size.", metavar="tiny|small"),
    seed=SEED,
)
command(
    run_soak,
    """Run SGLang's real memory cache on CPU under a seeded random workload, audited each step.

    --engine vllm runs vLLM's KVCacheManager instead (faults: block-freed-twice,
    block-freed-while-held, leak, free-count) and says what vLLM's own asserts said. How each
    option drives the engine: docs/soak.md.

    kvcanary checks a dump of every step and SGLang's own checks run on the same steps; on
    kvcanary's first finding (SGLang's crash; else SGLang's first complaint) the dump, the
    workload and a shrunk workload that still fails go to --out (checked first: --force to
    replace earlier files). The report says what each side saw, and who first. --replay runs a
    reproducer's workload again and says whether what it recorded came back.
    Exit 0 clean, 1 found (by kvcanary, SGLang's checks, or an SGLang crash), 2 bad input
    (not an SGLang tree, no kv canary, a missing dependency, an --out it may not write).
    """,
    name="soak",
    without=["max_rows", "svg"],
    # what runs, what the server runs it with, what it is given; the report's options after
    panels={
        "Engine and memory layout": [
            *("engine", "sglang_tree", "vllm_tree", "vllm_model", "layout", "page_size", "core")
        ],
        "Server options": [
            *("overlap", "speculative_tokens", "tp", "hicache", "hicache_storage"),
            "session_radix_cache",
        ],
        "Workload": ["steps", "seed", "fault", "replaying"],
    },
    engine=Opt("Whose KV cache runs.", metavar="sglang|vllm"),
    sglang_tree=Opt("An SGLang tree or wheel to run.", metavar="PATH"),
    vllm_tree=Opt("A vLLM wheel or tree (--engine vllm).", metavar="PATH"),
    vllm_model=Opt(
        "The models a vLLM soak runs in turn, comma-separated (default: full,hybrid): full "
        "attention, + sliding window, + Mamba state, + chunked local attention, + reference "
        "sliding window (vLLM 0.25.0 on).",
        metavar="full|hybrid|hybrid-mamba|hybrid-chunked-local|hybrid-rswa",
    ),
    layout=Opt(
        "Memory layout: hybrid SWA, unified memory, hybrid Mamba (page size 1), or hybrid "
        "Mamba with SGLang's extra buffer.",
        metavar="swa|unified|mamba|mamba-extra",
    ),
    page_size=Opt(
        "One page size (default: 1, 4, 16; --layout mamba: 1).", within=values.Bounds(1, 64)
    ),
    core=Opt("One tree core (default: each).", metavar="python|rust"),
    overlap=Opt(
        "Run SGLang's overlapped scheduler loop, a server's default, instead of the "
        "non-overlapped one (SGLang 0.5.13 to 0.5.23; before 0.5.21 not --layout unified); "
        "with --engine vllm, vLLM's async scheduling (a step scheduled while one is in flight).",
    ),
    speculative_tokens=Opt(
        "With --engine vllm, speculative decoding: K draft tokens a decode step verifies, the "
        "rejected ones taken back (with --overlap, once that step's output is processed: vLLM "
        "0.27.0 on).",
        within=values.DRAFT_TOKENS,
        metavar="K",
    ),
    tp=Opt(
        "Tensor-parallel ranks, each its own stack in lockstep, compared with rank 0's at "
        "every audited step.",
        within=values.TP_RANKS,
    ),
    hicache=Opt(
        "Also run SGLang's host tier (--enable-hierarchical-cache), its host pools audited "
        "each step (any --layout but unified).",
    ),
    hicache_storage=Opt(
        "With --hicache, also its storage tier (the file backend, in a temporary folder soak "
        "removes).",
    ),
    session_radix_cache=Opt(
        "Also run SGLang's radix sessions (--enable-session-radix-cache; the Python tree "
        "core, SGLang 0.5.17 on).",
    ),
    steps=Opt("Steps in all.", within=values.Bounds(1, 10**7)),
    seed=SEED,
    fault=Opt(
        "Plant a known SGLang bug: unmapped-representative, double-free-group-end, "
        "shared-boundary-page, tree-page-freed, lock-leak, tree-mamba-slot-freed "
        "(--layout mamba or mamba-extra), or host-evict-leak, load-back-frees-host, "
        "backup-twice (--hicache), storage-ack-frees-host (--hicache-storage).",
        metavar="NAME",
    ),
    replaying=Opt(
        "Run a soak-reproducer.json again (its page size, core and fault); writes nothing.",
        "--replay",
        kind=Path,
        metavar="FILE",
    ),
    out=Opt("Where a failure's files go.", kind=Path, metavar="DIR", default=Path("kvcanary-soak")),
    timings=Opt("Report the seconds (off: the same bytes each run)."),
    coverage=Opt("Say which SGLang memory-cache functions and free paths ran (slower)."),
    output_format=REPORT["output_format"],
    force=REPORT["force"],
)


def main(argv: Sequence[str] | None = None) -> None:
    """Run `kvcanary ARGV` (`cli_app.run`: the threads, the one-line errors), ending in
    `SystemExit` with its exit code: callable again in the same process."""
    run(app, argv)


def console() -> NoReturn:
    """`kvcanary` itself (the console script, `python -m kvcanary_cli`): `main`, and then the
    process ends at once (`cli_app.leave`)."""
    try:
        main()
    except SystemExit as done:
        leave(done.code)
    leave(ExitCode.CLEAN)
