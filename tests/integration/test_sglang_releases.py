"""kvcanary against every release with kv canary, 0.5.13 to 0.5.23, each from its own release
wheel (fetched like the 0.5.23 wheel; a release whose wheel is not cached is skipped).

The releases keep kv canary under two package paths (`jit_kernel` before 0.5.17) and differ in
what their launcher does off CUDA; the planner semantics are one. So on each release:
`--kernel sglang` finds the launcher in that release's layout, calls its torch reference
(directly before 0.5.21, where the launcher would run the device kernels on the CPU), and
agrees with kvcanary's model on every scenario; and the capture hook finds the launcher, dumps
a raising call and stamps the release in the dump. The releases tested here are the ones
`selftest` says kvcanary's model was verified on.
"""

from __future__ import annotations

import importlib
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kvcanary_cli.analysis.check import run_check
from kvcanary_cli.analysis.selftest import run_selftest
from kvcanary_cli.capture import DUMP_DIR_ENV, install_from_env, server, store, triggers
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.dump.releases import parse_release
from kvcanary_cli.planners import make_selftest_planners
from kvcanary_cli.planners.sglang_planner import SGLangPlanner
from kvcanary_cli.planners.sglang_runtime import VERIFIED_VERSIONS, load_launcher
from tests.helpers import VECTORIZED
from tests.lanes import DEEP
from tests.sglang_standin import forget_sglang
from tests.sglang_wheel import (
    RELEASES,
    WHEEL_VERSION,
    extract_release,
    launcher_modules,
    missing_wheel,
    wheel_path,
)
from tests.shared_plans import sharing_triton_plans

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = (*RELEASES, WHEEL_VERSION)


def _release(version: str, *marks: pytest.MarkDecorator) -> pytest.param:  # type: ignore[valid-type]
    wheel = wheel_path(version)
    return pytest.param(
        version,
        marks=[pytest.mark.skipif(wheel is None, reason=missing_wheel(version)), *marks],
    )


