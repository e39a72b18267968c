"""`check` on vLLM block-pool dumps: each planted fault is found (its codes exactly, its block
and holders named), the state it was planted in is silent, and the dump's I/O, provenance and
the command line behave (exit codes, one-line errors)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from kvcanary_cli import api
from kvcanary_cli.catalog import PoolCause, PoolCode
from kvcanary_cli.cli import app
from kvcanary_cli.dump.atomic import write_safetensors
from kvcanary_cli.dump.engine import read_arrays
from kvcanary_cli.engines.vllm import report_of
from kvcanary_cli.engines.vllm.capture import group_specs
from kvcanary_cli.engines.vllm.check import audit
from kvcanary_cli.engines.vllm.state import CHUNKED_LOCAL, MAMBA, GroupSpec, VllmState, state_of
from kvcanary_cli.engines.vllm.synth import (
    SCENARIOS,
    _clean,
    _copy,
    _null_in_chunk,
    _swap_entry,
    build,
)
from kvcanary_cli.errors import MetadataError, TensorShapeError
from kvcanary_cli.results.pool import PoolCheckReport, PoolProvenance
from tests.engines.bad_dumps import broken_vllm_contents

FAULTS = [name for name, s in SCENARIOS.items() if s.plant is not None]
runner = CliRunner()


def _codes(state: object) -> set[PoolCode]:
    return {f.code for f in audit(state).findings}  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", FAULTS)
def test_each_fault_is_found_and_its_clean_twin_is_silent(name: str, seed: int) -> None:
    scenario = SCENARIOS[name]
    assert _codes(_clean(seed, "tiny", scenario.hybrid, scenario.kind, scenario.drafts)) == set()
    assert _codes(build(name, seed=seed)) == set(scenario.expected)


def test_every_pool_code_has_a_scenario() -> None:
    planted = {code for s in SCENARIOS.values() for code in s.expected}
    assert planted == set(PoolCode)


@pytest.mark.parametrize("name", ["vllm-clean", "vllm-hybrid-clean"])
def test_clean_pools_of_a_realistic_size_are_silent(name: str) -> None:
    state = build(name, seed=5, size="small")
    assert state.ref_cnt.max() >= 2, "prefix sharing makes ref counts above 1"
    assert state.deferred_block.size and state.released_block.size
    assert audit(state).findings == ()


def test_freed_while_held_names_the_block_its_holders_and_the_queue() -> None:
    report = report_of("x", build("vllm-freed-while-held", seed=3))
    [finding] = report.findings
    [cause] = report.diagnosis
    assert cause.cause is PoolCause.FREED_WHILE_HELD
    assert finding.ref_cnt == 0 and finding.queue_position is not None
    assert finding.holders is not None and len(finding.owners) == finding.holders >= 2
    assert {o.group for o in finding.owners} == {0} and all(o.request for o in finding.owners)
    assert f"block {finding.block}" in cause.story and finding.owners[0].request in cause.story


def test_a_window_null_after_a_real_block_names_the_entry() -> None:
    state = build("vllm-null-block", seed=2)
    [finding] = audit(state).findings
    [owner] = finding.owners
    assert owner.group == 1 and owner.index is not None and owner.index > 0
    # the same null as a leading run of the window table is what a window drop leaves
    assert audit(_clean(2, "tiny", True)).findings == ()
    assert (state.table_block[state.table_group == 1] == 0).any()


def _null_after_real(state: VllmState, group: int) -> bool:
    """Some table of `group` holds the null block after a real block (not a leading run)."""
    at = np.flatnonzero(state.table_group == group)
    null = state.table_block[at] == state.null_block
    same = state.table_request[at][1:] == state.table_request[at][:-1]
    return bool((null[1:] & ~null[:-1] & same).any())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_mamba_table_may_hold_nulls_between_its_states(seed: int) -> None:
    # the leading-run rule of a window, applied to every group that is not full attention,
    # called this clean pool misplaced: Mamba's prefix-caching mode keeps a state block
    # between nulls
    state = build("vllm-mamba-clean", seed=seed)
    assert state.groups[1].kind == MAMBA and _null_after_real(state, 1)
    assert audit(state).findings == ()
    # a window group's table with the same entries is a finding
    as_window = replace(
        state, groups=(state.groups[0], replace(state.groups[1], kind="sliding_window", window=64))
    )
    assert _codes(as_window) == {PoolCode.NULL_BLOCK_MISPLACED}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_chunked_local_null_over_the_current_chunk_is_found(seed: int) -> None:
    state = build("vllm-chunked-local-null-in-chunk", seed=seed)
    # still a leading run: the run's shape alone (the old rule) saw nothing
    assert state.groups[1].kind == CHUNKED_LOCAL and not _null_after_real(state, 1)
    [finding] = audit(state).findings
    assert finding.code is PoolCode.NULL_BLOCK_MISPLACED
    assert "in place of a block its window still reads" in finding.message
    assert finding.owners and finding.owners[0].group == 1
    clean = _clean(seed, "tiny", True, CHUNKED_LOCAL)
    assert audit(clean).findings == ()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_sliding_window_null_inside_the_window_is_found(seed: int) -> None:
    # the same plant in a sliding window's table: its leading run one block too long
    state = _null_in_chunk(_copy(_clean(seed, "tiny", True)), np.random.default_rng(seed))
    assert not _null_after_real(state, 1)
    assert _codes(state) == {PoolCode.NULL_BLOCK_MISPLACED}


def test_the_window_rule_waits_for_known_lengths() -> None:
    # a dump without the requests' lengths (0 tokens) cannot place the window: no finding
    state = build("vllm-chunked-local-null-in-chunk", seed=1)
    unknown = replace(state, request_num_tokens=np.zeros_like(state.request_num_tokens))
    assert audit(unknown).findings == ()


def test_a_group_kind_without_a_rule_is_skipped_and_said() -> None:
    state = build("vllm-null-block", seed=2)
    other = replace(
        state, groups=(state.groups[0], GroupSpec(kind="circular_buffer", block_size=16))
    )
    result = audit(other)
    assert result.findings == ()
    [line] = result.skipped
    assert "group 1" in line and "circular_buffer" in line
    report = report_of("x", other)
    assert line in report.coverage
    assert audit(state).skipped == ()


def test_the_capture_reads_each_kind_and_its_window() -> None:
    def manager(name: str, **spec: object) -> object:
        cls = type(name, (), {})
        m = cls()
        m.block_size = 16
        m.kv_cache_spec = type("Spec", (), spec)()
        return m

    specs = group_specs(
        [
            manager("FullAttentionManager"),
            manager("SlidingWindowManager", sliding_window=64),
            manager("ChunkedLocalAttentionManager", attention_chunk_size=128),
            manager("MambaManager"),
        ]
    )
    assert [(g.kind, g.window) for g in specs] == [
        ("full", None),
        ("sliding_window", 64),
        ("chunked_local_attention", 128),
        ("mamba", None),
    ]


def _with_bound(state: VllmState, bound: int | None) -> VllmState:
    return replace(state, groups=(state.groups[0], replace(state.groups[1], max_states=bound)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_mamba_state_bound_is_checked_at_its_value_and_not_below(seed: int) -> None:
    planted = build("vllm-mamba-state-kept", seed=seed)
    [finding] = audit(planted).findings
    assert finding.code is PoolCode.MAMBA_STATES_OVER_BOUND
    assert "3 state blocks" in finding.message and "at most 2" in finding.message
    [owner] = {(o.request, o.group) for o in finding.owners}
    assert owner[1] == 1
    # the same three states are within a bound of three; the clean twin's two within two
    assert audit(_with_bound(planted, 3)).findings == ()
    clean = _clean(seed, "tiny", True, MAMBA)
    assert max(_states_per_table(clean)) == 2
    assert audit(clean).findings == ()
    assert _codes(_with_bound(clean, 1)) == {PoolCode.MAMBA_STATES_OVER_BOUND}


def _states_per_table(state: VllmState) -> list[int]:
    mamba = (state.table_group == 1) & (state.table_block != state.null_block)
    return [int(c) for c in np.bincount(state.table_request[mamba]) if c]


def test_an_unknown_mamba_bound_is_skipped_and_said() -> None:
    planted = _with_bound(build("vllm-mamba-state-kept", seed=1), None)
    result = audit(planted)
    assert result.findings == ()
    [line] = result.skipped
    assert "group 1" in line and "state blocks" in line
    assert line in report_of("x", planted).coverage
    assert audit(build("vllm-mamba-state-kept", seed=1)).skipped == ()


def test_a_dead_requests_mamba_states_are_not_counted_against_the_bound() -> None:
    planted = build("vllm-mamba-state-kept", seed=2)
    [finding] = audit(planted).findings
    request = planted.request_ids.index(finding.owners[0].request)
    live = planted.request_live.copy()
    live[request] = False
    assert _codes(replace(planted, request_live=live)) == {PoolCode.TABLE_OF_DEAD_REQUEST}


def test_the_capture_reads_a_mamba_groups_state_bound_from_its_spec() -> None:
    def mamba(block_size: int = 16, **spec: Any) -> object:
        m = type("MambaManager", (), {})()
        m.block_size = block_size
        m.kv_cache_spec = type("MambaSpec", (), spec)()
        return m

    def bound(m: object, max_model_len: int | None = 1024, requests_known: bool = True) -> object:
        [g] = group_specs([m], max_model_len=max_model_len, requests_known=requests_known)
        return g.max_states

    align: dict[str, Any] = {"mamba_cache_mode": "align", "num_speculative_blocks": 0}
    assert bound(mamba(**align)) == 2
    assert bound(mamba(**align, num_prefill_checkpoint_blocks=1)) == 3
    assert bound(mamba(**align, num_prefill_checkpoint_blocks=0)) == 2
    # the requests not read (their tokens in flight unknown): no bound
    assert bound(mamba(**align), requests_known=False) is None
    # speculative decoding: a scratch block more per draft token (a count it cannot be: none)
    assert bound(mamba(**{**align, "num_speculative_blocks": 2})) == 4
    checkpointed = {**align, "num_prefill_checkpoint_blocks": 1, "num_speculative_blocks": 3}
    assert bound(mamba(**checkpointed)) == 6
    assert bound(mamba(1024, num_speculative_blocks=2), requests_known=False) == 3
    for odd in (-1, True, "2", None):
        assert bound(mamba(**{**align, "num_speculative_blocks": odd})) is None
    # no prefix caching: one block the model's length, in flight or not
    assert bound(mamba(1024), requests_known=False) == 1
    assert bound(mamba(1024, mamba_cache_mode="none")) == 1
    assert bound(mamba(16, mamba_cache_mode="none")) is None
    assert bound(mamba(1024), max_model_len=None) is None
    full = type("FullAttentionManager", (), {"block_size": 16})()
    full.kv_cache_spec = type("Spec", (), {})()
    assert bound(full) is None


def test_a_dump_keeps_the_mamba_bound_and_refuses_a_bad_one(tmp_path: Path) -> None:
    state = build("vllm-mamba-clean", seed=1)
    path = tmp_path / "mamba.safetensors"
    tensors, meta = state.contents()
    write_safetensors(path, tensors, meta)
    assert state_of(read_arrays(path)).groups == state.groups
    assert state.groups[1].max_states == 2
    groups = json.loads(meta["vllm.groups"])
    assert "max_states" not in groups[0]
    del groups[1]["max_states"]  # an older dump: not known
    older = tmp_path / "older.safetensors"
    write_safetensors(older, tensors, {**meta, "vllm.groups": json.dumps(groups)})
    assert state_of(read_arrays(older)).groups[1].max_states is None
    for bad in (0, True, "2"):
        groups[1]["max_states"] = bad
        broken = tmp_path / "broken.safetensors"
        write_safetensors(broken, tensors, {**meta, "vllm.groups": json.dumps(groups)})
        with pytest.raises(MetadataError, match="max_states"):
            state_of(read_arrays(broken))


def _scratch(state: VllmState, blocks: int) -> VllmState:
    mamba = replace(state.groups[1], speculative_blocks=blocks)
    return replace(state, groups=(state.groups[0], mamba))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_running_state_dropped_is_found_past_its_tables_scratch_blocks(seed: int) -> None:
    """Under speculative decoding a Mamba table ends with a scratch block per draft token,
    real whatever the states before them hold: a table whose states are all null is found
    by the group's recorded count of them, and is invisible without it."""
    clean = build("vllm-mamba-drafting-clean", seed=seed)
    assert clean.groups[1].speculative_blocks == 2 and audit(clean).findings == ()
    mamba = (clean.table_group == 1) & clean.request_live[clean.table_request]
    ends = np.bincount(clean.table_request[mamba]) - 2  # each table's first scratch entry
    scratch = mamba & (clean.table_index >= ends[clean.table_request])
    assert scratch.any() and (clean.table_block[scratch] != clean.null_block).all()
    planted = build("vllm-mamba-running-state-dropped", seed=seed)
    [finding] = audit(planted).findings
    assert finding.code is PoolCode.NULL_BLOCK_MISPLACED
    assert "every entry of a Mamba table, its scratch blocks aside" in finding.message
    assert audit(_scratch(planted, 0)).findings == ()  # a dump without the count
    # a count past the table's length leaves no state entry to judge, not a false alarm
    assert audit(_scratch(clean, 2**31 - 1)).findings == ()
    assert audit(_scratch(planted, 2**31 - 1)).findings == ()
    # without drafts the same rule reads the whole table (the message as it was)
    [dropped] = audit(build("vllm-mamba-state-dropped", seed=seed)).findings
    assert "every entry of a Mamba table (no state block kept)" in dropped.message


