"""`kvcanary soak --engine vllm`: histories of the seeded workload on vLLM's real
`KVCacheManager` (`soak.vllm_driver`), the chosen models in turn (full and hybrid by default),
audited each step, until the step budget is spent or something is found (a planted --fault,
kvcanary's finding, vLLM's own assert, heard through the assert hook).

A finding leaves two files in `--out` (checked before a step runs), written as every soak
writes them (`soak.outputs`: all or none, never over a link, no overwrite without --force): the
failing step's dump and a reproducer (the history's model, seed, steps, fault and scheduling:
the workload is the seed's). `--replay` runs a reproducer again. Importing this module costs
the standard library: vLLM and torch load when a soak runs."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvcanary_cli.errors import OptionError, PathError
from kvcanary_cli.option_values import DRAFT_TOKENS
from kvcanary_cli.results.pool_soak import EngineComplaint, PoolSoakHistory, PoolSoakReport
from kvcanary_cli.results.soak import SoakFile, SoakReplay

__all__ = ["HISTORY_STEPS", "read_reproducer", "run_vllm_soak"]

#: Steps per history.
HISTORY_STEPS = 400


def _default_tree() -> Path:
    """The newest release wheel kvcanary reads in its wheel cache (`pip download
    vllm==0.34.0 --no-deps`, or 0.33.0)."""
    from kvcanary_cli.soak.vllm_stack import RELEASES, SUPPORTED, VllmUnavailableError

    base = os.environ.get("KVCANARY_CACHE") or Path.home() / ".cache" / "kvcanary"
    found = [
        wheel
        for release in reversed(RELEASES)
        for wheel in sorted((Path(base) / "wheels").glob(f"vllm-{release}-*.whl"))
    ]
    if not found:
        raise VllmUnavailableError(
            "no vLLM tree given and no vLLM wheel in kvcanary's cache",
            hint=f"give --vllm-tree PATH (a wheel or a source tree), or `pip download "
            f"vllm=={SUPPORTED} --no-deps -d ~/.cache/kvcanary/wheels`",
        )
    return found[0]


#: Unaudited steps a history runs on after kvcanary's finding, to hear vLLM's asserts.
AFTER_STEPS = 200
#: What a reproducer records and its type (the history is the seed's: nothing else to keep).
_REPRODUCER = {
    "engine": str,
    "model": str,
    "seed": int,
    "steps": int,
    "after_steps": int,
    "fault": (str, type(None)),
    "recorded": str,
}


def _history(h: Any) -> PoolSoakHistory:
    """A driver history (`vllm_driver.History`) as the record says it."""
    crash = h.crash
    return PoolSoakHistory(
        model=h.model,
        seed=h.seed,
        steps=h.steps,
        audited=h.audited,
        preemptions=h.preemptions,
        prefix_hits=h.prefix_hits,
        aborts=h.aborts,
        drafted=h.drafted,
        accepted=h.accepted,
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


def _key(h: Any) -> str | None:
    """What a history found, as a reproducer records it: kvcanary's top code, else vLLM's
    crash; None when it found nothing."""
    if h.findings:
        return str(h.findings[0].code)
    if h.crash is not None:
        return f"crash {h.crash.exception}"
    return None


@contextmanager
def _naming(tree: Any) -> Iterator[None]:
    """A manager kvcanary cannot read (a vLLM release laid out otherwise) is one error line
    naming the tree it came from, exit 2."""
    from kvcanary_cli.engines.vllm.capture import VllmLayoutError

    try:
        yield
    except VllmLayoutError as exc:
        exc.source = f"{tree.label} (vLLM {tree.version})"
        raise


def refuse_sglang_options(given: Mapping[str, object]) -> None:
    """One error line for SGLang's soak options given to a vLLM soak (flag -> value, None
    when not given)."""
    flags = [flag for flag, value in given.items() if value is not None]
    if flags:
        one = len(flags) == 1
        raise OptionError(
            f"{'an SGLang soak option' if one else 'SGLang soak options'}; --engine vllm soaks "
            "vLLM's models (--vllm-model)",
            option=", ".join(flags),
            hint=f"drop {'it' if one else 'them'}, or soak SGLang",
        )


def chosen_models(given: str | None) -> tuple[str, ...]:
    """The models named by `--vllm-model` (comma-separated, each once), or the default
    cycle; an unknown name is one error line."""
    from kvcanary_cli.soak.vllm_driver import DEFAULT_MODELS, MODELS

    if given is None:
        return DEFAULT_MODELS
    names = tuple(dict.fromkeys(n.strip() for n in given.split(",")))
    for name in names:
        if name not in MODELS:
            raise OptionError(
                f"{name[:40]!r} is not a vLLM model: {', '.join(MODELS)}", option="--vllm-model"
            )
    return names


def run_vllm_soak(
    tree: str | None,
    steps: int,
    seed: int,
    fault: str | None,
    *,
    models: str | None = None,
    out: Path,
    force: bool = False,
    timings: bool = False,
    replaying: Path | None = None,
    sglang_options: Mapping[str, object] | None = None,
    overlap: bool = False,
    speculative: int = 0,
) -> PoolSoakReport:
    """Soak vLLM's manager from `tree` (None: the cached release wheel) for `steps` audited
    steps, a finding's files to `out`; with `replaying`, that reproducer run again; with
    `overlap`, under vLLM's async scheduling; with `speculative`, under speculative decoding
    (that many draft tokens a decode step). A one-line error (exit 2) for an SGLang option,
    an unknown fault, an `out` it may not write, a tree that cannot load, `overlap` on a
    release whose manager counts no tokens in flight, or with `speculative` on one whose
    scheduler counts no stale share (`_refuse_synchronous`)."""
    from kvcanary_cli.soak.vllm_driver import FAULTS, run_history
    from kvcanary_cli.soak.vllm_stack import load_vllm

    refuse_sglang_options(sglang_options or {})
    if replaying is not None:
        if fault is not None or models is not None or overlap or speculative:
            raise OptionError(
                "takes the fault, the model and the scheduling from the reproducer: drop "
                "--fault, --vllm-model, --overlap and --speculative-tokens",
                option="--replay",
            )
        return _replay(replaying, tree, timings=timings)
    chosen = chosen_models(models)
    if fault is not None and fault not in FAULTS:
        raise OptionError(f"{fault!r} is not a vLLM fault: {', '.join(FAULTS)}", option="--fault")
    from kvcanary_cli.soak.outputs import check_out, scratch

    check_out(out, force=force)
    started = time.monotonic()
    modules = load_vllm(tree if tree is not None else _default_tree())
    _refuse_unbuildable(modules, chosen)
    if overlap:
        _refuse_synchronous(modules, drafting=bool(speculative))
    histories: list[PoolSoakHistory] = []
    audited = 0
    files: dict[SoakFile, str] = {}
    with scratch() as folder, _naming(modules.tree):
        while audited < steps:
            model = chosen[len(histories) % len(chosen)]
            length = min(HISTORY_STEPS, steps - audited)
            h = run_history(
                modules,
                model,
                seed + len(histories),
                length,
                fault=fault,
                after_steps=AFTER_STEPS,
                assert_dumps=folder / f"history-{len(histories)}",
                overlap=overlap,
                speculative=speculative,
            )
            audited += h.audited
            histories.append(_history(h))
            if h.findings or h.crash is not None:
                version = modules.tree.version
                scheduling = {"overlap": overlap, "speculative_tokens": speculative}
                files = _keep(h, length, version, fault, scheduling, folder, out, force)
                break
            if h.audited == 0:
                break
    return PoolSoakReport(
        engine="vllm",
        engine_version=modules.tree.version,
        steps=steps,
        seed=seed,
        fault=fault,
        histories=tuple(histories),
        seconds=round(time.monotonic() - started, 3) if timings else None,
        files=files,
        overlap=overlap,
        speculative_tokens=speculative,
    )


def _refuse_unbuildable(modules: Any, models: tuple[str, ...]) -> None:
    """One error line (exit 2) for a chosen model the loaded release has no manager for."""
    from kvcanary_cli.soak.vllm_driver import MODELS, model_available

    missing = [m for m in models if not model_available(modules, m)]
    if missing:
        raise OptionError(
            f"vLLM {modules.tree.version} cannot build {', '.join(missing)} "
            f"({'; '.join(MODELS[m] for m in missing)}): its KV-cache interface has no such "
            "group",
            option="--vllm-model",
            hint="choose another model, or a vLLM release that has it",
        )


def _refuse_synchronous(modules: Any, *, drafting: bool = False) -> None:
    """One error line (exit 2) for `--overlap` on a release that counts no tokens in flight
    (before 0.26.0): its manager frees on the tokens computed, async scheduling or not. With
    drafts, also on one that counts no stale share (0.26.0): its scheduler takes a preempted
    request's old rejections off its new count, which soak does not model."""
    from kvcanary_cli.soak.vllm_driver import counts_stale_share, counts_tokens_in_flight

    if not counts_tokens_in_flight(modules):
        raise OptionError(
            "models vLLM's async scheduling where its KV-cache manager frees on the tokens "
            "processed (num_in_flight_tokens, from 0.26.0 on); vLLM "
            f"{modules.tree.version}'s does not count them",
            option="--overlap",
            hint="drop --overlap: its manager reads the same state either way",
        )
    if drafting and not counts_stale_share(modules):
        raise OptionError(
            "models drafts under vLLM's async scheduling where a preempted request's steps in "
            "flight are counted stale (num_stale_output_tokens, from 0.27.0 on); vLLM "
            f"{modules.tree.version}'s scheduler does not count them",
            option="--overlap/--speculative-tokens",
            hint="drop one of them on this release",
        )


