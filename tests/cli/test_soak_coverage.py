"""`kvcanary soak --coverage` and the workload's serving knobs, without SGLang: the tracer and
the free-path list on a small package of our own laid out as SGLang's `srt/mem_cache`, the
workload files' new keys (and old files without them), and --coverage where it does not apply.
The real stack's coverage is in tests/integration/test_sglang_stack.py."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from kvcanary_cli.cli import app
from kvcanary_cli.soak.coverage import Tracer, free_paths, summary
from kvcanary_cli.soak.workload import Arrival, Workload, random_workload

_ALLOCATOR = """
class Base:
    def free(self, slots):
        return slots

    def free_full(self, slots):
        return self.free(slots)

    def available_size(self):
        return 0


class Swa(Base):
    def free(self, slots):
        return self._release_swa(slots) if slots else None

    def _release_swa(self, slots):
        return slots

    def free_host_values(self, values):
        return values

    def _free_pages_none_cuda(self, pages):
        return pages

    def evictable_size(self):
        return 0

    def get_all_free_pages(self):
        return []


def release_kv_cache(allocator):
    return allocator.free([])


def helper():
    return 1
"""


@pytest.fixture(scope="module")
def mem_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ModuleType]:
    folder = tmp_path_factory.mktemp("tree") / "sglang" / "srt" / "mem_cache"
    folder.mkdir(parents=True)
    (folder / "allocator.py").write_text(_ALLOCATOR)
    spec = importlib.util.spec_from_file_location("kvc_cov_allocator", folder / "allocator.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return folder, module


def test_free_paths_are_what_the_objects_resolve_to(mem_cache: tuple[Path, ModuleType]) -> None:
    """The overridden Base.free is not a path of a Swa; sizes are not free paths; the host
    tier's path is another feature's; what ran is reached."""
    folder, module = mem_cache
    allocator = module.Swa()
    paths = free_paths([allocator], [module], folder)
    assert sorted(paths) == [
        "Base.free_full",
        "Swa._free_pages_none_cuda",
        "Swa._release_swa",
        "Swa.free",
        "Swa.free_host_values",
        "kvc_cov_allocator.release_kv_cache",
    ]
    tracer = Tracer(folder)
    with tracer.tracing():
        module.release_kv_cache(allocator)  # Swa.free with no slots: _release_swa not called
    covered = summary(tracer, paths)
    assert covered.reached == ("Swa.free", "kvc_cov_allocator.release_kv_cache")
    # the CPU path (none_cuda) is this layout's, not the CUDA feature's
    assert covered.not_reached == (
        "Base.free_full",
        "Swa._free_pages_none_cuda",
        "Swa._release_swa",
    )
    assert covered.other_features == ("Swa.free_host_values",)
    assert covered.functions_run == 2


def test_the_tracer_sees_only_the_folder_and_puts_the_trace_function_back(
    mem_cache: tuple[Path, ModuleType], tmp_path: Path
) -> None:
    folder, module = mem_cache
    tracer = Tracer(tmp_path)  # another folder: nothing of the package counts
    before = sys.gettrace()
    with tracer.tracing():
        module.Swa().free([1])
    assert sys.gettrace() is before
    assert tracer.called == set()
    mine = Tracer(folder)
    with mine.tracing():
        module.Swa().free([1])
    assert {code.co_name for code in mine.called} == {"free", "_release_swa"}


def test_aborts_keep_the_arrivals_and_the_files_carry_the_knobs() -> None:
    plain = random_workload(5, steps=80, requests=30, max_prompt=60, max_new=20)
    knobs = random_workload(
        5,
        steps=80,
        requests=30,
        max_prompt=60,
        max_new=20,
        aborts=0.5,
        release_prefill_swa=True,
        swa_eviction_interval=4,
        need_sort=True,
        lazy_compaction=True,
        ignore_eos=False,
    )
    key = [(a.step, a.prompt, a.max_new_tokens) for a in plain.arrivals]
    assert sorted(key) == sorted((a.step, a.prompt, a.max_new_tokens) for a in knobs.arrivals)
    assert all(a.abort_after is None for a in plain.arrivals)
    assert {a.abort_after == 0 for a in knobs.arrivals if a.abort_after is not None} == {
        True,
        False,
    }
    assert Workload.from_json(knobs.to_json()) == knobs
    shrunk = knobs.without([0, 1])
    knobs_kept = (shrunk.release_prefill_swa, shrunk.swa_eviction_interval, shrunk.need_sort)
    assert knobs_kept == (True, 4, True) and shrunk.lazy_compaction
    assert shrunk.ignore_eos is False and plain.ignore_eos is True


def test_mamba_histories_estimate_outputs_and_abort_early() -> None:
    """The Mamba layout's requests may stop early (the adder estimates their rest, so decode
    retracts) and aborts come within a few steps (some in chunked prefill); the other
    layouts' workloads keep their fixed-length requests and abort draws."""
    from kvcanary_cli.soak.command import MAMBA_ABORT_WITHIN, history_workload

    mamba = [history_workload(0, h, 1, layout="mamba") for h in range(5)]
    assert not any(w.ignore_eos for w in mamba)
    late = [
        a.abort_after
        for w in mamba
        for a in _drawn(w.arrivals)  # sessions' later turns: see below
        if a.abort_after is not None
    ]
    assert late and max(late) < MAMBA_ABORT_WITHIN
    swa = history_workload(0, 0, 1)
    drawn = random_workload(
        swa.seed, steps=swa.steps, requests=20, max_prompt=60, max_new=20, aborts=0.15
    )
    unmarked = [replace(a, session=None) for a in _drawn(swa.arrivals)]  # streaming sessions
    assert swa.ignore_eos and unmarked == list(drawn.arrivals)


