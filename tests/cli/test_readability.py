"""What a new user reads (issue 26): reports at 80 columns, `--max-rows` on every table, one
unit per number, row maps that say what they leave out, output without padding, bad input
said once, and the words, help and documents around them."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

from kvcanary_cli import api
from kvcanary_cli.cli import app
from kvcanary_cli.render import OutputFormat, render
from kvcanary_cli.render.phrases.check import cause_sections, finding_words
from kvcanary_cli.results.check import CheckReport, Finding
from kvcanary_cli.results.provenance import ProvenanceReport
from tests.torch_extra import needs_torch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
EXAMPLE_NAMES = sorted(p.name for p in EXAMPLES.glob("*.safetensors"))


def run(*args: str) -> Result:
    """At the width the docs quote (100 columns), whatever the test runner's own terminal
    (pytest-xdist's workers export theirs)."""
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "100"})


# --- output without padding; bad input said once ------------------------------------------


@pytest.mark.parametrize("command", ["check", "provenance", "inspect"])
def test_piped_and_file_output_has_no_padding_spaces(command: str, tmp_path: Path) -> None:
    dump = str(EXAMPLES / "truncated-lut.safetensors")
    args = {
        "check": ["check", dump, "-k", "vectorized"],
        "provenance": ["provenance", dump, "--slot", "107"],
        "inspect": ["inspect", dump],
    }[command]
    piped = run(*args)
    target = tmp_path / "report.txt"
    assert run(*args, "-o", str(target)).exit_code == piped.exit_code
    for text in (piped.stdout, target.read_text()):
        padded = [line for line in text.splitlines() if line != line.rstrip()]
        assert padded == [], padded[:3]
        assert "━━" in text  # tables are still drawn


@pytest.mark.slow
def test_an_unreadable_dump_is_reported_once(tmp_path: Path) -> None:
    bad = tmp_path / "cut.safetensors"
    bad.write_bytes((EXAMPLES / "stale-tail.safetensors").read_bytes()[:100])
    good = str(EXAMPLES / "stale-tail.safetensors")
    for args in ([str(bad)], [str(bad), good]):
        for view in ("table", "markdown"):
            result = run("check", *args, "-k", "vectorized", "--format", view)
            assert result.exit_code == 2
            [line] = result.stderr.strip().splitlines()
            reason = line.removeprefix("error: ")
            assert "runs past the end" in reason
            assert "runs past the end" not in result.stdout, view  # said once: on stderr
            if len(args) == 1:  # nothing else to say: standard output stays empty
                assert result.stdout == "", view
                continue
            said = " ".join(result.stdout.split())
            assert "the error line on stderr says why" in said, view
            assert f"{bad}" in said, view
    # a report written to a file keeps the reason: nothing else holds it there
    target = tmp_path / "report.txt"
    for view in ("table", "markdown"):
        assert run("check", str(bad), "-f", view, "-o", str(target), "--force").exit_code == 2
        assert "runs past the end" in " ".join(target.read_text().split())


# --- 80 columns ------------------------------------------------------------------------------


def at_width(renderable: object, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, record=True)
    console.print(renderable)
    return console.export_text()


def _reads_whole(text: str, findings: Sequence[Finding], *, codes_per_finding: bool) -> None:
    """Every finding's code, rows, positions and slots, and its message's first 60
    characters, are in `text`, no word cut short."""
    assert not re.search(r"\w…", text), [line for line in text.splitlines() if "…" in line]
    assert max(map(len, text.splitlines())) <= 80
    flowing = " ".join(text.split())
    for f in findings:
        if codes_per_finding:
            assert f"{f.code} ({f.severity})" in flowing
        else:
            assert re.search(rf"^{re.escape(f.code)} \({f.severity}\): ", text, re.M)
        words = finding_words(f)
        for where in (words.slots, words.rows, words.positions):
            if where not in (None, "-"):
                assert where in flowing, (f.code, where)
        assert " ".join(f.message[:60].split()) in flowing, f.message


@pytest.fixture(scope="module")
def checked_examples() -> dict[str, CheckReport]:
    reports = {name: api.check(EXAMPLES / name, kernel="vectorized") for name in EXAMPLE_NAMES}
    assert all(isinstance(report, CheckReport) for report in reports.values())
    return reports  # type: ignore[return-value]


