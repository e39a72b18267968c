"""`kvcanary soak`'s options, declared like the other commands' (cli_options), and the command
itself (`register`): typer only, so `kvcanary --help` imports neither torch nor SGLang."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

import kvcanary_cli.cli_options as opt
from kvcanary_cli.cli_options import integer_option
from kvcanary_cli.option_values import Bounds
from kvcanary_cli.output import deliver
from kvcanary_cli.render import OutputFormat

__all__ = [
    "DEFAULT_OUT",
    "CoreOpt",
    "FaultOpt",
    "OutOpt",
    "PageSizeOpt",
    "StepsOpt",
    "TimingsOpt",
    "TreeOpt",
    "register",
]

TreeOpt = Annotated[
    str | None,
    typer.Option(
        "--sglang-tree",
        metavar="PATH",
        help="An SGLang source tree or release wheel to run instead of the installed SGLang.",
    ),
]
StepsOpt = Annotated[
    int,
    integer_option(
        "--steps",
        within=Bounds(1, 10**7),
        help="Scheduler steps to run in all (the budget: the last history stops where it is "
        "spent; shrinking a finding runs more).",
    ),
]
PageSizeOpt = Annotated[
    int | None,
    integer_option(
        "--page-size", within=Bounds(1, 64), help="One KV page size (default: 1, 4 and 16 in turn)."
    ),
]
CoreOpt = Annotated[
    str | None,
    typer.Option(
        "--core", metavar="python|rust", help="One radix tree core (default: every one here)."
    ),
]
FaultOpt = Annotated[
    str | None,
    typer.Option(
        "--fault",
        metavar="NAME",
        help="Plant a known SGLang bug to see soak find it: unmapped-representative, "
        "double-free-group-end or shared-boundary-page.",
    ),
]
#: Where a failure's files go by default.
DEFAULT_OUT = Path("kvcanary-soak")
OutOpt = Annotated[
    Path,
    typer.Option(
        "--out", metavar="DIR", help="Where a failure's dump, workload and reproducer go."
    ),
]

TimingsOpt = Annotated[
    bool,
    typer.Option(
        "--timings",
        help="Report the wall-clock seconds (off: two runs of one soak print the same bytes).",
    ),
]


def register(app: typer.Typer) -> None:
    """Add `soak` to the `kvcanary` app."""

    @app.command()
    def soak(
        sglang_tree: TreeOpt = None,
        steps: StepsOpt = 600,
        seed: opt.SeedOpt = 0,
        page_size: PageSizeOpt = None,
        core: CoreOpt = None,
        fault: FaultOpt = None,
        out: OutOpt = DEFAULT_OUT,
        force: opt.ForceOpt = False,
        output_format: opt.FormatOpt = OutputFormat.TABLE,
        timings: TimingsOpt = False,
    ) -> None:
        """Run SGLang's real memory cache on CPU under a seeded random workload, audited each
        step.

        kvcanary checks a dump of every step and SGLang's own checks run on the same steps; on
        the first finding the dump, the workload (seed, step) and a shrunk workload that still
        fails go to --out (checked before the soak: --force to replace earlier files), and the
        report says what SGLang's checks did not see. Exit 0 clean, 1 found, 2 bad input (not
        an SGLang tree, no kv canary, a missing dependency, an --out it may not write).
        """
        from kvcanary_cli.soak.command import run_and_render

        text, code = run_and_render(
            sglang_tree,
            steps,
            seed,
            page_size,
            core,
            fault,
            out,
            output_format,
            force=force,
            timings=timings,
        )
        deliver(text, None, inputs=[])
        raise typer.Exit(code)
