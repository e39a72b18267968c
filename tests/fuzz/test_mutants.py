"""Mutation tests: every mutant of the corpus, through every command, keeps the contract.

The corpus (`tests/fuzz/mutants.py`, about 3,500 mutants of six small dumps: four `synth`
scenarios and two `shrink` outputs, one of them mutated in its values only) runs in guarded
worker processes (`tests/fuzz/runner.py`): an address-space cap 2 GiB above the worker's own,
and a minute per mutant. Those are guards, not speed checks: a clean run of a mutant takes
milliseconds, and a run that does work by a number the file claims breaks them loudly, naming
the mutant. The suite runs three mutants in five (over 2,000, drawn by their ids), the deep
lane the others (tests/lanes.py). A smaller sample runs through
real `kvcanary` processes, where a signal (SIGBUS, SIGSEGV) would show as such. Everything
that starts a process is marked `slow` (still part of `python -m pytest`; the fast lane
`-m "not slow"` leaves it out).

Mutant classes that still break the contract in the analysis layer are listed in
`ANALYSIS_FIXES`: they run apart, each marked xfail(strict) -- delete a class's entry once
its fix is merged, and it joins the corpus (a crowded dump keeps its own test, unmarked).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from tests.fuzz.mutants import FAMILIES, Seed, corpus
from tests.fuzz.runner import (
    BAD_INPUT_KINDS,
    COMMANDS,
    CROWDED_COMMANDS,
    MEMORY_HEADROOM,
    MUTANT_TIMEOUT,
    address_space,
    command_for,
    judge,
    planned,
    read_results,
)
from tests.fuzz.seeds import load_seeds, write_seeds
from tests.lanes import DEEP

ROOT = Path(__file__).resolve().parents[2]
_REASON = "issue 11: fixed in analysis"

#: Mutant classes the analysis layer still fails, each with how (empty: every class passes; an
#: entry runs apart as a strict xfail until its fix lands).
ANALYSIS_FIXES: dict[str, str] = {}

#: Guards of a crowded mutant (a file under 200 KB, whose clean run takes well under a second
#: and 100 MB): seconds, and address space above the worker's own.
CROWDED_TIMEOUT = 10
CROWDED_HEADROOM = 512 << 20
#: Crowded dumps that are clean (exit 0; the others have findings, exit 1): a shrunk
#: production-wide pool checks like the clean original it stands for.
CLEAN_CROWDED = {"crowded.wide-shrunk-pool": 0}
#: Mutants per CI run that the corpus must reach (issue 11).
MINIMUM_MUTANTS = 2000


@dataclass(frozen=True)
class WorkerRun:
    """One guarded worker's results and how it ended."""

    family: str
    results: list[dict[str, Any]]
    pending: str | None
    timed_out: bool
    returncode: int
    stderr: str

    def breaches(self) -> list[str]:
        """One line per mutant that broke the contract, and one if the worker did."""
        lines = [
            f"{r['id']} [{r['kind']}] {r['detail']}: {' '.join(r['command'])} -> exit "
            f"{r['exit']} in {r['seconds']} s: {'; '.join(r['problems'])}: {r['stderr'][:200]!r}"
            for r in self.results
            if r["problems"]
        ]
        if self.returncode != 0:
            if self.timed_out:
                how = "broke the time guard"
            elif self.returncode < 0:
                how = f"was killed by {signal.Signals(-self.returncode).name}"
            else:
                how = f"ended with exit {self.returncode}: {self.stderr[-800:]}"
            lines.append(f"the worker {how} while running {self.pending}")
        return lines


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # CPU only (the Triton interpreter), as in CI: the guards cap the address space, which a
    # CUDA context would reserve by the gigabyte.
    env.update(OMP_NUM_THREADS="1", NO_COLOR="1", PYTHONFAULTHANDLER="", CUDA_VISIBLE_DEVICES="")
    env.pop("KVCANARY_DEBUG", None)
    return env