@pytest.mark.parametrize("example", EXAMPLE_NAMES)
def test_check_reads_whole_at_80_columns(
    example: str, checked_examples: dict[str, CheckReport]
) -> None:
    report = checked_examples[example]
    text = at_width(render(report, OutputFormat.TABLE), 80)
    [dump] = report.dumps
    shown = [f for s in cause_sections(dump, 10) for section in s.sections for f in section.shown]
    assert shown or example == "clean-swa.safetensors"
    _reads_whole(text, shown, codes_per_finding=False)


@pytest.mark.parametrize("example", EXAMPLE_NAMES)
def test_provenance_reads_whole_at_80_columns(
    example: str, checked_examples: dict[str, CheckReport]
) -> None:
    findings = checked_examples[example].dumps[0].findings
    asked: list[dict[str, object]] = []
    for f in findings[:3]:
        if f.slot is not None:
            asked.append({"slot": f.slot, "space": f.space.value})
        if f.pool_row is not None and f.pool_row >= 0:
            asked.append({"row": f.pool_row})
    if not findings:
        asked.append({"row": 1})
    for question in asked:
        answer = api.provenance(EXAMPLES / example, **question)  # type: ignore[arg-type]
        assert isinstance(answer, ProvenanceReport)
        text = at_width(render(answer, OutputFormat.TABLE), 80)
        _reads_whole(text, answer.findings, codes_per_finding=True)


def test_the_issues_80_column_provenance_reads_whole() -> None:
    """The command of issue 26 in an 80-column terminal: every line fits, messages wrap
    across the width (no column a few characters wide), and --max-rows bounds the findings."""
    result = CliRunner(env={"COLUMNS": "80"}).invoke(
        app,
        ["provenance", str(EXAMPLES / "truncated-lut.safetensors"), "--slot", "47"]
        + ["--space", "swa", "--max-rows", "2"],
    )
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    assert sum(line.startswith("• lut-out-of-range (error)") for line in lines) == 2
    assert "… and 1 more finding (--max-rows)" in lines
    assert (
        "  slots >= lut_len 107 (REF raises at the first; the GPU clamps them to LUT[106]" in lines
    )


# --- --max-rows bounds every table that grows with the dump ------------------------------------


def test_max_rows_bounds_the_findings_touching_a_slot_or_row() -> None:
    dump = str(EXAMPLES / "truncated-lut.safetensors")
    for args in (["--slot", "47", "--space", "swa"], ["--row", "9"]):
        every = json.loads(run("provenance", dump, *args, "-f", "json").stdout)["findings"]
        assert len(every) >= 2
        table = run("provenance", dump, *args, "--max-rows", "1").stdout
        assert f"… and {len(every) - 1} more finding" in table
        markdown = run("provenance", dump, *args, "--max-rows", "1", "-f", "markdown").stdout
        assert f"… and {len(every) - 1} more finding" in markdown
        assert markdown.count("| `lut-out-of-range` | error |") == 1


def test_max_rows_bounds_the_requests_with_findings() -> None:
    dump = str(EXAMPLES / "truncated-lut.safetensors")
    table = run("check", dump, "-k", "vectorized", "--max-rows", "2").stdout
    requests = table.split("requests with findings")[1].split("── cause")[0]
    assert len(re.findall(r"^│ +\d+ │", requests, re.M)) == 2
    assert "… and 1 more request with findings (--max-rows)" in requests
    markdown = run("check", dump, "-k", "vectorized", "--max-rows", "2", "-f", "markdown").stdout
    assert "… and 1 more request with findings" in markdown


# --- one unit per number ---------------------------------------------------------------------