def _keep(
    h: Any,
    length: int,
    version: str,
    fault: str | None,
    scheduling: dict[str, Any],
    folder: Path,
    out: Path,
    force: bool,
) -> dict[SoakFile, str]:
    """The failing history's dump and reproducer written to `out`, all or none."""
    from kvcanary_cli.dump.atomic import write_safetensors

    contents: dict[SoakFile, Path | bytes] = {}
    if h.dump is not None:  # kvcanary's finding: the state it audited at that step
        tensors, meta = h.dump.contents()
        meta.update(
            {
                "step": str(h.finding_step),
                "model": h.model,
                "seed": str(h.seed),
                "kvcanary.trigger": "soak",
            }
        )
        contents["dump"] = write_safetensors(folder / "dump.safetensors", tensors, meta)
    elif h.assert_dumps:  # vLLM raised first: the pool as the assert hook read it then
        contents["dump"] = h.assert_dumps[0]
    reproducer = {
        "engine": "vllm",
        "engine_version": version,
        "model": h.model,
        "seed": h.seed,
        "steps": length,
        "after_steps": AFTER_STEPS,
        "fault": fault,
        **scheduling,
        "recorded": _key(h),
        "finding_step": h.finding_step,
        "crash_step": None if h.crash is None else h.crash.step,
    }
    contents["reproducer"] = (json.dumps(reproducer, indent=1) + "\n").encode()
    from kvcanary_cli.soak.outputs import write_outputs

    return write_outputs(out, contents, force=force)