def test_mamba_histories_warm_each_stem_up_before_its_first_request() -> None:
    """Before the earliest request sharing a stem's first Mamba chunk comes, in the same step,
    a warm-up of that chunk alone with one output token; the other arrivals are those drawn
    without warm-ups, and no other layout has any."""
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.mamba import CHUNK
    from kvcanary_cli.soak.workload import random_workload

    for history in range(5):
        mamba = history_workload(0, history, 1, layout="mamba")
        arrivals = list(mamba.arrivals)
        warm = [
            i for i, a in enumerate(arrivals) if a.max_new_tokens == 1 and len(a.prompt) == CHUNK
        ]
        warmed = {arrivals[i].prompt for i in warm}
        assert warm and len(warmed) == len(warm)
        for i in warm:
            after = arrivals[i + 1]
            assert after.step == arrivals[i].step and after.prompt[:CHUNK] == arrivals[i].prompt
            sharers = [a.step for a in arrivals if a.prompt[:CHUNK] == arrivals[i].prompt]
            assert after.step == min(sharers)
        drawn = random_workload(
            mamba.seed, steps=mamba.steps, requests=20, max_prompt=96, max_new=40
        )
        kept = [a.prompt for i, a in enumerate(arrivals) if i not in warm]
        later = [a.prompt for a in arrivals if a not in _drawn(arrivals)]
        assert sorted(kept) == sorted([*later, *(a.prompt for a in drawn.arrivals)])
    swa = history_workload(0, 0, 1)
    assert len(_drawn(swa.arrivals)) == 20  # (its sessions' later turns aside)


def _drawn(arrivals: Sequence[Arrival]) -> list[Arrival]:
    """The arrivals but sessions' later turns (a session's first turn is a drawn request)."""
    opened: set[int] = set()
    kept = []
    for a in arrivals:
        if a.session is None or a.session not in opened:
            kept.append(a)
        if a.session is not None:
            opened.add(a.session)
    return kept


