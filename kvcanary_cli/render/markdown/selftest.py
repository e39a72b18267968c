"""The Markdown view of a `kvcanary.selftest/1` record: the one to paste into an issue when
kvcanary and an SGLang disagree."""

from __future__ import annotations

from kvcanary_cli.render.markdown.blocks import code, table, text
from kvcanary_cli.render.phrases.selftest import (
    agreement_rows,
    difference_value,
    differences_found,
    selftest_verdict,
    sglang_line,
)
from kvcanary_cli.render.records.selftest import SelftestRecord
from kvcanary_cli.safe_text import printable_record

__all__ = ["selftest_markdown"]


def selftest_markdown(record: SelftestRecord) -> str:
    """Facts, the verdict, the agreement table and the differences, as GitHub Markdown."""
    record = printable_record(record)
    title = "agreement" if record["verdict"] == "agree" else "disagreement"
    facts = [
        f"kvcanary {text(record['kvcanary_version'])} · `{record['schema']}`",
        text(sglang_line(record)),
        f"scenarios: {record['summary']['scenarios']} (size {text(record['size'])}, "
        f"seed {record['seed']})",
        "compared: "
        + "; ".join(f"{code(p['name'])} vs {code(p['baseline'])}" for p in record["planners"]),
    ]
    parts = [
        f"## kvcanary selftest: {title}",
        "\n".join(f"- {fact}" for fact in facts),
        text(selftest_verdict(record)),
        table(
            [
                "scenario",
                "group",
                *[p["name"] for p in record["planners"]],
                "SGLang's reference raises at",
            ],
            [
                [code(scenario), code(group), *[text(c) for c in cells], text(raises)]
                for scenario, group, cells, raises in agreement_rows(record)
            ],
        ),
    ]
    found = differences_found(record)
    if found:
        parts.append("### Differences (first per field)")
        parts.append(
            table(
                ["scenario", "group", "planner", "field", "index", "baseline", "planner value"],
                [
                    [
                        code(scenario),
                        code(group),
                        code(c["planner"]),
                        code(d["field"]),
                        text(d["index"]),
                        text(difference_value(d, "baseline")),
                        text(difference_value(d, "planner")),
                    ]
                    for scenario, group, c, d in found
                ],
                right={4},
            )
        )
    return "\n\n".join(parts) + "\n"
