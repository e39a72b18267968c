"""What `kvcanary synth` writes: a scenario's dump (with its server log: both files or
neither) or a sequence's folder of dumps, and the line that says what was written.

Every option is checked (`option_values`) before anything is written."""

from __future__ import annotations

import os
from pathlib import Path

from kvcanary_cli.catalog import plural
from kvcanary_cli.dump.files import Target, same_target, write_all_atomically, write_atomically
from kvcanary_cli.errors import OptionError
from kvcanary_cli.option_values import EVERY, INDEX, PAGE_SIZE, POSITIVE, STEPS, checked_integer
from kvcanary_cli.synth.scenarios import make_scenario
from kvcanary_cli.synth.sequence import write_sequence
from kvcanary_cli.synth.server_log import scenario_log

__all__ = ["write_scenario", "write_synth"]

PathLike = str | os.PathLike[str]


def write_synth(
    scenario: str | None,
    out: PathLike | None,
    *,
    seed: int,
    size: str,
    log: PathLike | None,
    force: bool,
    page_size: int | None,
    steps: int | None,
    at: int | None,
    every: int | None,
) -> str:
    """`write_scenario`, or with `steps` a sequence's `steps` dumps of one rank in the folder
    `out`, once their options are checked (`api.synth` holds their defaults)."""
    checked_integer(seed, "seed", INDEX)
    if page_size is not None:
        checked_integer(page_size, "page_size", PAGE_SIZE)
    if steps is None:
        if at is not None or every not in (None, 1):
            raise OptionError("--at and --every go with --steps K", option="at/every")
        if scenario is None or out is None:
            raise OptionError("give a SCENARIO and --out DUMP (or --list)", option="synth")
        return write_scenario(
            scenario, out, seed=seed, size=size, log=log, force=force, page_size=page_size
        )
    checked_integer(steps, "steps", STEPS)
    every = checked_integer(1 if every is None else every, "every", EVERY)
    if at is not None:
        checked_integer(at, "at", POSITIVE)
    if scenario is None or out is None or str(out) == "-":
        raise OptionError("give a SEQUENCE and --out FOLDER (or --list)", option="synth --steps")
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise OptionError(f"{folder} is not a folder: --steps writes one dump a step", option="out")
    paths = write_sequence(
        scenario,
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
        f"wrote {len(paths)} dumps to {folder} ({scenario}, seed {seed}, size {size}, one every "
        f"{plural(every, 'step')}): {paths[0].name} … {paths[-1].name}"
    )


def write_scenario(
    scenario: str,
    out: PathLike,
    *,
    seed: int,
    size: str,
    log: PathLike | None,
    force: bool,
    page_size: int | None,
) -> str:
    """Write `scenario`'s dump at `out` (`-`: standard output) and, with `log`, the kv_canary
    server log of its violations."""
    if log is not None and same_target(log, out):
        raise OptionError("names the dump's own file; give the log another name", option="log")
    state = make_scenario(scenario, seed=seed, size=size, page_size=page_size)
    logged = ""
    if log is None:
        path = state.save(Path(out), overwrite=force)
    elif str(out) == "-":  # the log first: a refused one prints no dump
        text = scenario_log(state)
        logged = f" and {write_atomically(log, lambda h: h.write(text), overwrite=force)}"
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
