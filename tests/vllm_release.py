"""The vLLM paths kvcanary drives, on one release, in a process of its own (one vLLM per
process): `python -m tests.vllm_release WHEEL OUT` prints one JSON line per case.

- `clean`: a history of each model the release can build (`model_available`), read after
  every step as soak reads it; the prefix-cache map as kvcanary lists it is checked against
  vLLM's own `contain` (before 0.24.0: `get_one_block` and the block's own key; before 0.11.0
  the map's own dict under the block's own key) both ways (every listed entry is one vLLM
  has, every hashed block is listed), with the most keys several blocks carry at once (the
  map's other shape); then the same seed through `run_history` with the assert hook: what
  kvcanary found, what vLLM raised.
- `fault`: each planted fault in the full model: the step planted, the step found, the code;
  and two of them (a double free, a leak) in each hybrid model the release builds beside the
  sliding window's (Mamba, chunked local attention).
- `hook`: vLLM's own assert after a double free, heard by the hook: the dump it wrote, what
  `check` finds in it, and whether the history ended as it does without the hook.
- `cli`: `kvcanary soak --engine vllm` clean (exit 0), with a fault (exit 1, dump and
  reproducer in OUT), and `--replay` of that reproducer.
- `async`: whether the release counts tokens in flight (`soak --overlap` runs it, 0.26.0 on)
  and, where it does, a history of each model under async scheduling: what kvcanary found,
  what vLLM raised, and whether the requests' stale share was read (0.27.0 on).
- `speculative`: each model under speculative decoding, and where the release counts the
  stale share (0.27.0 on) under async scheduling with drafts too: what kvcanary found, what
  vLLM raised, whether drafts were both accepted and rejected.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from kvcanary_cli.cli import app
from kvcanary_cli.dump.engine import read_arrays
from kvcanary_cli.engines.vllm import check_dump
from kvcanary_cli.engines.vllm.check import audit
from kvcanary_cli.soak.vllm_driver import (
    FAULTS,
    MODELS,
    _Scheduler,
    counts_stale_share,
    counts_tokens_in_flight,
    model_available,
    run_history,
)
from kvcanary_cli.soak.vllm_stack import load_vllm


def _key(digest: Any, group: int) -> bytes:
    return bytes(digest) + int(group).to_bytes(4, "big")


def _as_bytes(key: Any) -> bytes:
    """vLLM's key as bytes (digest, then group): itself, or before 0.10.2 its named pair's
    hash value (32 bytes, big-endian) and group id."""
    if isinstance(key, bytes):
        return key
    return _key(int(key.block_hash.hash_value).to_bytes(32, "big"), key.group_id)


def _cached(s: Any, table: Any, key: bytes, block: int) -> bool:
    """vLLM's own answer to "does the map hold this key for this block": `contain`; before
    0.24.0 (no `contain`) `get_one_block` finding the key with the block carrying it; before
    0.11.0 (a plain dict: key -> {block id: block}) the key's dict holding the block."""
    if hasattr(table, "contain"):
        return bool(table.contain(key, block))
    if hasattr(table, "get_one_block"):
        found = table.get_one_block(key) is not None
        return found and s.manager.block_pool.blocks[block].block_hash == key
    own = s.manager.block_pool.blocks[block].block_hash
    return own is not None and _as_bytes(own) == key and block in table.get(own, {})


def _clean(modules: Any, model: str, out: Path) -> dict[str, Any]:
    s = _Scheduler(modules, model, 11)
    several = denied = unlisted = findings = 0
    raised = None
    for _ in range(150):
        try:
            s.run_step()
        except AssertionError:  # vLLM's own (0.10.0's chunked-local hashing): said, not hidden
            raised = "AssertionError"
            break
        state = s.state()
        findings += len(audit(state).findings)
        table = s.manager.block_pool.cached_block_hash_to_block
        listed = {
            (_key(d, g), int(b))
            for b, g, d in zip(state.map_block, state.map_group, state.map_digest, strict=True)
        }
        denied += sum(not _cached(s, table, key, block) for key, block in listed)
        unlisted += sum(
            (_as_bytes(b.block_hash), b.block_id) not in listed
            for b in s.manager.block_pool.blocks
            if b.block_hash is not None
        )
        keys = [key for key, _ in listed]
        several = max(several, len(keys) - len(set(keys)))
    h = run_history(modules, model, 11, 150, assert_dumps=out / f"hook-{model}")
    return {
        "case": "clean",
        "model": model,
        "findings": findings + len(h.findings),
        "crash": raised if h.crash is None else h.crash.exception,
        "audited": h.audited,
        "prefix_hits": h.prefix_hits,
        "caching": s.caching,
        "several": several,
        "denied": denied,
        "unlisted": unlisted,
    }


