"""torch is an extra (`kvcanary[torch]`): every command runs without it on its default kernels,
and those that need it (SGLang's planners, compiled kernels) say so in one line, exit 2.

Each check runs in a fresh interpreter where torch cannot be imported (`WITHOUT_TORCH`), so
it holds whether or not this machine has torch.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kvcanary_cli.errors import PlannerUnavailableError
from kvcanary_cli.planners import triton_runtime
from tests.torch_extra import PACKAGE, WITHOUT_TORCH, is_missing_torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TRUNCATED = str(EXAMPLES / "truncated-lut.safetensors")
STEPS = [str(p) for p in sorted((EXAMPLES / "timeline-use-after-free").glob("*.safetensors"))]
EXTRA = "pip install 'kvcanary[torch]'"

#: (arguments, the exit code they must give): the default kernels, and the SGLang planners.
RUNS: list[tuple[list[str], int]] = [
    (["check", TRUNCATED], 1),
    (["check", TRUNCATED, "--kernel", "vectorized", "--format", "json"], 1),
    (["provenance", TRUNCATED, "--slot", "107"], 0),
    (["provenance", TRUNCATED, "--row", "3"], 0),
    (["inspect", TRUNCATED], 0),
    (["shrink", TRUNCATED, "--out", "{tmp}/small.safetensors"], 0),
    (["timeline", *STEPS], 1),
    (["diff", STEPS[1], STEPS[2]], 1),
    (["violations", str(EXAMPLES / "canary-aliasing.log"), "--replay", "--dump",
      str(EXAMPLES / "canary-aliasing.safetensors")], 1),
    (["synth", "truncated-lut", "--out", "{tmp}/t.safetensors"], 0),
    (["plan", TRUNCATED, "--group", "swa"], 1),
    (["plan", TRUNCATED, "--backend", "triton"], 0),
    (["selftest", "--size", "tiny"], 0),
    (["check", TRUNCATED, "--kernel", "sglang"], 2),
    (["plan", TRUNCATED, "--backend", "sglang"], 2),
    (["selftest", "--sglang"], 2),
]  # fmt: skip

_SCRIPT = (
    WITHOUT_TORCH
    + """
import sys
from typer.testing import CliRunner
from kvcanary_cli.cli import app

runs = []
for args in eval(sys.argv[1]):
    result = CliRunner().invoke(app, args)
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    runs.append((int(result.exit_code), repr(result.exception) if crashed else None, result.stderr))
print(repr((runs, "torch" in sys.modules)))
"""
)


@pytest.mark.slow  # one process through every command (5 s); the layering tests keep torch out
def test_every_command_runs_without_torch_and_the_sglang_ones_name_the_extra(
    tmp_path: Path,
) -> None:
    argvs = [[a.format(tmp=tmp_path) for a in args] for args, _ in RUNS]
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, repr(argvs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "100", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    runs, imported_torch = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert not imported_torch
    for (args, expected), (code, crash, err) in zip(RUNS, runs, strict=True):
        assert (code, crash) == (expected, None), (args, err)
        if expected == 2:  # one line, naming the option, what is missing and the extra
            assert len(err.strip().splitlines()) == 1, err
            assert "run on torch, which cannot be imported here" in err and EXTRA in err, err
        else:
            assert "torch" not in err, (args, err)


def test_compiled_kernels_without_torch_name_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU driver but no torch, and TRITON_INTERPRET=0: compiling needs torch's memory."""
    node = tmp_path / "nvidiactl"
    node.touch()
    monkeypatch.setattr(triton_runtime, "_GPU_NODES", (str(node),))
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    # triton itself is not imported: this process's later tests expect it interpreted
    monkeypatch.setattr(importlib, "import_module", ModuleType)
    triton_runtime.cuda_available.cache_clear()
    try:
        with pytest.raises(PlannerUnavailableError, match="torch cannot be imported") as raised:
            triton_runtime.load_triton()
        assert raised.value.hint is not None and EXTRA in raised.value.hint
        monkeypatch.setattr(triton_runtime, "_GPU_NODES", ())  # no GPU: the old message
        triton_runtime.cuda_available.cache_clear()
        with pytest.raises(PlannerUnavailableError, match="no CUDA device is available"):
            triton_runtime.load_triton()
    finally:
        triton_runtime.cuda_available.cache_clear()