def test_mamba_histories_open_sessions_drawn_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """`MAMBA_SESSIONS` drawn requests of a Mamba history each open a session with one or
    two later turns, each a few steps after the turn before; with those left out, and the
    session marks dropped, the arrivals and their aborts are those drawn without sessions.
    A conversation fits where the longest drawn request does; half the later turns are
    aborted, never at once, within twice the layout's abort window. They are client
    sessions; the other layouts' histories open `STREAMING_SESSIONS` streaming ones."""
    from kvcanary_cli.soak import command
    from kvcanary_cli.soak.command import (
        MAMBA_ABORT_WITHIN,
        MAMBA_NEW,
        MAMBA_PROMPT,
        MAMBA_SESSIONS,
        STREAMING_SESSIONS,
        history_workload,
    )

    aborted = later_turns = 0
    for history in range(5):
        mamba = history_workload(0, history, 1, layout="mamba")
        turns: dict[int, list[Arrival]] = {}
        for a in mamba.arrivals:
            if a.session is not None:
                turns.setdefault(a.session, []).append(a)
        assert sorted(turns) == list(range(MAMBA_SESSIONS))
        for session in turns.values():
            assert 2 <= len(session) <= 3
            assert all(b.step > a.step for a, b in zip(session, session[1:], strict=False))
            size = sum(len(a.prompt) + a.max_new_tokens for a in session)
            assert size <= MAMBA_PROMPT + MAMBA_NEW
            for a in session[1:]:
                later_turns += 1
                if a.abort_after is not None:
                    aborted += 1
                    assert 0 < a.abort_after < 2 * MAMBA_ABORT_WITHIN
        with monkeypatch.context() as patch:
            patch.setattr(command, "MAMBA_SESSIONS", 0)
            drawn = command.history_workload(0, history, 1, layout="mamba")
        unmarked = [replace(a, session=None) for a in _drawn(mamba.arrivals)]
        assert unmarked == list(drawn.arrivals)
    assert 0 < aborted < later_turns
    assert not mamba.streaming_sessions
    for layout in ("swa", "unified"):
        other = history_workload(0, 0, 1, layout=layout)
        opened = {a.session for a in other.arrivals if a.session is not None}
        assert other.streaming_sessions and opened == set(range(STREAMING_SESSIONS))


def test_a_workload_with_sessions_reads_back_and_one_without_writes_no_session() -> None:
    """A reproducer records each turn's session and replays it; arrivals of no session write
    none (files of other workloads stay as they were)."""
    from kvcanary_cli.soak.command import history_workload

    mamba = history_workload(0, 0, 1, layout="mamba")
    assert Workload.from_json(mamba.to_json()) == mamba
    assert '"session"' in mamba.to_json()
    plain = Workload(0, (Arrival(0, (1, 2), 3),), 80)
    assert '"session"' not in plain.to_json() and Workload.from_json(plain.to_json()) == plain
    swa = history_workload(0, 0, 1)
    assert swa.streaming_sessions and Workload.from_json(swa.to_json()) == swa
    # files before streaming sessions read as client sessions; a flag must be a bool
    older = json.loads(swa.to_json())
    del older["streaming_sessions"]
    assert not Workload.from_json(json.dumps(older)).streaming_sessions
    with pytest.raises(TypeError):
        Workload.from_json(json.dumps({**older, "streaming_sessions": 1}))


def test_mamba_paths_are_the_mamba_layouts_own(mem_cache: tuple[Path, ModuleType]) -> None:
    """A Mamba free path that never ran is another feature's in a soak of another layout,
    and this layout's own (not reached) in a Mamba soak; a host tier's stays another's."""
    folder, module = mem_cache
    code = module.helper.__code__
    paths = {"Pool.free_mamba_cache": code, "Swa.free_host_values": code}
    tracer = Tracer(folder)
    elsewhere = summary(tracer, paths)
    assert elsewhere.not_reached == ()
    assert elsewhere.other_features == ("Pool.free_mamba_cache", "Swa.free_host_values")
    mamba = summary(tracer, paths, mamba=True)
    assert mamba.not_reached == ("Pool.free_mamba_cache",)
    assert mamba.other_features == ("Swa.free_host_values",)


def test_host_paths_are_the_host_tiers_own_under_hicache(
    mem_cache: tuple[Path, ModuleType],
) -> None:
    """With `--hicache` a host free path that never ran is this soak's own (not reached),
    no longer another feature's; CUDA's and sessions' stay another's."""
    folder, module = mem_cache
    code = module.helper.__code__
    paths = {"Swa.free_host_values": code, "Tree.release_session": code, "Swa.free_cuda": code}
    tracer = Tracer(folder)
    plain = summary(tracer, paths)
    assert plain.not_reached == ()
    hicache = summary(tracer, paths, hicache=True)
    assert hicache.not_reached == ("Swa.free_host_values",)
    assert hicache.other_features == ("Swa.free_cuda", "Tree.release_session")


