"""Terminal views of a check and of a provenance query, as rich renderables (never printed here).

Both views are drawn from the same records as the JSON and Markdown output, so every format
shows the same findings in the same order; every string of the record is made printable first
(`safe_text.printable_record`: a dump's text cannot reach the terminal as control characters).
Every cell is a `Text` (no markup parsing), and the verdict is spelled out in words so the
views read the same without colour.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvcanary_cli.analysis.model import CheckReport, ProvenanceReport
from kvcanary_cli.render.records import (
    DIFFERENCES_NOTE,
    CodeSection,
    Record,
    cause_sections,
    cell_columns,
    differences_lines,
    failing_phrase,
    plural,
    position_text,
    provenance_record,
    row_lines,
    row_notices,
    shrunk_lines,
    to_record,
)
from kvcanary_cli.safe_text import printable_record

__all__ = ["check_table", "provenance_table", "verdict_lines"]

_VERDICT_STYLE = {
    "errors": "bold red",
    "warnings": "bold yellow",
    "clean": "bold green",
    "bad-input": "bold magenta",
}
_OVERALL_STYLE = {"findings": "bold red", "clean": "bold green", "bad-input": "bold magenta"}
_SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "cyan"}
_CONFIDENCE_STYLE = {"certain": "bold red", "likely": "bold yellow", "possible": "yellow"}
#: cells shown in the condensed provenance column before "+N more".
_CELLS_SHOWN = 3


def _t(value: object, style: str = "") -> Text:
    return Text("-" if value is None else str(value), style=style)


def _identity_line(identity: dict[str, str], path: str | None = None) -> RenderableType:
    bits = []
    version, commit = identity.get("sglang.version"), identity.get("sglang.commit")
    if version or commit:
        bits.append(f"sglang {version or '?'}" + (f" @ {commit}" if commit else ""))
    bits.extend(
        f"{k} {v}" for k, v in identity.items() if k not in ("sglang.version", "sglang.commit")
    )
    if path is not None:
        bits.append(path)
    return _indented([("", Text(" · ".join(bits) or "no identity metadata", style="dim"))])


def _shrunk_lines(shrunk: Record) -> RenderableType:
    return _indented([("", Text(line, style="yellow")) for line in shrunk_lines(shrunk)])


def _slot_text(f: Record) -> str:
    if f["slot"] is None:
        return "-"
    return f"swa {f['slot']}" if f["space"] == "swa" else str(f["slot"])


def _cells_text(f: Record) -> str:
    """Provenance condensed: `(row 8, pos 4) verify; (row 3, pos 4) verify shared; +2 more`."""
    prov = f["provenance"]
    if prov is None:
        return "-"
    bits = []
    for c in prov["cells"][:_CELLS_SHOWN]:
        flags = "".join(f" {flag}" for flag in ("seed", "shared") if c[flag])
        bits.append(f"(row {c['pool_row']}, pos {c['position']}) {c['role']}{flags}")
    more = prov["cells_total"] - min(len(prov["cells"]), _CELLS_SHOWN)
    if more > 0:
        bits.append(f"+{more} more")
    return "; ".join(bits) or "no cells"


def _groups_table(groups: list[Record]) -> Table:
    table = Table(
        title="groups", title_justify="left", caption=DIFFERENCES_NOTE, caption_justify="left"
    )
    for name in (
        "group",
        "window",
        "verify entries",
        "capacity",
        "enable",
        "kernel",
        "differences",
    ):
        table.add_column(
            name,
            justify="right"
            if name in ("window", "verify entries", "capacity", "enable")
            else "left",
        )
    for g in groups:
        lines = differences_lines(g)
        style = "bold red" if g["unexplained_differences"] or g["kernel_launch_error"] else ""
        table.add_row(
            _t(g["group"]),
            _t(g["window"]),
            _t(g["total_verify"]),
            _t(g["verify_capacity"]),
            _t(g["enable"]),
            _t(g["kernel"]),
            Text("\n".join(lines), style=style),
        )
    return table


def _counts_table(counts: list[Record]) -> Table:
    table = Table(title="findings by code", title_justify="left")
    for name in ("code", "severity", "group", "count"):
        table.add_column(name, justify="right" if name == "count" else "left")
    for c in counts:
        style = _SEVERITY_STYLE.get(c["severity"], "")
        table.add_row(
            _t(c["code"], style), _t(c["severity"], style), _t(c["group"]), _t(c["count"])
        )
    return table


def _findings_table(findings: list[Record]) -> Table:
    table = Table()
    for name in ("group", "slot", "batch row", "pool row", "pos", "role"):
        table.add_column(name, justify="left" if name in ("group", "role") else "right")
    table.add_column("cells")
    table.add_column("message")
    for f in findings:
        table.add_row(
            _t(f["group"]),
            _t(_slot_text(f)),
            _t(f["batch_row"]),
            _t(f["pool_row"]),
            _t(position_text(f)),
            _t(f["role"]),
            _t(_cells_text(f)),
            _message_text(f),
        )
    return table


def _message_text(f: Record) -> Text:
    """The message, flagged where SGLang's reference raises and where it rests on assumptions."""
    text = Text(f["message"])
    if f["first_raise"]:
        text.append(" ← SGLang's reference raises here first", style="bold")
    if "upstream_raise" in f["details"]:
        text.append(" ← the kernel's launch raised here", style="bold")
    if f["assumes"]:
        text.append(f" (assumes {', '.join(f['assumes'])}: not recorded)", style="yellow")
    return text


