"""bench/mutants.py's mutants still fit SGLang 0.5.23 (the hybrid SWA, unified-memory, Mamba and
Mamba extra-buffer layouts' code) and vLLM 0.33.0: every snippet is found exactly once in its
release wheel's file and the edited module compiles; a snippet that is not there (or is there
twice) fails loudly; planting never writes through to the release it copies. Nothing is soaked
here: the soak of each mutant is the benchmark's."""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from kvcanary_cli.soak.vllm_stack import RELEASES
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
        ("sglang", "mamba-extra", 4, 1),
        ("sglang", "swa+radix", 3, 1),
        ("sglang", "swa-overlap", 2, 2),
        ("vllm", "swa", 12, 3),
        ("vllm", "hybrid-mamba", 2, 1),
        ("vllm", "hybrid-chunked-local", 2, 1),
        ("vllm", "hybrid-spec3", 1, 0),
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
    # each layout's group is soaked under that layout (a vLLM one under its model; "swa" the
    # default models), with a release of its own
    group = ("-" if layout == "swa" else layout) if engine == "vllm" else layout
    assert (engine, group) in mutants.GROUPS


@pytest.mark.parametrize(
    ("engine", "found", "missing"),
    [
        pytest.param("sglang", WHEEL, MISSING_WHEEL, id="sglang"),
        pytest.param("vllm", VLLM_WHEEL, vllm_wheel.MISSING_WHEEL, id="vllm"),
    ],
)
@pytest.mark.slow
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
            assert mutant.old in text  # the release the snippets are written for: its own text
            edited = mutants.mutated(text, mutant)
            assert edited != text and mutant.new in edited
            compile(edited, mutant.relpath, "exec")  # a mutant is a module that still imports


def test_a_snippet_not_found_once_fails_loudly() -> None:
    gone = mutants.Mutant("gone", "x.py", "free(a)", "free(b)", "nothing")
    with pytest.raises(mutants.SnippetError, match="gone: .* found 0 times in sglang/srt/x.py"):
        mutants.mutated("alloc(a)\n", gone)
    with pytest.raises(mutants.SnippetError, match="found 2 times"):
        mutants.mutated("free(a)\nfree(a)\n", gone)


def test_a_mutant_with_alternatives_uses_the_one_the_text_has_and_fails_loudly_else() -> None:
    leak = mutants.Mutant(
        "leak",
        "pool.py",
        "queue.append_n(blocks)\n",
        "pass\n",
        "leak",
        engine="vllm",
        alternatives=(("queue.extend(blocks)\n", "pass  # old\n"),),
    )
    assert mutants.mutated("x = 1\nqueue.append_n(blocks)\n", leak) == "x = 1\npass\n"
    assert mutants.mutated("x = 1\nqueue.extend(blocks)\n", leak) == "x = 1\npass  # old\n"
    with pytest.raises(mutants.SnippetError, match="leak: 2 of its 2 snippets are found in vllm"):
        mutants.mutated("queue.append_n(blocks)\nqueue.extend(blocks)\n", leak)
    with pytest.raises(mutants.SnippetError, match="leak: none of its 2 snippets is found in"):
        mutants.mutated("queue.popleft()\n", leak)
    with pytest.raises(mutants.SnippetError, match="leak: its snippet is found 2 times"):
        mutants.mutated("queue.extend(blocks)\nqueue.extend(blocks)\n", leak)


def test_a_prefix_hit_left_queued_is_planted_in_a_touch_that_walks_each_group() -> None:
    """0.12.0 - 0.13.0's pool `touch` takes one list of blocks per group and walks each in a
    loop of its own (one level deeper): `pool-touch-leaves-queued` applies there too."""
    [mutant] = [m for m in mutants.MUTANTS if m.name == "pool-touch-leaves-queued"]
    text = (
        "class Pool:\n"
        "    def touch(self, blocks):\n"
        "        for blocks_per_group in blocks:\n"
        "            for block in blocks_per_group:\n"
        "                if block.ref_cnt == 0 and not block.is_null:\n"
        "                    self.free_block_queue.remove(block)\n"
        "                block.ref_cnt += 1\n"
    )
    edited = mutants.mutated(text, mutant)
    assert "free_block_queue.remove" not in edited
    assert edited.endswith(
        "            for block in blocks_per_group:\n                block.ref_cnt += 1\n"
    )
    compile(edited, mutant.relpath, "exec")


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