def test_radix_session_paths_are_the_soaks_own_under_radix_sessions(
    mem_cache: tuple[Path, ModuleType],
) -> None:
    """With `--session-radix-cache` a radix session's free path that never ran is this soak's
    own (not reached), no longer another feature's; a streaming session's and a host tier's
    stay another's."""
    folder, module = mem_cache
    code = module.helper.__code__
    paths = {
        "Tree.release_radix_session": code,
        "TreeComponent.release_session": code,
        "StreamingSession._free_tail": code,
        "Swa.free_host_values": code,
    }
    tracer = Tracer(folder)
    plain = summary(tracer, paths)
    assert plain.not_reached == ()
    radix = summary(tracer, paths, radix=True)
    assert radix.not_reached == ("Tree.release_radix_session", "TreeComponent.release_session")
    assert radix.other_features == ("StreamingSession._free_tail", "Swa.free_host_values")


def test_radix_histories_open_client_sessions_in_every_layout() -> None:
    """Under radix sessions every layout's sessions are client ones (none streaming), as many
    as without them, on the same arrivals; the flag reads back, and older files have none."""
    from kvcanary_cli.soak.command import MAMBA_SESSIONS, STREAMING_SESSIONS, history_workload

    for layout, count in (("swa", STREAMING_SESSIONS), ("mamba", MAMBA_SESSIONS)):
        radix = history_workload(0, 0, 1, layout=layout, radix=True)
        plain = history_workload(0, 0, 1, layout=layout)
        assert radix.radix_sessions and not radix.streaming_sessions
        assert radix.arrivals == plain.arrivals
        assert {a.session for a in radix.arrivals if a.session is not None} == set(range(count))
        assert Workload.from_json(radix.to_json()) == radix
    older = json.loads(radix.to_json())
    del older["radix_sessions"]
    assert not Workload.from_json(json.dumps(older)).radix_sessions
    assert not history_workload(0, 0, 1).radix_sessions
    with pytest.raises(TypeError):
        Workload.from_json(json.dumps({**older, "radix_sessions": 1}))


def test_hicache_histories_take_the_write_policies_in_turn() -> None:
    """Each history under `--hicache` names one of SGLang's write policies, in turn; without
    it, none (a reproducer of an older soak reads as none)."""
    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.workload import WRITE_POLICIES

    drawn = [history_workload(0, h, 6, hicache=True).hicache_write_policy for h in range(6)]
    assert drawn == [*WRITE_POLICIES, *WRITE_POLICIES]
    assert history_workload(0, 0, 6).hicache_write_policy is None


def test_one_history_in_five_sorts_its_free_lists_and_each_shape_meets_it() -> None:
    """need_sort at a low rate (the default soak's speed stays), on every default stack shape
    (page sizes 1, 4, 16 by two cores) within 30 histories."""
    from kvcanary_cli.soak.command import history_workload

    sorted_in = [h for h in range(30) if history_workload(0, h, 6).need_sort]
    assert len(sorted_in) == 6
    assert {h % 6 for h in sorted_in} == set(range(6))


def test_unified_memory_compacts_lazily_as_sglang_does_but_one_history_in_five() -> None:
    """Lazy compaction is SGLang's default for unified memory: most unified histories run it,
    one in five its opt-out, each default shape meets both; no other layout has it."""
    from kvcanary_cli.soak.command import history_workload

    lazy = [history_workload(0, h, 6, layout="unified").lazy_compaction for h in range(30)]
    assert lazy.count(False) == 6
    assert {h % 6 for h in range(30) if not lazy[h]} == set(range(6))
    assert not any(history_workload(0, h, 6).lazy_compaction for h in range(30))


def test_a_workload_file_without_the_knobs_reads_as_none_set() -> None:
    """Reproducers written before the knobs replay as they ran."""
    old = {"seed": 3, "steps": 10, "arrivals": [{"step": 0, "prompt": [1], "max_new_tokens": 2}]}
    workload = Workload.from_json(json.dumps(old))
    assert workload.arrivals[0].abort_after is None and workload.arrivals[0].session is None
    assert (workload.release_prefill_swa, workload.swa_eviction_interval) == (False, 0)
    assert workload.need_sort is False and workload.lazy_compaction is False
    assert workload.ignore_eos is True


