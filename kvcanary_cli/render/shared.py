"""What the table and Markdown views share: phrases, counts and groupings drawn from a record.

Both views of a command say the same things in the same words; only the layout differs. Each
helper reads a record (never a result dataclass) and returns plain text or plain structures,
which each view then styles (rich `Text`) or escapes (Markdown).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from kvcanary_cli.catalog import FindingCode, Severity, cell_unit
from kvcanary_cli.render.records.check import (
    CauseRecord,
    CheckSummaryRecord,
    CodeCountRecord,
    DumpRecord,
    GroupRecord,
)
from kvcanary_cli.render.records.common import (
    UPSTREAM_RAISE,
    FindingRecord,
    ShrinkSummaryRecord,
    ShrunkRecord,
    SlotProvenanceRecord,
)
from kvcanary_cli.render.records.inspect import BatchRecord, InspectRecord, TensorRecord
from kvcanary_cli.render.records.plan import PlanProblemRecord, PlanRecord, PlanRequestRecord
from kvcanary_cli.render.records.provenance import GapRecord, RowCellRecord, RowMapRecord
from kvcanary_cli.render.records.selftest import (
    ComparisonRecord,
    DifferenceRecord,
    ScenarioGroupRecord,
    SelftestRecord,
)

if TYPE_CHECKING:  # the violations record is built with numpy: `--help` does not import it
    from kvcanary_cli.render.records.violations import (
        ReplayComparisonRecord,
        SourceRecord,
        ViolationRowRecord,
    )

__all__ = [
    "CUT_COLUMNS",
    "DIFFERENCES_NOTE",
    "FIRST_RAISE_MARK",
    "UNITS_NOTE",
    "GLOSSARY",
    "glossary",
    "top_causes",
    "code_cells",
    "findings_per_count",
    "severity_cells",
    "REPLAY_NOTE",
    "REQUEST_COLUMNS",
    "CauseSection",
    "CodeSection",
    "RowLine",
    "agreement_rows",
    "batch_facts",
    "cause_sections",
    "cell_columns",
    "comparison_cell",
    "cut_rows",
    "difference_phrase",
    "difference_value",
    "differences_found",
    "differences_lines",
    "failing_phrase",
    "fmt_bytes",
    "inspect_metadata",
    "plan_headline",
    "plan_problem_line",
    "plan_request_cells",
    "plural",
    "EXAMPLE_CELLS",
    "examples_text",
    "positions_text",
    "launch_mark",
    "raise_mark",
    "role_text",
    "rows_text",
    "where_lines",
    "slots_text",
    "ref_raise_text",
    "replay_comparison_line",
    "row_lines",
    "row_notices",
    "selftest_verdict",
    "section_size",
    "severity_count",
    "shown",
    "shrink_facts",
    "shrunk_lines",
    "sglang_line",
    "slot_cells_text",
    "source_detail",
    "tensor_role",
    "violation_reasons",
]


def plural(count: int, word: str) -> str:
    """`1 finding`, `2 findings`."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def shown(value: object) -> str:
    """A value as a cell shows it: `-` for None."""
    return "-" if value is None else str(value)


# --- check and provenance ----------------------------------------------------------------

_DIFFERENCE_VERBS: dict[str, str] = {
    FindingCode.LUT_OUT_OF_RANGE: "kernel clamped",
    FindingCode.SLOT_BEYOND_POOL: "kernel read past the pool for",
    FindingCode.ROW_OUT_OF_RANGE: "kernel read out of bounds for",
    FindingCode.PREFIX_BEYOND_ROW: "kernel read neighbouring rows for",
}

#: How to read a groups table: what "verify entries" and differences count.
DIFFERENCES_NOTE = (
    "verify entries: what the reference plan requests; differences: plan values where the "
    "kernel and the reference disagree (a cell read as a verify slot and as a chain "
    "predecessor counts twice)"
)

#: The two units of a report's counts: what a cell and a finding are.
UNITS_NOTE = (
    "cells: the req_to_token cells with a problem (a problem of a request, a tensor or a "
    "scalar counts as 1 cell; a LUT or free-list entry as 1 entry, a leaked page as 1 page); "
    "a finding groups the cells of one code, cause, group and role"
)

