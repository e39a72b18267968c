"""The Python API: what each command computes, as the objects the CLI renders.

    from kvcanary_cli import api
    report = api.check("dump.safetensors", kernel="vectorized")  # a CheckReport
    report.dumps[0].diagnosis[0].code                           # e.g. CauseCode.LUT_TOO_SHORT
    answer = api.provenance("dump.safetensors", slot=107)       # a ProvenanceReport

Every function returns a typed result (frozen dataclasses), never a record: render any of them
with `kvcanary_cli.render` (`render_check`, `render_provenance`, ...), which builds the
versioned record (`kvcanary.check/2`, ...) the JSON, table and Markdown views show. Names
(`kernel="vectorized"`) are mapped to planner objects here, as on the command line; to choose
planners yourself, call `kvcanary_cli.analysis.check.run_check` with planner objects.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvcanary_cli.dump.schema import SCALARS
from kvcanary_cli.errors import OptionError
from kvcanary_cli.planners import PlannerChoice, make_kernel, make_planner, make_selftest_planners
from kvcanary_cli.planners.sglang_runtime import installed_version

# Each function imports what it runs: `inspect` reads a dump with numpy alone, and
# `import kvcanary_cli.api` stays light.
if TYPE_CHECKING:
    from kvcanary_cli.catalog import Severity
    from kvcanary_cli.dump.shrink_writer import ShrinkResult
    from kvcanary_cli.results.check import CheckReport
    from kvcanary_cli.results.inspect import DumpDescription
    from kvcanary_cli.results.plan import PlanRun
    from kvcanary_cli.results.provenance import ProvenanceReport
    from kvcanary_cli.results.selftest import SelftestReport
    from kvcanary_cli.results.timeline import TimelineReport
    from kvcanary_cli.results.violations import ViolationsReport

__all__ = [
    "check",
    "diff",
    "inspect",
    "plan",
    "provenance",
    "scenarios",
    "selftest",
    "shrink",
    "slot_history",
    "synth",
    "timeline",
    "violations",
]

PathLike = str | os.PathLike[str]
Overrides = Mapping[str, int | str | None] | None


def _readable(value: int) -> str:
    """An integer as a person reads a bound: `2^31-1`, `-2^31`, `2^40`, or its digits."""
    magnitude = abs(value)
    for exact, suffix in ((magnitude, ""), (magnitude + 1, "-1")):
        bits = exact.bit_length() - 1
        if bits >= 16 and exact == 1 << bits:
            return f"{'-' if value < 0 else ''}2^{bits}{suffix}"
    return str(value)


@dataclass(frozen=True)
class Bounds:
    """The integers an option takes, `low` to `high` (None: no bound that side), declared once:
    this module checks what a caller passes, the command line what a user types (and states
    the range at the end of the option's help), in the same words."""

    low: int | None = None
    high: int | None = None

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{_readable(self.low)} to {_readable(self.high)}"
        if self.low is not None:
            return f"at least {_readable(self.low)}"
        return "" if self.high is None else f"at most {_readable(self.high)}"

    def refusal(self, value: int) -> str | None:
        """Why `value` is out of range (`0 is below 1 (1 to 64)`); None when it is in."""
        both = f" ({self})" if self.low is not None and self.high is not None else ""
        if self.low is not None and value < self.low:
            return f"{value} is below {_readable(self.low)}{both}"
        if self.high is not None and value > self.high:
            return f"{value} is above {_readable(self.high)}{both}"
        return None


_INT64_MAX = (1 << 63) - 1
#: `--slot`: any int64 (a bad slot is what a finding reports, not a bad option).
SLOT = Bounds(-(1 << 63), _INT64_MAX)
#: `--row`, `--positions`, `--seed`: a non-negative int64.
INDEX = Bounds(0, _INT64_MAX)
#: `--jobs`, `--max-rows`, `synth --at`: one or more.
POSITIVE = Bounds(1)
#: `synth --steps`, `--every` and `--page-size`.
STEPS, EVERY, PAGE_SIZE = Bounds(2, 64), Bounds(1, 64), Bounds(1, 4096)
#: `violations --buffer`: a group's canary buffers, in the order the command line lists them.
BUFFER_CHOICES = ("head.k", "tail.k", "head.v", "tail.v")


def _integer(value: object, option: str, bounds: Bounds) -> int:
    """`value` when it is an int within `bounds`; else the `OptionError` the command line
    gives (the API is called with values no option parser saw: 2**70 was an OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, int):
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:40]}..."
        raise OptionError(f"{shown} is not an integer", option=option)
    if (refused := bounds.refusal(value)) is not None:
        raise OptionError(refused, option=option)
    return value


def _one_of(value: object, allowed: Sequence[str], option: str) -> str:
    """`value` when it is one of `allowed`; else an `OptionError` naming the choices."""
    if not isinstance(value, str) or value not in allowed:
        raise OptionError(f"{str(value)[:40]!r} is not one of {', '.join(allowed)}", option=option)
    return value


def _many(paths: PathLike | Sequence[PathLike]) -> list[PathLike]:
    """One path or several, as a list (iterating one string gave one path per character)."""
    return [paths] if isinstance(paths, str | os.PathLike) else list(paths)


def check(
    paths: PathLike | Sequence[PathLike],
    *,
    kernel: PlannerChoice | str = PlannerChoice.TRITON,
    groups: Sequence[str] | None = None,
    overrides: Overrides = None,
    fail_on: Severity | str = "error",
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CheckReport:
    """Check one dump or several (in parallel processes); an unreadable one gets an `error`
    report, the others are still checked. `kernel`: triton, vectorized, sglang or none. The report
    names the SGLang version installed here, if any, so a reader knows what was compared."""
    from kvcanary_cli.analysis.check import check_dumps
    from kvcanary_cli.catalog import Severity

    many = _many(paths)
    severity = Severity(_one_of(fail_on, [s.value for s in Severity], "--fail-on"))
    if jobs is not None:
        _integer(jobs, "--jobs", POSITIVE)
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
    path: PathLike,
    *,
    slot: int | None = None,
    row: int | None = None,
    space: str = "full",
    group: str | None = None,
    positions: tuple[int, int] | None = None,
    max_cells: int = 256,
    overrides: Overrides = None,
) -> ProvenanceReport:
    """One slot's provenance (`slot`, in `space` full or swa), or one pool row's map (`row`,
    optionally limited to `positions` [start, end)), with the findings touching it."""
    from kvcanary_cli.analysis.check import run_check
    from kvcanary_cli.analysis.focus import focused_findings, focused_index
    from kvcanary_cli.analysis.query import row_map, slot_query
    from kvcanary_cli.dump.loader import load_dump
    from kvcanary_cli.results.cells import Space

    if (slot is None) == (row is None):
        raise OptionError("give exactly one of --slot N or --row R", option="--slot/--row")
    if slot is not None:
        _integer(slot, "--slot", SLOT)
    if row is not None:
        _integer(row, "--row", INDEX)
    if positions is not None:
        if not isinstance(positions, tuple | list) or len(positions) != 2:
            raise OptionError("is not a (start, end) pair", option="--positions")
        for end in positions:
            _integer(end, "--positions", INDEX)
    _integer(max_cells, "--max-rows", POSITIVE)
    dump = load_dump(path, overrides=overrides)
    planner = make_planner(PlannerChoice.VECTORIZED)
    if slot is not None and space == Space.FULL:
        # only the batch rows that hold (or write) the slot: its findings, not the diagnosis
        # one scan of the table serves the findings' rows and the answer's cells
        index = focused_index(dump, slot, max_cells=max_cells)
        found = focused_findings(dump, slot, planner=planner, index=index)
        return slot_query(
            dump, found, slot, space=space, group=group, max_cells=max_cells, index=index
        )
    report = run_check(dump, planner=planner, kernel=None)
    if slot is not None:
        return slot_query(
            dump,
            list(report.findings),
            slot,
            space=space,
            group=group,
            max_cells=max_cells,
        )
    assert row is not None
    return row_map(dump, report, row, group=group, positions=positions, max_cells=max_cells)


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
    """One planner's plan of one group, written to `out` (a plan file) when it was made and
    would launch, with its per-request summary. With `strict`, the reference raises
    `UpstreamPlanError` where SGLang's does."""
    from kvcanary_cli.analysis.plan_summary import summarize_plan
    from kvcanary_cli.dump.loader import load_dump
    from kvcanary_cli.planners.plan_file import save_plan, upstream_raise
    from kvcanary_cli.results.plan import PlanRun

    planner = make_planner(backend, strict=strict)
    dump = load_dump(path, overrides=overrides)
    result = planner.plan(dump, group)
    if result.skipped is not None:  # nothing to write or show entry by entry
        return PlanRun(dump, result, None, f"not planned: {result.skipped}")
    if out is not None and result.launch_error is None:
        save_plan(out, result, dump=dump, overwrite=force)
    problem = None
    if result.launch_error is not None:
        problem = f"{result.launch_error_type}: {result.launch_error}"
    elif (raised := upstream_raise(result)) is not None:
        marked = f"; {out} marks them in kvcanary.verify_undefined" if out else ""
        problem = f"SGLang's reference raises here: {raised} (planned on past it{marked})"
    return PlanRun(dump, result, summarize_plan(dump, result), problem)


def inspect(path: PathLike) -> DumpDescription:
    """What a dump holds (rendered as the `kvcanary.inspect/2` record); validates the file on
    the way."""
    from kvcanary_cli.analysis.describe import describe_dump
    from kvcanary_cli.dump.loader import load_dump

    return describe_dump(load_dump(path), sglang_installed=installed_version())


def shrink(
    path: PathLike, out: PathLike | None, *, overrides: Overrides = None, force: bool = False
) -> ShrinkResult:
    """Write a small dump (format 1.2) of `path` at `out`: what the analysis of `path` reads,
    in its original coordinates, with a record of the source and of what was dropped.
    `check` gives the same findings and diagnosis on it. `out` is never `path`; an existing
    file is replaced only with `force`."""
    from kvcanary_cli import __version__
    from kvcanary_cli.analysis.shrink_selection import shrink_keep
    from kvcanary_cli.dump.loader import load_dump
    from kvcanary_cli.dump.shrink_writer import write_shrunk

    if out is None or str(out) == "-":  # a dump is binary: never to a terminal or a pipe
        raise OptionError("give the small dump's file: -o SMALL.safetensors", option="--out")
    dump = load_dump(path, overrides=overrides)
    kernel = make_kernel(PlannerChoice.VECTORIZED)
    assert kernel is not None
    keep, _ = shrink_keep(dump, planner=make_planner(PlannerChoice.VECTORIZED), kernel=kernel)
    scalars = {
        name: int(value)
        for name, value in (overrides or {}).items()
        if name in SCALARS and value is not None
    }
    return write_shrunk(
        dump, keep, out, kvcanary_version=__version__, overrides=scalars, overwrite=force
    )


def scenarios() -> list[str]:
    """The `synth` scenarios, one line each: name, summary, expected finding codes; then the
    sequences `synth --steps K` writes."""
    from kvcanary_cli.synth.scenarios import scenario_lines
    from kvcanary_cli.synth.sequence import sequence_lines

    return [*scenario_lines(), "", "sequences (--steps K -o DIR):", *sequence_lines()]


def synth(
    scenario: str | None,
    out: PathLike | None,
    *,
    seed: int = 0,
    size: str = "tiny",
    log: PathLike | None = None,
    force: bool = False,
    page_size: int | None = None,
    steps: int | None = None,
    at: int | None = None,
    every: int | None = None,
) -> str:
    """Write a synthetic dump of `scenario` at `out` (`-`: stdout), with its expected findings
    and diagnosis in its metadata, and with `log` a kv_canary server log of its violations;
    `page_size` overrides the scenario's. With `steps`, `scenario` names a sequence (one rank's
    dumps every `every` steps, an event planted at step `at`) and `out` a folder. Returns the
    line saying what was written."""
    _integer(seed, "--seed", INDEX)
    if page_size is not None:
        _integer(page_size, "--page-size", PAGE_SIZE)
    if steps is not None:
        every = 1 if every is None else every
        return _synth_sequence(scenario, out, steps, seed, size, every, at, page_size, force)
    if at is not None or every not in (None, 1):
        raise OptionError("--at and --every go with --steps K", option="--at/--every")
    from kvcanary_cli.dump.files import Target, same_target, write_all_atomically
    from kvcanary_cli.synth.scenarios import make_scenario
    from kvcanary_cli.synth.server_log import scenario_log

    if scenario is None or out is None:
        raise OptionError("give a SCENARIO and --out DUMP (or --list)", option="synth")
    if log is not None and same_target(log, out):
        raise OptionError("names the dump's own file; give the log another name", option="--log")
    state = make_scenario(scenario, seed=seed, size=size, page_size=page_size)
    if log is None or str(out) == "-":  # the log first: a refused one prints no dump
        logged = "" if log is None else f" and {_write_log(scenario_log(state), log, force)}"
        path = state.save(Path(out), overwrite=force)
    else:  # both files or neither: a refused log leaves no dump behind
        text = scenario_log(state)
        log_target: Target = (Path(log), lambda handle: handle.write(text))
        path, log_path = write_all_atomically(
            [state.target(Path(out)), log_target], overwrite=force
        )
        logged = f" and {log_path}"
    paged = "" if page_size is None else f", page size {page_size}"
    return f"wrote {path}{logged} ({scenario}, seed {seed}, size {size}{paged})"


def _write_log(text: bytes, log: PathLike, force: bool) -> Path:
    from kvcanary_cli.dump.files import write_atomically

    return write_atomically(log, lambda handle: handle.write(text), overwrite=force)


def _synth_sequence(
    name: str | None,
    out: PathLike | None,
    steps: int,
    seed: int,
    size: str,
    every: int,
    at: int | None,
    page_size: int | None,
    force: bool,
) -> str:
    from kvcanary_cli.synth.sequence import write_sequence

    _integer(steps, "--steps", STEPS)
    _integer(every, "--every", EVERY)
    if at is not None:
        _integer(at, "--at", POSITIVE)
    if name is None or out is None or str(out) == "-":
        raise OptionError("give a SEQUENCE and --out FOLDER (or --list)", option="synth --steps")
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise OptionError(
            f"{folder} is not a folder: --steps writes one dump a step", option="--out"
        )
    paths = write_sequence(
        name,
        folder,
        steps=steps,
        seed=seed,
        size=size,
        every=every,
        at=at,
        page_size=page_size,
        overwrite=force,
    )
    return (
        f"wrote {len(paths)} dumps to {folder} ({name}, seed {seed}, size {size}, one every "
        f"{every} step(s)): {paths[0].name} … {paths[-1].name}"
    )


def timeline(
    paths: PathLike | Sequence[PathLike], *, overrides: Overrides = None, check: bool = True
) -> TimelineReport:
    """What changed between dumps of one rank (read in step order, one at a time): requests,
    slot owners, LUT entries, SWA leaks, and the events that break the allocator's contract,
    each dated to the steps between two dumps. With `check`, each dump is checked as `check
    --kernel none` does, to date its findings and name each event's cause."""
    from kvcanary_cli.analysis.timeline import timeline as run_timeline

    planner = make_planner(PlannerChoice.VECTORIZED) if check else None
    many = _many(paths)
    return run_timeline(many, planner=planner, overrides=_dict(overrides))


def diff(old: PathLike, new: PathLike, *, overrides: Overrides = None) -> TimelineReport:
    """What changed from `old` to `new` (two dumps of one rank, `old` the earlier)."""
    from kvcanary_cli.analysis.timeline import timeline as run_timeline

    planner = make_planner(PlannerChoice.VECTORIZED)
    return run_timeline([old, new], planner=planner, keep_order=True, overrides=_dict(overrides))


def slot_history(
    paths: PathLike | Sequence[PathLike],
    *,
    slot: int | None,
    row: int | None = None,
    space: str = "full",
    overrides: Overrides = None,
) -> TimelineReport:
    """One slot over several dumps of one rank: its owners, allocator state and LUT entry in
    each, and the events that touch it (`provenance --slot N DUMP DUMP...`)."""
    from kvcanary_cli.analysis.timeline import timeline as run_timeline
    from kvcanary_cli.results.cells import Space

    if slot is None or row is not None:
        raise OptionError(
            "over several dumps, give --slot N (--row maps one dump's row)", option="--slot/--row"
        )
    _integer(slot, "--slot", SLOT)
    space = _one_of(space, [s.value for s in Space], "--space")
    many = _many(paths)
    return run_timeline(many, planner=None, focus=(slot, Space(space)), overrides=_dict(overrides))


def _dict(overrides: Overrides) -> dict[str, int | str | None] | None:
    return None if overrides is None else dict(overrides)


def selftest(*, sglang: bool = False, size: str = "tiny", seed: int = 0) -> SelftestReport:
    """Every synth scenario through kvcanary's planners (and, with `sglang`, the installed
    SGLang's launcher), compared per plan field and raise (rendered as the
    `kvcanary.selftest/1` record)."""
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
    """Violation rows from dumps' rings and server logs (`-`: stdin; one path, or several),
    explained against the one dump involved (a SOURCE, or `dump`); with `replay`, compared
    with the rows SGLang's verify would record on that dump. `group`/`buffer` restrict rows
    and replay."""
    from kvcanary_cli.analysis.violations.collect import violations_report
    from kvcanary_cli.dump.schema import Group

    if group is not None:
        _one_of(group, [g.value for g in Group], "--group")
    if buffer is not None:
        _one_of(buffer, BUFFER_CHOICES, "--buffer")
    return violations_report(
        [os.fspath(source) for source in _many(sources)],
        dump=dump,
        replay=replay,
        group=group,
        buffer=buffer,
        overrides=overrides,
    )