def test_a_dump_keeps_a_groups_scratch_blocks_and_refuses_a_bad_count(tmp_path: Path) -> None:
    state = build("vllm-mamba-drafting-clean", seed=1)
    tensors, meta = state.contents()
    groups = json.loads(meta["vllm.groups"])
    assert "speculative_blocks" not in groups[0] and groups[1]["speculative_blocks"] == 2
    path = tmp_path / "drafting.safetensors"
    write_safetensors(path, tensors, meta)
    assert state_of(read_arrays(path)).groups == state.groups
    del groups[1]["speculative_blocks"]  # an older dump, or a server without drafts
    older = tmp_path / "older.safetensors"
    write_safetensors(older, tensors, {**meta, "vllm.groups": json.dumps(groups)})
    assert state_of(read_arrays(older)).groups[1].speculative_blocks == 0
    for bad in (-1, True, "2", 2**31, 1.5):
        groups[1]["speculative_blocks"] = bad
        broken = tmp_path / "broken.safetensors"
        write_safetensors(broken, tensors, {**meta, "vllm.groups": json.dumps(groups)})
        with pytest.raises(MetadataError, match="speculative_blocks"):
            state_of(read_arrays(broken))


def test_the_capture_reads_a_mamba_groups_scratch_blocks_from_its_spec() -> None:
    def scratch(kind: str, **spec: Any) -> int:
        m = type(kind, (), {"block_size": 16})()
        m.kv_cache_spec = type("Spec", (), spec)()
        [g] = group_specs([m], max_model_len=1024, requests_known=True)
        return g.speculative_blocks

    assert scratch("MambaManager", num_speculative_blocks=3) == 3
    assert scratch("MambaManager") == 0  # a release without drafts for Mamba
    for odd in (-1, True, "2", None, 2**31):  # not a count: none assumed (the rule weaker)
        assert scratch("MambaManager", num_speculative_blocks=odd) == 0
    assert scratch("FullAttentionManager", num_speculative_blocks=3) == 0


