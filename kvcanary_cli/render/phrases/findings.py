"""A finding in words, as every view of `check` and `provenance` says it: where its cells lie,
its role, the marks of where SGLang's reference and the kernel's launch raise, a few of its
cells.

`finding_words` works them out together (the cells' span once), so that a view lays out a
finding with one call here rather than one per phrase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvcanary_cli.render.shared import plural
from kvcanary_cli.results.check import UPSTREAM_RAISE, Finding

if TYPE_CHECKING:
    import numpy as np

    from kvcanary_cli.results.cells import Span

__all__ = [
    "EXAMPLE_CELLS",
    "FIRST_RAISE_MARK",
    "FindingWords",
    "finding_words",
    "role_terms",
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

    #: where its cells lie (`Finding.span`, computed once here).
    span: Span | None
    #: `3 cells`.
    cells: str
    #: the batch rows (`3`, `0..255 (256 distinct)`), positions (`10..37`), slots (`107`,
    #: `swa 12`, `107..143 (15 distinct)`, `-` for none) and role it covers.
    rows: str | None
    positions: str | None
    slots: str
    role: str | None
    #: where its cells lie, one fact per line: batch rows, positions, slots.
    where: list[str]
    #: where SGLang's reference raises first, where the kernel's launch raised (when at
    #: this finding), and a few of a group's cells.
    raise_mark: str | None
    launch_mark: str | None
    examples: str | None


def finding_words(f: Finding) -> FindingWords:
    """All of a finding's phrases at once."""
    span = f.span
    rows, positions, slots = _rows(f, span), _positions(f, span), _slots(f, span)
    return FindingWords(
        span=span,
        cells=plural(f.count, "cell"),
        rows=rows,
        positions=positions,
        slots=slots,
        role=_role(f),
        where=_where(span, rows, positions, slots),
        raise_mark=_raise_mark(f),
        launch_mark=_launch_mark(f),
        examples=_examples(f),
    )


def _range_text(bounds: tuple[int, int]) -> str:
    first, last = bounds
    return str(first) if first == last else f"{first}..{last}"


def _rows(f: Finding, span: Span | None) -> str | None:
    if span is None:
        return None if f.batch_row is None else str(f.batch_row)
    if span.batch_rows is None:
        return None
    text = _range_text(span.batch_rows)
    return text if span.rows == 1 else f"{text} ({span.rows} distinct)"


def _positions(f: Finding, span: Span | None) -> str | None:
    if span is None:
        return None if f.position is None else str(f.position)
    return None if span.positions is None else _range_text(span.positions)


def _slots(f: Finding, span: Span | None) -> str:
    prefix = "swa " if f.space == "swa" else ""
    if span is None or span.slots is None:
        return "-" if f.slot is None else f"{prefix}{f.slot}"
    text = prefix + _range_text(span.slots)
    return text if span.distinct_slots == 1 else f"{text} ({span.distinct_slots} distinct)"


def _role(f: Finding) -> str | None:
    """A finding's role; for a LUT read, every read that met its cells (`verify+chain-prev`)."""
    read_as = f.details.get("read_as")
    if isinstance(read_as, list | tuple) and read_as:
        reads = sorted((str(r) for r in read_as), key=lambda r: (_READ_ORDER.get(r, 3), r))
        return "+".join(reads)
    return None if f.role is None else str(f.role)


def role_terms(findings: tuple[Finding, ...]) -> set[str]:
    """The planner terms the roles of `findings` use (`verify`, `chain-prev`, ...), and `REF`
    where a message names SGLang's reference: what a glossary explains."""
    used: set[str] = set()
    for f in findings:
        role = _role(f)
        if role:
            used.update(role.split("+"))
        if "REF" in f.message:
            used.add("REF")
    return used


def _where(span: Span | None, rows: str | None, positions: str | None, slots: str) -> list[str]:
    lines = []
    if rows is not None:
        lines.append(f"batch row{'s' if span and span.rows > 1 else ''} {rows}")
    if positions is not None:
        lines.append(f"pos {positions}")
    if slots != "-":
        label = "slot"
        if slots.startswith("swa "):  # `swa slot 12`, not `slot swa 12`
            label, slots = "swa slot", slots[len("swa ") :]
        lines.append(f"{label}{'s' if span and span.distinct_slots > 1 else ''} {slots}")
    return lines


def _raise_mark(f: Finding) -> str | None:
    if not f.first_raise:
        return None
    if f.count == 1:
        return f"{FIRST_RAISE_MARK}: SGLang's reference raises here"
    return (
        f"{FIRST_RAISE_MARK}: SGLang's reference raises at (batch row {f.batch_row}, "
        f"pos {f.position})"
    )


def _launch_mark(f: Finding) -> str | None:
    if UPSTREAM_RAISE not in f.details:
        return None
    if f.count == 1:
        return "← the kernel's launch raised here"
    return f"← the kernel's launch raised at (batch row {f.batch_row}, pos {f.position})"


def _examples(f: Finding, shown: int = EXAMPLE_CELLS) -> str | None:
    """A few cells of a group, its example first: `e.g. row 0 pos 14: slot 107; ...; +12 more`
    (batch rows), reading only those cells. None for a finding of one cell or none (its own
    fields say it all)."""
    cells = f.cells
    if cells is None or f.count < 2:
        return None
    rows, positions, slots = (
        cells.column("batch_row"),
        cells.column("position"),
        cells.column("slot"),
    )
    assert rows is not None and positions is not None

    def at(column: np.ndarray | None, i: int) -> int | None:
        return None if column is None else int(column[i])

    def is_example(i: int) -> bool:
        if f.batch_row is None:  # a finding about slots: its example is a slot
            return slots is not None and at(slots, i) == f.slot
        return at(rows, i) == f.batch_row and at(positions, i) == f.position

    picked = [i for i in range(min(len(cells), shown + 1)) if not is_example(i)]
    bits = []
    for i in [None, *picked][:shown]:
        row = f.batch_row if i is None else at(rows, i)
        position = f.position if i is None else at(positions, i)
        slot = f.slot if i is None else at(slots, i)
        if row is None or row < 0:  # a finding about slots, not table cells
            bits.append(f"slot {slot}")
            continue
        held = "" if slot is None else f": slot {slot}"
        bits.append(f"row {row} pos {position}{held}")
    more = f.count - len(bits)
    return "e.g. " + "; ".join(bits) + (f"; +{more} more" if more > 0 else "")