#: The planner terms a report may use, in the order a glossary lists them.
GLOSSARY = {
    "batch row": "a request's index in this batch; its pool row is its row of req_to_token",
    "P": "prefix length, the cells a request has written",
    "E": "extend length, the tokens this step writes (positions P..P+E-1)",
    "verify": "a prefix cell inside the window, which the canary verifies",
    "prefix": "a live prefix cell before the window",
    "chain-prev": "the cell just before the window, whose record the first verify read chains from",
    "seed": "a writing row's last prefix cell P-1, which this step's writes chain from",
    "pending-write": "a cell this step writes",
    "stale-tail": "a cell past a live row's end, left by an earlier owner",
    "idle-row": "a cell of a pool row no request of the batch uses",
    "expected-token": "a read of the expected-token pool",
    "REF": "SGLang's torch reference planner, which reads cells in its own order and raises "
    "at the first bad one",
}


def glossary(dumps: list[DumpRecord]) -> str | None:
    """`terms: P: prefix length ...; chain-prev: ...`: the planner terms the reports of
    `dumps` use (roles of their findings, P and E of a requests table, REF where the
    reference raises), each explained once; None when they use none."""
    used: set[str] = set()
    for dump in dumps:
        if dump["findings"] or dump["requests"]:
            used.add("batch row")
        if len(dump["requests"]) >= 2:
            used.update(("P", "E"))
        if dump["first_raise"] is not None:
            used.add("REF")
        for f in dump["findings"]:
            role = role_text(f)
            if role:
                used.update(role.split("+"))
            if "REF" in f["message"]:
                used.add("REF")
    terms = [f"{term}: {meaning}" for term, meaning in GLOSSARY.items() if term in used]
    return "terms: " + "; ".join(terms) if terms else None


def code_cells(counts: dict[FindingCode, int], name: Callable[[str], str] = str) -> str:
    """`15 lut-out-of-range cells, 1 lut-sentinel-missing cell`: counts of cells per code,
    each named as cells (`name` formats a code, e.g. as Markdown code)."""
    return ", ".join(
        f"{n} {name(code)} {cell_unit(FindingCode(code), n)}" for code, n in counts.items()
    )


def severity_cells(counts: list[CodeCountRecord], findings: int) -> str:
    """`16 error cells, 1 warning cell in 5 findings`: a dump's verdict in named units."""
    errors = severity_count(counts, Severity.ERROR)
    warnings = severity_count(counts, Severity.WARNING)
    return (
        f"{plural(errors, 'error cell')}, {plural(warnings, 'warning cell')} in "
        f"{plural(findings, 'finding')}"
    )


def findings_per_count(dump: DumpRecord) -> list[int]:
    """Per entry of a dump's `counts` (code, group, severity), how many findings hold its
    cells."""
    keys = [(f["code"], f["group"], f["severity"]) for f in dump["findings"]]
    return [keys.count((c["code"], c["group"], c["severity"])) for c in dump["counts"]]


def cell_columns(swa: bool) -> tuple[str, ...]:
    """The columns of a slot's cell table, in both views (an SWA slot's cells also name the
    full slot that maps to it)."""
    return (
        "pool row",
        "position",
        *(("full slot",) if swa else ()),
        "batch rows",
        "role",
        "seed",
        "shared",
    )


def differences_lines(group: GroupRecord) -> list[str]:
    """A group's reference/kernel comparison in words, one line per kind of difference."""
    if group["kernel"] == "none":
        return ["not compared (--kernel none)"]
    by_field = group["explained_by_field"]
    lines = [
        difference_phrase(
            code, list(by_field[code].items()) if by_field.get(code) else [("plan value", n)]
        )
        for code, n in group["explained_differences"].items()
    ]
    if group["unexplained_differences"]:
        unexplained = group["unexplained_differences"]
        lines.append(f"{unexplained} unexplained ({FindingCode.KERNEL_DIVERGENCE})")
    if group["kernel_launch_error"]:
        lines.append(f"launch raises: {group['kernel_launch_error']}")
    return lines or ["none"]