def test_tokens_in_flight_allow_a_state_per_block_they_reach(tmp_path: Path) -> None:
    """vLLM's async scheduling retires a Mamba state once the tokens after it are processed:
    a request with tokens in flight keeps one more per block they reach, its own only."""
    planted = build("vllm-mamba-state-kept", seed=1)
    [finding] = audit(planted).findings
    assert finding.code is PoolCode.MAMBA_STATES_OVER_BOUND
    request = planted.request_ids.index(finding.owners[0].request)

    def flying(tokens: int, who: int = request) -> VllmState:
        counts = np.zeros(len(planted.request_ids), dtype=np.int64)
        counts[who] = tokens
        return replace(planted, request_num_in_flight=counts)

    assert audit(flying(1)).findings == ()  # the third state: one block in flight
    assert audit(flying(16)).findings == ()
    # a dump's huge count allows any table, and never wraps the sum into a finding
    unit = (planted.groups[0], replace(planted.groups[1], block_size=1))
    huge = replace(flying(np.iinfo(np.int64).max), groups=unit)
    assert audit(huge).findings == ()
    other = (request + 1) % len(planted.request_ids)
    for unchanged in (flying(0), flying(1, other), flying(-5)):  # never loosened by another
        assert _codes(unchanged) == {PoolCode.MAMBA_STATES_OVER_BOUND}
    # two states too many: a block's tokens in flight allow one, two blocks' both
    tensors, meta = planted.contents()
    counts = flying(17).request_num_in_flight
    assert counts is not None
    path = tmp_path / "flying.safetensors"
    write_safetensors(path, {**tensors, "vllm.request_num_in_flight": counts}, meta)
    read = state_of(read_arrays(path))
    assert read.request_num_in_flight is not None
    assert read.request_num_in_flight.tolist() == counts.tolist()
    assert audit(read).findings == ()
    # the message says both bounds: every request one token in flight, the group's bound 1
    tight = (planted.groups[0], replace(planted.groups[1], max_states=1))
    ones = np.ones(len(planted.request_ids), dtype=np.int64)
    [over] = audit(replace(planted, groups=tight, request_num_in_flight=ones)).findings
    assert over.owners[0].request == finding.owners[0].request
    assert "keeps at most 2 with its 1 token in flight (1 without)" in over.message
    short = tmp_path / "short.safetensors"
    write_safetensors(short, {**tensors, "vllm.request_num_in_flight": counts[:-1]}, meta)
    with pytest.raises(TensorShapeError, match="one per request of vllm.request_ids"):
        state_of(read_arrays(short))


