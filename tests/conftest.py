"""Shared test set-up: the hypothesis profile, one torch thread, what a test process holds
frozen once it has collected, `--update-golden`, `tmp_dump`, SGLang as a test needs it: a
stand-in package (`sglang_standin`) or none (`no_sglang`), and torch as an extra: a test module
that cannot import it is skipped with the reason (`tests/torch_extra.py`)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from kvcanary_cli import api
from kvcanary_cli.planners import sglang_runtime
from tests.lanes import DEEP_ENV, deep_lane_on, engine_stack, engines_first
from tests.sglang_standin import forget_sglang, write_standin
from tests.torch_extra import HAS_TORCH, NEEDS_TORCH, is_missing_torch, needs_torch

# Examples are drawn from a seeded-per-run random source as usual; only timing-based health
# checks are off, because a loaded 2-core CI machine must not turn slow generation into a failure.
settings.register_profile(
    "kvcanary",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("kvcanary")


def pytest_configure(config: pytest.Config) -> None:
    """As the CLI does (OMP_NUM_THREADS=1 in kvcanary_cli.cli.main): one intra-op thread; on
    CPU-quota'd CI machines more threads spin against each other and slow every small tensor op.
    And the CLI's click command built once (`_build_the_cli_once`). Only where tests run:
    xdist's controller runs none, and importing torch there (~2 s of CPU) would hold back the
    start of every worker."""
    controller = bool(getattr(config.option, "numprocesses", None)) and not hasattr(
        config, "workerinput"
    )
    if not hasattr(config, "workerinput"):  # the controller, or a run without workers
        _compile_once()
        if controller:
            _rewrite_once(config)
    if controller:
        return
    if HAS_TORCH:
        import torch

        torch.set_num_threads(1)
    _build_the_cli_once()


def _compile_once() -> None:
    """Byte-compile the package and the tests' helper modules before any test runs: the suite
    starts over a hundred processes that import kvcanary (the CLI, the fuzz workers, the bench
    harness), and where PYTHONDONTWRITEBYTECODE is set each compiled every module it imports
    from source (0.5 s of CPU a process; a minute a run). What the interpreter would write on
    its own elsewhere, written once (timestamped: an edit invalidates it). The test modules
    are pytest's to rewrite and cache; a tree that cannot be written is left as it is."""
    import compileall
    import re

    root = Path(__file__).resolve().parents[1]
    test_module = re.compile(r"[/\\]test_[^/\\]*\.py$")
    for folder in (root / "kvcanary_cli", root / "tests"):
        try:
            compileall.compile_dir(folder, quiet=2, rx=test_module, workers=0)
        except OSError:
            pass


def _rewrite_once(config: pytest.Config) -> None:
    """Write pytest's rewritten test modules before the workers start, two processes at a
    time: where PYTHONDONTWRITEBYTECODE is set, every worker rewrote every test module's
    asserts itself (10 s of CPU each, half of its collection), and without it, on a clean
    clone, the workers rewrite them side by side. A worker reads a rewritten module pytest
    cached (stamped with the source's time and size and pytest's version); where pytest's
    internals differ, or a folder cannot be written, it rewrites as before."""
    import os

    try:
        from _pytest.assertion.rewrite import (
            PYC_TAIL,
            _read_pyc,
            _rewrite_test,
            _write_pyc,
            assertstate_key,
            get_cache_dir,
        )

        state = config.stash[assertstate_key]
    except (ImportError, KeyError):
        return
    if config.getoption("assertmode") != "rewrite":
        return
    tests = Path(__file__).resolve().parent
    asked = [
        Path(config.invocation_params.dir, arg.split("::")[0]).resolve() for arg in config.args
    ]
    modules = sorted(
        {
            module
            for path in asked
            if path == tests or tests in path.parents
            for module in (
                path.rglob("test_*.py") if path.is_dir() else [path] if path.is_file() else []
            )
        }
        | set(tests.rglob("conftest.py"))
    )

    def rewrite(paths: list[Path]) -> None:
        for path in paths:
            cache = get_cache_dir(path)
            pyc = cache / (path.name[:-3] + PYC_TAIL)
            if _read_pyc(path, pyc) is None:
                source_stat, code = _rewrite_test(path, config)
                cache.mkdir(exist_ok=True)
                _write_pyc(state, code, source_stat, pyc)

    if not hasattr(os, "fork"):
        return  # (no second process to share the work with: the workers rewrite, as before)
    child = os.fork()
    if child == 0:  # the other half; nothing of this process returns to pytest
        try:
            rewrite(modules[1::2])
        finally:
            os._exit(0)
    try:
        rewrite(modules[::2])
    except Exception:  # noqa: BLE001  (best effort: a worker meets it again, and says so)
        pass
    finally:
        os.waitpid(child, 0)


