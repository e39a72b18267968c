"""`kvcanary ranks` from the command line: exit 0 identical, 1 a divergence (named the same in
every format), 2 and one error line for dumps of different steps or a single dump."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from kvcanary_cli.cli import app
from kvcanary_cli.synth.state import SynthDump
from tests.rank_dumps import PAGE, Tensors, rank_state, write_ranks
from tests.render.md_tables import tables
from tests.render.record_schema import RECORDS, validate


def run(*args: object) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def base() -> SynthDump:
    return rank_state()


@pytest.fixture(scope="module")
def identical(base: SynthDump, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_ranks(base, tmp_path_factory.mktemp("same"), ranks=2)


@pytest.fixture(scope="module")
def shorter(base: SynthDump, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Rank 2's batch row 1 matched a page less of its prefix."""

    def change(t: Tensors) -> None:
        t["prefix_lens"][1] -= PAGE
        t["extend_seq_lens"][1] += PAGE

    return write_ranks(base, tmp_path_factory.mktemp("shorter"), change)


def record(result: Result) -> dict[str, object]:
    found: dict[str, object] = json.loads(result.stdout)
    assert validate(found, RECORDS["kvcanary.ranks/1"]) == []
    return found


def test_identical_ranks_exit_0(identical: list[Path]) -> None:
    table = run("ranks", *identical)
    assert table.exit_code == 0 and table.stderr == ""
    assert "identical: every rank holds rank 0's bookkeeping" in table.stdout
    assert "divergent" not in table.stdout
    assert record(run("ranks", *identical, "-f", "json"))["verdict"] == "identical"


def test_a_divergence_is_named_alike_in_every_format(base: SynthDump, shorter: list[Path]) -> None:
    prefix = int(base.tensors["prefix_lens"][1])
    pool_row = int(base.tensors["req_pool_indices"][1])
    part = prefix - PAGE
    words = (
        f"divergent: rank 2: batch row 1 (pool row {pool_row}): prefix_lens {prefix} on rank 0, "
        f"{part} on rank 2: 4 tokens (1 page) apart; the prefixes part at position {part}, "
        f"page {part // PAGE}"
    )
    table = run("ranks", *shorter)
    assert table.exit_code == 1, table.stderr
    assert words in " ".join(table.stdout.split())  # the table wraps it at 80 columns
    found = record(run("ranks", *shorter, "--format", "json"))
    first = found["first_divergence"]
    assert isinstance(first, dict) and first["rank"] == "2"
    assert f"divergent: rank 2: {first['divergence']['message']}" == words
    markdown = run("ranks", *shorter, "--format", "markdown")
    assert markdown.exit_code == 1 and f"**{words}**" in markdown.stdout.replace("\\_", "_")
    rows = next(t for t in tables(markdown.stdout) if t[1][0] == "rank")[2]
    assert [r[:2] for r in rows] == [["0", "reference"], ["1", "identical"], ["2", "divergent"]]
    assert rows[2][3:7] == [str(1), str(pool_row), str(part), str(part // PAGE)]


@pytest.mark.parametrize(
    ("meta", "words"),
    [({"step": "8"}, "step: records step 8, "), ({"model": "m2"}, "model: records model 'm2'")],
)
def test_dumps_of_another_step_or_model_get_one_line(
    base: SynthDump, tmp_path: Path, meta: dict[str, str], words: str
) -> None:
    paths = write_ranks(base, tmp_path, meta=meta, ranks=2)
    result = run("ranks", *paths)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert f"{paths[1]}: {words}" in result.stderr


def test_one_dump_is_a_usage_error(identical: list[Path]) -> None:
    result = run("ranks", identical[0])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "give two dumps or more, of one step" in result.stderr


def test_json_names_the_rank_request_and_page(base: SynthDump, shorter: list[Path]) -> None:
    found = record(run("ranks", *reversed(shorter), "-f", "json"))  # any order: by rank
    ranks = found["ranks"]
    assert isinstance(ranks, list) and [r["rank"] for r in ranks] == ["0", "1", "2"]
    d = ranks[2]["divergence"]
    assert (d["kind"], d["batch_row"], d["page"]) == ("request", 1, (d["position"]) // PAGE)
    lengths = base.tensors["prefix_lens"] + base.tensors["extend_seq_lens"]
    used = int(np.sum(lengths[base.tensors["req_pool_indices"] > 0]))
    assert ranks[1]["divergence"] is None and ranks[1]["table_cells"] == used