def run_worker(
    seeds_dir: Path,
    family: str,
    out: Path,
    *,
    kinds: Sequence[str] = (),
    exclude: Sequence[str] = (),
    timeout: float = MUTANT_TIMEOUT,
    headroom: int | None = None,
    part: str = "all",
) -> WorkerRun:
    """Run one family's mutants (of `part`: runner.PARTS) in a guarded worker process (see
    tests/fuzz/runner.py)."""
    command = [
        sys.executable,
        "-m",
        "tests.fuzz.runner",
        f"--family={family}",
        f"--seeds={seeds_dir}",
        f"--out={out}",
        f"--timeout={timeout}",
        f"--exclude={','.join(exclude)}",
        f"--part={part}",
    ]
    if kinds:
        command.append(f"--kinds={','.join(kinds)}")
    if headroom is not None:
        command.append(f"--headroom={headroom}")
    done = subprocess.run(
        command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900, check=False
    )
    results, pending, timed_out = read_results(out) if out.exists() else ([], None, False)
    return WorkerRun(family, results, pending, timed_out, done.returncode, done.stderr)


@pytest.fixture(scope="module")
def seeds_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("seeds")
    write_seeds(directory)
    return directory


@pytest.fixture(scope="module")
def seeds(seeds_dir: Path) -> list[Seed]:
    return load_seeds(seeds_dir)


def _corpus(seeds_dir: Path, folder: Path, part: str) -> dict[str, WorkerRun]:
    """`part` of every family of the corpus, known analysis failures left out; two workers
    at a time."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = pool.map(
            lambda family: run_worker(
                seeds_dir,
                family,
                folder / f"{family}.jsonl",
                exclude=list(ANALYSIS_FIXES),
                part=part,
            ),
            # the longest first, so that the two workers finish together (CPU seconds, one
            # process each: data 13, header 7, length 6.5, truncation 1.2)
            ("data", "header", "length", "truncation"),
        )
        return {run.family: run for run in runs}


@pytest.fixture(scope="module")
def corpus_runs(seeds_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, WorkerRun]:
    """The suite's part of the corpus (three mutants in five)."""
    return _corpus(seeds_dir, tmp_path_factory.mktemp("corpus"), "suite")


@pytest.fixture(scope="module")
def deep_corpus_runs(
    seeds_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, WorkerRun]:
    """The deep lane's part of the corpus: the other mutants."""
    return _corpus(seeds_dir, tmp_path_factory.mktemp("deep-corpus"), "deep")


# --- the corpus ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_every_mutant_keeps_the_contract(family: str, corpus_runs: dict[str, WorkerRun]) -> None:
    _kept(corpus_runs[family])


@pytest.mark.parametrize("family", [pytest.param(family, marks=DEEP) for family in FAMILIES])
def test_every_mutant_of_the_deep_lane_keeps_the_contract(
    family: str, deep_corpus_runs: dict[str, WorkerRun]
) -> None:
    _kept(deep_corpus_runs[family])


def _kept(run: WorkerRun) -> None:
    breaches = run.breaches()
    assert not breaches, f"{len(breaches)} breaches:\n" + "\n".join(breaches[:40])
    assert run.results, "the worker ran no mutant"


@pytest.mark.slow
def test_the_corpus_is_big_and_covers_every_command(corpus_runs: dict[str, WorkerRun]) -> None:
    total = sum(len(run.results) for run in corpus_runs.values())
    assert total >= MINIMUM_MUTANTS, total
    names = {" ".join(c[0:1] + c[2:]) for c in COMMANDS}
    for family, run in corpus_runs.items():
        used = Counter(" ".join(r["command"][1:2] + r["command"][3:]) for r in run.results)
        seen = {name for name in names if any(_same_command(name, u) for u in used)}
        assert seen == names, (family, sorted(names - seen))
        exits = Counter(r["exit"] for r in run.results)
        if family in ("data", "length"):  # values: the analysis runs (findings, or none);
            # a shrunk dump's structure (its sparse parts) may be bad input
            exits = Counter(r["exit"] for r in run.results if r["kind"] not in BAD_INPUT_KINDS)
            assert exits[0] + exits[1] > 9 * exits[2], (family, exits)
        else:  # the file: mostly refused, some still readable
            assert exits[2] > exits[0] + exits[1], (family, exits)


