"""Owners inline (issue 45): every slot-level finding of `check` names its slots' current or
last owner (pool row, position, what the request is) in the JSON and the table and Markdown
views, without `provenance`; a finding of many slots names a few and counts the rest."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.render import OutputFormat, render
from kvcanary_cli.render.json import to_json
from kvcanary_cli.render.phrases.check import owners_phrase
from kvcanary_cli.results.check import CheckReport, DumpReport, Finding
from kvcanary_cli.results.record import to_record
from kvcanary_cli.synth.scenarios import make_scenario
from kvcanary_cli.synth.state import SynthDump
from tests.helpers import checked

POSITION = 68


def _idle_row(d: SynthDump) -> int:
    """A pool row no request of the batch uses."""
    used = set(d.tensors["req_pool_indices"].tolist())
    return next(r for r in range(1, d.tensors["req_to_token"].shape[0]) if r not in used)


def _double_free(tmp_path: Path, *, free_row: bool) -> tuple[DumpReport, int, int]:
    """A double-freed page whose first slot an idle pool row still holds at `POSITION` (its
    last owner), the row on the free request-row list when `free_row`."""
    d = make_scenario("double-free", seed=1)
    report = checked(load_dump(d.save(tmp_path / "plain.safetensors")))
    [f] = [f for f in report.findings if f.code is FindingCode.FREE_LIST_DUPLICATE]
    assert f.slot is not None
    row = _idle_row(d)
    d.tensors["req_to_token"][row, POSITION] = f.slot
    if free_row:
        d.tensors["free_req_rows"] = np.array([row], dtype=np.int64)
    name = "free-row" if free_row else "idle-row"
    return checked(load_dump(d.save(tmp_path / f"{name}.safetensors"))), f.slot, row


def _finding(report: DumpReport, code: FindingCode) -> Finding:
    [f] = [f for f in report.findings if f.code is code]
    return f


@pytest.mark.parametrize(("free_row", "state"), [(False, "idle"), (True, "finished")])
def test_a_double_freed_slot_names_its_last_owner(
    tmp_path: Path, free_row: bool, state: str
) -> None:
    report, slot, row = _double_free(tmp_path, free_row=free_row)
    f = _finding(report, FindingCode.FREE_LIST_DUPLICATE)
    owner = f.owners[0]
    assert (owner.slot, owner.pool_row, owner.position, owner.state) == (slot, row, POSITION, state)
    # bounded: a few slots of the 16 traced, the rest counted, never all
    assert len(f.owners) < f.provenance_total == 16
    assert all(o.pool_row is None for o in f.owners[1:])
    phrase = owners_phrase(f)
    assert phrase is not None
    expected = (
        f"idle pool row {row}, position {POSITION}"
        if state == "idle"
        else f"pool row {row}, position {POSITION} (finished"
    )
    assert expected in phrase and "more slots not traced" in phrase, phrase
    # in the JSON and both views
    [record] = json.loads(to_json(to_record(report)))["findings"]
    assert record["owners"][0]["pool_row"] == row and record["owners"][0]["state"] == state
    whole = CheckReport(dumps=(report,))
    markdown = str(render(whole, OutputFormat.MARKDOWN))
    console = Console(file=io.StringIO(), width=400, color_system=None, record=True)
    console.print(render(whole, OutputFormat.TABLE))
    assert expected in markdown and expected in console.export_text()


def test_a_live_slot_names_its_running_owner(tmp_path: Path) -> None:
    d = make_scenario("use-after-free", seed=1)
    report = checked(load_dump(d.save(tmp_path / "uaf.safetensors")))
    f = _finding(report, FindingCode.FREED_SLOT_IN_LIVE_RANGE)
    assert owners_phrase(f) == (
        f"owner of slot {f.slot}: pool row {f.pool_row}, position {f.position} "
        f"(running, batch row {f.batch_row})"
    )


def test_a_row_level_finding_names_no_owner(tmp_path: Path) -> None:
    d = make_scenario("req-row-leaked", seed=1)
    report = checked(load_dump(d.save(tmp_path / "row.safetensors")))
    row_findings = [f for f in report.findings if f.slot is None]
    assert row_findings and all(f.owners == () for f in row_findings)
