"""'pool row' and 'batch row' always spelled out (issue 45): a bare "row" meant a batch row in
one line of a report and a pool row in the next. Every text the catalog gives a finding, cause,
event or violation-row cause, and every string the phrases put in a view (docstrings aside),
names its row: pool row (a row of req_to_token), batch row (a request's index in the batch),
or a row of a table or of the violation ring."""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

import pytest

from kvcanary_cli import catalog

PHRASES = Path(catalog.__file__).parent / "render" / "phrases"

#: a "row" or "rows" word that does not say which: not after pool, batch, table, violation or
#: ring, not part of a name (`running_req_rows`, `details.rows`, `row-level`, `stale-row-read`).
BARE_ROW = re.compile(
    r"(?<![\w.`-])(?<!pool )(?<!batch )(?<!table )(?<!violation )(?<!ring )rows?(?![\w`-])",
    re.I,
)


def bare_rows(text: str) -> list[str]:
    """The bare row words of `text`, each with a little context."""
    return [text[max(m.start() - 25, 0) : m.end() + 15] for m in BARE_ROW.finditer(text)]


def catalog_texts() -> list[tuple[str, str]]:
    out = []
    for table in (catalog.FINDINGS, catalog.CAUSES, catalog.EVENTS, catalog.VIOLATION_CAUSES):
        for code, entry in table.items():
            for f in fields(entry):
                value = getattr(entry, f.name)
                if isinstance(value, str):
                    out.append((f"{code}.{f.name}", value))
    return out


def phrase_texts() -> list[tuple[str, str]]:
    out = []
    for path in sorted(PHRASES.glob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
            ):
                out.append((f"{path.name}:{node.lineno}", node.value))
    return out


def test_the_pattern_tells_a_bare_row() -> None:
    assert bare_rows("stored position 11 belongs to row 11") != []
    assert bare_rows("the rows' cells") != []
    for named in (
        "pool row 9",
        "batch rows 0..3",
        "a violation row",
        "running_req_rows",
        "a row-level finding",
        "stale-row-read",
        "`details.rows`",
        "table rows",
    ):
        assert bare_rows(named) == [], named


@pytest.mark.parametrize("source", [catalog_texts, phrase_texts], ids=["catalog", "phrases"])
def test_every_row_is_a_pool_row_or_a_batch_row(source: object) -> None:
    assert callable(source)
    bare = [(where, bits) for where, text in source() if (bits := bare_rows(text))]
    assert bare == [], "\n".join(f"{where}: {bits}" for where, bits in bare)