def _raised_from(filename: Path, name: str = "torch") -> ModuleNotFoundError:
    try:
        exec(compile(f"raise ModuleNotFoundError('no', name={name!r})", str(filename), "exec"))
    except ModuleNotFoundError as exc:
        return exc
    raise AssertionError("not raised")


def test_only_a_test_asking_for_missing_torch_is_skipped() -> None:
    """A test module importing torch where it is absent is skipped; kvcanary's own module
    importing torch when imported is a bug, and stays a collection error (as does any
    other missing module, or torch missing where it is installed)."""
    in_tests = _raised_from(ROOT / "tests" / "test_x.py")
    assert is_missing_torch(in_tests, torch_installed=False)
    assert not is_missing_torch(in_tests, torch_installed=True)
    assert is_missing_torch(
        _raised_from(ROOT / "tests" / "x.py", "torch.cuda"), torch_installed=False
    )
    assert not is_missing_torch(
        _raised_from(ROOT / "tests" / "x.py", "torchvision"), torch_installed=False
    )
    assert not is_missing_torch(_raised_from(PACKAGE / "dump" / "x.py"), torch_installed=False)
    assert not is_missing_torch(ImportError("torch"), torch_installed=False)


@pytest.mark.slow
def test_no_extra_but_torch_pulls_torch(tmp_path: Path) -> None:
    """A package of the test extras that depends on torch (compressed-tensors does) would make
    the README's test line install a CUDA build of several GB on a machine without torch: every
    extra but `torch` is resolved as for a fresh environment, and neither torch nor triton's
    CUDA companions may be among what it would install. Skipped where the index is out of
    reach."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]

    def requirements(extra: str) -> list[str]:  # an extra naming kvcanary's own: theirs too
        listed = []
        for req in extras[extra]:
            if own := re.fullmatch(r"kvcanary\[(.*)\]", req.replace(" ", "")):
                listed += [r for name in own[1].split(",") for r in requirements(name)]
            else:
                listed.append(req)
        return listed

    # what kvcanary[every extra but torch] needs; kvcanary's own requirements read here, not
    # built (a resolver would build the project in an isolated environment for them)
    wanted = [
        *project["dependencies"],
        *(r for e in extras if e != "torch" for r in requirements(e)),
    ]
    names = _resolved(wanted, tmp_path)
    assert {"typer", "transformers", "pytest"} <= names  # the resolution lists every package
    pulled = sorted(n for n in names if n == "torch" or n.startswith("nvidia-"))
    assert not pulled, f"extras {sorted(e for e in extras if e != 'torch')} would install {pulled}"


def _resolved(wanted: list[str], folder: Path) -> set[str]:
    """The packages (normalised names) a fresh environment would install for `wanted`: uv's
    resolver (a test extra; about a second), else pip's (`--dry-run --report`; half a
    minute of CPU, most of it matching every file of every release against this platform)."""
    listed = folder / "requirements.in"
    listed.write_text("\n".join(wanted) + "\n")
    by_uv = _uv_resolved(listed, folder / "requirements.txt")
    if by_uv is not None:
        return by_uv
    report = folder / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        + ["--report", str(report), "-r", str(listed)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        pytest.skip(f"pip could not resolve the extras here: {done.stderr.strip()[-300:]}")
    install = json.loads(report.read_text())["install"]
    return {_normalised(item["metadata"]["name"]) for item in install}


def _uv_resolved(listed: Path, pinned: Path) -> set[str] | None:
    """uv's resolution of the requirements `listed`, pinned into `pinned`; None where uv is
    not installed, fails or its index does not answer in 2 minutes (uv reads its own index
    settings: pip's may reach one it cannot)."""
    uv = _uv()
    if uv is None:
        return None
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    command = [uv, "pip", "compile", "--quiet", "--no-header", "--python-version", version]
    try:
        done = subprocess.run(
            [*command, str(listed), "-o", str(pinned)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        return None
    return {
        _normalised(line.partition("==")[0])
        for line in pinned.read_text().splitlines()
        if "==" in line and not line.lstrip().startswith("#")
    }


def _normalised(name: str) -> str:
    """A package name as the index compares them (`Foo_Bar.baz` is `foo-bar-baz`)."""
    return re.sub(r"[-_.]+", "-", name.strip().lower())


def _uv() -> str | None:
    """uv's binary where the test extra installed it (None: not installed)."""
    try:
        from uv import find_uv_bin
    except ImportError:
        return None
    try:
        return os.fspath(find_uv_bin())
    except FileNotFoundError:
        return None
