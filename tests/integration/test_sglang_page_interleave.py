"""SGLang 0.5.23's page-interleave allocator (`PageInterleavePoolAllocator`, logical-page KV
sharding) on CPU, captured by `capture.tree` and checked.

It widens the index space: `shard_size` per-rank class free lists, logical page `l` owned by
rank `l % shard_size`, and logical pages `0 .. shard_size - 1` reserved (every rank's
physical page 0). Its logical ids reach `size + shard_size * page_size`, past the
`size + page_size` of a stock allocator. A correct state checks clean; a double free, pages
freed while a running request reads them, a reserved page on a free list and a reserved page
handed out are each named.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvcanary_cli.capture.tree import capture_state
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.dump.writer import dump_contents, write_dump
from tests.helpers import checked
from tests.live_capture import loaded

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def sglang(sglang: Any) -> Iterator[Any]:
    """The session's SGLang, its modules importable for this module's tests."""
    with loaded(sglang) as modules:
        yield modules


PAGE, SHARD, PER_RANK_TOKENS = 4, 2, 64
#: two requests holding every page between them (the top logical page included)
FIRST, SECOND = 5 * PAGE, 27 * PAGE


def _state(sglang: Any, tmp_path: Path, fault: str | None) -> Any:
    """Two running requests decoding on a real page-interleave allocator; `fault` planted."""
    module = importlib.import_module("sglang.srt.mem_cache.allocator.page_interleave")
    allocator = module.PageInterleavePoolAllocator(
        PER_RANK_TOKENS, PAGE, SHARD, torch.bfloat16, "cpu", None, False
    )
    if fault == "reserved-page-handed-out":  # logical page 1 (rank 1's page 0) on its list
        allocator.class_free_pages[1] = torch.cat(
            [torch.tensor([1]), allocator.class_free_pages[1]]
        )
    pool = sglang.memory_pool.ReqToTokenPool(
        size=4, max_context_len=128, device="cpu", enable_memory_saver=False
    )
    rows = []
    for base, tokens in ((0, FIRST), (1, SECOND)):
        slots = allocator.alloc_cyclic(base, tokens)
        row = pool.free_slots.pop(0)
        pool.write((row, slice(0, tokens)), slots.to(torch.int32))
        rows.append((row, tokens, slots))
    running = rows
    if fault == "double-free":  # the second request finished, its pages freed twice
        allocator.free(rows[1][2])
        allocator.free(rows[1][2])
        pool.free_slots.append(rows[1][0])
        running = rows[:1]
    elif fault == "freed-while-held":  # the first request's first page freed, still read
        allocator.free(rows[0][2][:PAGE])
    elif fault == "reserved-page-freed":  # rank 0's page 0 pushed onto its class list
        allocator.class_free_pages[0] = torch.cat(
            [allocator.class_free_pages[0], torch.tensor([0])]
        )
    batch = SimpleNamespace(
        req_pool_indices=torch.tensor([r for r, _, _ in running]),
        seq_lens=torch.tensor([n for _, n, _ in running]),
        out_cache_loc=torch.stack([s[-1] for _, _, s in running]),
        forward_mode=SimpleNamespace(is_extend=lambda: False),
    )
    requests = [SimpleNamespace(req_pool_idx=r, kv_allocated_len=n) for r, n, _ in running]
    tensors, metadata = capture_state(
        req_to_token_pool=pool, allocator=allocator, batch=batch, requests=requests
    )
    path = write_dump(tmp_path / f"{fault}.safetensors", dump_contents(metadata, tensors))
    return load_dump(path)


def _codes(dump: Any) -> set[FindingCode]:
    return {f.code for f in checked(dump, kernel="vectorized").findings}


def test_a_correct_page_interleave_state_checks_clean(sglang: Any, tmp_path: Path) -> None:
    dump = _state(sglang, tmp_path, None)
    assert int(dump.req_to_token.array().max()) >= PER_RANK_TOKENS * SHARD + PAGE  # the top page
    assert _codes(dump) == set()
    assert dump.scalar("num_full_slots") == PER_RANK_TOKENS * SHARD + SHARD * PAGE
    assert dump.metadata["reserved_pages"] == str(SHARD)


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ("double-free", FindingCode.FREE_LIST_DUPLICATE),
        ("freed-while-held", FindingCode.FREED_SLOT_IN_LIVE_RANGE),
        ("reserved-page-freed", FindingCode.RESERVED_SLOT_IN_USE),
        ("reserved-page-handed-out", FindingCode.RESERVED_SLOT_IN_USE),
    ],
)
def test_each_page_interleave_fault_is_named(
    sglang: Any, tmp_path: Path, fault: str, code: FindingCode
) -> None:
    codes = _codes(_state(sglang, tmp_path, fault))
    assert code in codes, codes
