"""mypy sees a renamed record key: the views read the typed results whose fields and properties
are the keys, so renaming a key in one declaration fails type checking in the views that read
it.

The package is copied to a temporary folder and type-checked there (strict, the repo's mypy
configuration, render/ checked and the rest followed silently, one cache for both runs): as
it is, mypy passes; with the finding's `count` renamed, it fails and names the view modules
that read `count`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DECLARATION = Path("kvcanary_cli") / "results" / "check.py"
#: the finding's key, as declared (the only `count` property in results/check.py).
KEY = "    def count(self) -> int:\n"
#: modules that read a finding's count: the phrases both views share (a finding's, and a
#: check's per code), the pieces the table views share (check's and provenance's findings),
#: and the Markdown views of a check and a provenance answer.
READERS = (
    "render/phrases/check.py",
    "render/table/common.py",
    "render/markdown/check.py",
    "render/markdown/provenance.py",
)


def _mypy(copy: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--follow-imports=silent",
            "--cache-dir",
            str(copy / ".mypy_cache"),
            "--no-error-summary",
            "--hide-error-context",
            "kvcanary_cli/render",
        ],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_mypy_names_the_views_that_read_a_renamed_key(tmp_path: Path) -> None:
    shutil.copytree(
        ROOT / "kvcanary_cli",
        tmp_path / "kvcanary_cli",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    clean = _mypy(tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr

    declaration = tmp_path / DECLARATION
    source = declaration.read_text()
    assert source.count(KEY) == 1 and "class Finding:" in source
    declaration.write_text(source.replace(KEY, "    def cell_count(self) -> int:\n"))
    renamed = _mypy(tmp_path)
    assert renamed.returncode == 1, renamed.stdout + renamed.stderr
    errors = renamed.stdout.splitlines()
    in_views = {
        reader
        for reader in READERS
        for line in errors
        if line.startswith(f"kvcanary_cli/{reader}:")
        and '"Finding" has no attribute "count"' in line
    }
    assert in_views == set(READERS), renamed.stdout
