"""Planner objects for tests, and `checked(dump, kernel=...)`: `run_check` with them injected."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcanary_cli.analysis.check import run_check
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.planners.base import Planner, Semantics
from kvcanary_cli.planners.reference import ReferencePlanner
from kvcanary_cli.planners.triton_planner import TritonPlanner
from kvcanary_cli.planners.vectorized import VectorizedPlanner
from kvcanary_cli.results.check import DumpReport, Finding
from kvcanary_cli.synth.scenarios import SCENARIOS
from tests.lanes import DEEP

REFERENCE = ReferencePlanner()
STRICT = ReferencePlanner(strict=True)
VECTORIZED = VectorizedPlanner()
VECTORIZED_GPU = VectorizedPlanner(semantics=Semantics.GPU)
TRITON = TritonPlanner()
#: the `--kernel` choices of `kvcanary check`, as objects.
KERNELS: dict[str, Planner | None] = {"vectorized": VECTORIZED_GPU, "triton": TRITON, "none": None}
#: every planner, by the name tests parametrize over.
PLANNERS: dict[str, Planner] = {
    "reference": REFERENCE,
    "vectorized": VECTORIZED,
    "vectorized-gpu": VECTORIZED_GPU,
    "triton": TRITON,
}


#: The page sizes the synth corpus is swept at.
PAGE_SIZES = (1, 4, 16)


def page_sizes_in_turn(names: Iterable[str], *, fast_only: bool = False) -> list[Any]:
    """(scenario, page size) for `parametrize`: every named scenario at every page size it
    takes; the suite one page size a scenario, taken in turn (1, 4, 16, 1, ...: at least its
    smallest), and the deep lane the others, which repeat that scenario's path (`fast_only`:
    only the suite's cases)."""
    cases: list[Any] = []
    for turn, name in enumerate(names):
        pages = [page for page in PAGE_SIZES if page >= SCENARIOS[name].min_page_size]
        first = pages[turn % len(pages)]
        cases += [
            (name, page) if page == first else pytest.param(name, page, marks=DEEP)
            for page in pages
            if page == first or not fast_only
        ]
    return cases


def checked(dump: KvDump, *, kernel: str = "vectorized") -> DumpReport:
    """`run_check` with the vectorized reference and the named kernel."""
    return run_check(dump, planner=VECTORIZED, kernel=KERNELS[kernel])


#: The synth scenarios on which SGLang's torch reference raises (its first bad read): what
#: the real SGLang and the stand-in must raise on, and nothing else.
UPSTREAM_RAISING_SCENARIOS = frozenset(
    {
        "truncated-lut",
        "truncated-lut-unrecorded",
        "undersized-lut",
        "slot-beyond-pool-swa",
        "row-out-of-range",
        "prefix-past-row",
        "expected-token-out-of-range",
    }
)

#: Scenarios whose lengths ask for more verify entries than the table holds: kvcanary plans
#: none of them and never hands SGLang the claim to allocate (its plan is "not launched").
NOT_HANDED_TO_SGLANG = frozenset({"absurd-prefix-length"})


def cells_key(f: Finding) -> tuple[object, ...] | None:
    """A finding group's cells as plain, comparable values (None for a row-level finding)."""
    if f.cells is None:
        return None
    c = f.cells
    return (
        tuple(c.batch_row.tolist()),
        tuple(c.pool_row.tolist()),
        tuple(c.position.tolist()),
        None if c.slot is None else tuple(c.slot.tolist()),
        tuple(sorted((name, tuple(v.tolist())) for name, v in c.extra.items())),
    )


def expand_cells(f: Finding) -> list[tuple[object, ...]]:
    """One (code, group, space, batch row, pool row, position, slot, role) per cell a finding
    stands for: the shape findings had before they were groups."""
    base = (f.code.value, f.group.value, f.space.value)
    role = None if f.role is None else f.role.value
    if f.cells is None:
        return [(*base, f.batch_row, f.pool_row, f.position, f.slot, role)]
    c = f.cells
    slots = [None] * len(c) if c.slot is None else c.slot.tolist()
    return [
        (*base, b, p, q, s, role)
        for b, p, q, s in zip(
            c.batch_row.tolist(), c.pool_row.tolist(), c.position.tolist(), slots, strict=True
        )
    ]


