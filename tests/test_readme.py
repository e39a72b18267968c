"""The README's and docs/' quoted command output is the real output (as pip-audit's
`check-readme`), their links lead somewhere in the repository, and the README's Quick start is
what CI runs.

Every ```text block of README.md or a docs/ page that starts with `$ kvcanary ...` is re-run as a
user would (a fresh process, 100 columns, no colour) and must print exactly the lines quoted
(trailing spaces aside), as on a machine without SGLang installed (reports name the installed
SGLang). A block whose last line is `…` alone quotes the first lines of the output: they must be
exactly its first lines, and the output must go on past them.
The Quick start's two commands are `.ci/run`'s, word for word, and CI checks their exit codes.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lanes import deep_lane_on
from tests.torch_extra import HAS_TORCH, WITHOUT_TORCH, needs_torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: the pages a user reads: the README, then docs/ in name order.
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
BLOCK = re.compile(r"```text\n\$ kvcanary (?P<args>[^\n]*)\n(?P<output>.*?)```", re.S)
#: the last line of a quoted block that shows only the output's first lines.
MORE = "…"
#: `python -m kvcanary_cli ARGS`, as if SGLang were not installed.
_WITHOUT_SGLANG = (
    "import sys; import kvcanary_cli.planners.sglang_runtime as r; "
    "r.installed_version = lambda: None; from kvcanary_cli.cli import main; main(sys.argv[1:])"
)


def page(name: str) -> str:
    """The text of README.md or of a docs/ page (`docs/capture.md`)."""
    return (ROOT / name).read_text()


QUOTED = [
    (path.relative_to(ROOT).as_posix(), m["args"], m["output"])
    for path in PAGES
    for m in BLOCK.finditer(path.read_text())
]


def test_the_pages_quote_commands() -> None:
    quoted = {(where, args.split()[0]) for where, args, _ in QUOTED}
    assert ("README.md", "check") in quoted  # the Quick start shows what it prints
    assert {command for _, command in quoted} >= {"--help", "check", "violations", "diff"}


@pytest.mark.parametrize(
    ("where", "args", "quoted"), QUOTED, ids=[f"{w}: {a}" for w, a, _ in QUOTED]
)
@pytest.mark.slow
def test_quoted_output_is_the_real_output(where: str, args: str, quoted: str) -> None:
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_SGLANG, *shlex.split(args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr
    assert quotes(done.stdout, quoted), where


def quotes(stdout: str, quoted: str) -> bool:
    """Whether a block quotes `stdout`: every line (trailing spaces aside), or with `…` as its
    last line, the first lines of an output that goes on past them."""
    real = [line.rstrip() for line in stdout.rstrip("\n").split("\n")]
    said = quoted.rstrip("\n").split("\n")
    if said[-1] == MORE:
        said = said[:-1]
        return len(real) > len(said) and real[: len(said)] == said
    return real == said


@pytest.mark.parametrize(
    ("stdout", "quoted", "right"),
    [
        ("a\nb  \nc\n", "a\nb\nc\n", True),
        ("a\nb\nc\n", "a\nb\n", False),  # a line left out
        ("a\nb\nc\n", "a\nb\n…\n", True),  # the first lines, said as such
        ("a\nb\n", "a\nb\n…\n", False),  # nothing follows the `…`
        ("a\nx\nc\n", "a\nb\n…\n", False),
        ("… and 1 more\n", "… and 1 more\n", True),  # a `…` line of the output is output
    ],
)
def test_a_quote_is_the_whole_output_or_says_it_goes_on(
    stdout: str, quoted: str, right: bool
) -> None:
    assert quotes(stdout, quoted) == right


SECTION = re.compile(r"## By hand, next to the failing call\n(?P<body>.*?)\n## ", re.S)
PYTHON = re.compile(r"```python\n(?P<code>.*?)```", re.S)


def test_the_capture_recipes_work_as_written(tmp_path: Path) -> None:
    """Each Python recipe of docs/capture.md's "By hand" runs and gives a dump kvcanary
    diagnoses."""
    needs_torch()  # the recipes run in the server, on its torch tensors
    from kvcanary_cli.dump.loader import load_dump
    from tests.helpers import checked
    from tests.test_capture import _Allocator, _Runner, plan_kwargs

    section = SECTION.search(page("docs/capture.md"))
    assert section is not None
    recipes = PYTHON.findall(section["body"])
    assert len(recipes) >= 2
    for i, code in enumerate(recipes):
        target = tmp_path / f"step{i}.safetensors"
        kwargs = plan_kwargs()  # an SWA call whose LUT (65 entries) misses live slot 70
        allocator = _Allocator(size=127, page_size=1, free_pages=[80])
        namespace = {
            "plan_kwargs": kwargs,
            "allocator": allocator,
            "model_runner": _Runner(kwargs["req_to_token"], allocator),
        }
        exec(
            compile(code.replace("/tmp/step.safetensors", str(target)), "capture", "exec"),
            namespace,
        )
        report = checked(load_dump(target))
        assert report.diagnosis[0].code.value == "lut-too-short", (i, report.diagnosis)
        assert report.diagnosis[0].confidence.value == "certain"
        errors = {f.code.value for f in report.findings if f.severity.value == "error"}
        assert errors == {"lut-out-of-range", "lut-shorter-than-pool"}


def test_the_python_api_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    section = re.search(r"## An example\n(?P<body>.*?)\n## ", page("docs/python-api.md"), re.S)
    assert section is not None
    [code] = PYTHON.findall(section["body"])
    namespace: dict[str, object] = {}
    exec(compile(code, "python-api", "exec"), namespace)
    assert namespace["report"].dumps[0].diagnosis[0].code.value == "lut-too-short"  # type: ignore[attr-defined]


# --- Quick start: two commands, from the package index alone, and exactly what CI runs ---------

QUICK_START = re.compile(r"## Quick start\n\n```bash\n(?P<commands>.*?)```", re.S)
CI = ROOT / ".ci" / "run"
#: what would fetch from anywhere but the package index, or need a step before the commands.
_OTHER_SOURCES = ("--index-url", "--extra-index-url", " -i ", "--find-links", " -f ", "http")


def quick_start() -> list[str]:
    found = QUICK_START.search((ROOT / "README.md").read_text())
    assert found is not None, "README.md: no ```bash block right under ## Quick start"
    return found["commands"].rstrip("\n").split("\n")


def ci_lines() -> list[str]:
    """`.ci/run`'s lines, stripped, without comments and blank lines."""
    lines = (line.strip() for line in CI.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_the_quick_start_is_two_commands_from_the_package_index() -> None:
    first, second = quick_start()
    install, run = first.split(" && ")
    assert install == "pip install ." and run.startswith("kvcanary check examples/")
    assert (ROOT / run.split()[-1]).is_file()  # a bundled example
    assert second == "pip install -e '.[test]' && python -m pytest -q"  # the whole suite
    for command in (first, second):
        assert not [s for s in _OTHER_SOURCES if s in f" {command} "], command
    assert "torch" not in first + second  # torch is an extra, explained below the commands


def test_ci_runs_the_quick_start_commands_as_written() -> None:
    """`.ci/run` runs the two lines word for word, in order, and checks how each ended: the
    first must exit 1 on its dump's findings (a crash exits 2 or 3), the second 0."""
    first, second = quick_start()
    lines = ci_lines()
    assert lines.count(f"out=$({first})") == 1 and lines.count(second) == 1, lines
    one, two = lines.index(f"out=$({first})"), lines.index(second)
    assert one < two
    for at, expected in ((one, 1), (two, 0)):
        assert lines[at - 1] == "set +e" and lines[at + 1 : at + 3] == ["code=$?", "set -e"]
        check = lines[at + 3 : at + 6]
        assert any(f'"$code" -ne {expected}' in line for line in check), check
    assert "torch" not in " ".join(lines[:one])  # the first command meets no torch CI added
    assert not [line for line in lines if "pytest" in line and line != second]
    assert "--index-url" not in CI.read_text() and "--extra-index-url" not in CI.read_text()


@pytest.mark.parametrize(
    ("code", "stdout", "green"),
    [
        (1, "  1. lut-too-short (certain): the SWA LUT is shorter", True),
        (0, "CLEAN", False),  # the example's findings are gone
        (1, "", False),  # exit 1 without the report (a failed install exits 1 too)
        (2, "", False),  # bad input
        (3, "", False),  # internal error: a traceback's exit
    ],
)
def test_ci_turns_red_unless_the_first_command_exits_1_with_its_findings(
    tmp_path: Path, code: int, stdout: str, green: bool
) -> None:
    """`.ci/run`'s own check of the first command, run with stand-ins for pip and kvcanary."""
    text = CI.read_text().splitlines()
    start = next(i for i, line in enumerate(text) if line.startswith("out=$(")) - 1
    end = next(i for i in range(start, len(text)) if text[i] == "fi") + 1
    for name, body in (("pip", "exit 0"), ("kvcanary", f"printf '%s\\n' '{stdout}'; exit {code}")):
        (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / name).chmod(0o755)
    done = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + "\n".join(text[start:end]) + "\necho passed"],
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode == 0 and done.stdout.endswith("passed\n")) == green, done