def _same_command(template: str, used: str) -> bool:
    """`provenance --slot {slot}` matches `provenance --slot 41` (and so on)."""
    a, b = template.split(), used.split()
    return len(a) == len(b) and all(x == y or x.startswith("{") for x, y in zip(a, b, strict=True))


@pytest.mark.slow
def test_the_corpus_is_deterministic(seeds: list[Seed]) -> None:
    # Workers regenerate the corpus: ids must name the same mutants in every process.
    for family in FAMILIES:
        first = [(m.kind, m.detail, m.blob) for m in itertools.islice(corpus(seeds, family), 200)]
        again = [(m.kind, m.detail, m.blob) for m in itertools.islice(corpus(seeds, family), 200)]
        assert first == again
    ids = [mutant_id for family in FAMILIES for mutant_id, *_ in planned(seeds, family)]
    assert len(ids) == len(set(ids))


def test_known_classes_exist(seeds: list[Seed]) -> None:
    # An entry of ANALYSIS_FIXES that matches no mutant would silently test nothing.
    kinds = {m.kind for family in (*FAMILIES, "crowded") for m in corpus(seeds, family)}
    assert set(ANALYSIS_FIXES) <= kinds, set(ANALYSIS_FIXES) - kinds
    for family in FAMILIES:  # each family several classes of damage
        assert len({k for k in kinds if k.startswith(family + ".")}) >= 4, family
    assert set(CROWDED_COMMANDS) == {k for k in kinds if k.startswith("crowded.")}


# --- classes still fixed elsewhere, and crowded dumps -------------------------------------


@pytest.fixture(scope="module")
def apart_runs(seeds_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, WorkerRun]:
    """Each class of `ANALYSIS_FIXES` in its own worker, and the crowded dumps together in
    one (a worker's start, 0.9 s of CPU, was most of each crowded dump's run): each mutant
    under its own time guard, all under the worker's memory guard (a crowded run takes well
    under 100 MB of its 512). Where that worker did not end cleanly, every crowded dump runs
    again in a worker of its own, so that a dump that breaks a guard is named by its own run
    and stops no other."""
    folder = tmp_path_factory.mktemp("apart")

    def run(kinds: list[str], name: str) -> WorkerRun:
        crowded = kinds[0].startswith("crowded.")
        return run_worker(
            seeds_dir,
            kinds[0].split(".")[0],
            folder / f"{name}.jsonl",
            kinds=kinds,
            timeout=CROWDED_TIMEOUT if crowded else MUTANT_TIMEOUT,
            headroom=CROWDED_HEADROOM if crowded else None,
        )

    # those that load the Triton interpreter (0.2 GiB of address space) last
    crowded = sorted(CROWDED_COMMANDS, key=lambda kind: ("triton" in CROWDED_COMMANDS[kind], kind))
    together = run(crowded, "crowded")
    runs: dict[str, WorkerRun] = {}
    if together.returncode == 0:
        runs = {
            kind: replace(together, results=[r for r in together.results if r["kind"] == kind])
            for kind in crowded
        }
    apart = sorted(set(ANALYSIS_FIXES) | (set(crowded) - set(runs)))
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs.update(zip(apart, pool.map(lambda kind: run([kind], kind), apart), strict=True))
    return runs


