"""`kvcanary soak`'s options, declared like the other commands' (cli_options): typer only."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvcanary_cli.cli_options import integer

__all__ = [
    "SoakCoreOpt",
    "SoakFaultOpt",
    "SoakOutOpt",
    "SoakPageSizeOpt",
    "SoakStepsOpt",
    "SoakTreeOpt",
]

SoakTreeOpt = Annotated[
    str | None,
    typer.Option(
        "--sglang-tree",
        metavar="PATH",
        help="An SGLang source tree or release wheel to run instead of the installed SGLang.",
    ),
]
SoakStepsOpt = Annotated[
    int,
    typer.Option(
        "--steps", **integer("Scheduler steps to run in all (the budget).", 1, 10**7, "N")
    ),
]
SoakPageSizeOpt = Annotated[
    int | None,
    typer.Option(
        "--page-size", **integer("One KV page size (default: 1, 4 and 16 in turn).", 1, 64, "N")
    ),
]
SoakCoreOpt = Annotated[
    str | None,
    typer.Option(
        "--core", metavar="python|rust", help="One radix tree core (default: every one here)."
    ),
]
SoakFaultOpt = Annotated[
    str | None,
    typer.Option(
        "--fault",
        metavar="NAME",
        help="Plant a known SGLang bug to see soak find it: unmapped-representative, "
        "double-free-group-end or shared-boundary-page.",
    ),
]
SoakOutOpt = Annotated[
    Path,
    typer.Option(
        "--out", metavar="DIR", help="Where a failure's dump, workload and reproducer go."
    ),
]
