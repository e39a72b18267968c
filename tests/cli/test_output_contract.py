"""Output that never hides a bad cell and never misleads (row maps, provenance, wording,
error shapes, output files, the Python API)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from kvcanary_cli import api
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.cli import app
from kvcanary_cli.dump.writer import save_dump
from kvcanary_cli.render import OutputFormat, render
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.results.provenance import ProvenanceReport
from kvcanary_cli.synth.scenarios import make_scenario

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def _long_row_dump(tmp_path: Path, length: int = 5000, bad_at: int = 3456) -> Path:
    """One request of `length` tokens whose slot at `bad_at` repeats the slot at 10."""
    table = np.zeros((3, length + 8), dtype=np.int32)
    table[1, :length] = np.arange(1, length + 1, dtype=np.int32)
    table[1, bad_at] = table[1, 10]
    return save_dump(
        tmp_path / "long.safetensors",
        req_to_token=table,
        req_pool_indices=[1],
        prefix_lens=[length],
        metadata={"num_full_slots": str(length + 64)},
    )


# --- provenance: row maps ---------------------------------------------------------------------


def test_a_row_map_shows_a_bad_cell_far_into_the_row_and_marks_the_gaps(tmp_path: Path) -> None:
    path = _long_row_dump(tmp_path)
    record = json.loads(run("provenance", str(path), "--row", "1", "-f", "json").stdout)
    row = record["row"]
    cells = {c["position"]: c for c in row["cells"]}
    assert cells[3456]["marks"] == ["duplicate-slot-in-row"]
    # every position is a shown cell or inside a gap, never silently skipped
    covered = set(cells)
    for gap in row["gaps"]:
        covered.update(range(gap["start"], gap["end"]))
    assert covered == set(range(row["max_seq_len"]))
    assert row["gaps"] and row["marks_not_shown"] == 0
    table = run("provenance", str(path), "--row", "1").stdout
    assert "not shown" in table and "! duplicate-slot-in-row" in table


def test_a_position_range_maps_just_that_range(tmp_path: Path) -> None:
    path = _long_row_dump(tmp_path)
    out = run("provenance", str(path), "--row", "1", "--positions", "3400:3500", "-f", "json")
    row = json.loads(out.stdout)["row"]
    assert row["positions"] == [3400, 3500]
    assert {c["position"] for c in row["cells"]} == set(range(3400, 3500))
    bad = run("provenance", str(path), "--row", "1", "--positions", "oops")
    assert bad.exit_code == 2 and "START:END" in bad.stderr
    assert "'--positions'" in bad.stderr  # the flag it is about, as click names one


def test_a_row_map_defaults_to_the_group_of_its_findings() -> None:
    record = json.loads(
        run(
            "provenance", str(EXAMPLES / "truncated-lut.safetensors"), "--row", "9", "-f", "json"
        ).stdout
    )
    assert record["row"]["group"] == "swa"
    assert any("lut-out-of-range" in c["marks"] for c in record["row"]["cells"])


# --- provenance: live cells first, the clamp target -------------------------------------------


def test_live_cells_come_first(tmp_path: Path) -> None:
    path = make_scenario("unfilled-cells", seed=0).save(tmp_path / "u.safetensors")
    report = api.check(path, kernel="none")
    assert isinstance(report, CheckReport)
    [finding] = [
        f for f in report.dumps[0].findings if f.code.value == "padding-slot-in-live-range"
    ]
    first = finding.provenance[0].cells[0]
    assert (first.pool_row, first.position) == (finding.pool_row, finding.position)
    answer = api.provenance(path, slot=0, max_cells=8)
    assert isinstance(answer, ProvenanceReport) and answer.slot is not None
    roles = [c.role for c in answer.slot.cells]
    live = {"verify", "prefix", "chain-prev", "pending-write"}
    assert roles[0] in live and roles == sorted(roles, key=lambda r: r not in live)


def test_the_clamp_target_shows_the_slots_redirected_to_it() -> None:
    path = EXAMPLES / "truncated-lut.safetensors"
    answer = api.provenance(path, slot=47, space="swa")  # LUT[lut_len - 1] of this dump
    assert isinstance(answer, ProvenanceReport) and answer.slot is not None
    assert 106 in answer.slot.mapped_from  # the last index maps: this LUT has no -1
    assert 107 in answer.slot.clamped_from
    assert all(c.full_slot is not None for c in answer.slot.cells)
    assert {c.full_slot for c in answer.slot.cells} >= {106, 107}
    table = run("provenance", str(path), "--slot", "47", "--space", "swa").stdout
    assert "redirected here by the GPU clamp" in table and "full slot" in table


# --- wording that does not mislead -----------------------------------------------------------


def test_differences_name_what_they_count() -> None:
    report = api.check(EXAMPLES / "truncated-lut.safetensors", kernel="vectorized")
    swa = next(g for g in report.dumps[0].groups if g.group == "swa")
    by_field = swa.explained_by_field[FindingCode.LUT_OUT_OF_RANGE]
    assert sum(by_field.values()) == swa.explained_differences[FindingCode.LUT_OUT_OF_RANGE]
    text = run("check", str(EXAMPLES / "truncated-lut.safetensors"), "-k", "vectorized").stdout
    assert "clamped 29 entries" not in text and "verify slots" in text and "counts twice" in text
    none = run("check", str(EXAMPLES / "truncated-lut.safetensors"), "-k", "none").stdout
    assert "not compared (--kernel none)" in none


def test_markdown_counts_dumps_in_plain_words() -> None:
    out = run("check", str(EXAMPLES / "use-after-free.safetensors"), "-f", "markdown").stdout
    assert "the dump fails at --fail-on error" in out and "1 of 1 dump" not in out


def test_markdown_stays_under_githubs_limit(tmp_path: Path) -> None:
    path = make_scenario("truncated-lut", size="small", seed=0).save(tmp_path / "s.safetensors")
    report = api.check(path, kernel="vectorized")
    assert isinstance(report, CheckReport)
    full = render(report, OutputFormat.MARKDOWN, max_rows=10_000)
    assert isinstance(full, str)
    from kvcanary_cli.render.markdown.check import check_markdown

    limit = len(full) // 2
    small = check_markdown(report, max_rows=10_000, limit=limit)
    assert len(small) <= limit < len(full)
    assert "Trimmed to fit GitHub's" in small and "--format json` has every finding" in small


def test_a_long_note_is_shortened_never_the_findings(tmp_path: Path) -> None:
    # A 70,000-character note left the summary table alone: the body was cut after it.
    plain = make_scenario("truncated-lut", seed=1).save(tmp_path / "plain.safetensors")
    usual = run("check", str(plain), "-k", "vectorized", "-f", "markdown").stdout
    findings = usual[usual.index("#### Diagnosis") :]
    for changes in ({"note": "n" * 70_000}, {"note": "n" * 60_000, "model": "m" * 60_000}):
        synth = make_scenario("truncated-lut", seed=1)
        synth.metadata.update(changes)
        # the same path: each cause's next command names the dump
        path = synth.save(plain, overwrite=True)
        out = run("check", str(path), "-k", "vectorized", "-f", "markdown").stdout
        assert len(out) <= 65_536 and "Trimmed" not in out
        assert out.endswith(findings)  # every finding, as without the note
        assert "n… (70,000 characters in all" in out or "n… (60,000 characters in all" in out


# --- one shape for a dump, readable or not; one line per error -------------------------------


def test_one_unreadable_dump_still_gets_its_json_record(tmp_path: Path) -> None:
    missing = tmp_path / "gone.safetensors"
    result = run("check", str(missing), "-f", "json")
    assert result.exit_code == 2
    [dump] = json.loads(result.stdout)["dumps"]
    assert dump["verdict"] == "bad-input" and str(missing) in dump["error"]
    assert result.stderr.strip().splitlines() == [f"error: {missing}: no such file"]


@pytest.mark.parametrize(
    "args",
    [
        ("check", "{dump}", "--kernel", "cuda"),
        ("check", "{dump}", "--format", "xml"),
        ("check", "{dump}", "--group", "nope"),
        ("check", "{dump}", "--max-rows", "0"),
        ("check", "{dump}", "--bogus"),
        ("check",),
        ("provenance", "{dump}"),
        ("provenance", "{dump}", "--row", "99999"),
        ("nosuchcommand",),
    ],
)
def test_usage_errors_are_one_line(args: tuple[str, ...]) -> None:
    dump = str(EXAMPLES / "clean-swa.safetensors")
    result = run(*(a.format(dump=dump) for a in args))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout == ""


def test_fail_on_info_is_accepted_and_fails_on_anything(tmp_path: Path) -> None:
    path = make_scenario("capacity-overflow", seed=0).save(tmp_path / "c.safetensors")
    assert run("check", str(path), "--fail-on", "error").exit_code == 0
    assert run("check", str(path), "--fail-on", "info").exit_code == 1


# --- output files --------------------------------------------------------------------------


def test_reports_go_to_a_file_with_the_umask_and_never_over_one(tmp_path: Path) -> None:
    dump = str(EXAMPLES / "use-after-free.safetensors")
    target = tmp_path / "report.json"
    old = os.umask(0o022)
    try:
        result = run("check", dump, "-f", "json", "-o", str(target))
    finally:
        os.umask(old)
    assert result.exit_code == 1 and result.stdout == ""
    assert json.loads(target.read_text())["verdict"] == "findings"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    again = run("check", dump, "-o", str(target))
    assert again.exit_code == 2 and "--force" in again.stderr
    target.chmod(0o600)
    assert run("check", dump, "-o", str(target), "--force").exit_code == 1
    assert stat.S_IMODE(target.stat().st_mode) == 0o600  # the replaced file's mode is kept
    assert "FINDINGS" not in target.read_text() and "ERRORS:" in target.read_text()


def test_quiet_prints_the_verdict_only() -> None:
    result = run("check", str(EXAMPLES / "truncated-lut.safetensors"), "-k", "vectorized", "-q")
    assert result.stdout.splitlines() == [
        "ERRORS: "
        + str(EXAMPLES / "truncated-lut.safetensors")
        + "  (16 error cells, 1 warning cell in 5 findings; fails --fail-on error)"
    ]


def test_shell_completion_is_offered() -> None:
    assert "--install-completion" in run("--help").stdout


# --- the Python API --------------------------------------------------------------------------


def test_the_python_api_returns_what_the_cli_renders() -> None:
    report = api.check(EXAMPLES / "truncated-lut.safetensors", kernel="vectorized")
    assert isinstance(report, CheckReport)
    assert report.dumps[0].diagnosis[0].code.value == "lut-too-short"
    rendered = render(report, OutputFormat.JSON)
    cli = run(
        "check", str(EXAMPLES / "truncated-lut.safetensors"), "-k", "vectorized", "-f", "json"
    )
    assert rendered == cli.stdout
    row = api.provenance(EXAMPLES / "stale-tail.safetensors", row=10)
    assert isinstance(row, ProvenanceReport) and row.row is not None and row.findings


@pytest.mark.parametrize("columns", ["0", "1", "39"])
def test_a_terminal_narrower_than_the_minimum_reads_as_the_minimum(columns: str) -> None:
    # COLUMNS=0 printed nothing at all (exit 0 for a clean dump), COLUMNS=1 a character a line.
    from kvcanary_cli.render.console import MIN_WIDTH

    result = CliRunner().invoke(
        app,
        ["check", str(EXAMPLES / "clean-swa.safetensors"), "-k", "vectorized"],
        env={"COLUMNS": columns},
    )
    lines = result.stdout.splitlines()
    assert result.exit_code == 0 and len(lines) > 5
    assert max(len(line) for line in lines) == MIN_WIDTH
    assert "CLEAN" in result.stdout and "clean-swa" in result.stdout
