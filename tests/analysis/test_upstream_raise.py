"""Where SGLang's reference raises (the first raise, derived once from the reference plans)
and the exception a dump records (`sglang.exception.type` and `.message`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcanary_cli.analysis.upstream_raise import raise_site
from kvcanary_cli.cli import app
from kvcanary_cli.dump.loader import RecordedException, load_dump
from kvcanary_cli.dump.schema import EXCEPTION_MESSAGE_KEY, EXCEPTION_TYPE_KEY, Group
from kvcanary_cli.errors import UpstreamPlanError
from kvcanary_cli.planners.base import reference_raise
from kvcanary_cli.synth.scenarios import make_scenario
from tests.analysis.conftest import ScenarioDump
from tests.helpers import REFERENCE, STRICT, checked


def test_first_raise_is_where_the_strict_reference_raises(scenario_dump: ScenarioDump) -> None:
    dump, _ = scenario_dump("truncated-lut", seed=2)
    report = checked(dump)
    with pytest.raises(UpstreamPlanError) as raised:
        for group in dump.groups:
            STRICT.plan(dump, group)
    assert report.first_raise is not None
    assert report.first_raise.message == raised.value.message
    assert report.first_raise.exception_type == raised.value.exception_type
    [marked] = [f for f in report.findings if f.first_raise]
    assert marked.code.value == "lut-out-of-range"
    assert (marked.batch_row, marked.position) == (
        report.first_raise.batch_row,
        report.first_raise.position,
    )
    assert f"SWA slot {marked.slot} " in report.first_raise.message


def test_clean_and_non_raising_dumps_have_no_first_raise(scenario_dump: ScenarioDump) -> None:
    for name in ("clean-swa", "use-after-free"):
        report = checked(scenario_dump(name)[0])
        assert report.first_raise is None and not any(f.first_raise for f in report.findings)


def test_the_raise_site_is_its_code_its_group_and_its_cell(scenario_dump: ScenarioDump) -> None:
    """`raise_site` (shared by the first raise and a kernel's launch raise) finds the marked
    finding, and no other: not under another code, not for another group's LUT read."""
    dump, _ = scenario_dump("truncated-lut", seed=2)
    [marked] = [f for f in checked(dump).findings if f.first_raise]
    raised = reference_raise(REFERENCE.plan(dump, "swa"))
    assert raised is not None and raised.group is Group.SWA
    site = raise_site(marked, raised)
    assert site is not None
    assert (site.batch_row, site.position) == (raised.problem.batch_row, raised.problem.position)
    assert raise_site(replace(marked, group=Group.FULL), raised) is None
    other_code = next(f for f in checked(dump).findings if f.code is not marked.code)
    assert raise_site(other_code, raised) is None


def _recording(tmp_path: Path, exception_type: str | None, message: str | None) -> Path:
    """truncated-lut (REF raises) with an exception recorded as the capture hook records it."""
    synth = make_scenario("truncated-lut", seed=1)
    if exception_type is not None:
        synth.metadata[EXCEPTION_TYPE_KEY] = exception_type
    if message is not None:
        synth.metadata[EXCEPTION_MESSAGE_KEY] = message
    return synth.save(tmp_path / "recorded.safetensors")


def test_the_loader_reads_the_recorded_exception_into_its_field(tmp_path: Path) -> None:
    dump = load_dump(_recording(tmp_path, "IndexError", "index 9 is out of bounds"))
    assert dump.recorded_exception == RecordedException(
        exception_type="IndexError", message="index 9 is out of bounds"
    )
    assert str(dump.recorded_exception) == "IndexError: index 9 is out of bounds"
    assert load_dump(_recording(tmp_path, None, "a message alone")).recorded_exception is None
    assert load_dump(_recording(tmp_path, "  ", "a blank type")).recorded_exception is None


def test_a_recorded_exception_that_matches_is_confirmed(tmp_path: Path) -> None:
    raised = checked(load_dump(_recording(tmp_path, None, None))).first_raise
    assert raised is not None
    path = _recording(tmp_path, raised.exception_type, raised.message)
    report = checked(load_dump(path))
    assert report.recorded_exception == f"{raised.exception_type}: {raised.message}"
    assert report.recorded_exception_matches is True
    result = CliRunner().invoke(app, ["check", str(path), "-k", "vectorized"])
    assert "the dump's note records the same exception" in result.stdout


def test_a_recorded_exception_that_differs_is_shouted(tmp_path: Path) -> None:
    message = "kv-canary: SWA slot 99999 is outside full_to_swa_index_mapping length 3"
    path = _recording(tmp_path, "ValueError", message)
    report = checked(load_dump(path))
    assert report.recorded_exception == f"ValueError: {message}"
    assert report.recorded_exception_matches is False
    result = CliRunner().invoke(app, ["check", str(path), "-k", "vectorized"])
    assert "MISMATCH: the dump's note records" in result.stdout
    result = CliRunner().invoke(app, ["check", str(path), "-k", "vectorized", "-f", "markdown"])
    assert "**Mismatch:**" in result.stdout


def test_the_same_message_under_another_type_differs(tmp_path: Path) -> None:
    raised = checked(load_dump(_recording(tmp_path, None, None))).first_raise
    assert raised is not None
    report = checked(load_dump(_recording(tmp_path, "RuntimeError", raised.message)))
    assert report.recorded_exception_matches is False


def test_a_recorded_exception_where_the_reference_does_not_raise(tmp_path: Path) -> None:
    synth = make_scenario("use-after-free", seed=1)
    synth.metadata.update({EXCEPTION_TYPE_KEY: "ValueError", EXCEPTION_MESSAGE_KEY: "boom"})
    report = checked(load_dump(synth.save(tmp_path / "clean-raise.safetensors")))
    assert report.first_raise is None
    assert (report.recorded_exception, report.recorded_exception_matches) == (
        "ValueError: boom",
        False,
    )


def test_no_recorded_exception_without_its_fields(
    tmp_path: Path, scenario_dump: ScenarioDump
) -> None:
    """A note alone records nothing, even one written the way the capture hook writes its
    note ("captured on Type: message"): the exception is read from its fields only."""
    report = checked(scenario_dump("truncated-lut")[0])
    assert report.recorded_exception is None and report.recorded_exception_matches is None
    raised = checked(load_dump(_recording(tmp_path, None, None))).first_raise
    assert raised is not None
    synth = make_scenario("truncated-lut", seed=1)
    synth.metadata["note"] = f"captured on {raised.exception_type}: {raised.message}"
    noted = checked(load_dump(synth.save(tmp_path / "noted.safetensors")))
    assert noted.recorded_exception is None and noted.recorded_exception_matches is None
