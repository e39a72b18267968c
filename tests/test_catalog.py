"""The catalog declares every code once: one entry per member, the mappings between kinds
consistent, the docs' code tables generated from it, and no other module of the package (but
the scenarios that plant them) spelling a code's string."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path

import pytest

from kvcanary_cli import catalog
from kvcanary_cli.catalog import (
    CAUSE_OF_EXPLANATION,
    CAUSE_OF_FINDING,
    CAUSES,
    EVENTS,
    FINDINGS,
    VIOLATION_CAUSES,
    CauseCode,
    Confidence,
    EventKind,
    FindingCode,
    Severity,
    ViolationRowCause,
)
from kvcanary_cli.planners.base import ProblemKind
from kvcanary_cli.planners.frame import GPU_MAX_BS
from tests import docs_tables

PACKAGE = Path(catalog.__file__).resolve().parent
#: the modules allowed to spell a code's string: its catalog entry, and the scenario that
#: plants it.
SPELLERS = ("catalog.py", "synth/scenarios.py")
KINDS: tuple[type[StrEnum], ...] = (
    FindingCode,
    CauseCode,
    EventKind,
    ViolationRowCause,
    catalog.PoolCode,
    catalog.PoolCause,
)


@pytest.mark.parametrize(
    ("codes", "table"),
    [
        (FindingCode, FINDINGS),
        (CauseCode, CAUSES),
        (EventKind, EVENTS),
        (ViolationRowCause, VIOLATION_CAUSES),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_every_member_has_exactly_one_entry(
    codes: type[StrEnum], table: Mapping[StrEnum, object]
) -> None:
    assert list(table) == list(codes)


def test_a_missing_or_second_entry_fails_at_import() -> None:
    entry = catalog.ViolationCauseEntry(when="w", meaning="m")
    every = [(c, entry) for c in ViolationRowCause]
    with pytest.raises(ValueError, match="two catalog entries"):
        catalog._table(ViolationRowCause, [*every, every[0]])
    with pytest.raises(ValueError, match="without a catalog entry"):
        catalog._table(ViolationRowCause, every[1:])
    with pytest.raises(ValueError, match="maps to"):
        twice = (FindingCode.FULL_PAGE_LEAKED,)
        catalog._inverse({CauseCode.DOUBLE_FREE: twice, CauseCode.FULL_LEAK: twice})


def test_code_strings_are_distinct_within_a_kind() -> None:
    for kind in KINDS:
        assert len({m.value for m in kind}) == len(kind), kind.__name__


def test_severities_and_ranks() -> None:
    assert FindingCode.LUT_OUT_OF_RANGE.severity is Severity.ERROR
    assert FindingCode.LUT_SENTINEL_MISSING.severity is Severity.WARNING
    assert {FINDINGS[c].severity for c in FindingCode} == {Severity.ERROR, Severity.WARNING}
    # warnings close the codes table, after every error
    severities = [c.severity for c in FindingCode]
    assert severities == sorted(severities, key=lambda s: -s.rank)
    assert [s.rank for s in (Severity.INFO, Severity.WARNING, Severity.ERROR)] == [0, 1, 2]
    assert [c.rank for c in (Confidence.POSSIBLE, Confidence.LIKELY, Confidence.CERTAIN)] == [
        0,
        1,
        2,
    ]
    assert [c.order for c in FindingCode] == list(range(len(FindingCode)))


def test_the_mappings_name_members_of_their_kinds() -> None:
    assert all(isinstance(c, FindingCode) for c in CAUSE_OF_FINDING)
    assert all(isinstance(c, ViolationRowCause) for c in CAUSE_OF_EXPLANATION)
    assert CAUSE_OF_FINDING[FindingCode.FREE_LIST_DUPLICATE] is CauseCode.DOUBLE_FREE
    assert CAUSE_OF_EXPLANATION[ViolationRowCause.STALE_SLOT] is CauseCode.USE_AFTER_FREE
    assert EventKind.LUT_REWRITTEN.default_cause is CauseCode.SWA_MAPPING_REWRITTEN
    # row-level and LUT-level codes are claimed by the diagnosis's own rules, never by default
    assert FindingCode.LUT_OUT_OF_RANGE not in CAUSE_OF_FINDING
    assert FindingCode.ROW_OUT_OF_RANGE not in CAUSE_OF_FINDING


def test_texts_are_filled_in() -> None:
    for code, f in FINDINGS.items():
        assert f.group and f.when and f.meaning, code
    for cause, c in CAUSES.items():
        assert c.summary and c.fix and c.evidence, cause
    for kind, e in EVENTS.items():
        assert e.seen, kind
    for name, v in VIOLATION_CAUSES.items():
        assert v.when and v.meaning, name


def test_the_kernel_limit_fix_names_the_block_size() -> None:
    """The catalog is a leaf: it writes the GPU path's batch limit as a number."""
    assert f"at most {GPU_MAX_BS} " in CAUSES[CauseCode.KERNEL_LIMIT].fix


