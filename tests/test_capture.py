"""kvcanary_cli.capture against a stand-in for SGLang's plan launcher (no SGLang needed)."""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kvcanary_cli import capture
from kvcanary_cli.capture import (
    DUMP_DIR_ENV,
    SGLANG_PLAN_FUNCTION,
    SGLANG_PLAN_MODULE,
    install_from_env,
    install_sglang_hook,
    launcher,
    save_plan_inputs,
    server,
    store,
    triggers,
)
from kvcanary_cli.dump.loader import RecordedException, load_dump

LUT_ERROR = "kv-canary: SWA slot 70 is outside full_to_swa_index_mapping length 65"

#: The stand-in, as source: exec'd into a ModuleType in-process, and written as
#: sglang/kernels/ops/kv_canary/plan/api.py for the subprocess tests.
STAND_IN_SOURCE = textwrap.dedent(
    '''
    """Stand-in for SGLang's plan launcher: the signature, one literal LUT check."""

    calls = []
    last_error = None
    RESULT = object()


    def launch_canary_plan_kernels(
        *, req_pool_indices, prefix_lens, extend_seq_lens, req_to_token, swa_window_size,
        full_to_swa_index_mapping, verify_capacity, req_to_verify_expected_tokens,
        req_to_verify_expected_tokens_valid_lens, kv_token_id_vs_position_offset,
        verify_plan_out, write_plan_out,
    ):
        global last_error
        calls.append(len(req_pool_indices))
        lut = full_to_swa_index_mapping
        if lut is not None:
            for row, prefix in zip(req_pool_indices.tolist(), prefix_lens.tolist()):
                if row == 0:
                    continue
                for slot in req_to_token[row, :prefix].tolist():
                    if slot >= len(lut):
                        last_error = ValueError(
                            f"kv-canary: SWA slot {slot} is outside "
                            f"full_to_swa_index_mapping length {len(lut)}"
                        )
                        raise last_error
        write_plan_out.write_num_valid_reqs[0] = len(req_pool_indices)
        return RESULT
    '''
)


@dataclass
class VerifyPlan:
    verify_slot_indices: torch.Tensor
    verify_expected_tokens: torch.Tensor
    verify_expected_positions: torch.Tensor
    verify_prev_slot_indices: torch.Tensor
    verify_num_valid: torch.Tensor
    enable: torch.Tensor

    @classmethod
    def allocate(cls, capacity: int) -> VerifyPlan:
        def empty() -> torch.Tensor:
            return torch.empty(capacity, dtype=torch.int64)

        return cls(
            empty(),
            empty(),
            empty(),
            empty(),
            torch.zeros(1, dtype=torch.int32),
            torch.ones(1, dtype=torch.int32),
        )


@dataclass
class WritePlan:
    write_offsets: torch.Tensor
    write_seed_slot_indices: torch.Tensor
    write_num_valid_reqs: torch.Tensor

    @classmethod
    def allocate(cls, capacity: int) -> WritePlan:
        return cls(
            torch.empty(capacity + 1, dtype=torch.int64),
            torch.empty(capacity, dtype=torch.int64),
            torch.zeros(1, dtype=torch.int32),
        )


def _dense(tensor: Any) -> np.ndarray:
    """A format-1 dump's tensor as its array (this module is imported by child processes,
    whatever kvcanary they have installed: it names only long-standing modules)."""
    array = tensor.array()
    assert isinstance(array, np.ndarray)
    return array


def plan_kwargs(*, bad_slot: bool = True, token_offset: int = 1) -> dict[str, Any]:
    """One SWA-group call: bs 3 (one padding row), LUT of length 65, slot 70 live if bad."""
    req_to_token = torch.zeros(4, 16, dtype=torch.int32)
    req_to_token[1, :5] = torch.tensor([1, 2, 3, 4, 5])
    req_to_token[2, :4] = torch.tensor([10, 11, 70 if bad_slot else 12, 13])
    lut = torch.arange(65, dtype=torch.int64)
    lut[-1] = -1
    return {
        "req_pool_indices": torch.tensor([1, 2, 0]),
        "prefix_lens": torch.tensor([4, 3, 0]),
        "extend_seq_lens": torch.tensor([1, 1, 0]),
        "req_to_token": req_to_token,
        "swa_window_size": 8,
        "full_to_swa_index_mapping": lut,
        "verify_capacity": 32,
        "req_to_verify_expected_tokens": None,
        "req_to_verify_expected_tokens_valid_lens": None,
        "kv_token_id_vs_position_offset": token_offset,
        "verify_plan_out": VerifyPlan.allocate(32),
        "write_plan_out": WritePlan.allocate(5),
    }


@pytest.fixture
def stand_in() -> types.ModuleType:
    module = types.ModuleType("kvcanary_test_plan_api")
    exec(compile(STAND_IN_SOURCE, "<stand-in api.py>", "exec"), module.__dict__)
    return module


