"""Pictures for a terminal: a pool row as a strip (`provenance --row`), and where a dump's
findings sit (`check`).

Each picture is drawn at the width the console gives it: one character per position while the
row fits, else one per run of positions (said above the picture). Every kind of cell has its
own glyph and every finding code its own letter, named in a legend, so a picture reads the same
without colour (`NO_COLOR`, a pipe, a file); colour only adds the severity's hue.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.text import Text

from kvcanary_cli.catalog import Severity
from kvcanary_cli.render.console import plural
from kvcanary_cli.render.table.common import SEVERITY_STYLE
from kvcanary_cli.results.check import DumpReport, Finding
from kvcanary_cli.results.provenance import RowMap

if TYPE_CHECKING:
    import numpy as np

    from kvcanary_cli.results.cells import CellColumns

__all__ = ["FindingsMap", "RowStrip", "SlotAxis", "code_letters"]

#: Glyph, style and legend of each kind of position in a row strip, in legend order.
_KINDS: dict[str, tuple[str, str, str]] = {
    "prefix": ("▒", "blue", "live prefix"),
    "window": ("█", "green", "verify window"),
    "pending": ("+", "cyan", "pending write"),
    "stale": ("~", "yellow", "stale tail"),
    "idle": ("o", "magenta", "held by an idle pool row"),
    "empty": ("·", "dim", "no slot"),
}
#: The letters finding codes are drawn with, most severe code first.
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
#: Columns a picture leaves on its left.
_INDENT = 2


def code_letters(findings: Iterable[Finding]) -> dict[str, tuple[str, str]]:
    """A letter and a severity per finding code, most severe first, then in report order
    (after A..Z, the codes share `*`)."""
    severity: dict[str, str] = {}
    for f in findings:
        current = severity.get(f.code)
        if current is None or Severity(f.severity).rank > Severity(current).rank:
            severity[f.code] = f.severity
    ordered = sorted(severity, key=lambda code: -Severity(severity[code]).rank)
    return {
        code: (_LETTERS[i] if i < len(_LETTERS) else "*", severity[code])
        for i, code in enumerate(ordered)
    }


def _per_char(length: int, room: int) -> int:
    """Positions per character for `length` positions in `room` characters (at least 1)."""
    return max(1, -(-length // max(room, 1)))


def _scale_line(start: int, chars: int, step: int) -> Text:
    """Position labels under a picture, every 10 characters where they fit."""
    line = [" "] * chars
    for i in range(0, chars, 10):
        label = str(start + i * step)
        if i + len(label) <= chars and all(c == " " for c in line[max(i - 1, 0) : i]):
            line[i : i + len(label)] = label
    return Text("".join(line).rstrip(), style="dim")


def _by_char(marks: dict[int, str], start: int, step: int) -> dict[int, str]:
    """The letters of `marks` (position -> letter) per character of `step` positions from
    `start`, the most severe (lowest) letter where several meet: work grows with the marks,
    never with the positions a character stands for (a claimed length may be 2^63)."""
    chars: dict[int, str] = {}
    for position, letter in marks.items():
        at = (position - start) // step
        if at not in chars or letter < chars[at]:
            chars[at] = letter
    return chars


def _scale_text(step: int) -> str:
    return "1 position per character" if step == 1 else f"{step} positions per character"


def _code_entries(
    letters: dict[str, tuple[str, str]], shown: Container[str]
) -> list[tuple[str, str, str]]:
    """Legend entries (glyph, style, meaning) of the finding codes whose letters are `shown`."""
    return [
        (letter, _mark_style(severity), f"{code} ({severity})")
        for code, (letter, severity) in letters.items()
        if letter in shown
    ]


def _legend(entries: list[tuple[str, str, str]], width: int) -> Iterator[Text]:
    """`glyph meaning` entries, two spaces apart, wrapped at `width`."""
    line = Text(" " * _INDENT)
    for glyph, style, meaning in entries:
        piece = len(glyph) + 1 + len(meaning)
        if line.cell_len > _INDENT and line.cell_len + 2 + piece > width:
            yield line
            line = Text(" " * _INDENT)
        if line.cell_len > _INDENT:
            line.append("  ")
        line.append(glyph, style=style)
        line.append(f" {meaning}")
    if line.cell_len > _INDENT:
        yield line


def _mark_style(severity: str) -> str:
    return f"bold {SEVERITY_STYLE.get(severity, '')}".strip()


def _marks(
    findings: Sequence[Finding], rows: set[int], *, by: Literal["batch_row", "pool_row"]
) -> tuple[dict[str, tuple[str, str]], dict[int, dict[int, str]]]:
    """Letters for the codes with a cell in `rows` (batch or pool rows, `by` names the cell
    column), and per row the most severe code's letter at each position a cell is on."""
    import numpy as np  # the columns' arrays: only the cells in `rows` become Python ints

    at: dict[int, dict[int, list[str]]] = {row: {} for row in rows}
    wanted = np.array(sorted(rows), dtype=np.int64)
    drawn = []
    for f in findings:
        cells = f.cells
        if cells is None:
            continue
        held, positions = cells.entries(by), cells.entries("position")  # as held: same ints
        assert held is not None and positions is not None
        here = cells.where_in(by, wanted)  # read: only those cells
        for row, position in zip(held[here].tolist(), positions[here].tolist(), strict=True):
            at[row].setdefault(position, []).append(f.code)
        if here.size:
            drawn.append(f)
    letters = code_letters(drawn)
    marks = {
        row: {p: min(letters[code][0] for code in codes) for p, codes in held.items()}
        for row, held in at.items()
    }
    return letters, marks


