"""The `kvcanary` command line: parse options, call the library, print, map to an exit code.

Nothing here decides anything about dumps; it only wires dump → planners/analysis → render.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import IntEnum
from inspect import Parameter, signature
from pathlib import Path
from typing import Annotated, Any

import typer

from kvcanary_cli import __version__
from kvcanary_cli.errors import KvcanaryError

__all__ = ["ExitCode", "app", "main"]


class ExitCode(IntEnum):
    """Exit codes, as documented in the README and findings.md."""

    CLEAN = 0
    FINDINGS = 1
    BAD_INPUT = 2
    INTERNAL = 3


app = typer.Typer(
    name="kvcanary",
    help=(
        "Diagnose KV-cache dumps of SGLang's kv canary: run the reference planner and the GPU "
        "kernel on a dump, compare them, and show every bad slot with where it came from.\n\n"
        "Exit codes: 0 clean, 1 findings, 2 bad input or usage, 3 internal error."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvcanary {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True,
                           help="Print the version and exit.")
    ] = False,
) -> None:
    """Diagnose KV-cache dumps of SGLang's kv canary."""


@contextmanager
def guarded() -> Iterator[None]:
    """Turn user mistakes into one stderr line + exit 2, and crashes into exit 3."""
    try:
        yield
    except (typer.Exit, typer.Abort, SystemExit):
        raise
    except KvcanaryError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(130) from None
    except Exception as exc:
        if os.environ.get("KVCANARY_DEBUG") == "1":
            traceback.print_exc()
        typer.echo(
            f"internal error: {type(exc).__name__}: {exc} -- this is a kvcanary bug; please "
            "report it with the output of `kvcanary inspect DUMP` (KVCANARY_DEBUG=1 shows the "
            "traceback)",
            err=True,
        )
        raise typer.Exit(ExitCode.INTERNAL) from None


DumpArg = Annotated[
    Path, typer.Argument(help="A .safetensors dump (see README: dump format v1).",
                         show_default=False, metavar="DUMP")
]