def difference_phrase(code: str, by_field: list[tuple[str, int]]) -> str:
    """How a group's explained reference/kernel differences read in tables and Markdown:
    what the kernel did, to how many plan values of each field (field, count), and why."""
    values = ", ".join(plural(n, what) for what, n in by_field)
    verb = _DIFFERENCE_VERBS.get(code)
    if verb is None:
        return f"{values} differ ({code})"
    return f"{verb} {values} ({code})"


def _range_text(bounds: list[int]) -> str:
    first, last = bounds
    return str(first) if first == last else f"{first}..{last}"


def rows_text(f: FindingRecord) -> str | None:
    """The batch rows a finding covers: `3`, or `0..255 (256 distinct)` for a group."""
    span = f["span"]
    if span is None:
        return None if f["batch_row"] is None else str(f["batch_row"])
    if span["batch_rows"] is None:
        return None
    text = _range_text(span["batch_rows"])
    return text if span["rows"] == 1 else f"{text} ({span['rows']} distinct)"


def positions_text(f: FindingRecord) -> str | None:
    """The positions a finding covers: `14`, or `10..37` for a group."""
    span = f["span"]
    if span is None:
        return None if f["position"] is None else str(f["position"])
    return None if span["positions"] is None else _range_text(span["positions"])


def slots_text(f: FindingRecord) -> str:
    """The slots a finding holds: `107`, `swa 12`, or `107..143 (15 distinct)`; `-` for none."""
    span = f["span"]
    prefix = "swa " if f["space"] == "swa" else ""
    if span is None or span["slots"] is None:
        return "-" if f["slot"] is None else f"{prefix}{f['slot']}"
    text = prefix + _range_text(span["slots"])
    return text if span["distinct_slots"] == 1 else f"{text} ({span['distinct_slots']} distinct)"


#: The plan reads of a LUT finding, in the order REF makes them.
_READ_ORDER = {"verify": 0, "chain-prev": 1, "seed": 2}


def role_text(f: FindingRecord) -> str | None:
    """A finding's role; for a LUT read, every read that met its cells (`verify+chain-prev`)."""
    read_as = f["details"].get("read_as")
    if isinstance(read_as, list) and read_as:
        reads = sorted((str(r) for r in read_as), key=lambda r: (_READ_ORDER.get(r, 3), r))
        return "+".join(reads)
    return f["role"]


def where_lines(f: FindingRecord) -> list[str]:
    """Where a finding's cells lie, one fact per line: batch rows, positions, slots."""
    lines = []
    span = f["span"]
    rows, positions = rows_text(f), positions_text(f)
    if rows is not None:
        lines.append(f"batch row{'s' if span and span['rows'] > 1 else ''} {rows}")
    if positions is not None:
        lines.append(f"pos {positions}")
    slots = slots_text(f)
    if slots != "-":
        label = "slot"
        if slots.startswith("swa "):  # `swa slot 12`, not `slot swa 12`
            label, slots = "swa slot", slots[len("swa ") :]
        lines.append(f"{label}{'s' if span and span['distinct_slots'] > 1 else ''} {slots}")
    return lines


#: How a finding is marked where SGLang's reference raises first; the line naming the first
#: raise quotes it.
FIRST_RAISE_MARK = "← first raise"


def raise_mark(f: FindingRecord) -> str | None:
    """Where SGLang's reference raises first, when at this finding: `here`, or the group's
    example cell."""
    if not f["first_raise"]:
        return None
    if f["count"] == 1:
        return f"{FIRST_RAISE_MARK}: SGLang's reference raises here"
    return (
        f"{FIRST_RAISE_MARK}: SGLang's reference raises at (batch row {f['batch_row']}, "
        f"pos {f['position']})"
    )


def launch_mark(f: FindingRecord) -> str | None:
    """Where the kernel's launch raised, as the reference predicts, when at this finding."""
    if UPSTREAM_RAISE not in f["details"]:
        return None
    if f["count"] == 1:
        return "← the kernel's launch raised here"
    return f"← the kernel's launch raised at (batch row {f['batch_row']}, pos {f['position']})"