SOAK_WHEELS = {
    "sglang": "cp311-cp311-manylinux_2_34_x86_64",
    "vllm": "cp38-abi3-manylinux_2_28_x86_64",
}


def readme_soak_routes() -> list[list[list[str]]]:
    """The README's ```bash blocks that run `kvcanary soak`, each as its commands' words
    (comments cut)."""
    blocks = re.findall(r"```bash\n(.*?)```", page("README.md"), re.S)
    routes = [[shlex.split(line, comments=True) for line in b.splitlines()] for b in blocks]
    return [r for r in routes if any(words[:2] == ["kvcanary", "soak"] for words in r)]


def test_each_soak_route_in_the_readme_installs_and_fetches_what_it_runs() -> None:
    """Run top to bottom on a fresh machine, each route installs its engine's extra and torch,
    then fetches from the package index, with no extra source, the release wheel its soak
    names, into the folder the soak looks in (the wheel's own name matches the pattern)."""
    from fnmatch import fnmatch

    from kvcanary_cli.soak import stack, vllm_stack

    supported = {"sglang": stack.SUPPORTED, "vllm": vllm_stack.SUPPORTED}
    engines = set()
    for route in readme_soak_routes():
        for at, words in enumerate(route):
            if words[:2] != ["kvcanary", "soak"]:
                continue
            engine = "vllm" if "--engine" in words else "sglang"
            engines.add(engine)
            before = route[:at]
            installs = [w for w in before if w[:2] == ["pip", "install"]]
            assert any(f".[{engine}-cpu]" in w and "torch" in w for w in installs), route
            tree = words[words.index(f"--{engine}-tree") + 1]
            folder, _, pattern = tree.rpartition("/")
            download = ["pip", "download", f"{engine}=={supported[engine]}", "--no-deps"]
            assert download + ["-d", folder] in before, route
            assert fnmatch(f"{engine}-{supported[engine]}-{SOAK_WHEELS[engine]}.whl", pattern)
            said = " ".join(" ".join(w) for w in before)
            assert not [s for s in _OTHER_SOURCES if s in f" {said} "], route
    assert engines == {"sglang", "vllm"}


