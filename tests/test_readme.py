"""The README's quoted command output is the real output (as pip-audit's `check-readme`).

Every ```text block of the README that starts with `$ kvcanary ...` is re-run as a user would
(a fresh process, 100 columns, no colour) and must print exactly the lines quoted (trailing
spaces aside), as on a machine without SGLang installed (reports name the installed SGLang).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```text\n\$ kvcanary (?P<args>[^\n]*)\n(?P<output>.*?)```", re.S)
#: `python -m kvcanary_cli ARGS`, as if SGLang were not installed.
_WITHOUT_SGLANG = (
    "import sys; import kvcanary_cli.planners.sglang_runtime as r; "
    "r.installed_version = lambda: None; from kvcanary_cli.cli import main; main(sys.argv[1:])"
)
QUOTED = [(m["args"], m["output"]) for m in BLOCK.finditer((ROOT / "README.md").read_text())]


def test_the_readme_quotes_commands() -> None:
    assert {args.split()[0] for args, _ in QUOTED} >= {"--help", "check"}


@pytest.mark.parametrize(("args", "quoted"), QUOTED, ids=[a for a, _ in QUOTED])
def test_quoted_output_is_the_real_output(args: str, quoted: str) -> None:
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
    real = [line.rstrip() for line in done.stdout.rstrip("\n").split("\n")]
    assert real == quoted.rstrip("\n").split("\n")


SECTION = re.compile(r"## Producing a dump from SGLang\n(?P<body>.*?)\n## ", re.S)
PYTHON = re.compile(r"```python\n(?P<code>.*?)```", re.S)


def test_the_readme_dump_recipes_work_as_written(tmp_path: Path) -> None:
    """Each Python recipe of "Producing a dump" runs and gives a dump kvcanary diagnoses."""
    from kvcanary_cli.dump.loader import load_dump
    from tests.helpers import checked
    from tests.test_capture import _Allocator, _Runner, plan_kwargs

    section = SECTION.search((ROOT / "README.md").read_text())
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
            compile(code.replace("/tmp/step.safetensors", str(target)), "README", "exec"), namespace
        )
        report = checked(load_dump(target))
        assert report.diagnosis[0].code.value == "lut-too-short", (i, report.diagnosis)
        assert report.diagnosis[0].confidence.value == "certain"
        errors = {f.code.value for f in report.findings if f.severity.value == "error"}
        assert errors == {"lut-out-of-range", "lut-shorter-than-pool"}


def test_the_readme_python_api_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    section = re.search(
        r"## Python API\n(?P<body>.*?)\n## ", (ROOT / "README.md").read_text(), re.S
    )
    assert section is not None
    [code] = PYTHON.findall(section["body"])
    namespace: dict[str, object] = {}
    exec(compile(code, "README", "exec"), namespace)
    assert namespace["report"].dumps[0].diagnosis[0].code.value == "lut-too-short"  # type: ignore[attr-defined]
