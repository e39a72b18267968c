"""Pictures (issue 26): a pool row as a strip (`provenance --row`) and where a dump's findings
sit (`check`), golden at 80 and 120 columns, with and without colour (refresh:
--update-golden); readable without colour through their glyphs."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from kvcanary_cli import api
from kvcanary_cli.render.table.pictures import FindingsMap, RowStrip, SlotAxis
from kvcanary_cli.results.check import CheckReport, DumpReport
from kvcanary_cli.results.provenance import ProvenanceReport

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
GOLDEN = ROOT / "tests" / "golden" / "pictures"

#: (name, dump, provenance question) of each row strip.
STRIPS: list[tuple[str, str, dict[str, Any]]] = [
    ("stale-tail-row-10", "stale-tail", {"row": 10}),
    ("truncated-lut-row-9", "truncated-lut", {"row": 9}),
    ("truncated-lut-row-8-positions", "truncated-lut", {"row": 8, "positions": (4, 20)}),
    ("write-into-live-slot-row-11", "write-into-live-slot", {"row": 11}),
]
#: the dumps whose findings map is golden.
MAPS = ["truncated-lut", "stale-tail", "canary-aliasing", "cross-request-aliasing"]
#: glyphs of the kinds of positions, never a letter (letters are finding codes).
KIND_GLYPHS = "▒█+~o·"


def drawn(picture: object, width: int, colour: bool) -> str:
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width,
        force_terminal=colour,
        color_system="standard" if colour else None,
        no_color=not colour,
        highlight=False,
    )
    console.print(picture)
    return buffer.getvalue()


def _strip(dump: str, question: dict[str, Any]) -> RowStrip:
    answer = api.provenance(EXAMPLES / f"{dump}.safetensors", **question)
    assert isinstance(answer, ProvenanceReport) and answer.row is not None
    return RowStrip(answer.row, answer.findings)


def _map(dump: str, max_rows: int = 10) -> FindingsMap:
    report = api.check(EXAMPLES / f"{dump}.safetensors", kernel="vectorized")
    assert isinstance(report, CheckReport)
    return FindingsMap(report.dumps[0], max_rows)


def _compare(name: str, text: str, update_golden: bool) -> None:
    golden = GOLDEN / name
    if update_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
        pytest.skip("golden refreshed")
    assert golden.exists(), f"missing {golden}: run pytest --update-golden"
    assert text == golden.read_text()


CASES = [(w, c) for w in (80, 120) for c in (False, True)]
IDS = [f"{w}-{'colour' if c else 'plain'}" for w, c in CASES]


@pytest.mark.parametrize(("width", "colour"), CASES, ids=IDS)
@pytest.mark.parametrize(("name", "dump", "question"), STRIPS, ids=[s[0] for s in STRIPS])
def test_row_strip_matches_golden(
    name: str,
    dump: str,
    question: dict[str, Any],
    width: int,
    colour: bool,
    update_golden: bool,
) -> None:
    text = drawn(_strip(dump, question), width, colour)
    _compare(f"{name}-{width}-{'colour' if colour else 'plain'}.txt", text, update_golden)


@pytest.mark.parametrize(("width", "colour"), CASES, ids=IDS)
@pytest.mark.parametrize("dump", MAPS)
def test_findings_map_matches_golden(
    dump: str, width: int, colour: bool, update_golden: bool
) -> None:
    text = drawn(_map(dump), width, colour)
    _compare(f"map-{dump}-{width}-{'colour' if colour else 'plain'}.txt", text, update_golden)


@pytest.mark.parametrize(("width", "colour"), CASES, ids=IDS)
def test_slot_axis_matches_golden(width: int, colour: bool, update_golden: bool) -> None:
    report = api.check(EXAMPLES / "truncated-lut.safetensors", kernel="vectorized")
    assert isinstance(report, CheckReport)
    axis = SlotAxis(report.dumps[0])
    assert axis.drawn
    text = drawn(axis, width, colour)
    _compare(
        f"slots-truncated-lut-{width}-{'colour' if colour else 'plain'}.txt", text, update_golden
    )
    if not colour:
        lines = text.splitlines()
        at = lines[2].index("^lut_len 107")
        per_char = int(re.search(r"(\d+) slots per character", lines[0])[1])  # type: ignore[index]
        assert at - 2 == 107 // per_char and lines[1][at] == "A"  # slot 107, the first bad one
        assert lines[2].rstrip().endswith("pool size 545^")


@pytest.mark.parametrize("width", [80, 120])
def test_pictures_fit_and_read_without_colour(width: int) -> None:
    for name, dump, question in STRIPS:
        text = drawn(_strip(dump, question), width, colour=False)
        assert "\x1b[" not in text
        assert max(map(len, text.splitlines())) <= width, name
        head, strip, scale, *legend = text.splitlines()
        assert re.match(r"row strip, positions \d+\.\.\d+", head)
        glyphs = set(strip.strip())
        # every glyph on the strip is named in the legend, each by its own glyph
        named = re.findall(r"(?:^|  )(\S) ", "\n".join(legend).replace("\n  ", "  "))
        assert glyphs <= set(named), (name, glyphs, named)
        assert len(named) == len(set(named))
    for dump in MAPS:
        text = drawn(_map(dump), width, colour=False)
        assert max(map(len, text.splitlines())) <= width, dump
        assert re.search(r"(?:^|  )[A-Z] [a-z-]+ \((error|warning|info)\)", text, re.M)


def test_a_strip_marks_each_bad_cell_at_its_position() -> None:
    """stale-tail's row 10: positions 0..18 live (window from 0), 15..18 freed slots (A), a
    stale tail to 33, nothing after: one character per position."""
    text = drawn(_strip("stale-tail", {"row": 10}), 120, colour=False)
    strip = text.splitlines()[1][2:]
    assert strip == "█" * 15 + "AAAA" + "~" * 15
    assert "A freed-slot-in-live-range (error)" in text
    assert "positions 0..33 (34..47: no slot)" in text


def test_a_long_row_is_drawn_in_runs_of_positions(tmp_path: Path) -> None:
    from kvcanary_cli.dump.writer import save_dump

    table = np.zeros((3, 5008), dtype=np.int32)
    table[1, :5000] = np.arange(1, 5001, dtype=np.int32)
    table[1, 3456] = table[1, 10]
    path = save_dump(
        tmp_path / "long.safetensors",
        req_to_token=table,
        req_pool_indices=np.array([1], dtype=np.int64),
        prefix_lens=np.array([4900], dtype=np.int64),
        extend_seq_lens=np.array([100], dtype=np.int64),
        metadata={"num_full_slots": "6000"},
    )
    answer = api.provenance(path, row=1)
    assert isinstance(answer, ProvenanceReport)
    assert answer.row is not None and answer.row.occupancy is not None
    assert answer.row.occupancy.step == 5  # 5000 positions in at most 1024 steps
    text = drawn(RowStrip(answer.row, answer.findings), 80, colour=False)
    head, strip = text.splitlines()[:2]
    per_char = int(re.search(r"(\d+) positions per character", head)[1])  # type: ignore[index]
    assert len(strip) - 2 == -(-5000 // per_char) <= 78
    assert strip.count("A") == 1 and strip.rstrip("+").endswith("█")
    assert strip[2 + 3456 // per_char] == "A"


def test_the_map_is_bounded_by_max_rows() -> None:
    text = drawn(_map("truncated-lut", max_rows=2), 120, colour=False)
    assert len(re.findall(r"^  batch row \d+ \(pool row \d+\)", text, re.M)) == 2
    assert "… and 1 more batch row (--max-rows)" in text


def test_the_pictures_are_in_the_reports() -> None:
    from kvcanary_cli.render import OutputFormat, render

    check = drawn(
        render(
            api.check(EXAMPLES / "stale-tail.safetensors", kernel="vectorized"), OutputFormat.TABLE
        ),
        120,
        colour=False,
    )
    assert "where the findings sit: batch rows by position" in check
    row = drawn(
        render(api.provenance(EXAMPLES / "stale-tail.safetensors", row=10), OutputFormat.TABLE),
        120,
        colour=False,
    )
    assert "row strip, positions 0..33" in row
    assert KIND_GLYPHS


def test_pictures_of_absurd_slots_and_lengths_cost_what_they_draw(tmp_path: Path) -> None:
    """A slot of 2^31 - 1 and a prefix of 2^40: each character stands for billions of slots or
    positions, and drawing them takes the time of the characters, not of what they stand for."""
    from kvcanary_cli.dump.writer import save_dump

    table = np.zeros((3, 64), dtype=np.int32)
    table[1, :20] = np.arange(1, 21, dtype=np.int32)
    table[1, 7] = (1 << 31) - 1
    path = save_dump(
        tmp_path / "absurd.safetensors",
        req_to_token=table,
        req_pool_indices=np.array([1, 2], dtype=np.int64),
        prefix_lens=np.array([20, 1 << 40], dtype=np.int64),
        metadata={"num_full_slots": "64"},
    )
    dump = api.check(path, kernel="vectorized").dumps[0]
    assert isinstance(dump, DumpReport)
    axis = drawn(SlotAxis(dump), 80, colour=False)
    assert "^pool size 64" in axis and re.search(r"\d+ slots per character", axis)
    assert axis.splitlines()[1].rstrip().endswith("A")
    drawn(FindingsMap(dump, 10), 80, colour=False)