def quick_start_section() -> str:
    """The README's Quick start, up to the next section."""
    return page("README.md").split("## Quick start\n")[1].split("\n## ")[0]


def test_the_quick_start_explains_torch_below_the_commands() -> None:
    below = " ".join(quick_start_section().split("```", 2)[2].split())
    assert "pip install 'kvcanary[torch]'" in below  # how to add it
    assert "--index-url https://download.pytorch.org/whl/cpu" in below  # the CPU build
    assert "CUDA build" in below and "5.5 GB" in below  # why not a bare `pip install torch`
    assert "On a GPU machine" in below and "bring your own CUDA build of torch" in below


def test_the_readme_is_read_in_a_minute() -> None:
    """What kvcanary is, the Quick start and what its first command prints come first, in at
    most 60 lines; the rest is pages of docs/, each of which the README and docs/README.md
    point to."""
    readme = page("README.md")
    top = readme.split("\n## ", 2)  # the title and intro, the Quick start, the rest
    assert top[1].startswith("Quick start\n")
    assert len("\n## ".join(top[:2]).splitlines()) <= 60
    first = quick_start()[0].split(" && ")[1]
    [(where, args, _), *_] = QUOTED
    assert (where, f"kvcanary {args}") == ("README.md", first)  # what the first command prints
    pages = {path.name for path in DOCS.glob("*.md")} - {"README.md"}
    assert pages <= set(re.findall(r"\]\(docs/([\w-]+\.md)\)", readme))
    assert pages <= set(re.findall(r"\]\(([\w-]+\.md)\)", page("docs/README.md")))


