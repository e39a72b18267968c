"""What a new user reads (issue 26): reports at 80 columns, `--max-rows` on every table, one
unit per number, row maps that say what they leave out, output without padding, bad input
said once, and the words, help and documents around them."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from kvcanary_cli.cli import app

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
EXAMPLE_NAMES = sorted(p.name for p in EXAMPLES.glob("*.safetensors"))


def run(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


# --- output without padding; bad input said once ------------------------------------------


@pytest.mark.parametrize("command", ["check", "provenance", "inspect"])
def test_piped_and_file_output_has_no_padding_spaces(command: str, tmp_path: Path) -> None:
    dump = str(EXAMPLES / "truncated-lut.safetensors")
    args = {
        "check": ["check", dump, "-k", "vectorized"],
        "provenance": ["provenance", dump, "--slot", "107"],
        "inspect": ["inspect", dump],
    }[command]
    piped = run(*args)
    target = tmp_path / "report.txt"
    assert run(*args, "-o", str(target)).exit_code == piped.exit_code
    for text in (piped.stdout, target.read_text()):
        padded = [line for line in text.splitlines() if line != line.rstrip()]
        assert padded == [], padded[:3]
        assert "━━" in text  # tables are still drawn


def test_an_unreadable_dump_is_reported_once(tmp_path: Path) -> None:
    bad = tmp_path / "cut.safetensors"
    bad.write_bytes((EXAMPLES / "stale-tail.safetensors").read_bytes()[:100])
    good = str(EXAMPLES / "stale-tail.safetensors")
    for args in ([str(bad)], [str(bad), good]):
        result = run("check", *args)
        assert result.exit_code == 2
        [line] = result.stderr.strip().splitlines()
        reason = line.removeprefix("error: ")
        assert "runs past the end" in reason
        assert "runs past the end" not in result.stdout  # said once: on stderr
        said = " ".join(result.stdout.split())
        assert f"BAD INPUT: {bad} (unreadable: the error line on stderr says why)" in said
    # a report written to a file keeps the reason: nothing else holds it there
    target = tmp_path / "report.txt"
    assert run("check", str(bad), good, "-o", str(target)).exit_code == 2
    assert "runs past the end" in target.read_text()
