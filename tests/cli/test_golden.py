"""Golden outputs: every bundled example rendered in every format (refresh: --update-golden)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcanary_cli.cli import app

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.safetensors"))
GOLDEN = ROOT / "tests" / "golden"
SUFFIX = {"table": "txt", "json": "json", "markdown": "md"}


def test_examples_exist() -> None:
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("fmt", list(SUFFIX))
@pytest.mark.parametrize("example", EXAMPLES)
def test_check_output_matches_golden(
    example: str, fmt: str, update_golden: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    # The same bytes whether or not SGLang is installed where the tests run.
    monkeypatch.setattr("kvcanary_cli.api.installed_version", lambda: None)
    result = CliRunner().invoke(
        app, ["check", f"examples/{example}", "--kernel", "vectorized", "--format", fmt]
    )
    assert result.exit_code in (0, 1), result.stderr
    golden = GOLDEN / f"{Path(example).stem}.{SUFFIX[fmt]}"
    if update_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(result.stdout)
        pytest.skip("golden refreshed")
    assert golden.exists(), f"missing {golden}: run pytest --update-golden"
    assert result.stdout == golden.read_text()


@pytest.mark.parametrize("example", EXAMPLES)
def test_examples_report_what_they_record(example: str) -> None:
    """Each bundled dump's metadata says what check must find; check agrees."""
    from kvcanary_cli.dump.loader import load_dump
    from tests.helpers import checked

    dump = load_dump(ROOT / "examples" / example)
    report = checked(dump)
    expected = {c for c in dump.metadata.get("kvcanary.expected_findings", "").split(",") if c}
    allowed = {c for c in dump.metadata.get("kvcanary.allowed_findings", "").split(",") if c}
    codes = {f.code.value for f in report.findings}
    assert expected <= codes <= expected | allowed
    cause = dump.metadata.get("kvcanary.expected_diagnosis")
    assert [c.code.value for c in report.diagnosis][:1] == ([cause] if cause else [])


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_json_validates_against_the_schema(example: str) -> None:
    """The golden JSON of each example is a `kvcanary.check/2` record as docs/json-schema.md
    describes it (so are the JSON goldens `test_check_output_matches_golden` compares)."""
    import json

    from kvcanary_cli.results.check import CheckReport
    from tests.render.record_schema import validate

    record = json.loads((GOLDEN / f"{Path(example).stem}.json").read_text())
    assert record["schema"] == "kvcanary.check/2"
    assert validate(record, CheckReport) == []
