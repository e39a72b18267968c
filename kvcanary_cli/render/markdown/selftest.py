"""The Markdown view of a selftest (the `kvcanary.selftest/1` record): the one to paste into an
issue when kvcanary and an SGLang disagree."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcanary_cli.render.markdown.blocks import code, table, text
from kvcanary_cli.render.table.selftest import (
    agreement_rows,
    difference_value,
    differences_found,
    selftest_verdict,
    sglang_line,
)
from kvcanary_cli.safe_text import printable_record

if TYPE_CHECKING:  # the selftest plans synthetic dumps: `kvcanary --help` does not import it
    from kvcanary_cli.results.selftest import SelftestReport

__all__ = ["selftest_markdown"]


def selftest_markdown(report: SelftestReport) -> str:
    """Facts, the verdict, the agreement table and the differences, as GitHub Markdown."""
    report = printable_record(report)
    title = "agreement" if report.verdict == "agree" else "disagreement"
    facts = [
        f"kvcanary {text(report.kvcanary_version)} · `{report.SCHEMA}`",
        text(sglang_line(report)),
        f"scenarios: {report.summary.scenarios} (size {text(report.size)}, seed {report.seed})",
        "compared: " + "; ".join(f"{code(p.name)} vs {code(p.baseline)}" for p in report.planners),
    ]
    parts = [
        f"## kvcanary selftest: {title}",
        "\n".join(f"- {fact}" for fact in facts),
        text(selftest_verdict(report)),
        table(
            [
                "scenario",
                "group",
                *[p.name for p in report.planners],
                "SGLang's reference raises at",
            ],
            [
                [code(scenario), code(group), *[text(c) for c in cells], text(raises)]
                for scenario, group, cells, raises in agreement_rows(report)
            ],
        ),
    ]
    found = differences_found(report)
    if found:
        parts.append("### Differences (first per field)")
        parts.append(
            table(
                ["scenario", "group", "planner", "field", "index", "baseline", "planner value"],
                [
                    [
                        code(scenario),
                        code(group),
                        code(c.planner),
                        code(d.field),
                        text(d.index),
                        text(difference_value(d, "baseline")),
                        text(difference_value(d, "planner")),
                    ]
                    for scenario, group, c, d in found
                ],
                right={4},
            )
        )
    return "\n\n".join(parts) + "\n"
