"""A command's typed result is its record: one generic `to_record` for every command.

A result is a frozen dataclass whose fields are the record's keys, in the order JSON writes
them, and whose `SCHEMA` class constant names the record (`kvcanary.plan/1`). A value the
record derives from the fields is a `@recorded` property: a key after the fields. A field a
view needs but the record does not carry says so with `not_recorded()`. So one JSON key is
one declaration: the field (with its `#:` comment, which docs/json-schema.md's key tables
are generated from) or the property.

`to_record` maps a result to JSON values: a dataclass to an object, an enum to its value, a
tuple to a list, a map's keys to strings; a value that knows its own JSON form gives it
(`__record__`), and an integer column (`IntColumn`) stays a column, which the JSON view
writes in pieces and a table view reads a few entries of.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, Protocol, TypeVar

__all__ = [
    "Result",
    "not_recorded",
    "recorded",
    "record_keys",
    "to_record",
]

T = TypeVar("T")

#: The metadata key of a field that is not a key of its record.
_NOT_RECORDED = "kvcanary.not_recorded"


class Result(Protocol):
    """A command's result: a dataclass that names its record's schema."""

    SCHEMA: ClassVar[str]


class _Recorded(property):
    """A property that is a key of its class' record."""


def recorded(getter: Callable[[Any], T]) -> T:
    """A derived value that is a key of the record, after the fields (a read-only property)."""
    return _Recorded(getter)  # type: ignore[return-value]


def not_recorded(**kwargs: Any) -> Any:
    """A dataclass field a view or the analysis reads but the record does not carry."""
    return dataclasses.field(metadata={_NOT_RECORDED: True}, **kwargs)


def record_keys(cls: type) -> Iterator[tuple[str, Any]]:
    """A result class' keys in record order: (name, the field or the property)."""
    for item in dataclasses.fields(cls):
        if not item.metadata.get(_NOT_RECORDED):
            yield item.name, item
    seen: set[str] = set()
    for klass in reversed(cls.__mro__):
        for name, attribute in vars(klass).items():
            if isinstance(attribute, _Recorded) and name not in seen:
                seen.add(name)
                yield name, attribute


@functools.cache
def _key_names(cls: type) -> tuple[str, ...]:
    """`record_keys`' names, once per class (a record of many rows walks a class per row)."""
    return tuple(name for name, _ in record_keys(cls))


def to_record(result: object) -> dict[str, object]:
    """The record of a result (a dataclass): `schema` first when the class names one."""
    record = _value(result)
    if not isinstance(record, dict):
        raise TypeError(f"not a result: {type(result).__name__}")
    return record


#: Values that are their own JSON form (exactly these types: an enum of int or str is not).
_PLAIN = frozenset({type(None), bool, int, float, str})


def _value(value: object) -> object:
    if type(value) in _PLAIN:  # most values: no isinstance chain
        return value
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, str):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        out: dict[str, object] = {}
        schema = getattr(cls, "SCHEMA", None)
        if isinstance(schema, str):
            out["schema"] = schema
        for name in _key_names(cls):
            out[name] = _value(getattr(value, name))
        return out
    own = getattr(value, "__record__", None)
    if own is not None:
        return own()
    if isinstance(value, tuple | list):
        return [_value(item) for item in value]
    if isinstance(value, Mapping):
        return {str(_value(key)): _value(item) for key, item in value.items()}
    raise TypeError(f"no record for a {type(value).__name__}")
