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
