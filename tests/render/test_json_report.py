"""JSON output: parses, validates, carries every finding, and is byte-for-byte stable."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcanary_cli.render.json import to_json
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.results.provenance import ProvenanceReport
from tests.render.record_schema import record_of, validate


def test_check_json_parses_and_validates(any_report: CheckReport) -> None:
    text = to_json(record_of(any_report))
    assert text.endswith("}\n")
    data = json.loads(text)
    assert validate(data, CheckReport) == []
    assert data == record_of(any_report)
    for dump, rec in zip(any_report.dumps, data["dumps"], strict=True):
        assert len(rec["findings"]) == len(dump.findings)


def test_check_json_keeps_every_finding_past_any_row_cap(single_report: CheckReport) -> None:
    data = json.loads(to_json(record_of(single_report)))
    lut = [f for f in data["dumps"][0]["findings"] if f["code"] == "lut-out-of-range"]
    assert len(lut) == 12


def test_check_json_is_deterministic(multi_report: CheckReport) -> None:
    text = to_json(record_of(multi_report))
    assert text == to_json(record_of(multi_report))
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


def test_provenance_json(any_provenance: ProvenanceReport) -> None:
    text = to_json(record_of(any_provenance))
    data = json.loads(text)
    assert validate(data, ProvenanceReport) == []
    assert data["findings"] == [json.loads(to_json(record_of(f))) for f in any_provenance.findings]
    assert text.endswith("\n")


_SCALARS = st.none() | st.booleans() | st.integers(-(1 << 62), 1 << 62) | st.text(max_size=8)
_VALUES = st.recursive(
    _SCALARS | st.lists(st.integers(-(1 << 62), 1 << 62), min_size=15, max_size=40),
    lambda inner: st.lists(inner, max_size=20) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=60,
)


@pytest.mark.slow  # the fast lane's heaviest test: 30 generated records, up to 60 leaves each
@settings(max_examples=30, deadline=None)
@given(record=st.dictionaries(st.text(max_size=6), _VALUES))
def test_json_text_reads_back_as_the_record(record: dict[str, object]) -> None:
    """Long integer lists go on one line; the text still parses to the very record, and the
    same record gives the same text (no marker or stray list survives)."""
    text = to_json(record)
    assert json.loads(text) == record
    assert text == to_json(record)
    assert "kvcanary-inline-" not in text or "kvcanary-inline-" in json.dumps(record)


def test_long_integer_lists_are_one_line_and_nothing_else_is() -> None:
    record = {"cells": list(range(100)), "flags": [1] * 20 + [True], "short": [1, 2, 3]}
    lines = to_json(record).splitlines()
    assert '  "cells": [' + ",".join(map(str, range(100))) + "]," in lines
    assert "    true" in lines  # a list holding a bool keeps one item per line
    assert "    3" in lines  # short lists too


def test_long_integer_lists_written_in_slices_are_the_whole_lists() -> None:
    # More entries than one slice converts (three slices and a part), int64 extremes among
    # them: the pieces joined are the list's one-line JSON, with a comma between slices.
    import numpy as np

    from kvcanary_cli.results.columns import JSON_SLICE, IntColumn

    values = np.arange(-JSON_SLICE, 2 * JSON_SLICE + 5, dtype=np.int64) * 3
    values[[0, -1]] = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    ints = values.tolist()
    record = {"column": IntColumn(values), "list": ints, "tuple": tuple(ints[: JSON_SLICE + 1])}
    one_line = {key: json.dumps(ints, separators=(",", ":")) for key in ("column", "list")}
    one_line["tuple"] = json.dumps(ints[: JSON_SLICE + 1], separators=(",", ":"))
    lines = to_json(record).splitlines()
    for key, text in one_line.items():
        assert f'  "{key}": {text}' in {line.rstrip(",") for line in lines}
