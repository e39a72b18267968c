"""A finding in words, as every view of `check` and `provenance` says it: where its cells lie,
its role, the marks of where SGLang's reference and the kernel's launch raise, a few of its
cells.

`finding_words` works them out together, so that a view lays out a finding with one call here
rather than one per phrase.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcanary_cli.render.records.common import UPSTREAM_RAISE, FindingRecord
from kvcanary_cli.render.shared import plural

__all__ = [
    "EXAMPLE_CELLS",
    "FIRST_RAISE_MARK",
    "FindingWords",
    "examples_text",
    "finding_words",
    "launch_mark",
    "positions_text",
    "raise_mark",
    "role_terms",
    "role_text",
    "rows_text",
    "slots_text",
    "where_lines",
]

#: How a finding is marked where SGLang's reference raises first; the line naming the first
#: raise quotes it.
FIRST_RAISE_MARK = "← first raise"

#: cells of a group listed as examples.
EXAMPLE_CELLS = 3

#: The plan reads of a LUT finding, in the order REF makes them.
_READ_ORDER = {"verify": 0, "chain-prev": 1, "seed": 2}


@dataclass(frozen=True)
class FindingWords:
    """Every phrase of one finding (None: the finding has nothing to say there)."""

    #: `3 cells`.
    cells: str
    #: `rows_text`, `positions_text`, `slots_text`, `role_text`.
    rows: str | None
    positions: str | None
    slots: str
    role: str | None
    #: `where_lines`.
    where: list[str]
    #: `raise_mark`, `launch_mark`, `examples_text`.
    raise_mark: str | None
    launch_mark: str | None
    examples: str | None


def finding_words(f: FindingRecord) -> FindingWords:
    """All of a finding's phrases at once."""
    rows, positions, slots = rows_text(f), positions_text(f), slots_text(f)
    return FindingWords(
        cells=plural(f["count"], "cell"),
        rows=rows,
        positions=positions,
        slots=slots,
        role=role_text(f),
        where=_where(f, rows, positions, slots),
        raise_mark=raise_mark(f),
        launch_mark=launch_mark(f),
        examples=examples_text(f),
    )


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


def role_text(f: FindingRecord) -> str | None:
    """A finding's role; for a LUT read, every read that met its cells (`verify+chain-prev`)."""
    read_as = f["details"].get("read_as")
    if isinstance(read_as, list) and read_as:
        reads = sorted((str(r) for r in read_as), key=lambda r: (_READ_ORDER.get(r, 3), r))
        return "+".join(reads)
    return f["role"]


def role_terms(findings: list[FindingRecord]) -> set[str]:
    """The planner terms the roles of `findings` use (`verify`, `chain-prev`, ...), and `REF`
    where a message names SGLang's reference: what a glossary explains."""
    used: set[str] = set()
    for f in findings:
        role = role_text(f)
        if role:
            used.update(role.split("+"))
        if "REF" in f["message"]:
            used.add("REF")
    return used


def where_lines(f: FindingRecord) -> list[str]:
    """Where a finding's cells lie, one fact per line: batch rows, positions, slots."""
    return _where(f, rows_text(f), positions_text(f), slots_text(f))


def _where(f: FindingRecord, rows: str | None, positions: str | None, slots: str) -> list[str]:
    lines = []
    span = f["span"]
    if rows is not None:
        lines.append(f"batch row{'s' if span and span['rows'] > 1 else ''} {rows}")
    if positions is not None:
        lines.append(f"pos {positions}")
    if slots != "-":
        label = "slot"
        if slots.startswith("swa "):  # `swa slot 12`, not `slot swa 12`
            label, slots = "swa slot", slots[len("swa ") :]
        lines.append(f"{label}{'s' if span and span['distinct_slots'] > 1 else ''} {slots}")
    return lines


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
