"""What the records still built by hand share (`render/records/`, until each command's result
is its record, `results.record`): the names of groups and spaces as `Literal` types.

The `Literal`s mirror enums of the analysis (`Group`, `Space`); tests/render/test_record_types.py
checks they hold the same values.
"""

from __future__ import annotations

from typing import Literal, cast

__all__ = ["GroupName", "SpaceName", "group_name"]

#: An attention group: full attention, or the sliding window's.
GroupName = Literal["full", "swa"]
#: Which KV pool a slot indexes.
SpaceName = Literal["full", "swa"]


def group_name(group: str) -> GroupName:
    """A group as the analysis names it (`full`, `swa`); `str()` keeps a StrEnum's value."""
    return cast(GroupName, str(group))
