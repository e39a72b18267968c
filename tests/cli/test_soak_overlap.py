"""`soak --overlap` without SGLang: where it is refused (one error line, before any SGLang is
loaded), and the workloads it draws (tests/integration/test_soak_overlap.py runs them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcanary_cli.cli import app


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--engine", "vllm", "--layout", "swa"], "--layout: an SGLang soak option"),
        (["--replay", "soak-reproducer.json"], "scheduler loop from the reproducer"),
    ],
)
def test_overlap_where_it_was_not_validated_is_one_error_line(args: list[str], said: str) -> None:
    result = CliRunner().invoke(app, ["soak", "--overlap", *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and said in result.stderr, result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--layout", "unified"],
        ["--layout", "mamba-extra"],
        ["--hicache"],
        ["--layout", "mamba", "--hicache"],
        ["--layout", "mamba-extra", "--hicache"],
        ["--tp", "2"],
        ["--session-radix-cache"],
        ["--hicache", "--hicache-storage"],
    ],
)
def test_overlap_passes_where_it_was_validated(args: list[str], tmp_path: Path) -> None:
    """Unified memory, the Mamba layouts, the host tier (wherever it runs) and the storage
    tier behind it, several ranks and radix sessions were validated under the overlapped
    loop: no refusal; the run goes on to load its SGLang (here a missing one)."""
    missing = tmp_path / "no-sglang"
    result = CliRunner().invoke(app, ["soak", "--overlap", *args, "--sglang-tree", str(missing)])
    assert result.exit_code == 2, result.output
    assert "drop" not in result.stderr and "no such file" in result.stderr, result.stderr


def test_another_release_is_refused_once_loaded() -> None:
    """The release is known once its tree is loaded: another one's loop is not modelled."""
    from kvcanary_cli.errors import OptionError
    from kvcanary_cli.soak.command import _refuse_overlap

    for version in ("0.5.23", "0.5.21", "0.5.19", "0.5.15.post1", "0.5.13", None):  # None: not
        _refuse_overlap(version, "swa")  # loaded yet
    for other in ("0.5.24", "0.5.12"):
        with pytest.raises(
            OptionError, match=rf"of SGLang 0\.5\.13 to 0\.5\.23, not SGLang {other}'s"
        ):
            _refuse_overlap(other, "swa")
    with pytest.raises(OptionError, match="drop --layout paged$"):
        _refuse_overlap(None, "paged")


@pytest.mark.parametrize(
    ("version", "refused"),
    [("0.5.21", []), ("0.5.20", ["unified"]), ("0.5.17", ["unified"]), ("0.5.13", ["unified"])],
)
def test_an_older_loop_is_taken_where_it_was_validated(version: str, refused: list[str]) -> None:
    """0.5.13 - 0.5.21's loop (no `_reqs_finishing_inflight`) was validated on every layout
    (the host tier on each it runs on, as 0.5.22's), but unified memory before 0.5.21 (the
    release's own defects: a busy check that reads a leak on correct states, a tree that
    crashes recovering an SWA tombstone): that layout is refused once the release is known,
    in one line naming what to drop; a reproducer of it is refused on replay too
    (`_overlap_modelled`)."""
    from kvcanary_cli.errors import OptionError
    from kvcanary_cli.soak.command import OVERLAP_LAYOUTS, _overlap_modelled, _refuse_overlap

    for layout in OVERLAP_LAYOUTS:
        assert _overlap_modelled(version, layout) == (layout not in refused)
        if layout not in refused:
            _refuse_overlap(version, layout)
            continue
        with pytest.raises(OptionError, match=f"drop --layout {layout}$") as raised:
            _refuse_overlap(version, layout)
        assert "\n" not in str(raised.value) and f"SGLang {version}'s" in str(raised.value)
    for newer in ("0.5.22", "0.5.23"):
        assert all(_overlap_modelled(newer, layout) for layout in OVERLAP_LAYOUTS)
    assert not _overlap_modelled("0.5.24", "swa")


def test_overlapped_extra_buffer_histories_run_the_lazy_strategy_in_two_of_four() -> None:
    """Under the overlapped loop the extra buffer's track buffer holds two slots (SGLang sizes
    it so overlapped), and the second and third of every four histories run SGLang's lazy
    strategy, so the lazy one meets the prefill sync on and off; a workload file keeps it
    (absent: off), and one asking for it without the overlapped loop and two track slots is
    refused, as SGLang refuses the strategy without its overlapped scheduler."""
    import json

    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.workload import Workload

    drawn = [history_workload(3, h, 3, 4, "mamba-extra", overlap=True) for h in range(8)]
    assert [w.mamba_track_slots for w in drawn] == [2] * 8
    assert [w.mamba_lazy for w in drawn] == [False, True, True, False] * 2
    assert {(w.mamba_lazy, w.consecutive_prefill_sync) for w in drawn[:4]} == {
        (False, False),
        (True, True),
        (True, False),
        (False, True),
    }
    for h, w in enumerate(drawn):
        assert w.arrivals == history_workload(3, h, 3, 4, "mamba-extra").arrivals
        assert Workload.from_json(w.to_json()) == w
    assert "mamba_lazy" not in json.loads(drawn[0].to_json())
    assert not any(history_workload(3, h, 1, 1, "mamba", overlap=True).mamba_lazy for h in range(4))
    assert not any(history_workload(3, h, 3, 4, "mamba-extra").mamba_lazy for h in range(4))
    data = json.loads(drawn[1].to_json())
    for key, value in (("overlap", False), ("mamba_track_slots", 1), ("mamba_lazy", "yes")):
        bad = dict(data, **{key: value})
        with pytest.raises(TypeError):
            Workload.from_json(json.dumps(bad))


def test_overlapped_histories_sync_consecutive_prefills_every_other_history() -> None:
    """The arrivals are the non-overlapped history's; the first history runs SGLang's default
    (consecutive prefills overlapped), the next SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP;
    a workload file keeps both switches (absent: off)."""
    import json

    from kvcanary_cli.soak.command import history_workload
    from kvcanary_cli.soak.workload import Workload

    drawn = [history_workload(3, h, 6, overlap=True) for h in range(4)]
    assert [w.overlap for w in drawn] == [True] * 4
    assert [w.consecutive_prefill_sync for w in drawn] == [False, True, False, True]
    for h, w in enumerate(drawn):
        plain = history_workload(3, h, 6)
        assert (plain.overlap, plain.consecutive_prefill_sync) == (False, False)
        assert w.arrivals == plain.arrivals
        assert Workload.from_json(w.to_json()) == w
    data = json.loads(drawn[1].to_json())
    del data["overlap"], data["consecutive_prefill_sync"]  # a file from before the switches
    assert not Workload.from_json(json.dumps(data)).overlap
    data["overlap"] = "yes"
    with pytest.raises(TypeError):
        Workload.from_json(json.dumps(data))
