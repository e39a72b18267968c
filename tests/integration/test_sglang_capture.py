"""The capture hook inside SGLang 0.5.23's real module structure.

The wheel's `plan` package, `kernel_launcher` and `violation_reporter` (with what they import;
tests/sglang_wheel.py stubs the server-wide package levels) are imported the way a server
imports them, after the hook is armed as a `sitecustomize` arms it. On the CPU SGLang's
launcher runs its torch reference, which raises on a bad LUT; the canary state is CPU tensors.
Each trigger's dump is then checked. Skipped without the cached wheel.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kvcanary_cli.analysis.check import run_check
from kvcanary_cli.capture import DUMP_DIR_ENV, install_from_env, launcher, server, store, triggers
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.synth.scenarios import make_scenario
from tests.helpers import VECTORIZED
from tests.sglang_standin import installed
from tests.sglang_wheel import MISSING_WHEEL, extract_canary_runner, wheel_path

WHEEL = wheel_path()

pytestmark = pytest.mark.skipif(WHEEL is None, reason=MISSING_WHEEL)

_RUNNER = "sglang.srt.kv_canary."


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert WHEEL is not None
    return extract_canary_runner(WHEEL, tmp_path_factory.mktemp("sglang-runner"))


@pytest.fixture
def sglang(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[types.SimpleNamespace]:
    """A fresh process's hook armed by `KVCANARY_DUMP_DIR`, then SGLang's modules imported."""
    monkeypatch.setenv(DUMP_DIR_ENV, str(tmp_path / "dumps"))
    for name in ("RANK", "LOCAL_RANK", "KVCANARY_DUMP_LIMIT", "KVCANARY_DUMP_EVERY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(store, "BUDGET", store.Budget())
    monkeypatch.setattr(triggers, "GUARD", triggers.Guard())
    monkeypatch.setattr(triggers, "_SETTINGS", [triggers.Settings()])
    monkeypatch.setattr(server, "_LAST", {})
    monkeypatch.setattr(server, "_RUNNERS", [])
    monkeypatch.setattr(server, "_MANAGERS", [])
    monkeypatch.setattr(server, "_calls", itertools.count())
    with installed(monkeypatch, tree):
        before = list(sys.meta_path)
        try:
            assert install_from_env()
            modules = types.SimpleNamespace(
                kernel_launcher=importlib.import_module(_RUNNER + "runner.kernel_launcher"),
                reporter=importlib.import_module(_RUNNER + "runner.violation_reporter"),
                plan=importlib.import_module("sglang.kernels.ops.kv_canary.plan"),
                plan_api=importlib.import_module("sglang.kernels.ops.kv_canary.plan.api"),
                verify=importlib.import_module("sglang.kernels.ops.kv_canary.verify"),
                write=importlib.import_module("sglang.kernels.ops.kv_canary.write"),
                consts=importlib.import_module("sglang.kernels.ops.kv_canary.consts"),
                buffers=importlib.import_module(_RUNNER + "buffer_group"),
                plan_input=importlib.import_module(_RUNNER + "plan_input"),
                state=importlib.import_module(_RUNNER + "state"),
                config=importlib.import_module(_RUNNER + "config"),
                dumps=tmp_path / "dumps",
            )
            yield modules
        finally:
            sys.meta_path[:] = [f for f in sys.meta_path if f in before]


def test_the_launcher_binding_kernel_launcher_uses_and_the_reporter_are_wrapped(
    sglang: types.SimpleNamespace,
) -> None:
    bound = sglang.kernel_launcher.launch_canary_plan_kernels
    assert hasattr(bound, server.ORIGINAL_ATTR)
    assert (
        bound
        is sglang.plan.launch_canary_plan_kernels
        is sglang.plan_api.launch_canary_plan_kernels
    )
    pump = sglang.reporter.ViolationReporter.log_or_raise_violation
    assert hasattr(pump, server.ORIGINAL_ATTR)


def _tensor(value: Any) -> Any:
    return torch.from_numpy(value.copy()) if hasattr(value, "dtype") else value


class _Manager:
    """What the hook reads from SGLang's CanaryManager: buffer groups, device state, table."""

    def __init__(self, groups: tuple[Any, ...], device_state: Any, table: torch.Tensor) -> None:
        self._buffer_groups = groups
        self._device_state = device_state
        self._req_to_token_pool = types.SimpleNamespace(req_to_token=table)


