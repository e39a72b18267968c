"""vLLM 0.33.0's real `KVCacheManager` (from the release wheel, on CPU) under the soak's
workload: clean histories of both models are silent across every audited step, and each
planted fault is found at the step it is planted, naming its block and holders, while vLLM's
own asserts say nothing then (later, or never)."""

from __future__ import annotations

import inspect
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from kvcanary_cli.catalog import PoolCode
from kvcanary_cli.dump.engine import read_arrays
from kvcanary_cli.engines.vllm import check_dump
from kvcanary_cli.soak.vllm_driver import FAULTS, _Scheduler, run_history

#: fault -> the finding it must raise at its step.
EXPECTED = {
    "block-freed-twice": PoolCode.NEGATIVE_REF_COUNT,
    "block-freed-while-held": PoolCode.QUEUED_BLOCK_HELD,
    "leak": PoolCode.REF_COUNT_HIGH,
    "free-count": PoolCode.FREE_COUNT_MISMATCH,
}


@pytest.mark.parametrize("model", ["full", "hybrid", "hybrid-mamba", "hybrid-chunked-local"])
def test_clean_histories_are_silent_at_every_step(vllm: Any, model: str) -> None:
    seen: list[int] = []
    h = run_history(vllm, model, seed=11, steps=150, observe=lambda s: seen.append(s.step))
    assert h.crash is None and h.findings == ()
    assert h.audited == 150
    assert h.prefix_hits > 0
    assert seen == list(range(1, 151))  # handed the scheduler after each step


def test_the_hybrid_models_build_the_group_kinds_they_name(vllm: Any) -> None:
    from kvcanary_cli.engines.vllm.capture import group_specs

    kinds = {}
    for model in ("hybrid-mamba", "hybrid-chunked-local"):
        s = _Scheduler(vllm, model, 0)
        for _ in range(60):
            s.run_step()
        specs = group_specs(s.manager.coordinator.single_type_managers)
        kinds[model] = [(g.kind, g.window) for g in specs]
        state = s.state()
        g1 = state.table_group == 1
        # each drops blocks: the null block stands in its tables
        assert (state.table_block[g1] == state.null_block).any(), model
        # the Mamba group's bound is read from its spec ("align" mode, no checkpoint block)
        assert state.groups[1].max_states == (2 if model == "hybrid-mamba" else None)
    assert kinds == {
        "hybrid-mamba": [("full", None), ("mamba", None)],
        "hybrid-chunked-local": [("full", None), ("chunked_local_attention", 64)],
    }


def test_a_state_left_in_a_real_mamba_table_is_over_its_bound(vllm: Any) -> None:
    from kvcanary_cli.engines.vllm.check import audit

    s = _Scheduler(vllm, "hybrid-mamba", 3)
    manager = s.manager.coordinator.single_type_managers[1]
    for _ in range(200):
        s.run_step()
        assert audit(s.state()).findings == ()
        if tables := _tables_holding(s, manager, 2):
            break
    else:
        pytest.fail("no Mamba table holding two states and a null entry in 200 steps")
    # a state the group should have retired, left in the table (held: the pool is consistent)
    _left_a_state_in(s, tables[0], states=3)
    # tokens in flight (vLLM's async scheduling): a state more per block they reach, the
    # three states within that request's bound, the others' bound unchanged
    request = s.requests[next(rid for rid, t in manager.req_to_blocks.items() if t is tables[0])]
    request.num_in_flight_tokens = 1
    state = s.state()
    assert state.groups[1].max_states == 2
    assert audit(state).findings == ()
    request.num_in_flight_tokens = 0
    assert [f.code for f in audit(s.state()).findings] == [PoolCode.MAMBA_STATES_OVER_BOUND]


def test_async_scheduling_keeps_states_in_flight_and_is_silent(vllm: Any) -> None:
    """Under vLLM's async scheduling (`soak --engine vllm --overlap`) every model's histories
    check clean at each step, tokens in flight; a Mamba table then holds a state beyond the
    bound of a request with none in flight, which the tokens in flight allow."""
    from kvcanary_cli.engines.vllm.check import audit

    for model in ("full", "hybrid", "hybrid-chunked-local"):
        h = run_history(vllm, model, seed=11, steps=150, overlap=True)
        assert h.crash is None and h.findings == (), model
    s = _Scheduler(vllm, "hybrid-mamba", 0, overlap=True)
    beyond = in_flight = settled = 0
    for _ in range(300):
        s.run_step()
        # both steps in flight, then the older one's output processed
        for state in [s.state(), *([s.state()] if s.settle() else [])]:
            settled += 1
            assert audit(state).findings == ()
            assert state.request_num_in_flight is not None
            in_flight += int((state.request_num_in_flight > 0).sum())
            live = state.request_live[state.table_request]
            mamba = (state.table_group == 1) & (state.table_block != state.null_block) & live
            held = np.bincount(state.table_request[mamba], minlength=len(state.request_ids))
            beyond += int((held > state.groups[1].max_states).sum())
    assert in_flight > 0 and beyond > 0 and settled > 300


