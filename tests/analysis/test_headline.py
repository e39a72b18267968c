"""A cause's headline is a bug-report sentence from the dump (issue 45): its slots, who holds
or last held them (pool row, position, running or not), and the step that went wrong; in the
JSON (`headline`) and heading the cause in the table and Markdown views, the catalog's
summary under it."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from kvcanary_cli.catalog import CauseCode
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.render import OutputFormat, render
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.results.record import to_record
from kvcanary_cli.synth.scenarios import make_scenario
from tests.analysis.test_owners import POSITION, _double_free
from tests.helpers import checked


def test_a_double_free_names_its_slots_last_owner_and_step(tmp_path: Path) -> None:
    report, slot, row = _double_free(tmp_path, free_row=True)
    [cause] = report.diagnosis
    assert cause.code is CauseCode.DOUBLE_FREE
    assert cause.headline == (
        f"full slots {slot}..{slot + 15}, last held by pool row {row} (slot {slot} at position "
        f"{POSITION}, "
        "finished), are on a free list twice: they were freed twice"
    )
    assert to_record(cause)["headline"] == cause.headline
    whole = CheckReport(dumps=(report,))
    console = Console(file=io.StringIO(), width=400, color_system=None, record=True)
    console.print(render(whole, OutputFormat.TABLE))
    table = console.export_text()
    assert f"1. double-free (certain): {cause.headline}" in table
    assert f"- {cause.summary}" in table
    assert cause.headline in str(render(whole, OutputFormat.MARKDOWN))


def test_a_live_slot_freed_names_its_running_owner(tmp_path: Path) -> None:
    d = make_scenario("use-after-free", seed=1)
    report = checked(load_dump(d.save(tmp_path / "uaf.safetensors")))
    [cause] = report.diagnosis
    [f] = report.findings
    assert cause.headline == (
        f"full slot {f.slot}, held by batch row {f.batch_row} (pool row {f.pool_row}, "
        f"position {f.position}, running), was freed while its owner still holds it"
    )


def test_a_cause_without_a_step_keeps_its_summary(tmp_path: Path) -> None:
    d = make_scenario("capacity-overflow", seed=1)
    report = checked(load_dump(d.save(tmp_path / "cap.safetensors")))
    assert report.diagnosis and all(c.headline is None for c in report.diagnosis)
