"""The Markdown view of a check (the `kvcanary.check/2` record): a GitHub issue body, at most
GitHub's length.

Drawn from the report the JSON output is the record of, so the two formats agree. Every string
of the report is made printable first (`safe_text.printable_record`).
"""

from __future__ import annotations

import html
import json
from collections import Counter
from dataclasses import dataclass, replace
from functools import partial

from kvcanary_cli.catalog import FindingCode, Severity
from kvcanary_cli.render.console import plural
from kvcanary_cli.render.markdown.blocks import clipped
from kvcanary_cli.render.markdown.blocks import code as _code
from kvcanary_cli.render.markdown.blocks import table as _table
from kvcanary_cli.render.markdown.blocks import text as _text
from kvcanary_cli.render.markdown.common import identity_table, provenance_body, reproduce
from kvcanary_cli.render.phrases.check import (
    FIRST_RAISE_MARK,
    CodeSection,
    FindingWords,
    cause_sections,
    code_cells,
    coverage_lines,
    differences_lines,
    failing_phrase,
    finding_words,
    findings_per_count,
    legend,
    no_findings_phrase,
    severity_count,
    top_causes,
)
from kvcanary_cli.render.phrases.shrink import shrunk_lines
from kvcanary_cli.results.check import (
    CheckReport,
    DumpReport,
    Finding,
    GroupSummary,
    RequestSummary,
    code_order,
)
from kvcanary_cli.safe_text import printable_record

__all__ = ["GITHUB_BODY_LIMIT", "check_markdown"]

#: A code as an inline code span outside a table; handed to `code_cells`, which names each
#: code with it (a partial: the phrase calls the escape directly, not back into this view).
_code_span = partial(_code, cell=False)

_TITLES = {"clean": "clean", "findings": "findings", "bad-input": "bad input"}


def _groups_table(groups: tuple[GroupSummary, ...]) -> str:
    rows = [
        [
            _code(g.group),
            str(g.window),
            str(g.total_verify),
            str(g.verify_capacity),
            str(g.enable),
            _text(g.kernel),
            _text("; ".join(differences_lines(g))),
        ]
        for g in groups
    ]
    return _table(
        ["group", "window", "verify entries", "capacity", "enable", "kernel", "differences"],
        rows,
        right={1, 2, 3, 4},
    )


def _where(f: Finding, words: FindingWords) -> str:
    bits = []
    if f.count > 1:
        bits.append(words.cells)
    span = words.span
    if f.slot is not None:
        many = span is not None and span.distinct_slots > 1
        bits.append(f"{f.space} slot{'s' if many else ''} {words.slots}")
    rows = words.rows
    if rows is not None:
        bits.append(f"batch row{'s' if span is not None and span.rows > 1 else ''} {rows}")
    if f.pool_row is not None and f.count == 1:
        bits.append(f"pool row {f.pool_row}")
    positions = words.positions
    if positions is not None:
        bits.append(f"position{'s' if '..' in positions else ''} {positions}")
    if words.role:
        bits.append(words.role)
    return ", ".join(bits) or f"group {f.group}"


def _details_block(f: Finding, words: FindingWords) -> str:
    summary = f"<code>{html.escape(f.code)}</code> {html.escape(_where(f, words))}"
    body = [_text(f.message)]
    if words.examples:
        body.append(_text(words.examples))
    if not f.provenance:
        body.append(
            "No slot provenance (the finding is about a pool row, a batch row or a tensor)."
        )
    for prov in f.provenance:
        body.extend(provenance_body(prov))
    more = f.provenance_total - len(f.provenance)
    if more > 0:
        body.append(f"… and {plural(more, 'more slot')} (`kvcanary provenance --slot N` shows any)")
    if f.details:
        body.append(
            "details: " + _code(json.dumps(f.details, sort_keys=True, default=str), cell=False)
        )
    return "\n\n".join([f"<details><summary>{summary}</summary>", *body, "</details>"])


def _message_cell(f: Finding, words: FindingWords) -> str:
    text = _text(f.message)
    if words.raise_mark:
        text += f" **{_text(words.raise_mark)}**"
    if f.assumes:
        text += f" (assumes {_text(', '.join(f.assumes))}: not recorded)"
    if words.owners:
        text += f"<br>{_text(words.owners)}"
    return text


