"""The JSON view of any record: deterministic text (sorted keys, indent 2, trailing newline).

JSON keeps a record's strings exact (`json.dumps` escapes control characters itself), so this
view, unlike the others, does not make the record printable first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

__all__ = ["to_json"]


def to_json(record: Mapping[str, object]) -> str:
    """Deterministic JSON (sorted keys) so outputs diff cleanly and goldens stay stable."""
    return json.dumps(record, indent=2, sort_keys=True) + "\n"
