"""Walk `kvcanary check` from a dump to its rendered output: which kvcanary_cli modules it
passes through, and how often it comes back to one.

    python bench/walk.py                          # this checkout (or the first on PYTHONPATH)
    python bench/walk.py --top 15                 # and the hubs: most visited, most taken steps
    python bench/walk.py --checkout /tmp/before   # an older checkout's kvcanary_cli, same dumps

Runs `check DUMP --format F` in this process, through the typer app of `kvcanary_cli.cli`
(typer's test runner: what the console script runs, its output captured), for each bundled
example dump and format. Every command is run once unprofiled first, so that what it imports
lazily is imported before the walk is measured; nothing under the import machinery is
followed all the same (the `imports` column counts the kvcanary_cli modules imported during a
measured walk: 0 after the warm-up).

A profiler hook (`sys.setprofile`, and `threading.setprofile` for the threads the command
starts; Python frames only) maps each frame to its kvcanary_cli module by its code's file name
and follows, per thread, the module of the nearest kvcanary_cli frame under each call: code in
between (typer, rich, the standard library) is passed through, so rich calling a view's
`__rich_console__` while `render.console.emit` prints is a step console -> that view. A call
into a module from a different one (or from outside kvcanary_cli: `(outside)`) is a visit:

- entered: distinct modules visited;
- re-entered: modules visited more than once (the walk left them and came back by a new call,
  from their callers or through a round trip to another module);
- visits: every visit.

The numbers in brackets count the same for the `render/` modules only (visits into them).
The `out` column is a digest of the command's stdout: the same dump and format give the same
digest on two checkouts when their output is byte-equal. Forked planner processes (big
launches only) are not followed; the example dumps are too small for them.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The bundled example dumps walked by default (examples/README.md says what each holds).
DUMPS = ("truncated-lut.safetensors", "use-after-free.safetensors")
FORMATS = ("table", "json", "markdown")
#: The width the table view is laid out for (a pipe's, as `render.console` gives it): fixed,
#: since a narrower one chooses other layouts (and other modules).
COLUMNS = "120"
OUTSIDE = "(outside)"
#: A frame of the import machinery: nothing under it is counted.
_IMPORTING = "(importing)"


@dataclass
class Walk:
    """What one profiled command went through."""

    #: (from, to) module -> how many calls crossed from one into the other.
    steps: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: kvcanary_cli modules imported during the walk (their import-time code not followed).
    imported: int = 0

    def visits(self) -> Counter[str]:
        """Module -> how many times it was entered from elsewhere."""
        out: Counter[str] = Counter()
        for (_, to), n in self.steps.items():
            out[to] += n
        return out

    def numbers(self, keep: Callable[[str], bool] = lambda module: True) -> tuple[int, int, int]:
        """(entered, re-entered, visits) over the modules `keep` accepts."""
        visits = {m: n for m, n in self.visits().items() if keep(m)}
        return len(visits), sum(1 for n in visits.values() if n > 1), sum(visits.values())


class Tracker:
    """The profiler hook: per thread, the stack of the nearest kvcanary_cli module of each
    live Python frame (None: no kvcanary_cli frame under it)."""

    def __init__(self, package: Path) -> None:
        self.package = str(package) + os.sep
        self.walk = Walk()
        self._stacks: dict[int, list[str | None]] = {}
        self._modules: dict[str, str | None] = {}

    def module_of(self, filename: str) -> str | None:
        """`render.table.check` for .../kvcanary_cli/render/table/check.py; None outside."""
        if filename in self._modules:
            return self._modules[filename]
        name: str | None = None
        if filename.startswith("<frozen importlib"):
            name = _IMPORTING
        else:
            path = os.path.realpath(filename)
            if path.startswith(self.package) and path.endswith(".py"):
                parts = path[len(self.package) : -len(".py")].split(os.sep)
                name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"
        self._modules[filename] = name
        return name

    def hook(self, frame: FrameType, event: str, arg: object) -> None:
        """`sys.setprofile`'s callback: 'call' pushes, 'return' pops (C calls are ignored)."""
        if event == "call":
            stack = self._stacks.setdefault(threading.get_ident(), [])
            under = stack[-1] if stack else None
            module = self.module_of(frame.f_code.co_filename)
            if _IMPORTING in (under, module):  # an import: nothing under it is followed
                body = under == _IMPORTING and frame.f_code.co_name == "<module>"
                if body and module not in (None, _IMPORTING):
                    self.walk.imported += 1
                stack.append(_IMPORTING)
                return
            if module is None:
                module = under  # not ours: the frame carries the module under it
            elif module != under:
                self.walk.steps[(under or OUTSIDE, module)] += 1
            stack.append(module)
        elif event == "return":
            live = self._stacks.get(threading.get_ident())
            if live:
                live.pop()


@dataclass(frozen=True)
class Outcome:
    """One command's exit code, its stdout's size and digest, and its walk."""

    exit_code: int
    out_bytes: int
    digest: str
    walk: Walk