#: The scenarios of the bookkeeping audit (free lists, the whole LUT, radix sharing, leaks).
AUDIT_SCENARIOS = (
    "double-free",
    "reserved-slot-freed",
    "reserved-swa-page-freed",
    "reserved-swa-page-handed-out",
    "stale-swa-mapping",
    "swa-shared-owner",
    "swa-write-into-live-slot",
    "radix-copy",
    "swa-page-leak",
    "full-page-leak",
    "partial-page-free",
    "swa-mapping-rewritten",
)
#: Scenarios of diagnosis rules over old codes (a consistent row is no stale-row read, a radix
#: sharer's repeat is no aliasing, a live SWA page on the free list is its own cause).
RULE_SCENARIOS = ("reuse-under-radix-sharer", "double-allocation", "swa-freed-while-live")


def stale_rows_dump(path: Path, rows: int, *, prefix: int = 8, tail: int = 4) -> Path:
    """A dump whose `rows` batch rows each read a stale tail: the last `tail` of their
    `prefix` cells hold slots on the free list (the shape of the stale-row-read diagnosis at
    any batch size). Built with numpy only: cheap at tens of thousands of rows."""
    from kvcanary_cli.dump.writer import save_dump

    width = prefix + 2
    table = np.zeros((rows + 1, width), dtype=np.int32)
    slots = 1 + np.arange(rows * prefix, dtype=np.int32).reshape(rows, prefix)
    table[1:, :prefix] = slots
    freed = slots[:, prefix - tail :].reshape(-1)
    return save_dump(
        path,
        req_to_token=table,
        req_pool_indices=np.arange(1, rows + 1, dtype=np.int64),
        prefix_lens=np.full(rows, prefix, dtype=np.int64),
        free_full_slots=freed.astype(np.int64),
        metadata={"num_full_slots": str(rows * prefix + 16)},
    )


def wide_dump(path: Path, *, rows: int = 128, width: int = 131_076, seed: int = 1) -> Path:
    """A clean SWA state of production row width (`req_to_token` of `rows + 1` x `width`)
    whose `rows` live requests hold pages from all over a shuffled pool: shrunk, it is the
    wide sparse dump whose kernel staging holds `rows x width` dense cells."""
    from dataclasses import replace

    from kvcanary_cli.synth.scenarios import SIZES
    from kvcanary_cli.synth.state import build_dump

    spec = replace(
        SIZES["small"],
        max_reqs=rows + 1,
        max_seq_len=width,
        active_rows=rows,
        padding_rows=1,
        history=rows,
        max_request_len=2048,
        pool_slots=1 << 19,
        window=64,
        mode="mixed",
        shuffled_free_list=True,
    )
    return build_dump(spec, seed=seed).save(path)