def _build_the_cli_once() -> None:
    """typer builds the click command again, from every command's signature, on each
    `CliRunner.invoke` (6 ms; over a thousand invokes a run). The app does not change during a
    run: it is built once per test process, as `kvcanary` builds it once per run (and the fuzz
    runner once per worker: tests/fuzz/runner.py). `main` still builds its own each call."""
    import typer.main
    import typer.testing

    setattr(typer.testing, "_get_command", functools.cache(typer.main.get_command))  # noqa: B010


class _TorchOptionalModule(pytest.Module):
    """A test module that is skipped, with the reason, when its imports fail for want of torch
    (any other import error stays a collection error)."""

    def collect(self) -> Any:
        try:
            return super().collect()
        except self.CollectError as exc:
            if is_missing_torch(exc.__cause__):
                where = self.path.relative_to(self.config.rootpath)
                pytest.skip(f"{where} imports torch: {NEEDS_TORCH}", allow_module_level=True)
            raise


def pytest_pycollect_makemodule(
    module_path: Path, parent: pytest.Collector
) -> pytest.Module | None:
    if HAS_TORCH:
        return None  # pytest's own
    return _TorchOptionalModule.from_parent(parent, path=module_path)


@pytest.hookimpl(tryfirst=True)  # before `-m` selects: it reads the `slow` marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The lanes (`tests/lanes.py`): the tests of an engine's own stack marked `slow`, the
    deep lane's tests deselected unless the run asks for them, and the modules that load an
    engine in the test process first (`engines_first`)."""
    for item in items:
        if engine_stack(item.path):
            item.add_marker(pytest.mark.slow)
    if not deep_lane_on(config.option.markexpr):
        deep = [item for item in items if item.get_closest_marker("deep") is not None]
        if deep:
            config.hook.pytest_deselected(items=deep)
            items[:] = [item for item in items if item.get_closest_marker("deep") is None]
    engines_first(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What a test process holds once it has collected (torch, the test modules, thousands of
    items) lives until it ends: frozen, it is out of the collector's reach, so a full
    collection during the run scans only what the tests made, and a process a test forks does
    not scan it again (the fast lane's collections: 6.2 s of CPU where they took 8.2). Its
    end is `_end_quickly`'s."""
    import atexit
    import gc

    gc.freeze()
    atexit.register(_end_quickly)


def _end_quickly() -> None:
    """A test process's end, once pytest has said everything: all it made is frozen too, so
    the interpreter's last collection does not scan it all again only to free what the exit
    frees (a worker that had run SGLang's and vLLM's stacks spent 7 s there, the run waiting
    on it: the suite's end took 13 s after its last test, now 4), and its standard error goes
    nowhere: what stays frozen is never finalized, which triton's bindings (nanobind) would
    report, falsely, as leaked objects."""
    import gc
    import os

    sys.stderr.flush()
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 2)
    os.close(quiet)
    gc.freeze()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The lane the run left out, said after its summary (under xdist pytest's own count of
    deselected tests stays in the workers)."""
    if not deep_lane_on(terminalreporter.config.option.markexpr):
        terminalreporter.write_line(
            f"the deep lane was not run: python -m pytest -m deep runs it, {DEEP_ENV}=1 adds it "
            "to any run (tests/lanes.py)"
        )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite tests/golden/* from the current output instead of comparing",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture
def tmp_dump(tmp_path: Path) -> Path:
    return tmp_path / "dump.safetensors"


#: the `sglang_standin` fixture: install a stand-in SGLang (`write_standin`'s options).
InstallStandin = Callable[..., Path]


@pytest.fixture
def sglang_standin(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[InstallStandin]:
    """Put a stand-in SGLang first on sys.path for this test; every `sglang` module goes after."""

    needs_torch()  # the stand-in's plan modules run on torch, as SGLang's do

    def install(**options: Any) -> Path:
        forget_sglang()
        root = write_standin(tmp_path_factory.mktemp("sglang"), **options)
        monkeypatch.syspath_prepend(str(root))
        return root

    yield install
    forget_sglang()


@pytest.fixture
def no_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang cannot be imported and is not installed, whatever this machine has."""
    forget_sglang()
    monkeypatch.setitem(sys.modules, "sglang", None)
    # `api` holds its own reference to the function: patch it through the module object
    # imported at the top, so it is never first imported while the runtime is patched.
    monkeypatch.setattr(api, "installed_version", lambda: None)
    monkeypatch.setattr(sglang_runtime, "installed_version", lambda: None)
