"""Run mutants through the command line and judge every run by the bad-input contract.

`python -m tests.fuzz.runner --family F --seeds DIR --out RESULTS.jsonl` is the guarded worker
the tests start: once kvcanary is imported it caps its address space (RLIMIT_AS,
`MEMORY_HEADROOM` above what it holds) and each mutant's wall time, then runs the family's
mutants in-process (typer's CliRunner, the same `app` as `kvcanary`), one command each, and
writes one JSON line per mutant. A mutant that breaks the time guard ends the worker; the
`start` line written before it names the culprit. (Memory beyond the cap is a MemoryError:
exit 3, a breach like any other.)

The contract, for every mutant and command: exit 0, 1 or 2 (never 3, never a signal); on
exit 2 exactly one `error:` line on stderr; no traceback anywhere; the input file unchanged.
For mutants that only change values (families `data` and `length`) exit 2 is itself a
breach, unless the same command exits 2 on the unmutated seed too: corrupt values are
findings, not bad input.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import signal
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from tests.fuzz.mutants import Mutant, Seed, corpus

__all__ = [
    "COMMANDS",
    "BAD_INPUT_KINDS",
    "CROWDED_COMMANDS",
    "MEMORY_HEADROOM",
    "MUTANT_TIMEOUT",
    "Outcome",
    "address_space",
    "command_for",
    "judge",
    "planned",
    "run_worker",
]

#: Every command and format, in the order mutants take them (triton: 2 in 20).
COMMANDS: tuple[tuple[str, ...], ...] = (
    ("check", "{dump}", "--kernel", "vectorized"),
    ("check", "{dump}", "--kernel", "none", "--format", "json"),
    ("provenance", "{dump}", "--slot", "{slot}"),
    ("plan", "{dump}"),
    ("inspect", "{dump}"),
    ("check", "{dump}", "--kernel", "triton"),
    ("provenance", "{dump}", "--row", "{row}"),
    ("violations", "{dump}", "--replay"),
    ("check", "{dump}", "--kernel", "vectorized", "--format", "markdown"),
    ("plan", "{dump}", "--group", "swa", "--backend", "triton"),
    ("check", "{dump}", "--kernel", "none", "--quiet", "-o", "{out}", "--force"),
    ("provenance", "{dump}", "--slot", "{slot}", "--space", "swa", "--format", "json"),
    ("plan", "{dump}", "--backend", "reference", "--strict"),
    ("inspect", "{dump}", "--format", "json"),
    ("violations", "{dump}", "--format", "markdown"),
    ("provenance", "{dump}", "--row", "{row}", "--positions", "0:8", "--format", "markdown"),
    ("plan", "{dump}", "--out", "{out}", "--force"),
    ("inspect", "{dump}", "--format", "markdown"),
    ("plan", "{dump}", "--group", "swa", "--backend", "reference", "--format", "json"),
    ("check", "{dump}", "--kernel", "vectorized", "--group", "swa", "--format", "json"),
    ("shrink", "{dump}", "--out", "{out}", "--force"),
)

#: value mutants that are bad input by the format's rules (docs/dump-format.md): exit 2 is
#: right for them. A LUT with a window no SGLang could use leaves the swa group unplannable; a
#: shrunk dump's sparse shapes, runs and original dtypes are its structure; real-KV metadata
#: upstream refuses (docs/canary.md §3) is bad input.
BAD_INPUT_KINDS = frozenset(
    {
        "data.scalar.window-unplannable",
        "data.sparse.shape",
        "data.sparse.runs",
        "data.sparse.dtypes",
        "data.real-kv.metadata",
    }
)

#: the command each `crowded` mutant runs: the one its findings make expensive.
CROWDED_COMMANDS: dict[str, tuple[str, ...]] = {
    "crowded.shared-slots": ("check", "{dump}", "--kernel", "none", "--format", "json"),
    "crowded.duplicate-row": ("check", "{dump}", "--kernel", "none", "--format", "json"),
    "crowded.ring": ("check", "{dump}", "--kernel", "none", "--format", "json"),
    "crowded.real-kv-one-slot": ("violations", "{dump}", "--replay", "--format", "json"),
    "crowded.long-log-lines": ("violations", "{dump}", "--format", "json"),
    "crowded.cut-violation-lines": ("violations", "{dump}", "--format", "markdown"),
    "crowded.stale-rows": ("check", "{dump}", "--kernel", "none", "--format", "markdown"),
    "crowded.wide-shrunk-pool": ("check", "{dump}", "--kernel", "triton"),
}

#: address space a worker may add to what it holds once kvcanary is imported (the Triton
#: interpreter adds 0.2 GiB): far more than any mutant of a small
#: seed needs, far less than a run that allocates by a claimed size.
MEMORY_HEADROOM = 2 << 30
#: seconds one mutant may take in a worker (a clean run takes well under one).
MUTANT_TIMEOUT = 60


@dataclass
class Outcome:
    """One mutant's run: what it was, what ran, how it ended, and what broke the contract."""

    id: str
    kind: str
    detail: str
    command: list[str]
    exit: int
    seconds: float
    stderr: str
    problems: list[str] = field(default_factory=list)