@dataclass(frozen=True)
class _Live:
    """A live row's ranges: prefix `[0, window)`, window `[window, prefix)`, pending writes
    `[prefix, end)`."""

    window: int
    prefix: int
    end: int


class _FullWidth:
    """A picture drawn across the console's whole width."""

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(options.max_width, options.max_width)


class RowStrip(_FullWidth):
    """A pool row as one line of glyphs: its live prefix, verify window, pending writes and
    stale tail, and each cell with a finding as its code's letter; a scale and a legend."""

    def __init__(self, row: RowMap, findings: Sequence[Finding]) -> None:
        self.row = row
        self.letters, marks = _marks(findings, {row.pool_row}, by="pool_row")
        self.marks = marks[row.pool_row]
        self.live: _Live | None = None
        if row.prefix_len is not None and row.extend_len is not None:
            prefix = max(row.prefix_len, 0)
            self.live = _Live(
                window=max(min(row.window_start or 0, prefix), 0),
                prefix=prefix,
                end=prefix + max(row.extend_len, 0),
            )

    def _kind(self, lo: int, hi: int, filled: int) -> str:
        live = self.live
        if live is not None and lo < live.end:
            for kind, start, end in (
                ("pending", live.prefix, live.end),
                ("window", live.window, live.prefix),
                ("prefix", 0, live.window),
            ):
                if lo < end and start < hi:
                    return kind
        if filled:
            return "stale" if live is not None else "idle"
        return "empty"

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        occupancy = self.row.occupancy
        if occupancy is None:
            return
        width = options.max_width
        start, end, base = occupancy.start, occupancy.end, occupancy.step
        filled = occupancy.filled
        steps = _per_char(len(filled), width - _INDENT)
        step = steps * base
        chars = -(-len(filled) // steps)
        strip = Text(" " * _INDENT)
        kinds: set[str] = set()
        letters: set[str] = set()
        marked = _by_char(self.marks, start, step)
        for i in range(chars):
            lo, hi = start + i * step, min(start + (i + 1) * step, end)
            if i in marked:
                letter = marked[i]
                letters.add(letter)
                severity = next(s for c, (ltr, s) in self.letters.items() if ltr == letter)
                strip.append(letter, style=_mark_style(severity))
                continue
            kind = self._kind(lo, hi, sum(filled[i * steps : (i + 1) * steps]))
            kinds.add(kind)
            glyph, style, _ = _KINDS[kind]
            strip.append(glyph, style=style)
        asked = self.row.positions
        range_end = asked[1] if asked is not None else self.row.max_seq_len
        rest = f" ({end}..{range_end - 1}: no slot)" if range_end > end else ""
        yield Text(
            f"row strip, positions {start}..{end - 1}{rest}: {_scale_text(step)}", style="bold"
        )
        yield strip
        yield Text(" " * _INDENT) + _scale_line(start, chars, step)
        entries = [_KINDS[k] for k in _KINDS if k in kinds]
        entries += _code_entries(self.letters, letters)
        yield from _legend(entries, width)


class FindingsMap(_FullWidth):
    """Where a dump's findings sit: one line per batch row with findings (the first
    `max_rows`), its positions as glyphs: a live cell `·`, a cell with a finding its code's
    letter; a scale and a legend."""

    def __init__(self, dump: DumpReport, max_rows: int) -> None:
        self.requests = dump.requests[:max_rows]
        self.more = len(dump.requests) - len(self.requests)
        shown = {r.batch_row for r in self.requests}
        self.letters, self.marks = _marks(dump.findings, shown, by="batch_row")
        self.ends = {
            r.batch_row: max(
                max(r.prefix_len, 0) + max(r.extend_len, 0),
                max(self.marks[r.batch_row], default=-1) + 1,
            )
            for r in self.requests
        }

    @property
    def drawn(self) -> bool:
        """Whether there is anything to draw: a finding on a cell of a shown batch row."""
        return any(self.marks.values())

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.drawn:
            return
        width = options.max_width
        labels = {
            r.batch_row: f"batch row {r.batch_row} (pool row {r.pool_row})" for r in self.requests
        }
        label_width = max(map(len, labels.values()))
        room = width - _INDENT - label_width - 1
        longest = max(self.ends.values())
        step = _per_char(longest, room)
        yield Text(
            f"where the findings sit: batch rows by position, {_scale_text(step)}", style="bold"
        )
        seen: set[str] = set()
        severity_of = dict(self.letters.values())
        for r in self.requests:
            line = Text(" " * _INDENT + labels[r.batch_row].ljust(label_width) + " ")
            marks, end = self.marks[r.batch_row], self.ends[r.batch_row]
            marked = _by_char(marks, 0, step)
            for i in range(-(-end // step)):
                if i in marked:
                    letter = marked[i]
                    seen.add(letter)
                    line.append(letter, style=_mark_style(severity_of[letter]))
                else:
                    line.append("·", style="dim")
            yield line
        chars = -(-longest // step)
        yield Text(" " * (_INDENT + label_width + 1)) + _scale_line(0, chars, step)
        if self.more:
            yield Text(f"  … and {plural(self.more, 'more batch row')} (--max-rows)")
        entries = [("·", "dim", "a live cell without findings")]
        entries += _code_entries(self.letters, seen)
        yield from _legend(entries, width)


def _slots(f: Finding) -> np.ndarray:
    """A finding's distinct slots as held (empty without a slot column)."""
    import numpy as np

    held = None if f.cells is None else f.cells.distinct("slot")
    return np.zeros(0, dtype=np.int64) if held is None else held


def _has_slots(f: Finding) -> bool:
    """Whether a finding has slots to place (no sort: `_slots` sorts them)."""
    return f.cells is not None and len(f.cells) > 0 and f.cells.entries("slot") is not None


def _min_batch_row(cells: CellColumns) -> int:
    bounds = cells.bounds("batch_row")
    return 0 if bounds is None else bounds[0]


class SlotAxis(_FullWidth):
    """Where a dump's findings sit among the full pool's slots: one line from slot 0 to the
    pool's size (or the largest slot found), `|` at `lut_len` and at the pool's end, a slot
    with a finding its code's letter; drawn when the LUT's length or the pool's size is what
    the findings are about (or they hold slots but no batch row's cells)."""

    def __init__(self, dump: DumpReport) -> None:
        slotted = [f for f in dump.findings if f.space == "full" and f.cells is not None]
        self.letters = code_letters(f for f in slotted if _has_slots(f))
        self.slots: dict[int, str] = {}
        for f in slotted:
            letter = self.letters.get(f.code, ("*", ""))[0]
            held = _slots(f)
            for slot in held[held >= 0].tolist():
                if slot not in self.slots or letter < self.slots[slot]:
                    self.slots[slot] = letter
        lut = [f.details["lut_len"] for f in dump.findings if "lut_len" in f.details]
        self.lut_len = int(lut[0]) if lut and isinstance(lut[0], int) else None
        pool = [s for s in dump.scalars if s.name == "num_full_slots"]
        self.pool = pool[0].value if pool else None
        self.pool_name = "pool size" + (
            " (derived)" if pool and pool[0].origin == "derived" else ""
        )
        beyond = self.pool is not None and any(slot >= self.pool for slot in self.slots)
        cells_only_of_slots = all(
            f.cells is None or (len(f.cells) > 0 and _min_batch_row(f.cells) < 0)
            for f in dump.findings
        )
        self.drawn = bool(self.slots) and (
            self.lut_len is not None or beyond or cells_only_of_slots
        )

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.drawn:
            return
        width = options.max_width
        ends = [max(self.slots) + 1, self.pool or 0, self.lut_len or 0]
        length = max(ends)
        step = _per_char(length + 1, width - _INDENT)
        chars = -(-(length + 1) // step)
        line = Text(" " * _INDENT)
        seen: set[str] = set()
        severity_of = dict(self.letters.values())
        held = _by_char(self.slots, 0, step)
        for i in range(chars):
            if i in held:
                letter = held[i]
                seen.add(letter)
                line.append(letter, style=_mark_style(severity_of.get(letter, "")))
            else:
                line.append("·", style="dim")
        unit = "1 slot per character" if step == 1 else f"{step} slots per character"
        yield Text(f"where the findings sit among the full pool's slots: {unit}", style="bold")
        yield line
        marks = [(0, "0")] + [
            (b // step, f"{name} {b}")
            for name, b in (("lut_len", self.lut_len), (self.pool_name, self.pool))
            if b is not None
        ]
        rows: list[list[str]] = []
        for at, text in marks:  # `^` under the character the bound falls in
            if text == "0":
                label, start = text, 0
            elif at + 1 + len(text) <= chars:
                label, start = f"^{text}", at
            else:
                label, start = f"{text}^", max(at - len(text), 0)
            for row in rows:
                if all(c == " " for c in row[max(start - 1, 0) : start + len(label) + 1]):
                    break
            else:
                row = [" "] * max(chars, start + len(label))
                rows.append(row)
            row[start : start + len(label)] = label
        for row in rows:
            yield Text(" " * _INDENT + "".join(row).rstrip(), style="dim")
        entries = [("·", "dim", "slots without findings")]
        entries += _code_entries(self.letters, seen)
        yield from _legend(entries, width)