def wide_shrunk_contents(
    *, rows: int = 2048, width: int = 131_076, prefix: int = 4
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors and metadata of a shrunk dump (format 1.2) of a clean production-wide
    pool: `rows + 1` pool rows of `width` cells whose `rows` batch rows are all live, each
    holding `prefix` distinct slots. Only the live cells are stored, so the file is small
    while the shape is the production one (a batch of every row: 2048 x 131,076 cells to
    stage dense for the Triton kernels, past the 2^28 kvcanary stages)."""
    from kvcanary_cli.dump.narrow import original_dtypes_text
    from kvcanary_cli.dump.schema import ORIGINAL_DTYPES_KEY, SHRINK_KEY, SHRUNK_FORMAT_VERSION
    from kvcanary_cli.dump.shrink_record import ShrinkRecord, TensorCut
    from kvcanary_cli.dump.sparse import flat_runs, gap_runs

    pool_rows = np.arange(1, rows + 1, dtype=np.int64)
    flat = (pool_rows[:, None] * width + np.arange(prefix, dtype=np.int64)).reshape(-1)
    values = (1 + np.arange(flat.size)).astype(np.int32)
    slots = rows * prefix + 16
    cut = TensorCut(
        name="req_to_token",
        shape=(rows + 1, width),
        kept=int(flat.size),
        dropped=(rows + 1) * width - int(flat.size),
        dropped_bytes=((rows + 1) * width - int(flat.size)) * 4,
        rows=rows + 1,
        kept_rows=rows,
    )
    record = ShrinkRecord(
        source_name="wide.safetensors",
        source_bytes=(rows + 1) * width * 4,
        source_sha256="0" * 64,
        kvcanary_version="test",
        tensors=(cut,),
    )
    tensors = {
        "req_to_token": values,
        "req_to_token.runs": gap_runs(flat_runs(flat)),
        "req_to_token.shape": np.array([rows + 1, width], dtype=np.int64),
        "req_pool_indices": pool_rows,
        "prefix_lens": np.full(rows, prefix, dtype=np.int64),
        "extend_seq_lens": np.zeros(rows, dtype=np.int64),
        "free_full_slots": np.arange(flat.size + 1, slots, dtype=np.int64),
    }
    metadata = {
        "num_full_slots": str(slots),
        "kvcanary.format": SHRUNK_FORMAT_VERSION,
        SHRINK_KEY: record.to_json(),
        ORIGINAL_DTYPES_KEY: original_dtypes_text({"req_to_token": "I32"}),
    }
    return tensors, metadata


def wide_shrunk_dump(path: Path, **shape: int) -> Path:
    """`wide_shrunk_contents` written to `path`."""
    from kvcanary_cli.dump.atomic import write_safetensors

    tensors, metadata = wide_shrunk_contents(**shape)
    return write_safetensors(path, tensors, metadata)


def one_slot_shrunk_dump(
    path: Path, *, rows: int = 4096, width: int = 2400, slot: int = 7, slots: int = 16
) -> Path:
    """A shrunk dump (format 1.2) whose `req_to_token` (`rows + 1` x `width`, uint8 elements
    of an int32 original) is stored whole as one run, and whose `rows` live batch rows hold
    `slot` in every one of their `width` cells: one slot aliased by every live cell, so a
    view of that slot's findings has `rows x width` cells to show a few of."""
    from kvcanary_cli.dump.atomic import write_safetensors
    from kvcanary_cli.dump.narrow import original_dtypes_text
    from kvcanary_cli.dump.schema import ORIGINAL_DTYPES_KEY, SHRINK_KEY, SHRUNK_FORMAT_VERSION
    from kvcanary_cli.dump.shrink_record import ShrinkRecord, TensorCut
    from kvcanary_cli.dump.sparse import gap_runs

    table = np.full((rows + 1, width), slot, dtype=np.uint8)
    table[0] = 0
    cut = TensorCut(
        name="req_to_token",
        shape=(rows + 1, width),
        kept=table.size,
        dropped=0,
        dropped_bytes=0,
        rows=rows + 1,
        kept_rows=rows + 1,
    )
    record = ShrinkRecord(
        source_name="one-slot.safetensors",
        source_bytes=table.size * 4,
        source_sha256="0" * 64,
        kvcanary_version="test",
        tensors=(cut,),
    )
    pool_rows = np.arange(1, rows + 1, dtype=np.int64)
    tensors = {
        "req_to_token": table.reshape(-1),
        "req_to_token.runs": gap_runs(np.array([[0, table.size]], dtype=np.int64)),
        "req_to_token.shape": np.array([rows + 1, width], dtype=np.int64),
        "req_pool_indices": pool_rows,
        "prefix_lens": np.full(rows, width, dtype=np.int64),
        "extend_seq_lens": np.zeros(rows, dtype=np.int64),
        "free_full_slots": np.array([s for s in range(1, slots) if s != slot], dtype=np.int64),
    }
    metadata = {
        "num_full_slots": str(slots),
        "kvcanary.format": SHRUNK_FORMAT_VERSION,
        SHRINK_KEY: record.to_json(),
        ORIGINAL_DTYPES_KEY: original_dtypes_text({"req_to_token": "I32"}),
    }
    return write_safetensors(path, tensors, metadata)


def json_lines_of_module(module: str, *args: str) -> list[dict[str, Any]]:
    """`python -m MODULE ARGS` (a module of `tests`) in a process of its own, from the
    checkout (one engine release per process: SGLang's and vLLM's trees cannot be unloaded),
    its exit 0 asserted; the JSON object each line of its stdout holds."""
    run = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return [json.loads(line) for line in run.stdout.splitlines()]