def _code_sections(sections: list[CodeSection], details: bool) -> list[str]:
    parts: list[str] = []
    for section in sections:
        shown = [(f, finding_words(f)) for f in section.shown]
        parts.append(
            f"##### {_code(section.code, cell=False)} · {section.severity} · {section.size}"
        )
        if shown:
            parts.append(
                _table(
                    ["group", "cells", "batch rows", "positions", "slots", "role", "message"],
                    [
                        [
                            _code(f.group),
                            str(f.count),
                            _text(words.rows),
                            _text(words.positions),
                            _text(words.slots),
                            _text(words.role),
                            _message_cell(f, words),
                        ]
                        for f, words in shown
                    ],
                    right={1},
                )
            )
        if section.total > len(shown):
            parts.append(f"… and {section.total - len(shown)} more")
        if details:
            parts.extend(_details_block(f, words) for f, words in shown)
    return parts


def _findings_sections(dump: DumpReport, max_rows: int, details: bool) -> list[str]:
    """Symptoms under their causes, in diagnosis order."""
    parts: list[str] = []
    for number, block in enumerate(cause_sections(dump, max_rows), 1):
        cause = block.cause
        parts.append(
            "#### Findings no cause explains"
            if cause is None
            else f"#### Cause {number}: {_code(cause.cause, cell=False)} ({cause.confidence})"
        )
        parts.extend(_code_sections(block.sections, details))
    return parts


def _diagnosis_section(dump: DumpReport, text: DumpText) -> list[str]:
    if not dump.diagnosis:
        return []
    items = []
    for number, cause in enumerate(top_causes(dump), 1):
        lines = [
            f"{number}. **{_code(cause.cause, cell=False)}** ({cause.confidence}): "
            f"{_text(cause.headline or cause.summary)}"
        ]
        if cause.headline:
            lines.append(f"   - {_text(cause.summary)}")
        evidence = cause.evidence
        lines.extend(
            f"   - {_text(clipped(fact, text.chars))}" for fact in evidence[: text.evidence]
        )
        if len(evidence) > text.evidence:
            more = plural(len(evidence) - text.evidence, "more evidence line")
            lines.append(f"   - … and {more} (--format json)")
        explains = code_cells(cause.explains, _code_span)
        if explains:
            lines.append(f"   - explains: {explains}")
        lines.extend(f"   - {_text(clipped(line, text.chars))}" for line in cause.also_shows)
        lines.append(f"   - **fix:** {_text(cause.fix)}")
        if cause.next_command:
            lines.append(f"   - next: {_code(cause.next_command, cell=False)}")
        items.append("\n".join(lines))
    return ["#### Diagnosis", "\n".join(items)]


def _raise_lines(dump: DumpReport, text_limit: int) -> list[str]:
    lines = []
    raised = dump.first_raise
    if raised is not None:
        lines.append(
            f"SGLang's reference raises first in group {_code(raised.group, cell=False)} at "
            f"batch row {raised.batch_row}, position {raised.position} "
            f"({_code(raised.code, cell=False)}, marked **{_text(FIRST_RAISE_MARK)}** "
            "below): "
            f"{_code(raised.exception_type + ': ' + raised.message, cell=False)}"
        )
    recorded = dump.recorded_exception
    if recorded is not None:  # from the dump's note
        recorded = clipped(recorded, text_limit)
    if recorded is not None and dump.recorded_exception_matches:
        lines.append(f"The dump's note records the same exception: {_code(recorded, cell=False)}")
    elif recorded is not None:
        lines.append(
            f"**Mismatch:** the dump's note records {_code(recorded, cell=False)}, but "
            "kvcanary's reference "
            + ("raises something else first" if raised else "does not raise at all")
            + ": the dump may not be the "
            "state that failed, or kvcanary's model differs from the SGLang that ran."
        )
    for a in dump.assumptions:
        decides = code_cells(a.decides, _code_span)
        lines.append(
            f"**Assumption:** {_code(a.scalar, cell=False)} = {a.value} "
            f"({_text(a.source)}) is not recorded; {decides} rest on it and are "
            f"reported as info: {_text(a.advice)}"
        )
    return lines


def _requests_table(requests: tuple[RequestSummary, ...]) -> str:
    return _table(
        ["batch row", "pool row", "P", "E", "first bad position", "cells with findings"],
        [
            [
                str(r.batch_row),
                str(r.pool_row),
                str(r.prefix_len),
                str(r.extend_len),
                _text(r.first_bad_position),
                code_cells(r.counts, _code),
            ]
            for r in requests
        ],
        right={0, 1, 2, 3, 4},
    )