def _plan(sglang: types.SimpleNamespace, name: str, *, lut_entries: int | None = None) -> Any:
    """Run `kernel_launcher.invoke_plan` on a synth scenario's state, as the runner does each
    step; returns (the scenario, its tensors, the buffer group)."""
    scenario = make_scenario(name, seed=0)
    t = {key: _tensor(value) for key, value in scenario.tensors.items()}
    lut = t.get("full_to_swa_index_mapping")
    if lut is not None and lut_entries is not None:
        lut = lut[:lut_entries]
    kind = sglang.buffers.PoolKind.SWA if lut is not None else sglang.buffers.PoolKind.FULL
    group = sglang.buffers.CanaryBufferGroup(
        kind=kind,
        k_head=t.get("canary.full.head.k"),
        k_tail=t.get("canary.full.tail.k"),
        v_head=None,
        v_tail=None,
        real_kv_sources_k=(),
        real_kv_sources_v=(),
        swa_index_lut=lut,
        kv_token_id_vs_position_offset=0,
    )
    bs = t["req_pool_indices"].shape[0]
    plan_input = sglang.plan_input.PlanInput(
        req_pool_indices=t["req_pool_indices"],
        prefix_lens=t["prefix_lens"],
        extend_seq_lens=t["extend_seq_lens"],
        req_to_verify_expected_tokens_valid_lens=t.get(
            "req_to_verify_expected_tokens_valid_lens", torch.zeros(bs, dtype=torch.int64)
        ),
    )
    cpu = torch.device("cpu")
    sglang.kernel_launcher.invoke_plan(
        plan_input=plan_input,
        verify_plan=sglang.verify.VerifyPlan.allocate(verify_capacity=1 << 12, device=cpu),
        write_plan=sglang.write.WritePlan.allocate(
            write_req_capacity=int(scenario.metadata["write_req_capacity"]), device=cpu
        ),
        group=group,
        req_to_token=t["req_to_token"],
        swa_window_size=int(scenario.metadata.get("swa_window_size", 0)),
        req_to_verify_expected_tokens=t.get("req_to_verify_expected_tokens"),
    )
    return scenario, t, group


def _first_cause(path: Path) -> tuple[str, set[str]]:
    report = run_check(load_dump(path), planner=VECTORIZED, kernel=None)
    return report.diagnosis[0].code.value, {f.code.value for f in report.findings}


@pytest.mark.parametrize("mode", ["log", "raise"])
def test_violations_pumped_by_sglangs_reporter_leave_a_dump_that_explains_them(
    sglang: types.SimpleNamespace, mode: str
) -> None:
    """A CPU violation ring with the rows of two aliased requests: the real reporter logs
    them (log mode) or raises (raise mode) as it would, and the dump taken at that pump names
    the aliasing and replays the records."""
    scenario, t, group = _plan(sglang, "canary-aliasing")
    log = sglang.state.ViolationLog(
        violation_ring=t["violation_ring"], violation_write_index=t["violation_write_index"]
    )
    device_state = types.SimpleNamespace(violation_log=log)
    manager = _Manager((group,), device_state, t["req_to_token"])  # held, as the runner does
    server.register_canary_manager(manager)
    config = sglang.config.CanaryConfig(
        mode=sglang.config.CanaryMode(mode),
        ring_capacity=int(t["violation_ring"].shape[0]),
        sweep_interval=0,
        real_kv_hash_mode=sglang.consts.RealKvHashMode.NONE,
        enable_write_input_assert=False,
        enable_verify_token_assert=False,
        stats_print_every_n_steps=0,
    )
    reporter = sglang.reporter.ViolationReporter(config=config, device_state=device_state)
    if mode == "raise":
        with pytest.raises(RuntimeError, match="kv_canary violation"):
            reporter.log_or_raise_violation(outer_step_counter=1235)
    else:
        reporter.log_or_raise_violation(outer_step_counter=1235)
    [path] = sorted(sglang.dumps.glob("*-violations.safetensors"))
    dump = load_dump(path)
    assert dump.metadata["violations_pumped_step"] == "1235"
    assert dump.canary_buffers and dump.violation_write_index == int(t["violation_write_index"])
    cause, codes = _first_cause(path)
    assert cause == scenario.metadata["kvcanary.expected_diagnosis"]
    assert {"slot-shared-across-positions", "canary-chain-break"} <= codes


def test_the_guard_fires_on_a_sliced_lut_before_sglangs_planner_runs(
    sglang: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KVCANARY_GUARD=1 and the seed's bug (the LUT sliced to the slots handed out): the dump
    is written from the LUT's last entry before the launch; SGLang's torch reference then
    raises as it always did, and that call leaves no second dump."""
    monkeypatch.setenv("KVCANARY_GUARD", "1")
    launcher.install_sglang_hook(sglang.dumps, module=sglang.plan_api)
    scenario = make_scenario("truncated-lut", seed=0)
    entries = int(scenario.tensors["full_to_swa_index_mapping"].shape[0])
    calls: list[int] = []
    original = getattr(sglang.plan_api.launch_canary_plan_kernels, server.ORIGINAL_ATTR)

    def counted(**kwargs: Any) -> Any:
        calls.append(len(list(sglang.dumps.glob("*-guard.safetensors"))))
        return original(**kwargs)

    monkeypatch.setattr(sglang.plan_api.launch_canary_plan_kernels, server.ORIGINAL_ATTR, counted)
    launcher.install_sglang_hook(sglang.dumps, module=sglang.plan_api)
    with pytest.raises(ValueError, match="outside full_to_swa_index_mapping length"):
        _plan(sglang, "truncated-lut", lut_entries=entries)
    assert calls == [1]  # the guard's dump existed when SGLang's planner ran
    [path] = sorted(sglang.dumps.glob("*.safetensors"))
    assert path.name.endswith("-guard.safetensors")
    cause, codes = _first_cause(path)
    assert cause == "lut-too-short" and "lut-out-of-range" in codes


def test_a_snapshot_of_a_clean_step_checks_clean(
    sglang: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVCANARY_DUMP_EVERY", "1")
    launcher.install_sglang_hook(sglang.dumps, module=sglang.plan_api)
    _plan(sglang, "clean-swa")
    [path] = sorted(sglang.dumps.glob("*-snapshot.safetensors"))
    report = run_check(load_dump(path), planner=VECTORIZED, kernel=None)
    assert report.findings == ()
