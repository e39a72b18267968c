"""The assert hook on vLLM 0.33.0's real `KVCacheManager`: when vLLM's own assert fires, the
pool is written as a dump that `check` explains, and vLLM's exception goes on unchanged (the
same object, raised from the same line, the history ending at the same step); when nothing
fires nothing is written; a dump that cannot be written never reaches the engine."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import pytest

from kvcanary_cli.dump.engine import read_arrays
from kvcanary_cli.engines.vllm import check_dump
from kvcanary_cli.engines.vllm.hook import watch_asserts
from kvcanary_cli.soak.vllm_driver import _Scheduler, run_history


def _vllm_frames(exc: BaseException) -> list[tuple[str, int | None, str]]:
    """The traceback's frames, the hook's own left out."""
    return [
        (f.filename, f.lineno, f.name)
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.endswith("hook.py")
    ]


def test_a_double_free_assert_writes_the_pool_and_changes_nothing(
    vllm: Any, tmp_path: Path
) -> None:
    bare = run_history(vllm, "full", 3, 80, fault="block-freed-twice", after_steps=40)
    hooked = run_history(
        vllm, "full", 3, 80, fault="block-freed-twice", after_steps=40, assert_dumps=tmp_path
    )
    assert bare.crash is not None and bare.crash.exception == "AssertionError"
    assert hooked.crash == bare.crash and hooked.steps == bare.steps
    [dump] = hooked.assert_dumps
    stored = read_arrays(dump)
    assert stored.metadata["kvcanary.trigger"] == "vllm-assert"
    assert stored.metadata["step"] == str(bare.crash.step)
    assert stored.metadata["kvcanary.raised_in"] == bare.crash.raised_in
    report = check_dump(stored)
    block = int(bare.fault_note.split()[1])  # "block N of rX freed twice"
    assert any(f.code.value == "negative-ref-count" and f.block == block for f in report.findings)


def test_the_same_exception_goes_on_even_when_the_dump_cannot_be_written(
    vllm: Any, tmp_path: Path
) -> None:
    def fire(folder: Path | None) -> tuple[BaseException, Any]:
        s = _Scheduler(vllm, "full", 5)
        pool = s.manager.block_pool
        hook = None if folder is None else watch_asserts(s.manager, folder, requests=s.requests)
        pool.free_block_queue.fake_free_list_head.next_free_block.ref_cnt = 1
        with pytest.raises(AssertionError) as caught:
            for _ in range(50):  # until a request is given blocks: the queue's head first
                s.run_step()
        return caught.value, hook

    bare, _ = fire(None)
    written, hook = fire(tmp_path / "dumps")
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    unwritten, failed_hook = fire(blocked)
    for exc in (written, unwritten):
        assert exc.args == bare.args and exc.__context__ is None and exc.__cause__ is None
        assert _vllm_frames(exc)[1:] == _vllm_frames(bare)[1:]  # [0]: this test's own line
    assert len(hook.written) == 1 and hook.failures == []
    assert failed_hook.written == [] and len(failed_hook.failures) == 1
    assert blocked.read_text() == "not a folder"


def test_nothing_fires_nothing_is_written_and_uninstall_restores(vllm: Any, tmp_path: Path) -> None:
    folder = tmp_path / "dumps"
    bare = run_history(vllm, "hybrid", 11, 60)
    hooked = run_history(vllm, "hybrid", 11, 60, assert_dumps=folder)
    assert hooked.findings == bare.findings == () and hooked.crash is None
    assert (hooked.audited, hooked.preemptions, hooked.prefix_hits) == (
        bare.audited,
        bare.preemptions,
        bare.prefix_hits,
    )
    assert hooked.assert_dumps == [] and not folder.exists()
    s = _Scheduler(vllm, "full", 5)
    hook = watch_asserts(s.manager, folder)
    assert "free_blocks" in vars(s.manager.block_pool) and "free" in vars(s.manager)
    hook.uninstall()
    assert "free_blocks" not in vars(s.manager.block_pool) and "free" not in vars(s.manager)
