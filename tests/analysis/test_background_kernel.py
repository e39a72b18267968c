"""`run_check` plans the kernel on a spare core while it runs the detectors: the report must be
the one planning in turn gives, on every scenario (findings, their order, diagnosis, groups)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from kvcanary_cli.analysis import check
from kvcanary_cli.analysis.check import run_check
from kvcanary_cli.synth.scenarios import SCENARIOS, make_scenario
from tests.analysis.conftest import LoadSynth
from tests.helpers import TRITON, VECTORIZED
from tests.lanes import DEEP

#: The suite's scenarios (a clean one, the kernel's raise, a stale tail, the canary): the
#: background path is one path; the deep lane runs it on every scenario.
FAST_SCENARIOS = {"clean-swa", "truncated-lut", "stale-tail", "canary-aliasing"}


@pytest.mark.parametrize(
    "scenario",
    [
        pytest.param(name, marks=[] if name in FAST_SCENARIOS else DEEP)
        for name in sorted(SCENARIOS)
    ],
)
def test_the_kernel_in_the_background_changes_nothing(
    scenario: str, load_synth: LoadSynth, monkeypatch: pytest.MonkeyPatch
) -> None:
    dump = load_synth(make_scenario(scenario, seed=1))
    monkeypatch.setattr(check, "_spare_core", lambda: False)
    in_turn = run_check(dump, planner=VECTORIZED, kernel=TRITON)
    monkeypatch.setattr(check, "_spare_core", lambda: True)
    background = run_check(dump, planner=VECTORIZED, kernel=TRITON)
    assert background == in_turn


def test_a_kernel_that_fails_in_the_background_fails_the_check(
    load_synth: LoadSynth, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Broken(type(TRITON)):  # type: ignore[misc]
        def plan(self, dump, group):  # type: ignore[no-untyped-def]
            raise RuntimeError(f"kernel broke on {group}")

    monkeypatch.setattr(check, "_spare_core", lambda: True)
    dump = load_synth(make_scenario("truncated-lut", seed=0))
    with pytest.raises(RuntimeError, match="kernel broke on full"):
        run_check(dump, planner=VECTORIZED, kernel=Broken())


@pytest.mark.parametrize(("mode", "background"), [("interpreter", True), ("compiled", False)])
def test_only_a_kernel_on_the_host_plans_in_the_background(
    mode: str, background: bool, load_synth: LoadSynth, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Kernel(type(TRITON)):  # type: ignore[misc]
        @property
        def mode(self) -> str:
            return mode

    threads: list[int] = []
    real = ThreadPoolExecutor

    def counted(workers: int) -> object:
        threads.append(workers)
        return real(workers)

    monkeypatch.setattr(check, "_spare_core", lambda: True)
    monkeypatch.setattr(check, "ThreadPoolExecutor", counted)
    dump = load_synth(make_scenario("clean-swa", seed=0))
    run_check(dump, planner=VECTORIZED, kernel=Kernel() if mode == "compiled" else TRITON)
    assert bool(threads) is background
