"""Generate the key tables of docs/json-schema.md from the commands' typed results.

Each table in the doc follows a marker naming the declarations it shows,
`<!-- record keys: DumpReport Cause -->`, and is a ```text block: one object per name, its
keys in record order (`results.record.record_keys`), each with its type (from
`typing.get_type_hints`) and its documentation (the `#:` comment above the field in
`kvcanary_cli/results/`). A declaration named by some marker is shown as `<its name>`
wherever it is used; any other is written out in place. `<!-- record names -->` marks the
legend of the named value sets (finding codes, ...). The doc's prose is left as it is.

    python -m tests.render.schema_doc      # rewrite docs/json-schema.md's tables

tests/render/test_schema_doc.py checks that the doc's tables are what this generates.
"""

from __future__ import annotations

import ast
import enum
import functools
import json
import re
import sys
import textwrap
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ForwardRef, Literal, Union, get_args, get_origin

from kvcanary_cli.catalog import CauseCode, EventKind, FindingCode
from kvcanary_cli.results.check import PlanValueName
from kvcanary_cli.results.selftest import PlanField
from kvcanary_cli.results.violations import OriginName
from tests.render.record_schema import RECORDS, declared_keys, is_declaration, nested_typeddicts

__all__ = ["DOC", "MARKER", "declarations", "generate", "render_doc", "value_set"]

DOC = Path(__file__).resolve().parents[2] / "docs" / "json-schema.md"
#: `<!-- record keys: Name Name -->` and the ```text block after it.
MARKER = re.compile(r"<!-- record keys: ([\w ]+) -->\n```text\n.*?```", re.S)
_LEGEND = re.compile(r"<!-- record names -->\n```text\n.*?```", re.S)

#: Value sets shown by name (their values are in the legend): as a dict's keys always, as a
#: value when they are long.
NAMES: dict[Any, str] = {
    FindingCode: "<finding code>",
    CauseCode: "<cause code>",
    PlanField: "<plan field>",
    PlanValueName: "<plan value>",
    OriginName: "<origin>",
    EventKind: "<event kind>",
}
_LONG = 8
#: where the comments start, and the widest line.
_COMMENT_COLUMN = 41
_WIDTH = 100


def declarations() -> dict[str, Any]:
    """Every TypedDict the six records reach, by class name (names are unique)."""
    found: dict[str, Any] = {}
    for record in RECORDS.values():
        for td in nested_typeddicts(record):
            assert found.setdefault(td.__name__, td) is td, f"two TypedDicts {td.__name__}"
    return found