#: What 0.10.0 - 0.11.0 leave out (their window frees and free queue are written alike).
_BEFORE_0_12 = {
    "window-freed-still-in-table": "the sliding window's frees are written as the chunked "
    "local attention's, in a loop of their own: the snippet is there twice",
    "queue-popleft-one-by-loop": "popleft_n has no one-block fast path before 0.32.0",
}
#: What releases before the Mamba group's prefix-caching mode and before chunked local
#: attention's skipped tokens were counted by `get_num_skipped_tokens` leave out.
_BEFORE_HYBRID_REWRITE = {
    "mamba-retires-running-state": "no Mamba state retirement: one state block per request",
    "mamba-retired-kept": "no Mamba state retirement: one state block per request",
    "mamba-skipped-states-allocated": "no prefix-caching mode: one state block per request",
    "mamba-null-test-by-identity": "no Mamba state retirement: one state block per request",
    "chunked-local-drops-current-chunk": "chunked local attention drops its blocks in a "
    "loop of its own",
    "chunked-local-hit-skips-chunk-start": "its prefix lookup is spelled otherwise",
    "chunked-local-skip-by-remainder": "chunked local attention drops its blocks in a loop "
    "of its own",
}
#: What releases before 0.32.0 leave out: the free queue's one-block fast path.
_BEFORE_0_32 = {"queue-popleft-one-by-loop": _BEFORE_0_12["queue-popleft-one-by-loop"]}
#: What releases before the Mamba group's retirement of the states behind the computed tokens
#: (0.15.0 to 0.29.0: "align" mode, but no `_num_retired_blocks`) leave out.
_BEFORE_MAMBA_RETIREMENT = {
    "mamba-retires-running-state": "no Mamba state retirement",
    "mamba-retired-kept": "no Mamba state retirement",
    "mamba-null-test-by-identity": "no Mamba state retirement",
}
#: What releases before the Mamba group's prefix-caching mode leave out (0.12.0 and 0.13.0
#: here: their chunked local attention is already written as 0.33.0's).
_BEFORE_ALIGN = {
    name: "no prefix-caching mode: one state block per request"
    for name in _BEFORE_HYBRID_REWRITE
    if name.startswith("mamba-")
}
#: What releases before vLLM counted a request's tokens in flight (0.26.0) leave out: their
#: manager frees a window on the tokens computed, the fix's line is not there to break.
_BEFORE_IN_FLIGHT = {
    "window-freed-on-computed": "no tokens in flight counted before 0.26.0",
    "window-freed-in-flight-minus-one": "no tokens in flight counted before 0.26.0",
    "window-freed-on-scheduled-drafts": "no tokens in flight counted before 0.26.0",
}
#: What releases before vLLM's reference sliding window (R-SWA, 0.25.0) leave out.
_BEFORE_RSWA = {
    name: "no reference sliding window before 0.25.0"
    for name in (
        "rswa-gap-from-prompt-floor",
        "rswa-gap-through-window-start",
        "rswa-gap-start-by-negation",
    )
}
#: Per cached vLLM release (those `.ci/run` fetches, the others where cached: 0.10.x's
#: spellings of the map's eviction, the queue's count and 0.10.0's touch; 0.12.0 to 0.32.0's of
#: the pool, the queue and the managers' frees), the mutants that cannot apply there, and why:
#: the code path they break is not in that release, or is not one place in it to edit. Every
#: other mutant applies, through its 0.33.0 snippet or an alternative spelling.
LEFT_OUT = {
    "0.10.0": {**_BEFORE_0_12, **_BEFORE_HYBRID_REWRITE, **_BEFORE_IN_FLIGHT, **_BEFORE_RSWA},
    "0.10.1.1": {**_BEFORE_0_12, **_BEFORE_HYBRID_REWRITE, **_BEFORE_IN_FLIGHT, **_BEFORE_RSWA},
    "0.10.2": {**_BEFORE_0_12, **_BEFORE_HYBRID_REWRITE, **_BEFORE_IN_FLIGHT, **_BEFORE_RSWA},
    "0.11.0": {**_BEFORE_0_12, **_BEFORE_HYBRID_REWRITE, **_BEFORE_IN_FLIGHT, **_BEFORE_RSWA},
    **{
        v: {**_BEFORE_0_32, **_BEFORE_ALIGN, **_BEFORE_IN_FLIGHT, **_BEFORE_RSWA}
        for v in ("0.12.0", "0.13.0")
    },
    **{
        v: {**_BEFORE_0_32, **_BEFORE_MAMBA_RETIREMENT, **_BEFORE_IN_FLIGHT, **_BEFORE_RSWA}
        for v in RELEASES[RELEASES.index("0.20.1") : RELEASES.index("0.25.0")]
    },
    **{
        v: {**_BEFORE_0_32, **_BEFORE_MAMBA_RETIREMENT, **_BEFORE_IN_FLIGHT}
        for v in RELEASES[RELEASES.index("0.25.0") : RELEASES.index("0.26.0")]
    },
    **{
        v: {**_BEFORE_0_32, **_BEFORE_MAMBA_RETIREMENT}
        for v in RELEASES[RELEASES.index("0.26.0") : RELEASES.index("0.30.0")]
    },
    **{v: dict(_BEFORE_0_32) for v in ("0.30.0", "0.31.0")},
    "0.32.0": {},
    "0.33.0": {},
    "0.34.0": {},
}


