"""`render_check` / `render_provenance`: every OutputFormat renders; strings are written raw."""

from __future__ import annotations

import ast
import io
import json
from pathlib import Path

import pytest
from rich.console import Console, ConsoleRenderable

import kvcanary_cli.render as render_pkg
from kvcanary_cli.render import JsonText, OutputFormat, emit, render
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.results.provenance import ProvenanceReport


@pytest.mark.parametrize("fmt", list(OutputFormat))
def test_every_format_renders_a_check(fmt: OutputFormat, any_report: CheckReport) -> None:
    out = render(any_report, fmt, max_rows=2)
    if fmt is OutputFormat.TABLE:
        assert isinstance(out, ConsoleRenderable)
    else:
        assert isinstance(out, str) and out.endswith("\n")
    if fmt is OutputFormat.JSON:
        assert isinstance(out, str)
        assert json.loads(out)["schema"] == "kvcanary.check/2"


@pytest.mark.parametrize("fmt", list(OutputFormat))
def test_every_format_renders_a_provenance(
    fmt: OutputFormat, any_provenance: ProvenanceReport
) -> None:
    out = render(any_provenance, fmt)
    assert isinstance(out, ConsoleRenderable if fmt is OutputFormat.TABLE else str)


def test_json_ignores_max_rows(single_report: CheckReport) -> None:
    out = render(single_report, OutputFormat.JSON, max_rows=1)
    assert isinstance(out, str)
    assert len(json.loads(out)["dumps"][0]["findings"]) == len(single_report.dumps[0].findings)


def test_unknown_format_is_rejected(single_report: CheckReport) -> None:
    with pytest.raises(AssertionError):
        render(single_report, "html")  # type: ignore[arg-type]


def test_emit_writes_strings_verbatim(single_report: CheckReport) -> None:
    buf = io.StringIO()
    console = Console(file=buf, width=80, color_system=None)
    text = render(single_report, OutputFormat.JSON)
    emit(text, console)
    assert buf.getvalue() == text  # no markup parsing, wrapping or highlighting
    buf.seek(0)
    buf.truncate()
    emit(render(single_report, OutputFormat.TABLE), console)
    assert "lut-out-of-range" in buf.getvalue()


def test_streamed_json_is_the_same_text_in_pieces(single_report: CheckReport) -> None:
    """`streamed=True` (the command line's way): a `JsonText`, written piece by piece, whose
    text is the JSON `render` returns whole."""
    whole = render(single_report, OutputFormat.JSON)
    view = render(single_report, OutputFormat.JSON, streamed=True)
    assert isinstance(view, JsonText) and isinstance(whole, str)
    buf = io.StringIO()
    emit(view, Console(file=buf, width=80, color_system=None))
    assert buf.getvalue() == str(view) == "".join(view.pieces()) == whole


def test_render_imports_only_results_and_itself() -> None:
    """render may import the commands' typed results (`results`, and the shrink record they
    hold), the package root (for __version__), the canary's labels, the escape for shown text,
    the catalog of codes and itself: every module of it, in every subpackage."""
    allowed = {
        "kvcanary_cli",
        "kvcanary_cli.safe_text",
        "kvcanary_cli.catalog",
        "kvcanary_cli.canary.constants",
        "kvcanary_cli.dump.shrink_record",
    }
    root = Path(render_pkg.__file__).parent
    paths = sorted(root.rglob("*.py"))
    assert len(paths) > 20  # the subpackages are walked too
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.startswith("kvcanary_cli"):
                    assert name in allowed or name.startswith(
                        ("kvcanary_cli.render", "kvcanary_cli.results.")
                    ), f"{path.relative_to(root)} imports {name}"


def test_views_read_results_only() -> None:
    """The table and Markdown views (and their shared helpers) read the typed results (the
    records) by attribute: they import nothing of the analysis or the dump, and never build a
    record (`results.record`), which is JSON's."""
    root = Path(render_pkg.__file__).parent
    views = [*(root / "table").glob("*.py"), *(root / "markdown").glob("*.py")]
    views += [root / "console.py", *(root / "phrases").glob("*.py")]
    assert len(views) > 20
    for path in views:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            where = f"{path.relative_to(root)} imports from {node.module}"
            assert not node.module.startswith(("kvcanary_cli.analysis", "kvcanary_cli.dump")), where
            assert node.module != "kvcanary_cli.results.record", f"{where}: views read results"
            assert not node.module.startswith("kvcanary_cli.render.records"), where
