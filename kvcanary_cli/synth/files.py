"""What `kvcanary synth` writes: a scenario's dump (with its server log: both files or
neither) or a sequence's folder of dumps, and the line that says what was written.

Every option is checked (`option_values`) before anything is written."""

from __future__ import annotations

import os
from collections.abc import Iterable
from difflib import get_close_matches
from pathlib import Path

from kvcanary_cli.catalog import plural
from kvcanary_cli.dump.files import Target, same_target, write_all_atomically, write_atomically
from kvcanary_cli.errors import OptionError
from kvcanary_cli.option_values import EVERY, INDEX, PAGE_SIZE, POSITIVE, STEPS, checked_integer
from kvcanary_cli.synth.scenarios import SCENARIOS, make_scenario
from kvcanary_cli.synth.sequence import SEQUENCES, write_sequence
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
    others: Iterable[str] = (),
) -> str:
    """`write_scenario`, or with `steps` a sequence's `steps` dumps of one rank in the folder
    `out`, once their options are checked (`api.synth` holds their defaults). `others`: the
    other engines' scenario names, for the suggestion a misspelt name gets."""
    checked_integer(seed, "seed", INDEX)
    if page_size is not None:
        checked_integer(page_size, "page_size", PAGE_SIZE)
    if steps is None:
        if at is not None or every not in (None, 1):
            raise OptionError("--at and --every go with --steps K", option="at/every")
        if scenario is not None:
            _check_name(scenario, sequence=False, others=others)
        if scenario is None or out is None:
            raise OptionError("give a SCENARIO and --out DUMP (or --list)", option="synth")
        return write_scenario(
            scenario, out, seed=seed, size=size, log=log, force=force, page_size=page_size
        )
    checked_integer(steps, "steps", STEPS)
    every = checked_integer(1 if every is None else every, "every", EVERY)
    if at is not None:
        checked_integer(at, "at", POSITIVE)
    if scenario is not None:
        _check_name(scenario, sequence=True, others=others)
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
        f"{'step' if every == 1 else plural(every, 'step')}): {paths[0].name} … {paths[-1].name}"
    )


def _check_name(name: str, *, sequence: bool, others: Iterable[str]) -> None:
    """Refuse a name that is not what was asked for: a one-dump scenario given `--steps`, a
    sequence without it, or a misspelling (with the closest names)."""
    wanted, other = (SEQUENCES, SCENARIOS) if sequence else (SCENARIOS, SEQUENCES)
    if name in wanted:
        return
    if name in other:
        fix = "drop --steps" if sequence else "add --steps K and --out a folder"
        kind = "one-dump scenario" if sequence else "sequence"
        raise OptionError(f"{name} is a {kind} ({fix})", option="scenario")
    names = dict.fromkeys([*wanted, *other, *others])
    close = get_close_matches(name, list(names), n=3, cutoff=0.75)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise OptionError(
        f"unknown {'sequence' if sequence else 'scenario'} {name!r}",
        option="scenario",
        hint=f"{hint}kvcanary synth --list shows them",
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