def read_reproducer(path: Path) -> dict[str, Any]:
    """A vLLM soak's reproducer; anything else is one error line (exit 2)."""
    from kvcanary_cli.soak.outputs import RECORDED_CHARACTERS, read_reproducer_text
    from kvcanary_cli.soak.vllm_driver import FAULTS, MODELS

    hint = "give the soak-reproducer.json a vLLM soak wrote"
    try:
        data = json.loads(read_reproducer_text(path, hint=hint))
    except ValueError as exc:
        raise PathError(f"is not JSON ({exc})"[:300], path=str(path), hint=hint) from None
    if not isinstance(data, dict) or data.get("engine") != "vllm":
        raise PathError(
            "is not a vLLM soak reproducer (no engine vllm in it)", path=str(path), hint=hint
        )
    for key, kind in _REPRODUCER.items():
        value = data.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):  # type: ignore[arg-type]
            raise PathError(
                f"is not a vLLM soak reproducer ({key!r} missing or not a {kind})"[:300],
                path=str(path),
                hint=hint,
            )
    if not isinstance(data.setdefault("overlap", False), bool):  # absent before --overlap
        raise PathError(
            "is not a vLLM soak reproducer ('overlap' not true or false)", path=str(path), hint=hint
        )
    drafts = data.setdefault("speculative_tokens", 0)  # absent before --speculative-tokens
    if not isinstance(drafts, int) or isinstance(drafts, bool) or DRAFT_TOKENS.refusal(drafts):
        raise PathError(
            f"is not a vLLM soak reproducer ('speculative_tokens' not {DRAFT_TOKENS})",
            path=str(path),
            hint=hint,
        )
    if (
        data["model"] not in MODELS
        or (data["fault"] is not None and data["fault"] not in FAULTS)
        or not 0 < data["steps"] <= 10**7
        or not 0 <= data["after_steps"] <= 10**7
        or len(data["recorded"]) > RECORDED_CHARACTERS
        or len(str(data.get("engine_version"))) > RECORDED_CHARACTERS
    ):
        raise PathError(
            "is not a vLLM soak reproducer (a value out of range)", path=str(path), hint=hint
        )
    return data


def _replay(reproducer: Path, tree: str | None, *, timings: bool) -> PoolSoakReport:
    """The reproducer's history run again, audited as the soak audited it; nothing written."""
    from kvcanary_cli.soak.vllm_driver import run_history
    from kvcanary_cli.soak.vllm_stack import load_vllm

    data = read_reproducer(reproducer)
    started = time.monotonic()
    modules = load_vllm(tree if tree is not None else _default_tree())
    if data["overlap"]:
        _refuse_synchronous(modules, drafting=bool(data["speculative_tokens"]))
    with _naming(modules.tree):
        h = run_history(
            modules,
            data["model"],
            data["seed"],
            data["steps"],
            fault=data["fault"],
            after_steps=data["after_steps"],
            overlap=data["overlap"],
            speculative=data["speculative_tokens"],
        )
    return PoolSoakReport(
        engine="vllm",
        engine_version=modules.tree.version,
        steps=data["steps"],
        seed=data["seed"],
        fault=data["fault"],
        histories=(_history(h),),
        seconds=round(time.monotonic() - started, 3) if timings else None,
        replay=SoakReplay(
            reproducer=str(reproducer),
            recorded=data["recorded"],
            reproduced=_key(h) == data["recorded"],
            recorded_on=data.get("engine_version")
            if isinstance(data.get("engine_version"), str)
            else None,
        ),
        overlap=data["overlap"],
        speculative_tokens=data["speculative_tokens"],
    )