def test_a_window_is_read_from_the_tokens_processed_where_the_stale_share_is_known() -> None:
    """A step in flight reads the window of the tokens processed before it: a null over a
    block that window reaches is a finding, where the dump records which tokens in flight are
    stale (a preempted request's old steps, which read no block of its table)."""
    state = build("vllm-hybrid-clean", seed=1, size="small")  # (tiny's fit their window)
    assert audit(state).findings == ()
    window = state.groups[1].window
    assert window is not None
    nulls = np.flatnonzero((state.table_group == 1) & (state.table_block == state.null_block))
    entry = int(nulls[-1])  # the last block the window dropped
    request = int(state.table_request[entry])
    block_end = (int(state.table_index[entry]) + 1) * state.groups[1].block_size
    computed = int(state.request_num_computed[request])
    # processed tokens one short of the window that has left this block behind
    tokens = computed - (block_end + window - 2)
    assert 0 < tokens <= computed

    def flying(in_flight: int, stale: int | None) -> VllmState:
        counts = np.zeros(len(state.request_ids), dtype=np.int64)
        counts[request] = in_flight
        shares = None if stale is None else np.where(counts > 0, stale, 0)
        return replace(state, request_num_in_flight=counts, request_num_stale_in_flight=shares)

    [finding] = audit(flying(tokens, 0)).findings
    assert finding.code is PoolCode.NULL_BLOCK_MISPLACED
    assert "in place of a block its window still reads" in finding.message
    assert audit(flying(tokens - 1, 0)).findings == ()  # the window just past the block
    assert audit(flying(tokens, tokens)).findings == ()  # every token in flight stale
    assert audit(flying(tokens, None)).findings == ()  # the share unknown: the tokens computed


