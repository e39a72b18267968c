"""One step's dumps of several TP ranks (`kvcanary ranks`), made from one synthetic state: every
rank the same, the last one changed as a test asks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from kvcanary_cli.synth.state import SynthDump, SynthSpec, build_dump

__all__ = ["PAGE", "Tensors", "rank_state", "write_ranks"]

PAGE = 4
Tensors = dict[str, np.ndarray]


def rank_state() -> SynthDump:
    """One step's state with pages, an SWA LUT and both free lists."""
    return build_dump(SynthSpec(page_size=PAGE, window=8, max_seq_len=64), seed=3)


def write_ranks(
    base: SynthDump,
    folder: Path,
    change: Callable[[Tensors], None] | None = None,
    *,
    ranks: int = 3,
    meta: dict[str, str] | None = None,
) -> list[Path]:
    """`ranks` dumps of step 7; the last one changed by `change` (and `meta`)."""
    paths = []
    for rank in range(ranks):
        tensors = {name: array.copy() for name, array in base.tensors.items()}
        metadata = {**base.metadata, "rank": str(rank), "step": "7"}
        if rank == ranks - 1:
            if change is not None:
                change(tensors)
            metadata.update(meta or {})
        dump = SynthDump(
            spec=base.spec, seed=base.seed, tensors=tensors, metadata=metadata, live=[]
        )
        paths.append(dump.save(folder / f"rank{rank}.safetensors"))
    return paths
