"""JSON output: parses, validates, carries every finding, and is byte-for-byte stable."""

from __future__ import annotations

import json

from kvcanary_cli.analysis.model import CheckReport, ProvenanceReport
from kvcanary_cli.render.json_report import check_json, provenance_json
from kvcanary_cli.render.records import provenance_record, to_record
from tests.render.render_schema import CHECK, PROVENANCE_REPORT, validate


def test_check_json_parses_and_validates(any_report: CheckReport) -> None:
    text = check_json(any_report)
    assert text.endswith("}\n")
    data = json.loads(text)
    assert validate(data, CHECK) == []
    assert data == to_record(any_report)
    for dump, rec in zip(any_report.dumps, data["dumps"], strict=True):
        assert len(rec["findings"]) == len(dump.findings)


def test_check_json_keeps_every_finding_past_any_row_cap(single_report: CheckReport) -> None:
    data = json.loads(check_json(single_report))
    lut = [f for f in data["dumps"][0]["findings"] if f["code"] == "lut-out-of-range"]
    assert len(lut) == 12


def test_check_json_is_deterministic(multi_report: CheckReport) -> None:
    text = check_json(multi_report)
    assert text == check_json(multi_report)
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


def test_provenance_json(any_provenance: ProvenanceReport) -> None:
    text = provenance_json(any_provenance)
    data = json.loads(text)
    assert validate(data, PROVENANCE_REPORT) == []
    assert data == provenance_record(any_provenance)
    assert text.endswith("\n")