def _code_blocks(sections: list[CodeSection]) -> list[RenderableType]:
    parts: list[RenderableType] = []
    for section in sections:
        style = _SEVERITY_STYLE.get(section.severity, "")
        parts.append(
            Text(
                f"{section.code} ({section.severity}): {plural(section.total, 'finding')}",
                style=f"bold {style}".strip(),
            )
        )
        if section.shown:
            parts.append(_findings_table(section.shown))
        if section.total > len(section.shown):
            parts.append(Text(f"… and {section.total - len(section.shown)} more (--max-rows)"))
    return parts


def _findings_blocks(dump: Record, max_rows: int) -> list[RenderableType]:
    """Symptoms under their causes, in diagnosis order."""
    parts: list[RenderableType] = []
    for number, block in enumerate(cause_sections(dump, max_rows), 1):
        title = (
            "findings no cause explains"
            if block.cause is None
            else f"cause {number}: {block.cause['cause']} ({block.cause['confidence']})"
        )
        parts.append(Text(f"── {title}", style="bold"))
        parts.extend(_code_blocks(block.sections))
    return parts


def _indented(rows: list[tuple[str, Text]], indent: int = 2) -> Table:
    """Lines that wrap under their own start: (marker, text) rows after `indent` spaces."""
    grid = Table.grid()
    grid.add_column(width=indent, no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1)
    for marker, text in rows:
        grid.add_row("", Text(marker + " " if marker else ""), text)
    return grid


def _diagnosis_blocks(dump: Record) -> list[RenderableType]:
    """The causes, most likely first: what went wrong, the evidence, the fix."""
    if not dump["diagnosis"]:
        return []
    parts: list[RenderableType] = [Text("diagnosis", style="bold")]
    for number, cause in enumerate(dump["diagnosis"], 1):
        style = _CONFIDENCE_STYLE.get(cause["confidence"], "")
        head = Text(f"{cause['cause']} ({cause['confidence']})", style=style)
        head.append(f": {cause['summary']}", style="")
        parts.append(_indented([(f"{number}.", head)]))
        rows = [("-", Text(fact)) for fact in cause["evidence"]]
        explains = ", ".join(f"{n} {code}" for code, n in cause["explains"].items())
        if explains:
            rows.append(("-", Text(f"explains {explains}")))
        rows.append(("-", Text(f"fix: {cause['fix']}", style="bold")))
        parts.append(_indented(rows, indent=5))
    return parts