def test_a_released_block_in_its_table_is_no_finding_until_unmarked() -> None:
    state = build("vllm-clean", seed=4)
    assert audit(state).findings == ()
    unmarked = replace(state, released_block=state.released_block[:0])
    assert _codes(unmarked) == {PoolCode.QUEUED_BLOCK_HELD}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("vllm")
    out = {}
    for name in ("vllm-clean", "vllm-freed-while-held", "vllm-double-free"):
        out[name] = folder / f"{name}.safetensors"
        api.synth(name, out[name], seed=1)
    return out


def test_a_dump_reads_back_as_the_state_written(dumps: dict[str, Path]) -> None:
    stored = read_arrays(dumps["vllm-double-free"])
    state, built = state_of(stored), build("vllm-double-free", seed=1)
    assert stored.engine == "vllm"
    assert np.array_equal(state.ref_cnt, built.ref_cnt)
    assert np.array_equal(state.free_queue, built.free_queue)
    assert state.request_ids == built.request_ids and state.groups == built.groups
    assert state.extra["vllm.expected_findings"] == PoolCode.NEGATIVE_REF_COUNT


def test_check_cli_exit_codes_and_json(dumps: dict[str, Path]) -> None:
    clean = runner.invoke(app, ["check", str(dumps["vllm-clean"]), "--format", "json"])
    assert clean.exit_code == 0, clean.output
    record = json.loads(clean.output)
    assert record["schema"] == PoolCheckReport.SCHEMA
    assert record["dumps"][0]["verdict"] == "clean"
    assert any("planner" in c for c in record["dumps"][0]["coverage"])
    bad = runner.invoke(app, ["check", str(dumps["vllm-double-free"]), "--format", "json"])
    assert bad.exit_code == 1
    [finding] = json.loads(bad.output)["dumps"][0]["findings"]
    assert finding["code"] == PoolCode.NEGATIVE_REF_COUNT
    assert finding["cause"] == PoolCause.POOL_DOUBLE_FREE
    for fmt in ("table", "markdown"):
        shown = runner.invoke(app, ["check", str(dumps["vllm-freed-while-held"]), "-f", fmt])
        assert shown.exit_code == 1 and PoolCode.QUEUED_BLOCK_HELD in shown.output


