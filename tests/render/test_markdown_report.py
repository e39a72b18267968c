"""Markdown output: summary table, per-code tables, one <details> per shown finding; agrees with
the JSON record it is drawn from."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace

import pytest

from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.render.markdown.check import GITHUB_BODY_LIMIT, check_markdown
from kvcanary_cli.render.markdown.provenance import provenance_markdown
from kvcanary_cli.results.check import CheckReport, DumpReport
from kvcanary_cli.results.provenance import ProvenanceReport
from tests.render.md_tables import tables
from tests.render.record_schema import record_of

HEAD = re.compile(r"^##### `([a-z-]+)` · (error|warning|info) · (\d+) findings?$", re.M)


def _summary(markdown: str) -> dict[tuple[str, str], int]:
    [(_, header, rows)] = [t for t in tables(markdown) if t[0] == "### Summary"]
    assert header == ["code", "severity", "group", "findings", "cells"]
    return {(code, group): int(cells) for code, _sev, group, _findings, cells in rows}


def _dump_sections(markdown: str) -> list[str]:
    return re.split(r"^### `", markdown, flags=re.M)[1:]


def test_summary_agrees_with_json(any_report: CheckReport) -> None:
    record = record_of(any_report)
    markdown = check_markdown(any_report)
    expected: Counter[tuple[str, str]] = Counter()
    for dump in record["dumps"]:
        for c in dump["counts"]:
            expected[(c["code"], c["group"])] += c["count"]
    if expected:
        assert _summary(markdown) == dict(expected)
    else:
        assert "### Summary\n\nNo findings." in markdown
    codes = {code for code, _ in expected}
    assert codes == set(record["summary"]["counts"])


def test_title_and_verdict(
    multi_report: CheckReport, clean_report: CheckReport, single_report: CheckReport
) -> None:
    assert check_markdown(multi_report).startswith("## kvcanary check: bad input\n")
    assert check_markdown(clean_report).startswith("## kvcanary check: clean\n")
    assert check_markdown(single_report).startswith("## kvcanary check: findings\n")


@pytest.mark.parametrize("max_rows", [0, 1, 3, 10, 50])
def test_details_per_shown_finding(multi_report: CheckReport, max_rows: int) -> None:
    record = record_of(multi_report)
    markdown = check_markdown(multi_report, max_rows=max_rows)
    sections = _dump_sections(markdown)
    assert len(sections) == len(record["dumps"])
    for dump, section in zip(record["dumps"], sections, strict=True):
        per_code = Counter(f["code"] for f in dump["findings"])
        shown = sum(min(n, max_rows) for n in per_code.values())
        assert section.count("<details>") == shown == section.count("</details>")
        heads = {code: int(n) for code, _sev, n in HEAD.findall(section)}
        totals: Counter[str] = Counter()
        for c in dump["counts"]:
            totals[c["code"]] += c["count"]
        assert heads == dict(totals)
        for n in totals.values():
            if n > max_rows:
                assert f"… and {n - max_rows} more" in section


def test_code_tables_and_escaping(single_report: CheckReport) -> None:
    markdown = check_markdown(single_report, max_rows=10)
    for _, header, rows in tables(markdown):
        assert all(len(row) == len(header) for row in rows), header
    lut = [t for t in tables(markdown) if t[0].startswith("##### `lut-out-of-range`")]
    [(_, header, rows)] = lut
    assert header == ["group", "cells", "batch rows", "positions", "slots", "role", "message"]
    assert [r[4] for r in rows] == [str(900 + i) for i in range(10)]
    assert "… and 2 more" in markdown
    dup = [t for t in tables(markdown) if t[0].startswith("##### `duplicate-slot-in-row`")]
    message = dup[0][2][0][-1]
    assert "pool row 8 \\| both live &lt;here>" not in message  # the reader unescapes `\|`
    assert message == "slot 77 is at positions 4 and 9 of pool row 8 | both live &lt;here>"


def test_provenance_details_block(single_report: CheckReport) -> None:
    markdown = check_markdown(single_report)
    block = markdown[markdown.index("<details><summary><code>duplicate-slot-in-row") :]
    block = block[: block.index("</details>")]
    assert (
        "<summary><code>duplicate-slot-in-row</code> full slot 77, batch row 1, pool row 8, "
        "position 4, verify</summary>\n\n" in block
    )
    [(_, header, rows)] = [t for t in tables(block) if t[1][0] == "pool row"]
    assert header == ["pool row", "position", "batch rows", "role", "seed", "shared"]
    assert rows[2] == ["3", "4", "0", "verify", "", "yes"]
    assert "(first 3 of 5)" in block
    assert "SWA translation: `LUT[77] = 12`" in block
    assert "allocator: free" in block
    assert "canary.full.head.k" in block and "77, 4, 1, 0" in block


def test_identity_and_groups(single_report: CheckReport) -> None:
    markdown = check_markdown(single_report)
    # outside tables a pipe needs no escape (a backslash would show inside a code span)
    assert "\n### `dumps/step1207|rank0.safetensors`: errors\n" in markdown
    [(_, _, identity)] = [t for t in tables(markdown) if t[1] == ["identity", "value"]]
    assert identity[:6] == [
        ["sglang.version", "0.5.1"],
        ["sglang.commit", "abc1234"],
        ["model", "Qwen/Qwen3-8B"],
        ["rank", "0"],
        ["step", "1207"],
        ["forward_mode", "target_verify"],
    ]
    assert ["note|with pipe", "x|y"] in identity
    [(_, header, groups)] = [
        t for t in tables(markdown) if t[1][0] == "group" and "differences" in t[1]
    ]
    swa = groups[1]
    assert swa[header.index("differences")] == (
        "kernel clamped 17 plan values (lut-out-of-range); 1 plan value differ "
        "(kernel-divergence); 2 unexplained (kernel-divergence)"
    )
    assert "counts twice" in markdown  # what each number counts, under the table


def test_multi_dump_table_and_bad_input(multi_report: CheckReport) -> None:
    markdown = check_markdown(multi_report)
    [(_, header, rows)] = [t for t in tables(markdown) if t[1][0] == "dump"]
    assert [r[1] for r in rows] == ["errors", "clean", "warnings", "bad-input"]
    assert rows[3][-1] == "missing tensor \\`req_to_token\\` (needed by every plan)"
    # the table in the order given; the sections failing first (errors, bad input, warnings)
    sections = _dump_sections(markdown)
    assert [s.split("`: ")[1].split("\n")[0] for s in sections] == [
        "errors",
        "bad-input",
        "warnings",
        "clean",
    ]
    assert sections[1].startswith("dumps/broken.safetensors`: bad-input")
    assert "**Bad input:** missing tensor" in sections[1]
    assert "No findings." in sections[3]


def test_markdown_is_deterministic(multi_report: CheckReport) -> None:
    assert check_markdown(multi_report) == check_markdown(multi_report)


def test_provenance_markdown_slot(slot_report: ProvenanceReport) -> None:
    markdown = provenance_markdown(slot_report)
    assert markdown.startswith("## kvcanary provenance: ")
    assert "### FULL slot 77" in markdown
    [(_, _, findings)] = [t for t in tables(markdown) if t[1][0] == "code"]
    assert [r[0] for r in findings] == ["duplicate-slot-in-row"]


def test_provenance_markdown_row(row_report: ProvenanceReport) -> None:
    markdown = provenance_markdown(row_report)
    [(_, header, rows)] = [t for t in tables(markdown) if t[1][0] == "position"]
    assert header == ["position", "slot", "role", "swa slot", "marks"]
    assert len(rows) == 10
    assert rows[2][4] == "padding-slot-in-live-range"
    assert re.findall(r"[a-z-]+", rows[4][4]) == ["swa-unmapped-in-window", "duplicate-slot-in-row"]
    assert rows[5][2] == "verify (seed)"


def test_many_long_notes_give_way_to_the_findings(findings_dump: DumpReport) -> None:
    # What came from the dump is shortened first (values, then how many notes), never the
    # findings: 200 notes of 5,000 characters would fill the body three times over.
    noted = replace(findings_dump, notes=tuple(f"{i}: " + "x" * 5_000 for i in range(200)))
    markdown = check_markdown(CheckReport(dumps=(noted,)))
    usual = check_markdown(CheckReport(dumps=(findings_dump,)))
    assert len(markdown) <= GITHUB_BODY_LIMIT and "Trimmed" not in markdown
    assert markdown[markdown.index("\n#### ") :] == usual[usual.index("\n#### ") :]
    assert "note: 9: xxx" in markdown and "note: 10: " not in markdown
    assert "… and 190 more notes (--format json)" in markdown
    assert markdown.count("(5,003 characters in all; --format json has them)") == 10


def test_many_clean_dumps_never_crowd_out_the_failing_one(
    findings_dump: DumpReport, clean_dump: DumpReport
) -> None:
    """Issue 36, class 13: forty clean dumps with long notes, the only failing dump last. The
    body fits GitHub's limit with the failing dump's section whole (diagnosis and findings)
    and first, and each clean dump summarised on one line."""
    notes = tuple(f"note {k}: " + "x" * 2_000 for k in range(12))
    clean = [
        replace(clean_dump, path=f"dumps/clean-{i:02d}.safetensors", notes=notes) for i in range(40)
    ]
    markdown = check_markdown(CheckReport(dumps=(*clean, findings_dump)))
    assert len(markdown) <= GITHUB_BODY_LIMIT
    alone = check_markdown(CheckReport(dumps=(findings_dump,)))
    # its section, as a body of its own (the run's legend follows the last section)
    failing = alone[alone.index("### `dumps/step1207") : alone.index("*verify entries: ")]
    sections = _dump_sections(markdown)
    assert sections[0].startswith("dumps/step1207|rank0.safetensors`: errors")
    assert failing.strip() in markdown  # whole: diagnosis, findings, provenance
    assert "### Clean dumps (40)" in markdown
    for i in range(40):
        assert f"- `dumps/clean-{i:02d}.safetensors`: clean, batch size" in markdown
    assert "x" * 300 not in markdown  # no clean dump's note


def test_clean_dumps_keep_their_sections_when_the_body_fits(
    findings_dump: DumpReport, clean_dump: DumpReport
) -> None:
    """The twin: a body that fits keeps every clean dump's section, after the failing one."""
    clean = [replace(clean_dump, path=f"dumps/clean-{i}.safetensors") for i in range(3)]
    markdown = check_markdown(CheckReport(dumps=(*clean, findings_dump)))
    sections = _dump_sections(markdown)
    assert [s.split("`")[0] for s in sections] == [
        "dumps/step1207|rank0.safetensors",
        *(f"dumps/clean-{i}.safetensors" for i in range(3)),
    ]
    assert "Clean dumps (" not in markdown


