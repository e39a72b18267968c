"""The Python API: one function per command (each command's `--help` says what it does),
reading either engine's dumps as the command does and returning its typed result, which is its
versioned record: `kvcanary_cli.render.render` shows any of them as JSON, a table or Markdown.
Names (`kernel="vectorized"`) are mapped to planner objects here, as on the command line;
docs/python-api.md shows an example and how to choose the planners yourself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from kvcanary_cli.errors import DumpError, OptionError
from kvcanary_cli.option_values import INDEX, POSITIVE, checked_choice, checked_integer
from kvcanary_cli.planners import PlannerChoice, make_kernel, make_planner, make_selftest_planners
from kvcanary_cli.planners.sglang_runtime import installed_version

# Each function imports what it runs: `inspect` reads a dump with numpy alone, and
# `import kvcanary_cli.api` stays light.
if TYPE_CHECKING:
    from kvcanary_cli.catalog import Severity
    from kvcanary_cli.dump.header import HeaderRead
    from kvcanary_cli.dump.shrink_writer import ShrinkResult
    from kvcanary_cli.results.check import CheckReport
    from kvcanary_cli.results.inspect import DumpDescription
    from kvcanary_cli.results.leak import LeakReport
    from kvcanary_cli.results.plan import PlanRun
    from kvcanary_cli.results.pool import PoolCheckReport, PoolProvenance
    from kvcanary_cli.results.pool_inspect import PoolDumpDescription
    from kvcanary_cli.results.pool_timeline import PoolTimelineReport
    from kvcanary_cli.results.provenance import ProvenanceReport
    from kvcanary_cli.results.ranks import RanksReport
    from kvcanary_cli.results.selftest import SelftestReport
    from kvcanary_cli.results.timeline import TimelineReport
    from kvcanary_cli.results.violations import ViolationsReport

__all__ = [
    "check",
    "diff",
    "inspect",
    "leak",
    "plan",
    "provenance",
    "ranks",
    "scenarios",
    "selftest",
    "shrink",
    "synth",
    "timeline",
    "violations",
]

PathLike = str | os.PathLike[str]
#: `provenance`: the cells of a slot or row it lists at most (a hostile dump's slot can fill
#: millions), unless asked for more.
CELLS = 256
Overrides = Mapping[str, int | str | None] | None


def _many(paths: PathLike | Sequence[PathLike]) -> list[PathLike]:
    """One path or several, as a list (iterating one string gave one path per character)."""
    return [paths] if isinstance(paths, str | os.PathLike) else list(paths)


#: Why a vLLM dump refuses `--set` (`check`, `provenance --block`, `shrink`).
_NO_SCALARS = "a block-pool (vLLM) dump has no SGLang scalars to set"


def _pools(paths: list[PathLike], mixed: str, headers: Sequence[HeaderRead] | None = None) -> bool:
    """Whether the dumps are a block-pool engine's (vLLM), not SGLang's; `mixed`: the error
    when only some are. `headers`: theirs, read already (one per path)."""
    from kvcanary_cli.dump.header import header_engine, read_header_or_error
    from kvcanary_cli.dump.schema import POOL_ENGINES

    reads = [read_header_or_error(p) for p in paths] if headers is None else headers
    pools = [header_engine(h) in POOL_ENGINES for h in reads]
    if any(pools) and not all(pools):
        raise OptionError(mixed, option="DUMP")
    return any(pools)


def check(
    paths: PathLike | Sequence[PathLike],
    *,
    kernel: PlannerChoice | str = PlannerChoice.TRITON,
    groups: Sequence[str] | None = None,
    overrides: Overrides = None,
    fail_on: Severity | str = "error",
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CheckReport | PoolCheckReport:
    """`kvcanary check`; an unreadable dump gets an `error` report. vLLM dumps get a
    `PoolCheckReport` (`kernel` and `jobs` are SGLang's; `groups` and `overrides`, which
    would say what is checked, are refused)."""
    from kvcanary_cli.catalog import Severity

    severity = Severity(checked_choice(fail_on, [s.value for s in Severity], "fail_on"))
    if jobs is not None:
        checked_integer(jobs, "jobs", POSITIVE)
    many = _many(paths)
    if _pools(many, "SGLang and block-pool (vLLM) dumps are checked in separate runs"):
        from kvcanary_cli.engines import check_pool_dump
        from kvcanary_cli.results.pool import PoolCheckReport

        if overrides:
            raise OptionError(_NO_SCALARS, option="overrides")
        if groups is not None:
            raise OptionError(
                "a block-pool (vLLM) dump is checked whole: its KV-cache groups are not "
                "SGLang's full and swa",
                option="groups",
                hint="drop --group",
            )
        reports = []
        for i, p in enumerate(many):
            reports.append(check_pool_dump(p))
            if progress is not None:
                progress(i + 1, len(many))
        return PoolCheckReport(dumps=tuple(reports), fail_on=severity)
    from kvcanary_cli.analysis.check import check_dumps

    return check_dumps(
        many,
        planner=make_planner(PlannerChoice.VECTORIZED),
        kernel=make_kernel(kernel),
        overrides=overrides,
        groups=groups,
        fail_on=severity,
        jobs=jobs,
        progress=progress,
        sglang_installed=installed_version(),
    )


def provenance(
    paths: PathLike | Sequence[PathLike],
    *,
    slot: int | None = None,
    row: int | None = None,
    block: int | None = None,
    space: str = "full",
    group: str | None = None,
    positions: tuple[int, int] | None = None,
    max_cells: int = CELLS,
    overrides: Overrides = None,
) -> ProvenanceReport | TimelineReport | PoolProvenance:
    """`kvcanary provenance`: a `slot` or a pool `row` (`positions`: [start, end)); over
    several dumps, the slot's history (a `TimelineReport`); `block`: a vLLM dump's block."""
    many = _many(paths)
    if block is not None:
        from kvcanary_cli.engines import pool_provenance

        if len(many) > 1 or slot is not None or row is not None:
            raise OptionError("traces a block of one dump, with no slot or row", option="block")
        sglang = {"space": space != "full", "group": group, "positions": positions}
        if given := [key for key, value in sglang.items() if value]:
            goes = "goes" if len(given) == 1 else "go"
            raise OptionError(
                f"{goes} with --slot or --row (an SGLang dump), not with --block",
                option="/".join(given),
            )
        if overrides:
            raise OptionError(_NO_SCALARS, option="overrides")
        return pool_provenance(many[0], checked_integer(block, "block", INDEX))
    from kvcanary_cli.analysis.query import provenance_report
    from kvcanary_cli.analysis.timeline import slot_history
    from kvcanary_cli.dump.header import dump_engine
    from kvcanary_cli.dump.loader import load_dump
    from kvcanary_cli.dump.schema import ENGINE_KEY, POOL_ENGINES

    try:
        if len(many) > 1:
            return slot_history(many, slot=slot, row=row, space=space, overrides=overrides)
        return provenance_report(
            load_dump(many[0], overrides=overrides),
            make_planner(PlannerChoice.VECTORIZED),
            slot=slot,
            row=row,
            space=space,
            group=group,
            positions=positions,
            max_cells=max_cells,
        )
    except DumpError as exc:  # a vLLM dump, refused by the SGLang reader: say what traces it
        if exc.field != ENGINE_KEY or dump_engine(str(exc.path)) not in POOL_ENGINES:
            raise
        raise OptionError(
            f"{exc.path} is a vLLM dump: it holds blocks, not slots or pool rows",
            option="slot" if slot is not None or row is None else "row",
            hint="trace a block with --block N",
        ) from None


def plan(
    path: PathLike,
    group: str = "full",
    *,
    backend: PlannerChoice | str = PlannerChoice.VECTORIZED,
    strict: bool = False,
    overrides: Overrides = None,
    out: PathLike | None = None,
    force: bool = False,
) -> PlanRun:
    """`kvcanary plan`: the plan is written to `out` when it was made and would launch; with
    `strict`, the reference raises `UpstreamPlanError` where SGLang's does."""
    from kvcanary_cli.analysis.plan_summary import plan_run
    from kvcanary_cli.dump.loader import load_dump

    planner = make_planner(backend, strict=strict)
    return plan_run(load_dump(path, overrides=overrides), group, planner, out=out, force=force)


