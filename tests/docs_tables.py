"""Generate the code tables of the docs from the catalog (`kvcanary_cli.catalog`).

Each table follows a marker naming it, `<!-- catalog table: findings -->`, and runs to the
first line that is not a table row: its header, then one row per member of the catalog enum,
in the enum's order, each cell a text of the member's entry. The doc's prose is left as it is.

    python -m tests.docs_tables      # rewrite the docs' code tables

tests/test_catalog.py checks that every doc's tables are what this generates.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from kvcanary_cli.analysis.coverage import CHECKS
from kvcanary_cli.catalog import (
    CAUSES,
    EVENTS,
    FINDINGS,
    POOL_CAUSES,
    POOL_FINDINGS,
    VIOLATION_CAUSES,
    CauseCode,
    EventKind,
    FindingCode,
    PoolCause,
    PoolCode,
    ViolationRowCause,
)
from kvcanary_cli.dump.schema import Layout

__all__ = ["DOCS", "MARKER", "TABLES", "render_doc", "table"]

DOCS = Path(__file__).resolve().parents[1] / "docs"
#: `<!-- catalog table: NAME -->` and the table rows after it.
MARKER = re.compile(r"<!-- catalog table: ([\w-]+) -->\n(?:\|.*\n?)*")


def _code(value: str) -> str:
    return f"`{value}`"


def _findings() -> list[list[str]]:
    rows = [["code", "severity", "group", "when", "what it usually means"]]
    for code in FindingCode:
        e = FINDINGS[code]
        severity = f"{e.severity} {e.severity_note}" if e.severity_note else str(e.severity)
        rows.append([_code(code), severity, e.group, e.when, e.meaning])
    return rows


def _causes() -> list[list[str]]:
    rows = [["cause", "evidence that points to it"]]
    rows += [[_code(code), CAUSES[code].evidence] for code in CauseCode]
    return rows


def _events() -> list[list[str]]:
    rows = [
        ["kind", "what the timeline saw", "cause (unless a finding of `to_dump` names another)"]
    ]
    rows += [[_code(k), EVENTS[k].seen, _code(EVENTS[k].cause)] for k in EventKind]
    return rows


def _violation_causes() -> list[list[str]]:
    rows = [["cause", "when", "what it usually means"]]
    for cause in ViolationRowCause:
        e = VIOLATION_CAUSES[cause]
        rows.append([_code(cause), e.when, e.meaning])
    return rows


def _pool_findings() -> list[list[str]]:
    rows = [["code", "when", "what it usually means", "cause"]]
    for code in PoolCode:
        e = POOL_FINDINGS[code]
        cause = next(c for c in PoolCause if code in POOL_CAUSES[c].findings)
        rows.append([_code(code), e.when, e.meaning, _code(cause)])
    return rows


def _pool_causes() -> list[list[str]]:
    rows = [["cause", "what went wrong", "fix"]]
    rows += [[_code(c), POOL_CAUSES[c].summary, POOL_CAUSES[c].fix] for c in PoolCause]
    return rows


def _coverage() -> list[list[str]]:
    rows = [["family", "needs", "what it checks", "runs on"]]
    for family in CHECKS:
        needs = ", ".join(
            " or ".join(" and ".join(_code(n) for n in together) for together in alternatives)
            for alternatives in family.needs
        )
        where = "hybrid-SWA dumps" if family.swa else "every dump"
        if family.hicache:
            where = "dumps with a HiCache host pool record"
        if set(family.layouts) != set(Layout):
            where = where.replace("dump", f"{' or '.join(family.layouts)} dump")
        if family.group is not None:
            where += f", with the `{family.group}` group checked"
        rows.append([family.name, needs, family.covers, where])
    return rows


#: table name -> its doc and its rows (the header first).
TABLES: dict[str, tuple[str, Callable[[], list[list[str]]]]] = {
    "findings": ("findings.md", _findings),
    "causes": ("findings.md", _causes),
    "coverage": ("findings.md", _coverage),
    "events": ("timeline.md", _events),
    "violation-causes": ("canary.md", _violation_causes),
    "pool-findings": ("findings.md", _pool_findings),
    "pool-causes": ("findings.md", _pool_causes),
}


def table(name: str) -> str:
    """One table as Markdown: header, separator, rows (a `|` inside a cell escaped)."""
    header, *body = TABLES[name][1]()

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |\n"

    return line(header) + "|" + "---|" * len(header) + "\n" + "".join(line(r) for r in body)


def render_doc(doc: str) -> str:
    """`doc` with every marked table regenerated."""

    def regenerate(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in TABLES:
            raise KeyError(f"no catalog table named {name!r}")
        return f"<!-- catalog table: {name} -->\n{table(name)}"

    return MARKER.sub(regenerate, doc)


if __name__ == "__main__":
    for doc in sorted({d for d, _ in TABLES.values()}):
        path = DOCS / doc
        path.write_text(render_doc(path.read_text()))
