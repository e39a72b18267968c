"""One declaration per output field: a result's field is its record's key, in JSON, in the
schema doc and in the validator, with nothing else to edit.

A result class with one more field (made here as a subclass, as a developer would add the
field) gets the key in its JSON, in its generated doc table and in what the validator
demands, while the class as it is gets none of it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import kvcanary_cli.render as render_pkg
from kvcanary_cli.render import OutputFormat, render
from kvcanary_cli.results.record import not_recorded, record_keys, recorded, to_record
from tests.render import schema_doc
from tests.render.record_schema import RECORDS, declared_keys, is_declaration, validate

#: The converted results: every top-level record declared as a result dataclass.
RESULTS: dict[str, Any] = {
    schema: cls for schema, cls in RECORDS.items() if dataclasses.is_dataclass(cls)
}


def _json(result: Any) -> Any:
    text = render(result, OutputFormat.JSON)
    assert isinstance(text, str)
    return json.loads(text)


def _with_field(cls: type) -> Any:
    """`cls` with one more field, `added_key` (documented as a developer would)."""
    added = dataclasses.make_dataclass(
        cls.__name__,
        [("added_key", int, dataclasses.field(default=7))],
        bases=(cls,),
        frozen=True,
        kw_only=True,
    )
    added.__module__ = cls.__module__
    return added


@pytest.fixture(scope="module")
def plan_summary() -> Any:

    from kvcanary_cli import api

    example = Path(__file__).resolve().parents[2] / "examples" / "truncated-lut.safetensors"
    summary = api.plan(example, group="swa", backend="reference").summary
    assert summary is not None and summary.problems  # a plan with rows of each kind
    return summary


def test_every_record_is_a_result() -> None:
    """Every command's record is declared once, by its result class (no hand-built records
    left: `render/records/` is gone), and each class names the schema it is."""
    assert RESULTS == RECORDS and len(RESULTS) == 15
    assert all(cls.SCHEMA == schema for schema, cls in RESULTS.items())

    assert not (Path(render_pkg.__file__).parent / "records").exists()


def test_a_result_names_its_schema_first_and_its_fields_in_order(plan_summary: Any) -> None:
    record = to_record(plan_summary)
    assert list(record)[0] == "schema" and record["schema"] == type(plan_summary).SCHEMA
    assert list(record)[1:] == [f.name for f in dataclasses.fields(plan_summary)]
    assert validate(record, type(plan_summary)) == []


def test_an_added_field_reaches_json_the_validator_and_the_doc(plan_summary: Any) -> None:
    cls: Any = type(plan_summary)
    grown_cls = _with_field(cls)
    grown = grown_cls(**{f.name: getattr(plan_summary, f.name) for f in dataclasses.fields(cls)})

    shown = _json(grown)
    assert shown["added_key"] == 7 and "added_key" not in _json(plan_summary)
    assert "added_key" in declared_keys(grown_cls) and "added_key" not in declared_keys(cls)
    assert validate(shown, grown_cls) == []
    assert validate(_json(plan_summary), grown_cls) == ["$: missing key 'added_key'"]
    text = schema_doc.type_text(grown_cls, set())
    assert '"added_key": int' in text and '"added_key"' not in schema_doc.type_text(cls, set())


def test_derived_keys_follow_the_fields_and_internal_fields_stay_out() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Counted:
        SCHEMA = "kvcanary.example/1"

        values: tuple[int, ...]
        scratch: str = not_recorded(default="kept for a view")

        @recorded
        def total(self) -> int:
            return sum(self.values)

    assert [name for name, _ in record_keys(Counted)] == ["values", "total"]
    assert to_record(Counted(values=(1, 2))) == {
        "schema": "kvcanary.example/1",
        "values": [1, 2],
        "total": 3,
    }
    assert is_declaration(Counted) and list(declared_keys(Counted)) == [
        "schema",
        "values",
        "total",
    ]
