"""`kvcanary soak`: histories of a seeded random workload on SGLang's real stack, audited after
every step, until the step budget is spent or something is found.

Histories cycle through page sizes (1, 4, 16 unless one is given) and the tree cores the
install has. On the first finding: the dump of that step, the workload with its seed and step,
and a shrunk workload that still fails the same way (same top cause) go to `--out`; the report
says whether SGLang's own checks saw anything at that step. Importing this module costs only
the standard library: SGLang and torch load when a soak runs.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvcanary_cli.results.soak import SoakReport

__all__ = ["render_soak", "run_and_render", "soak"]

#: Steps per history: short histories find the planted faults early and shrink fast.
HISTORY_STEPS = 80


def _specs(page_size: int | None, cores: tuple[str, ...], core: str | None) -> list[Any]:
    from kvcanary_cli.soak.stack import StackSpec

    sizes = [page_size] if page_size else [1, 4, 16]
    chosen = [core] if core else list(cores)
    return [StackSpec.pressured(ps, c) for ps in sizes for c in chosen]


def soak(
    *,
    sglang_tree: str | None,
    steps: int,
    seed: int,
    page_size: int | None = None,
    core: str | None = None,
    fault: str | None = None,
    out: Path,
    progress: Callable[[int, int], None] | None = None,
) -> SoakReport:
    """Run histories until `steps` scheduler steps are spent or one fails (see module)."""
    from kvcanary_cli.errors import OptionError
    from kvcanary_cli.output import complain
    from kvcanary_cli.soak.faults import FAULTS
    from kvcanary_cli.soak.run import run_history, shrink_workload
    from kvcanary_cli.soak.stack import load_sglang
    from kvcanary_cli.soak.workload import Workload, random_workload

    if fault is not None and fault not in FAULTS:
        raise OptionError(f"unknown fault {fault!r} (one of {', '.join(FAULTS)})", option="--fault")
    modules = load_sglang(sglang_tree)
    if core is not None and core not in modules.cores:
        why = "".join(f"; {note}" for note in modules.notes)
        raise OptionError(
            f"tree core {core!r} is not in this SGLang (available: "
            f"{', '.join(modules.cores)}){why}",
            option="--core",
        )
    specs = _specs(page_size, modules.cores, core)
    report = SoakReport(sglang_version=modules.tree.version, sglang_root=str(modules.tree.root))
    started = time.monotonic()
    history = 0
    while report.steps < steps:
        spec = specs[history % len(specs)]
        history_seed = seed * 1_000_003 + history
        workload = random_workload(
            history_seed, steps=HISTORY_STEPS, requests=20, max_prompt=60, max_new=20
        )
        result = run_history(modules, spec, workload, fault=fault)
        history += 1
        report.histories += 1
        report.steps += result.steps
        report.audited_steps += result.audited
        if progress is not None:
            progress(min(report.steps, steps), steps)
        failure = result.failure
        if failure is None:
            continue
        report.found = True
        report.sglang_said = list(failure.sglang)
        report.sglang_missed = not failure.sglang
        report.failure = {
            "seed": history_seed,
            "page_size": spec.page_size,
            "core": spec.core,
            "step": failure.step,
            "when": failure.mode,
            "codes": failure.codes,
            "top_cause": failure.top_cause,
            "fault": fault,
        }
        out.mkdir(parents=True, exist_ok=True)
        cause = failure.top_cause

        def fails(candidate: Workload, spec: Any = spec, cause: Any = cause) -> bool:
            again = run_history(modules, spec, candidate, fault=fault, sglang_checks=False)
            return again.failure is not None and again.failure.top_cause == cause

        shrunk = shrink_workload(workload, fails)
        # the dumps: the original failing step, and the shrunk workload's (which still fails)
        for name, chosen in (("dump", workload), ("shrunk_dump", shrunk)):
            scratch = out / f".{name}"
            scratch.mkdir(exist_ok=True)
            again = run_history(modules, spec, chosen, fault=fault, folder=scratch)
            if again.failure is not None and again.failure.dump is not None:
                target = out / f"soak-{name.replace('_', '-')}.safetensors"
                shutil.move(str(again.failure.dump), target)
                report.files[name] = str(target)
            shutil.rmtree(scratch, ignore_errors=True)
        meta = {"spec": asdict(spec), **report.failure}
        for name, chosen in (("workload", workload), ("reproducer", shrunk)):
            path = out / f"soak-{name}.json"
            body = json.loads(chosen.to_json())
            path.write_text(json.dumps({**meta, "workload": body}, indent=1) + "\n")
            report.files[name] = str(path)
        report.shrunk_arrivals = (len(workload.arrivals), len(shrunk.arrivals))
        break
    report.seconds = round(time.monotonic() - started, 2)
    if core is None:  # a tree core the default would have soaked too, once the run went well
        for note in modules.notes:
            complain(f"note: {note}")
    return report


def render_soak(report: SoakReport, fmt: str) -> str:
    """The report as JSON, or as a few lines for a terminal."""
    if fmt == "json":
        return json.dumps(asdict(report), indent=1, sort_keys=True) + "\n"
    from kvcanary_cli.safe_text import printable

    lines = [
        f"kvcanary soak: SGLang {report.sglang_version} ({report.sglang_root}), "
        f"{report.histories} histories, {report.steps} steps, {report.audited_steps} audited, "
        f"{report.seconds} s"
    ]
    if not report.found or report.failure is None:
        lines.append("clean: no finding, SGLang's checks silent on every audited step")
        return "".join(printable(line) + "\n" for line in lines)
    f = report.failure
    lines.append(
        f"FOUND at step {f['step']} ({f['when']}) of seed {f['seed']}, page size "
        f"{f['page_size']}, {f['core']} core: {', '.join(f['codes'])} "
        f"(cause: {f['top_cause']})"
    )
    if report.sglang_missed:
        lines.append("SGLang's own checks were silent at that step: only kvcanary saw it")
    else:
        lines.append("SGLang's own checks at that step: " + " | ".join(report.sglang_said))
    if report.shrunk_arrivals:
        before, after = report.shrunk_arrivals
        lines.append(f"shrunk the workload from {before} to {after} requests")
    for name, path in report.files.items():
        lines.append(f"  {name}: {path}")
    return "".join(printable(line) + "\n" for line in lines)


def run_and_render(
    sglang_tree: str | None,
    steps: int,
    seed: int,
    page_size: int | None,
    core: str | None,
    fault: str | None,
    out: Path,
    fmt: str,
) -> tuple[str, int]:
    """The command: a soak with a progress bar on a terminal, its report rendered, and the
    exit code (0 clean, 1 found; bad input raises before, exit 2)."""
    from kvcanary_cli.render.console import progress

    with progress(f"soaking SGLang for {steps} steps", 2) as tick:
        report = soak(
            sglang_tree=sglang_tree,
            steps=steps,
            seed=seed,
            page_size=page_size,
            core=core,
            fault=fault,
            out=out,
            progress=tick,
        )
    return render_soak(report, "json" if fmt == "json" else "table"), 1 if report.found else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use `kvcanary soak`")
