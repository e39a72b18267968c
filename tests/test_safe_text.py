"""`safe_text.printable` and the Markdown escapes: nothing acts, nothing is lost."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from kvcanary_cli.dump.schema import Group
from kvcanary_cli.errors import DumpError, PathError
from kvcanary_cli.render.markdown.blocks import code, text
from kvcanary_cli.safe_text import printable, printable_record


def test_printable_escapes_control_characters() -> None:
    assert printable("ok · é 漢 ✓") == "ok · é 漢 ✓"
    assert printable("a\x1b[31m\nb\u2028") == "a\\x1b[31m\\nb\\u2028"
    assert printable("\x1b]52;c;SGVsbG8=\x07") == "\\x1b]52;c;SGVsbG8=\\x07"
    assert printable("x\ry\tz\x00\x7f\x9b\x85") == "x\\ry\\tz\\x00\\x7f\\x9b\\x85"
    assert printable("\u202eevil\u2066\u200b\ufeff") == "\\u202eevil\\u2066\\u200b\\ufeff"
    assert printable("\udcff.safetensors") == "\\udcff.safetensors"  # an undecodable name


@given(st.text())
def test_printable_output_prints_and_keeps_every_character(value: str) -> None:
    shown = printable(value)
    assert shown.isprintable()
    assert printable(shown) == shown  # idempotent: any layer may apply it again
    # nothing is lost: decoding the escapes of a string without backslashes gives it back
    if "\\" not in value:
        assert shown.encode("ascii", "backslashreplace").decode("unicode_escape") == value


def test_printable_record_escapes_keys_and_nested_values() -> None:
    record = {"a\x1b": ["\r", {"k\u202e": ("v\n", 3, None)}], "n": 1.5}
    assert printable_record(record) == {
        "a\\x1b": ["\\r", {"k\\u202e": ("v\\n", 3, None)}],
        "n": 1.5,
    }


def test_printable_record_escapes_a_result_and_keeps_its_type_and_enums() -> None:
    """A result (a frozen dataclass, the record itself) comes back as a copy of its class,
    every string escaped, nested results and enum members kept as they are."""

    @dataclasses.dataclass(frozen=True)
    class Inner:
        name: str
        group: Group

    @dataclasses.dataclass(frozen=True)
    class Outer:
        path: str
        inner: tuple[Inner, ...]
        count: int

    result = Outer(path="d\x1b.st", inner=(Inner(name="k\u202e", group=Group.SWA),), count=3)
    shown = printable_record(result)
    assert type(shown) is Outer and shown == Outer(
        path="d\\x1b.st", inner=(Inner(name="k\\u202e", group=Group.SWA),), count=3
    )
    assert shown.inner[0].group is Group.SWA
    assert result.path == "d\x1b.st"  # the original is left as it is


def test_error_lines_are_escaped_but_keep_their_fields() -> None:
    err = DumpError("dtype F32\x1b[2J", field="t\u202e", path="/d/\r.safetensors", hint="h\x07")
    assert str(err) == "/d/\\r.safetensors: t\\u202e: dtype F32\\x1b[2J (h\\x07)"
    assert err.field == "t\u202e"  # the attribute stays exact for library users
    assert str(PathError("exists", path="a\nb")) == "a\\nb: exists"


def _rendered(markdown: str) -> str:
    """What a paragraph renders to, as text."""
    tokens = MarkdownIt("commonmark").enable(["table", "strikethrough"]).parseInline(markdown)
    children = tokens[0].children or []
    assert {t.type for t in children} <= {"text", "code_inline", "softbreak"}, children
    return "".join(t.content for t in children)


TRICKS = [
    "![img](https://e.x/i.png)",
    "[a](https://e.x)",
    "<script>alert(1)</script>",
    "<https://e.x>",
    "&#x202e; &lt; &amp;",
    "*em* **strong** _u_ __uu__ ~~s~~ ~s~",
    "a`b``c```d",
    "`` x ``",
    "back\\slash \\* \\_ \\[",
    "lut_len LUT[106] [x] (y)",
]


@pytest.mark.parametrize("value", TRICKS)
def test_markdown_text_renders_as_itself(value: str) -> None:
    assert _rendered(text(value)) == value


@pytest.mark.parametrize("value", TRICKS + [" padded ", "`edge`", " lead"])
def test_a_code_span_holds_any_text(value: str) -> None:
    assert _rendered(code(value, cell=False)) == value


def test_markdown_text_escapes_control_characters_and_keeps_own_line_breaks() -> None:
    assert _rendered(text("a\x1b\rb")) == "a\\x1b\\rb"
    assert text("one\ntwo") == "one<br>two"
    assert code("a\nb", cell=False) == "`a\\nb`"


JSON_LIKE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _all_strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_all_strings(k), *_all_strings(v))]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _all_strings(v)]
    return []


@given(st.dictionaries(st.text(), JSON_LIKE, max_size=4))
@pytest.mark.slow
def test_printable_record_leaves_no_string_unescaped(record: dict[str, object]) -> None:
    shown = printable_record(record)
    assert all(s.isprintable() for s in _all_strings(shown))
    assert len(_all_strings(shown)) == len(_all_strings(record))