def _kind_params(kinds: Sequence[str]) -> Iterator[Any]:
    for kind in kinds:
        marks = [pytest.mark.xfail(strict=True, reason=_REASON)] if kind in ANALYSIS_FIXES else []
        yield pytest.param(kind, marks=marks, id=kind)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind", list(_kind_params([k for k in ANALYSIS_FIXES if not k.startswith("crowded.")]))
)
def test_analysis_fix_class(kind: str, apart_runs: dict[str, WorkerRun]) -> None:
    """A class of `ANALYSIS_FIXES` on its own, under the corpus's guards."""
    run = apart_runs[kind]
    breaches = run.breaches()
    assert not breaches, f"{len(breaches)} breaches:\n" + "\n".join(breaches[:20])
    assert run.results


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(_kind_params(sorted(CROWDED_COMMANDS))))
def test_crowded_dump_stays_bounded(kind: str, apart_runs: dict[str, WorkerRun]) -> None:
    """Small valid files with many far-reaching findings, each through the command their
    findings make expensive, under guards for a small file (`CROWDED_TIMEOUT`,
    `CROWDED_HEADROOM`)."""
    run = apart_runs[kind]
    breaches = run.breaches()
    assert not breaches, "\n".join(breaches)
    assert [r["exit"] for r in run.results] == [CLEAN_CROWDED.get(kind, 1)]


#: int64 `req_to_token` (an accepted dtype) with slots past 2^31, in a pool that large (so
#: every slot is valid): the error findings `check` must report. Packed keys used to mix such
#: slots up: `row * 2^40 + slot` made two different slots one (a false duplicate-slot-in-row),
#: `slot << 32` overflowed and hid one slot at two positions (exit 0).
WIDE_SLOTS: dict[str, tuple[dict[tuple[int, int], int], set[str]]] = {
    "slots-2^40-apart-in-two-rows": ({(1, 0): 2**40 + 7, (2, 1): 7}, set()),
    "one-slot-at-two-positions": (
        {(1, 0): 2**33 + 5, (2, 2): 2**33 + 5},
        {"slot-shared-across-positions"},
    ),
}


@pytest.mark.parametrize("case", sorted(WIDE_SLOTS))
def test_int64_slots_keep_their_identity(case: str, tmp_path: Path) -> None:
    import numpy as np

    from kvcanary_cli import api
    from kvcanary_cli.catalog import Severity
    from kvcanary_cli.dump.writer import save_dump

    cells, expected = WIDE_SLOTS[case]
    table = np.zeros((3, 4), dtype=np.int64)
    table[1], table[2] = [1, 2, 3, 4], [11, 12, 13, 14]
    for (row, pos), slot in cells.items():
        table[row, pos] = slot
    path = save_dump(
        tmp_path / "wide.safetensors",
        req_to_token=table,
        req_pool_indices=np.array([1, 2], dtype=np.int64),
        prefix_lens=np.array([4, 4], dtype=np.int64),
        extend_seq_lens=np.array([0, 0], dtype=np.int64),
        metadata={"num_full_slots": 2**41},
    )
    report = api.check(path, kernel="vectorized").dumps[0]
    errors = {f.code.value for f in report.findings if f.severity is Severity.ERROR}
    assert errors == expected


# --- real processes -----------------------------------------------------------------------

#: (family, kind) of the mutants that also run through a real `kvcanary` process: the first
#: mutant of each, with its turn of the commands.
REAL_PROCESS_KINDS = (
    ("header", "header.length-field"),
    ("header", "header.many-tensors"),
    ("header", "header.empty-claimed-huge"),
    ("data", "data.req_to_token.shared"),
    ("length", "length.valid_lens.large"),
    ("truncation", "truncation.tensor-boundary"),
)


def _real_cases(seeds: list[Seed]) -> list[tuple[str, int, Seed, bytes, str]]:
    cases = []
    for family, kind in REAL_PROCESS_KINDS:
        for mutant_id, number, seed, mutant in planned(seeds, family):
            if mutant.kind == kind:
                cases.append((mutant_id, number, seed, mutant.blob, family))
                break
    return cases


