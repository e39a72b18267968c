"""bench/mutants.py's mutants still fit SGLang 0.5.23 (the hybrid SWA, unified-memory and Mamba
layouts' code) and vLLM 0.33.0: every snippet is found exactly once in its release wheel's
file and the edited module compiles; a snippet that is not there (or is there twice) fails
loudly; planting never writes through to the release it copies. Nothing is soaked here: the
soak of each mutant is the benchmark's."""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests import vllm_wheel
from tests.sglang_wheel import MISSING_WHEEL, wheel_path

ROOT = Path(__file__).resolve().parents[1]
WHEEL = wheel_path()
VLLM_WHEEL = vllm_wheel.wheel_path()


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_mutants", ROOT / "bench" / "mutants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


mutants = _bench()


@pytest.mark.parametrize(
    ("engine", "layout", "least", "controls"),
    [
        ("sglang", "swa", 12, 3),
        ("sglang", "unified", 4, 1),
        ("sglang", "mamba", 4, 1),
        ("vllm", "swa", 12, 3),
    ],
)
def test_the_set_is_what_the_benchmark_promises(
    engine: str, layout: str, least: int, controls: int
) -> None:
    names = [m.name for m in mutants.MUTANTS]
    assert len(set(names)) == len(names)
    chosen = [m for m in mutants.MUTANTS if (m.engine, m.layout) == (engine, layout)]
    assert sum(not m.control for m in chosen) >= least
    assert sum(m.control for m in chosen) >= controls
    assert all(m.old != m.new and m.what for m in chosen)
    # each layout's group is soaked under that layout, with a release of its own
    assert (engine, "-" if engine == "vllm" else layout) in mutants.GROUPS


@pytest.mark.parametrize(
    ("engine", "found", "missing"),
    [
        pytest.param("sglang", WHEEL, MISSING_WHEEL, id="sglang"),
        pytest.param("vllm", VLLM_WHEEL, vllm_wheel.MISSING_WHEEL, id="vllm"),
    ],
)
def test_every_mutant_applies_to_the_release_wheel(
    engine: str, found: Path | None, missing: str
) -> None:
    if found is None:
        pytest.skip(missing)
    texts: dict[str, str] = {}
    with zipfile.ZipFile(found) as wheel:
        for mutant in mutants.MUTANTS:
            if mutant.engine != engine:
                continue
            if mutant.relpath not in texts:
                texts[mutant.relpath] = wheel.read(mutant.relpath).decode()
            text = texts[mutant.relpath]
            edited = mutants.mutated(text, mutant)
            assert edited != text and mutant.new in edited
            compile(edited, mutant.relpath, "exec")  # a mutant is a module that still imports


def test_a_snippet_not_found_once_fails_loudly() -> None:
    gone = mutants.Mutant("gone", "x.py", "free(a)", "free(b)", "nothing")
    with pytest.raises(mutants.SnippetError, match="gone: .* found 0 times in sglang/srt/x.py"):
        mutants.mutated("alloc(a)\n", gone)
    with pytest.raises(mutants.SnippetError, match="found 2 times"):
        mutants.mutated("free(a)\nfree(a)\n", gone)


def test_planting_leaves_the_release_as_it_was(tmp_path: Path) -> None:
    release = tmp_path / "release"
    module = release / "sglang" / "srt" / "mem_cache" / "pool.py"
    module.parent.mkdir(parents=True)
    module.write_text("def free(a):\n    give_back(a)\n")
    other = module.parent / "other.py"
    other.write_text("x = 1\n")
    leak = mutants.Mutant("leak", "mem_cache/pool.py", "    give_back(a)\n", "    pass\n", "leak")
    copy = mutants.plant(release, leak, tmp_path / "copy")
    assert (copy / "sglang/srt/mem_cache/pool.py").read_text() == "def free(a):\n    pass\n"
    assert module.read_text() == "def free(a):\n    give_back(a)\n"
    assert (copy / "sglang/srt/mem_cache/other.py").read_text() == "x = 1\n"


def test_a_vllm_mutant_is_planted_under_vllm_v1_core(tmp_path: Path) -> None:
    release = tmp_path / "release"
    module = release / "vllm" / "v1" / "core" / "block_pool.py"
    module.parent.mkdir(parents=True)
    module.write_text("def free(b):\n    queue(b)\n")
    leak = mutants.Mutant(
        "leak", "block_pool.py", "    queue(b)\n", "    pass\n", "leak", engine="vllm"
    )
    copy = mutants.plant(release, leak, tmp_path / "copy")
    assert (copy / "vllm/v1/core/block_pool.py").read_text() == "def free(b):\n    pass\n"
    assert module.read_text() == "def free(b):\n    queue(b)\n"


#: vLLM 0.34.0 rewrote `get_new_blocks`' loop: the one mutant whose 0.33.0 snippet it lacks.
LEFT_OUT_ON_0_34 = {"pool-reuse-keeps-hash"}


def test_on_another_vllm_release_the_mutants_it_lacks_are_left_out_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vllm = [m for m in mutants.MUTANTS if m.engine == "vllm"]
    wheel = vllm_wheel.wheel_path("0.34.0")
    if wheel is None:
        pytest.skip(vllm_wheel.missing_wheel("0.34.0"))
    with zipfile.ZipFile(wheel) as archive:
        for path in {m.relpath for m in vllm}:
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_bytes(archive.read(path))
    kept, left_out = mutants._fitting(tmp_path, "0.34.0", vllm)
    assert {m.name for m in vllm} - {m.name for m in kept} == LEFT_OUT_ON_0_34
    [line] = left_out
    assert line.startswith("mutant pool-reuse-keeps-hash: its snippet is found 0 times")
    said = capsys.readouterr().err
    assert "snippets are written for vLLM 0.33.0; this tree is vLLM 0.34.0" in said
    assert f"{len(kept)} of {len(vllm)} apply" in said and "pool-reuse-keeps-hash" in said
    # on the snippets' own release nothing is left out quietly: planting fails loudly
    assert mutants._fitting(tmp_path, "0.33.0", vllm) == (vllm, [])


class _Drawn(Exception):
    """Stops `sglang_alone` once its first history's workload is drawn."""


@pytest.mark.parametrize("layout", ["swa", "unified", "mamba"])
def test_sglang_alone_runs_the_soak_workload_of_its_layout(
    layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's checks alone run the histories soak runs on that layout (the Mamba layout's
    requests that may stop early, unified memory's lazy compaction), not the SWA layout's."""
    from types import SimpleNamespace

    from kvcanary_cli.soak import command

    real = command.history_workload
    drawn: list[object] = []

    def recording(*args: Any, **kwargs: Any) -> object:
        drawn.append(real(*args, **kwargs))
        raise _Drawn

    monkeypatch.setattr(command, "history_workload", recording)
    with pytest.raises(_Drawn):
        mutants.sglang_alone(SimpleNamespace(cores=("python",)), 10, 0, layout)
    shapes = len(command._specs(None, ("python",), None, layout))
    assert drawn == [real(0, 0, shapes, 1, layout)]
