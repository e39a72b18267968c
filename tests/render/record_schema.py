"""Validate JSON values against the commands' typed results, which are their records.

The schema is the result dataclasses themselves (and the few `TypedDict`s that declare a
leaf's own JSON form, `__record__`), walked with `typing.get_type_hints`: an object has
exactly its declared keys (no missing, no extra), a `Literal` admits its values only (and `1`
is not `True`), a catalog enum (`FindingCode`, ...) its members' strings, `X | None`,
`list[X]` and `dict[K, V]` check their parts, and a nested declaration is checked the same
way. `JsonValue` (a finding's `details`) admits any JSON value.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
from collections.abc import Iterator, Sequence
from typing import (
    Annotated,
    Any,
    ForwardRef,
    Literal,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.results.columns import IntColumn
from kvcanary_cli.results.inspect import DumpDescription
from kvcanary_cli.results.leak import LeakReport
from kvcanary_cli.results.plan import PlanSummary
from kvcanary_cli.results.pool import PoolCheckReport, PoolProvenance
from kvcanary_cli.results.pool_inspect import PoolDumpDescription
from kvcanary_cli.results.pool_soak import PoolSoakReport
from kvcanary_cli.results.pool_timeline import PoolTimelineReport
from kvcanary_cli.results.provenance import ProvenanceReport
from kvcanary_cli.results.ranks import RanksReport
from kvcanary_cli.results.record import record_keys, to_record
from kvcanary_cli.results.selftest import SelftestReport
from kvcanary_cli.results.soak import SoakReport
from kvcanary_cli.results.timeline import TimelineReport
from kvcanary_cli.results.violations import ViolationsReport

__all__ = [
    "RECORDS",
    "declared_keys",
    "is_declaration",
    "nested_typeddicts",
    "record_of",
    "validate",
]

#: schema name -> the record's top-level declaration.
RECORDS: dict[str, Any] = {
    "kvcanary.check/2": CheckReport,
    "kvcanary.provenance/2": ProvenanceReport,
    "kvcanary.violations/1": ViolationsReport,
    "kvcanary.inspect/2": DumpDescription,
    "kvcanary.plan/1": PlanSummary,
    "kvcanary.selftest/1": SelftestReport,
    "kvcanary.timeline/1": TimelineReport,
    "kvcanary.soak/2": SoakReport,
    "kvcanary.ranks/1": RanksReport,
    "kvcanary.leak/1": LeakReport,
    "kvcanary.pool-check/1": PoolCheckReport,
    "kvcanary.pool-provenance/1": PoolProvenance,
    "kvcanary.pool-inspect/1": PoolDumpDescription,
    "kvcanary.pool-soak/1": PoolSoakReport,
    "kvcanary.pool-timeline/1": PoolTimelineReport,
}


def is_declaration(tp: Any) -> bool:
    """A record object's declaration: a result dataclass (`results/`), or a TypedDict."""
    return is_typeddict(tp) or (isinstance(tp, type) and dataclasses.is_dataclass(tp))


@functools.cache
def declared_keys(declaration: Any) -> dict[str, Any]:
    """A declaration's keys and their types, in record order, forward references resolved.

    A TypedDict's keys are its annotations (inherited ones first); a result dataclass' are
    `schema` (when it names one), its recorded fields, then its `@recorded` properties
    (`results.record.record_keys`). A field of a type with a JSON form of its own
    (`__record__`) is `Annotated` with that form's declaration: the key has the declaration."""
    if is_typeddict(declaration):
        return get_type_hints(declaration)
    hints = get_type_hints(declaration, include_extras=True)
    keys: dict[str, Any] = {}
    schema = getattr(declaration, "SCHEMA", None)
    if isinstance(schema, str):
        keys["schema"] = Literal[schema]
    for name, item in record_keys(declaration):
        tp = (
            hints[name]
            if isinstance(item, dataclasses.Field)
            else (get_type_hints(item.fget)["return"])
        )
        keys[name] = tp.__metadata__[0] if get_origin(tp) is Annotated else _own_records(tp)
    return keys