def _dump_section(dump: DumpReport, max_rows: int, details: bool, text: DumpText) -> list[str]:
    parts = [f"### {_code(dump.path, cell=False)}: {dump.verdict}"]
    if dump.error is not None and text.errors_on_stderr:  # the reason is said once
        parts.append("**Bad input:** unreadable: the error line on stderr says why")
    elif dump.error is not None:
        parts.append(f"**Bad input:** {_text(clipped(dump.error, text.chars))}")
    parts.append(identity_table(dump.identity, limit=text.chars))
    facts = [f"batch size: {dump.bs}"]
    if dump.kernel_mode:
        facts.append(f"kernel mode: {_text(dump.kernel_mode)}")
    if dump.shrunk is not None:
        facts.extend(_text(line) for line in shrunk_lines(dump.shrunk))
    facts.extend(_text(line) for line in coverage_lines(dump))
    notes = dump.notes
    facts.extend(f"note: {_text(clipped(note, text.chars))}" for note in notes[: text.notes])
    if len(notes) > text.notes:
        facts.append(f"… and {plural(len(notes) - text.notes, 'more note')} (--format json)")
    parts.append("\n".join(f"- {fact}" for fact in facts))
    if dump.shrunk is not None:
        parts.append(reproduce(dump.shrunk))
    parts.extend(_diagnosis_section(dump, text))
    parts.extend(_raise_lines(dump, text.chars))
    if dump.groups:
        parts.append(_groups_table(dump.groups))
    if len(dump.requests) >= 2:
        requests = dump.requests
        parts.extend(["#### Requests with findings", _requests_table(requests[:max_rows])])
        if len(requests) > max_rows:
            parts.append(f"… and {plural(len(requests) - max_rows, 'more request')} with findings")
    if dump.counts:
        parts.extend(_findings_sections(dump, max_rows, details))
    elif dump.error is None:
        parts.append(no_findings_phrase(dump).capitalize() + ".")
    return parts


def _summary_rows(report: CheckReport) -> list[list[str]]:
    totals: Counter[tuple[str, str]] = Counter()
    findings: Counter[tuple[str, str]] = Counter()
    severity: dict[str, str] = {}
    for dump in report.dumps:
        for c, held in zip(dump.counts, findings_per_count(dump), strict=True):
            key = (c.code, c.group)
            totals[key] += c.count
            findings[key] += held
            severity[c.code] = c.severity
    order = sorted(totals, key=lambda k: code_order(FindingCode(k[0]), k[1]))
    return [
        [_code(code), severity[code], _code(group), str(findings[(code, group)])]
        + [str(totals[(code, group)])]
        for code, group in order
    ]


#: GitHub refuses issue and comment bodies longer than this many characters.
GITHUB_BODY_LIMIT = 65_536


@dataclass(frozen=True)
class DumpText:
    """How much of what came from a dump (identity values, notes, the recorded exception)
    a body shows: characters per value, notes per dump."""

    chars: int
    notes: int
    #: evidence lines per cause in the diagnosis (the rest counted): a long argument is
    #: shortened before any finding is, so the diagnosis is never what a trim cuts.
    evidence: int
    #: the body goes where `check`'s error lines on stderr are read too: an unreadable
    #: dump's reason is not repeated (a file keeps it).
    errors_on_stderr: bool = False


#: What came from the dump, shown generously, then shortly when the body is too long: it is
#: shortened before any finding is.
_DUMP_TEXT = (
    DumpText(chars=4_000, notes=50, evidence=50),
    DumpText(chars=300, notes=10, evidence=5),
)


def check_markdown(
    report: CheckReport,
    *,
    max_rows: int = 10,
    limit: int = GITHUB_BODY_LIMIT,
    errors_on_stderr: bool = False,
) -> str:
    """A `kvcanary.check/2` report as a GitHub issue body, at most `limit` characters.

    Per code, the first `max_rows` findings get a table row and a `<details>` provenance block;
    the rest are counted ("… and K more"). A body that would be too long for GitHub is
    trimmed: first what came from the dump is shortened (each value says so), then, saying so
    at the top, fewer rows per code, then no provenance blocks, then the last sections cut;
    the JSON output always has everything.
    """
    report = printable_record(report)
    texts = [replace(t, errors_on_stderr=errors_on_stderr) for t in _DUMP_TEXT]
    rows, details, text = max_rows, True, texts[0]
    brief = _clean_in_brief(report, rows, details, text, limit)
    while True:
        body = _check_markdown(report, rows, details, text, brief=brief)
        if len(body) <= limit:
            break
        if text != texts[-1]:
            text = texts[-1]
        elif rows > 1:
            rows //= 2
        elif details:
            details = False
        else:
            return _cut(body, limit)
    if (rows, details) == (max_rows, True):
        return body
    what = f"{rows} findings per code (asked: {max_rows})" + (
        "" if details else ", without provenance blocks"
    )
    return _trim_notice(f"showing {what}") + body


