"""docs/json-schema.md's key tables are generated from the record declarations: the doc shows
every key of every record, with its declared type and documentation, and nothing else."""

from __future__ import annotations

import re

from tests.render.record_schema import RECORDS, declared_keys
from tests.render.schema_doc import DOC, MARKER, declarations, render_doc

TEXT = DOC.read_text()


def test_the_doc_tables_are_the_generated_ones() -> None:
    """Refresh with `python -m tests.render.schema_doc` after changing a declaration."""
    assert render_doc(TEXT) == TEXT


def test_a_hand_edited_table_is_caught() -> None:
    edited = TEXT.replace('"slot_idx": int,', '"slot_idx": str,', 1)
    assert edited != TEXT and render_doc(edited) != edited
    dropped = TEXT.replace('  "fix": str,\n', "", 1)
    assert dropped != TEXT and render_doc(dropped) != dropped


def test_every_record_has_a_table_and_every_key_is_shown() -> None:
    named = {n for m in MARKER.finditer(TEXT) for n in m.group(1).split()}
    assert {record.__name__ for record in RECORDS.values()} <= named
    tables = "\n".join(m.group(0) for m in MARKER.finditer(TEXT))
    shown = set(re.findall(r'"([a-z0-9_]+)":', tables))
    for name, td in declarations().items():
        missing = sorted(set(declared_keys(td)) - shown)
        assert missing == [], f"{name}: {missing} not in docs/json-schema.md"
