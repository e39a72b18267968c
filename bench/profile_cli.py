"""Profile whole `kvcanary` commands on the benchmark's dumps: where the time goes.

    python bench/profile_cli.py --size medium check --kernel none
    python bench/profile_cli.py --size medium --truncated-lut check --format json
    python bench/profile_cli.py --size medium provenance --slot {slot_finding}
    python bench/profile_cli.py --size medium --standard          # the set below, both dumps

Each command runs in a fresh process under cProfile (`python -m cProfile -m kvcanary_cli`), so
imports count; the dump (built and cached as `bench/run.py` does) goes after the command's
name, and `{slot_finding}`, `{slot_clean}` and `{row}` stand for the sidecar's picks. Prints
the top functions by cumulative and by own time, and keeps the `.prof` files (bench/out, or
`--out`) for `python -m pstats` or snakeviz. cProfile slows Python-heavy code (the Triton
interpreter most): read the shares, not the absolute times; `bench/run.py` times without it.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This checkout's kvcanary_cli, whatever else is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse  # noqa: E402
import pstats  # noqa: E402
import re  # noqa: E402
from collections.abc import Callable  # noqa: E402

from dumps import CLEAN, SHAPES, TRUNCATED, BenchDump, default_cache, ensure_dumps  # noqa: E402
from procs import ROOT, run_child  # noqa: E402

#: `--standard`: the commands profiled before and after a performance change, per dump variant.
STANDARD: dict[str, list[list[str]]] = {
    CLEAN: [
        ["check"],
        ["check", "--kernel", "vectorized"],
        ["check", "--kernel", "none"],
        ["provenance", "--slot", "{slot_finding}"],
    ],
    TRUNCATED: [
        ["check"],
        ["check", "--kernel", "vectorized"],
        ["check", "--kernel", "none"],
        ["check", "--format", "json"],
        ["provenance", "--slot", "{slot_finding}"],
    ],
}


def short(where: tuple[str, int, str]) -> str:
    """`file:line(function)`, the file relative to the checkout or to site-packages."""
    path, line, name = where
    if path == "~":  # built-ins
        return name
    path = path.removeprefix(str(ROOT) + "/")
    path = re.sub(r"^.*/site-packages/", "", path)
    path = re.sub(r"^.*/lib/python3\.\d+/", "", path)
    return f"{path}:{line}({name})"


#: Frames every command passes through (start-up, typer) and the import machinery (its total
#: is in the header): left out of the list of everything by cumulative time.
_WRAPPERS = re.compile(
    r"^(<string>|<frozen runpy>|<frozen importlib|typer/|kvcanary_cli/__main__\.py"
    r"|<built-in method builtins\.(exec|__import__)>)"
)


def top(stats: pstats.Stats, key: int, count: int, keep: Callable[[str], bool]) -> list[str]:
    """The `count` biggest entries by `key` (2: own time, 3: cumulative) whose name passes
    `keep`, as aligned lines."""
    table = stats.stats  # type: ignore[attr-defined]
    rows = sorted(table.items(), key=lambda item: item[1][key], reverse=True)
    lines = [f"{'calls':>10} {'own s':>8} {'cum s':>8}  function"]
    for where, (_, calls, own, cumulative, _) in rows:
        name = short(where)
        if keep(name):
            lines.append(f"{calls:10d} {own:8.3f} {cumulative:8.3f}  {name}")
        if len(lines) > count:
            break
    return lines


def summarize(target: Path, count: int) -> list[str]:
    """A profile's import time and its top entries: kvcanary's own functions and everything
    by cumulative time, everything by own time."""
    stats = pstats.Stats(str(target))
    table = stats.stats  # type: ignore[attr-defined]
    imports = max((v[3] for k, v in table.items() if k[2] == "_find_and_load"), default=0.0)
    return [
        f"   {stats.total_tt:.1f}s profiled, of which imports {imports:.1f}s",  # type: ignore[attr-defined]
        "-- kvcanary_cli by cumulative time",
        *top(stats, 3, count, lambda n: n.startswith("kvcanary_cli/")),
        "-- everything by cumulative time (start-up and CLI wrappers left out)",
        *top(stats, 3, count, lambda n: not _WRAPPERS.search(n)),
        "-- everything by own time",
        *top(stats, 2, count, lambda n: True),
    ]


def profile(dump: BenchDump, command: list[str], out: Path, count: int) -> str:
    """Run one command under cProfile; its summary as text."""
    args = [a.format(**dump.info["queries"]) for a in command]
    args.insert(1, str(dump.path))
    slug = re.sub(r"[^A-Za-z0-9]+", "-", " ".join([a for a in command if "{" not in a]))
    target = out / f"profile-{dump.info['size']}-{dump.variant}-{slug.strip('-')}.prof"
    done = run_child(
        [sys.executable, "-m", "cProfile", "-o", str(target), "-m", "kvcanary_cli", *args]
    )
    head = (
        f"== kvcanary {' '.join(command)}  [{dump.info['size']} {dump.variant}]  exit "
        f"{done.exit_code}, {done.seconds:.1f}s wall under cProfile, peak RSS "
        f"{done.peak_rss_bytes / 2**20:.0f} MiB, stdout {done.stdout_bytes / 2**20:.1f} MiB\n"
        f"   {target}"
    )
    return "\n".join([head, *summarize(target, count)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(__doc__ or "").split("\n\n", 1)[1],
    )
    parser.add_argument("--size", default="medium", choices=list(SHAPES))
    parser.add_argument("--truncated-lut", action="store_true")
    parser.add_argument("--ordered", action="store_true", help="slots handed out in page order")
    parser.add_argument("--standard", action="store_true", help="the standard set, both dumps")
    parser.add_argument("--top", type=int, default=25, help="entries per list")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--cache", type=Path, default=default_cache())
    parser.add_argument(
        "--summarize", type=Path, nargs="+", metavar="PROF", help="only summarize .prof files"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="kvcanary COMMAND [ARGS]")
    args = parser.parse_args(argv)
    if args.summarize:
        for target in args.summarize:
            print("\n".join([f"== {target}", *summarize(target, args.top)]), end="\n\n")
        return
    if args.standard == bool(args.command):
        parser.error("give a kvcanary command, or --standard")
    variants = [CLEAN, TRUNCATED] if args.standard else [TRUNCATED if args.truncated_lut else CLEAN]
    dumps = ensure_dumps(args.size, variants, args.cache, ordered=args.ordered)
    args.out.mkdir(parents=True, exist_ok=True)
    for variant in variants:
        commands = STANDARD[variant] if args.standard else [args.command]
        for command in commands:
            print(profile(dumps[variant], command, args.out, args.top), end="\n\n", flush=True)


if __name__ == "__main__":
    main()