def run_check(app: Any, args: list[str], package: Path | None) -> Outcome:
    """Run `kvcanary ARGS` through `app`, profiled when `package` is given."""
    from typer.testing import CliRunner

    runner = CliRunner()
    tracker = Tracker(package) if package is not None else None
    if tracker is not None:
        threading.setprofile(tracker.hook)
        sys.setprofile(tracker.hook)
    try:
        result = runner.invoke(app, args, env={"COLUMNS": COLUMNS})
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise RuntimeError(f"kvcanary {' '.join(args)} failed") from result.exception
    out = result.stdout_bytes
    return Outcome(
        exit_code=result.exit_code,
        out_bytes=len(out),
        digest=hashlib.sha256(out).hexdigest()[:12],
        walk=tracker.walk if tracker is not None else Walk(),
    )


def choose_checkout(asked: Path | None) -> Path:
    """The checkout whose kvcanary_cli is walked: `--checkout`, else the first PYTHONPATH
    entry holding one, else this script's."""
    if asked is not None:
        return asked.resolve()
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and (Path(entry) / "kvcanary_cli" / "__init__.py").is_file():
            return Path(entry).resolve()
    return ROOT


def revision(checkout: Path) -> str:
    """The checkout's commit, short (`?` when it is not a git checkout)."""
    done = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "?"


def is_render(module: str) -> bool:
    """Whether a module lies under kvcanary_cli/render/."""
    return module == "render" or module.startswith("render.")


def numbers_cell(walk: Walk, which: int) -> str:
    """One of (entered, re-entered, visits), all modules and [render only]."""
    return f"{walk.numbers()[which]} [{walk.numbers(is_render)[which]}]"


def table(rows: list[tuple[str, str, Outcome, bool]]) -> list[str]:
    """One aligned line per (dump, format)."""
    head = ["dump", "format", "exit", "out bytes", "out", "imports"]
    head += ["entered", "re-entered", "visits"]
    lines = [head]
    for dump, fmt, outcome, stable in rows:
        walk = outcome.walk
        lines.append(
            [
                dump,
                fmt,
                str(outcome.exit_code),
                str(outcome.out_bytes),
                outcome.digest,
                str(walk.imported),
                numbers_cell(walk, 0),
                numbers_cell(walk, 1),
                numbers_cell(walk, 2) + ("" if stable else " (unstable)"),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    left = {0, 1, 4}  # dump, format, digest
    return [
        "  ".join(
            cell.ljust(width) if i in left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    ]


def hubs(walks: list[Walk], count: int, keep: Callable[[str], bool], what: str) -> list[str]:
    """The `count` most visited modules and most taken steps into them, over all the walks,
    for the modules `keep` accepts."""
    visits: Counter[str] = Counter()
    steps: Counter[tuple[str, str]] = Counter()
    for walk in walks:
        visits.update({m: n for m, n in walk.visits().items() if keep(m)})
        steps.update({s: n for s, n in walk.steps.items() if keep(s[1])})
    lines = [f"-- most visited {what} (over {len(walks)} walks)"]
    lines += [f"{n:8d}  {module}" for module, n in visits.most_common(count)]
    lines.append(f"-- most taken steps into {what}")
    lines += [f"{n:8d}  {a} -> {b}" for (a, b), n in steps.most_common(count)]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(__doc__ or "").split("\n\n", 1)[1],
    )
    parser.add_argument("--checkout", type=Path, help="the checkout whose kvcanary_cli runs")
    parser.add_argument(
        "--dump", type=Path, action="append", help="a dump to walk (default: the examples)"
    )
    parser.add_argument("--format", dest="formats", action="append", choices=FORMATS)
    parser.add_argument("--top", type=int, default=0, metavar="N", help="list N hubs")
    args = parser.parse_args(argv)

    checkout = choose_checkout(args.checkout)
    sys.path.insert(0, str(checkout))
    package = Path(importlib.import_module("kvcanary_cli").__file__ or "").resolve().parent
    if package != checkout / "kvcanary_cli":
        parser.error(f"imported {package}, not the checkout's {checkout / 'kvcanary_cli'}")
    app = importlib.import_module("kvcanary_cli.cli").app
    dumps = args.dump or [ROOT / "examples" / name for name in DUMPS]
    formats = args.formats or list(FORMATS)
    commands = [(d, f, ["check", str(d), "--format", f]) for d in dumps for f in formats]

    for _, _, command in commands:  # the warm-up: lazy imports, first-use set-up
        run_check(app, command, None)
    rows = []
    for dump, fmt, command in commands:
        first, again = (run_check(app, command, package) for _ in range(2))
        stable = first.walk.steps == again.walk.steps and first.digest == again.digest
        rows.append((dump.name, fmt, first, stable))
    print(f"kvcanary_cli of {checkout} ({revision(checkout)}); [render/ only]")
    print("\n".join(table(rows)))
    if args.top:
        walks = [outcome.walk for _, _, outcome, _ in rows]
        print("\n".join(hubs(walks, args.top, lambda module: True, "modules")))
        print("\n".join(hubs(walks, args.top, is_render, "render/ modules")))


if __name__ == "__main__":
    main()