def command_for(number: int, seed: Seed, dump: Path, out: Path) -> list[str]:
    """The command mutant `number` runs: commands in turn, slots and rows from the seed."""
    commands = COMMANDS
    if "full_to_swa_index_mapping" not in seed.tensors:  # swa needs a LUT: no wasted runs
        commands = tuple(c for c in COMMANDS if "swa" not in c)
    template = commands[number % len(commands)]
    cells = seed.live_cells()
    table = seed.table()
    slot = int(table[cells[number % len(cells)]]) if cells else 1
    rows = sorted({row for row, _ in cells}) or [1]
    values = {
        "dump": str(dump),
        "out": str(out),
        "slot": str(slot),
        "row": str(rows[number % len(rows)]),
    }
    return [part.format(**values) for part in template]


def judge(
    exit_code: int,
    stdout: str,
    stderr: str,
    exception: BaseException | None,
    *,
    changed: bool,
    values_only: bool,
    seed_exit: int | None,
) -> list[str]:
    """The contract breaches of one run (empty: it held)."""
    problems = []
    if exit_code not in (0, 1, 2):
        problems.append(f"exit {exit_code}")
    if exception is not None and not isinstance(exception, SystemExit):
        problems.append(f"raised {type(exception).__name__}: {str(exception)[:200]}")
    if "Traceback" in stdout or "Traceback" in stderr:
        problems.append("a traceback in the output")
    if exit_code == 2:
        lines = stderr.splitlines()
        if len(lines) != 1 or stderr != lines[0] + "\n" or not lines[0].startswith("error: "):
            problems.append(f"exit 2 without exactly one 'error:' line ({len(lines)} lines)")
        if values_only and seed_exit != 2:
            problems.append("exit 2 on corrupt values (they are findings)")
    if changed:
        problems.append("the input file changed")
    return problems


def address_space() -> int | None:
    """This process's address space in bytes (Linux), or None where it cannot be read."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _guard(headroom: int, timeout: float, log: TextIO) -> None:
    """Cap the address space at `headroom` above today's; a mutant still running after
    `timeout` seconds ends the worker."""
    now = address_space()
    if now is not None:
        resource.setrlimit(resource.RLIMIT_AS, (now + headroom, now + headroom))

    def expired(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        log.write(json.dumps({"timeout": timeout}) + "\n")
        log.flush()
        os._exit(98)

    signal.signal(signal.SIGALRM, expired)


def run_worker(
    seeds_dir: Path,
    family: str,
    out: TextIO,
    *,
    kinds: set[str] | None = None,
    exclude: set[str] | None = None,
    headroom: int = MEMORY_HEADROOM,
    timeout: float = MUTANT_TIMEOUT,
    command: Sequence[str] | None = None,
    work_root: Path | None = None,
    part: str = "all",
) -> None:
    """Run `family`'s mutants (only `kinds`, none of `exclude`, those of `part`: `in_part`),
    one JSON line each to `out`; each runs its turn of `COMMANDS`, or `command` (a template)
    when given. The mutants are written in a folder under `work_root` (the results' folder: a
    worker the time guard ends leaves it to the caller's clean-up, not in the system's
    temporary folder)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("NO_COLOR", "1")
    import typer.main
    import typer.testing
    from typer.testing import CliRunner

    from kvcanary_cli.cli import app
    from tests.fuzz.seeds import load_seeds

    # torch is not imported: no command here runs on it (tests/test_torch_extra.py), and its
    # import alone cost each worker 1.4 s of CPU.
    # typer rebuilds the click command on every invoke (most of a bad-input run's time): build
    # it once per worker process.
    build = functools.lru_cache(maxsize=None)(typer.main.get_command)
    setattr(typer.testing, "_get_command", build)  # noqa: B010 (private: the name invoke uses)
    _guard(headroom, timeout, out)
    seeds = load_seeds(seeds_dir)
    runner = CliRunner()
    value_family = family in ("data", "length")
    with tempfile.TemporaryDirectory(prefix="kvc-fuzz-", dir=work_root) as tmp:
        work = Path(tmp)
        seed_exits: dict[tuple[str, ...], int] = {}
        for seed in seeds:
            (work / f"seed-{seed.name}.safetensors").write_bytes(seed.blob)
        for mutant_id, number, seed, mutant in planned(seeds, family):
            if (kinds is not None and mutant.kind not in kinds) or (
                exclude is not None and mutant.kind in exclude
            ):
                continue
            if not in_part(mutant_id, part):
                continue
            dump = work / f"{mutant_id.replace('/', '-')}{mutant.suffix}"
            dump.write_bytes(mutant.blob)
            args = command_for(number, seed, dump, work / "out.safetensors")
            template = command if command is not None else CROWDED_COMMANDS.get(mutant.kind)
            if template is not None:
                args = [part.format(dump=dump, out=work / "out.safetensors") for part in template]
            values_only = value_family and mutant.kind not in BAD_INPUT_KINDS
            seed_exit = None
            if values_only and template is None:  # is exit 2 the mutant's, or the command's?
                clean = command_for(
                    number, seed, work / f"seed-{seed.name}.safetensors", work / "out.safetensors"
                )
                if tuple(clean) not in seed_exits:
                    seed_exits[tuple(clean)] = runner.invoke(app, clean).exit_code
                seed_exit = seed_exits[tuple(clean)]
            out.write(json.dumps({"start": mutant_id}) + "\n")
            out.flush()
            signal.setitimer(signal.ITIMER_REAL, timeout)
            began = time.perf_counter()
            result = runner.invoke(app, args)
            seconds = time.perf_counter() - began
            signal.setitimer(signal.ITIMER_REAL, 0)
            changed = dump.read_bytes() != mutant.blob
            dump.unlink()
            outcome = Outcome(
                id=mutant_id,
                kind=mutant.kind,
                detail=mutant.detail,
                command=["kvcanary", *[a.replace(str(work), "$TMP") for a in args]],
                exit=result.exit_code,
                seconds=round(seconds, 4),
                stderr=result.stderr[:400],
                problems=judge(
                    result.exit_code,
                    result.stdout,
                    result.stderr,
                    result.exception,
                    changed=changed,
                    values_only=values_only,
                    seed_exit=seed_exit,
                ),
            )
            out.write(json.dumps(asdict(outcome)) + "\n")
            out.flush()