def _raise_blocks(dump: Record) -> list[RenderableType]:
    """Where SGLang's reference raises first, and whether the dump's recorded error agrees."""
    rows: list[tuple[str, Text]] = []
    raised = dump["first_raise"]
    if raised is not None:
        rows.append(
            (
                "",
                Text(
                    f"SGLang's reference raises first in group {raised['group']} at batch "
                    f"row {raised['batch_row']}, position {raised['position']} "
                    f"({raised['code']}, marked 'first raise'): "
                    f"{raised['exception_type']}: {raised['message']}"
                ),
            )
        )
    recorded = dump["recorded_exception"]
    if recorded is not None and dump["recorded_exception_matches"]:
        rows.append(
            ("", Text(f"the dump's note records the same exception: {recorded}", style="green"))
        )
    elif recorded is not None:
        rows.append(
            (
                "",
                Text(
                    f"MISMATCH: the dump's note records {recorded!r}, but kvcanary's reference "
                    + ("raises something else first (above)" if raised else "does not raise at all")
                    + ": the dump may not be the state that failed, or kvcanary's model of SGLang "
                    "differs from the version that ran",
                    style="bold red",
                ),
            )
        )
    for a in dump["assumptions"]:
        decides = ", ".join(f"{n} {code}" for code, n in a["decides"].items())
        rows.append(
            (
                "",
                Text(
                    f"assumption: {a['scalar']} = {a['value']} ({a['source']}) is not recorded; "
                    f"{decides} rest on it and are reported as info: {a['advice']}",
                    style="yellow",
                ),
            )
        )
    return [_indented(rows)] if rows else []


def _requests_table(requests: list[Record]) -> Table:
    table = Table(title="requests with findings", title_justify="left")
    for name in ("batch row", "pool row", "P", "E", "first bad pos"):
        table.add_column(name, justify="right")
    table.add_column("findings")
    for r in requests:
        counts = ", ".join(f"{n} {code}" for code, n in r["counts"].items())
        table.add_row(
            _t(r["batch_row"]),
            _t(r["pool_row"]),
            _t(r["prefix_len"]),
            _t(r["extend_len"]),
            _t(r["first_bad_position"]),
            _t(counts),
        )
    return table


def _dump_blocks(dump: Record, fail_on: str, max_rows: int) -> list[RenderableType]:
    parts: list[RenderableType] = [_verdict_text(dump, fail_on)]
    if dump["identity"] or dump["error"] is None:
        parts.append(_identity_line(dump["identity"]))
    if dump["error"] is not None:
        parts.append(Text(f"  bad input: {dump['error']}", style="magenta"))
    else:
        facts = [f"bs {dump['bs']}"]
        if dump["kernel_mode"]:
            facts.append(f"kernel mode {dump['kernel_mode']}")
        parts.append(Text("  " + " · ".join(facts)))
    if dump["shrunk"] is not None:
        parts.append(_shrunk_lines(dump["shrunk"]))
    if dump["notes"]:
        parts.append(
            _indented([("", Text(f"note: {note}", style="dim")) for note in dump["notes"]])
        )
    parts.extend(_diagnosis_blocks(dump))
    parts.extend(_raise_blocks(dump))
    if dump["groups"]:
        parts.append(_groups_table(dump["groups"]))
    if dump["counts"]:
        parts.append(_counts_table(dump["counts"]))
        if len(dump["requests"]) >= 2:
            parts.append(_requests_table(dump["requests"]))
        parts.extend(_findings_blocks(dump, max_rows))
    elif dump["error"] is None:
        parts.append(Text("  no findings", style="green"))
    return parts


def _summary_table(record: Record) -> Table:
    table = Table(title="summary", title_justify="left")
    for name in ("dump", "verdict", "bs", "errors", "warnings", "error"):
        table.add_column(name, justify="right" if name in ("bs", "errors", "warnings") else "left")
    for d in record["dumps"]:
        errors = sum(c["count"] for c in d["counts"] if c["severity"] == "error")
        warnings = sum(c["count"] for c in d["counts"] if c["severity"] == "warning")
        table.add_row(
            _t(d["path"]),
            _t(d["verdict"], _VERDICT_STYLE.get(d["verdict"], "")),
            _t(d["bs"]),
            _t(errors),
            _t(warnings),
            _t(d["error"]),
        )
    return table