def test_the_quoted_torch_error_is_the_real_one() -> None:
    """docs/commands.md's line for `--kernel sglang` without torch is what that run prints."""
    section = page("docs/commands.md").split("## What needs torch\n")[1].split("\n## ")[0]
    [quoted] = re.findall(r"```text\n(error: [^\n]*)\n```", section)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            WITHOUT_TORCH + _WITHOUT_SGLANG,
            "check",
            "--kernel",
            "sglang",
            "examples/truncated-lut.safetensors",
        ],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "100", "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout, done.stderr) == (2, "", quoted + "\n")


FIGURES = re.compile(
    r"the suite, (?P<whole>[\d,]+) tests.*?the\s+fast\s+lane,\s+`-m \"not slow\"`,\s+"
    r"(?P<fast>[\d,]+) tests",
    re.S,
)


def test_the_suite_figures_in_the_readme_are_this_suite(request: pytest.FixtureRequest) -> None:
    """The Quick start's test counts (whole suite, fast lane) are within 10 % of what this run
    collected: figures a reader plans by, not a past release's. Checked only on a whole
    collection with torch (a chosen file, `-k` or `-m` collects a part)."""
    config = request.config
    if not HAS_TORCH or config.option.markexpr or config.option.keyword or deep_lane_on(""):
        pytest.skip("counts only on a whole collection with torch, without the deep lane")
    if [Path(arg).resolve() for arg in config.args] not in ([ROOT / "tests"], [ROOT]):
        pytest.skip("counts only on a whole collection (no test file or folder chosen)")
    found = FIGURES.search(quick_start_section())
    assert found, "the README's Quick start gives the suite's test counts"
    items = request.session.items
    whole = len(items)
    fast = sum(1 for item in items if item.get_closest_marker("slow") is None)
    for name, real in (("whole", whole), ("fast", fast)):
        said = int(found[name].replace(",", ""))
        assert abs(said - real) <= 0.1 * real, f"README says {said} {name}-suite tests; {real} ran"


# --- links: every link of the README and docs/ leads to a file and heading of this repository ---

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (?P<title>.+?)\s*$", re.M)


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation but `-` and `_`
    dropped, spaces made `-`; a repeated one gets `-1`, `-2`, ... (headings in code skipped)."""
    seen: dict[str, int] = {}
    for found in HEADING.finditer(FENCE.sub("", text)):
        slug = re.sub(r"[^\w\- ]", "", found["title"].lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def test_anchors_are_githubs() -> None:
    text = "# A `b` (c 1.2)\n## SGLang trees (`soak --sglang-tree`)\n```\n# not one\n```\n## a b\n"
    assert anchors(text + "## A b\n") == {
        "a-b-c-12",
        "sglang-trees-soak---sglang-tree",
        "a-b",
        "a-b-1",
    }


LINKED = [
    path.relative_to(ROOT).as_posix()
    for path in [*PAGES, ROOT / "examples" / "README.md"]
    if path.is_file()
]


@pytest.mark.parametrize("where", LINKED)
def test_every_link_leads_into_the_repository(where: str) -> None:
    """A relative link names a file of the repository (a folder's README for a folder) and,
    with `#`, a heading of it; the only web link a page may hold is none (an install URL is
    code, not a link)."""
    source = ROOT / where
    broken = []
    for found in LINK.finditer(FENCE.sub("", source.read_text())):
        target = found["target"]
        path, _, anchor = target.partition("#")
        if "://" in target or target.startswith(("/", "~", "mailto:")):
            broken.append(f"{target}: outside the repository")
            continue
        file = (source.parent / path).resolve() if path else source
        if not file.is_relative_to(ROOT) or not file.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and (file.is_dir() or anchor not in anchors(file.read_text())):
            broken.append(f"{target}: no heading #{anchor}")
    assert broken == [], where