def _fault(modules: Any, fault: str, model: str = "full") -> dict[str, Any]:
    h = run_history(modules, model, 3, 80, fault=fault, after_steps=0)
    return {
        "case": "fault",
        "model": model,
        "fault": fault,
        "planted": h.fault_step,
        "found": h.finding_step,
        "code": h.findings[0].code.value if h.findings else None,
        "crash": None if h.crash is None else h.crash.step,
    }


def _hook(modules: Any, out: Path) -> dict[str, Any]:
    bare = run_history(modules, "full", 3, 80, fault="block-freed-twice", after_steps=40)
    h = run_history(
        modules, "full", 3, 80, fault="block-freed-twice", after_steps=40, assert_dumps=out
    )
    block = int(h.fault_note.split()[1])  # "block N of rX freed twice"
    found = []
    for dump in h.assert_dumps:
        stored = read_arrays(dump)
        found += [(f.code.value, f.block == block) for f in check_dump(stored).findings]
    return {
        "case": "hook",
        "crash": None if h.crash is None else h.crash.exception,
        "raised_in": None if h.crash is None else h.crash.raised_in,
        "dumps": len(h.assert_dumps),
        "as_without_hook": (h.crash, h.steps) == (bare.crash, bare.steps),
        "found": sorted(set(found)),
    }


def _cli(wheel: str, out: Path) -> dict[str, Any]:
    args = ["soak", "--engine", "vllm", "--vllm-tree", wheel, "--format", "json"]
    clean = CliRunner().invoke(app, [*args, "--steps", "60", "--out", str(out / "clean")])
    found = CliRunner().invoke(
        app, [*args, "--steps", "300", "--fault", "leak", "--out", str(out / "found")]
    )
    files = json.loads(found.output)["files"] if found.exit_code == 1 else {}
    replayed = CliRunner().invoke(app, [*args, "--replay", str(files.get("reproducer"))])
    again = json.loads(replayed.output) if replayed.exit_code == 1 else {}
    return {
        "case": "cli",
        "exits": [clean.exit_code, found.exit_code, replayed.exit_code],
        "files": sorted(files),
        "reproduced": again.get("replay", {}).get("reproduced"),
        "errors": [r.output[-300:] for r in (clean, found, replayed) if r.exit_code not in (0, 1)],
    }


def _async(modules: Any, built: list[str]) -> dict[str, Any]:
    counted = counts_tokens_in_flight(modules)
    findings, crashes, stale = 0, [], False
    for model in built if counted else []:
        h = run_history(modules, model, 5, 150, overlap=True)
        findings += len(h.findings)
        crashes += [] if h.crash is None else [f"{model}: {h.crash.exception}"]
        s = _Scheduler(modules, model, 5, overlap=True)
        while not s.requests:  # (with no request the share is known vacuously)
            s.run_step()
        stale = stale or s.state().request_num_stale_in_flight is not None
    return {"case": "async", "counted": counted, "findings": findings, "crashes": crashes,
            "stale": stale}  # fmt: skip


def _speculative(modules: Any, built: list[str]) -> dict[str, Any]:
    """Every model under speculative decoding (3 drafts a decode step), and the sliding window
    and Mamba state again under async scheduling where the release counts the stale share
    (`async`): what kvcanary found, what vLLM raised, and whether some drafts were rejected
    (taken back) and some accepted."""
    findings, crashes, both = 0, [], True
    overlapped = counts_stale_share(modules)
    for model in built:
        # (async with drafts: the models whose rules read the tokens in flight)
        again = overlapped and model in ("hybrid", "hybrid-mamba")
        for overlap in (False, True) if again else (False,):
            h = run_history(modules, model, 5, 150, speculative=3, overlap=overlap)
            findings += len(h.findings)
            crashes += [] if h.crash is None else [f"{model}: {h.crash.exception}"]
            both = both and 0 < h.accepted < h.drafted
    return {"case": "speculative", "findings": findings, "crashes": crashes, "both": both,
            "async": overlapped}  # fmt: skip


def main(wheel: str, out: str) -> None:
    """Every case on `wheel`'s vLLM, one JSON line each; the first names the release."""
    folder = Path(out)
    modules = load_vllm(wheel)
    print(json.dumps({"case": "release", "version": modules.tree.version}), flush=True)
    built = [model for model in MODELS if model_available(modules, model)]
    for model in built:
        print(json.dumps(_clean(modules, model, folder)), flush=True)
    for fault in FAULTS:
        print(json.dumps(_fault(modules, fault)), flush=True)
    for model in [m for m in built if m.startswith("hybrid-")]:
        for fault in ("block-freed-twice", "leak"):
            print(json.dumps(_fault(modules, fault, model)), flush=True)
    print(json.dumps(_hook(modules, folder / "hook")), flush=True)
    print(json.dumps(_cli(wheel, folder / "cli")), flush=True)
    print(json.dumps(_async(modules, built)), flush=True)
    print(json.dumps(_speculative(modules, built)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
