"""`kvcanary soak --engine vllm`: histories of the seeded workload on vLLM's real
`KVCacheManager` (`soak.vllm_driver`), full and hybrid models in turn, audited each step,
until the step budget is spent or something is found (a planted --fault, kvcanary's finding,
vLLM's own assert). Importing this module costs the standard library: vLLM and torch load
when a soak runs."""

from __future__ import annotations

import os
import time
from pathlib import Path

from kvcanary_cli.errors import OptionError
from kvcanary_cli.results.pool_soak import EngineComplaint, PoolSoakHistory, PoolSoakReport

__all__ = ["HISTORY_STEPS", "run_vllm_soak"]

#: Steps per history.
HISTORY_STEPS = 400


def _default_tree() -> Path:
    """The release wheel in kvcanary's wheel cache (`pip download vllm==0.33.0 --no-deps`)."""
    from kvcanary_cli.soak.vllm_stack import SUPPORTED, VllmUnavailableError

    base = os.environ.get("KVCANARY_CACHE") or Path.home() / ".cache" / "kvcanary"
    found = sorted((Path(base) / "wheels").glob(f"vllm-{SUPPORTED}-*.whl"))
    if not found:
        raise VllmUnavailableError(
            "no vLLM tree given and no vLLM wheel in kvcanary's cache",
            hint=f"give --vllm-tree PATH (a wheel or a source tree), or `pip download "
            f"vllm=={SUPPORTED} --no-deps -d ~/.cache/kvcanary/wheels`",
        )
    return found[0]


def run_vllm_soak(
    tree: str | None, steps: int, seed: int, fault: str | None, *, timings: bool = False
) -> PoolSoakReport:
    """Soak vLLM's manager from `tree` (None: the cached release wheel) for `steps` audited
    steps; a one-line error (exit 2) for an unknown fault or a tree that cannot load."""
    from kvcanary_cli.soak.vllm_driver import FAULTS, MODELS, run_history
    from kvcanary_cli.soak.vllm_stack import load_vllm

    if fault is not None and fault not in FAULTS:
        raise OptionError(f"{fault!r} is not a vLLM fault: {', '.join(FAULTS)}", option="--fault")
    started = time.monotonic()
    modules = load_vllm(tree if tree is not None else _default_tree())
    histories: list[PoolSoakHistory] = []
    audited = 0
    while audited < steps:
        model = MODELS[len(histories) % len(MODELS)]
        h = run_history(
            modules,
            model,
            seed + len(histories),
            min(HISTORY_STEPS, steps - audited),
            fault=fault,
        )
        audited += h.audited
        crash = h.crash
        histories.append(
            PoolSoakHistory(
                model=model,
                seed=h.seed,
                steps=h.steps,
                audited=h.audited,
                preemptions=h.preemptions,
                prefix_hits=h.prefix_hits,
                aborts=h.aborts,
                fault_step=h.fault_step,
                fault_note=h.fault_note or None,
                finding_step=h.finding_step,
                findings=h.findings,
                engine_said=None
                if crash is None
                else EngineComplaint(
                    step=crash.step,
                    exception=crash.exception,
                    message=crash.message,
                    raised_in=crash.raised_in,
                ),
            )
        )
        if h.findings or crash is not None or h.audited == 0:
            break
    return PoolSoakReport(
        engine="vllm",
        engine_version=modules.tree.version,
        steps=steps,
        seed=seed,
        fault=fault,
        histories=tuple(histories),
        seconds=round(time.monotonic() - started, 3) if timings else None,
    )
