"""The terminal view of a `kvcanary.selftest/1` record (the drift report).

One row per scenario and group, one column per planner compared ("agree", or the fields that
differ), and where SGLang's torch reference raises; then every difference found.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvcanary_cli.render.phrases.selftest import (
    agreement_rows,
    difference_value,
    differences_found,
    selftest_verdict,
    sglang_line,
)
from kvcanary_cli.render.records.selftest import SelftestRecord
from kvcanary_cli.render.shared import shown
from kvcanary_cli.safe_text import printable_record

__all__ = ["selftest_table"]


def selftest_table(record: SelftestRecord) -> RenderableType:
    """Header, the agreement table, the verdict, and a table of differences when any."""
    record = printable_record(record)
    header = (
        f"kvcanary {record['kvcanary_version']} selftest: {record['summary']['scenarios']} "
        f"scenarios (size {record['size']}, seed {record['seed']})"
    )
    pairs = "; ".join(f"{p['name']} vs {p['baseline']}" for p in record["planners"])
    parts: list[RenderableType] = [
        Text(header, style="bold"),
        Text("  " + sglang_line(record)),
        Text(f"  compared: {pairs}"),
    ]
    grid = Table(title="agreement per scenario and group", title_justify="left")
    grid.add_column("scenario")
    grid.add_column("group")
    for p in record["planners"]:
        grid.add_column(p["name"])
    grid.add_column("SGLang's reference raises at")
    for scenario, group, cells, raises in agreement_rows(record):
        styled = [
            Text(c, style="" if c.startswith(("agree", "not")) else "bold red") for c in cells
        ]
        grid.add_row(Text(scenario), Text(group), *styled, Text(raises))
    parts.append(grid)
    agree = record["verdict"] == "agree"
    parts.append(Text(selftest_verdict(record), style="bold green" if agree else "bold red"))
    found = differences_found(record)
    if found:
        diffs = Table(title="differences (first per field)", title_justify="left")
        diffs.add_column("scenario", overflow="fold")
        for name in ("group", "planner", "field", "index"):
            diffs.add_column(name, justify="right" if name == "index" else "left", no_wrap=True)
        diffs.add_column("baseline", min_width=12)
        diffs.add_column("planner", min_width=8)
        for scenario, group, c, d in found:
            row = (
                scenario,
                group,
                c["planner"],
                d["field"],
                shown(d["index"]),
                difference_value(d, "baseline"),
                difference_value(d, "planner"),
            )
            diffs.add_row(*(Text(cell) for cell in row))
        parts.append(diffs)
    return Group(*parts)