def test_a_window_freed_on_the_tokens_computed_under_async_scheduling_is_found(
    vllm: Any,
) -> None:
    """Before vLLM's fix (#47282, #47653) a window's blocks were freed on the tokens computed,
    so the step in flight lost blocks its window still read; 0.26.0 on frees on the tokens
    processed. Planted on the real manager (its coordinator told the tokens computed), the
    null block is found in place of a block the step in flight reads, within a few steps;
    the same history as vLLM runs it is silent (`test_async_scheduling_keeps_...`)."""
    from kvcanary_cli.engines.vllm.check import audit

    s = _Scheduler(vllm, "hybrid", 1, overlap=True)
    coordinator = s.manager.coordinator
    real = coordinator.remove_skipped_blocks

    def on_computed(request_id: str, processed: int, *args: Any, **kw: Any) -> None:
        request = s.requests.get(request_id)
        tokens = processed if request is None else max(processed, request.num_computed_tokens)
        real(request_id, tokens, *args, **kw)

    coordinator.remove_skipped_blocks = on_computed
    for _ in range(60):
        s.run_step()
        state = s.state()
        assert state.request_num_stale_in_flight is not None  # (0.27.0 on: the stale share)
        found = audit(state).findings
        if found:
            break
    else:
        pytest.fail("a window freed on the tokens computed went unseen for 60 steps")
    assert [f.code for f in found] == [PoolCode.NULL_BLOCK_MISPLACED]
    assert "in place of a block its window still reads" in found[0].message
    # the pool as a dump without the stale share reads it (0.26.0): not decided
    assert audit(replace(state, request_num_stale_in_flight=None)).findings == ()


def test_speculative_decoding_verifies_drafts_and_every_model_is_silent(vllm: Any) -> None:
    """Under speculative decoding (`soak --engine vllm --speculative-tokens K`) each decode
    step allocates K lookahead slots and verifies K drafts; the rejected ones are taken off
    the tokens computed, as vLLM's scheduler takes them. Every model's histories check clean
    at each step, some drafts accepted and some rejected, and a table holds blocks past its
    request's tokens (the lookahead's)."""
    for model in ("full", "hybrid", "hybrid-chunked-local", "hybrid-mamba"):
        h = run_history(vllm, model, seed=5, steps=150, speculative=3)
        assert h.crash is None and h.findings == (), model
        assert 0 < h.accepted < h.drafted, (model, h.accepted, h.drafted)
    assert _blocks_past_the_tokens(vllm, speculative=3) > 0
    assert _blocks_past_the_tokens(vllm, speculative=0) == 0


def _blocks_past_the_tokens(vllm: Any, *, speculative: int) -> int:
    """Over 60 steps of a full-attention history, the table entries whose block starts past
    its request's tokens."""
    s = _Scheduler(vllm, "full", 0, speculative=speculative)
    past = 0
    for _ in range(60):
        s.run_step()
        state = s.state()
        held = state.request_live[state.table_request] & (state.table_block != state.null_block)
        first = state.table_index * state.groups[0].block_size
        past += int((held & (first >= state.request_num_tokens[state.table_request])).sum())
    return past


def test_a_mamba_table_keeps_a_state_block_per_draft_and_no_more(vllm: Any) -> None:
    """Speculative decoding gives a Mamba group a scratch block per draft token
    (`num_speculative_blocks`): with 3 drafts a table holds up to 2 + 3 state blocks, which
    the capture's bound says, and tables reach it (past the bound without drafts); a state
    left beyond it is found."""
    from kvcanary_cli.engines.vllm.check import audit

    s = _Scheduler(vllm, "hybrid-mamba", 0, speculative=3)
    manager = s.manager.coordinator.single_type_managers[1]
    reached = 0
    tables: list[Any] = []
    for _ in range(200):
        s.run_step()
        state = s.state()
        assert state.groups[1].max_states == 5 and audit(state).findings == ()
        live = state.request_live[state.table_request]
        mamba = (state.table_group == 1) & (state.table_block != state.null_block) & live
        held = np.bincount(state.table_request[mamba], minlength=len(state.request_ids))
        reached += int((held == 5).sum())
        tables = _tables_holding(s, manager, 5)
        if reached > 20 and tables:
            break
    else:
        pytest.fail("no Mamba table at its bound with a null entry in 200 steps")
    _left_a_state_in(s, tables[0], states=6)


def test_a_running_state_retired_under_drafts_is_found_past_the_scratch_blocks(
    vllm: Any,
) -> None:
    """A drafting request's Mamba table ends with its K scratch blocks, the running state
    just before them: over a real history that entry is real in every live table, and the
    dump records K. A manager that retires the running state with the states before it
    (freed and nulled, the scratch blocks still real) is named."""
    from kvcanary_cli.engines.vllm.check import audit

    s = _Scheduler(vllm, "hybrid-mamba", 1, speculative=3)
    manager = s.manager.coordinator.single_type_managers[1]
    tables = 0
    for _ in range(40):
        s.run_step()
        state = s.state()
        assert state.groups[1].speculative_blocks == 3 and audit(state).findings == ()
        live = [t for rid, t in manager.req_to_blocks.items() if rid in s.requests and t]
        assert all(len(t) > 3 and not t[-4].is_null for t in live)
        tables += len(live)
    assert tables > 40
    table = next(t for rid, t in manager.req_to_blocks.items() if rid in s.requests and t)
    retired = [b for b in table[:-3] if not b.is_null]
    table[:-3] = [s.manager.block_pool.null_block] * (len(table) - 3)
    s.manager.block_pool.free_blocks(retired)
    [finding] = audit(s.state()).findings
    assert finding.code is PoolCode.NULL_BLOCK_MISPLACED
    assert "every entry of a Mamba table, its scratch blocks aside" in finding.message


def _tables_holding(s: Any, manager: Any, states: int) -> list[Any]:
    """The live requests' Mamba tables holding `states` state blocks, their first entry null."""
    return [
        t
        for rid, t in manager.req_to_blocks.items()
        if rid in s.requests and sum(not b.is_null for b in t) == states and t[0].is_null
    ]