def test_provenance_of_a_block(dumps: dict[str, Path]) -> None:
    checked = api.check(dumps["vllm-freed-while-held"])
    assert isinstance(checked, PoolCheckReport)
    [finding] = checked.dumps[0].findings
    assert finding.block is not None
    prov = api.provenance(dumps["vllm-freed-while-held"], block=finding.block)
    assert isinstance(prov, PoolProvenance)
    assert prov.queue_position == finding.queue_position
    assert len(prov.owners) == finding.holders and prov.hash is not None
    assert [f.code for f in prov.findings] == [PoolCode.QUEUED_BLOCK_HELD]
    quiet = api.provenance(dumps["vllm-clean"], block=finding.block)
    assert isinstance(quiet, PoolProvenance) and quiet.findings == ()
    out = runner.invoke(app, ["provenance", str(dumps["vllm-clean"]), "--block", "99999"])
    assert out.exit_code == 2 and "outside the pool" in out.output
    clean = str(dumps["vllm-clean"])
    for extra in (["--slot", "3"], [clean]):  # a block is one dump's, traced alone
        out = runner.invoke(app, ["provenance", clean, "--block", "1", *extra])
        assert out.exit_code == 2, out.output
        assert out.output.strip().splitlines() == [
            "error: --block: traces a block of one dump, with no slot or row"
        ]


def test_bad_vllm_dumps_are_one_line_exit_2(tmp_path: Path, dumps: dict[str, Path]) -> None:
    for name, (t, m) in broken_vllm_contents(**{"kvcanary.engine": "trtllm"}).items():
        path = write_safetensors(tmp_path / f"{name}.st", t, m)
        out = runner.invoke(app, ["check", str(path)])
        assert out.exit_code == 2, (name, out.output)
        assert "Traceback" not in out.output and str(path) in out.output
    api.synth("clean-decode", tmp_path / "sglang.st")
    mixed = runner.invoke(app, ["check", str(dumps["vllm-clean"]), str(tmp_path / "sglang.st")])
    assert mixed.exit_code == 2 and "separate runs" in mixed.output
    sglang_only = runner.invoke(app, ["plan", str(dumps["vllm-clean"])])
    assert sglang_only.exit_code == 2 and "SGLang dumps" in sglang_only.output


@pytest.mark.parametrize(
    "command",
    [
        ["provenance", "{path}", "--block", "1"],
        ["shrink", "{path}", "--out", "{out}"],
        ["timeline", "{path}", "{clean}"],
        ["inspect", "{path}"],
    ],
    ids=["provenance", "shrink", "timeline", "inspect"],
)
def test_every_command_names_the_broken_file(
    tmp_path: Path, dumps: dict[str, Path], command: list[str]
) -> None:
    """A bad dump is one line naming its file, the tensor and the fix, as `check` says it,
    whichever command read it (provenance, shrink and timeline named only the tensor)."""
    for name, (t, m) in broken_vllm_contents().items():
        path = write_safetensors(tmp_path / f"{name}.st", t, m)
        small, clean = tmp_path / "small.st", dumps["vllm-clean"]
        given = {"path": str(path), "out": str(small), "clean": str(clean)}
        out = runner.invoke(app, [part.format(**given) for part in command])
        assert out.exit_code == 2, (name, out.output)
        [line] = out.stderr.strip().splitlines()
        assert line.startswith(f"error: {path}: "), (name, line)
        assert line.endswith(
            "(capture the pool again; kvcanary's capture writes these "
            "tensors together, as docs/dump-format.md's 'vLLM dumps' lays "
            "them out)"
        ), (name, line)