def test_every_count_of_a_report_names_its_unit(tmp_path: Path) -> None:
    """The issue's dump: a truncated LUT without a recorded pool size. Counts of cells say
    "cells", counts of findings say "findings", distinct slots and rows say "distinct"."""
    dump = tmp_path / "u.safetensors"
    wrote = run("synth", "truncated-lut-unrecorded", "--out", str(dump), "--seed", "7")
    assert wrote.exit_code == 0, wrote.stderr
    record = json.loads(run("check", str(dump), "-k", "vectorized", "-f", "json").stdout)
    [checked] = record["dumps"]
    counts = {c["code"]: c["count"] for c in checked["counts"]}
    beyond = counts["slot-beyond-pool"]
    text = " ".join(run("check", str(dump), "-k", "vectorized").stdout.split())
    markdown = run("check", str(dump), "-k", "vectorized", "-f", "markdown").stdout
    cells, findings = sum(counts.values()), len(checked["findings"])
    errors = sum(c["count"] for c in checked["counts"] if c["severity"] == "error")
    assert f"({errors} error cells, " in text and f" in {findings} findings; fails" in text
    assert f"{beyond} slot-beyond-pool cells rest on it" in text
    assert f"{beyond} `slot-beyond-pool` cells rest on it" in markdown
    explained = checked["diagnosis"][0]["explains"]
    explains = re.findall(r"- explains (.*?) - fix", text)[0]
    for code, n in explained.items():
        assert f"{n} {code} cell{'s' if n > 1 else ''}" in explains
    assert f"({cells} cells: " in markdown
    assert "cells: the req_to_token cells with a problem" in text
    assert re.search(r"┃ code +┃ severity ┃ group ┃ findings ┃ cells ┃", text)
    assert "cells with findings" in text
    # a number alone in parentheses is a distinct count, and says so
    assert not re.search(r"\.\.\d+ \(\d+\)", text), re.findall(r"\S+ \.\.\d+ \(\d+\)", text)
    assert re.search(r"slots \d+\.\.\d+ \(\d+ distinct\)", text)
    assert "findings: cells and rows" not in text


# --- a row map says what it leaves out -----------------------------------------------------


def test_a_position_range_shows_the_rest_of_the_row_as_gaps() -> None:
    """Issue 26: `--positions 10:20` on a row of 48 positions: 0..9 and 20..47 are gap rows
    with their filled counts, and the map says it shows 10 of 48."""
    args = ["provenance", str(EXAMPLES / "stale-tail.safetensors"), "--row", "10"]
    row = json.loads(run(*args, "--positions", "10:20", "-f", "json").stdout)["row"]
    whole = json.loads(run(*args, "-f", "json").stdout)["row"]
    gaps = {(g["start"], g["end"]): g["filled"] for g in row["gaps"]}
    assert gaps == {(0, 10): 10, (20, 48): whole["filled"] - 10 - 10}
    shown = {c["position"] for c in row["cells"]}
    covered = shown.union(*(range(a, b) for a, b in gaps))
    assert shown == set(range(10, 20)) and covered == set(range(48))
    table = " ".join(run(*args, "--positions", "10:20").stdout.split())
    assert "positions 0..9 not shown (10 filled)" in table
    assert "positions 20..47 not shown (14 filled)" in table
    assert "showing 10 of the pool row's 48 positions (--positions 10:20)" in table
    markdown = run(*args, "--positions", "10:20", "-f", "markdown").stdout
    assert "*positions 0..9 not shown (10 filled)*" in markdown
    assert "showing 10 of the pool row's 48 positions (--positions 10:20)" in markdown


# --- --help, old names -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "command", ["check", "provenance", "violations", "plan", "synth", "shrink", "selftest"]
)
def test_help_states_integer_ranges_as_people_read_them(command: str) -> None:
    text = CliRunner(env={"COLUMNS": "100"}).invoke(app, [command, "--help"]).stdout
    assert "<=x" not in text and "x>=" not in text and "<int range>" not in text
    assert not re.search(r"\d{7,}", text), re.findall(r"\S*\d{7,}\S*", text)


def test_an_integer_out_of_range_is_one_line_in_the_same_words() -> None:
    dump = str(EXAMPLES / "clean-swa.safetensors")
    result = run("check", dump, "--set", "page_size=0")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: Invalid value for '--set': page_size: 0 is below 1 (1 to 2^31-1) "
        "(see 'kvcanary check --help')"
    ]
    assert "is above 2^63-1" in run("provenance", dump, "--slot", str(1 << 63)).stderr
    assert "'x' is not an integer" in run("check", dump, "--max-rows", "x").stderr


