"""Terminal views: render without colour at 100 and 120 columns, show verdicts, codes, caps."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console, RenderableType

from kvcanary_cli.render.table.check import check_table
from kvcanary_cli.render.table.provenance import provenance_table
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.results.provenance import ProvenanceReport
from tests.render.record_schema import record_of

_BOX_START, _BOX_END = "┏┃┡│└", "┓┃┩│┘"


def plain(renderable: RenderableType, width: int = 120) -> str:
    console = Console(file=io.StringIO(), record=True, width=width, color_system=None)
    console.print(renderable)
    text = console.export_text()
    # no table was cropped: every bordered line is closed on the right
    for line in text.splitlines():
        if line[:1] in _BOX_START:
            assert line.rstrip()[-1:] in _BOX_END, line
    return text


@pytest.mark.parametrize("width", [100, 120])
def test_check_table_shows_verdicts_and_codes(any_report: CheckReport, width: int) -> None:
    text = plain(check_table(any_report), width)
    record = record_of(any_report)
    for dump in record["dumps"]:
        verdict = dump["verdict"].upper().replace("-", " ")
        assert re.search(rf"^{verdict}: ", text, re.M), verdict
        for c in dump["counts"]:
            assert c["code"] in text
    if not record["dumps"]:
        assert "no dumps checked" in text


def test_check_table_caps_rows_per_code(single_report: CheckReport) -> None:
    text = plain(check_table(single_report, max_rows=3))
    assert "lut-out-of-range (error): 12 findings" in text
    assert "… and 9 more (--max-rows)" in text
    assert "901" in text and "903" not in text
    assert "… and" not in plain(check_table(single_report, max_rows=50))


def test_check_table_details(single_report: CheckReport) -> None:
    text = plain(check_table(single_report))
    assert (
        "ERRORS: dumps/step1207|rank0.safetensors  (15 error cells, 3 warning cells in 18 "
        "findings; fails --fail-on error)" in text
    )
    assert "sglang 0.5.1 @ abc1234 · model Qwen/Qwen3-8B · rank 0 · step 1207" in text
    assert "kernel clamped 17 plan values (lut-out-of-range)" in plain(
        check_table(single_report), 300
    )
    assert "2 unexplained (kernel-divergence)" in text
    # the example slot's provenance condensed under the message (wide enough not to wrap)
    wide = plain(check_table(single_report), 300)
    assert (
        "slot 77 is held at (pool row 8, pos 4) verify; (pool row 8, pos 9) pending-write; "
        "(pool row 3, pos 4) verify shared; +2 more" in wide
    )
    assert "(pool row 5, pos 10) verify seed" not in wide  # a slot held by its finding's cell only
    # messages are text, never markup
    assert "[bold]full slots 77 and 78[/bold]" in text
    assert "note: no out_cache_loc" in text


def test_multi_dump_summary_only_with_two_dumps(
    multi_report: CheckReport, single_report: CheckReport
) -> None:
    text = plain(check_table(multi_report))
    assert re.search(r"^summary", text, re.M)
    assert "1 of 4 dumps fails at --fail-on error; 1 unreadable" in text
    assert "bad input: missing tensor `req_to_token`" in text
    assert "no findings" in text
    assert not re.search(r"^summary", plain(check_table(single_report)), re.M)


def test_check_table_order_follows_the_record(single_report: CheckReport) -> None:
    text = plain(check_table(single_report))
    heads = re.findall(r"^([a-z-]+) \((?:error|warning)\): ", text, re.M)
    codes = list(dict.fromkeys(c.code for c in single_report.dumps[0].counts))
    assert heads == codes


@pytest.mark.parametrize("width", [100, 120])
def test_slot_provenance_table(slot_report: ProvenanceReport, width: int) -> None:
    text = plain(provenance_table(slot_report), width)
    assert "full slot 77  → swa slot 12 (LUT[77])" in text
    assert "allocator: free" in text
    assert "cells (5 in req_to_token, live first)" in text and "… and 2 more cells" in text
    assert "canary.full.head.k" in text and "77, 4, 1, 0" in text
    assert "duplicate-slot-in-row" in text
    assert "shared" in text


@pytest.mark.parametrize("width", [100, 120])
def test_row_provenance_table(row_report: ProvenanceReport, width: int) -> None:
    text = plain(provenance_table(row_report), width)
    assert "pool row 8 (batch rows 1), group swa" in text
    assert "P 6 · E 2 · window start 3 · 9 filled of max_seq_len 4096" in text
    for role in ("prefix", "verify (seed)", "pending-write", "stale-tail"):
        assert role in text
    marked = [line for line in text.splitlines() if "! " in line]
    assert len(marked) == 3  # one code per line: a code is never cut
    assert "padding-slot-in-live-range" in marked[0]
    assert "! swa-unmapped-in-window" in marked[1] and "! duplicate-slot-in-row" in marked[2]
    assert re.match(r"│ +\d+ │", marked[1]) and re.match(r"│ +│", marked[2])  # the same cell


def test_table_never_prints(single_report: CheckReport, capsys: pytest.CaptureFixture[str]) -> None:
    check_table(single_report)
    assert capsys.readouterr() == ("", "")


def test_piped_output_has_no_colour(
    single_report: CheckReport, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvcanary_cli.render import make_console

    for no_color in (None, "1"):
        if no_color is None:
            monkeypatch.delenv("NO_COLOR", raising=False)
        else:
            monkeypatch.setenv("NO_COLOR", no_color)
        buf = io.StringIO()
        make_console(buf, width=100).print(check_table(single_report))
        assert "\x1b[" not in buf.getvalue()
        assert "ERRORS: " in buf.getvalue()


def test_a_slot_no_cell_holds_says_so_instead_of_an_empty_table(
    slot_report: ProvenanceReport,
) -> None:
    """A free slot that only a LUT or free list names: one line, in the table view and in
    Markdown, where an empty table's header used to stand."""
    from dataclasses import replace

    from kvcanary_cli.render.markdown.provenance import provenance_markdown

    assert slot_report.slot is not None
    held_nowhere = replace(slot_report, slot=replace(slot_report.slot, cells=(), cells_total=0))
    text = plain(provenance_table(held_nowhere))
    assert "cells: no req_to_token cell holds it" in text
    assert "in req_to_token, live first" not in text and "pool row ┃" not in text
    markdown = provenance_markdown(held_nowhere)
    assert "No req_to_token cell holds full slot 77." in markdown
    assert "| pool row |" not in markdown
    # the twin: a held slot keeps its table
    assert "cells (5 in req_to_token, live first)" in plain(provenance_table(slot_report))