#: cells of a group listed as examples.
EXAMPLE_CELLS = 3


def examples_text(f: FindingRecord, shown: int = EXAMPLE_CELLS) -> str | None:
    """A few cells of a group, its example first: `e.g. row 0 pos 14: slot 107; ...; +12 more`
    (batch rows). None for a finding of one cell or none (its own fields say it all)."""
    cells = f["cells"]
    if cells is None or f["count"] < 2:
        return None

    def is_example(i: int) -> bool:
        if f["batch_row"] is None:  # a finding about slots: its example is a slot
            return cells["slot"] is not None and cells["slot"][i] == f["slot"]
        return cells["batch_row"][i] == f["batch_row"] and cells["position"][i] == f["position"]

    picked = [i for i in range(min(len(cells["position"]), shown + 1)) if not is_example(i)]
    bits = []
    for i in [None, *picked][:shown]:
        row = f["batch_row"] if i is None else cells["batch_row"][i]
        position = f["position"] if i is None else cells["position"][i]
        slot = f["slot"] if i is None else None if cells["slot"] is None else cells["slot"][i]
        if row is None or row < 0:  # a finding about slots, not table cells
            bits.append(f"slot {slot}")
            continue
        held = "" if slot is None else f": slot {slot}"
        bits.append(f"row {row} pos {position}{held}")
    more = f["count"] - len(bits)
    return "e.g. " + "; ".join(bits) + (f"; +{more} more" if more > 0 else "")


def section_size(section: CodeSection) -> str:
    """`15 cells in 3 findings`, `1 finding` (a finding of one row or tensor counts 1)."""
    findings = plural(section.total, "finding")
    if section.cells == section.total:
        return findings
    return f"{plural(section.cells, 'cell')} in {findings}"


def severity_count(counts: list[CodeCountRecord], severity: Severity) -> int:
    """Cells of one severity over a dump's counts."""
    return sum(c["count"] for c in counts if c["severity"] == severity)


def failing_phrase(summary: CheckSummaryRecord, fail_on: str) -> str:
    """`the dump fails --fail-on error` / `2 of 3 dumps fail ...`, with the unreadable count."""
    failed, dumps, bad = summary["failed"], summary["dumps"], summary["bad_input"]
    if dumps == 1:
        verdict = "is unreadable" if bad else ("fails" if failed else "passes")
        return f"the dump {verdict}" + ("" if bad else f" at --fail-on {fail_on}")
    unreadable = f"; {bad} unreadable" if bad else ""
    verb = "fails" if failed == 1 else "fail"
    return f"{failed} of {dumps} dumps {verb} at --fail-on {fail_on}{unreadable}"


def shrunk_lines(shrunk: ShrunkRecord) -> list[str]:
    """A shrunk dump's facts in words: where it came from, what it dropped, how to redo it."""
    source = shrunk["source"]
    return [
        f"shrunk from {shrunk['source_file']} ({source['bytes']:,} bytes, sha256 "
        f"{source['sha256'][:16]}…): {shrunk['dropped_bytes']:,} bytes of tensor data "
        "dropped",
        shrunk["note"],
    ]


@dataclass(frozen=True)
class CodeSection:
    """One code's block in a dump's view: its cells, its findings and those shown."""

    code: FindingCode
    severity: Severity
    #: cells (and rows) its findings stand for.
    cells: int
    #: its findings (groups).
    total: int
    shown: list[FindingRecord]


@dataclass(frozen=True)
class CauseSection:
    """One cause's block: the diagnosis entry and its symptoms, code by code."""

    #: the `diagnosis` entry; None for findings no cause explains.
    cause: CauseRecord | None
    sections: list[CodeSection]


def _code_sections(findings: list[FindingRecord], max_rows: int) -> list[CodeSection]:
    by_code: dict[tuple[FindingCode, Severity], list[FindingRecord]] = {}
    for f in findings:  # already in report order
        by_code.setdefault((f["code"], f["severity"]), []).append(f)
    return [
        CodeSection(
            code=code,
            severity=severity,
            cells=sum(f["count"] for f in members),
            total=len(members),
            shown=members[: max(max_rows, 0)],
        )
        for (code, severity), members in by_code.items()
    ]


