"""Commands with two outputs write both or neither (issue 36, class 8): every target is
checked before any is written, so a refused second file leaves no first file behind (whose
rerun would then be told it exists)."""

from __future__ import annotations

import os
from pathlib import Path

from typer.testing import CliRunner, Result

from kvcanary_cli.cli import app
from kvcanary_cli.synth.sequence import dump_name

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DUMP = str(EXAMPLES / "stale-tail.safetensors")


def run(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def test_a_refused_image_leaves_no_report(tmp_path: Path) -> None:
    report, image = tmp_path / "report.txt", tmp_path / "report.svg"
    image.write_text("kept")
    refused = run("check", DUMP, "-o", str(report), "--svg", str(image))
    assert refused.exit_code == 2 and "exists" in refused.stderr
    assert not report.exists() and image.read_text() == "kept"
    assert [p.name for p in tmp_path.iterdir()] == ["report.svg"]  # no temporary file either
    image.unlink()
    again = run("check", DUMP, "-o", str(report), "--svg", str(image))
    assert again.exit_code == 1, again.stderr  # the rerun is not told the report exists
    assert "ERRORS:" in report.read_text() and image.read_text().startswith("<svg ")


def test_an_image_over_an_input_leaves_no_report(tmp_path: Path) -> None:
    report = tmp_path / "report.txt"
    refused = run("check", DUMP, "-o", str(report), "--svg", DUMP)
    assert refused.exit_code == 2 and "is an input" in refused.stderr
    assert not report.exists()


def test_one_file_for_report_and_image_is_named_twice(tmp_path: Path) -> None:
    report = tmp_path / "report.txt"
    for spelled in (str(report), os.path.join(str(tmp_path), ".", "report.txt")):
        refused = run("check", DUMP, "-o", str(report), "--svg", spelled)
        assert refused.exit_code == 2
        assert "same file given twice" in refused.stderr and "is an input" not in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        assert not report.exists()


def test_a_refused_log_leaves_no_dump(tmp_path: Path) -> None:
    dump, log = tmp_path / "a.safetensors", tmp_path / "a.log"
    log.write_text("kept")
    refused = run("synth", "canary-aliasing", "--out", str(dump), "--log", str(log))
    assert refused.exit_code == 2 and "exists" in refused.stderr
    assert not dump.exists() and log.read_text() == "kept"
    log.unlink()
    assert run("synth", "canary-aliasing", "--out", str(dump), "--log", str(log)).exit_code == 0
    assert dump.stat().st_size > 0 and "violations=4" in log.read_text()


def test_a_log_the_scenario_cannot_have_leaves_no_dump(tmp_path: Path) -> None:
    dump = tmp_path / "a.safetensors"
    refused = run("synth", "clean-decode", "--out", str(dump), "--log", str(tmp_path / "a.log"))
    assert refused.exit_code == 2 and "violation ring" in refused.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_refused_step_leaves_no_other_steps(tmp_path: Path) -> None:
    folder = tmp_path / "seq"
    folder.mkdir()
    taken = folder / dump_name(0, 2)
    taken.write_bytes(b"someone else's")
    refused = run("synth", "clean", "--steps", "4", "--out", str(folder))
    assert refused.exit_code == 2 and "exists" in refused.stderr
    assert list(folder.iterdir()) == [taken] and taken.read_bytes() == b"someone else's"
    assert run("synth", "clean", "--steps", "4", "--out", str(folder), "--force").exit_code == 0
    assert len(list(folder.iterdir())) == 4


def test_plan_out_and_svg_are_checked_before_either_is_written(tmp_path: Path) -> None:
    plan, image = tmp_path / "plan.safetensors", tmp_path / "plan.svg"
    image.write_text("kept")
    refused = run("plan", DUMP, "--out", str(plan), "--svg", str(image))
    assert refused.exit_code == 2 and "exists" in refused.stderr and not plan.exists()
    twice = run("plan", DUMP, "--out", str(plan), "--svg", str(plan))
    assert twice.exit_code == 2 and "same file given twice" in twice.stderr
    assert not plan.exists()
    image.unlink()
    assert run("plan", DUMP, "--out", str(plan), "--svg", str(image)).exit_code == 0
    assert plan.stat().st_size > 0 and image.read_text().startswith("<svg ")