def _keyed_twice(extra: bool) -> object:
    """A clean pool where one hashed block is also reachable under a second key (vLLM's
    partial prefix entries: `cached_block_hashes_by_block`), listed as its extra key or not."""
    state = _clean(4, "tiny", False)
    block = int(np.flatnonzero(state.hash_group >= 0)[0])
    key = np.full((1, state.hash_digest.shape[1]), 7, dtype=np.uint8)
    state = replace(
        state,
        map_block=np.append(state.map_block, block),
        map_group=np.append(state.map_group, 0),
        map_digest=np.concatenate([state.map_digest, key]),
    )
    if extra:
        state = replace(
            state,
            extra_key_block=np.array([block]),
            extra_key_group=np.array([0]),
            extra_key_digest=key,
        )
    return state


def test_a_map_entry_under_a_blocks_extra_key_is_not_stale(tmp_path: Path) -> None:
    assert _codes(_keyed_twice(extra=False)) == {PoolCode.HASH_ENTRY_STALE}
    state = _keyed_twice(extra=True)
    assert _codes(state) == set()
    tensors, meta = state.contents()  # type: ignore[attr-defined]
    write_safetensors(tmp_path / "d.safetensors", tensors, meta)
    assert _codes(state_of(read_arrays(tmp_path / "d.safetensors"))) == set()


@pytest.mark.parametrize("command", [["ranks", "{a}", "{b}"], ["plan", "{a}"]])
def test_sglang_only_commands_refuse_vllm_dumps_first(tmp_path: Path, command: list[str]) -> None:
    """Two snapshots of one step (the assert hook and the soak both write one) are refused as
    vLLM dumps, naming what reads them, not as ranks of one step (`timeline` and `diff` read
    them: tests/engines/test_vllm_timeline.py)."""
    tensors, meta = build("vllm-clean", seed=1).contents()
    meta["step"] = "7"
    a = write_safetensors(tmp_path / "a.st", tensors, meta)
    b = write_safetensors(tmp_path / "b.st", tensors, meta)
    out = runner.invoke(app, [part.format(a=a, b=b) for part in command])
    assert out.exit_code == 2, out.output
    [line] = out.output.splitlines()
    assert "a vLLM dump: this command reads SGLang dumps only" in line
    assert (
        "`check`, `inspect`, `provenance --block N`, `timeline`, `diff` and `shrink` read vLLM"
        in line
    )


