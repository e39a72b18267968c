"""`kvcanary ranks` on dumps the capture hook's own snapshot trigger wrote, for two ranks of
SGLang 0.5.23's real stack (hybrid SWA and unified memory) run on the same requests: soak's
scheduler, one stack per rank, each plan launched through the launcher wrapper.

Before one rank's tree evicts a page the other keeps, every snapshot of the two ranks is
identical (the tree's slots compared too) and `ranks` is silent; the first snapshot after it
is named divergent, at rank 1, on that page.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvcanary_cli.capture import server, triggers
from kvcanary_cli.cli import app as cli_app
from tests.live_capture import arm_hook, drive, live_scheduler, loaded

PAGE = 4
#: a snapshot every this many plan launches
EVERY = 5


@pytest.fixture(scope="module")
def sglang(sglang: Any) -> Iterator[Any]:
    """The session's SGLang, its modules importable for this module's tests."""
    with loaded(sglang) as modules:
        yield modules


def _ranks(paths: list[Path]) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(cli_app, ["ranks", *map(str, paths), "-f", "json"])
    assert result.exit_code in (0, 1), result.stderr
    return result.exit_code, json.loads(result.stdout)


def _run_rank(
    sglang: Any, tmp_path: Path, layout: str, rank: int, evict: bool
) -> tuple[dict[int, Path], int | None, list[int]]:
    """One rank's history, its snapshots by launch number; rank 1 may evict one page of its
    tree after 33 steps. Returns (snapshots, the launch the eviction followed, evicted pages)."""
    with pytest.MonkeyPatch.context() as patch:
        dumps = arm_hook(
            patch, sglang, tmp_path / layout / f"rank{rank}", rank=rank, dump_every=EVERY
        )
        scheduler = live_scheduler(sglang, PAGE, 100, 40, layout=layout)
        drive(scheduler, 33)
        after = pages = None
        if not evict:
            triggers.settings().signal_pending.set()
        else:
            tree = scheduler.stack.tree
            core = getattr(tree, "tree_core", tree)
            before = core.walk_for_kv_canary(unlocked_only=False, swa_resident_only=False)
            params = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
            tree.evict(params.EvictParams(num_tokens=PAGE))
            kept = core.walk_for_kv_canary(unlocked_only=False, swa_resident_only=False)
            gone = sorted(
                set((before.slot_indices // PAGE).tolist())
                - set((kept.slot_indices // PAGE).tolist())
            )
            assert gone, "the tree had nothing to evict"
            after, pages = server.last_step(), gone
        triggers.settings().signal_pending.set()  # both ranks: a snapshot at the next launch
        drive(scheduler, 17)
        snapshots = {
            int(p.name.split("-step")[1].split("-")[0]): p
            for p in dumps.glob("*-snapshot.safetensors")
        }
    return snapshots, after, pages or []


@pytest.mark.parametrize("layout", ["swa", "unified"])
def test_ranks_on_snapshots_of_two_real_ranks(sglang: Any, tmp_path: Path, layout: str) -> None:
    zero, _, _ = _run_rank(sglang, tmp_path, layout, 0, evict=False)
    one, evicted_at, pages = _run_rank(sglang, tmp_path, layout, 1, evict=True)
    assert evicted_at is not None
    steps = sorted(set(zero) & set(one))
    before = [s for s in steps if s <= evicted_at]
    later = [s for s in steps if s > evicted_at]
    assert before and later, (steps, evicted_at)
    for step in before:
        code, record = _ranks([zero[step], one[step]])
        assert code == 0 and record["verdict"] == "identical", record["first_divergence"]
        compared = record["ranks"][1]["compared"]
        assert {"req_to_token", "free_full_slots", "tree_full_slots"} <= set(compared)
    code, record = _ranks([zero[later[0]], one[later[0]]])
    assert code == 1 and record["verdict"] == "divergent"
    first = record["first_divergence"]
    assert first["rank"] == "1"
    divergence = first["divergence"]
    # the slot rank 1 holds otherwise (a table cell, a free or tree slot) is on a page it evicted
    slot = divergence["value"] if divergence["kind"] == "table" else divergence["slot"]
    assert slot is not None and slot // PAGE in pages, (divergence, pages)
    assert f"{slot}" in divergence["message"]
