"""`triton_runtime.kernel_arrays`: the Triton interpreter runs kernels on numpy memory (no torch).

These pin what the interpreter needs of a kernel argument: a Triton release that reads
another tensor method fails here first, with the method's name in the error. The torch memory
compiled kernels use is run here on CPU tensors, and must plan what numpy memory plans.
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvcanary_cli.planners import triton_runtime
from kvcanary_cli.planners.triton_runtime import HostBuffer, kernel_arrays
from tests.torch_extra import needs_torch

pytest.importorskip("triton")

_SCRIPT = """
import sys
import numpy as np
from kvcanary_cli.planners import triton_runtime
from kvcanary_cli.planners.triton_runtime import kernel_arrays

triton, tl = triton_runtime.load_triton()

@triton.jit
def scale(x_ptr, y_ptr, flags_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m, other=0)
    tl.store(y_ptr + i, x.to(tl.int64) * 3 - 1, mask=m)
    tl.store(flags_ptr + i, (x % 2).to(tl.uint8), mask=m)

memory = kernel_arrays(triton_runtime.mode())
source = np.arange(-5, 12, dtype=np.int32)
x = memory.upload(source)
y, flags = memory.empty(source.size, np.int64), memory.empty(source.size, np.uint8)
scale[(3,)](x, y, flags, source.size, BLOCK=8)
print(repr((memory.download(y).tolist(), memory.download(flags).tolist(), "torch" in sys.modules)))
"""


@pytest.mark.skipif(triton_runtime.cuda_available(), reason="compiled kernels use torch memory")
def test_interpreted_kernels_read_and_write_numpy_memory_without_torch() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    values, flags, imported_torch = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    source = np.arange(-5, 12)
    assert values == (source * 3 - 1).tolist()
    assert flags == np.fmod(source, 2).astype(np.uint8).tolist()  # C's %, wrapped to uint8
    assert imported_torch is False


def test_host_buffers_are_the_arrays_themselves() -> None:
    """No copy on the way in (a 2 GB mapped table stays mapped) nor on the way out."""
    memory = kernel_arrays("interpreter")
    table = np.arange(12, dtype=np.int32).reshape(3, 4)
    buffer = memory.upload(table)
    assert isinstance(buffer, HostBuffer)
    assert buffer.data_ptr() == table.ctypes.data
    assert buffer.size() == (3, 4) and buffer.stride() == (4, 1)
    assert np.shares_memory(memory.download(buffer), table)


def test_a_strided_view_is_copied_contiguous_before_a_kernel_sees_it() -> None:
    memory = kernel_arrays("interpreter")
    column = np.arange(12, dtype=np.int64).reshape(3, 4)[:, 1]
    buffer = memory.upload(column)
    assert buffer.stride() == (1,) and buffer.array.tolist() == [1, 5, 9]
    with pytest.raises(ValueError, match="C-contiguous"):
        HostBuffer(column)


@pytest.mark.parametrize("scenario", ["clean-swa", "truncated-lut", "row-out-of-range"])
def test_the_torch_memory_path_plans_what_numpy_memory_plans(
    scenario: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiled kernels get their memory from torch (`_TorchArrays("cuda")`). Without a GPU,
    the same code path runs here on CPU tensors, which the interpreter also takes: uploads,
    allocations by numpy dtype and downloads must give the plan numpy memory gives."""
    needs_torch()  # the compiled kernels' memory path is torch's
    from kvcanary_cli.dump.loader import load_dump
    from kvcanary_cli.planners import triton_planner
    from kvcanary_cli.synth.scenarios import make_scenario

    dump = load_dump(make_scenario(scenario, seed=3).save(tmp_path / "d.safetensors"))
    planner = triton_planner.TritonPlanner(host_processes=1)
    with_numpy = [planner.plan(dump, group) for group in dump.groups]
    monkeypatch.setattr(
        triton_planner, "kernel_arrays", lambda mode: triton_runtime._TorchArrays("cpu")
    )
    with_torch = [planner.plan(dump, group) for group in dump.groups]
    for got, want in zip(with_torch, with_numpy, strict=True):
        for field in dataclasses.fields(got):
            a, b = getattr(got, field.name), getattr(want, field.name)
            if isinstance(b, np.ndarray):
                assert isinstance(a, np.ndarray) and a.dtype == b.dtype, field.name
                assert np.array_equal(a, b), field.name
        assert got.problems.same_as(want.problems)
        assert (got.total_verify, got.verify_num_valid, got.enable) == (
            want.total_verify,
            want.verify_num_valid,
            want.enable,
        )


@pytest.mark.parametrize(
    ("at", "planted"),
    [(0, 5), (1535, -129), (1536, 2**40), (1635, 128), (700, -(2**31) - 1)],
)
def test_a_shared_buffer_reads_back_narrow_a_piece_at_a_time(
    monkeypatch: pytest.MonkeyPatch, at: int, planted: int
) -> None:
    """The forked children's buffer is read back a page of entries at a time, each piece's
    memory released once narrowed: the column is `held_narrow`'s of the whole (its dtype set
    by a value planted in any piece: the first, the last, at a boundary)."""
    from kvcanary_cli.planners import triton_planner
    from kvcanary_cli.planners.base import held_narrow
    from kvcanary_cli.planners.triton_runtime import shared_host_arrays

    monkeypatch.setattr(triton_planner, "_READ_BACK", 512)  # a 4 KiB page of int64
    values = np.random.default_rng(at).integers(-100, 100, size=3 * 512 + 100)
    values[at] = planted
    memory = shared_host_arrays()
    buffer = memory.empty(values.size, np.int64)
    buffer.array[:] = values
    column = triton_planner._read_back(memory, buffer)
    whole = held_narrow(values)
    assert column.dtype == whole.dtype and column.tolist() == whole.tolist()
    assert not buffer.array.any()  # every piece released (its pages read 0 now)


def test_a_private_buffer_reads_back_whole_and_untouched() -> None:
    from kvcanary_cli.planners import triton_planner

    memory = kernel_arrays("interpreter")
    buffer = memory.empty(1000, np.int64)
    buffer.array[:] = np.arange(1000) - 500
    column = triton_planner._read_back(memory, buffer)
    assert column.dtype == np.int16 and column.tolist() == list(range(-500, 500))
    assert buffer.array.tolist() == list(range(-500, 500))
