"""Text from a dump reaches a terminal, a Markdown report or an error line only escaped.

A dump (and a log, and their file names) is written by whatever crashed; kvcanary's output is
read in terminals and pasted into issues. Every dump-fed command runs in every format on a dump
whose metadata keys and values, extra tensor names, capture note and file name are full of
control characters, escape sequences (an OSC 52 clipboard write, a screen clear and a spoofed
line), bidi overrides, rich markup and Markdown tricks. The output must hold no control
character (a newline aside), every string must still be readable in escaped form, JSON must
carry the original strings exactly, and Markdown must render the data as plain text: no link,
image or HTML, no broken code span.

(`selftest` is left out: nothing it prints comes from a dump.)
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token
from typer.testing import CliRunner, Result

from kvcanary_cli.canary.logs import format_pump
from kvcanary_cli.cli import app
from kvcanary_cli.dump.schema import EXCEPTION_MESSAGE_KEY, EXCEPTION_TYPE_KEY
from kvcanary_cli.synth.scenarios import make_scenario

#: escape sequences and controls a terminal acts on, and a line that spoofs a clean verdict.
TERMINAL = (
    "\x1b]52;c;SGVsbG8=\x07"  # OSC 52: write the clipboard
    "\x1b[2J\x1b[H"  # CSI: clear the screen, cursor home
    "\x1bc"  # RIS: reset the terminal
    "CLEAN: no findings\r"  # a spoofed verdict, then back to column 0
    "\x9b31m\x85\x90x\x9c"  # C1: CSI, NEL, DCS ... ST
    "\x00\x07\x08\x0b\x0c\x7f"  # NUL, BEL, BS, VT, FF, DEL
    "\u202eevil\u202c\u2066\u200b\ufeff\u2028\u2029\n\t"  # bidi, zero-width, line separators
)
#: rich markup (a closing tag alone is a MarkupError), emoji codes.
MARKUP = "[/x] [link=https://evil.example]click[/link] [bold red]b[/] :smile: "
#: Markdown that would break a code span or a heading, or make a link, an image or HTML.
MARKDOWN = (
    "`one` ``two`` ![img](https://evil.example/i.png) [a](https://evil.example) "
    "<script>alert(1)</script> <https://evil.example> &#x202e; &lt; *em* _u_ ~~s~~ | pipe # h"
)
HOSTILE = TERMINAL + MARKUP + MARKDOWN
NOTE = f"captured on ValueError: {HOSTILE}"
#: a file name holding the same tricks (no `/`, no NUL), kept under 255 bytes.
FILE_STEM = (
    "\x1b]52;c;SGVsbG8=\x07\x1b[2JCLEAN\r\x9b\u202e[bold][link=x]`x`![i](y)[a](b)<b>&amp;\n\t"
)
#: characters a terminal or a renderer would act on; none may appear in any output.
ALLOWED_CONTROL = {"\n"}


def escaped(text: str) -> str:
    """How a string must read once made printable: each non-printable character as its Python
    escape (an oracle written here, independent of kvcanary's sanitizer)."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


@dataclass(frozen=True)
class Hostile:
    """The files every command is run on."""

    dump: Path
    bad: Path
    log: Path
    slot: int
    row: int


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Hostile:
    folder = tmp_path_factory.mktemp("hostile")
    state = make_scenario("canary-aliasing", seed=0, size="tiny")
    state.metadata.update(
        {
            "model": HOSTILE,
            "sglang.commit": HOSTILE,
            "note": NOTE,
            EXCEPTION_TYPE_KEY: "ValueError",  # the recorded exception's line shows it
            EXCEPTION_MESSAGE_KEY: HOSTILE,
            HOSTILE: HOSTILE,
        }
    )
    state.tensors[HOSTILE] = np.array([1, 2], dtype=np.int32)
    dump = state.save(folder / f"{FILE_STEM}.safetensors")
    # a second dump that cannot be read: an accepted tensor with a float dtype
    bad_state = make_scenario("clean-decode", seed=0, size="tiny")
    bad_state.tensors["prefix_lens"] = bad_state.tensors["prefix_lens"].astype(np.float32)
    bad = _save_unchecked(folder / f"bad {FILE_STEM}.safetensors", bad_state.tensors, {})
    ring = state.tensors["violation_ring"]
    index = int(state.tensors["violation_write_index"].reshape(-1)[0])
    messages = format_pump(ring, index, step_when_pumped=7)
    log = folder / f"{FILE_STEM}.log"
    text = HOSTILE.replace("\x00", "")  # a NUL near its start would make the log "binary"
    lines = [text, f"kv_canary violation: launch_tag={text}", *messages, text]
    log.write_bytes("\n".join(lines).encode("utf-8") + b"\n\xff\xfe not utf-8 \x1b[31m\n")
    pool_row = int(state.tensors["req_pool_indices"][state.truth["batch_row"]])
    return Hostile(dump=dump, bad=bad, log=log, slot=state.truth["slot"], row=pool_row)


def _save_unchecked(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> Path:
    """A safetensors file of `tensors` as they are (the writer would refuse bad dtypes)."""
    dtypes = {np.dtype(np.int32): "I32", np.dtype(np.int64): "I64", np.dtype(np.float32): "F32"}
    header: dict[str, Any] = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        data = tensors[name].tobytes()
        header[name] = {
            "dtype": dtypes[tensors[name].dtype],
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    return _write_raw(path, header, b"".join(blobs))


def _write_raw(path: Path, header: dict[str, Any], data: bytes) -> Path:
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def run(args: list[str]) -> Result:
    # color=True: the test runner would otherwise strip CSI sequences from `typer.echo` lines;
    # wide tables, so that a string is found on one line
    return CliRunner().invoke(app, args, color=True, env={"COLUMNS": "4000"})


#: every dump-fed command, with the exit codes it may end in on the hostile files.
COMMANDS: dict[str, tuple[Callable[[Hostile], list[str]], set[int]]] = {
    "check": (lambda h: ["check", str(h.dump), "--kernel", "vectorized"], {1}),
    "check-two": (  # -j 1: in this process (a pool would spend seconds starting)
        lambda h: ["check", str(h.dump), str(h.bad), "--kernel", "vectorized", "-j", "1"],
        {2},
    ),
    "check-quiet": (lambda h: ["check", str(h.dump), "--kernel", "vectorized", "-q"], {1}),
    "provenance-slot": (lambda h: ["provenance", str(h.dump), "--slot", str(h.slot)], {0}),
    "provenance-row": (lambda h: ["provenance", str(h.dump), "--row", str(h.row)], {0}),
    "plan": (lambda h: ["plan", str(h.dump)], {0, 1}),
    "inspect": (lambda h: ["inspect", str(h.dump)], {0}),
    "violations-dump": (lambda h: ["violations", str(h.dump)], {1}),
    "ranks": (lambda h: ["ranks", str(h.dump), str(h.dump)], {0}),  # one dump as two ranks
    "violations-log": (
        lambda h: ["violations", str(h.log), "--dump", str(h.dump), "--replay"],
        {1},
    ),
}
FORMATS = ("table", "json", "markdown")


def assert_terminal_safe(text: str, where: str) -> None:
    bad = sorted({c for c in text if not c.isprintable() and c not in ALLOWED_CONTROL})
    assert not bad, f"{where} holds raw {[ascii(c) for c in bad]}"


def _strings(value: object) -> Iterator[str]:
    """Every string in a JSON document, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _walk(tokens: list[Token]) -> Iterator[Token]:
    for token in tokens:
        yield token
        yield from _walk(token.children or [])


def _rendered_inlines(markdown: str) -> list[str]:
    """The text each inline (a paragraph, a heading, a table cell) renders to."""
    parser = MarkdownIt("commonmark").enable(["table", "strikethrough"])
    tokens = parser.parse(markdown)
    made = [t for t in _walk(tokens) if t.type in ("link_open", "image")]
    assert not made, f"data became a link or an image: {[t.attrs for t in made]}"
    html = "".join(t.content for t in _walk(tokens) if t.type in ("html_inline", "html_block"))
    tags = set(re.findall(r"</?\s*([A-Za-z][\w-]*)", html))
    assert tags <= _OWN_TAGS, f"data became HTML: {tags - _OWN_TAGS}"
    shown = []
    for token in tokens:
        if token.type == "inline":
            pieces = [
                # GitHub unescapes `\|` in a table cell's code span; markdown-it keeps it
                child.content.replace("\\|", "|") if child.type == "code_inline" else child.content
                for child in token.children or []
                if child.type in ("text", "code_inline")
            ]
            shown.append("".join(pieces))
    return shown


#: the HTML kvcanary's own Markdown uses (provenance blocks, line breaks in cells).
_OWN_TAGS = {"details", "summary", "code", "br"}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_dump_text_reaches_no_output_raw(hostile: Hostile, command: str, fmt: str) -> None:
    make_args, codes = COMMANDS[command]
    args = make_args(hostile)
    refused = (command, fmt) == ("check-quiet", "json")  # verdict lines are not JSON
    result = run([*args, "--format", fmt])
    if refused:
        codes = {2}
    assert result.exit_code in codes, (result.exit_code, result.stdout[-400:], result.stderr)
    assert_terminal_safe(result.stdout, "stdout")
    assert_terminal_safe(result.stderr, "stderr")
    if command == "check-two":  # the unreadable dump's error line names its file, escaped
        assert f"{escaped(str(hostile.bad))}: prefix_lens" in result.stderr
    if refused:
        assert result.stdout == ""
    elif command == "check-quiet":  # the verdict lines, table or Markdown alike
        assert escaped(str(hostile.dump)) in result.stdout
    elif fmt == "json":
        strings = set(_strings(json.loads(result.stdout)))
        assert str(hostile.dump) in strings  # the path, exactly
        if command.startswith(("check", "provenance", "inspect", "violations", "ranks")):
            assert {HOSTILE, NOTE} <= strings  # metadata values, exactly
        if command.startswith("check"):  # the recorded exception, exactly
            assert f"ValueError: {HOSTILE}" in strings
        if command == "inspect":
            record = json.loads(result.stdout)
            assert record["other_metadata"][HOSTILE] == HOSTILE
            assert HOSTILE in {t["name"] for t in record["tensors"]}
        if command == "violations-log":
            assert str(hostile.log) in strings
    elif fmt == "markdown":
        shown = "\n".join(_rendered_inlines(result.stdout))
        assert_terminal_safe(shown, "rendered Markdown")  # `&#x202e;` must not decode
        assert escaped(str(hostile.dump)) in shown or escaped(hostile.dump.name) in shown
        if command.startswith(("check", "provenance", "inspect")):
            assert escaped(HOSTILE) in shown
    else:
        if command != "plan":  # the plan's table names no file
            assert escaped(str(hostile.dump)) in result.stdout
        if command.startswith(("check", "provenance", "inspect")):
            assert escaped(HOSTILE) in result.stdout  # markup shown as it is, not parsed


def test_a_file_name_that_is_not_utf8_is_shown_escaped(tmp_path: Path) -> None:
    state = make_scenario("clean-decode", seed=0, size="tiny")
    name = os.fsdecode(b"\xff\xfe\x1b[2J.safetensors")
    path = state.save(tmp_path / name)
    for fmt in FORMATS:
        result = run(["inspect", str(path), "--format", fmt])
        assert result.exit_code in (0, 2), (fmt, result.stdout[-300:], result.stderr)
        assert_terminal_safe(result.stdout, "stdout")
        assert_terminal_safe(result.stderr, "stderr")
        shown = result.stdout if result.exit_code == 0 else result.stderr
        if fmt != "json" or result.exit_code == 2:
            assert "\\udcff\\udcfe\\x1b[2J.safetensors" in shown


# --- error lines --------------------------------------------------------------------------


def _tensor(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def _header_unknown_dtype(folder: Path) -> tuple[Path, str]:
    header = {HOSTILE: _tensor(f"I32{TERMINAL}", [1], 0, 4)}
    return _write_raw(folder / "dtype.safetensors", header, b"\0" * 4), "unknown dtype"


def _header_wrong_size(folder: Path) -> tuple[Path, str]:
    header = {HOSTILE: _tensor("I32", [2], 0, 4)}
    return _write_raw(folder / "size.safetensors", header, b"\0" * 4), "bytes but data_offsets"


def _header_refused_by_safetensors(folder: Path) -> tuple[Path, str]:
    # each entry is sound, but the two overlap: the Rust parser refuses the file
    header = {HOSTILE: _tensor("I32", [1], 0, 4), f"b{HOSTILE}": _tensor("I32", [1], 0, 4)}
    return _write_raw(folder / "refused.safetensors", header, b"\0" * 8), "safetensors"


def _wrong_dtype_in_a_hostile_file(folder: Path) -> tuple[Path, str]:
    state = make_scenario("clean-decode", seed=0, size="tiny")
    state.tensors["req_to_token"] = state.tensors["req_to_token"].astype(np.float32)
    path = _save_unchecked(folder / f"{FILE_STEM}.safetensors", state.tensors, {})
    return path, "req_to_token: dtype"


def _metadata_key_and_value(folder: Path) -> tuple[Path, str]:
    state = make_scenario("clean-decode", seed=0, size="tiny")
    state.metadata["kvcanary.format"] = HOSTILE
    path = folder / f"{FILE_STEM}.safetensors"
    tensors = {k: v for k, v in state.tensors.items()}
    return _save_unchecked(path, tensors, dict(state.metadata)), "format version"


MALFORMED = {
    "unknown dtype": _header_unknown_dtype,
    "size mismatch": _header_wrong_size,
    "safetensors refuses": _header_refused_by_safetensors,
    "wrong dtype, hostile file name": _wrong_dtype_in_a_hostile_file,
    "hostile format version": _metadata_key_and_value,
}


@pytest.mark.parametrize("case", list(MALFORMED))
@pytest.mark.parametrize("command", ["inspect", "check", "provenance", "plan", "violations"])
def test_error_lines_about_a_malformed_dump_are_escaped(
    tmp_path: Path, case: str, command: str
) -> None:
    path, expected = MALFORMED[case](tmp_path)
    args = [command, str(path)] + (["--slot", "1"] if command == "provenance" else [])
    result = run(args)
    assert result.exit_code == 2, (result.exit_code, result.stdout[-300:], result.stderr)
    assert_terminal_safe(result.stdout, "stdout")
    assert_terminal_safe(result.stderr, "stderr")
    line = result.stderr.strip()
    assert line.startswith("error: ") and "\n" not in line, line
    assert expected in line, line
    assert "\\x1b" in line  # the escape is shown, not dropped


def test_a_hostile_option_value_is_echoed_escaped(hostile: Hostile) -> None:
    result = run(["provenance", str(hostile.dump), "--slot", "1", "--group", HOSTILE])
    assert result.exit_code == 2
    assert_terminal_safe(result.stderr, "stderr")
    assert "--group" in result.stderr


def test_provenance_refuses_an_unknown_group(hostile: Hostile) -> None:
    result = run(["provenance", str(hostile.dump), "--slot", "1", "--group", "bogus"])
    assert result.exit_code == 2, result.stdout
    assert "--group" in result.stderr and "bogus" in result.stderr