@pytest.mark.slow
def test_real_processes_keep_the_contract(seeds: list[Seed], tmp_path: Path) -> None:
    import resource

    # The workers' memory guard, for whole processes: this process (torch imported) plus the
    # headroom bounds what a `kvcanary` process may reserve.
    ceiling = (address_space() or 0) + MEMORY_HEADROOM

    def limited() -> None:
        if ceiling > MEMORY_HEADROOM:
            resource.setrlimit(resource.RLIMIT_AS, (ceiling, ceiling))

    def run(case: tuple[str, int, Seed, bytes, str]) -> str | None:
        mutant_id, number, seed, blob, family = case
        dump = tmp_path / f"{mutant_id.replace('/', '-')}.safetensors"
        dump.write_bytes(blob)
        args = command_for(number, seed, dump, tmp_path / f"{dump.name}.out")
        done = subprocess.run(
            [sys.executable, "-m", "kvcanary_cli", *args],
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            preexec_fn=limited,
        )
        if done.returncode < 0:
            return f"{mutant_id}: killed by {signal.Signals(-done.returncode).name}"
        problems = judge(
            done.returncode,
            done.stdout,
            done.stderr,
            None,
            changed=dump.read_bytes() != blob,
            values_only=False,
            seed_exit=None,
        )
        return f"{mutant_id}: {args}: {problems}: {done.stderr[:300]!r}" if problems else None

    cases = _real_cases(seeds)
    assert len(cases) == len(REAL_PROCESS_KINDS)
    with ThreadPoolExecutor(max_workers=2) as pool:
        failures = [f for f in pool.map(run, cases) if f is not None]
    assert not failures, "\n".join(failures)


# --- the judge itself ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exit_code", "stderr", "exception", "changed", "values_only", "seed_exit", "expected"),
    [
        (0, "", None, False, False, None, []),
        (2, "error: x: bad\n", SystemExit(2), False, False, None, []),
        (3, "internal error: boom\n", SystemExit(3), False, False, None, ["exit 3"]),
        (2, "error: a\nerror: b\n", SystemExit(2), False, False, None, ["one 'error:' line"]),
        (2, "oops\n", SystemExit(2), False, False, None, ["one 'error:' line"]),
        (1, "", ValueError("x"), False, False, None, ["raised ValueError"]),
        (0, "Traceback (most recent call last):", None, False, False, None, ["traceback"]),
        (0, "", None, True, False, None, ["input file changed"]),
        (2, "error: x\n", SystemExit(2), False, True, 0, ["corrupt values"]),
        (2, "error: x\n", SystemExit(2), False, True, 2, []),
        (-7, "", None, False, False, None, ["exit -7"]),
    ],
)
def test_judge_catches_each_breach(
    exit_code: int,
    stderr: str,
    exception: BaseException | None,
    changed: bool,
    values_only: bool,
    seed_exit: int | None,
    expected: list[str],
) -> None:
    problems = judge(
        exit_code,
        "",
        stderr,
        exception,
        changed=changed,
        values_only=values_only,
        seed_exit=seed_exit,
    )
    assert len(problems) == len(expected), problems
    for problem, needle in zip(problems, expected, strict=True):
        assert needle in problem


@pytest.mark.slow
def test_the_time_guard_stops_a_worker(seeds_dir: Path, tmp_path: Path) -> None:
    # The guards must fire: no mutant runs in a tenth of a millisecond.
    run = run_worker(
        seeds_dir, "truncation", tmp_path / "run.jsonl", kinds=["truncation.header"], timeout=1e-4
    )
    assert run.timed_out and run.pending == "truncation/swa/0000", run
    assert run.breaches() == ["the worker broke the time guard while running truncation/swa/0000"]
    # it ended before cleaning up: its mutants' folder is under the test's, not the system's
    assert [p.name.startswith("kvc-fuzz-") for p in tmp_path.iterdir() if p.is_dir()] == [True]


@pytest.mark.slow
def test_the_memory_guard_stops_a_mutant(seeds_dir: Path, tmp_path: Path) -> None:
    # No address space to spare: the first command that allocates fails, and says so.
    run = run_worker(seeds_dir, "data", tmp_path / "run.jsonl", kinds=["data.lut"], headroom=0)
    assert run.breaches(), run


def test_results_file_records_every_mutant(tmp_path: Path) -> None:
    lines = [
        {"start": "a"},
        {"id": "a", "kind": "k", "problems": []},
        {"start": "b"},
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    results, pending, timed_out = read_results(path)
    assert [r["id"] for r in results] == ["a"] and pending == "b" and not timed_out