def _left_a_state_in(s: Any, table: Any, *, states: int) -> None:
    """A state block the group should have retired, left in `table` (held: the pool stays
    consistent), is the one finding: the table's `states` blocks over its bound."""
    from kvcanary_cli.engines.vllm.check import audit

    table[0] = s.manager.block_pool.get_new_blocks(1)[0]
    [finding] = audit(s.state()).findings
    assert finding.code is PoolCode.MAMBA_STATES_OVER_BOUND
    assert f"{states} state blocks" in finding.message


def test_a_window_freed_before_its_drafts_are_verified_is_found(vllm: Any) -> None:
    """A manager that frees a window's blocks on the tokens the step will compute, drafts
    included, loses blocks its window reads once drafts are rejected: kvcanary names the null
    block within a few steps, where vLLM's asserts say nothing. Without drafts the same
    manager's histories read clean after each step (the tokens scheduled are all computed):
    only speculative decoding shows it."""
    from kvcanary_cli.engines.vllm.check import audit

    def planted(speculative: int) -> list[Any]:
        s = _Scheduler(vllm, "hybrid", 1, speculative=speculative)
        coordinator = s.manager.coordinator
        real = coordinator.remove_skipped_blocks
        scheduled: dict[str, int] = {}
        allocate = s.manager.allocate_slots

        def allocating(request: Any, want: int, *args: Any, **kw: Any) -> Any:
            scheduled[request.request_id] = want
            return allocate(request, want, *args, **kw)

        def ahead(request_id: str, processed: int, *args: Any, **kw: Any) -> None:
            real(request_id, processed + scheduled.get(request_id, 0), *args, **kw)

        s.manager.allocate_slots = allocating
        coordinator.remove_skipped_blocks = ahead
        for _ in range(100):
            s.run_step()
            if found := audit(s.state()).findings:
                return list(found)
        return []

    found = planted(3)
    assert [f.code for f in found] == [PoolCode.NULL_BLOCK_MISPLACED], found
    assert "in place of a block its window still reads" in found[0].message
    assert planted(0) == []