def _trim_notice(what: str) -> str:
    return (
        f"> **Trimmed to fit GitHub's {GITHUB_BODY_LIMIT:,}-character limit:** {what}; "
        "`kvcanary check --format json` has every finding.\n\n"
    )


def _cut(body: str, limit: int) -> str:
    """The first sections of `body` that fit, and a notice of the cut."""
    notice = _trim_notice("the last sections are cut")
    kept = body[: max(limit - len(notice) - 2, 0)]
    kept = kept[: kept.rfind("\n\n")] if "\n\n" in kept else kept
    return notice + kept + "\n"


#: The order of dump sections in a body of several dumps: the failing ones (and their
#: diagnoses) first, so that a trim never cuts the one that matters for the clean ones.
_SECTION_ORDER = {"errors": 0, "bad-input": 1, "warnings": 2, "clean": 3}


def _in_section_order(dumps: tuple[DumpReport, ...]) -> list[DumpReport]:
    return sorted(dumps, key=lambda d: _SECTION_ORDER.get(d.verdict, 0))


def _clean_in_brief(
    report: CheckReport, rows: int, details: bool, text: DumpText, limit: int
) -> bool:
    """Whether the clean dumps are summarised one line each: when there are clean and other
    dumps, and the body with every section is too long."""
    verdicts = {d.verdict for d in report.dumps}
    if "clean" not in verdicts or verdicts == {"clean"}:
        return False
    return len(_check_markdown(report, rows, details, text, brief=False)) > limit


def _clean_summary(clean: list[DumpReport]) -> list[str]:
    lines = [f"- {_code(d.path, cell=False)}: clean, batch size {d.bs}, no findings" for d in clean]
    return [
        f"### Clean dumps ({len(clean)})",
        "\n".join(lines),
        f"*One line each, to fit GitHub's {GITHUB_BODY_LIMIT:,}-character limit; "
        "`kvcanary check --format json` has their sections.*",
    ]


def _check_markdown(
    report: CheckReport, max_rows: int, details: bool, text: DumpText, *, brief: bool = False
) -> str:
    summary = report.summary
    by_severity = summary.by_severity
    head = [
        f"## kvcanary check: {_TITLES.get(report.verdict, report.verdict)}",
        (
            f"{failing_phrase(summary, report.fail_on)} · "
            f"{plural(summary.findings, 'finding')} "
            f"({plural(summary.cells, 'cell')}: {plural(by_severity.error, 'error cell')}, "
            f"{plural(by_severity.warning, 'warning cell')}, "
            f"{plural(by_severity.info, 'info cell')}) · "
            f"kvcanary {report.kvcanary_version} · "
            f"`{report.SCHEMA}`"
            + (
                f" · SGLang installed here: {_text(report.sglang_installed)}"
                if report.sglang_installed
                else ""
            )
        ),
        "### Summary",
    ]
    rows = _summary_rows(report)
    if rows:
        head.append(_table(["code", "severity", "group", "findings", "cells"], rows, right={3, 4}))
    else:
        head.append("No findings.")
    if len(report.dumps) >= 2:
        head.append(
            _table(
                ["dump", "verdict", "bs", "findings", "error cells", "warning cells", "error"][
                    : 6 if text.errors_on_stderr else 7
                ],
                [
                    [
                        _code(d.path),
                        d.verdict,
                        str(d.bs),
                        str(d.findings_total),
                        str(severity_count(d.counts, Severity.ERROR)),
                        str(severity_count(d.counts, Severity.WARNING)),
                        _text(None if d.error is None else clipped(d.error, text.chars)),
                    ][: 6 if text.errors_on_stderr else 7]
                    for d in report.dumps
                ],
                right={2, 3, 4, 5},
            )
        )
    parts = list(head)
    dumps = _in_section_order(report.dumps)
    clean = [d for d in dumps if brief and d.verdict == "clean"]
    for dump in dumps:
        if not (brief and dump.verdict == "clean"):
            parts.extend(_dump_section(dump, max_rows, details, text))
    if clean:
        parts.extend(_clean_summary(clean))
    # once per body, after every dump: not after each table
    parts.extend(f"*{_text(paragraph)}*" for paragraph in legend(report.dumps))
    return "\n\n".join(parts) + "\n"