@pytest.fixture(autouse=True)
def _no_rank_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", DUMP_DIR_ENV, "KVCANARY_DUMP_LIMIT"):
        monkeypatch.delenv(name, raising=False)
    for name in ("KVCANARY_GUARD", "KVCANARY_GUARD_EVERY", "KVCANARY_DUMP_EVERY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("KVCANARY_DUMP_TRIGGER", "KVCANARY_DUMP_SIGNAL", "KVCANARY_DUMP_MAX_BYTES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(store, "BUDGET", store.Budget())  # a fresh process's budget
    monkeypatch.setattr(triggers, "GUARD", triggers.Guard())
    monkeypatch.setattr(triggers, "_SETTINGS", [triggers.Settings()])
    monkeypatch.setattr(server, "_LAST", {})
    monkeypatch.setattr(server, "_calls", itertools.count())
    monkeypatch.setattr(server, "_last_step", [-1])


def dumps_in(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.safetensors")) if directory.exists() else []


# --- save_plan_inputs -------------------------------------------------------------------------


def test_save_plan_inputs_records_inputs_and_capacities(tmp_path: Path) -> None:
    kwargs = plan_kwargs()
    path = save_plan_inputs(tmp_path / "d.safetensors", metadata={"model": "m"}, **kwargs)
    dump = load_dump(path)
    assert np.array_equal(_dense(dump.req_to_token), kwargs["req_to_token"].numpy())
    assert dump.req_pool_indices.tolist() == [1, 2, 0]
    assert dump.prefix_lens.tolist() == [4, 3, 0]
    assert dump.extend_seq_lens.tolist() == [1, 1, 0]
    assert dump.full_to_swa_index_mapping is not None
    assert (
        _dense(dump.full_to_swa_index_mapping).tolist()
        == kwargs["full_to_swa_index_mapping"].tolist()
    )
    assert dump.scalar("swa_window_size") == 8
    assert dump.scalar("verify_capacity") == 32
    assert dump.write_req_capacity == 5
    assert dump.token_offset == 1
    assert dump.groups == ("full", "swa")
    # plan outputs are not stored as tensors
    assert not any(name.startswith(("verify_", "write_")) for name in dump.tensors)
    assert dump.metadata["model"] == "m"
    assert dump.metadata["captured_at"].endswith("+00:00")


def test_save_plan_inputs_without_lut_plans_full_only(tmp_path: Path) -> None:
    kwargs = plan_kwargs(token_offset=0)
    kwargs.update(swa_window_size=0, full_to_swa_index_mapping=None)
    dump = load_dump(save_plan_inputs(tmp_path / "d.safetensors", **kwargs))
    assert dump.groups == ("full",)
    assert dump.metadata["groups"] == "full"
    assert dump.lut_len is None


def test_save_plan_inputs_expected_pool_and_int_like_scalars(tmp_path: Path) -> None:
    kwargs = plan_kwargs()
    kwargs["req_to_verify_expected_tokens"] = torch.arange(64, dtype=torch.int32).reshape(4, 16)
    kwargs["req_to_verify_expected_tokens_valid_lens"] = torch.tensor([5, 4, 0])
    kwargs["swa_window_size"] = torch.tensor(8)  # a 0-d tensor is recorded as an int
    dump = load_dump(save_plan_inputs(tmp_path / "d.safetensors", **kwargs))
    assert dump.scalars["swa_window_size"].source == "metadata"
    assert dump.scalar("swa_window_size") == 8
    assert dump.req_to_verify_expected_tokens is not None
    assert dump.req_to_verify_expected_tokens_valid_lens is not None
    assert dump.req_to_verify_expected_tokens_valid_lens.tolist() == [5, 4, 0]


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("layout", ["to_sparse", "to_sparse_csr"])
def test_save_plan_inputs_names_a_sparse_tensor(tmp_path: Path, layout: str) -> None:
    # numpy cannot take a sparse tensor: it was refused as "dtype torch.int32 is not accepted
    # (expected int32 or int64)", an int32 tensor refused for being int32.
    from kvcanary_cli.errors import DumpError

    kwargs = plan_kwargs()
    kwargs["req_to_token"] = getattr(kwargs["req_to_token"].to(torch.int32), layout)()
    with pytest.raises(DumpError) as caught:
        save_plan_inputs(tmp_path / "d.safetensors", **kwargs)
    message = str(caught.value)
    assert message.startswith("req_to_token: is a sparse tensor (torch.sparse_")
    assert "pass req_to_token.to_dense()" in message and "dtype" not in message


def test_save_plan_inputs_rejects_unknown_arguments(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword arguments 'bogus', 'out_cache_lok'"):
        save_plan_inputs(tmp_path / "d.safetensors", bogus=1, out_cache_lok=2, **plan_kwargs())
    with pytest.raises(TypeError, match=r"missing required keyword argument.*'req_to_token'"):
        save_plan_inputs(
            tmp_path / "d.safetensors",
            req_pool_indices=torch.tensor([1]),
            prefix_lens=torch.tensor([1]),
        )
    assert dumps_in(tmp_path) == []


# --- install_sglang_hook ----------------------------------------------------------------------


def test_raising_call_dumps_once_and_reraises_same_exception(
    tmp_path: Path, stand_in: types.ModuleType
) -> None:
    original = stand_in.launch_canary_plan_kernels
    assert install_sglang_hook(tmp_path, module=stand_in)
    assert stand_in.launch_canary_plan_kernels is not original
    with pytest.raises(ValueError) as info:
        stand_in.launch_canary_plan_kernels(**plan_kwargs())
    assert info.value is stand_in.last_error
    assert type(info.value) is ValueError
    assert str(info.value) == LUT_ERROR
    assert info.value.__context__ is None and info.value.__cause__ is None
    # the traceback still reaches the frame that raised
    frames = []
    tb = info.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert frames[-1] == "launch_canary_plan_kernels"
    [path] = dumps_in(tmp_path)
    assert path.name.startswith("kvcanary-rank0-step") and path.suffix == ".safetensors"


def test_dump_of_failed_call_has_inputs_and_note(
    tmp_path: Path, stand_in: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "3")
    install_sglang_hook(tmp_path, module=stand_in)
    with pytest.raises(ValueError):
        stand_in.launch_canary_plan_kernels(**plan_kwargs())
    [path] = dumps_in(tmp_path)
    dump = load_dump(path)
    step = dump.metadata["step"]
    assert path.name == f"kvcanary-rank3-step{int(step):06d}.safetensors"
    assert dump.metadata["rank"] == "3"
    assert dump.metadata["note"] == f"captured on ValueError: {LUT_ERROR}"
    # the exception as data: what the analysis holds against kvcanary's reference
    assert dump.metadata["sglang.exception.type"] == "ValueError"
    assert dump.metadata["sglang.exception.message"] == LUT_ERROR
    assert dump.recorded_exception == RecordedException(
        exception_type="ValueError", message=LUT_ERROR
    )
    assert dump.metadata["kvcanary.trigger"] == "raise"
    assert dump.scalar("swa_window_size") == 8
    assert dump.scalar("verify_capacity") == 32
    assert dump.write_req_capacity == 5
    assert dump.token_offset == 1
    assert dump.lut_len == 65
    assert int(_dense(dump.req_to_token)[2, 2]) == 70
    assert dump.identity["note"].startswith("captured on ValueError")


def test_an_argument_the_format_lacks_is_named_in_the_note_not_in_the_exception(
    tmp_path: Path, stand_in: types.ModuleType
) -> None:
    install_sglang_hook(tmp_path, module=stand_in)
    with pytest.raises(TypeError):
        stand_in.launch_canary_plan_kernels(**plan_kwargs(), new_argument=1)
    [path] = dumps_in(tmp_path)
    dump = load_dump(path)
    assert dump.metadata["note"].startswith("captured on TypeError: ")
    assert dump.metadata["note"].endswith(" (arguments not saved: new_argument)")
    recorded = dump.recorded_exception
    assert recorded is not None and recorded.exception_type == "TypeError"
    assert "new_argument" in recorded.message and "not saved" not in recorded.message
    assert "new_argument" not in dump.tensors


def test_step_counts_calls_and_explicit_rank(tmp_path: Path, stand_in: types.ModuleType) -> None:
    install_sglang_hook(tmp_path, module=stand_in, rank=7)
    stand_in.launch_canary_plan_kernels(**plan_kwargs(bad_slot=False))
    with pytest.raises(ValueError):
        stand_in.launch_canary_plan_kernels(**plan_kwargs())
    with pytest.raises(ValueError):
        stand_in.launch_canary_plan_kernels(**plan_kwargs())
    paths = dumps_in(tmp_path)
    steps = [int(load_dump(p).metadata["step"]) for p in paths]
    assert len(paths) == 2 and steps[1] == steps[0] + 1
    assert all(p.name.startswith("kvcanary-rank7-") for p in paths)


def test_successful_call_passes_through(tmp_path: Path, stand_in: types.ModuleType) -> None:
    install_sglang_hook(tmp_path / "dumps", module=stand_in)
    kwargs = plan_kwargs(bad_slot=False)
    assert stand_in.launch_canary_plan_kernels(**kwargs) is stand_in.RESULT
    assert int(kwargs["write_plan_out"].write_num_valid_reqs[0]) == 3
    assert not (tmp_path / "dumps").exists()


def test_installing_twice_does_not_double_wrap(tmp_path: Path, stand_in: types.ModuleType) -> None:
    original = stand_in.launch_canary_plan_kernels
    assert install_sglang_hook(tmp_path / "first", module=stand_in)
    assert install_sglang_hook(tmp_path / "second", module=stand_in)
    wrapper = stand_in.launch_canary_plan_kernels
    assert wrapper.__kvcanary_original__ is original
    assert wrapper.__wrapped__ is original
    with pytest.raises(ValueError):
        wrapper(**plan_kwargs())
    assert stand_in.calls == [3]
    assert dumps_in(tmp_path / "first") == []
    assert len(dumps_in(tmp_path / "second")) == 1


def test_install_rebinds_names_imported_elsewhere(
    tmp_path: Path, stand_in: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    caller = types.ModuleType("kvcanary_test_caller")
    caller.launch_canary_plan_kernels = stand_in.launch_canary_plan_kernels  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, caller.__name__, caller)
    install_sglang_hook(tmp_path, module=stand_in)
    assert caller.launch_canary_plan_kernels is stand_in.launch_canary_plan_kernels


def test_dump_failure_is_logged_and_original_exception_kept(
    tmp_path: Path, stand_in: types.ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the dump directory should be")
    install_sglang_hook(blocker, module=stand_in)
    with caplog.at_level(logging.WARNING, logger="kvcanary.capture"):
        with pytest.raises(ValueError) as info:
            stand_in.launch_canary_plan_kernels(**plan_kwargs())
    assert info.value is stand_in.last_error
    assert info.value.__context__ is None
    assert any("could not write a dump" in r.getMessage() for r in caplog.records)
    assert all(r.name == "kvcanary.capture" for r in caplog.records)


def test_install_returns_false_when_sglang_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, SGLANG_PLAN_MODULE, None)  # makes the import fail
    assert install_sglang_hook(tmp_path) is False


def test_install_returns_false_without_the_launcher(tmp_path: Path) -> None:
    assert install_sglang_hook(tmp_path, module=types.ModuleType("empty")) is False


def test_install_from_env_needs_the_variable() -> None:
    before = list(sys.meta_path)
    assert install_from_env() is False
    assert sys.meta_path == before


def test_install_from_env_wraps_an_already_loaded_module(
    tmp_path: Path, stand_in: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DUMP_DIR_ENV, str(tmp_path))
    monkeypatch.setitem(sys.modules, SGLANG_PLAN_MODULE, stand_in)
    assert install_from_env() is True
    assert hasattr(stand_in.launch_canary_plan_kernels, "__kvcanary_original__")
    # Still armed for the module where SGLang sets the canary up with its model runner, the
    # reporter, the invariant checker and the radix caches; not for the other release's
    # launcher module.
    [finder] = [f for f in sys.meta_path if isinstance(f, launcher._InstallOnImport)]
    assert finder.pending == {
        capture.SGLANG_CANARY_MODULE,
        capture.SGLANG_REPORTER_MODULE,
        capture.SGLANG_CHECKER_MODULE,
        *capture.SGLANG_TREE_CLASSES,
    }
    sys.meta_path.remove(finder)


def test_captured_dump_checks_as_lut_out_of_range(
    tmp_path: Path, stand_in: types.ModuleType
) -> None:
    from typer.testing import CliRunner

    from kvcanary_cli.cli import app

    install_sglang_hook(tmp_path, module=stand_in)
    with pytest.raises(ValueError, match="outside full_to_swa_index_mapping"):
        stand_in.launch_canary_plan_kernels(**plan_kwargs())
    [path] = dumps_in(tmp_path)
    result = CliRunner().invoke(
        app, ["check", str(path), "--format", "json", "--kernel", "vectorized"]
    )
    assert result.exit_code == 1, result.output
    record = json.loads(result.stdout)
    codes = {f["code"] for d in record["dumps"] for f in d["findings"]}
    assert "lut-out-of-range" in codes


# --- start-up route: KVCANARY_DUMP_DIR + sitecustomize / .pth, in a fresh interpreter -----------

CHILD_SCRIPT = textwrap.dedent(
    f"""
    import sys
    import torch
    assert {SGLANG_PLAN_MODULE!r} not in sys.modules, "sglang imported at start-up"
    assert "kvcanary_cli.capture" in sys.modules, "start-up import did not run"
    from sglang.kernels.ops.kv_canary.plan.api import {SGLANG_PLAN_FUNCTION} as launch
    import sglang.kernels.ops.kv_canary.plan.api as api
    assert launch is api.{SGLANG_PLAN_FUNCTION}
    assert hasattr(launch, "__kvcanary_original__")
    sys.path.insert(0, sys.argv[1])
    import test_capture as helpers
    assert launch(**helpers.plan_kwargs(bad_slot=False)) is api.RESULT
    try:
        launch(**helpers.plan_kwargs())
    except ValueError as exc:
        assert exc is api.last_error
        print("RAISED:", exc)
    """
)


def _fake_sglang(root: Path) -> None:
    package = root / "sglang/kernels/ops/kv_canary/plan"
    package.mkdir(parents=True)
    directory = package
    while directory != root:
        (directory / "__init__.py").touch()
        directory = directory.parent
    (package / "api.py").write_text(STAND_IN_SOURCE)


def _run_child(
    tmp_path: Path, startup_dir: Path, dump_dir: Path
) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "fake-site"
    _fake_sglang(fake)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
    env[DUMP_DIR_ENV] = str(dump_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(startup_dir), str(fake)])
    return subprocess.run(
        [sys.executable, "-c", CHILD_SCRIPT, str(Path(__file__).parent)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_env_var_with_sitecustomize_captures_in_a_fresh_process(tmp_path: Path) -> None:
    startup = tmp_path / "startup"
    startup.mkdir()
    (startup / "sitecustomize.py").write_text("import kvcanary_cli.capture\n")
    dump_dir = tmp_path / "dumps"
    result = _run_child(tmp_path, startup, dump_dir)
    assert result.returncode == 0, result.stderr
    assert f"RAISED: {LUT_ERROR}" in result.stdout
    [path] = dumps_in(dump_dir)
    assert path.name == "kvcanary-rank0-step000001.safetensors"
    dump = load_dump(path)
    assert dump.metadata["note"] == f"captured on ValueError: {LUT_ERROR}"
    assert dump.metadata["step"] == "1"
    assert "inputs saved to" in result.stderr


@pytest.mark.slow
def test_env_var_with_pth_file_captures_in_a_fresh_process(tmp_path: Path) -> None:
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "kvcanary-capture.pth").write_text("import kvcanary_cli.capture\n")
    startup = tmp_path / "startup"
    startup.mkdir()
    # site.addsitedir is what processes site-packages' .pth files at start-up
    (startup / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(site_dir)!r})\n")
    dump_dir = tmp_path / "dumps"
    result = _run_child(tmp_path, startup, dump_dir)
    assert result.returncode == 0, result.stderr
    assert len(dumps_in(dump_dir)) == 1


def test_import_without_the_variable_stays_cheap(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != DUMP_DIR_ENV}
    code = (
        "import sys, kvcanary_cli.capture as c\n"
        "heavy = [m for m in ('torch', 'numpy', 'safetensors') if m in sys.modules]\n"
        "hooks = [f for f in sys.meta_path if isinstance(f, c.launcher._InstallOnImport)]\n"
        "print(heavy, hooks)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == "[] []"


def test_dumps_per_process_are_capped(
    tmp_path: Path, stand_in: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVCANARY_DUMP_LIMIT", "2")
    install_sglang_hook(tmp_path, module=stand_in)
    for _ in range(5):
        with pytest.raises(ValueError):
            stand_in.launch_canary_plan_kernels(**plan_kwargs())
    assert len(dumps_in(tmp_path)) == 2


# --- what the server knows besides the call: pool sizes, page size, free lists ---------------


class _Allocator:
    """Shaped like SGLang's paged allocator: `page_size`, `size`, `get_all_free_pages()`."""

    def __init__(self, size: int, page_size: int, free_pages: list[int]) -> None:
        self.size, self.page_size, self._free = size, page_size, free_pages

    def get_all_free_pages(self) -> torch.Tensor:
        return torch.tensor(self._free, dtype=torch.int64)


class _SWAAllocator:
    """Shaped like SGLang's SWATokenToKVPoolAllocator: two sub-allocators, two sizes."""

    def __init__(self, full: _Allocator, swa: _Allocator) -> None:
        self._size_full, self._size_swa, self.page_size = full.size, swa.size, full.page_size
        self.full_attn_allocator, self.swa_attn_allocator = full, swa


class _Pool:
    def __init__(self, req_to_token: torch.Tensor) -> None:
        self.req_to_token = req_to_token


class _Runner:
    def __init__(self, req_to_token: torch.Tensor, allocator: object) -> None:
        self.req_to_token_pool = _Pool(req_to_token)
        self.token_to_kv_pool_allocator = allocator


CANARY_STAND_IN = textwrap.dedent(
    """
    seen = []


    def install_canary(*, server_args, model_runner, token_oracle_manager=None):
        seen.append(model_runner)
        return "manager"
    """
)


def test_install_canary_registers_the_runner_and_dumps_record_the_pools(
    tmp_path: Path, stand_in: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "_RUNNERS", [])
    canary = types.ModuleType("kvcanary_test_canary_api")
    exec(compile(CANARY_STAND_IN, "<stand-in canary api.py>", "exec"), canary.__dict__)
    assert capture.watch_model_runners(canary)
    kwargs = plan_kwargs()
    full = _Allocator(size=60, page_size=4, free_pages=[14, 15])
    runner = _Runner(kwargs["req_to_token"], _SWAAllocator(full, _Allocator(40, 4, [9])))
    assert canary.install_canary(server_args=None, model_runner=runner) == "manager"
    assert canary.seen == [runner]
    install_sglang_hook(tmp_path, module=stand_in)
    with pytest.raises(ValueError, match="outside full_to_swa_index_mapping"):
        stand_in.launch_canary_plan_kernels(**kwargs)
    [path] = dumps_in(tmp_path)
    dump = load_dump(path)
    assert dump.scalar("num_full_slots") == 64 and dump.scalar("num_swa_slots") == 44
    assert dump.scalar("page_size") == 4
    assert dump.free_full_slots is not None and dump.free_swa_slots is not None
    assert dump.free_full_slots.tolist() == list(range(56, 64))
    assert dump.free_swa_slots.tolist() == [36, 37, 38, 39]


def test_captured_truncated_lut_is_diagnosed_with_both_lengths(
    tmp_path: Path, stand_in: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/capture.md's capture path: exactly the lut-out-of-range errors, cause lut-too-short."""
    from typer.testing import CliRunner

    from kvcanary_cli.cli import app

    monkeypatch.setattr(server, "_RUNNERS", [])
    kwargs = plan_kwargs()  # LUT of 65 entries; slot 70 is live
    runner = _Runner(kwargs["req_to_token"], _Allocator(127, 1, [80, 81]))  # the server holds it
    capture.register_model_runner(runner)
    install_sglang_hook(tmp_path, module=stand_in)
    with pytest.raises(ValueError):
        stand_in.launch_canary_plan_kernels(**kwargs)
    [path] = dumps_in(tmp_path)
    result = CliRunner().invoke(app, ["check", str(path), "--format", "json", "-k", "vectorized"])
    assert result.exit_code == 1, result.output
    [dump] = json.loads(result.stdout)["dumps"]
    errors = {f["code"] for f in dump["findings"] if f["severity"] == "error"}
    assert errors == {"lut-out-of-range", "lut-shorter-than-pool"}
    first = dump["diagnosis"][0]
    assert first["cause"] == "lut-too-short" and first["confidence"] == "certain"
    assert "lut_len 65" in first["evidence"]
    assert any(e.startswith("num_full_slots 128") for e in first["evidence"])
    assert dump["recorded_exception_matches"] is True


def test_without_a_runner_the_dump_assumes_and_does_not_accuse(
    tmp_path: Path, stand_in: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No pool size recorded: slot-beyond-pool is info (assumes), never an error."""
    from typer.testing import CliRunner

    from kvcanary_cli.cli import app

    monkeypatch.setattr(server, "_RUNNERS", [])
    install_sglang_hook(tmp_path, module=stand_in)
    with pytest.raises(ValueError):
        stand_in.launch_canary_plan_kernels(**plan_kwargs())
    [path] = dumps_in(tmp_path)
    result = CliRunner().invoke(app, ["check", str(path), "--format", "json", "-k", "vectorized"])
    [dump] = json.loads(result.stdout)["dumps"]
    beyond = [f for f in dump["findings"] if f["code"] == "slot-beyond-pool"]
    assert beyond and all(f["severity"] == "info" for f in beyond)
    assert all(f["assumes"] == ["num_full_slots"] for f in beyond)
    errors = {f["code"] for f in dump["findings"] if f["severity"] == "error"}
    assert errors == {"lut-out-of-range"}
    [assumption] = dump["assumptions"]
    assert (
        assumption["scalar"] == "num_full_slots"
        and "--set num_full_slots=N" in assumption["advice"]
    )
    # One slot past a LUT of unknown pool: both answers stay on the table, neither certain.
    causes = {c["cause"]: c["confidence"] for c in dump["diagnosis"]}
    assert set(causes) == {"lut-too-short", "slot-index-corrupt"}
    assert sorted(causes.values()) == ["likely", "possible"]


def test_failed_writes_do_not_use_up_the_limit(
    tmp_path: Path, stand_in: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVCANARY_DUMP_LIMIT", "1")
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the dump directory should be")
    install_sglang_hook(blocker, module=stand_in)
    with pytest.raises(ValueError):  # the dump cannot be written: logged, limit untouched
        stand_in.launch_canary_plan_kernels(**plan_kwargs())
    assert store.BUDGET.dumps == 0
    install_sglang_hook(tmp_path / "dumps", module=stand_in)
    with pytest.raises(ValueError):
        stand_in.launch_canary_plan_kernels(**plan_kwargs())
    assert len(dumps_in(tmp_path / "dumps")) == 1


def test_a_dump_directory_with_a_tilde_is_the_home_directory(
    tmp_path: Path, stand_in: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    install_sglang_hook("~/kvc", module=stand_in)
    with pytest.raises(ValueError):
        stand_in.launch_canary_plan_kernels(**plan_kwargs())
    assert len(dumps_in(tmp_path / "kvc")) == 1
    assert not (tmp_path / "~").exists()


def test_restarted_servers_never_replace_an_earlier_dump(
    tmp_path: Path,
    stand_in: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three server runs sharing one dump directory, each PID 1 in its own namespace and
    failing at the same step: three dumps, each run's note intact."""
    monkeypatch.setattr(os, "getpid", lambda: 1)
    install_sglang_hook(tmp_path, module=stand_in)
    for run in range(3):
        monkeypatch.setattr(server, "_calls", itertools.count())  # a fresh process
        monkeypatch.setattr(store, "BUDGET", store.Budget())
        kwargs = plan_kwargs()
        kwargs["req_to_token"][1, 0] = 100 + run  # tells the runs' dumps apart
        with caplog.at_level(logging.WARNING, logger="kvcanary.capture"):
            with pytest.raises(ValueError):
                stand_in.launch_canary_plan_kernels(**kwargs)
    names = [p.name for p in dumps_in(tmp_path)]
    assert names == [
        "kvcanary-rank0-step000000-pid1-2.safetensors",
        "kvcanary-rank0-step000000-pid1.safetensors",
        "kvcanary-rank0-step000000.safetensors",
    ]
    first_slots = sorted(int(_dense(load_dump(tmp_path / n).req_to_token)[1, 0]) for n in names)
    assert first_slots == [100, 101, 102]
    saved = [r.getMessage() for r in caplog.records if "inputs saved" in r.getMessage()]
    assert [s.split("saved to ")[1].split(" ")[0] for s in saved] == [
        str(tmp_path / n) for n in reversed(names)
    ]


# --- triggers: violations, the guard, snapshots, the byte budget -------------------------------


REPORTER_STAND_IN = textwrap.dedent(
    '''
    """Shaped like SGLang 0.5.23's violation reporter: log mode warns, raise mode raises."""


    class ViolationReporter:
        def __init__(self, *, raise_mode, device_state):
            self._raise_mode = raise_mode
            self._device_state = device_state
            self._last_logged_write_index = 0

        def log_or_raise_violation(self, *, outer_step_counter):
            log = self._device_state.violation_log
            valid = min(int(log.violation_write_index[0]), log.violation_ring.shape[0])
            if valid <= self._last_logged_write_index:
                return
            self._last_logged_write_index = valid
            if self._raise_mode:
                raise RuntimeError(f"{valid} violations at step {outer_step_counter}")
    '''
)


def _reporter_module() -> types.ModuleType:
    module = types.ModuleType("kvcanary_test_violation_reporter")
    exec(compile(REPORTER_STAND_IN, "<stand-in violation_reporter.py>", "exec"), module.__dict__)
    return module


def _violation_state(rows: int) -> types.SimpleNamespace:
    ring = torch.zeros(8, 8, dtype=torch.int64)
    ring[:rows, 1] = torch.arange(1, rows + 1)  # slots 1.. (rows of the full HEAD K launch)
    log = types.SimpleNamespace(
        violation_ring=ring, violation_write_index=torch.tensor([rows], dtype=torch.int32)
    )
    return types.SimpleNamespace(violation_log=log)


@pytest.mark.parametrize("raise_mode", [False, True])
def test_a_pump_with_new_violation_rows_leaves_one_dump_in_either_mode(
    raise_mode: bool, tmp_path: Path, stand_in: types.ModuleType
) -> None:
    """The reporter's pump runs unchanged (raise mode still raises its own error); the dump
    holds the last plan call, the ring and write index, and both steps; a pump without new
    rows writes nothing."""
    module = _reporter_module()
    install_sglang_hook(tmp_path, module=stand_in)
    assert capture.watch_violation_reporter(module)
    stand_in.launch_canary_plan_kernels(**plan_kwargs(bad_slot=False))
    state = _violation_state(2)
    reporter = module.ViolationReporter(raise_mode=raise_mode, device_state=state)
    if raise_mode:
        with pytest.raises(RuntimeError, match="2 violations at step 7"):
            reporter.log_or_raise_violation(outer_step_counter=7)
    else:
        assert reporter.log_or_raise_violation(outer_step_counter=7) is None
    reporter.log_or_raise_violation(outer_step_counter=8)  # nothing new: no dump
    [path] = dumps_in(tmp_path)
    assert path.name == "kvcanary-rank0-step000000-violations.safetensors"
    dump = load_dump(path)
    assert dump.identity["note"].startswith("captured on 2 new kv-canary violations (")
    meta = dump.metadata
    assert (meta["violations_pumped_step"], meta["violations_made_step"]) == ("7", "6")
    assert meta["kvcanary.trigger"] == "violations"
    assert dump.violation_ring is not None and dump.violation_ring[:2, 1].tolist() == [1, 2]
    assert dump.violation_write_index == 2
    assert (
        _dense(dump.req_to_token).tolist() == plan_kwargs(bad_slot=False)["req_to_token"].tolist()
    )


def test_the_guard_writes_a_dump_before_a_sliced_lut_launches_then_stays_quiet(
    tmp_path: Path, stand_in: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KVCANARY_GUARD=1: a LUT that no longer ends in -1 is caught at its first launch, from
    its length and last entry alone; the launch then runs (and raises) unchanged, without a
    second dump of that call, and the same LUT is not reported by the guard again (the later
    raising calls leave their usual dumps)."""
    monkeypatch.setenv("KVCANARY_GUARD", "1")
    install_sglang_hook(tmp_path, module=stand_in)
    kwargs = plan_kwargs()
    kwargs["full_to_swa_index_mapping"] = kwargs["full_to_swa_index_mapping"][:60]
    for _ in range(3):
        with pytest.raises(ValueError, match="kv-canary: SWA slot 70"):
            stand_in.launch_canary_plan_kernels(**kwargs)
    assert len(stand_in.calls) == 3  # every launch ran
    names = [p.name for p in dumps_in(tmp_path)]
    assert names == [
        "kvcanary-rank0-step000000-guard.safetensors",
        "kvcanary-rank0-step000001.safetensors",
        "kvcanary-rank0-step000002.safetensors",
    ]
    dump = load_dump(tmp_path / names[0])
    assert "does not end in -1" in dump.identity["note"]
    assert dump.metadata["kvcanary.trigger"] == "guard"
    assert dump.recorded_exception is None  # the guard runs before anything raised
    raised = load_dump(tmp_path / names[1])
    assert raised.recorded_exception is not None
    assert raised.recorded_exception.message.startswith("kv-canary: SWA slot 70")


def test_the_guard_is_off_by_default_and_silent_on_a_good_lut(
    tmp_path: Path, stand_in: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_sglang_hook(tmp_path, module=stand_in)
    kwargs = plan_kwargs(bad_slot=False)
    sliced = dict(kwargs, full_to_swa_index_mapping=kwargs["full_to_swa_index_mapping"][:60])
    stand_in.launch_canary_plan_kernels(**sliced)
    assert dumps_in(tmp_path) == []
    monkeypatch.setenv("KVCANARY_GUARD", "1")
    monkeypatch.setenv("KVCANARY_GUARD_EVERY", "1")
    install_sglang_hook(tmp_path, module=stand_in)
    for _ in range(3):
        stand_in.launch_canary_plan_kernels(**kwargs)
    assert dumps_in(tmp_path) == []


def test_the_window_guard_counts_cells_past_the_lut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KVCANARY_GUARD_EVERY=2: every second launch reads the window cells; slot 70 past a LUT
    of 65 (which still ends in -1) is caught at the next checked launch, not before."""
    monkeypatch.setenv("KVCANARY_GUARD", "1")
    monkeypatch.setenv("KVCANARY_GUARD_EVERY", "2")
    quiet = types.ModuleType("quiet_plan_api")
    setattr(quiet, SGLANG_PLAN_FUNCTION, lambda **kwargs: None)
    install_sglang_hook(tmp_path, module=quiet)
    launch = getattr(quiet, SGLANG_PLAN_FUNCTION)
    launch(**plan_kwargs(bad_slot=False))  # step 0: checked, clean
    launch(**plan_kwargs())  # step 1: not checked
    assert dumps_in(tmp_path) == []
    launch(**plan_kwargs())  # step 2: checked
    [path] = dumps_in(tmp_path)
    assert path.name == "kvcanary-rank0-step000002-guard.safetensors"
    note = load_dump(path).identity["note"]
    assert "1 window cells hold slots the LUT of 65 entries cannot translate" in note


def test_snapshots_every_n_launches_on_a_trigger_file_and_on_a_signal(
    tmp_path: Path, stand_in: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    trigger = tmp_path / "take-one"
    monkeypatch.setenv("KVCANARY_DUMP_EVERY", "3")
    monkeypatch.setenv("KVCANARY_DUMP_TRIGGER", str(trigger))
    monkeypatch.setenv("KVCANARY_DUMP_LIMIT", "10")
    out = tmp_path / "dumps"
    install_sglang_hook(out, module=stand_in)
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        assert triggers.install_signal("USR2")
        for step in range(7):
            if step == 1:
                trigger.write_text("")
            if step == 4:
                os.kill(os.getpid(), signal.SIGUSR2)
            stand_in.launch_canary_plan_kernels(**plan_kwargs(bad_slot=False))
    finally:
        signal.signal(signal.SIGUSR2, previous)
    steps = sorted(int(p.name.split("-step")[1][:6]) for p in dumps_in(out))
    assert steps == [0, 1, 3, 4, 6] and not trigger.exists()
    notes = {load_dump(p).identity["note"] for p in dumps_in(out)}
    assert any("trigger file" in n for n in notes) and any("signal" in n for n in notes)


def test_the_byte_budget_refuses_a_dump_and_says_so(
    tmp_path: Path,
    stand_in: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("KVCANARY_DUMP_MAX_BYTES", "100")
    install_sglang_hook(tmp_path, module=stand_in)
    with caplog.at_level(logging.WARNING, logger="kvcanary.capture"):
        with pytest.raises(ValueError):
            stand_in.launch_canary_plan_kernels(**plan_kwargs())
    assert dumps_in(tmp_path) == []
    assert any("KVCANARY_DUMP_MAX_BYTES" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("KVCANARY_DUMP_MAX_BYTES", "2KiB")
    assert store.read_bytes("KVCANARY_DUMP_MAX_BYTES") == (2048, None)


def test_a_lut_sliced_to_a_growing_length_costs_one_guard_dump(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed's bug slices one LUT to the slots handed out so far, a new length every
    step: the guard reports that storage once, not at every launch."""
    monkeypatch.setenv("KVCANARY_GUARD", "1")
    monkeypatch.setenv("KVCANARY_DUMP_LIMIT", "50")
    quiet = types.ModuleType("quiet_plan_api")
    setattr(quiet, SGLANG_PLAN_FUNCTION, lambda **kwargs: None)
    install_sglang_hook(tmp_path, module=quiet)
    kwargs = plan_kwargs(bad_slot=False)
    lut = kwargs["full_to_swa_index_mapping"]
    for allocated in range(20, 30):
        getattr(quiet, SGLANG_PLAN_FUNCTION)(
            **dict(kwargs, full_to_swa_index_mapping=lut[:allocated])
        )
    assert [p.name for p in dumps_in(tmp_path)] == ["kvcanary-rank0-step000000-guard.safetensors"]


# --- a capture inside a live server: spent budgets, unreadable budgets, bad directories ------


class _CountingAllocator(_Allocator):
    """An allocator that counts the reads of its free list (a device copy and sort on a GPU)."""

    reads = 0

    def get_all_free_pages(self) -> torch.Tensor:
        self.reads += 1
        return super().get_all_free_pages()


def _capture_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The capture's warnings other than the ones naming a dump written."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "kvcanary.capture"
        and r.levelno >= logging.WARNING
        and "saved to" not in r.getMessage()
    ]


def test_a_spent_dump_limit_costs_a_due_trigger_nothing(
    tmp_path: Path,
    stand_in: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Snapshots due at every launch, a raising launch and the guard, with the limit of one
    dump spent by the first: no later free-list read, and one warning in all."""
    monkeypatch.setattr(server, "_RUNNERS", [])
    monkeypatch.setenv("KVCANARY_DUMP_LIMIT", "1")
    monkeypatch.setenv("KVCANARY_DUMP_EVERY", "1")
    monkeypatch.setenv("KVCANARY_GUARD", "1")
    kwargs = plan_kwargs(bad_slot=False)
    # a pool the LUT of 65 entries fits: the guard stays silent
    allocator = _CountingAllocator(size=63, page_size=1, free_pages=[40, 41])
    runner = _Runner(kwargs["req_to_token"], allocator)  # held: the hook holds it weakly
    capture.register_model_runner(runner)
    install_sglang_hook(tmp_path, module=stand_in)
    with caplog.at_level(logging.DEBUG, logger="kvcanary.capture"):
        for _ in range(6):
            stand_in.launch_canary_plan_kernels(**kwargs)
        for _ in range(2):
            with pytest.raises(ValueError, match="kv-canary: SWA slot 70"):
                stand_in.launch_canary_plan_kernels(**plan_kwargs())
    assert [p.name for p in dumps_in(tmp_path)] == [
        "kvcanary-rank0-step000000-snapshot.safetensors"
    ]
    assert allocator.reads == 1  # the one dump's
    [warning] = _capture_warnings(caplog)
    assert "dump limit of 1 is reached" in warning and "KVCANARY_DUMP_LIMIT" in warning


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("KVCANARY_DUMP_LIMIT", "1.0"),
        ("KVCANARY_DUMP_LIMIT", "one"),
        ("KVCANARY_DUMP_LIMIT", "-1"),
        ("KVCANARY_DUMP_LIMIT", "0x10"),
        ("KVCANARY_DUMP_MAX_BYTES", "0.5K"),
        ("KVCANARY_DUMP_MAX_BYTES", "1e2"),
        ("KVCANARY_DUMP_MAX_BYTES", "0x10"),
        ("KVCANARY_DUMP_MAX_BYTES", "-5G"),
    ],
)
def test_an_unreadable_budget_disarms_capture_in_one_log_line(
    name: str,
    value: str,
    tmp_path: Path,
    stand_in: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Never the defaults (4 dumps, 16 GiB): no dump at all, one line naming the variable."""
    monkeypatch.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="kvcanary.capture"):
        install_sglang_hook(tmp_path, module=stand_in)
        for _ in range(3):
            with pytest.raises(ValueError, match="kv-canary: SWA slot 70"):
                stand_in.launch_canary_plan_kernels(**plan_kwargs())
    assert dumps_in(tmp_path) == []
    [warning] = _capture_warnings(caplog)
    assert f"{name}={value!r}" in warning and "disarmed" in warning


def test_an_unreadable_snapshot_count_turns_that_trigger_off_and_says_so(
    tmp_path: Path,
    stand_in: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("KVCANARY_DUMP_EVERY", "1.0")
    with caplog.at_level(logging.WARNING, logger="kvcanary.capture"):
        install_sglang_hook(tmp_path, module=stand_in)
        for _ in range(3):
            stand_in.launch_canary_plan_kernels(**plan_kwargs(bad_slot=False))
        with pytest.raises(ValueError):
            stand_in.launch_canary_plan_kernels(**plan_kwargs())
    assert [p.name for p in dumps_in(tmp_path)] == ["kvcanary-rank0-step000003.safetensors"]
    [warning] = _capture_warnings(caplog)
    assert "KVCANARY_DUMP_EVERY='1.0' is not a count" in warning


@pytest.mark.parametrize(
    ("value", "expected"),
    [("4096", 4096), ("4096B", 4096), ("2KiB", 2048), ("512m", 512 << 20), ("16GB", 16 << 30)],
)
def test_byte_counts_in_the_documented_grammar(
    value: str, expected: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVCANARY_DUMP_MAX_BYTES", value)
    assert store.read_bytes("KVCANARY_DUMP_MAX_BYTES") == (expected, None)


def test_a_dump_directory_that_cannot_be_written_is_left_alone_for_a_growing_pause(
    tmp_path: Path, stand_in: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Due at every launch: the first failure pauses the directory (no free-list read while it
    lasts), a retry after it fails again and doubles it, and once the directory can be
    written the next due launch writes, the failures having used up nothing."""
    monkeypatch.setattr(server, "_RUNNERS", [])
    monkeypatch.setenv("KVCANARY_DUMP_EVERY", "1")
    monkeypatch.setenv("KVCANARY_DUMP_LIMIT", "1")
    now = [100.0]
    monkeypatch.setattr(store, "_clock", lambda: now[0])
    kwargs = plan_kwargs(bad_slot=False)
    allocator = _CountingAllocator(size=127, page_size=1, free_pages=[80, 81])
    runner = _Runner(kwargs["req_to_token"], allocator)  # held: the hook holds it weakly
    capture.register_model_runner(runner)
    blocked = tmp_path / "dumps"
    blocked.write_text("a file where the dump directory should be")
    install_sglang_hook(blocked, module=stand_in)

    def launches(count: int) -> None:
        for _ in range(count):
            stand_in.launch_canary_plan_kernels(**kwargs)

    launches(5)
    assert allocator.reads <= 1 and store.BUDGET.dumps == 0
    now[0] += 1.5  # past the first pause (1 s): one retry, which fails and pauses 2 s
    launches(5)
    assert allocator.reads <= 2 and store.BUDGET.dumps == 0
    now[0] += 1.5
    launches(3)
    assert allocator.reads <= 2
    blocked.unlink()
    now[0] += 1.0  # past the second pause
    launches(3)
    assert [p.name for p in dumps_in(blocked)] == ["kvcanary-rank0-step000013-snapshot.safetensors"]
    assert store.BUDGET.dumps == 1


def test_losing_the_trigger_file_race_leaves_the_trigger_armed(
    tmp_path: Path, stand_in: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another rank removes the file between this rank's look and its unlink: this rank still
    takes that snapshot, and the next trigger file is taken too."""
    trigger = tmp_path / "take-one"
    monkeypatch.setenv("KVCANARY_DUMP_TRIGGER", str(trigger))
    out = tmp_path / "dumps"
    install_sglang_hook(out, module=stand_in)
    unlink = Path.unlink

    def another_rank_first(self: Path, missing_ok: bool = False) -> None:
        if self == trigger:
            os.remove(self)  # the other rank's unlink
        unlink(self, missing_ok=missing_ok)

    trigger.write_text("")
    with monkeypatch.context() as racing:
        racing.setattr(Path, "unlink", another_rank_first)
        stand_in.launch_canary_plan_kernels(**plan_kwargs(bad_slot=False))  # step 0
    stand_in.launch_canary_plan_kernels(**plan_kwargs(bad_slot=False))  # step 1: no file
    trigger.write_text("")
    stand_in.launch_canary_plan_kernels(**plan_kwargs(bad_slot=False))  # step 2
    steps = [int(p.name.split("-step")[1][:6]) for p in dumps_in(out)]
    assert steps == [0, 2] and not trigger.exists()


# --- releases before 0.5.20: free lists without get_all_free_pages() -------------------------


class _AllocatorBefore0520:
    """Shaped like 0.5.13 .. 0.5.19's allocators (their `allocator/base.py`): free pages in
    `free_pages`, frees staged in `release_pages` until the next merge; no census method."""

    def __init__(self, size: int, page_size: int, free: list[int], staged: list[int]) -> None:
        self.size, self.page_size = size, page_size
        self.free_pages = torch.tensor(free, dtype=torch.int64)
        self.release_pages = torch.tensor(staged, dtype=torch.int64)


def test_free_lists_of_a_release_before_0_5_20_are_recorded_with_the_staged_pages(
    tmp_path: Path, stand_in: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "_RUNNERS", [])
    kwargs = plan_kwargs()
    full = _AllocatorBefore0520(size=60, page_size=4, free=[14], staged=[12])
    swa = _AllocatorBefore0520(size=40, page_size=4, free=[9], staged=[])
    runner = _Runner(kwargs["req_to_token"], _SWAAllocator(full, swa))  # type: ignore[arg-type]
    capture.register_model_runner(runner)
    install_sglang_hook(tmp_path, module=stand_in)
    with pytest.raises(ValueError):
        stand_in.launch_canary_plan_kernels(**kwargs)
    dump = load_dump(dumps_in(tmp_path)[0])
    assert dump.free_full_slots is not None and dump.free_swa_slots is not None
    assert dump.free_full_slots.tolist() == [*range(48, 52), *range(56, 60)]
    assert dump.free_swa_slots.tolist() == [36, 37, 38, 39]


def test_a_dump_records_the_serving_release(
    tmp_path: Path, stand_in: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "_VERSION", [])
    monkeypatch.setitem(sys.modules, "sglang.version", types.SimpleNamespace(__version__="0.5.16"))
    install_sglang_hook(tmp_path, module=stand_in)
    with pytest.raises(ValueError):
        stand_in.launch_canary_plan_kernels(**plan_kwargs())
    dump = load_dump(dumps_in(tmp_path)[0])
    assert dump.metadata["sglang.version"] == "0.5.16"
    assert not [n for n in dump.notes if "SGLang" in n]
