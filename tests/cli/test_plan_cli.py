"""`kvcanary plan`: identical plan files from every backend, JSON output, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from typer.testing import CliRunner, Result

from kvcanary_cli.cli import app
from kvcanary_cli.dump.writer import save_dump
from kvcanary_cli.synth.state import SynthSpec, build_dump

UPSTREAM_MESSAGE = "kv-canary: SWA slot 7 is outside full_to_swa_index_mapping length 5"


def _triton_available() -> bool:
    """False only where the triton backend cannot exist here; a broken one must fail."""
    try:
        from kvcanary_cli.planners.triton_runtime import load_kernels
    except ModuleNotFoundError as exc:
        if exc.name == "kvcanary_cli.planners.triton_runtime":
            return False
        raise
    from kvcanary_cli.errors import PlannerUnavailableError

    try:
        load_kernels()
    except PlannerUnavailableError:
        return False
    return True


TRITON = _triton_available()
_TRITON = pytest.param(
    "triton", marks=pytest.mark.skipif(not TRITON, reason="the triton backend is not installed")
)


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture(scope="module")
def swa_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A consistent synthetic SWA state with padding, shared prefixes and a token pool."""
    synth = build_dump(
        SynthSpec(window=5, expected_pool=True, active_rows=5, padding_rows=2), seed=7
    )
    return synth.save(tmp_path_factory.mktemp("cli") / "swa.safetensors")