def _emit(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _override(option: str, help_text: str) -> Any:
    return Annotated[int | None, typer.Option(option, help=help_text,
                                              rich_help_panel="Scalar overrides")]


#: (parameter, dump scalar key, option type): the scalar overrides shared by every command
#: that plans. Command-line values win over the dump's metadata and scalar tensors.
_SCALAR_OVERRIDES = (
    ("swa_window", "swa_window_size", _override(
        "--swa-window", "Override swa_window_size (window W of the swa group).")),
    ("verify_capacity", "verify_capacity", _override(
        "--verify-capacity", "Override verify_capacity (default: no overflow).")),
    ("write_req_capacity", "write_req_capacity", _override(
        "--write-req-capacity", "Override write_req_capacity (default: bs).")),
    ("token_offset", "kv_token_id_vs_position_offset", _override(
        "--token-offset", "Override kv_token_id_vs_position_offset (1 for EAGLE draft pools).")),
    ("page_size", "page_size", _override("--page-size", "Override page_size.")),
    ("num_full_slots", "num_full_slots", _override(
        "--num-full-slots", "Override num_full_slots (rows of the full KV pool).")),
    ("num_swa_slots", "num_swa_slots", _override(
        "--num-swa-slots", "Override num_swa_slots (rows of the SWA KV pool).")),
)


def with_scalar_overrides(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command the scalar override options, passed to it as one `overrides` dict.

    The options are declared once here instead of in every command's signature; typer reads
    the wrapper's signature, so `--help` lists them like any other option.
    """
    declared = signature(command, eval_str=True)
    own = [p for p in declared.parameters.values() if p.name != "overrides"]
    extra = [Parameter(name, Parameter.KEYWORD_ONLY, default=None, annotation=kind)
             for name, _, kind in _SCALAR_OVERRIDES]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        overrides = {key: kwargs.pop(name) for name, key, _ in _SCALAR_OVERRIDES}
        command(overrides=overrides, **kwargs)

    wrapper.__signature__ = declared.replace(parameters=own + extra)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in own + extra}
    return wrapper


@app.command()
@with_scalar_overrides
def check(
    dumps: Annotated[list[Path], typer.Argument(
        help="One or more .safetensors dumps (one per rank, say).", show_default=False,
        metavar="DUMP")],
    group: Annotated[str, typer.Option(
        "--group", "-g", metavar="full|swa|all",
        help="Groups to plan (default: all the dump has).")] = "all",
    kernel: Annotated[str, typer.Option(
        "--kernel", "-k", metavar="triton|torch|none",
        help="What stands in for the production GPU path: triton (the kernels; compiled on "
             "CUDA, interpreted elsewhere), torch (same GPU semantics, vectorized: fast), none "
             "(skip the comparison).")] = "triton",
    output_format: Annotated[str, typer.Option(
        "--format", "-f", metavar="table|json|markdown",
        help="table for a terminal, json for scripts (schema kvcanary.check/1), markdown for "
             "a bug report.")] = "table",
    fail_on: Annotated[str, typer.Option(
        "--fail-on", metavar="error|warning",
        help="Exit 1 when a finding is at least this severe.")] = "error",
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
    with guarded():
        from kvcanary_cli.analysis.check import check_dumps, run_check
        from kvcanary_cli.analysis.model import CheckReport
        from kvcanary_cli.dump import load_dump
        from kvcanary_cli.render import OutputFormat

        fmt = _parse_format(output_format, tuple(OutputFormat))
        threshold = _parse_severity(fail_on)
        groups = None if group == "all" else [group]
        if len(dumps) == 1:
            with _busy(f"checking {dumps[0]}"):
                single = run_check(load_dump(dumps[0], overrides=overrides), kernel=kernel,
                                   groups=groups)
            report = CheckReport(dumps=(single,), fail_on=threshold)
        else:
            with _progress(len(dumps)) as tick:
                report = check_dumps(dumps, overrides=overrides, kernel=kernel, groups=groups,
                                     fail_on=threshold, jobs=jobs, progress=tick)
        _show_check(report, fmt, max_rows)
        for bad in report.dumps:
            if bad.error is not None:
                typer.echo(f"error: {bad.error}", err=True)
        if report.bad_input:
            raise typer.Exit(ExitCode.BAD_INPUT)
        raise typer.Exit(ExitCode.FINDINGS if report.failed else ExitCode.CLEAN)


@app.command()
@with_scalar_overrides
def provenance(
    dump: DumpArg,
    slot: Annotated[int | None, typer.Option(
        "--slot", "-s", help="Slot to trace: every req_to_token cell holding it.")] = None,
    row: Annotated[int | None, typer.Option(
        "--row", "-r", help="Pool row to map instead: live prefix, window, pending writes, "
                            "stale tail, bad cells marked.")] = None,
    space: Annotated[str, typer.Option(
        "--space", metavar="full|swa",
        help="Whether --slot is a full-pool slot or an SWA-pool slot.")] = "full",
    group: Annotated[str | None, typer.Option(
        "--group", "-g", metavar="full|swa",
        help="Group whose window labels the roles (default: swa for --space swa).")] = None,
    output_format: Annotated[str, typer.Option(
        "--format", "-f", metavar="table|json|markdown", help="Output format.")] = "table",
    overrides: dict[str, int | None] | None = None,
) -> None:
    """Trace one slot (or map one pool row) through the whole req_to_token table.

    Shows every cell holding the slot with its role (verify, prefix, chain-prev,
    pending-write, stale-tail, idle-row), radix sharing, the slot's SWA translation, allocator
    state when the dump has free lists, and the findings touching it.
    """
    with guarded():
        from kvcanary_cli.analysis.check import run_check
        from kvcanary_cli.analysis.query import row_map, slot_query
        from kvcanary_cli.dump import load_dump
        from kvcanary_cli.errors import UsageError
        from kvcanary_cli.render import OutputFormat, render_provenance

        fmt = _parse_format(output_format, tuple(OutputFormat))
        if (slot is None) == (row is None):
            raise UsageError("give exactly one of --slot N or --row R", tensor="provenance")
        loaded = load_dump(dump, overrides=overrides)
        report = run_check(loaded, kernel="none")
        if slot is not None:
            answer = slot_query(loaded, report, slot, space=space, group=group)
        else:
            assert row is not None
            answer = row_map(loaded, report, row, group=group or "full")
        _print(render_provenance(answer, fmt))


@app.command()
@with_scalar_overrides
def plan(
    dump: DumpArg,
    group: Annotated[str, typer.Option("--group", "-g", help="Group to plan: full or swa.",
                                       metavar="full|swa")] = "full",
    backend: Annotated[str, typer.Option(
        "--backend", "-b", metavar="reference|torch|triton",
        help="reference: scalar, literal (slow); torch: vectorized, same results; triton: the "
             "GPU kernels (compiled on CUDA, interpreted elsewhere; GPU semantics on bad input).",
    )] = "torch",
    strict: Annotated[bool, typer.Option(
        "--strict", help="With --backend reference: raise (exit 1) exactly where SGLang's "
                         "torch reference raises, with its message.")] = False,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Write the plan (SGLang's field names, trimmed to what upstream "
                            "defines) to this .safetensors file.")] = None,
    output_format: Annotated[str, typer.Option("--format", "-f", help="table or json.",
                                               metavar="table|json")] = "table",
    max_rows: Annotated[int, typer.Option("--max-rows", help="Batch rows shown in the table.",
                                          min=1)] = 50,
    overrides: dict[str, int | None] | None = None,
) -> None:
    """Run one planner on one group and show the plan per request (or write it with --out).

    Exit 0 when planned; 1 when the planner raises like upstream would (--strict, or the GPU
    launch refusing the batch); 2 on bad input.
    """
    with guarded():
        from kvcanary_cli.analysis.plan_summary import plan_record
        from kvcanary_cli.dump import load_dump
        from kvcanary_cli.errors import UpstreamPlanError
        from kvcanary_cli.planners import get_planner
        from kvcanary_cli.planners.plan_file import save_plan
        from kvcanary_cli.render import OutputFormat, make_console, to_json
        from kvcanary_cli.render.plan_view import plan_table

        fmt = _parse_format(output_format, (OutputFormat.TABLE, OutputFormat.JSON))
        planner = get_planner(backend, strict=strict)
        loaded = load_dump(dump, overrides=overrides)
        try:
            result = planner.plan(loaded, group)
        except UpstreamPlanError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(ExitCode.FINDINGS) from None
        if out is not None and result.launch_error is None:
            save_plan(out, result, source=str(dump))
        record = plan_record(loaded, result)
        if fmt is OutputFormat.JSON:
            _emit(to_json(record))
        else:
            make_console().print(plan_table(record, max_rows=max_rows))
        if result.launch_error is not None:
            typer.echo(f"ValueError: {result.launch_error}", err=True)
            raise typer.Exit(ExitCode.FINDINGS)


@app.command()
def inspect(
    dump: DumpArg,
    output_format: Annotated[
        str, typer.Option("--format", "-f", help="table or json.", metavar="table|json")
    ] = "table",
) -> None:
    """Show what a dump holds: tensors, scalars (and their source), groups, batch, notes.

    Validates the file on the way: a malformed dump is reported as one error line, exit 2.
    """
    with guarded():
        from kvcanary_cli.dump import load_dump
        from kvcanary_cli.dump.describe import describe_dump
        from kvcanary_cli.render import OutputFormat, make_console, to_json
        from kvcanary_cli.render.inspect_view import inspect_table

        fmt = _parse_format(output_format, (OutputFormat.TABLE, OutputFormat.JSON))
        record = describe_dump(load_dump(dump))
        if fmt is OutputFormat.JSON:
            _emit(to_json(record))
        else:
            make_console().print(inspect_table(record))


@app.command()
def synth(
    scenario: Annotated[str | None, typer.Argument(
        help="Scenario name (see --list).", show_default=False, metavar="SCENARIO")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Dump file to write.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
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
    with guarded():
        from kvcanary_cli.dump.scenarios import SCENARIOS, make_scenario
        from kvcanary_cli.errors import UsageError

        if list_:
            width = max(len(name) for name in SCENARIOS)
            for name, item in SCENARIOS.items():
                codes = ", ".join(item.expected) or "none (clean)"
                typer.echo(f"{name:<{width}}  {item.summary}  [{codes}]")
            return
        if scenario is None or out is None:
            raise UsageError("give a SCENARIO and --out DUMP (or --list)", tensor="synth")
        path = make_scenario(scenario, seed=seed, size=size).save(out)
        typer.echo(f"wrote {path} ({scenario}, seed {seed}, size {size})")


def _show_check(report: Any, fmt: Any, max_rows: int) -> None:
    from kvcanary_cli.render import render_check

    _print(render_check(report, fmt, max_rows=max_rows))


def _print(rendered: Any) -> None:
    """Strings (json, markdown) go out verbatim; rich renderables through a console."""
    from kvcanary_cli.render import make_console
    from kvcanary_cli.render.console import emit

    emit(rendered, make_console())


def _parse_severity(value: str) -> Any:
    from kvcanary_cli.analysis.model import Severity
    from kvcanary_cli.errors import UsageError

    if value not in ("error", "warning"):
        raise UsageError(f"unknown severity {value!r} (choose error or warning)",
                         tensor="--fail-on")
    return Severity(value)


@contextmanager
def _busy(message: str) -> Iterator[None]:
    """A spinner on stderr while one big dump is checked (only on a terminal)."""
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(message):
        yield


@contextmanager
def _progress(total: int) -> Iterator[Any]:
    """A progress bar on stderr over several dumps (only on a terminal)."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("checking dumps", total=total)
        yield lambda done, _total: bar.update(task, completed=done)


def _parse_format(value: str, allowed: tuple[Any, ...]) -> Any:
    for choice in allowed:
        if value == choice.value:
            return choice
    from kvcanary_cli.errors import UsageError

    names = ", ".join(c.value for c in allowed)
    raise UsageError(f"unknown format {value!r} (choose one of: {names})", tensor="--format")


def main() -> None:
    """Console-script entry point."""
    _limit_torch_threads()
    app(prog_name="kvcanary")


def _limit_torch_threads() -> None:
    """One intra-op torch thread unless the user chose (OMP_NUM_THREADS).

    kvcanary's work is memory-bound gathers over modest batches: extra intra-op threads buy
    little there, and on CPU-quota'd containers they spin against each other (seen: a
    121K-element arange 50x slower with 2 threads than with 1). Several dumps are checked
    in separate processes instead. Set lazily: torch is imported by the command anyway.
    """
    if "OMP_NUM_THREADS" in os.environ:
        return
    os.environ["OMP_NUM_THREADS"] = "1"  # read when torch starts its thread pool