@functools.cache
def _classes(module: str) -> dict[str, ast.ClassDef]:
    tree = ast.parse(Path(sys.modules[module].__file__ or "").read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


@functools.cache
def _source_lines(module: str) -> list[str]:
    return Path(sys.modules[module].__file__ or "").read_text().splitlines()


def _key_docs(td: Any) -> dict[str, str]:
    """Key -> the `#:` comment above its declaration, through the TypedDict bases."""
    node = _classes(td.__module__).get(td.__name__)
    if node is None:  # the functional form: no comments
        return {}
    docs: dict[str, str] = {}
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in declarations():
            docs.update(_key_docs(declarations()[base.id]))
    lines = _source_lines(td.__module__)
    for item in node.body:
        name, first = None, 0
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            name, first = item.target.id, item.lineno
        elif isinstance(item, ast.FunctionDef) and item.decorator_list:  # a @recorded key
            name, first = item.name, item.decorator_list[0].lineno
        if name is not None:
            comment: list[str] = []
            row = first - 2
            while row >= 0 and lines[row].strip().startswith("#:"):
                comment.insert(0, lines[row].strip()[2:].strip())
                row -= 1
            if comment:
                docs[name] = " ".join(comment)
    return docs


def _named_base(td: Any, named: set[str]) -> Any | None:
    node = _classes(td.__module__).get(td.__name__)
    for base in [] if node is None else node.bases:
        if isinstance(base, ast.Name) and base.id in named:
            return declarations()[base.id]
    return None


#: Declarations the doc names shorter than their class.
_SHORT_NAMES = {"DumpReport": "Dump", "GroupSummary": "Group"}


def display_name(td: Any) -> str:
    """`<shrink summary>` for ShrinkSummaryRecord (or ShrinkSummary)."""
    name = _SHORT_NAMES.get(td.__name__, td.__name__)
    words = re.findall(r"[A-Z]+(?=[A-Z][a-z]|$)|[A-Z][a-z]*", name.removesuffix("Record"))
    return f"<{' '.join(w.lower() for w in words)}>"


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _refers_to_itself(tp: Any) -> bool:
    """A recursive alias (`JsonValue`) keeps a forward reference somewhere inside."""
    return isinstance(tp, ForwardRef) or any(_refers_to_itself(a) for a in get_args(tp))


def value_set(tp: Any) -> tuple[Any, ...] | None:
    """The values a `Literal` or a catalog enum (a `StrEnum`) admits, in order; None for any
    other type."""
    if get_origin(tp) is Literal:
        return get_args(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tuple(member.value for member in tp)
    return None


def _literal(tp: Any, *, as_key: bool = False) -> str:
    values = value_set(tp) or ()
    name = NAMES.get(tp)
    if name is not None and (as_key or len(values) > _LONG):
        return f'"{name}"' if as_key else name
    if as_key:
        return '"<key>"'
    return " | ".join(json.dumps(v) for v in values)


def type_text(tp: Any, named: set[str]) -> str:
    """A type as the doc writes it: `int | null`, `[str]`, `{"<key>": int}`, `"a" | "b"`."""
    if tp is type(None):
        return "null"
    if tp in (str, int, float, bool):
        return str(tp.__name__)
    if isinstance(tp, ForwardRef) or (_is_union(tp) and _refers_to_itself(tp)):
        return "<JSON value>"
    if is_declaration(tp):
        if tp.__name__ in named:
            return display_name(tp)
        keys = declared_keys(tp).items()  # in a type (a dict's values): on one line
        return "{" + ", ".join(f"{json.dumps(k)}: {type_text(t, named)}" for k, t in keys) + "}"
    origin, args = get_origin(tp), get_args(tp)
    if value_set(tp) is not None:
        return _literal(tp)
    if _is_union(tp):
        members = [a for a in args if a is not type(None)]
        tail = [" | null"] if len(members) < len(args) else []
        return " | ".join(type_text(m, named) for m in members) + "".join(tail)
    if origin in (list, tuple, Sequence):  # a tuple, a cell column (`IntColumn`): a JSON list
        return f"[{type_text(args[0], named)}]"
    if origin is dict:
        key = _literal(args[0], as_key=True) if value_set(args[0]) is not None else '"<key>"'
        return f"{{{key}: {type_text(args[1], named)}}}"
    raise TypeError(f"no doc form for {tp!r}")


def _with_comment(lines: list[str], doc: str | None) -> list[str]:
    """A key's lines with its comment: beside a short single line, else below."""
    if not doc:
        return lines
    chunks = textwrap.wrap(doc, _WIDTH - _COMMENT_COLUMN - 3)
    pad = " " * _COMMENT_COLUMN
    if len(lines) == 1 and len(lines[0]) < _COMMENT_COLUMN - 1:
        first = [f"{lines[0].ljust(_COMMENT_COLUMN)}// {chunks[0]}"]
        return first + [f"{pad}// {chunk}" for chunk in chunks[1:]]
    return lines + [f"{pad}// {chunk}" for chunk in chunks]


def _wrapped(head: str, text: str) -> list[str]:
    """`head + text`, a long union broken before a `|`, aligned under the value."""
    if len(head + text) <= _WIDTH or " | " not in text:
        return [head + text]
    parts = text.split(" | ")
    lines, line = [], head + parts[0]
    for part in parts[1:]:
        if len(line) + len(" | ") + len(part) > _WIDTH:
            lines.append(line)
            line = " " * (len(head) - 2) + "| " + part
        else:
            line += " | " + part
    return [*lines, line]


def _inline(tp: Any, named: set[str]) -> tuple[Any, str, str] | None:
    """A TypedDict written out in place: (it, what opens it, what follows its `}`)."""
    nullable = _is_union(tp) and type(None) in get_args(tp)
    members = [a for a in get_args(tp) if a is not type(None)] if nullable else [tp]
    if len(members) != 1:
        return None
    inner = members[0]
    tail = " | null" if nullable else ""
    if is_declaration(inner) and inner.__name__ not in named:
        return inner, "{", tail
    if get_origin(inner) in (list, tuple):
        item = get_args(inner)[0]
        if is_declaration(item) and item.__name__ not in named:
            return item, "[ {", " ]" + tail
    return None


def _object_lines(td: Any, indent: int, named: set[str], skip: set[str]) -> list[str]:
    keys = {k: t for k, t in declared_keys(td).items() if k not in skip}
    docs = _key_docs(td)
    lines: list[str] = []
    for i, (key, tp) in enumerate(keys.items()):
        comma = "," if i < len(keys) - 1 else ""
        head = " " * indent + json.dumps(key) + ": "
        inline = _inline(tp, named)
        if inline is None:
            lines += _with_comment(_wrapped(head, type_text(tp, named) + comma), docs.get(key))
            continue
        inner, opening, tail = inline
        lines += _with_comment([head + opening], docs.get(key))
        step = 4 if opening == "[ {" else 2
        lines += _object_lines(inner, indent + step, named, set())
        lines.append(" " * indent + "}" + tail + comma)
    return lines


def generate(names: list[str], named: set[str]) -> str:
    """The ```text block of one marker: the named TypedDicts, one after another."""
    blocks = []
    for name in names:
        td = declarations()[name]
        top = td in RECORDS.values()
        base = None if top else _named_base(td, named)
        lines = ["{" if top else f"{display_name(td)} = {{"]
        skip: set[str] = set()
        if base is not None:
            skip = set(declared_keys(base))
            spread = f"  ...{display_name(base)},"
            lines += _with_comment([spread], f"every key of {display_name(base)}")
        lines += _object_lines(td, 2, named, skip)
        lines.append("}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def legend() -> str:
    """The named value sets and their values."""
    out = []
    for tp, name in NAMES.items():
        values = [json.dumps(v) for v in value_set(tp) or ()]
        head = f"{name} = "
        line, lines = head + values[0], []
        for value in values[1:]:
            if len(line) + len(" | ") + len(value) > _WIDTH:
                lines.append(line)
                line = " " * (len(head) - 2) + "| " + value
            else:
                line += " | " + value
        out.append("\n".join([*lines, line]))
    return "\n".join(out)


def render_doc(doc: str) -> str:
    """`doc` with every marked table (and the legend) regenerated."""
    named = {n for m in MARKER.finditer(doc) for n in m.group(1).split()}
    doc = MARKER.sub(
        lambda m: (
            f"<!-- record keys: {m.group(1)} -->\n```text\n"
            f"{generate(m.group(1).split(), named)}\n```"
        ),
        doc,
    )
    return _LEGEND.sub(lambda m: f"<!-- record names -->\n```text\n{legend()}\n```", doc)


if __name__ == "__main__":
    DOC.write_text(render_doc(DOC.read_text()))