def top_causes(dump: DumpRecord) -> list[CauseRecord]:
    """The causes a report lists: those no other cause explains (docs/findings.md, "Chains");
    the others are their parents' "also shows" lines."""
    return [c for c in dump["diagnosis"] if c["explained_by"] is None]


def cause_sections(dump: DumpRecord, max_rows: int) -> list[CauseSection]:
    """Per cause (diagnosis order), its findings per code: the totals and the first
    `max_rows` findings (groups).

    The table and Markdown views both draw their finding blocks from this, so symptoms are
    always shown under their cause.
    """
    parent: dict[str, str] = {
        c["cause"]: c["explained_by"] for c in dump["diagnosis"] if c["explained_by"]
    }
    members: dict[str | None, list[FindingRecord]] = {}
    for f in dump["findings"]:  # an explained cause's symptoms go under its parent
        own: str | None = f["cause"]
        members.setdefault(parent.get(own or "", own), []).append(f)
    out = []
    for cause in top_causes(dump):
        if cause["cause"] in members:
            found = members.pop(cause["cause"])
            out.append(CauseSection(cause=cause, sections=_code_sections(found, max_rows)))
    for rest in members.values():
        out.append(CauseSection(cause=None, sections=_code_sections(rest, max_rows)))
    return out


#: One line of a row map: a shown cell, or a run of positions left out.
RowLine = tuple[Literal["cell"], RowCellRecord] | tuple[Literal["gap"], GapRecord]


def row_lines(row: RowMapRecord) -> list[RowLine]:
    """The row map's cells and gaps in position order, so that every view shows where
    positions were left out."""
    items: list[tuple[int, RowLine]] = [(c["position"], ("cell", c)) for c in row["cells"]]
    items += [(g["start"], ("gap", g)) for g in row["gaps"]]
    return [item for _, item in sorted(items, key=lambda pair: pair[0])]


def row_notices(row: RowMapRecord) -> list[str]:
    """What a row map does not show, in words."""
    count, length = len(row["cells"]), row["max_seq_len"]
    notices = []
    if count < length:
        asked = row["positions"]
        within = "" if asked is None else f" (--positions {asked[0]}:{asked[1]})"
        notices.append(
            f"showing {count} of the row's {length} positions{within}; the others are in "
            "the gap rows (--positions START:END and --max-rows show more)"
        )
    if row["marks_not_shown"]:
        notices.append(
            f"{row['marks_not_shown']} marked positions do not fit --max-rows: narrow "
            "the range with --positions to see them"
        )
    return notices


# --- inspect -----------------------------------------------------------------------------

#: The columns of a shrunk dump's cut table.
CUT_COLUMNS = ["tensor", "original shape", "kept", "dropped", "dropped bytes", "rows kept"]


def fmt_bytes(count: int) -> str:
    """A byte count for people: `512 B`, `1.5 KiB`, ..., up to GiB."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(count)


def tensor_role(t: TensorRecord) -> str:
    """A tensor's role; for a sparse one (a shrunk dump), how much of it is kept."""
    role = t["role"] or "(ignored)"
    kept = t["kept"]
    if kept is None:
        return role
    total = 1
    for dim in t["shape"]:
        total *= dim
    return f"{role} (sparse: {kept:,} of {total:,} kept)"


def cut_rows(shrink: ShrinkSummaryRecord) -> list[list[str]]:
    """Per tensor the shrink cut: original shape, kept, dropped, bytes dropped, rows kept."""
    return [
        [
            t["name"],
            "x".join(map(str, t["shape"])) or "[]",
            f"{t['kept']:,}",
            f"{t['dropped']:,}",
            fmt_bytes(t["dropped_bytes"]),
            "-" if t["rows"] is None else f"{t['kept_rows']:,} of {t['rows']:,}",
        ]
        for t in shrink["tensors"]
    ]