def test_plan_problems_are_finding_codes() -> None:
    assert all(isinstance(kind.code, FindingCode) for kind in ProblemKind)
    assert ProblemKind.ROW_OUT_OF_RANGE.code is FindingCode.ROW_OUT_OF_RANGE


# --- a code's string is spelled in the catalog and the scenarios only -----------------------


#: A word between two quotes (or backquotes), in the letters a code string is spelled with.
QUOTED_WORD = re.compile(r"""(?<=["'`])[a-z0-9-]+(?=["'`])""")


def spellers(texts: dict[str, str]) -> dict[str, list[str]]:
    """Code string -> the modules (of `texts`: path -> source) that spell it quoted (in
    quotes or backquotes), for every code string the catalog declares. Each text is read
    once for its quoted words (not once a code: 150 codes)."""
    values = sorted({m.value for kind in KINDS for m in kind})
    assert all(re.fullmatch(r"[a-z0-9-]+", value) for value in values), "see QUOTED_WORD"
    words = {path: set(QUOTED_WORD.findall(text)) for path, text in texts.items()}
    return {value: sorted(path for path, w in words.items() if value in w) for value in values}


def _package_texts() -> dict[str, str]:
    return {
        path.relative_to(PACKAGE).as_posix(): path.read_text()
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_only_the_catalog_and_the_scenarios_spell_a_code() -> None:
    found = spellers(_package_texts())
    assert all("catalog.py" in modules for modules in found.values())
    wrong = {code: m for code, m in found.items() if set(m) - set(SPELLERS)}
    assert wrong == {}, "name these codes by their catalog member"


def test_a_spelled_code_is_caught() -> None:
    texts = _package_texts()
    texts["render/console.py"] += '\nX = "swa-page-leaked"\n'
    texts["analysis/findings.py"] += "\n#: see `double-free`\n"
    found = spellers(texts)
    assert "render/console.py" in found["swa-page-leaked"]
    assert "analysis/findings.py" in found["double-free"]
    assert "render/console.py" not in found["double-free"]


# --- the docs' code tables ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(docs_tables.TABLES))
def test_doc_tables_are_generated_from_the_catalog(name: str) -> None:
    doc_name, _ = docs_tables.TABLES[name]
    doc = (docs_tables.DOCS / doc_name).read_text()
    assert f"<!-- catalog table: {name} -->\n" in doc
    assert docs_tables.render_doc(doc) == doc, "run `python -m tests.docs_tables`"


def test_a_stale_doc_table_is_regenerated() -> None:
    doc = (docs_tables.DOCS / "canary.md").read_text()
    stale = doc.replace("| `no-live-cell` |", "| `no-live-cell-any-more` |")
    assert stale != doc
    assert docs_tables.render_doc(stale) == doc
    with pytest.raises(KeyError):
        docs_tables.render_doc("<!-- catalog table: nothing -->\n| a |\n")


def test_doc_tables_list_every_code_in_order() -> None:
    rows = [
        line.split(" | ")[0].strip("| `") for line in docs_tables.table("findings").splitlines()[2:]
    ]
    assert rows == [c.value for c in FindingCode]