def _own_records(tp: Any) -> Any:
    """`tp` with each value that gives its own JSON form (`__record__`, a cell column set)
    read as the declaration its `__record__` returns."""
    own = getattr(tp, "__record__", None) if isinstance(tp, type) else None
    if own is not None:
        return get_type_hints(own)["return"]
    args = get_args(tp)
    if get_origin(tp) is Literal or not args:
        return tp
    resolved = tuple(_own_records(a) for a in args)
    if resolved == args:
        return tp
    if _is_union(tp):
        return Union[resolved]  # noqa: UP007
    return get_origin(tp)[resolved]


def record_of(result: object) -> Any:
    """A result's record (`to_record`), for a test to read by key."""
    return to_record(result)


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _is_json(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


def _plain(value: Any) -> Any:
    """A value as JSON holds it (an enum member as its value)."""
    return value.value if isinstance(value, enum.Enum) else value


def _same_value(value: Any, allowed: Any) -> bool:
    """`value` is `allowed` as JSON sees it: equal and of the same JSON type (`1` is not
    `True`); a member of a catalog enum is its string."""
    if isinstance(value, enum.Enum) or isinstance(allowed, enum.Enum):
        return type(_plain(value)) is type(_plain(allowed)) and _plain(value) == _plain(allowed)
    return type(value) is type(allowed) and bool(value == allowed)


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp)


def validate(value: Any, tp: Any, path: str = "$") -> list[str]:
    """Every place where `value` breaks the declaration `tp` (an empty list when it conforms)."""
    if isinstance(tp, ForwardRef) or tp is object:  # JsonValue's recursion, or any value
        return [] if _is_json(value) else [f"{path}: not a JSON value: {value!r}"]
    if is_declaration(tp):
        if not isinstance(value, dict):
            return [f"{path}: expected an object ({_name(tp)}), got {type(value).__name__}"]
        keys = declared_keys(tp)
        errors = [f"{path}: missing key {k!r}" for k in keys if k not in value]
        errors += [f"{path}: unexpected key {k!r}" for k in value if k not in keys]
        return errors + [
            e for k, t in keys.items() if k in value for e in validate(value[k], t, f"{path}.{k}")
        ]
    origin, args = get_origin(tp), get_args(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):  # a catalog code: its values
        origin, args = Literal, tuple(tp)
    if origin is Literal:
        ok = any(_same_value(value, a) for a in args)
        return [] if ok else [f"{path}: {value!r} not one of {[_plain(a) for a in args]}"]
    if _is_union(tp):
        if value is None:
            ok = type(None) in args
            return [] if ok else [f"{path}: null, expected {tp}"]
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:
            return validate(value, members[0], path)
        if any(not validate(value, m, path) for m in members):
            return []
        return [f"{path}: {value!r} is none of {tp}"]
    if origin is tuple:  # a result's tuple: a list in JSON
        origin, args = list, args[:1]
    if origin is list or origin is Sequence:  # a record's cell column: a list in JSON
        if not isinstance(value, list if origin is list else (list, IntColumn)):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [e for i, v in enumerate(value) for e in validate(v, args[0], f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {type(value).__name__}"]
        key_type, value_type = args
        errors = []
        for k, v in value.items():
            if not isinstance(k, str):
                errors.append(f"{path}: non-string key {k!r}")
            elif key_type is not str:
                errors += validate(k, key_type, f"{path}<key {k!r}>")
            errors += validate(v, value_type, f"{path}.{k}")
        return errors
    if tp is type(None):
        return [] if value is None else [f"{path}: expected null, got {value!r}"]
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif tp in (str, bool):
        ok = isinstance(value, tp)
    else:
        raise TypeError(f"{path}: the validator does not know {tp!r}")
    return [] if ok else [f"{path}: expected {_name(tp)}, got {value!r}"]


def nested_typeddicts(tp: Any) -> Iterator[Any]:
    """Every TypedDict a declaration reaches (itself first, each once, in key order)."""
    seen: set[Any] = set()

    def walk(t: Any) -> Iterator[Any]:
        if is_declaration(t):
            if t in seen:
                return
            seen.add(t)
            yield t
            for sub in declared_keys(t).values():
                yield from walk(sub)
        elif not isinstance(t, ForwardRef):
            for arg in get_args(t):
                yield from walk(arg)

    yield from walk(tp)