def inspect(path: PathLike) -> DumpDescription | PoolDumpDescription:
    """`kvcanary inspect`: what a dump (SGLang's or vLLM's) holds, validated on the way."""
    if _pools([path], ""):
        from kvcanary_cli.engines import describe_pool_dump

        return describe_pool_dump(path)
    from kvcanary_cli.analysis.describe import describe_dump
    from kvcanary_cli.dump.loader import load_dump

    return describe_dump(load_dump(path), sglang_installed=installed_version())


def shrink(
    path: PathLike, out: PathLike | None, *, overrides: Overrides = None, force: bool = False
) -> ShrinkResult:
    """`kvcanary shrink`: a small dump of `path` at `out` (never `path`; an existing file only
    with `force`). `overrides` are SGLang's scalars: refused on a vLLM dump."""
    from kvcanary_cli import __version__
    from kvcanary_cli.analysis.shrink_selection import shrink_dump
    from kvcanary_cli.dump.loader import load_dump

    if out is None or str(out) == "-":  # a dump is binary: never to a terminal or a pipe
        raise OptionError("name the small dump's file (SMALL.safetensors)", option="out")
    if _pools([path], ""):
        from kvcanary_cli.engines import shrink_pool_dump

        if overrides:
            raise OptionError(_NO_SCALARS, option="overrides")
        return shrink_pool_dump(path, out, kvcanary_version=__version__, force=force)
    kernel = make_kernel(PlannerChoice.VECTORIZED)
    assert kernel is not None
    return shrink_dump(
        load_dump(path, overrides=overrides),
        out,
        planner=make_planner(PlannerChoice.VECTORIZED),
        kernel=kernel,
        overrides=overrides,
        kvcanary_version=__version__,
        force=force,
    )