@pytest.mark.parametrize(("command", "option"), [("plan", "--backend"), ("check", "--kernel")])
def test_torch_is_the_old_name_of_vectorized(command: str, option: str) -> None:
    dump = str(EXAMPLES / "truncated-lut.safetensors")
    old = run(command, dump, option, "torch", "-f", "json")
    new = run(command, dump, option, "vectorized", "-f", "json")
    assert old.exit_code == new.exit_code and old.stdout == new.stdout
    assert old.stderr.startswith(f"note: {option} torch is the old name of {option} vectorized\n")
    assert "torch" not in run(command, dump, option, "vectorized").stderr


# --- documents --------------------------------------------------------------------------------


def test_examples_readme_quotes_what_its_commands_print() -> None:
    """Each phrase examples/README.md quotes from a report is in the output of its row's
    command (issue 26: it quoted "kernel clamped 29 entries" long after that changed)."""
    quoted = 0
    for line in (EXAMPLES / "README.md").read_text().splitlines():
        command = re.search(r"`kvcanary ([^`]+)`", line)
        phrases = re.findall(r'"([^"]+)"', line)
        if command is None or not phrases:
            continue
        args = command[1].split()
        if args[0] == "check":
            args += ["-k", "vectorized"]
        out = CliRunner(env={"COLUMNS": "300"}).invoke(app, args)
        said = " ".join(out.stdout.split())
        for phrase in phrases:
            assert phrase in said, (phrase, args)
            quoted += 1
    assert quoted >= 2


def test_the_findings_page_lists_every_code_with_its_severity() -> None:
    from kvcanary_cli.catalog import FINDINGS, FindingCode

    doc = (ROOT / "docs" / "findings.md").read_text()
    section = doc.split("## Finding codes\n")[1].split("\n## ")[0]
    listed = dict(re.findall(r"^\| `([a-z-]+)` \| (error|warning|info)\b", section, re.M))
    assert listed == {code.value: str(FINDINGS[code].severity) for code in FindingCode}


def test_the_commands_table_names_plans_backends_as_plan_takes_them() -> None:
    doc = (ROOT / "docs" / "commands.md").read_text()
    [row] = [line for line in doc.splitlines() if line.startswith("| `kvcanary plan DUMP")]
    backends = re.search(r"--backend ([a-z\\|]+)\]", row)
    assert backends is not None
    assert backends[1].split("\\|") == ["reference", "vectorized", "triton", "sglang"]
    assert "`--backend torch` still works" in row


# --- wording ----------------------------------------------------------------------------------


def test_a_slot_beyond_the_pool_is_not_in_use(tmp_path: Path) -> None:
    dump = tmp_path / "beyond.safetensors"
    assert run("synth", "slot-beyond-pool", "--out", str(dump)).exit_code == 0
    record = json.loads(run("check", str(dump), "-k", "vectorized", "-f", "json").stdout)
    [finding] = record["dumps"][0]["findings"]
    slot = str(finding["slot"])
    assert "  allocator: beyond the pool" in run("provenance", str(dump), "--slot", slot).stdout
    answer = json.loads(run("provenance", str(dump), "--slot", slot, "-f", "json").stdout)
    assert answer["slot"]["allocator"] == "beyond the pool"
    assert "allocator: free" in run("provenance", str(dump), "--slot", "5").stdout


def test_a_negative_slot_is_below_the_pool_not_beyond_it() -> None:
    # slot -1 is no slot of the pool, but not past its end: every format says "below"
    dump = str(EXAMPLES / "use-after-free.safetensors")
    table = run("provenance", dump, "--slot", "-1").stdout
    markdown = run("provenance", dump, "--slot", "-1", "-f", "markdown").stdout
    answer = json.loads(run("provenance", dump, "--slot", "-1", "-f", "json").stdout)
    assert "  allocator: below the pool (negative)" in table
    assert "- allocator: below the pool (negative)" in markdown
    assert answer["slot"]["allocator"] == "below the pool (negative)"
    assert not any("beyond" in text for text in (table, markdown, json.dumps(answer)))


