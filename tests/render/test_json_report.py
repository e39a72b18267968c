"""JSON output: parses, validates, carries every finding, and is byte-for-byte stable."""

from __future__ import annotations

import json

from kvcanary_cli.analysis.model import CheckReport, ProvenanceReport
from kvcanary_cli.render.json import to_json
from kvcanary_cli.render.records.check import CheckRecord, check_record
from kvcanary_cli.render.records.provenance import ProvenanceRecord, provenance_record
from tests.render.record_schema import validate


def test_check_json_parses_and_validates(any_report: CheckReport) -> None:
    text = to_json(check_record(any_report))
    assert text.endswith("}\n")
    data = json.loads(text)
    assert validate(data, CheckRecord) == []
    assert data == check_record(any_report)
    for dump, rec in zip(any_report.dumps, data["dumps"], strict=True):
        assert len(rec["findings"]) == len(dump.findings)


def test_check_json_keeps_every_finding_past_any_row_cap(single_report: CheckReport) -> None:
    data = json.loads(to_json(check_record(single_report)))
    lut = [f for f in data["dumps"][0]["findings"] if f["code"] == "lut-out-of-range"]
    assert len(lut) == 12


def test_check_json_is_deterministic(multi_report: CheckReport) -> None:
    text = to_json(check_record(multi_report))
    assert text == to_json(check_record(multi_report))
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


def test_provenance_json(any_provenance: ProvenanceReport) -> None:
    text = to_json(provenance_record(any_provenance))
    data = json.loads(text)
    assert validate(data, ProvenanceRecord) == []
    assert data == provenance_record(any_provenance)
    assert text.endswith("\n")