def shrink_facts(shrink: ShrinkSummaryRecord) -> list[str]:
    """Where a shrunk dump came from, what it dropped and the command that made it."""
    source = shrink["source"]
    return [
        f"shrunk from {shrink['source_file']}: {source['bytes']:,} bytes, "
        f"sha256 {source['sha256']}",
        f"{fmt_bytes(shrink['dropped_bytes'])} of tensor data dropped; reports on this dump "
        "cover the kept cells only",
        f"made with: {shrink['command']}",
    ]


def inspect_metadata(record: InspectRecord) -> dict[str, str]:
    """Identity keys, the SGLang installed here (when it is), then other metadata."""
    installed = record["sglang_installed"]
    here = {"sglang installed here": installed} if installed else {}
    return {**record["identity"], **here, **record["other_metadata"]}


def batch_facts(batch: BatchRecord) -> list[tuple[str, int | None]]:
    """The batch summary's rows, in the order both views show them."""
    return [
        ("bs", batch["bs"]),
        ("active rows", batch["active_rows"]),
        ("padding rows", batch["padding_rows"]),
        ("total prefix tokens", batch["total_prefix_tokens"]),
        ("total extend tokens", batch["total_extend_tokens"]),
        ("max reqs", batch["max_reqs"]),
        ("max seq len", batch["max_seq_len"]),
        ("lut len", batch["lut_len"]),
    ]


# --- plan --------------------------------------------------------------------------------

#: The columns of a plan's request table.
REQUEST_COLUMNS = ("batch row", "pool row", "P", "E", "verify range", "entries", "seed")


def plan_headline(record: PlanRecord) -> str:
    """The plan's scalars in one line."""
    return (
        f"group {record['group']} (window {record['window']}"
        f"{', LUT-translated' if record['translated'] else ''}) "
        f"backend {record['backend']} [{record['semantics']} semantics]: "
        f"{record['total_verify']} entries requested, capacity {record['verify_capacity']}, "
        f"num_valid {record['verify_num_valid']}, enable {record['enable']}, "
        f"write_num_valid_reqs {record['write_num_valid_reqs']}"
    )


def plan_request_cells(req: PlanRequestRecord) -> list[str]:
    """One request's row of `REQUEST_COLUMNS`."""
    start = req["verify_start"]
    span = f"[{start}, {req['verify_end']})" if start is not None else "-"
    seed = "undefined" if req["seed_undefined"] else shown(req["seed"])
    pool_row = "pad" if req["pool_row"] == 0 else str(req["pool_row"])
    return [
        str(req["batch_row"]),
        pool_row,
        str(req["prefix_len"]),
        str(req["extend_len"]),
        span,
        str(req["entries"]),
        seed,
    ]


def plan_problem_line(p: PlanProblemRecord) -> str:
    """One problem met while planning, in words."""
    raises = " (REF raises)" if p["upstream_raises"] else ""
    return (
        f"{p['kind']}: {p['role']} of batch row {p['batch_row']} (pool row "
        f"{p['pool_row']}) at position {p['position']}: value {p['value']}{raises}"
    )


# --- selftest ----------------------------------------------------------------------------


def sglang_line(record: SelftestRecord) -> str:
    """What SGLang is here, whether it ran, and the versions kvcanary models."""
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


def comparison_cell(comparison: ComparisonRecord) -> str:
    """A comparison in the agreement table: agree, or the fields that differ."""
    if comparison["agree"]:
        if comparison["not_launched"]:
            return "not launched"
        return "agree, raises" if comparison["raised"] else "agree"
    return "differs: " + ", ".join(d["field"] for d in comparison["differences"])


def ref_raise_text(group: ScenarioGroupRecord) -> str:
    """Where SGLang's reference raises on a group, or `-`."""
    where = group["ref_raise"]
    if where is None:
        return "-"
    return (
        f"batch row {where['batch_row']}, pos {where['position']} ({where['role']}): "
        f"{where['error']}"
    )


def selftest_verdict(record: SelftestRecord) -> str:
    """Full agreement over what, or how many comparisons differ."""
    s = record["summary"]
    names = ", ".join(p["name"] for p in record["planners"])
    if record["verdict"] == "agree":
        return (
            f"full agreement: {s['comparisons']} comparisons ({names} against their baselines) "
            f"over {s['groups']} groups of {s['scenarios']} scenarios"
        )
    return f"DISAGREEMENT: {s['disagreements']} of {s['comparisons']} comparisons differ"