#: The releases whose case is the fast lane's (`.ci/run` fetches 0.11.0, 0.33.0 and 0.34.0;
#: 0.10.x's spellings are the oldest); the others are the whole suite's (a wheel each read).
_FAST_LANE = ("0.10.0", "0.10.1.1", "0.10.2", "0.11.0", "0.33.0", "0.34.0")


@pytest.mark.parametrize(
    "version",
    [
        pytest.param(v, marks=[] if v in _FAST_LANE else [pytest.mark.slow])
        for v in sorted(LEFT_OUT)
    ],
)
def test_on_each_cached_vllm_release_every_mutant_its_code_has_applies(
    version: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vllm = [m for m in mutants.MUTANTS if m.engine == "vllm"]
    wheel = vllm_wheel.wheel_path(version)
    if wheel is None:
        pytest.skip(vllm_wheel.missing_wheel(version))
    with zipfile.ZipFile(wheel) as archive:
        for path in {m.relpath for m in vllm}:
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_bytes(archive.read(path))
    # checked as on a release other than the snippets' own, so that a lacking one is left out
    kept, left_out = mutants._fitting(tmp_path, "another", vllm)
    # a mutant soaked again under async scheduling or with drafts is left out where its
    # original is
    lacking = LEFT_OUT[version]
    expected = [
        m.name
        for m in vllm
        if m.name.removesuffix("-overlapped").removesuffix("-drafting").removesuffix("-async")
        in lacking
    ]
    assert {m.name for m in vllm} - {m.name for m in kept} == set(expected)
    assert [line.split(":")[0] for line in left_out] == [f"mutant {name}" for name in expected]
    for mutant in kept:
        text = (tmp_path / mutant.relpath).read_text()
        edited = mutants.mutated(text, mutant)
        assert edited != text
        compile(edited, mutant.relpath, "exec")  # a mutant is a module that still imports
    said = capsys.readouterr().err
    assert f"this tree is vLLM another: {len(kept)} of {len(vllm)} apply" in said
    assert all(name in said for name in LEFT_OUT[version])
    # on the snippets' own release nothing is left out quietly: planting fails loudly
    assert mutants._fitting(tmp_path, "0.33.0", vllm) == (vllm, [])


class _Drawn(Exception):
    """Stops `sglang_alone` once its first history's stack is asked for."""


@pytest.mark.parametrize(
    "layout",
    ["swa", "unified", "mamba", "swa+hicache-tp2", "swa+hicache-storage-tp2", "swa-overlap"],
)
def test_sglang_alone_runs_the_soak_workload_of_its_layout(
    layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's checks alone run the histories soak runs on that layout (the Mamba layout's
    requests that may stop early, unified memory's lazy compaction), not the SWA layout's, on
    the stack soak builds for them (`history_stack`: the workload's serving switches; they
    once ran unified memory without its lazy compaction)."""
    from types import SimpleNamespace

    from kvcanary_cli.soak import command
    from kvcanary_cli.soak import run as soak_run

    built: list[tuple[object, object]] = []

    def recording(modules: object, spec: object, workload: object, **placed: object) -> object:
        built.append((spec, workload))
        raise _Drawn

    monkeypatch.setattr(soak_run, "history_stack", recording)
    with pytest.raises(_Drawn):
        modules = SimpleNamespace(
            cores=("python",),
            server_args=SimpleNamespace(ServerArgs=lambda **kw: kw),
            tree=SimpleNamespace(version="0.5.23"),
        )
        mutants.sglang_alone(modules, 10, 0, layout)
    base, _, hicache, _, storage, overlap = mutants.soak_layout(layout)
    specs = command._specs(None, ("python",), None, base)
    workload = command.history_workload(
        0, 0, len(specs), 1, base, hicache=hicache, storage=storage, overlap=overlap
    )  # no cap
    assert built == [(specs[0], workload)]
    assert workload.hicache_write_policy is not None or not hicache
    assert (workload.hicache_storage is not None) == storage
    assert workload.overlap == overlap == (layout == "swa-overlap")


def test_a_vllm_bench_layout_names_its_models_and_scheduling() -> None:
    """`hybrid-spec3` soaks `--vllm-model hybrid --speculative-tokens 3`, `hybrid-overlap`
    `--overlap`, `-` soak's default models; the drafts' window mutant is soaked with drafts."""
    assert mutants.vllm_scheduling("hybrid-spec3") == ("hybrid", False, 3)
    assert mutants.vllm_scheduling("hybrid-overlap") == ("hybrid", True, 0)
    assert mutants.vllm_scheduling("hybrid-chunked-local") == ("hybrid-chunked-local", False, 0)
    assert mutants.vllm_scheduling("-") == (None, False, 0)
    [drafts] = [m for m in mutants.MUTANTS if m.name == "window-freed-on-scheduled-drafts"]
    assert mutants._group(drafts) == ("vllm", "hybrid-spec3")
    # again under async scheduling with drafts, the window's and the Mamba group's
    assert mutants.vllm_scheduling("hybrid-mamba-spec3-overlap") == ("hybrid-mamba", True, 3)
    both = {m.name: m.layout for m in mutants.MUTANTS if m.name.endswith("-async-drafting")}
    assert both["window-freed-on-computed-async-drafting"] == "hybrid-spec3-overlap"
    assert both["window-freed-on-scheduled-drafts-async-drafting"] == "hybrid-spec3-overlap"
    assert both["mamba-retired-kept-async-drafting"] == "hybrid-mamba-spec3-overlap"
    assert len(both) == 7


def test_a_bench_layout_names_soaks_switches() -> None:
    """`swa+hicache-tp2` is soak's swa layout with the host tier on two ranks, as `soak
    --layout swa --hicache --tp 2` runs it; its mutants are the host tier's on ranks."""
    assert mutants.soak_layout("swa+hicache-tp2") == ("swa", False, True, 2, False, False)
    assert mutants.soak_layout("swa+hicache-storage-tp2") == ("swa", False, True, 2, True, False)
    assert mutants.soak_layout("swa+radix") == ("swa", True, False, 1, False, False)
    assert mutants.soak_layout("swa-tp2") == ("swa", False, False, 2, False, False)
    assert mutants.soak_layout("swa-overlap") == ("swa", False, False, 1, False, True)
    on_ranks = [m for m in mutants.MUTANTS if m.layout == "swa+hicache"]
    assert {m.control for m in on_ranks} == {False, True}
    assert all(mutants._group(m) == ("sglang", "swa+hicache-tp2") for m in on_ranks)
    with_storage = [m for m in mutants.MUTANTS if m.layout == "swa+hicache-storage"]
    assert {m.control for m in with_storage} == {False, True}
    assert all(mutants._group(m) == ("sglang", "swa+hicache-storage-tp2") for m in with_storage)


def test_a_mutant_that_parts_ranks_is_soaked_on_ranks() -> None:
    """A mutant that makes ranks part is soaked with `--tp` (its group's layout says how many
    ranks), with a release of that group beside it: one rank alone holds nothing wrong."""
    ranked = [m for m in mutants.MUTANTS if m.tp > 1]
    assert ranked
    for mutant in ranked:
        group = mutants._group(mutant)
        assert group in mutants.GROUPS and mutants.soak_layout(group[1]).tp == mutant.tp
        assert mutants.soak_layout(group[1])._replace(tp=1) == mutants.soak_layout(mutant.layout)
        assert mutants._release_name(group) == f"{group[1]}-release"


def test_sglang_alone_sets_the_serving_options_as_soak_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SGLang's checks alone set the history's serving switches by the names its release
    reads, with the call soak's own loop makes (`serving_options(workload, schedule_batch)`):
    a call of an older arity once failed only when a bench run reached it."""
    from inspect import signature
    from types import SimpleNamespace

    from kvcanary_cli.soak import audit, driver
    from kvcanary_cli.soak import run as soak_run

    real = driver.serving_options
    calls: list[tuple[object, ...]] = []

    def recording(*args: object) -> None:
        signature(real).bind(*args)  # the call fits the real function, or the test fails here
        calls.append(args)
        raise _Drawn

    monkeypatch.setattr(soak_run, "history_stack", lambda *_, **placed: object())
    monkeypatch.setattr(driver, "Scheduler", lambda stack, workload: SimpleNamespace())
    monkeypatch.setattr(audit, "SGLangChecks", lambda scheduler: None)
    monkeypatch.setattr(driver, "serving_options", recording)
    schedule_batch = SimpleNamespace(envs=None)
    modules = SimpleNamespace(
        cores=("python",),
        server_args=SimpleNamespace(ServerArgs=lambda **kw: kw),
        tree=SimpleNamespace(version="0.5.23"),
        schedule_batch=schedule_batch,
    )
    with pytest.raises(_Drawn):
        mutants.sglang_alone(modules, 10, 0, "swa")
    assert len(calls) == 1 and calls[0][1] is schedule_batch


def test_the_overlapped_loops_mutants_are_soaked_under_it() -> None:
    """A mutant of what only the overlapped loop reaches (a batch in flight while the next
    is chosen) is soaked with `--overlap`, SGLang's checks alone running the same loop, with
    a release of that group beside it; each of its two edits has a control."""
    overlapped = [m for m in mutants.MUTANTS if m.layout == "swa-overlap"]
    assert {m.name for m in overlapped} >= {
        "swa-evicted-under-inflight-prefill",
        "finishing-inflight-one-early",
    }
    groups = {m.tp: mutants._group(m) for m in overlapped}
    assert groups == {1: ("sglang", "swa-overlap"), 2: ("sglang", "swa-tp2-overlap")}
    assert all(mutants.soak_layout(layout).overlap for _, layout in groups.values())
    assert mutants._release_name(("sglang", "swa-overlap")) == "swa-overlap-release"
    for old in {m.old for m in overlapped}:
        assert {m.control for m in overlapped if m.old == old} == {False, True}
