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
        (["--layout", "mamba"], "drop --layout mamba"),
        (["--layout", "mamba-extra"], "drop --layout mamba-extra"),
        (["--hicache", "--hicache-storage"], "drop --hicache-storage"),
        (["--layout", "mamba", "--tp", "2"], "drop --layout mamba and --tp"),
        (["--session-radix-cache"], "drop --session-radix-cache"),
        (["--tp", "2"], "drop --tp"),
        (["--engine", "vllm"], "SGLang's overlapped loop only"),
        (["--replay", "soak-reproducer.json"], "scheduler loop from the reproducer"),
    ],
)
def test_overlap_where_it_was_not_validated_is_one_error_line(args: list[str], said: str) -> None:
    result = CliRunner().invoke(app, ["soak", "--overlap", *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and said in result.stderr, result.stderr


@pytest.mark.parametrize("args", [["--layout", "unified"], ["--hicache"]])
def test_overlap_passes_where_it_was_validated(args: list[str], tmp_path: Path) -> None:
    """Unified memory and the host tier (on the swa layout) were validated under the
    overlapped loop: no refusal; the run goes on to load its SGLang (here a missing one)."""
    missing = tmp_path / "no-sglang"
    result = CliRunner().invoke(app, ["soak", "--overlap", *args, "--sglang-tree", str(missing)])
    assert result.exit_code == 2, result.output
    assert "drop" not in result.stderr and "no such file" in result.stderr, result.stderr


def test_another_release_is_refused_once_loaded() -> None:
    """The release is known once its tree is loaded: another one's loop is not modelled."""
    from kvcanary_cli.errors import OptionError
    from kvcanary_cli.soak.command import _refuse_overlap

    def refused(version: str | None) -> None:
        _refuse_overlap(version, "swa", hicache_storage=False, session_radix_cache=False, tp=1)

    refused("0.5.23")
    refused("0.5.22")
    refused(None)  # not loaded yet: only the options are checked
    with pytest.raises(OptionError, match=r"of SGLang 0\.5\.22 and 0\.5\.23, not SGLang 0\.5\.21"):
        refused("0.5.21")


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