#: The parts of the corpus a worker may run: the suite's (three mutants in five, drawn by
#: their ids, so every command and mutant kind keeps its turn) and the deep lane's (the rest).
PARTS = ("all", "suite", "deep")


def in_part(mutant_id: str, part: str) -> bool:
    """Whether the mutant `mutant_id` is one of `part`'s (`PARTS`)."""
    if part == "all":
        return True
    suite = zlib.crc32(mutant_id.encode()) % 5 < 3
    return suite if part == "suite" else not suite


def planned(seeds: Sequence[Seed], family: str) -> Iterator[tuple[str, int, Seed, Mutant]]:
    """(id, number, seed, mutant) for every mutant of `family`, in corpus order: the id names
    the family, the seed and the mutant's index among that seed's."""
    number = 0
    for seed in seeds[:1] if family == "crowded" else seeds:
        for index, mutant in enumerate(corpus([seed], family)):
            yield f"{family}/{seed.name}/{index:04d}", number, seed, mutant
            number += 1


def main(argv: Sequence[str] | None = None) -> None:
    """The worker's command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.runner")
    parser.add_argument("--family", required=True)
    parser.add_argument("--seeds", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kinds", default=None, help="comma list: only these kinds")
    parser.add_argument("--exclude", default="", help="comma list: not these kinds")
    parser.add_argument("--headroom", type=int, default=MEMORY_HEADROOM, help="bytes")
    parser.add_argument("--timeout", type=float, default=MUTANT_TIMEOUT, help="seconds")
    parser.add_argument("--command", default=None, help="one command for all: 'check {dump}'")
    parser.add_argument("--part", default="all", choices=PARTS, help="of the corpus")
    args = parser.parse_args(argv)
    kinds = set(args.kinds.split(",")) if args.kinds else None
    exclude = set(filter(None, args.exclude.split(",")))
    with args.out.open("w", encoding="utf-8") as out:
        run_worker(
            args.seeds,
            args.family,
            out,
            kinds=kinds,
            exclude=exclude,
            headroom=args.headroom,
            timeout=args.timeout,
            command=None if args.command is None else args.command.split(),
            work_root=args.out.resolve().parent,
            part=args.part,
        )


def read_results(path: Path) -> tuple[list[dict[str, Any]], str | None, bool]:
    """A worker's results, the mutant it was running when it stopped (if any), and whether
    it hit its per-mutant timeout."""
    results: list[dict[str, Any]] = []
    pending: str | None = None
    timed_out = False
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if "start" in record:
            pending = record["start"]
        elif "timeout" in record:
            timed_out = True
        else:
            results.append(record)
            pending = None
    return results, pending, timed_out


if __name__ == "__main__":
    main(sys.argv[1:])