def verdict_lines(report: CheckReport) -> str:
    """`--quiet`: the verdict line of each dump (and the overall one for several), as text."""
    record = printable_record(to_record(report))
    lines = [_verdict_text(dump, record["fail_on"]).plain for dump in record["dumps"]]
    if len(record["dumps"]) >= 2:
        lines.append(failing_phrase(record["summary"], record["fail_on"]))
    return "\n".join(lines) + "\n"


def _verdict_text(dump: Record, fail_on: str) -> Text:
    verdict = dump["verdict"]
    errors = sum(c["count"] for c in dump["counts"] if c["severity"] == "error")
    warnings = sum(c["count"] for c in dump["counts"] if c["severity"] == "warning")
    head = Text(
        f"{verdict.upper().replace('-', ' ')}: {dump['path']}",
        style=_VERDICT_STYLE.get(verdict, "bold"),
    )
    if dump["error"] is None:
        head.append(
            f"  ({plural(errors, 'error')}, {plural(warnings, 'warning')}; "
            f"{'fails' if dump['fails'] else 'passes'} --fail-on {fail_on})"
        )
    return head


def check_table(report: CheckReport, *, max_rows: int = 10) -> RenderableType:
    """Per dump: verdict, identity, groups, counts, then per code the first `max_rows` findings.

    A summary of all dumps follows when there are two or more.
    """
    record = printable_record(to_record(report))
    parts: list[RenderableType] = []
    if record["sglang_installed"]:
        parts.append(Text(f"SGLang installed here: {record['sglang_installed']}", style="dim"))
    for i, dump in enumerate(record["dumps"]):
        if i:
            parts.append(Text(""))
        parts.extend(_dump_blocks(dump, record["fail_on"], max_rows))
    if len(record["dumps"]) >= 2:
        parts.append(Text(""))
        parts.append(_summary_table(record))
        s = record["summary"]
        parts.append(
            Text(
                failing_phrase(s, record["fail_on"]),
                style=_OVERALL_STYLE.get(record["verdict"], "bold"),
            )
        )
    if not parts:
        parts.append(Text("no dumps checked"))
    return Group(*parts)


def _slot_blocks(prov: Record) -> list[RenderableType]:
    head = Text(f"{prov['space']} slot {prov['slot']}", style="bold")
    if prov["swa_slot"] is not None:
        head.append(f"  → swa slot {prov['swa_slot']} (LUT[{prov['slot']}])")
    elif prov["translation_note"]:
        head.append(f"  → no SWA translation: {prov['translation_note']}", style="yellow")
    parts: list[RenderableType] = [head]
    if prov["space"] == "swa":
        mapped = ", ".join(map(str, prov["mapped_from"])) or "none"
        parts.append(Text(f"  mapped from full slots (LUT[f] = {prov['slot']}): {mapped}"))
    if prov["clamped_from"]:
        parts.append(
            Text(
                "  redirected here by the GPU clamp (full slots >= lut_len the SWA plan reads): "
                + ", ".join(map(str, prov["clamped_from"])),
                style="yellow",
            )
        )
    parts.append(
        Text(
            f"  allocator: {prov['allocator'] or 'unknown (no free list in the dump)'}",
            style="red" if prov["allocator"] == "free" else "",
        )
    )
    swa = prov["space"] == "swa"
    cells = Table(
        title=f"cells ({prov['cells_total']} in req_to_token, live first)", title_justify="left"
    )
    for name in cell_columns(swa):
        cells.add_column(
            name, justify="right" if name in ("pool row", "position", "full slot") else "left"
        )
    for c in prov["cells"]:
        cells.add_row(
            _t(c["pool_row"]),
            _t(c["position"]),
            *((_t(c["full_slot"]),) if swa else ()),
            _t(", ".join(map(str, c["batch_rows"])) or "-"),
            _t(c["role"]),
            _t("seed" if c["seed"] else ""),
            _t("shared" if c["shared"] else ""),
        )
    parts.append(cells)
    if prov["cells_total"] > len(prov["cells"]):
        parts.append(Text(f"… and {prov['cells_total'] - len(prov['cells'])} more cells"))
    if prov["canary"]:
        canary = Table(title="canary records", title_justify="left")
        for name in ("buffer", "token", "position", "prev hash", "real kv hash"):
            canary.add_column(name, justify="left" if name == "buffer" else "right")
        for r in prov["canary"]:
            canary.add_row(
                _t(r["buffer"]),
                _t(r["token"]),
                _t(r["position"]),
                _t(r["prev_hash"]),
                _t(r["real_kv_hash"]),
            )
        parts.append(canary)
    if prov["violations"]:
        shown, total = len(prov["violations"]), prov.get("violations_total", 0)
        title = "violation ring rows" + (f" (first {shown} of {total})" if total > shown else "")
        violations = Table(title=title, title_justify="left")
        violations.add_column("index", justify="right")
        violations.add_column("fields")
        for v in prov["violations"]:
            violations.add_row(_t(v["index"]), _t(", ".join(map(str, v["fields"]))))
        parts.append(violations)
    return parts


