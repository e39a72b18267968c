"""Table and Markdown views of the `kvcanary.selftest/1` record (the drift report).

One row per scenario and group, one column per planner compared ("agree", or the fields that
differ), and where SGLang's torch reference raises; then every difference found. The Markdown
view is the one to paste into an issue when kvcanary and an SGLang disagree.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvcanary_cli.render.markdown import code, table, text
from kvcanary_cli.safe_text import printable_record

__all__ = ["selftest_markdown", "selftest_table"]

Record = dict[str, Any]


def _sglang_line(record: Record) -> str:
    sglang = record["sglang"]
    verified = ", ".join(sglang["verified"])
    if sglang["run"]:
        how = "its CUDA kernels" if sglang["mode"] == "cuda" else "its torch reference (no CUDA)"
        state = f"installed {sglang['installed'] or 'unknown'}, run: {how}"
    elif sglang["installed"]:
        state = f"installed {sglang['installed']}, not run (add --sglang)"
    else:
        state = "not installed"
    return f"SGLang: {state}; kvcanary models SGLang {verified}"


def _cell(comparison: Record) -> str:
    if comparison["agree"]:
        if comparison["not_launched"]:
            return "not launched"
        return "agree, raises" if comparison["raised"] else "agree"
    return "differs: " + ", ".join(d["field"] for d in comparison["differences"])


def _raise_text(group: Record) -> str:
    where = group["ref_raise"]
    if where is None:
        return "-"
    return (
        f"batch row {where['batch_row']}, pos {where['position']} ({where['role']}): "
        f"{where['error']}"
    )


def _verdict(record: Record) -> str:
    s = record["summary"]
    names = ", ".join(p["name"] for p in record["planners"])
    if record["verdict"] == "agree":
        return (
            f"full agreement: {s['comparisons']} comparisons ({names} against their baselines) "
            f"over {s['groups']} groups of {s['scenarios']} scenarios"
        )
    return f"DISAGREEMENT: {s['disagreements']} of {s['comparisons']} comparisons differ"


def _rows(record: Record) -> list[tuple[str, str, list[str], str]]:
    rows = []
    for scenario in record["scenarios"]:
        for group in scenario["groups"]:
            cells = [_cell(c) for c in group["comparisons"]]
            rows.append((scenario["scenario"], group["group"], cells, _raise_text(group)))
    return rows


def _differences(record: Record) -> list[tuple[str, str, Record, Record]]:
    return [
        (scenario["scenario"], group["group"], c, d)
        for scenario in record["scenarios"]
        for group in scenario["groups"]
        for c in group["comparisons"]
        for d in c["differences"]
    ]


def _show(value: object) -> str:
    return "-" if value is None else str(value)


def _value(difference: Record, side: str) -> str:
    """One side of a difference; for the raise, None is "no raise"."""
    value = difference[side]
    if value is None and difference["field"] == "raise":
        return "no raise"
    return _show(value)


def selftest_table(record: Record) -> RenderableType:
    """Header, the agreement table, the verdict, and a table of differences when any."""
    record = printable_record(record)
    header = (
        f"kvcanary {record['kvcanary_version']} selftest: {record['summary']['scenarios']} "
        f"scenarios (size {record['size']}, seed {record['seed']})"
    )
    pairs = "; ".join(f"{p['name']} vs {p['baseline']}" for p in record["planners"])
    parts: list[RenderableType] = [
        Text(header, style="bold"),
        Text("  " + _sglang_line(record)),
        Text(f"  compared: {pairs}"),
    ]
    grid = Table(title="agreement per scenario and group", title_justify="left")
    grid.add_column("scenario")
    grid.add_column("group")
    for p in record["planners"]:
        grid.add_column(p["name"])
    grid.add_column("SGLang's reference raises at")
    for scenario, group, cells, raises in _rows(record):
        styled = [
            Text(c, style="" if c.startswith(("agree", "not")) else "bold red") for c in cells
        ]
        grid.add_row(Text(scenario), Text(group), *styled, Text(raises))
    parts.append(grid)
    agree = record["verdict"] == "agree"
    parts.append(Text(_verdict(record), style="bold green" if agree else "bold red"))
    found = _differences(record)
    if found:
        diffs = Table(title="differences (first per field)", title_justify="left")
        diffs.add_column("scenario", overflow="fold")
        for name in ("group", "planner", "field", "index"):
            diffs.add_column(name, justify="right" if name == "index" else "left", no_wrap=True)
        diffs.add_column("baseline", min_width=12)
        diffs.add_column("planner", min_width=8)
        for scenario, group, c, d in found:
            shown = (
                scenario,
                group,
                c["planner"],
                d["field"],
                _show(d["index"]),
                _value(d, "baseline"),
                _value(d, "planner"),
            )
            diffs.add_row(*(Text(cell) for cell in shown))
        parts.append(diffs)
    return Group(*parts)


def selftest_markdown(record: Record) -> str:
    """The same report as GitHub Markdown, for an issue about kvcanary and an SGLang."""
    record = printable_record(record)
    title = "agreement" if record["verdict"] == "agree" else "disagreement"
    facts = [
        f"kvcanary {text(record['kvcanary_version'])} · `{record['schema']}`",
        text(_sglang_line(record)),
        f"scenarios: {record['summary']['scenarios']} (size {text(record['size'])}, "
        f"seed {record['seed']})",
        "compared: "
        + "; ".join(f"{code(p['name'])} vs {code(p['baseline'])}" for p in record["planners"]),
    ]
    parts = [
        f"## kvcanary selftest: {title}",
        "\n".join(f"- {fact}" for fact in facts),
        text(_verdict(record)),
        table(
            [
                "scenario",
                "group",
                *[p["name"] for p in record["planners"]],
                "SGLang's reference raises at",
            ],
            [
                [code(scenario), code(group), *[text(c) for c in cells], text(raises)]
                for scenario, group, cells, raises in _rows(record)
            ],
        ),
    ]
    found = _differences(record)
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
                        text(_value(d, "baseline")),
                        text(_value(d, "planner")),
                    ]
                    for scenario, group, c, d in found
                ],
                right={4},
            )
        )
    return "\n\n".join(parts) + "\n"
