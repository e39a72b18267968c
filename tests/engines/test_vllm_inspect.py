"""`inspect` on vLLM block-pool dumps: every figure is what the dump's reader reads from the
file (pool, queue, groups, requests and their tables, map, tensors, metadata), in every format,
with the record's keys its result's fields; text from the dump is shown escaped; a shrunk dump
names its original; a malformed dump is one line, exit 2, as `check` says it."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvcanary_cli import api
from kvcanary_cli.cli import app
from kvcanary_cli.dump.atomic import write_safetensors
from kvcanary_cli.dump.engine import read_arrays
from kvcanary_cli.engines.vllm.state import state_of
from kvcanary_cli.engines.vllm.synth import build
from kvcanary_cli.render import OutputFormat, render
from kvcanary_cli.results.pool_inspect import PoolDumpDescription
from kvcanary_cli.results.record import record_keys
from tests.engines.bad_dumps import broken_vllm_contents
from tests.render.record_schema import RECORDS, validate

SCENARIOS = ["vllm-clean", "vllm-hybrid-clean", "vllm-double-free", "vllm-queue-broken"]
runner = CliRunner()


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("vllm-inspect")
    out = {}
    for name in SCENARIOS:
        out[name] = folder / f"{name}.safetensors"
        api.synth(name, out[name], seed=3)
    out["small"] = folder / "small.safetensors"
    api.shrink(out["vllm-double-free"], out["small"])
    return out


def _described(path: Path) -> PoolDumpDescription:
    described = api.inspect(path)
    assert isinstance(described, PoolDumpDescription)
    return described


@pytest.mark.parametrize("name", [*SCENARIOS, "small"])
def test_the_figures_are_what_the_reader_reads(dumps: dict[str, Path], name: str) -> None:
    stored = read_arrays(dumps[name])
    state = state_of(stored)
    d = _described(dumps[name])
    assert (d.path, d.engine, d.engine_version) == (str(dumps[name]), "vllm", state.version)
    assert d.file_bytes == os.path.getsize(dumps[name])
    assert d.format == stored.metadata.get("kvcanary.format")
    assert (d.num_blocks, d.null_block, d.num_free_blocks) == (
        state.num_blocks,
        state.null_block,
        state.num_free_blocks,
    )
    assert (d.queue_length, d.queue_complete) == (state.queue_length, state.queue_complete)
    back = state.walks()[2]  # the walk back at its original length
    assert d.reverse_queue_length == (None if back is None else back.size)
    known = state.known()
    assert d.kept_blocks == (None if known is None else int(known.sum()))
    held = np.ones(state.num_blocks, bool) if known is None else known
    assert d.referenced == int((state.ref_cnt[held] > 0).sum())
    assert d.hashed_blocks == int((state.hash_group[held] >= 0).sum())
    assert (d.map_entries, d.extra_keys) == (state.map_block.size, state.extra_key_block.size)
    assert (d.deferred_frees, d.released_blocks) == (
        state.deferred_block.size,
        state.released_block.size,
    )
    assert [(g.kind, g.block_size, g.window) for g in d.groups] == [
        (g.kind, g.block_size, g.window) for g in state.groups
    ]
    for g in d.groups:
        entries = state.table_group == g.group
        assert g.entries == int(entries.sum())
        assert g.tables == len(set(state.table_request[entries].tolist()))
        assert g.null_entries == int((state.table_block[entries] == state.null_block).sum())
    assert [r.request for r in d.requests] == list(state.request_ids)
    for i, r in enumerate(d.requests):
        assert r.live == bool(state.request_live[i])
        assert (r.num_tokens, r.num_computed) == (
            int(state.request_num_tokens[i]),
            int(state.request_num_computed[i]),
        )
        mine = state.table_request == i
        assert r.table_lengths == tuple(
            int((mine & (state.table_group == g)).sum()) for g in range(len(state.groups))
        )
    assert d.live_requests == int(state.request_live.sum())
    assert d.requests_with_blocks == len(set(state.table_request.tolist()))
    assert [(t.name, t.dtype, t.shape, t.bytes) for t in d.tensors] == [
        (k, str(v.dtype), v.shape, v.nbytes) for k, v in stored.arrays.items()
    ]
    assert d.metadata == dict(state.extra)
    assert (d.shrink is not None) == (name == "small")


def test_a_cut_walk_and_a_shrunk_dump_are_said(tmp_path: Path, dumps: dict[str, Path]) -> None:
    tensors, meta = dataclasses.replace(
        build("vllm-clean", seed=3), queue_complete=False
    ).contents()
    cut = _described(write_safetensors(tmp_path / "cut.safetensors", tensors, meta))
    clean = _described(dumps["vllm-clean"])
    assert cut.queue_complete is False and clean.queue_complete is True
    assert any("cut" in note for note in cut.notes)
    assert not any("cut" in note for note in clean.notes)
    small = _described(dumps["small"])
    assert small.shrink is not None
    assert small.shrink.source.name == dumps["vllm-double-free"].name
    assert small.kept_blocks is not None and small.kept_blocks < small.num_blocks
    assert any("shrunk" in note for note in small.notes)


@pytest.mark.parametrize("name", [*SCENARIOS, "small"])
def test_every_format_exits_0_and_json_is_the_result(dumps: dict[str, Path], name: str) -> None:
    path = str(dumps[name])
    out = runner.invoke(app, ["inspect", path, "--format", "json"])
    assert out.exit_code == 0, out.output
    record = json.loads(out.output)
    assert record["schema"] == PoolDumpDescription.SCHEMA == "kvcanary.pool-inspect/1"
    assert set(record) == {"schema", *(k for k, _ in record_keys(PoolDumpDescription))}
    assert validate(record, RECORDS[record["schema"]]) == []
    d = _described(dumps[name])
    assert record["num_blocks"] == d.num_blocks
    assert [r["table_lengths"] for r in record["requests"]] == [
        list(r.table_lengths) for r in d.requests
    ]
    table = runner.invoke(app, ["inspect", path])
    markdown = runner.invoke(app, ["inspect", path, "--format", "markdown"])
    for shown in (table, markdown):
        assert shown.exit_code == 0, shown.output
        assert f"{d.num_blocks} blocks" in shown.output
        assert d.requests[0].request in shown.output and "vllm.ref_cnt" in shown.output
    assert markdown.output.startswith("## kvcanary inspect")


def test_long_lists_are_cut_in_views_not_in_json(dumps: dict[str, Path]) -> None:
    d = _described(dumps["vllm-clean"])
    assert len(d.requests) > 2
    for fmt in (OutputFormat.TABLE, OutputFormat.MARKDOWN):
        shown = render(d, fmt, max_rows=2)
        text = shown if isinstance(shown, str) else _plain(shown)
        assert f"{len(d.requests) - 2} more requests" in text
        assert d.requests[2].request not in text
    record = json.loads(str(render(d, OutputFormat.JSON, max_rows=2)))
    assert len(record["requests"]) == len(d.requests)


def _plain(renderable: object) -> str:
    from rich.console import Console

    console = Console(width=200, color_system=None, record=True)
    with console.capture() as cap:
        console.print(renderable)
    return cap.get()


def test_text_from_the_dump_is_shown_escaped(tmp_path: Path) -> None:
    state = build("vllm-clean", seed=1)
    hostile = "\x1b]52;c;cm0gLXJmIH4=\x07[bold]x[/bold] | *y* @someone"
    tensors, meta = dataclasses.replace(
        state,
        request_ids=("\x1b]52;c;eA==\x07[/x]`|", *state.request_ids[1:]),
        extra={"note": hostile, "\x1b[2Jkey": "v"},
    ).contents()
    path = write_safetensors(tmp_path / "hostile.safetensors", tensors, meta)
    for fmt in ("table", "markdown"):
        out = runner.invoke(app, ["inspect", str(path), "--format", fmt])
        assert out.exit_code == 0, out.output
        assert "\x1b" not in out.output and "\x07" not in out.output
        assert "\\x1b]52;c;cm0g" in out.output and "\\x1b]52;c;eA==" in out.output
        assert "\\x1b[2Jkey" in out.output and "[/x]" in out.output
    markdown = runner.invoke(app, ["inspect", str(path), "--format", "markdown"]).output
    assert "@someone" not in markdown and "\\| \\*y\\*" in markdown
    record = json.loads(runner.invoke(app, ["inspect", str(path), "--format", "json"]).output)
    assert record["metadata"]["note"] == hostile  # JSON keeps the raw string


def test_a_malformed_vllm_dump_is_one_line_exit_2(tmp_path: Path) -> None:
    for name, (t, m) in broken_vllm_contents(**{"vllm.shrunk": "{}"}).items():
        path = write_safetensors(tmp_path / f"{name}.st", t, m)
        out = runner.invoke(app, ["inspect", str(path)])
        assert out.exit_code == 2, (name, out.output)
        [line] = out.output.splitlines()
        assert line.startswith(f"error: {path}: ") and "Traceback" not in line
        [checked] = api.check(path).dumps
        assert checked.error is not None and checked.error in line  # the check's own reason


def test_unrecorded_counts_are_null_and_foreign_tensors_are_noted(tmp_path: Path) -> None:
    tensors, meta = build("vllm-hybrid-clean", seed=2, size="small").contents()
    del tensors["vllm.request_num_tokens"], tensors["vllm.free_queue_reverse"]
    tensors["debug.extra"] = np.arange(3, dtype=np.int64)
    d = _described(write_safetensors(tmp_path / "d.safetensors", tensors, meta))
    assert all(r.num_tokens is None and r.num_computed is not None for r in d.requests)
    assert d.reverse_queue_length is None
    assert [n for n in d.notes if "debug.extra" in n] == [
        "ignored tensor 'debug.extra' (not a tensor of the vLLM layout)"
    ]
    assert ("debug.extra", "int64", (3,), 24, True) in [
        (t.name, t.dtype, t.shape, t.bytes, t.ignored) for t in d.tensors
    ]
    assert not any(t.ignored for t in d.tensors if t.name != "debug.extra")
    assert {g.kind for g in d.groups} == {"full", "sliding_window"}
    assert any(g.null_entries for g in d.groups if g.window is not None)  # dropped by the window


@pytest.mark.parametrize(
    ("recorded", "plain", "field", "column"),
    [
        # taken under async scheduling: each request's tokens in flight
        ("vllm-mamba-in-flight", "vllm-mamba-clean", "num_in_flight", "in flight"),
        # a reference sliding window's gap starts after each request's prompt
        ("vllm-rswa-clean", "vllm-hybrid-clean", "num_prompt", "prompt"),
    ],
)
def test_a_requests_optional_count_is_shown_where_the_dump_records_it(
    recorded: str, plain: str, field: str, column: str, tmp_path: Path
) -> None:
    """A per-request count some dumps record (tokens in flight, the prompt's length) is a
    column of the table and a key in JSON where recorded; where not, no column, and null."""
    with_it, without = tmp_path / "with.safetensors", tmp_path / "without.safetensors"
    api.synth(recorded, with_it, seed=3)
    api.synth(plain, without, seed=3)
    counts = getattr(state_of(read_arrays(with_it)), f"request_{field}")
    assert counts is not None and counts.any()
    d = _described(with_it)
    assert [getattr(r, field) for r in d.requests] == counts.tolist()
    assert f"| {column} |" in str(render(d, OutputFormat.MARKDOWN))
    record = json.loads(runner.invoke(app, ["inspect", str(with_it), "-f", "json"]).output)
    assert validate(record, RECORDS[record["schema"]]) == []
    assert [r[field] for r in record["requests"]] == counts.tolist()
    older = _described(without)
    assert {getattr(r, field) for r in older.requests} == {None}
    assert f"| {column} |" not in str(render(older, OutputFormat.MARKDOWN))


def test_a_mamba_groups_bound_and_scratch_blocks_are_shown(tmp_path: Path) -> None:
    """A dump with a Mamba group shows its state bound and its scratch blocks (a speculative
    decoder's): two columns of the groups table, `max_states` and `speculative_blocks` in
    JSON; a dump without one has neither column."""
    drafting, window = tmp_path / "drafting.safetensors", tmp_path / "window.safetensors"
    api.synth("vllm-mamba-drafting-clean", drafting, seed=2)
    api.synth("vllm-hybrid-clean", window, seed=2)
    d = _described(drafting)
    assert [(g.kind, g.max_states, g.speculative_blocks) for g in d.groups] == [
        ("full", None, 0),
        ("mamba", 4, 2),
    ]
    markdown = str(render(d, OutputFormat.MARKDOWN))
    assert "| state bound | scratch |" in markdown and "| 4 | 2 |" in markdown
    shown = runner.invoke(app, ["inspect", str(drafting)], env={"COLUMNS": "160"}).output
    assert "state bound" in shown and "scratch" in shown
    record = json.loads(runner.invoke(app, ["inspect", str(drafting), "-f", "json"]).output)
    assert validate(record, RECORDS[record["schema"]]) == []
    assert [(g["max_states"], g["speculative_blocks"]) for g in record["groups"]] == [
        (None, 0),
        (4, 2),
    ]
    plain = _described(window)
    assert "state bound" not in str(render(plain, OutputFormat.MARKDOWN))
    # a bound the dump does not record is shown as not known
    unknown = dataclasses.replace(
        d, groups=(d.groups[0], dataclasses.replace(d.groups[1], max_states=None))
    )
    assert "| ? | 2 |" in str(render(unknown, OutputFormat.MARKDOWN))