def _row_blocks(row: Record) -> list[RenderableType]:
    batch_rows = ", ".join(map(str, row["batch_rows"])) or "none (idle row)"
    parts: list[RenderableType] = [
        Text(
            f"pool row {row['pool_row']} (batch rows {batch_rows}), group {row['group']}",
            style="bold",
        ),
        Text(
            f"  P {row['prefix_len'] if row['prefix_len'] is not None else '-'}"
            f" · E {row['extend_len'] if row['extend_len'] is not None else '-'}"
            f" · window start "
            f"{row['window_start'] if row['window_start'] is not None else '-'}"
            f" · {row['filled']} filled of max_seq_len {row['max_seq_len']}"
        ),
    ]
    table = Table()
    for name in ("position", "slot", "role", "swa slot", "marks"):
        table.add_column(
            name, justify="right" if name in ("position", "slot", "swa slot") else "left"
        )
    for line in row_lines(row):
        if "gap" in line:
            gap = line["gap"]
            table.add_row(
                Text("⋯", style="dim"),
                Text("⋯", style="dim"),
                Text(
                    f"positions {gap['start']}..{gap['end'] - 1} not shown "
                    f"({gap['filled']} filled)",
                    style="dim",
                ),
                Text(""),
                Text(""),
            )
            continue
        c = line["cell"]
        marked = bool(c["marks"])
        style = "bold red" if marked else ""
        role = c["role"] + (" (seed)" if c["seed"] else "")
        table.add_row(
            _t(c["position"], style),
            _t(c["slot"], style),
            _t(role, style),
            _t(c["swa_slot"], style),
            _t("! " + ", ".join(c["marks"]) if marked else "", style),
        )
    parts.append(table)
    parts.extend(Text(f"  {notice}", style="yellow") for notice in row_notices(row))
    return parts


def _touching_table(findings: list[Record]) -> Table:
    table = Table(title="findings touching it", title_justify="left")
    table.add_column("code", no_wrap=True)
    for name in ("group", "slot", "batch row", "pool row", "pos", "role", "message"):
        table.add_column(
            name, justify="right" if name in ("slot", "batch row", "pool row", "pos") else "left"
        )
    for f in findings:
        style = _SEVERITY_STYLE.get(f["severity"], "")
        table.add_row(
            _t(f["code"], style),
            _t(f["group"]),
            _t(_slot_text(f)),
            _t(f["batch_row"]),
            _t(f["pool_row"]),
            _t(position_text(f)),
            _t(f["role"]),
            _t(f["message"]),
        )
    return table


def provenance_table(report: ProvenanceReport) -> RenderableType:
    """A slot's cells, translation, allocator, canary and violation rows, or a pool row's map.

    Findings touching the slot (or row) follow; in a row map, the cells they mark are flagged
    with `!` and the finding codes (and highlighted when colour is on).
    """
    record = printable_record(provenance_record(report))
    parts: list[RenderableType] = [
        Text(record["path"], style="bold"),
        _identity_line(record["identity"]),
    ]
    if record["shrunk"] is not None:
        parts.append(_shrunk_lines(record["shrunk"]))
    if record["slot"] is not None:
        parts.extend(_slot_blocks(record["slot"]))
    if record["row"] is not None:
        parts.extend(_row_blocks(record["row"]))
    if record["findings"]:
        parts.append(_touching_table(record["findings"]))
    else:
        parts.append(Text("no findings touch it", style="green"))
    return Group(*parts)