def scenarios() -> list[str]:
    """`kvcanary synth --list`: the scenarios, the sequences and the vLLM scenarios."""
    from kvcanary_cli.engines import pool_scenario_lines
    from kvcanary_cli.synth.scenarios import scenario_lines
    from kvcanary_cli.synth.sequence import sequence_lines

    return [
        *scenario_lines(),
        "",
        "sequences (--steps K --out DIR):",
        *sequence_lines(),
        "",
        "vLLM block pools:",
        *pool_scenario_lines(),
    ]


def synth(
    scenario: str | None = None,
    out: PathLike | None = None,
    *,
    seed: int = 0,
    size: str = "tiny",
    log: PathLike | None = None,
    force: bool = False,
    page_size: int | None = None,
    steps: int | None = None,
    at: int | None = None,
    every: int = 1,
) -> str:
    """`kvcanary synth` (`out` `-`: stdout); the line saying what was written."""
    from kvcanary_cli.engines import is_pool_scenario, pool_scenario_names, write_pool_scenario
    from kvcanary_cli.synth.files import write_synth

    if scenario is not None and is_pool_scenario(scenario):  # it refuses SGLang's options
        options = {"log": log, "page_size": page_size, "steps": steps, "at": at, "every": every}
        return write_pool_scenario(scenario, out, seed=seed, size=size, force=force, **options)
    return write_synth(
        scenario, out, seed=seed, size=size, log=log, force=force, page_size=page_size,
        steps=steps, at=at, every=every, others=pool_scenario_names(),
    )  # fmt: skip


def timeline(
    paths: PathLike | Sequence[PathLike], *, overrides: Overrides = None, check: bool = True
) -> TimelineReport | PoolTimelineReport:
    """`kvcanary timeline` (`check`: each dump checked as `check --kernel none`, to name each
    event's cause); vLLM dumps get a `PoolTimelineReport`."""
    return _timeline(_many(paths), overrides=overrides, check=check, keep_order=False)


def diff(
    old: PathLike, new: PathLike, *, overrides: Overrides = None
) -> TimelineReport | PoolTimelineReport:
    """`kvcanary diff`: from `old` to `new`, two dumps of one rank."""
    return _timeline([old, new], overrides=overrides, check=True, keep_order=True)


def _timeline(
    paths: list[PathLike], *, overrides: Overrides, check: bool, keep_order: bool
) -> TimelineReport | PoolTimelineReport:
    if len(paths) < 2:  # either engine's: a timeline is what changed between dumps
        raise OptionError("give two dumps or more, of one rank", option="DUMP")
    from kvcanary_cli.dump.header import read_header_or_error

    headers = [read_header_or_error(p) for p in paths]  # once: the engine, then the steps
    mixed = "a timeline reads one engine's dumps: SGLang and block-pool (vLLM) dumps mixed"
    if _pools(paths, mixed, headers):
        from kvcanary_cli.engines import pool_timeline

        return pool_timeline(paths, keep_order=keep_order)
    from kvcanary_cli.analysis.timeline import timeline as run

    planner = make_planner(PlannerChoice.VECTORIZED) if check else None
    return run(paths, planner=planner, keep_order=keep_order, overrides=overrides, headers=headers)


def ranks(paths: Sequence[PathLike], *, overrides: Overrides = None) -> RanksReport:
    """`kvcanary ranks`: one step's dumps of every tensor-parallel rank compared."""
    from kvcanary_cli.analysis.ranks import compare_ranks

    return compare_ranks(_many(paths), overrides=overrides)


def leak(
    line: str | None = None,
    dump: PathLike | None = None,
    *,
    log: PathLike | None = None,
    overrides: Overrides = None,
) -> LeakReport:
    """`kvcanary leak`: SGLang's message `line`, or every one in the server log `log` (with
    `log` and no `dump`, a `line` is the dump: `kvcanary leak --sglang-log FILE DUMP`)."""
    from kvcanary_cli.analysis.leak import leak_report

    if log is not None and dump is None and line is not None:
        dump, line = line, None

    return leak_report(line, log=log, dump=dump, overrides=overrides)


def selftest(*, sglang: bool = False, size: str = "tiny", seed: int = 0) -> SelftestReport:
    """`kvcanary selftest`: kvcanary's planners (and with `sglang` SGLang's) compared."""
    from kvcanary_cli import __version__
    from kvcanary_cli.analysis.selftest import run_selftest

    return run_selftest(
        *make_selftest_planners(sglang=sglang),
        kvcanary_version=__version__,
        sglang_installed=installed_version(),
        size=size,
        seed=seed,
    )


def violations(
    sources: PathLike | Sequence[PathLike],
    *,
    dump: PathLike | None = None,
    replay: bool = False,
    group: str | None = None,
    buffer: str | None = None,
    overrides: Overrides = None,
) -> ViolationsReport:
    """`kvcanary violations`: rows of dumps' rings and server logs (`-`: stdin), explained
    against the one dump involved (a source, or `dump`)."""
    from kvcanary_cli.analysis.violations.collect import violations_report

    return violations_report(
        [os.fspath(source) for source in _many(sources)],
        dump=dump,
        replay=replay,
        group=group,
        buffer=buffer,
        overrides=overrides,
    )
