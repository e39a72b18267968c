"""The `kvcanary.check/2` record: schema, completeness, order, verdicts, caps."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

from kvcanary_cli.catalog import FindingCode, Severity
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.results.cells import Role
from kvcanary_cli.results.check import CheckReport, DumpReport, Finding
from kvcanary_cli.results.provenance import ProvenanceReport
from tests.render.record_schema import record_of, validate

CODE_INDEX = {c.value: i for i, c in enumerate(FindingCode)}


def test_record_matches_schema(any_report: CheckReport) -> None:
    record = record_of(any_report)
    assert validate(record, CheckReport) == []
    assert json.loads(json.dumps(record)) == record  # JSON types only


def test_every_finding_is_in_the_record(multi_report: CheckReport) -> None:
    record = record_of(multi_report)
    for dump, rec in zip(multi_report.dumps, record["dumps"], strict=True):
        assert len(rec["findings"]) == len(dump.findings) == rec["findings_total"]
        assert sum(c["count"] for c in rec["counts"]) == len(dump.findings)
    total = sum(len(d.findings) for d in multi_report.dumps)
    assert record["summary"]["findings"] == total
    assert sum(record["summary"]["counts"].values()) == total
    by_severity = record["summary"]["by_severity"]
    assert by_severity["error"] + by_severity["warning"] + by_severity["info"] == total


def test_finding_fields_are_copied(single_report: CheckReport) -> None:
    findings = single_report.dumps[0].findings
    records = record_of(single_report)["dumps"][0]["findings"]
    expected = sorted(
        (
            f.code.value,
            f.group,
            f.slot,
            f.space,
            f.batch_row,
            f.pool_row,
            f.position,
            f.role,
            f.message,
        )
        for f in findings
    )
    got = sorted(
        (
            r["code"],
            r["group"],
            r["slot"],
            r["space"],
            r["batch_row"],
            r["pool_row"],
            r["position"],
            r["role"],
            r["message"],
        )
        for r in records
    )
    assert got == expected
    lut = next(r for r in records if r["code"] == "lut-out-of-range")
    assert lut["details"]["cells"] == [5, lut["position"]]  # tuples become lists
    dup = next(r for r in records if r["code"] == "duplicate-slot-in-row")
    [prov] = dup["provenance"]
    assert dup["provenance_total"] == 1
    assert prov["cells_total"] == 5 and len(prov["cells"]) == 3
    assert [c["shared"] for c in prov["cells"]] == [False, False, True]
    assert prov["canary"][0]["buffer"] == "canary.full.head.k"
    assert prov["violations"] == [{"index": 0, "fields": [77, 4, 1, 0]}]
    assert prov["allocator"] == "free" and prov["swa_slot"] == 12


def _none_last(v: int | None) -> tuple[bool, int]:
    return (v is None, v or 0)


def test_findings_order(multi_report: CheckReport) -> None:
    for rec in record_of(multi_report)["dumps"]:
        keys = [
            (
                -Severity(f["severity"]).rank,
                CODE_INDEX[f["code"]],
                f["group"],
                _none_last(f["batch_row"]),
                _none_last(f["position"]),
                _none_last(f["slot"]),
            )
            for f in rec["findings"]
        ]
        assert keys == sorted(keys)
        severities = [f["severity"] for f in rec["findings"]]
        assert severities == sorted(severities, key=lambda s: -Severity(s).rank)
        count_keys = [
            (-Severity(c["severity"]).rank, CODE_INDEX[c["code"]], c["group"])
            for c in rec["counts"]
        ]
        assert count_keys == sorted(count_keys)
        assert len(set(count_keys)) == len(count_keys)


def test_order_does_not_depend_on_input_order(single_report: CheckReport) -> None:
    dump = single_report.dumps[0]
    baseline = json.dumps(record_of(single_report), sort_keys=True)
    for seed in range(5):
        findings = list(dump.findings)
        random.Random(seed).shuffle(findings)
        shuffled = CheckReport(dumps=(replace(dump, findings=tuple(findings)),))
        assert json.dumps(record_of(shuffled), sort_keys=True) == baseline


def test_none_sorts_last() -> None:
    base = Finding(
        code=FindingCode.NEGATIVE_SLOT,
        group=Group.FULL,
        batch_row=1,
        position=3,
        slot=5,
        pool_row=2,
        role=Role.VERIFY,
        message="m",
    )
    assert base.order_key() < replace(base, batch_row=None).order_key()
    assert base.order_key() < replace(base, position=None).order_key()
    assert base.order_key() < replace(base, slot=None).order_key()


def test_verdicts(multi_report: CheckReport) -> None:
    record = record_of(multi_report)
    assert [d["verdict"] for d in record["dumps"]] == ["errors", "clean", "warnings", "bad-input"]
    assert [d["fails"] for d in record["dumps"]] == [True, False, False, False]
    assert record["verdict"] == "bad-input"  # exit code 2 outranks 1
    assert record["summary"]["failed"] == 1 and record["summary"]["bad_input"] == 1
    error = record["dumps"][3]["error"]
    assert error is not None and error.startswith("missing tensor")

    warn = record_of(replace(multi_report, fail_on=Severity.WARNING))
    assert [d["fails"] for d in warn["dumps"]] == [True, False, True, False]
    assert warn["fail_on"] == "warning"


def test_top_level_verdicts(
    single_report: CheckReport, clean_report: CheckReport, warning_dump: DumpReport
) -> None:
    assert record_of(single_report)["verdict"] == "findings"
    assert record_of(clean_report)["verdict"] == "clean"
    only_warnings = CheckReport(dumps=(warning_dump,))
    assert record_of(only_warnings)["verdict"] == "clean"
    assert record_of(replace(only_warnings, fail_on=Severity.WARNING))["verdict"] == "findings"
    assert record_of(CheckReport(dumps=()))["verdict"] == "clean"


def test_details_are_made_json_safe() -> None:
    finding = Finding(
        code=FindingCode.NEGATIVE_SLOT,
        group=Group.FULL,
        message="m",
        details={"t": (1, 2), "nested": {"b": (3,), "a": None}, "odd": {1, 2}},  # type: ignore[dict-item]  # not JSON: made so
    )
    report = CheckReport(
        dumps=(DumpReport(path="p", identity={}, bs=1, groups=(), findings=(finding,)),)
    )
    details = record_of(report)["dumps"][0]["findings"][0]["details"]
    assert details["t"] == [1, 2] and details["nested"] == {"a": None, "b": [3]}
    assert isinstance(details["odd"], str)
    assert validate(record_of(report), CheckReport) == []


def test_provenance_record_matches_schema(any_provenance: ProvenanceReport) -> None:
    record = record_of(any_provenance)
    assert validate(record, ProvenanceReport) == []
    assert record["schema"] == "kvcanary.provenance/2"
    assert len(record["findings"]) == len(any_provenance.findings)


def test_provenance_record_row(row_report: ProvenanceReport) -> None:
    row = record_of(row_report)["row"]
    assert row is not None
    assert [c["position"] for c in row["cells"]] == list(range(10))
    # marks follow FindingCode order, whatever order the analysis gave
    assert row["cells"][4]["marks"] == ["swa-unmapped-in-window", "duplicate-slot-in-row"]
    assert row["cells"][2]["marks"] == ["padding-slot-in-live-range"]


def test_schema_validator_catches_mistakes(single_report: CheckReport) -> None:
    record: dict[str, Any] = json.loads(json.dumps(record_of(single_report)))
    finding = record["dumps"][0]["findings"][0]
    del finding["role"]
    finding["slot"] = "12"
    finding["extra"] = 1
    finding["code"] = "no-such-code"  # a catalog enum admits its members' strings only
    record["fail_on"] = 2
    errors = validate(record, CheckReport)
    assert any("missing key 'role'" in e for e in errors)
    assert any(".slot: expected int" in e for e in errors)
    assert any("unexpected key 'extra'" in e for e in errors)
    assert any(".code: 'no-such-code' not one of" in e for e in errors)
    assert any(".fail_on: 2 not one of" in e for e in errors)
