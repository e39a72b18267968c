"""Engines besides SGLang, one package each (`vllm`): a dump naming its engine in
`kvcanary.engine` is read, checked, traced and synthesized by that engine's package. A third
engine is one more package and one more branch here; results and views are shared
(`results.pool`, `render`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from kvcanary_cli.dump.atomic import write_safetensors
from kvcanary_cli.dump.engine import StoredArrays, read_arrays
from kvcanary_cli.dump.header import dump_engine, unknown_engine
from kvcanary_cli.dump.schema import POOL_ENGINES, SGLANG
from kvcanary_cli.errors import DumpError, OptionError
from kvcanary_cli.option_values import INDEX, checked_integer
from kvcanary_cli.results.pool import PoolDumpReport, PoolProvenance
from kvcanary_cli.results.pool_timeline import PoolTimelineReport

if TYPE_CHECKING:
    from kvcanary_cli.dump.shrink_writer import ShrinkResult
    from kvcanary_cli.results.pool_inspect import PoolDumpDescription

__all__ = [
    "POOL_ENGINES",
    "check_pool_dump",
    "describe_pool_dump",
    "dump_engine",
    "is_pool_scenario",
    "pool_provenance",
    "pool_scenario_lines",
    "pool_scenario_names",
    "pool_timeline",
    "shrink_pool_dump",
    "write_pool_scenario",
]

PathLike = str | os.PathLike[str]


def _unknown(engine: str, path: PathLike) -> DumpError:
    """Why a dump that is not a block pool's is refused here: an SGLang dump (read by the
    SGLang commands), or an engine this kvcanary does not know."""
    if engine == SGLANG:
        return DumpError(
            "an SGLang dump, which holds slots, not a block pool's blocks",
            field="kvcanary.engine",
            path=str(path),
            hint="an SGLang dump's slots and pool rows are traced with provenance --slot/--row",
        )
    return unknown_engine(engine, path)


def _read(path: PathLike) -> StoredArrays:
    """A block-pool dump's arrays, its layout's only (vLLM's, the one such engine)."""
    from kvcanary_cli.engines.vllm.state import LAYOUT_TENSORS

    return read_arrays(path, keep=LAYOUT_TENSORS.__contains__)


def check_pool_dump(path: PathLike) -> PoolDumpReport:
    """A block-pool dump checked; an unreadable one is a report with its `error`."""
    try:
        stored = _read(path)
        if stored.engine != "vllm":
            raise _unknown(stored.engine, path)
        from kvcanary_cli.engines.vllm import check_dump

        return check_dump(stored)
    except DumpError as exc:
        if exc.path is None:
            exc.path = str(path)
        return PoolDumpReport(path=str(path), engine=dump_engine(path), error=str(exc))


def describe_pool_dump(path: PathLike) -> PoolDumpDescription:
    """What a block-pool dump holds (`inspect`), read as `check` reads it: a `DumpError`
    naming the file on bad input."""
    stored = _read(path)
    if stored.engine != "vllm":
        raise _unknown(stored.engine, path)
    from kvcanary_cli.engines.vllm import describe_dump

    try:
        return describe_dump(stored)
    except DumpError as exc:
        exc.path = exc.path or str(path)
        raise


def pool_provenance(path: PathLike, block: int) -> PoolProvenance:
    """One block of a block-pool dump: holders, queue places, hash, findings."""
    stored = _read(path)
    if stored.engine != "vllm":
        raise _unknown(stored.engine, path)
    from kvcanary_cli.engines.vllm import provenance

    return provenance(stored, block)


def pool_timeline(paths: list[PathLike], *, keep_order: bool) -> PoolTimelineReport:
    """What changed between snapshots of one block pool (`timeline`, `diff`)."""
    stored = [_read(p) for p in paths]
    for s in stored:
        if s.engine != "vllm":
            raise _unknown(s.engine, s.path)
    from kvcanary_cli.engines.vllm import timeline_of

    return timeline_of(stored, keep_order=keep_order)


def shrink_pool_dump(
    path: PathLike, out: PathLike, *, kvcanary_version: str, force: bool = False
) -> ShrinkResult:
    """A block-pool dump's small dump, written at `out` (the engine chooses what it keeps)."""
    stored = _read(path)
    if stored.engine != "vllm":
        raise _unknown(stored.engine, path)
    from kvcanary_cli.engines.vllm import shrink_dump

    return shrink_dump(stored, out, kvcanary_version=kvcanary_version, force=force)


def pool_scenario_lines() -> list[str]:
    """Every block-pool engine's synth scenarios, one line each."""
    from kvcanary_cli.engines.vllm import scenario_lines

    return scenario_lines()


def pool_scenario_names() -> list[str]:
    """Every block-pool engine's synth scenario names."""
    from kvcanary_cli.engines.vllm.synth import SCENARIOS

    return list(SCENARIOS)


def is_pool_scenario(name: str) -> bool:
    """Whether `name` is a block-pool engine's synth scenario."""
    from kvcanary_cli.engines.vllm import is_scenario

    return is_scenario(name)


def write_pool_scenario(name: str, out: PathLike | None, **options: object) -> str:
    """Write scenario `name`'s dump at `out`; the line saying what was written. Of `synth`'s
    options it takes `seed`, `size` and `force` (the others are SGLang's: refused)."""
    from kvcanary_cli.engines.vllm import synth_contents

    rest = [
        k
        for k, v in options.items()
        if k not in ("seed", "size", "force") and v is not None and (k, v) != ("every", 1)
    ]
    if rest:
        raise OptionError(
            f"{name} is a vLLM scenario: it takes --out, --seed, --size and --force only",
            option="/".join(rest),
            hint="drop " + ", ".join(f"--{k.replace('_', '-')}" for k in rest),
        )
    if out is None:
        raise OptionError("give the dump's file (--out DUMP)", option="out")
    seed = checked_integer(options.get("seed", 0), "seed", INDEX)
    size = str(options.get("size", "tiny"))
    tensors, metadata = synth_contents(name, seed=seed, size=size)
    write_safetensors(out, tensors, metadata, overwrite=bool(options.get("force", False)))
    return f"wrote {out} ({name}, seed {seed}, size {size})"