def test_the_first_raise_is_marked_as_the_line_naming_it_says() -> None:
    dump = str(EXAMPLES / "truncated-lut.safetensors")
    for fmt in ("table", "markdown"):
        out = CliRunner(env={"COLUMNS": "300"}).invoke(
            app, ["check", dump, "-k", "vectorized", "-f", fmt]
        )
        text = " ".join(out.stdout.split())
        [mark] = re.findall(r"marked \**'?([^'*]+?)'?\** below\)", text)
        assert mark == "← first raise"
        assert text.count(mark) >= 2, fmt  # the line naming it, and the finding it marks


def test_fixes_name_values_not_upstreams_internal_names(tmp_path: Path) -> None:
    dump = tmp_path / "limit.safetensors"
    assert run("synth", "kernel-limit-exceeded", "--out", str(dump)).exit_code == 0
    record = json.loads(run("check", str(dump), "-k", "vectorized", "-f", "json").stdout)
    fixes = [cause["fix"] for cause in record["dumps"][0]["diagnosis"]]
    assert any("at most 4096" in fix for fix in fixes), fixes
    assert not any("_PLAN_BS_BLOCK_SIZE" in fix for fix in fixes)


def test_the_replay_columns_are_explained_where_they_are_shown() -> None:
    args = [
        str(EXAMPLES / "canary-aliasing.log"),
        "--dump",
        str(EXAMPLES / "canary-aliasing.safetensors"),
    ]
    for fmt in ("table", "markdown"):
        out = run("violations", *args, "--replay", "-f", fmt).stdout
        said = " ".join(out.split())
        assert "slot 0: entries skipped, their slot being 0" in said
        assert "no chain check: entries checked without a chain check (prev slot 0)" in said
        assert "skipped (the dump records no real_kv.mode)" in said


def test_the_safetensors_alone_recipe_records_what_the_checks_need(tmp_path: Path) -> None:
    """docs/capture.md's "With safetensors alone" recipe records write_req_capacity and
    page_size: a batch larger than the write plan is reported from its dump
    (kernel-limit-exceeded)."""
    needs_torch()  # the recipe runs in the server, on its torch tensors
    from kvcanary_cli.dump.loader import load_dump
    from tests.helpers import checked
    from tests.test_capture import WritePlan, _Allocator, plan_kwargs

    doc = (ROOT / "docs" / "capture.md").read_text()
    recipe = doc.split("**With safetensors alone**")[1].split("```python\n")[1].split("```")[0]
    target = tmp_path / "step.safetensors"
    kwargs = plan_kwargs()
    kwargs["write_plan_out"] = WritePlan.allocate(2)  # bs 3: one request too many
    namespace = {
        "plan_kwargs": kwargs,
        "allocator": _Allocator(size=127, page_size=1, free_pages=[80]),
    }
    exec(
        compile(recipe.replace("/tmp/step.safetensors", str(target)), "capture", "exec"), namespace
    )
    dump = load_dump(target)
    assert dump.scalars["write_req_capacity"].origin == "recorded"
    assert dump.scalars["page_size"].origin == "recorded"
    assert "kernel-limit-exceeded" in {f.code.value for f in checked(dump).findings}


# --- --svg ------------------------------------------------------------------------------------


def _svg_text(path: Path) -> str:
    """The words of an SVG rich recorded, spaces restored."""
    import html

    return html.unescape(" ".join(re.findall(r">([^<>]+)</text>", path.read_text())))


@pytest.mark.parametrize(
    "args",
    [
        ["check", "truncated-lut.safetensors", "-k", "vectorized"],
        ["provenance", "stale-tail.safetensors", "--row", "10"],
        ["provenance", "truncated-lut.safetensors", "--slot", "107"],
        ["inspect", "clean-swa.safetensors"],
        ["plan", "clean-swa.safetensors", "--group", "swa"],
        ["violations", "canary-aliasing.log", "--dump", "canary-aliasing.safetensors"],
    ],
    ids=lambda a: a[0] if isinstance(a, list) else str(a),
)
def test_svg_saves_the_view_as_an_image(args: list[str], tmp_path: Path) -> None:
    """`--svg FILE` saves what the command shows, in colour, as rich records it; the report
    still goes to standard output."""
    argv = [a if not a.endswith((".safetensors", ".log")) else str(EXAMPLES / a) for a in args]
    image = tmp_path / "report.svg"
    result = run(*argv, "--svg", str(image))
    assert result.exit_code in (0, 1), result.stderr
    svg = image.read_text()
    assert svg.startswith("<svg ") and "Generated with Rich" in svg
    words = " ".join(_svg_text(image).split())
    first = result.stdout.splitlines()[0].split()
    assert " ".join(first[:2]) in words  # the report's first words are in the picture
    if args[0] == "check":
        assert "fill: #cc555a" in svg  # the errors' red: a picture in colour
        assert "where the findings sit" in words
    if "--row" in args:
        assert "row strip, positions 0..33" in words


