"""`kvcanary soak`: histories of a seeded random workload on SGLang's real stack, audited after
every step, until the step budget is spent or something is found.

Histories cycle through page sizes (1, 4, 16 unless one is given) and the tree cores the
install has. On kvcanary's first finding, or SGLang's crash: the dump of that step (a crash:
of the last state audited before it), the workload with its seed and step, and a shrunk
workload that still fails the same way go to `--out`. What SGLang's own checks say never stops
a soak: the report counts every complaint per check over the whole run, keeps the first few,
and says who saw a fault first. Importing this module costs only the standard library: SGLang
and torch load when a soak runs.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kvcanary_cli.results.soak import (
    FirstSeen,
    SGLangCheck,
    SGLangCheckName,
    SGLangMessage,
    SoakFailure,
    SoakFile,
    SoakReport,
)

__all__ = ["run_soak", "soak"]

#: Steps per history: short histories find the planted faults early and shrink fast.
HISTORY_STEPS = 80


def _specs(
    page_size: int | None, cores: tuple[str, ...], core: str | None, layout: str = "swa"
) -> list[Any]:
    from kvcanary_cli.soak.stack import StackSpec

    sizes = [page_size] if page_size else [1, 4, 16]
    chosen = [core] if core else list(cores)
    return [StackSpec.pressured(ps, c, layout) for ps in sizes for c in chosen]


@dataclass
class _Heard:
    """One of SGLang's checks over the soak so far: how often, where, its first complaints."""

    steps: int = 0
    histories: int = 0
    first: list[SGLangMessage] = field(default_factory=list)


def _hear(heard: dict[SGLangCheckName, _Heard], result: Any, spec: Any, seed: int) -> None:
    """Add a history's complaints (`HistoryResult`) to the soak's, keeping the first few."""
    from kvcanary_cli.soak.run import KEEP

    for check, count in result.sglang_counts.items():
        tally = heard.setdefault(check, _Heard())
        tally.steps += count
        tally.histories += 1
        for one in result.sglang_first[check][: KEEP - len(tally.first)]:
            tally.first.append(
                SGLangMessage(
                    seed=seed,
                    page_size=spec.page_size,
                    core=spec.core,
                    step=one.step,
                    when=one.when,
                    message=one.said.message,
                )
            )


def _seen(result: Any, spec: Any, seed: int) -> FirstSeen:
    """Who saw something first in a history that failed or SGLang complained in."""
    failure = result.failure
    kvcanary = failure if failure is not None and failure.crash is None else None
    return FirstSeen(
        seed=seed,
        page_size=spec.page_size,
        core=spec.core,
        kvcanary_step=None if kvcanary is None else kvcanary.step,
        kvcanary_when=None if kvcanary is None else kvcanary.mode,
        sglang_step=result.sglang_step,
        sglang_when=result.sglang_when,
    )


def soak(
    *,
    sglang_tree: str | None,
    steps: int,
    seed: int,
    page_size: int | None = None,
    core: str | None = None,
    fault: str | None = None,
    out: Path,
    force: bool = False,
    timings: bool = False,
    progress: Callable[[int, int], None] | None = None,
    layout: str = "swa",
) -> SoakReport:
    """Run histories until `steps` scheduler steps are spent or one fails (see module).

    `--out` is checked first: a soak is not run to find that its finding cannot be kept."""
    from kvcanary_cli import __version__
    from kvcanary_cli.errors import OptionError
    from kvcanary_cli.output import complain
    from kvcanary_cli.soak.faults import FAULTS
    from kvcanary_cli.soak.outputs import check_out
    from kvcanary_cli.soak.run import run_history
    from kvcanary_cli.soak.stack import LAYOUTS, load_sglang
    from kvcanary_cli.soak.workload import random_workload

    if fault is not None and fault not in FAULTS:
        raise OptionError(f"unknown fault {fault!r} (one of {', '.join(FAULTS)})", option="fault")
    if layout not in LAYOUTS:
        raise OptionError(
            f"unknown layout {layout!r} (one of {', '.join(LAYOUTS)})", option="layout"
        )
    check_out(out, force=force)
    modules = load_sglang(sglang_tree)
    if core is not None and core not in modules.cores:
        why = "".join(f"; {note}" for note in modules.notes)
        raise OptionError(
            f"tree core {core!r} is not in this SGLang (available: "
            f"{', '.join(modules.cores)}){why}",
            option="core",
        )
    specs = _specs(page_size, modules.cores, core, layout)
    started = time.monotonic()
    histories = steps_run = audited = 0
    failed: tuple[Any, Any, Any] | None = None  # the spec, the workload, the audit
    heard: dict[SGLangCheckName, _Heard] = {}
    seen: FirstSeen | None = None  # the failing history's, else the first SGLang complained in
    while steps_run < steps and failed is None:
        spec = specs[histories % len(specs)]
        history_seed = seed * 1_000_003 + histories
        workload = random_workload(
            history_seed, steps=HISTORY_STEPS, requests=20, max_prompt=60, max_new=20
        )
        # the budget is steps run: the last history stops where it is spent
        result = run_history(modules, spec, workload, fault=fault, max_steps=steps - steps_run)
        histories += 1
        steps_run += result.steps
        audited += result.audited
        if progress is not None:
            progress(min(steps_run, steps), steps)
        _hear(heard, result, spec, workload.seed)
        if result.failure is not None:
            failed = (spec, workload, result.failure)
        if result.failure is not None or (seen is None and result.sglang_step is not None):
            seen = _seen(result, spec, workload.seed)
    report = SoakReport(
        kvcanary_version=__version__,
        sglang_version=modules.tree.version,
        sglang_root=str(modules.tree.root),
        seed=seed,
        budget=steps,
        histories=histories,
        steps=steps_run,
        audited_steps=audited,
        sglang_checks=tuple(
            SGLangCheck(check=check, steps=t.steps, histories=t.histories, first=tuple(t.first))
            for check, t in heard.items()
        ),
        seen=seen,
    )
    if failed is not None:
        report = _keep_finding(report, modules, *failed, fault, out, force)
    if timings:
        report = replace(report, seconds=round(time.monotonic() - started, 2))
    if core is None:  # a tree core the default would have soaked too, once the run went well
        for note in modules.notes:
            complain(f"note: {note}")
    return report


