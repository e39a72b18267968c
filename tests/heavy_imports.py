"""The heavy modules (torch, triton, numpy, sglang, pydantic) command lines import, read by the
tests that keep `--help`, `inspect`, `check`, `provenance` and `timeline` light
(tests/test_layering.py): every run in one fresh interpreter, once per test process."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

__all__ = ["RUNS", "Imports", "has_gpu_driver", "imports_by_run"]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
_EXAMPLE = str(EXAMPLES / "truncated-lut.safetensors")
_STEPS = [str(p) for p in sorted((EXAMPLES / "timeline-use-after-free").glob("*.safetensors"))]


def has_gpu_driver() -> bool:
    """A GPU driver's device node is here: compiled kernels, which need torch's memory."""
    return any(Path(node).exists() for node in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd"))


#: The runs, lightest first: a run's heavy modules are those of every run before it too, so a
#: run imports at most what it is allowed to only if every run before it did (the check and
#: provenance runs only without a GPU driver).
RUNS: dict[str, list[str]] = {
    "help": ["--help"],
    "timeline-help": ["timeline", "--help"],
    **{f"inspect-{f}": ["inspect", _EXAMPLE, "--format", f] for f in ("table", "json", "markdown")},
    **(
        {}
        if has_gpu_driver()
        else {
            "check": ["check", _EXAMPLE],
            "check-vectorized-json": ["check", _EXAMPLE, "-k", "vectorized", "--format", "json"],
            "provenance-slot": ["provenance", _EXAMPLE, "--slot", "107"],
            "provenance-row": ["provenance", _EXAMPLE, "--row", "3"],
        }
    ),
    "timeline": ["timeline", *_STEPS],
}

#: A run's heavy modules imported once it ended, those it imported itself, its exit code.
Imports = tuple[list[str], list[str], int]


@functools.cache
def imports_by_run() -> dict[str, Imports]:
    """Every run of `RUNS`, in order, as `kvcanary ARGV` in one fresh interpreter (one
    interpreter's start instead of one a run), by name."""
    script = (
        "import sys\nfrom kvcanary_cli.cli import main\n"
        "heavy = ('torch', 'triton', 'numpy', 'sglang', 'pydantic')\nruns = {}\n"
        f"for name, argv in {RUNS!r}.items():\n"
        "    before = [m for m in heavy if m in sys.modules]\n"
        "    code = 0\n"
        "    try:\n        main(argv)\n    except SystemExit as exc:\n        code = exc.code\n"
        "    after = [m for m in heavy if m in sys.modules]\n"
        "    runs[name] = (after, [m for m in after if m not in before], int(code or 0))\n"
        "print(repr(runs))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    runs: dict[str, Imports] = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert list(runs) == list(RUNS)
    return runs
