"""No `@user` or `@org/team` from a dump or a log mentions anyone in a Markdown view (issue 36,
class 12): pasted into an issue, such text must read as itself and notify nobody.

GitHub finds mentions in the rendered text outside code (`pre`, `code`, `a`), after entities
and backslash escapes are decoded; `live_mentions` reads a body that way."""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcanary_cli.cli import app
from kvcanary_cli.render.markdown.blocks import text
from kvcanary_cli.synth.scenarios import make_scenario
from kvcanary_cli.synth.sequence import write_sequence

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTE = "RuntimeError: cc @octocat and @kv-org/on-call"
#: GitHub's own rule, near enough: `@` after the start or a non-word character, then a name.
_LIVE = re.compile(r"(?<![0-9A-Za-z_])@[0-9A-Za-z]")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
_CODE = re.compile(r"<code>.*?</code>", re.S)


def live_mentions(markdown: str) -> list[str]:
    """The mentions GitHub would make in `markdown`: code removed, then the text decoded."""
    prose = _CODE.sub("", _SPAN.sub("", _FENCE.sub("", markdown)))
    unescaped = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", prose)  # backslash escapes
    rendered = html.unescape(unescaped)
    return [rendered[m.start() : m.start() + 20] for m in _LIVE.finditer(rendered)]


def test_the_reader_catches_a_mention() -> None:
    """The checker itself: a bare, backslashed or entity-written `@` is live; in code it is not."""
    for live in ("hi @octocat", "hi \\@octocat", "hi &#64;octocat", "(@org/team)"):
        assert live_mentions(live), live
    for quiet in ("`@octocat`", "a@b.example", "```\n@octocat\n```", "<code>@x</code>"):
        assert not live_mentions(quiet), quiet


def test_text_from_a_dump_mentions_nobody_and_reads_as_itself() -> None:
    shown = text(NOTE)
    assert live_mentions(shown) == []
    assert html.unescape(shown).replace("\u2060", "") == NOTE  # a word joiner, shown as nothing


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A dump, a log and a sequence whose folder, names, metadata and note carry mentions."""
    folder = tmp_path_factory.mktemp("m") / "@kv-org"
    folder.mkdir()
    state = make_scenario("stale-tail", seed=0)
    state.metadata["note"] = NOTE
    state.metadata["model"] = "@someone/model"
    dump = state.save(folder / "@octocat.safetensors")
    twin = state.save(folder / "@twin.safetensors")  # the same step of another rank
    log = folder / "@octocat.log"
    shutil.copy(EXAMPLES / "canary-aliasing.log", log)
    with log.open("a") as handle:  # a canary-looking line that does not parse: a note
        handle.write("kv_canary_swa_divergence=@octocat\n")
    canary = folder / "@canary.safetensors"
    shutil.copy(EXAMPLES / "canary-aliasing.safetensors", canary)
    steps = write_sequence("use-after-free", folder / "@seq", steps=3, seed=1)
    return {"dump": dump, "twin": twin, "log": log, "canary": canary, "a": steps[0], "b": steps[-1]}


VIEWS = {
    "check": ["check", "{dump}", "-k", "vectorized"],
    "check-many": ["check", "{dump}", "{canary}", "-k", "none", "-j", "1"],  # no workers: a view
    "inspect": ["inspect", "{dump}"],
    "provenance-row": ["provenance", "{dump}", "--row", "10"],
    "provenance-slot": ["provenance", "{dump}", "--slot", "107"],
    "plan": ["plan", "{dump}"],
    "violations": ["violations", "{log}", "--dump", "{canary}"],
    "timeline": ["timeline", "{a}", "{b}"],
    "diff": ["diff", "{a}", "{b}"],
    "ranks": ["ranks", "{dump}", "{twin}"],
    "leak": [
        "leak",
        "pool memory leak detected! [full] total=8, available=8, evictable=0, protected=0, "
        "session_held=0, uncached=0",
        "{dump}",
    ],
}


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_no_markdown_view_mentions_anyone(view: str, hostile: dict[str, Path]) -> None:
    args = [a.format(**{k: str(v) for k, v in hostile.items()}) for a in VIEWS[view]]
    result = CliRunner().invoke(app, [*args, "--format", "markdown"])
    assert result.exit_code in (0, 1), result.stderr
    body = result.stdout
    assert "@" in body  # the names are shown (as `@user`, with a word joiner)
    assert live_mentions(body) == [], live_mentions(body)[:5]