@pytest.mark.parametrize("fmt", ["json", "markdown"])
def test_svg_of_a_json_or_markdown_report_is_the_table_view(fmt: str, tmp_path: Path) -> None:
    """An image of JSON or Markdown source helps nobody (and of a report of millions of cells
    would take minutes): `--svg` draws the table view the terminal shows, whatever --format."""
    dump = str(EXAMPLES / "truncated-lut.safetensors")
    report, image = tmp_path / f"report.{fmt}", tmp_path / "report.svg"
    result = run(
        "check", dump, "-k", "vectorized", "-f", fmt, "-o", str(report), "--svg", str(image)
    )
    assert result.exit_code == 1, result.stderr
    words = " ".join(_svg_text(image).split())
    assert "fill: #cc555a" in image.read_text() and "where the findings sit" in words
    assert '"schema"' not in words and "## " not in words
    table = run("check", dump, "-k", "vectorized", "-o", str(tmp_path / "table.txt"))
    assert table.exit_code == 1
    first = (tmp_path / "table.txt").read_text().splitlines()[0]
    assert " ".join(first.split()[:2]) in words


def test_svg_is_written_by_the_rules_of_output_files(tmp_path: Path) -> None:
    dump = str(EXAMPLES / "stale-tail.safetensors")
    image = tmp_path / "row.svg"
    assert run("provenance", dump, "--row", "10", "--svg", str(image)).exit_code == 0
    again = run("provenance", dump, "--row", "10", "--svg", str(image))
    assert again.exit_code == 2 and "--force" in again.stderr
    assert run("provenance", dump, "--row", "10", "--svg", str(image), "--force").exit_code == 0
    over_input = run("check", dump, "--svg", dump)
    assert over_input.exit_code == 2 and "is an input" in over_input.stderr
    dash = run("inspect", dump, "--svg", "-")
    assert dash.exit_code == 2 and dash.stderr.startswith("error: --svg")
    # with -o, the image is the view the file holds (120 columns), never over the file
    report = tmp_path / "report.txt"
    twice = run("check", dump, "-o", str(report), "--svg", str(report))
    assert twice.exit_code == 2 and "same file given twice" in twice.stderr
    assert not report.exists()  # both files or neither (tests/cli/test_two_outputs.py)


def test_the_diagnosis_evidence_names_its_counts_as_cells() -> None:
    out = run("check", str(EXAMPLES / "stale-tail.safetensors"), "-k", "vectorized", "-f", "json")
    [cause] = json.loads(out.stdout)["dumps"][0]["diagnosis"]
    assert any("hold 4 freed-slot-in-live-range cells;" in fact for fact in cause["evidence"])


@pytest.mark.parametrize("view", ["table", "markdown"])
def test_the_legend_is_said_once_at_the_end_of_a_run(view: str) -> None:
    """The three legend paragraphs (groups, units, terms) once per run, after every dump's
    section, not after every table (issue 45). Checked in this process (`-j 1`): how the
    reports were made is not what is rendered (the worker processes of a run of several dumps
    are the unreadable-dump test's above)."""
    dumps = [
        str(EXAMPLES / name) for name in ("truncated-lut.safetensors", "stale-tail.safetensors")
    ]
    args = ("check", *dumps, "-k", "vectorized", "-j", "1", "-f", view)
    text = " ".join(run(*args).stdout.split())
    last = max(text.rfind("stale-tail.safetensors"), text.rfind("truncated-lut.safetensors"))
    for paragraph in (
        "verify entries: what the reference plan requests",
        "cells: the req_to_token cells",
        "terms: batch row:",
    ):
        assert text.count(paragraph) == 1, (paragraph, text.count(paragraph))
        assert text.find(paragraph) > last, paragraph