def test_a_speculative_soaks_reproducer_replays_with_its_drafts(
    vllm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvcanary_cli.cli import app
    from tests.render.record_schema import RECORDS, validate
    from tests.vllm_wheel import wheel_path

    args = ["soak", "--engine", "vllm", "--vllm-tree", str(wheel_path()), "--format", "json"]
    found = CliRunner().invoke(
        app,
        [
            *args,
            *("--speculative-tokens", "2", "--steps", "300", "--fault", "leak"),
            *("--out", str(tmp_path / "o")),
        ],
    )
    assert found.exit_code == 1, found.output
    record = json.loads(found.output)
    assert validate(record, RECORDS[record["schema"]]) == [] and record["speculative_tokens"] == 2
    history = record["histories"][0]
    assert 0 < history["accepted"] < history["drafted"]
    reproducer = Path(record["files"]["reproducer"])
    assert json.loads(reproducer.read_text())["speculative_tokens"] == 2
    replayed = json.loads(CliRunner().invoke(app, [*args, "--replay", str(reproducer)]).output)
    assert replayed["speculative_tokens"] == 2 and replayed["replay"]["reproduced"] is True
    assert replayed["histories"][0]["drafted"] == history["drafted"]
    # a reproducer written before --speculative-tokens (no such key) replays without drafts
    data = json.loads(reproducer.read_text())
    older = tmp_path / "older.json"
    older.write_text(json.dumps({k: v for k, v in data.items() if k != "speculative_tokens"}))
    again = json.loads(CliRunner().invoke(app, [*args, "--replay", str(older)]).output)
    assert again["speculative_tokens"] == 0 and again["histories"][0]["drafted"] == 0
    for value, said in ((-1, "not 0 to 16"), (True, "not 0 to 16"), ("2", "not 0 to 16")):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**data, "speculative_tokens": value}))
        refused = CliRunner().invoke(app, [*args, "--replay", str(bad)])
        assert refused.exit_code == 2 and said in refused.output, refused.output
    # the same workload under async scheduling (a drafting server's default) replays so
    bad.write_text(json.dumps({**data, "overlap": True}))
    both = json.loads(CliRunner().invoke(app, [*args, "--replay", str(bad)]).output)
    assert both["overlap"] is True and both["speculative_tokens"] == 2
    assert 0 < both["histories"][0]["accepted"] < both["histories"][0]["drafted"]


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["--speculative-tokens", "2"], "--speculative-tokens: drives vLLM's speculative"),
        (["--engine", "vllm", "--speculative-tokens", "17"], "17 is above 16 (0 to 16)"),
        (
            ["--engine", "vllm", "--replay", "r.json", "--speculative-tokens", "1"],
            "--overlap and --speculative-tokens",
        ),
    ],
)
def test_speculative_tokens_are_refused_where_not_modelled_in_one_line(
    given: list[str], said: str, tmp_path: Path
) -> None:
    from kvcanary_cli.cli import app

    result = CliRunner().invoke(app, ["soak", *given, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert said in result.output and "Traceback" not in result.output


def test_overlap_is_refused_where_the_manager_counts_no_tokens_in_flight(
    vllm: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from kvcanary_cli.cli import app
    from kvcanary_cli.soak import vllm_driver
    from tests.vllm_wheel import wheel_path

    monkeypatch.setattr(vllm_driver, "counts_tokens_in_flight", lambda modules: False)
    args = ["soak", "--engine", "vllm", "--vllm-tree", str(wheel_path()), "--overlap"]
    result = CliRunner().invoke(app, [*args, "--steps", "5", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    [line] = result.output.splitlines()
    assert line.startswith("error: --overlap: models vLLM's async scheduling where")
    assert "does not count them (drop --overlap" in line


def test_drafts_under_async_scheduling_are_refused_without_the_stale_share(
    vllm: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Before 0.27.0 vLLM's scheduler takes a preempted request's old rejections off its
    new count (no stale share), which soak does not model: one line, exit 2."""
    from kvcanary_cli.cli import app
    from kvcanary_cli.soak import vllm_driver
    from tests.vllm_wheel import wheel_path

    monkeypatch.setattr(vllm_driver, "counts_stale_share", lambda modules: False)
    args = ["soak", "--engine", "vllm", "--vllm-tree", str(wheel_path()), "--overlap"]
    result = CliRunner().invoke(app, [*args, "--steps", "5", "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output  # async scheduling alone runs
    drafting = [*args, "--speculative-tokens", "2", "--steps", "5"]
    result = CliRunner().invoke(app, [*drafting, "--out", str(tmp_path / "o"), "--force"])
    assert result.exit_code == 2, result.output
    [line] = result.output.splitlines()
    assert line.startswith("error: --overlap/--speculative-tokens: models drafts under vLLM's")
    assert "does not count them (drop one of them on this release)" in line


def test_drafts_under_async_scheduling_stay_counted_until_their_step_is_processed(
    vllm: Any,
) -> None:
    """Under async scheduling with drafts (a drafting server's default) vLLM schedules a
    step past the last one's drafts, counted computed until its output is processed, then
    takes the rejected ones off. The manager sees those counts ahead of the tokens; each
    model's pool checks clean at both reads of every step; a preempted request's stale
    rejections never reach its new count."""
    from kvcanary_cli.engines.vllm.check import audit

    preempted = 0
    # (full attention and chunked local attention: the release tests' and soak's own runs)
    for model in ("hybrid", "hybrid-mamba"):
        s = _Scheduler(vllm, model, 3, overlap=True, speculative=3)
        ahead = 0
        for _ in range(120):
            before = s.preemptions
            s.run_step()
            preempted += s.preemptions > before
            for request in s.running:
                behind = s.rejected_in_flight.get(request.request_id, 0)
                # never more computed than its tokens once the rejections are taken off
                assert request.num_computed_tokens - behind <= request.num_tokens
                # (readmitted only once its stale steps drained, as vLLM 0.27.0 on admits)
                assert request.num_stale_output_tokens == 0
                ahead += request.num_computed_tokens > request.num_tokens
            assert audit(s.state()).findings == (), model
            if s.settle():
                assert audit(s.state()).findings == (), model
        assert 0 < s.accepted < s.drafted and ahead > 0, (model, ahead)
    assert preempted > 0  # (the stale rejections' case reached)


def test_an_async_soaks_reproducer_replays_under_async_scheduling(
    vllm: Any, tmp_path: Path
) -> None:
    from kvcanary_cli.cli import app
    from tests.render.record_schema import RECORDS, validate
    from tests.vllm_wheel import wheel_path

    args = ["soak", "--engine", "vllm", "--vllm-tree", str(wheel_path()), "--format", "json"]
    found = CliRunner().invoke(
        app,
        [*args, "--overlap", "--steps", "300", "--fault", "leak", "--out", str(tmp_path / "o")],
    )
    assert found.exit_code == 1, found.output
    record = json.loads(found.output)
    assert validate(record, RECORDS[record["schema"]]) == [] and record["overlap"] is True
    reproducer = Path(record["files"]["reproducer"])
    assert json.loads(reproducer.read_text())["overlap"] is True
    replayed = json.loads(CliRunner().invoke(app, [*args, "--replay", str(reproducer)]).output)
    assert replayed["overlap"] is True and replayed["replay"]["reproduced"] is True
    step = record["histories"][0]["finding_step"]
    assert replayed["histories"][0]["finding_step"] == step
    # a reproducer written before --overlap (no such key) replays synchronously
    older = tmp_path / "older.json"
    older.write_text(
        json.dumps({k: v for k, v in json.loads(reproducer.read_text()).items() if k != "overlap"})
    )
    again = json.loads(CliRunner().invoke(app, [*args, "--replay", str(older)]).output)
    assert again["overlap"] is False
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(reproducer.read_text()), "overlap": "yes"}))
    refused = CliRunner().invoke(app, [*args, "--replay", str(bad)])
    assert refused.exit_code == 2 and "'overlap' not true or false" in refused.output


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (
            ["--engine", "vllm", "--vllm-model", "jamba"],
            "error: --vllm-model: 'jamba' is not a "
            "vLLM model: full, hybrid, hybrid-mamba, hybrid-chunked-local, hybrid-rswa",
        ),
        (
            ["--vllm-model", "hybrid-mamba"],
            "error: --vllm-model: is a vLLM soak option: add --engine vllm",
        ),
        (
            ["--engine", "vllm", "--vllm-model", "full", "--replay", "x.json"],
            "error: --replay: takes the fault, the model and the scheduling from the "
            "reproducer: drop --fault, --vllm-model, --overlap and --speculative-tokens",
        ),
    ],
)
def test_soak_refuses_a_bad_vllm_model_in_one_line(given: list[str], said: str) -> None:
    from kvcanary_cli.cli import app

    result = CliRunner().invoke(app, ["soak", *given])
    assert result.exit_code == 2
    assert result.output.splitlines() == [said]


def test_a_model_the_release_cannot_build_is_one_line(vllm: Any, tmp_path: Path) -> None:
    from kvcanary_cli.errors import OptionError
    from kvcanary_cli.soak.vllm_command import _refuse_unbuildable

    older = replace(vllm, interface=SimpleNamespace(FullAttentionSpec=object))
    with pytest.raises(OptionError, match="cannot build hybrid-mamba"):
        _refuse_unbuildable(older, ("full", "hybrid-mamba"))
    _refuse_unbuildable(vllm, ("full", "hybrid", "hybrid-mamba", "hybrid-chunked-local"))


def test_soak_runs_the_chosen_models_in_turn(vllm: Any, tmp_path: Path) -> None:
    from kvcanary_cli.soak.vllm_command import run_vllm_soak
    from tests.vllm_wheel import wheel_path

    report = run_vllm_soak(
        str(wheel_path()),
        450,
        0,
        None,
        models="hybrid-chunked-local,hybrid-mamba",
        out=tmp_path / "o",
    )
    assert [h.model for h in report.histories] == ["hybrid-chunked-local", "hybrid-mamba"]
    assert all(not h.findings and h.engine_said is None for h in report.histories)


def test_every_fault_has_an_expectation() -> None:
    assert set(EXPECTED) == set(FAULTS)


@pytest.mark.parametrize(
    ("fault", "model"),
    [(f, "full") for f in FAULTS]
    + [("block-freed-twice", "hybrid"), ("block-freed-while-held", "hybrid")],
)
def test_a_planted_fault_is_found_at_the_step_it_happens(vllm: Any, fault: str, model: str) -> None:
    h = run_history(vllm, model, seed=3, steps=80, fault=fault, after_steps=0)
    assert h.fault_step is not None, "the workload gave the fault a place"
    assert h.finding_step == h.fault_step
    assert h.crash is None, "vLLM said nothing at that step"
    top = h.findings[0]
    assert top.code is EXPECTED[fault]
    if top.block is not None:
        assert f"block {top.block}" in top.message
    if fault == "block-freed-while-held":
        assert top.owners and top.holders and top.holders >= 2


def test_soak_engine_vllm_reports_the_fault_and_what_vllm_said(vllm: Any, tmp_path: Path) -> None:
    from kvcanary_cli.cli import app
    from tests.render.record_schema import RECORDS, validate
    from tests.vllm_wheel import wheel_path

    out = tmp_path / "out"
    args = ["soak", "--engine", "vllm", "--vllm-tree", str(wheel_path()), "--format", "json"]
    args += ["--out", str(out)]
    clean = CliRunner().invoke(app, [*args, "--steps", "60"])
    assert clean.exit_code == 0, clean.output
    record = json.loads(clean.output)
    assert record["schema"] == "kvcanary.pool-soak/1" and record["audited"] == 60
    assert validate(record, RECORDS[record["schema"]]) == []
    assert record["files"] == {} and not out.exists()
    found = CliRunner().invoke(app, [*args, "--steps", "300", "--fault", "block-freed-twice"])
    assert found.exit_code == 1, found.output
    record = json.loads(found.output)
    assert validate(record, RECORDS[record["schema"]]) == []
    [history] = record["histories"]
    assert history["finding_step"] == history["fault_step"]
    assert history["findings"][0]["code"] == "negative-ref-count"

    # the failing step's dump and a reproducer, and nothing else
    files = record["files"]
    assert set(files) == {"dump", "reproducer"}
    assert sorted(p.name for p in out.iterdir()) == [
        "soak-dump.safetensors",
        "soak-reproducer.json",
    ]
    stored = read_arrays(files["dump"])
    assert stored.metadata["step"] == str(history["finding_step"])
    [top, *_] = check_dump(stored).findings
    assert (top.code.value, top.block) == ("negative-ref-count", history["findings"][0]["block"])
    reproducer = json.loads(Path(files["reproducer"]).read_text())
    assert reproducer["recorded"] == "negative-ref-count"
    assert reproducer["seed"] == history["seed"] and reproducer["model"] == history["model"]

    # --replay runs it again: the finding comes back at the same step; without the fault not
    replayed = CliRunner().invoke(app, [*args[:-2], "--replay", files["reproducer"]])
    assert replayed.exit_code == 1, replayed.output
    again = json.loads(replayed.output)
    assert validate(again, RECORDS[again["schema"]]) == []
    assert again["replay"]["reproduced"] is True
    assert again["replay"]["recorded_on"] == again["engine_version"] == record["engine_version"]
    assert again["histories"][0]["finding_step"] == history["finding_step"]
    twin = tmp_path / "twin.json"
    twin.write_text(json.dumps({**reproducer, "fault": None, "engine_version": "0.32.0"}))
    clean_twin = CliRunner().invoke(app, [*args[:-2], "--replay", str(twin)])
    assert clean_twin.exit_code == 0, clean_twin.output
    assert json.loads(clean_twin.output)["replay"]["reproduced"] is False
    # the table says the release changed, where a finding that did not come back is read
    table = CliRunner().invoke(app, [*args[:-4], "--replay", str(twin)])
    running = record["engine_version"]
    said = " ".join(table.output.split())  # the terminal's width wraps it
    assert f"(recorded on vllm 0.32.0, replayed on {running})" in said, table.output

    # a second finding does not replace the first without --force
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    again_found = CliRunner().invoke(app, [*args, "--steps", "300", "--fault", "leak"])
    assert again_found.exit_code == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_crash_kvcanary_did_not_audit_keeps_the_assert_hooks_dump(
    vllm: Any, tmp_path: Path
) -> None:
    from kvcanary_cli.soak.vllm_command import _keep

    h = run_history(
        vllm,
        "full",
        3,
        80,
        fault="block-freed-twice",
        audit_every=False,
        assert_dumps=tmp_path / "hook",
    )
    assert h.crash is not None and h.findings == ()
    scheduling = {"overlap": False, "speculative_tokens": 0}
    files = _keep(
        h, 80, "0.33.0", "block-freed-twice", scheduling, tmp_path, tmp_path / "out", False
    )
    assert json.loads(Path(files["reproducer"]).read_text())["recorded"] == "crash AssertionError"
    stored = read_arrays(files["dump"])
    assert stored.metadata["kvcanary.trigger"] == "vllm-assert"
    assert stored.metadata["step"] == str(h.crash.step)


@pytest.mark.parametrize(
    "given",
    [["--page-size", "4"], ["--core", "python"], ["--layout", "swa"], ["--sglang-tree", "x"]],
)
def test_soak_engine_vllm_refuses_sglang_options_in_one_line(given: list[str]) -> None:
    from kvcanary_cli.cli import app

    result = CliRunner().invoke(app, ["soak", "--engine", "vllm", *given])
    assert result.exit_code == 2
    [line] = result.output.splitlines()
    assert line.startswith(f"error: {given[0]}: an SGLang soak option")


def test_soak_refuses_a_vllm_tree_without_engine_vllm() -> None:
    from kvcanary_cli.cli import app

    result = CliRunner().invoke(app, ["soak", "--vllm-tree", "x"])
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        "error: --vllm-tree: is a vLLM soak option: add --engine vllm"
    ]


def test_soak_refuses_an_unknown_engine_in_one_line() -> None:
    from kvcanary_cli.cli import app

    result = CliRunner().invoke(app, ["soak", "--engine", "tgi"])
    assert result.exit_code == 2
    assert "'tgi' is not one of sglang, vllm" in result.output


class _TupleMap:
    """A prefix-cache map of a make kvcanary does not know: a key maps to a tuple of blocks."""

    def __init__(self, *args: object) -> None:
        self._cache: dict[bytes, tuple[Any, ...]] = {}

    def get_one_block(self, key: bytes) -> Any:
        return self._cache.get(key, (None,))[0]

    def contain(self, key: bytes, block_id: int) -> bool:
        return any(b.block_id == block_id for b in self._cache.get(key, ()))

    def insert(self, key: bytes, block: Any) -> None:
        self._cache[key] = (*self._cache.get(key, ()), block)

    def pop(self, key: bytes, block_id: int) -> Any:
        kept = tuple(b for b in self._cache.get(key, ()) if b.block_id != block_id)
        found = [b for b in self._cache.pop(key, ()) if b.block_id == block_id]
        if kept:
            self._cache[key] = kept
        return found[0] if found else None

    def __len__(self) -> int:
        return len(self._cache)


def _no_signature_match(self: Any, request: Any) -> None:
    """`allocate_slots` of a release that takes only the request."""


#: A manager of a make kvcanary does not read or drive -> what the one line says.
OTHER_MAKES = {
    "map": ("BlockHashToBlockMap", _TupleMap, "its prefix-cache map holds a tuple"),
    "method": ("get_computed_blocks", None, "has no attribute 'get_computed_blocks'"),
    "signature": ("allocate_slots", _no_signature_match, "TypeError"),
}


@pytest.mark.parametrize("make", list(OTHER_MAKES))
def test_a_manager_laid_out_otherwise_is_one_line_naming_the_tree(
    vllm: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, make: str
) -> None:
    """Never an internal error, and never "vLLM raised": the error names the tree, exit 2."""
    from kvcanary_cli.cli import app
    from tests.vllm_wheel import wheel_path

    name, replacement, said = OTHER_MAKES[make]
    if make == "map":
        monkeypatch.setattr(vllm.block_pool, name, replacement)
    elif replacement is None:
        monkeypatch.delattr(vllm.manager.KVCacheManager, name)
    else:
        monkeypatch.setattr(vllm.manager.KVCacheManager, name, replacement)
    wheel = str(wheel_path())
    args = ["soak", "--engine", "vllm", "--vllm-tree", wheel, "--steps", "40"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    [line] = result.output.splitlines()
    assert line.startswith(f"error: {wheel} (vLLM {vllm.tree.version}): "), line
    assert not (tmp_path / "out").exists()
    assert said in line and "0.34.0" in line, line


def test_a_prefix_lookup_that_returns_two_values_is_driven_the_same(
    vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before 0.26.0 vLLM's `get_computed_blocks` returns (blocks, hit tokens); from 0.26.0 on
    it adds the shared-prefix boundary, which the workload does not use: the history is the
    same (was: a ValueError, reported as vLLM's crash)."""
    bare = run_history(vllm, "hybrid", 11, 60)
    lookup = vllm.manager.KVCacheManager.get_computed_blocks
    monkeypatch.setattr(
        vllm.manager.KVCacheManager,
        "get_computed_blocks",
        lambda self, request: lookup(self, request)[:2],
    )
    h = run_history(vllm, "hybrid", 11, 60)
    assert (h.crash, h.findings, h.audited) == (None, (), 60)
    assert (h.prefix_hits, h.preemptions) == (bare.prefix_hits, bare.preemptions) != (0, 0)


def test_a_manager_that_takes_no_scheduler_block_size_is_built_without_it(
    vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.22.1 and older's `KVCacheManager` takes no `scheduler_block_size` (it schedules
    by hash blocks): it is built without one, and the history is the same (was: exit 3)."""
    bare = run_history(vllm, "full", 11, 40)
    built = vllm.manager.KVCacheManager.__init__

    def older(
        self: Any, kv_cache_config: Any, max_model_len: int, hash_block_size: int, **kw: Any
    ) -> None:
        assert "scheduler_block_size" not in kw
        built(self, kv_cache_config, max_model_len, hash_block_size, hash_block_size, **kw)

    monkeypatch.setattr(vllm.manager.KVCacheManager, "__init__", older)
    h = run_history(vllm, "full", 11, 40)
    assert (h.crash, h.findings, h.audited) == (None, (), 40)
    assert (h.prefix_hits, h.preemptions) == (bare.prefix_hits, bare.preemptions)


def test_a_manager_without_deferred_frees_frees_at_once_and_a_leak_is_still_found(
    vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.23.0 and older have no `pop_blocks_for_free` (no frees deferred past an in-flight
    step): the workload frees at once, silent, and the planted leak (a request's bookkeeping
    dropped, its blocks never freed) is found at its step (was: refused)."""
    monkeypatch.delattr(vllm.manager.KVCacheManager, "pop_blocks_for_free")
    clean = run_history(vllm, "hybrid", 11, 80)
    assert (clean.crash, clean.findings, clean.audited) == (None, (), 80)
    assert clean.prefix_hits > 0
    h = run_history(vllm, "full", 3, 80, fault="leak", after_steps=0)
    assert h.fault_step is not None and h.finding_step == h.fault_step
    assert h.findings[0].code is PoolCode.REF_COUNT_HIGH


def test_a_manager_kvcanary_cannot_build_is_one_line_naming_the_tree(
    vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `KVCacheManager` whose constructor wants what kvcanary does not give: `soak --engine
    vllm` says so in one line naming the tree, exit 2 (was: exit 3, a kvcanary bug)."""
    from kvcanary_cli.cli import app
    from tests.vllm_wheel import wheel_path

    def other(
        self: Any, kv_cache_config: Any, max_model_len: int, page_bytes: int, enable_caching: bool
    ) -> None:
        raise AssertionError("not reached: the call does not fit")

    monkeypatch.setattr(vllm.manager.KVCacheManager, "__init__", other)
    said = CliRunner().invoke(app, ["soak", "--engine", "vllm", "--vllm-tree", str(wheel_path())])
    assert said.exit_code == 2, said.output
    [line] = [x for x in said.output.splitlines() if x.startswith("error:")]
    assert str(wheel_path()) in line and "(vLLM 0.33.0)" in line, line
    assert "cannot build its KV-cache manager" in line, line
    assert "TypeError" in line and "page_bytes" in line, line


def _eos_token_id_wanted(
    self: Any,
    request_id: str,
    prompt_token_ids: Any,
    sampling_params: Any,
    pooling_params: Any,
    eos_token_id: Any,
    block_hasher: Any = None,
) -> None:
    """0.15.x and 0.16.0's `Request`: an `eos_token_id` after its pooling parameters."""


def _multimodal_lists_wanted(
    self: Any,
    request_id: str,
    prompt_token_ids: Any,
    multi_modal_kwargs: Any,
    multi_modal_hashes: Any,
    multi_modal_placeholders: Any,
    sampling_params: Any,
    pooling_params: Any,
    eos_token_id: Any,
    block_hasher: Any = None,
) -> None:
    """0.10.0 and 0.10.1.1's `Request`: the multi-modal inputs' lists between the prompt and
    the sampling parameters."""


@pytest.mark.parametrize("older", [_eos_token_id_wanted, _multimodal_lists_wanted])
def test_a_request_that_wants_what_older_releases_do_is_given_it_none(
    vllm: Any, monkeypatch: pytest.MonkeyPatch, older: Any
) -> None:
    """A `Request` taking what older releases' take (as `older`'s signature says, binding as
    it binds): every argument is given by name, what the workload has none of as None, and the
    history is the same (was: refused, kvcanary's workload could not drive it; the multi-modal
    lists took the parameters' places)."""
    bare = run_history(vllm, "full", 11, 40)
    made, shape = vllm.request.Request.__init__, inspect.signature(older)
    kept = ("request_id", "prompt_token_ids", "sampling_params", "pooling_params", "block_hasher")

    def init(self: Any, *args: Any, **kw: Any) -> None:
        given = shape.bind(self, *args, **kw).arguments
        wanted = {k: v for k, v in given.items() if k not in (*kept, "self")}
        assert wanted and set(wanted.values()) == {None}, wanted
        made(self, **{k: given[k] for k in kept if k in given})

    init.__signature__ = shape  # type: ignore[attr-defined]
    monkeypatch.setattr(vllm.request.Request, "__init__", init)
    h = run_history(vllm, "full", 11, 40)
    assert (h.crash, h.findings, h.audited) == (None, (), 40)
    assert (h.prefix_hits, h.preemptions) == (bare.prefix_hits, bare.preemptions)


def test_a_manager_that_hashes_requests_itself_is_named_sha256_and_told_of_finishes(
    vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.10.0's `Request` takes no block hasher: its manager hashes a request's blocks
    with the function it is named (`caching_hash_algo`) and keeps them until told the
    request finished (`free_block_hashes`, never on a preemption). The workload names
    sha256, gives no hasher, and tells it of each finish; the history is the same."""
    bare = run_history(vllm, "hybrid", 11, 80)
    hasher = vllm.kv_cache_utils.get_request_block_hasher(16, vllm.hashing.sha256)
    made, built = vllm.request.Request.__init__, vllm.manager.KVCacheManager.__init__
    forgotten: list[str] = []

    def request(
        self: Any,
        request_id: str,
        prompt_token_ids: Any,
        sampling_params: Any,
        pooling_params: Any,
    ) -> None:
        made(
            self,
            request_id,
            prompt_token_ids,
            sampling_params,
            pooling_params,
            block_hasher=hasher,
        )

    def manager(
        self: Any,
        kv_cache_config: Any,
        max_model_len: int,
        hash_block_size: int,
        enable_caching: bool = True,
        caching_hash_algo: str = "builtin",
    ) -> None:
        assert caching_hash_algo == "sha256"
        built(self, kv_cache_config, max_model_len, hash_block_size, hash_block_size)

    def free_block_hashes(self: Any, request: Any) -> None:
        assert not preempting, "a preempted request keeps its hashes"
        forgotten.append(request.request_id)

    preempt, preempting = _Scheduler.preempt, []

    def preempted(self: Any, victim: Any) -> None:
        preempting.append(victim)
        preempt(self, victim)
        preempting.clear()

    monkeypatch.setattr(vllm.request.Request, "__init__", request)
    monkeypatch.setattr(vllm.manager.KVCacheManager, "__init__", manager)
    monkeypatch.setattr(
        vllm.manager.KVCacheManager, "free_block_hashes", free_block_hashes, raising=False
    )
    monkeypatch.setattr(_Scheduler, "preempt", preempted)
    h = run_history(vllm, "hybrid", 11, 80)
    assert (h.crash, h.findings, h.audited) == (None, (), 80)
    assert (h.prefix_hits, h.preemptions) == (bare.prefix_hits, bare.preemptions)
    assert h.preemptions and len(forgotten) == len(set(forgotten)) > 0


def test_an_attention_spec_that_says_whether_it_is_mla_is_told_it_is_not(vllm: Any) -> None:
    """Before 0.11.0 (no MLA spec of its own) an attention spec wants `use_mla`: the
    full-attention and window specs are told False, and the history is the same (was: the
    manager could not be built)."""
    bare = run_history(vllm, "hybrid", 11, 40)
    told: list[bool] = []

    def older(real: Any) -> Any:
        def spec(*, use_mla: bool, **fields: Any) -> Any:
            told.append(use_mla)
            return real(**fields)

        return spec

    # (the interface module itself is left as it is: its own code checks specs by class)
    specs = {
        n: older(getattr(vllm.interface, n)) for n in ("FullAttentionSpec", "SlidingWindowSpec")
    }
    interface = SimpleNamespace(**{**vars(vllm.interface), **specs})
    h = run_history(replace(vllm, interface=interface), "hybrid", 11, 40)
    assert told == [False, False]
    assert (h.crash, h.findings, h.audited) == (None, (), 40)
    assert (h.prefix_hits, h.preemptions) == (bare.prefix_hits, bare.preemptions)


def test_a_reference_sliding_window_drops_its_gap_and_a_dropped_prompt_block_is_found(
    vllm: Any,
) -> None:
    """vLLM's R-SWA manager (`hybrid-rswa`) keeps each request's prompt blocks and its
    generated tokens' window, nulling the blocks between: a real history checks clean with
    such gaps in its tables (the dump recording the prompts' lengths), in both schedulings;
    a prompt block freed and nulled (the gap begun a block early) is named."""
    from kvcanary_cli.engines.vllm.check import audit

    for overlap in (False, True):
        s = _Scheduler(vllm, "hybrid-rswa", 2, overlap=overlap)
        manager = s.manager.coordinator.single_type_managers[1]
        gaps = 0
        for _ in range(120):
            s.run_step()
            state = s.state()
            assert state.groups[1].kind == "rswa" and audit(state).findings == ()
            assert state.request_num_prompt is not None
            gaps += int(((state.table_group == 1) & (state.table_block == state.null_block)).sum())
            if s.settle():
                assert audit(s.state()).findings == ()
        assert gaps > 50, gaps
    request, table = next(
        (s.requests[rid], t)
        for rid, t in manager.req_to_blocks.items()
        if rid in s.requests and any(b.is_null for b in t)
    )
    last = -(-request.num_prompt_tokens // 16) - 1
    freed, table[last] = table[last], s.manager.block_pool.null_block
    s.manager.block_pool.free_blocks([freed])
    [finding] = audit(s.state()).findings
    assert finding.code is PoolCode.NULL_BLOCK_MISPLACED
    assert "outside the gap between its prompt and its window" in finding.message


def test_a_group_with_a_pool_of_its_own_is_not_read_as_this_pools(vllm: Any) -> None:
    """A group whose manager keeps a block pool of its own (vLLM's HiSparse source group,
    bound to a host pool) names that pool's blocks in its tables: the capture leaves them
    out and says so, instead of reading them as the device pool's (false findings: ids past
    the pool, counts off), and no request reads as missing from it."""
    from kvcanary_cli.engines.vllm import capture
    from kvcanary_cli.engines.vllm.check import audit, skipped_checks
    from kvcanary_cli.soak.vllm_driver import NUM_BLOCKS

    s = _Scheduler(vllm, "hybrid", 4)
    for _ in range(40):
        s.run_step()
    window = s.manager.coordinator.single_type_managers[1]
    device = s.manager.block_pool
    host = type(device)(num_gpu_blocks=8 * NUM_BLOCKS, enable_caching=False, hash_block_size=16)
    # (as HiSparse binds its host pool: the device blocks go back, the host's take their place)
    for table in window.req_to_blocks.values():
        device.free_blocks([b for b in reversed(table) if not b.is_null])
        table[:] = host.get_new_blocks(len(table))
    window.block_pool = host
    assert any(t for t in window.req_to_blocks.values())
    with pytest.MonkeyPatch.context() as patch:  # the capture as it was: every group read
        patch.setattr(capture, "_own_pool", lambda manager, pool: False)
        assert audit(s.state()).findings != ()  # the host pool's ids counted as the device's
    state = s.state()
    assert state.groups[1].own_pool and not state.groups[0].own_pool
    assert not (state.table_group == 1).any() and (state.table_group == 0).any()
    result = audit(state)
    assert result.findings == ()
    assert any("keeps a block pool of its own" in line for line in result.skipped)
    assert skipped_checks(state.groups) == result.skipped