def test_a_long_argument_gives_way_before_the_diagnosis_or_a_finding(
    findings_dump: DumpReport,
) -> None:
    # A cause whose evidence is thousands of lines (one per batch row) is shortened in the
    # body, never cut with the diagnosis and every finding after it.
    from kvcanary_cli.catalog import CauseCode, Confidence
    from kvcanary_cli.results.check import Cause

    argued = Cause(
        code=CauseCode.STALE_ROW_READ,
        confidence=Confidence.LIKELY,
        summary="stale tails",
        evidence=tuple(f"batch row {i}: " + "y" * 120 for i in range(3_000)),
        explains={FindingCode.FREED_SLOT_IN_LIVE_RANGE: 3_000},
        fix="fix it",
    )
    long = replace(findings_dump, diagnosis=(argued, *findings_dump.diagnosis))
    markdown = check_markdown(CheckReport(dumps=(long,)))
    usual = check_markdown(CheckReport(dumps=(findings_dump,)))
    assert len(markdown) <= GITHUB_BODY_LIMIT and "Trimmed" not in markdown
    assert "#### Diagnosis" in markdown and "**`stale-row-read`** (likely)" in markdown
    assert "batch row 49: " in markdown and "batch row 50: " not in markdown
    assert "… and 2950 more evidence lines (--format json)" in markdown
    tail = usual[usual.index("\n##### ") :]
    assert markdown.endswith(tail)