@pytest.fixture(
    params=[_release(v) for v in VERSIONS],
    scope="module",
)
def release(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One release's kv-canary modules first on sys.path for the test."""
    version: str = request.param
    wheel = wheel_path(version)
    assert wheel is not None
    root = extract_release(wheel, tmp_path_factory.mktemp(f"sglang-{version}"), version)
    forget_sglang()
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        yield version
    forget_sglang()


def test_the_releases_said_verified_are_the_ones_tested_here() -> None:
    assert VERIFIED_VERSIONS == VERSIONS


def _before(version: str, release: tuple[int, int, int]) -> bool:
    parsed = parse_release(version)
    assert parsed is not None
    return parsed < release


def test_the_launcher_is_found_in_the_releases_layout(release: str) -> None:
    launcher = load_launcher()
    assert launcher.version == release
    old_layout = _before(release, (0, 5, 17))
    assert launcher.package == (
        "sglang.jit_kernel.kv_canary" if old_layout else "sglang.kernels.ops.kv_canary"
    )
    # before 0.5.21 the launcher would run Triton and JIT CUDA on the CPU: the reference is
    # called directly; from 0.5.21 the launcher dispatches to it by itself
    direct = _before(release, (0, 5, 21))
    assert launcher.direct_reference is direct
    assert launcher.where.endswith(
        "plan_ref:launch_canary_plan_kernels_torch_reference"
        if direct
        else "plan.api:launch_canary_plan_kernels"
    )


def test_kernel_sglang_agrees_and_raises_the_seeds_error(release: str) -> None:
    """The seed's truncated LUT raises the same text in every release, kvcanary's first raise;
    a clean state plans identically (no kernel-divergence)."""
    clean = load_dump(ROOT / "examples" / "clean-swa.safetensors")
    report = run_check(clean, planner=VECTORIZED, kernel=SGLangPlanner())
    assert not [f for f in report.findings if f.code == "kernel-divergence"]
    assert all(g.kernel_launch_error is None for g in report.groups)
    bad = load_dump(ROOT / "examples" / "truncated-lut.safetensors")
    report = run_check(bad, planner=VECTORIZED, kernel=SGLangPlanner())
    assert not [f for f in report.findings if f.code == "kernel-divergence"]
    raised = {g.group: g.kernel_launch_error for g in report.groups if g.kernel_launch_error}
    assert raised == {
        "swa": "kv-canary: SWA slot 107 is outside full_to_swa_index_mapping length 107"
    }


#: Releases whose plan launcher ships byte for byte an earlier release's modules (by the
#: release whose modules they are; `test_a_repeated_release_ships_its_twins_plan_code`
#: checks it): their selftest asks the earlier one's question again, in the deep lane.
REPEATED_PLAN_CODE = {
    "0.5.13.post1": "0.5.13",
    **dict.fromkeys(("0.5.15", "0.5.15.post1", "0.5.16"), "0.5.14"),
    **dict.fromkeys(("0.5.18", "0.5.19"), "0.5.17"),
    "0.5.23": "0.5.22",
}


@pytest.mark.parametrize("version", sorted(REPEATED_PLAN_CODE))
def test_a_repeated_release_ships_its_twins_plan_code(version: str) -> None:
    twin = REPEATED_PLAN_CODE[version]
    wheel, twins = wheel_path(version), wheel_path(twin)
    if wheel is None or twins is None:
        pytest.skip(missing_wheel(version if wheel is None else twin))
    ours = launcher_modules(wheel)
    assert ours and ours == launcher_modules(twins)


@pytest.mark.parametrize(
    "release",
    [
        # the suite runs each release's plan code once (every scenario through three
        # planners, Triton's plans shared by the releases: 0.5 s each, and 3 s to unpack a
        # release), the deep lane the releases that repeat it
        _release(v, *(DEEP if v in REPEATED_PLAN_CODE else (pytest.mark.slow,)))
        for v in VERSIONS
    ],
    indirect=True,
)
def test_selftest_sglang_agrees(release: str) -> None:
    baselines, planners = make_selftest_planners(sglang=True)
    report = run_selftest(
        baselines, sharing_triton_plans(planners), kvcanary_version="test", sglang_installed=release
    )
    assert report.verdict == "agree", report.summary


def test_the_hook_finds_the_launcher_and_stamps_the_release(
    release: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Armed as a `sitecustomize` arms it, before SGLang loads: the launcher's module (in
    either layout) is wrapped on import, and a call that raises leaves a dump recording the
    release, read without a release note."""
    monkeypatch.setenv(DUMP_DIR_ENV, str(tmp_path / "dumps"))
    monkeypatch.setattr(store, "BUDGET", store.Budget())
    monkeypatch.setattr(triggers, "_SETTINGS", [triggers.Settings()])
    monkeypatch.setattr(server, "_LAST", {})
    monkeypatch.setattr(server, "_VERSION", [])
    monkeypatch.setattr(server, "_calls", itertools.count())
    before = list(sys.meta_path)
    try:
        assert install_from_env()
        launcher = load_launcher()
        api = importlib.import_module(launcher.package + ".plan.api")
        wrapped = api.launch_canary_plan_kernels
        assert hasattr(wrapped, server.ORIGINAL_ATTR)
        cpu = torch.device("cpu")
        verify = launcher.verify_plan.allocate(verify_capacity=8, device=cpu)
        write = launcher.write_plan.allocate(write_req_capacity=2, device=cpu)
        with pytest.raises(ValueError, match="requires full_to_swa_index_mapping"):
            wrapped(
                req_pool_indices=torch.tensor([1]),
                prefix_lens=torch.tensor([2]),
                extend_seq_lens=torch.tensor([1]),
                req_to_token=torch.zeros(2, 8, dtype=torch.int32),
                swa_window_size=4,
                full_to_swa_index_mapping=None,
                verify_capacity=8,
                req_to_verify_expected_tokens=None,
                req_to_verify_expected_tokens_valid_lens=None,
                kv_token_id_vs_position_offset=0,
                verify_plan_out=verify,
                write_plan_out=write,
            )
    finally:
        sys.meta_path[:] = before
    [path] = sorted((tmp_path / "dumps").glob("*.safetensors"))
    dump = load_dump(path)
    assert dump.metadata["sglang.version"] == release
    assert not [n for n in dump.notes if "SGLang" in n]