def agreement_rows(record: SelftestRecord) -> list[tuple[str, str, list[str], str]]:
    """Per scenario and group: its name, group, a cell per planner, and where REF raises."""
    rows: list[tuple[str, str, list[str], str]] = []
    for scenario in record["scenarios"]:
        for group in scenario["groups"]:
            cells = [comparison_cell(c) for c in group["comparisons"]]
            rows.append((scenario["scenario"], group["group"], cells, ref_raise_text(group)))
    return rows


def differences_found(
    record: SelftestRecord,
) -> list[tuple[str, str, ComparisonRecord, DifferenceRecord]]:
    """Every difference, with its scenario, group and comparison."""
    return [
        (scenario["scenario"], group["group"], c, d)
        for scenario in record["scenarios"]
        for group in scenario["groups"]
        for c in group["comparisons"]
        for d in c["differences"]
    ]


def difference_value(difference: DifferenceRecord, side: Literal["baseline", "planner"]) -> str:
    """One side of a difference; for the raise, None is "no raise"."""
    value = difference[side]
    if value is None and difference["field"] == "raise":
        return "no raise"
    return shown(value)


# --- violations --------------------------------------------------------------------------


#: How to read a replay table: what each column counts.
REPLAY_NOTE = (
    "entries: verify entries planned; checked: entries verified; slot 0: entries skipped, "
    "their slot being 0; no chain check: entries checked without a chain check (prev slot "
    "0); real KV: zero (a HEAD buffer must hold 0), checked (a TAIL buffer, against the real "
    "KV fingerprint the dump records) or skipped (the dump records no real_kv.mode); rows: "
    "the violation rows the replay gives"
)


def source_detail(source: SourceRecord) -> str:
    """What a source gave: a ring's state, what the log parser met, or why neither."""
    ring = source["ring"]
    if ring is not None:
        detail = (
            f"ring: {ring['valid']} of {ring['capacity']} rows valid, write index "
            f"{ring['write_index']}"
        )
        return detail + (" (overflow)" if ring["overflow"] else "")
    log = source["log"]
    if log is not None:
        detail = (
            f"{plural(log['lines'], 'line')}: {plural(log['structured'], 'violation line')}, "
            f"{plural(log['messages'], 'full message')}, {log['unparsed']} unparsed"
        )
        if log["unread_violations"]:
            detail += f", {log['unread_violations']} violation(s) unreadable (cut short?)"
        swa = log["swa_divergence"]
        if swa is not None:
            detail += (
                f"; {plural(swa['samples'], 'SWA divergence sample')} (peak index divergence "
                f"{swa['peak_swa_full_idx_divergence']}, out of window "
                f"{swa['peak_swa_out_of_window_tokens']})"
            )
        return detail
    # neither read: the source says why (no ring in the dump, a file named twice)
    return source["notes"][0] if source["notes"] else "no violation ring"


def violation_reasons(row: ViolationRowRecord) -> str:
    """Reason labels, shortened for a table (`verify_` dropped, `write_` kept)."""
    return ", ".join(label.removeprefix("verify_") for label in row["reasons"]) or "none"


def slot_cells_text(prov: SlotProvenanceRecord) -> str:
    """A slot's first cells, condensed: `(row 9, pos 13) verify; +2 more`."""
    cells = [f"(row {c['pool_row']}, pos {c['position']}) {c['role']}" for c in prov["cells"][:3]]
    more = prov["cells_total"] - len(cells)
    if more > 0:
        cells.append(f"+{more} more")
    return "; ".join(cells) or "none"


def replay_comparison_line(comparison: ReplayComparisonRecord) -> str:
    """Replayed rows against the rows read, in words."""
    return (
        f"replay vs observed rows (as multisets): {comparison['matched']} matched, "
        f"{comparison['observed_only']} only observed, {comparison['replayed_only']} only replayed"
    )