@pytest.fixture(scope="module")
def short_lut_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lut_len = 5, but row 0 reads slot 7 (and row 1 slot 6)."""
    return save_dump(
        tmp_path_factory.mktemp("cli") / "short-lut.safetensors",
        metadata={"swa_window_size": "10"},
        req_to_token=np.array([[0, 0, 0, 0], [1, 2, 7, 3], [2, 6, 0, 0]], dtype=np.int32),
        req_pool_indices=[1, 2],
        prefix_lens=[4, 2],
        extend_seq_lens=[1, 1],
        full_to_swa_index_mapping=[0, 101, 102, 103, -1],
    )


@pytest.fixture(scope="module")
def full_only_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dump(SynthSpec(window=0), seed=3).save(
        tmp_path_factory.mktemp("cli") / "full.safetensors"
    )


def _plan_file(
    runner: CliRunner, dump: Path, out: Path, backend: str, *args: str, raises: bool = False
) -> bytes:
    """The plan file `plan --out` writes; exit 1 and a marked file where REF raises."""
    result = runner.invoke(app, ["plan", str(dump), "--backend", backend, "--out", str(out), *args])
    assert result.exit_code == (1 if raises else 0), (backend, result.output, result.stderr)
    if raises:
        assert "SGLang's reference raises here" in result.stderr
        tensors = load_file(str(out))
        assert bool(tensors["kvcanary.verify_undefined"].any())
    return out.read_bytes()


@pytest.mark.parametrize("backend", ["vectorized", _TRITON])
@pytest.mark.parametrize(
    "extra",
    [[], ["--set", "verify_capacity=3"], ["--set", "kv_token_id_vs_position_offset=1"]],
    ids=["plain", "overflow", "offset1"],
)
@pytest.mark.parametrize("group", ["full", "swa"])
def test_plan_file_is_identical_to_reference(
    runner: CliRunner,
    swa_dump: Path,
    tmp_path: Path,
    group: str,
    extra: list[str],
    backend: str,
) -> None:
    args = ("--group", group, *extra)
    reference = _plan_file(runner, swa_dump, tmp_path / "reference.safetensors", "reference", *args)
    other = _plan_file(runner, swa_dump, tmp_path / f"{backend}.safetensors", backend, *args)
    assert other == reference, f"{backend} wrote a different plan file than reference"
    tensors = load_file(str(tmp_path / "reference.safetensors"))
    assert tensors["write_num_valid_reqs"].tolist() == [7]
    if extra[1:] == ["verify_capacity=3"]:
        assert tensors["enable"].tolist() == [0]
        assert tensors["verify_slot_indices"].size == 0
    else:
        assert tensors["enable"].tolist() == [1]
        assert tensors["verify_slot_indices"].size == tensors["verify_num_valid"].item()


@pytest.mark.parametrize("backend", ["reference", "vectorized", _TRITON])
def test_plan_json(runner: CliRunner, swa_dump: Path, backend: str) -> None:
    result = runner.invoke(
        app, ["plan", str(swa_dump), "--backend", backend, "--group", "swa", "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["schema"] == "kvcanary.plan/1"
    assert record["group"] == "swa" and record["bs"] == 7
    assert [r["batch_row"] for r in record["requests"]] == list(range(7))
    assert record["problem_count"] == 0 and record["launch_error"] is None


def test_strict_reference_exits_1_with_the_upstream_message(
    runner: CliRunner, short_lut_dump: Path, tmp_path: Path
) -> None:
    out = tmp_path / "plan.safetensors"
    result = runner.invoke(
        app,
        [
            "plan",
            str(short_lut_dump),
            "--group",
            "swa",
            "--backend",
            "reference",
            "--strict",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 1, result.output
    assert UPSTREAM_MESSAGE in result.stderr
    assert not out.exists()


def test_collect_reference_plans_a_short_lut(runner: CliRunner, short_lut_dump: Path) -> None:
    result = runner.invoke(
        app,
        [
            "plan",
            str(short_lut_dump),
            "--group",
            "swa",
            "--backend",
            "reference",
            "--format",
            "json",
        ],
    )
    # Planned on past the raise, every problem listed; exit 1 and one line: upstream raises.
    assert result.exit_code == 1, result.output
    assert _one_error_line(result).startswith("SGLang's reference raises here: ValueError:")
    record = json.loads(result.stdout)
    assert record["problem_count"] == 4
    assert [(p["role"], p["batch_row"], p["value"]) for p in record["problems"]] == [
        ("verify", 0, 7),
        ("chain-prev", 0, 7),
        ("verify", 1, 6),
        ("seed", 1, 6),
    ]
    assert all(p["upstream_raises"] for p in record["problems"])


@pytest.mark.skipif(not TRITON, reason="the triton backend is not installed")
def test_triton_writes_clamped_values_for_a_short_lut(
    runner: CliRunner, short_lut_dump: Path, tmp_path: Path
) -> None:
    out = tmp_path / "plan.safetensors"
    result = runner.invoke(
        app,
        ["plan", str(short_lut_dump), "--group", "swa", "--backend", "triton", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    tensors = load_file(str(out))
    assert tensors["verify_slot_indices"].tolist() == [101, 102, -1, 103, 102, -1]
    assert tensors["verify_prev_slot_indices"].tolist() == [-1, 101, 102, -1, -1, 102]
    assert tensors["write_seed_slot_indices"].tolist() == [103, -1]


def _one_error_line(result: Result) -> str:
    lines = str(result.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_strict_with_vectorized_is_a_usage_error(runner: CliRunner, swa_dump: Path) -> None:
    result = runner.invoke(app, ["plan", str(swa_dump), "--backend", "vectorized", "--strict"])
    assert result.exit_code == 2
    assert "--strict" in _one_error_line(result)


def test_unknown_group_is_a_usage_error(runner: CliRunner, swa_dump: Path) -> None:
    result = runner.invoke(app, ["plan", str(swa_dump), "--group", "sliding"])
    assert result.exit_code == 2
    assert "sliding" in _one_error_line(result)


def test_swa_group_without_lut_is_a_usage_error(runner: CliRunner, full_only_dump: Path) -> None:
    result = runner.invoke(app, ["plan", str(full_only_dump), "--group", "swa"])
    assert result.exit_code == 2
    assert "full_to_swa_index_mapping" in _one_error_line(result)


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: Examples whose swa group is bad input, where REF and the GPU path part ways by design.
_DIVERGENT = {("truncated-lut", "swa")}


@pytest.mark.parametrize("group", ["full", "swa"])
@pytest.mark.parametrize("example", sorted(p.stem for p in EXAMPLES.glob("*.safetensors")))
def test_example_plan_files_are_identical_across_backends(
    runner: CliRunner, tmp_path: Path, example: str, group: str
) -> None:
    from kvcanary_cli.dump.loader import load_dump

    dump = EXAMPLES / f"{example}.safetensors"
    if group == "swa" and load_dump(dump).lut_len is None:
        pytest.skip("no SWA LUT in this example")
    backends = ["vectorized", *(["triton"] if TRITON else [])]
    if (example, group) in _DIVERGENT:
        backends = ["vectorized"]  # the REF backends still agree with each other
    divergent = (example, group) in _DIVERGENT
    reference = _plan_file(
        runner,
        dump,
        tmp_path / "reference.safetensors",
        "reference",
        "--group",
        group,
        raises=divergent,
    )
    for backend in backends:
        other = _plan_file(
            runner,
            dump,
            tmp_path / f"{backend}.safetensors",
            backend,
            "--group",
            group,
            raises=divergent and backend == "vectorized",
        )
        assert other == reference, f"{backend} wrote a different plan file than reference"


def test_truncated_lut_example_strict_exits_1_with_the_upstream_message(runner: CliRunner) -> None:
    from kvcanary_cli.dump.loader import load_dump
    from kvcanary_cli.planners.base import lut_error_message
    from tests.helpers import REFERENCE

    dump = EXAMPLES / "truncated-lut.safetensors"
    if not dump.exists():
        pytest.skip("examples/truncated-lut.safetensors is not there")
    loaded = load_dump(dump)
    first = REFERENCE.plan(loaded, "swa").problems.first_raise()
    assert first is not None
    result = runner.invoke(
        app, ["plan", str(dump), "--group", "swa", "--backend", "reference", "--strict"]
    )
    assert result.exit_code == 1, result.output
    assert lut_error_message(first.value, loaded.lut_len or 0) in result.stderr


@pytest.mark.parametrize(
    ("limit", "args"),
    [
        # the Triton kernels, staged (check plans with their numpy model instead)
        ("staging.MAX_STAGED_CELLS", ["plan", "{small}", "--backend", "triton"]),
        ("reference.SCALAR_ENTRY_LIMIT", ["plan", "{dump}", "--backend", "reference"]),
    ],
)
def test_a_plan_too_large_names_the_dump(
    limit: str, args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The refusals were raised after the loader returned, so the error line named no file.
    from kvcanary_cli import api
    from kvcanary_cli.planners import reference, staging
    from kvcanary_cli.synth.scenarios import make_scenario

    dump = make_scenario("truncated-lut", seed=0).save(tmp_path / "big.safetensors")
    small = tmp_path / "small.safetensors"
    api.shrink(dump, small)
    module, name = limit.split(".")
    monkeypatch.setattr({"staging": staging, "reference": reference}[module], name, 10)
    result = CliRunner().invoke(app, [a.format(dump=dump, small=small) for a in args])
    assert result.exit_code == 2
    path = small if "{small}" in args else dump
    assert result.stderr.startswith(f"error: {path}: ") and len(result.stderr.splitlines()) == 1
