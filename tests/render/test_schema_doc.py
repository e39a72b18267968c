"""docs/json-schema.md documents every key the validator (and so the output) has."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.render.render_schema import CHECK, ListOf, MapOf, Nullable

DOC = (Path(__file__).resolve().parents[2] / "docs" / "json-schema.md").read_text()
QUOTED_KEYS = set(re.findall(r'"([a-z0-9_]+)":', DOC))


def _keys(spec: Any) -> set[str]:
    if isinstance(spec, ListOf | Nullable):
        return _keys(spec.item if isinstance(spec, ListOf) else spec.inner)
    if isinstance(spec, MapOf):
        return _keys(spec.value)
    if isinstance(spec, dict):
        return set(spec) | {k for v in spec.values() for k in _keys(v)}
    return set()


def test_every_check_record_key_is_documented() -> None:
    missing = sorted(_keys(CHECK) - QUOTED_KEYS)
    assert missing == [], f"docs/json-schema.md does not name: {missing}"
