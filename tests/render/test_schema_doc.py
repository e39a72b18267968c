"""docs/json-schema.md documents every key the check record declares (and so outputs)."""

from __future__ import annotations

import re
from pathlib import Path

from kvcanary_cli.render.records.check import CheckRecord
from tests.render.record_schema import declared_keys, nested_typeddicts

DOC = (Path(__file__).resolve().parents[2] / "docs" / "json-schema.md").read_text()
QUOTED_KEYS = set(re.findall(r'"([a-z0-9_]+)":', DOC))


def test_every_check_record_key_is_documented() -> None:
    keys = {k for td in nested_typeddicts(CheckRecord) for k in declared_keys(td)}
    missing = sorted(keys - QUOTED_KEYS)
    assert missing == [], f"docs/json-schema.md does not name: {missing}"