@pytest.mark.parametrize(
    "knob",
    [
        {"release_prefill_swa": "yes"},
        {"swa_eviction_interval": -1},
        {"swa_eviction_interval": 1.5},
        {"need_sort": 1},
        {"lazy_compaction": "no"},
        {"ignore_eos": 0},
        {"arrivals": [{"step": 0, "prompt": [1], "max_new_tokens": 2, "abort_after": -1}]},
        {"arrivals": [{"step": 0, "prompt": [1], "max_new_tokens": 2, "session": "a"}]},
        {"arrivals": [{"step": 0, "prompt": [1], "max_new_tokens": 2, "session": -1}]},
    ],
)
def test_a_reproducer_with_a_bad_knob_is_one_error_line(
    tmp_path: Path, knob: dict[str, object]
) -> None:
    body = {"seed": 3, "steps": 10, "arrivals": [{"step": 0, "prompt": [1], "max_new_tokens": 2}]}
    spec = {"page_size": 1, "core": "python"}
    data = {"spec": spec, "fault": None, "crash": None, "top_cause": "double-free"}
    path = tmp_path / "soak-reproducer.json"
    path.write_text(json.dumps({**data, "workload": {**body, **knob}}))
    result = CliRunner().invoke(app, ["soak", "--replay", str(path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and "not a soak reproducer" in result.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--replay", "soak-reproducer.json", "--coverage"], "drop --coverage"),
        (["--engine", "vllm", "--coverage"], "SGLang's memory cache only"),
    ],
)
def test_coverage_where_it_does_not_apply_is_one_error_line(args: list[str], said: str) -> None:
    result = CliRunner().invoke(app, ["soak", *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and said in result.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--engine", "vllm", "--session-radix-cache"], "SGLang's radix sessions only"),
        (
            ["--replay", "soak-reproducer.json", "--session-radix-cache"],
            "radix sessions, ranks and scheduler loop from",
        ),
    ],
)
def test_radix_sessions_where_they_do_not_apply_is_one_error_line(
    args: list[str], said: str
) -> None:
    result = CliRunner().invoke(app, ["soak", *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and said in result.stderr


def test_mamba_histories_cap_every_other_history_and_each_shape_meets_both() -> None:
    """Where the release has the per-path Mamba state cap, the first history of a two-core
    Mamba soak is capped and the second not, the next round swapped: each core meets both
    within two rounds, on the same arrivals. Without the option, or on another layout, none.
    A workload file's cap is a positive count or null (absent: null)."""
    import json

    from kvcanary_cli.soak.command import MAMBA_PATH_CAP, history_workload

    def caps(layout: str, path_cap: bool) -> list[int | None]:
        drawn = [history_workload(0, h, 2, layout=layout, path_cap=path_cap) for h in range(4)]
        for h, w in enumerate(drawn):
            assert w.arrivals == history_workload(0, h, 2, layout=layout).arrivals
        return [w.mamba_max_states_per_path for w in drawn]

    assert caps("mamba", True) == [MAMBA_PATH_CAP, None, None, MAMBA_PATH_CAP]
    assert caps("mamba", False) == caps("swa", True) == caps("unified", True) == [None] * 4
    capped = history_workload(0, 0, 1, layout="mamba", path_cap=True)
    assert Workload.from_json(capped.to_json()) == capped
    data = json.loads(capped.to_json())
    for wrong in (0, -1, True, "2", 1.5):
        with pytest.raises(TypeError):
            Workload.from_json(json.dumps({**data, "mamba_max_states_per_path": wrong}))
    del data["mamba_max_states_per_path"]
    assert Workload.from_json(json.dumps(data)).mamba_max_states_per_path is None


def test_streaming_session_paths_are_the_streaming_layouts_own(
    mem_cache: tuple[Path, ModuleType],
) -> None:
    """A streaming session's free path that never ran is another feature's where no history
    opened one (the Mamba layout's client sessions), and the soak's own (not reached) where
    they did; a radix session's (its own, and the components' `release_session`) stays
    another's."""
    folder, module = mem_cache
    code = module.helper.__code__
    paths = {
        "StreamingSession.release_session": code,
        "TreeComponent.release_session": code,
        "UnifiedRadixCache.release_radix_session": code,
    }
    tracer = Tracer(folder)
    radix = ("TreeComponent.release_session", "UnifiedRadixCache.release_radix_session")
    elsewhere = summary(tracer, paths, mamba=True)
    assert elsewhere.not_reached == ()
    assert elsewhere.other_features == ("StreamingSession.release_session", *radix)
    streaming = summary(tracer, paths, streaming=True)
    assert streaming.not_reached == ("StreamingSession.release_session",)
    assert streaming.other_features == radix
