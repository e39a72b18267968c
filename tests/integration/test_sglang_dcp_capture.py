"""Decode context parallel on SGLang 0.5.23's paged allocator: the allocator is built over
pages `dcp_size` times the pool's (`page_size × attn_dcp_size`, as SGLang's configurator
builds it), and the ids a request holds are paged in those. Capture records the allocator's
page as `page_size` and, beside it, `dcp_size` and the per-rank pool page; a state without
DCP records neither. Both check clean.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvcanary_cli.capture.tree import capture_state
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


POOL_PAGE, TOKENS = 4, 128


def _dump(sglang: Any, tmp_path: Path, dcp: int) -> Any:
    paged = importlib.import_module("sglang.srt.mem_cache.allocator.paged")
    page = POOL_PAGE * dcp
    allocator = paged.PagedTokenToKVPoolAllocator(
        TOKENS * dcp, page_size=page, dtype=torch.bfloat16, device="cpu", kvcache=None,
        need_sort=False,
    )  # fmt: skip
    pool = sglang.memory_pool.ReqToTokenPool(
        size=2, max_context_len=64, device="cpu", enable_memory_saver=False
    )
    zero, length = torch.tensor([0]), torch.tensor([20])
    slots = allocator.alloc_extend(zero, zero, length, length, torch.tensor([-1]), 20)
    row = pool.free_slots.pop(0)
    pool.write((row, slice(0, 20)), slots.to(torch.int32))
    batch = SimpleNamespace(
        req_pool_indices=torch.tensor([row]),
        seq_lens=torch.tensor([20]),
        out_cache_loc=slots[-1:],
        forward_mode=SimpleNamespace(is_extend=lambda: False),
    )
    requests = [SimpleNamespace(req_pool_idx=row, kv_allocated_len=20)]
    tensors, metadata = capture_state(
        req_to_token_pool=pool, allocator=allocator, batch=batch, requests=requests
    )
    return load_dump(
        write_dump(tmp_path / f"dcp{dcp}.safetensors", dump_contents(metadata, tensors))
    )


def test_dcps_widened_page_is_recorded(
    sglang: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    context = importlib.import_module("sglang.srt.runtime_context")
    monkeypatch.setattr(context, "get_parallel", lambda: SimpleNamespace(attn_dcp_size=2))
    dump = _dump(sglang, tmp_path, 2)
    assert dump.metadata["page_size"] == str(2 * POOL_PAGE)
    assert (dump.metadata["dcp_size"], dump.metadata["dcp_pool_page_size"]) == ("2", "4")
    assert checked(dump, kernel="vectorized").findings == ()


def test_without_dcp_nothing_is_added(sglang: Any, tmp_path: Path) -> None:
    dump = _dump(sglang, tmp_path, 1)
    assert dump.metadata["page_size"] == str(POOL_PAGE)
    assert "dcp_size" not in dump.metadata and "dcp_pool_page_size" not in dump.metadata
    assert checked(dump, kernel="vectorized").findings == ()