def _keep_finding(
    report: SoakReport,
    modules: Any,
    spec: Any,
    workload: Any,
    failure: Any,
    fault: str | None,
    out: Path,
    force: bool,
) -> SoakReport:
    """Shrink the failing workload, record the dumps of both (a crash: the last state audited
    before it), write the four files, and say so in the report."""
    from kvcanary_cli.soak.outputs import scratch, write_outputs
    from kvcanary_cli.soak.run import run_history, shrink_workload

    found = SoakFailure(
        seed=workload.seed,
        page_size=spec.page_size,
        core=spec.core,
        step=failure.step,
        when=failure.mode,
        codes=tuple(failure.codes),
        top_cause=failure.top_cause,
        fault=fault,
        crash=failure.crash,
    )
    key = failure.key

    def fails(candidate: Any) -> bool:
        again = run_history(modules, spec, candidate, fault=fault, sglang_checks=False)
        return again.failure is not None and again.failure.key == key

    shrunk = shrink_workload(workload, fails)
    meta = {"spec": asdict(spec), **asdict(found)}
    contents: dict[SoakFile, Path | bytes] = {}
    dumps: dict[SoakFile, Any] = {"dump": workload, "shrunk_dump": shrunk}
    workloads: dict[SoakFile, Any] = {"workload": workload, "reproducer": shrunk}
    with scratch() as folder:
        # the dumps: the original failing step, and the shrunk workload's (which still fails)
        for name, chosen in dumps.items():
            (folder / name).mkdir()
            again = run_history(modules, spec, chosen, fault=fault, folder=folder / name)
            if again.failure is not None and again.failure.dump is not None:
                contents[name] = again.failure.dump
        for name, chosen in workloads.items():
            body = json.loads(chosen.to_json())
            contents[name] = (json.dumps({**meta, "workload": body}, indent=1) + "\n").encode()
        files = write_outputs(out, contents, force=force)
    return replace(
        report,
        failure=found,
        files=files,
        shrunk_arrivals=(len(workload.arrivals), len(shrunk.arrivals)),
    )


def run_soak(
    sglang_tree: str | None,
    steps: int,
    seed: int,
    page_size: int | None,
    core: str | None,
    fault: str | None,
    out: Path,
    *,
    force: bool = False,
    timings: bool = False,
    layout: str = "swa",
) -> SoakReport:
    """The command: a soak with a progress bar on a terminal (bad input raises before it
    runs, exit 2). Whatever SGLang prints on standard output goes to standard error:
    standard output carries the report."""
    from kvcanary_cli.dump.streams import standard_output_on_standard_error
    from kvcanary_cli.render.console import progress

    with (
        standard_output_on_standard_error(),
        progress(f"soaking SGLang for {steps} steps", 2) as tick,
    ):
        return soak(
            sglang_tree=sglang_tree,
            steps=steps,
            seed=seed,
            page_size=page_size,
            core=core,
            fault=fault,
            out=out,
            force=force,
            timings=timings,
            progress=tick,
            layout=layout,
        )


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use `kvcanary soak`")