def _rswa_entries(state: VllmState, where: str) -> np.ndarray:
    """Real entries of the reference sliding window's tables: the last prompt block of each
    (`prompt`), or each table's last block (`window`)."""
    assert state.request_num_prompt is not None
    real = (state.table_group == 1) & (state.table_block != state.null_block)
    prompt_end = -(-state.request_num_prompt[state.table_request] // 16) - 1
    if where == "prompt":
        return np.flatnonzero(real & (state.table_index == prompt_end))
    last = np.r_[state.table_request[1:] != state.table_request[:-1], True]
    return np.flatnonzero(real & last & (state.table_index > prompt_end))


def test_a_reference_sliding_windows_nulls_are_its_gap_and_nothing_else() -> None:
    """A reference sliding window (vLLM's R-SWA) keeps every prompt block and its generated
    tokens' window, the blocks between null: those nulls are clean, a null over a prompt block
    or a block of the window is `null-block-misplaced`, and without the prompts' lengths
    nothing is judged (and the coverage says so)."""
    clean = build("vllm-rswa-clean", seed=1, size="small")
    nulls = (clean.table_group == 1) & (clean.table_block == clean.null_block)
    assert nulls.sum() > 10 and audit(clean).findings == ()
    for where in ("prompt", "window"):
        entries = _rswa_entries(clean, where)
        assert entries.size, where
        planted = _swap_entry(_copy(clean), int(entries[0]), clean.null_block)  # freed too
        [finding] = audit(planted).findings
        assert finding.code is PoolCode.NULL_BLOCK_MISPLACED
        assert "outside the gap between its prompt and its window" in finding.message
        unknown = replace(planted, request_num_prompt=None)
        assert audit(unknown).findings == ()
        [line] = audit(unknown).skipped
        assert "group 1" in line and "prompt" in line
    assert audit(clean).skipped == ()


def test_the_capture_names_an_acronyms_kind_and_reads_a_reference_windows_window() -> None:
    def spec(name: str, **fields: Any) -> GroupSpec:
        m = type(name, (), {"block_size": 16})()
        m.kv_cache_spec = type("Spec", (), fields)()
        [g] = group_specs([m])
        return g

    assert (
        spec("RSWAManager", rswa_window=20).kind,
        spec("RSWAManager", rswa_window=20).window,
    ) == (
        "rswa",
        20,
    )
    assert spec("CircularBufferManager").kind == "circular_buffer"
    assert spec("_HiSparseAuxiliaryManager").kind == "hi_sparse_auxiliary"
    assert spec("ChunkedLocalAttentionManager").kind == CHUNKED_LOCAL
    assert spec("MambaManager").kind == MAMBA


def test_a_dump_keeps_the_requests_prompt_lengths(tmp_path: Path) -> None:
    state = build("vllm-rswa-clean", seed=2)
    assert state.request_num_prompt is not None
    tensors, meta = state.contents()
    path = tmp_path / "rswa.safetensors"
    write_safetensors(path, tensors, meta)
    read = state_of(read_arrays(path))
    assert read.request_num_prompt is not None
    assert read.request_num_prompt.tolist() == state.request_num_prompt.tolist()
    short = tmp_path / "short.safetensors"
    prompts = tensors["vllm.request_num_prompt_tokens"][:-1]
    write_safetensors(short, {**tensors, "vllm.request_num_prompt_tokens": prompts}, meta)
    with pytest.raises(TensorShapeError, match="one per request of vllm.request_ids"):
        state_of(read_arrays(short))
    without = {k: v for k, v in tensors.items() if k != "vllm.request_num_prompt_tokens"}
    write_safetensors(short, without, meta)
    assert state_of(read_arrays(short)).request_num_prompt is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("window", 2**70),
        ("window", -(2**70)),
        ("block_size", 2**63),
        ("max_states", 2**64),
        ("block_size", 0),
    ],
)
def test_a_groups_number_past_int64_is_one_error_line(key: str, value: int, tmp_path: Path) -> None:
    """A group's size too large for the arithmetic with token counts (a window of 2**70 made
    the audit fail inside numpy, exit 3) is malformed metadata: one line, exit 2."""
    tensors, meta = build(
        "vllm-mamba-clean" if key == "max_states" else "vllm-rswa-clean"
    ).contents()
    groups = json.loads(meta["vllm.groups"])
    groups[1][key] = value
    path = tmp_path / "odd.safetensors"
    write_safetensors(path, tensors, {**meta, "vllm.groups": json.dumps(groups)})
    result = runner.invoke(app, ["check", str(path)])
    assert result.exit_code == 2, result.output
    [line] = result.output.splitlines()
    assert "vllm.groups" in line and "below 2**62" in line


def test_a_group_with_its_own_pool_is_recorded_unread_and_said(tmp_path: Path) -> None:
    """A group whose manager keeps a block pool of its own has no entries in the dump: no
    request reads as missing from it, the coverage says its tables were not checked, and the
    flag survives the file (a value that is not a boolean is refused)."""
    state = build("vllm-mamba-clean", seed=3)
    kept = state.table_group == 0
    tables = {k: getattr(state, k)[kept] for k in ("table_group", "table_request")}
    tables |= {k: getattr(state, k)[kept] for k in ("table_index", "table_block")}
    unread = replace(state, **tables)
    assert PoolCode.REQUEST_MISSING_IN_GROUP in _codes(unread)  # (read as this pool's group)
    own = replace(unread, groups=(state.groups[0], replace(state.groups[1], own_pool=True)))
    result = audit(own)
    assert PoolCode.REQUEST_MISSING_IN_GROUP not in {f.code for f in result.findings}
    assert [line for line in result.skipped if "group 1" in line] == [
        "not checked: group 1's tables (its manager, mamba, keeps a block pool of its own, a "
        "host tier's: they name that pool's blocks, not this one's)"
    ]
    tensors, meta = own.contents()
    assert json.loads(meta["vllm.groups"])[1]["own_pool"] is True
    assert "own_pool" not in json.loads(meta["vllm.groups"])[0]
    path = tmp_path / "own.safetensors"
    write_safetensors(path, tensors, meta)
    assert state_of(read_arrays(path)).groups == own.groups
    groups = json.loads(meta["vllm.groups"])
    groups[1]["own_pool"] = "yes"
    write_safetensors(path, tensors, {**meta, "vllm.groups": json.dumps(groups)})
    with pytest.raises(MetadataError, match="own_pool"):
        state_of(read_arrays(path))
