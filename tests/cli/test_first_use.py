"""What a new user meets first: the mistakes a first session makes (a misspelt scenario, an
SGLang option on a vLLM dump, a folder for a file, `--quiet` with JSON), each one error line
naming the flag or file and the fix, exit 2; and their clean twins, which still run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from kvcanary_cli.cli import app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SGLANG_DUMP = EXAMPLES / "clean-swa.safetensors"


def run(*args: object) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def refused(*args: object) -> str:
    """The one error line of a refused command line (exit 2, nothing on stdout)."""
    result = run(*args)
    assert result.exit_code == 2 and result.stdout == "", (result.exit_code, result.stdout)
    [line] = result.stderr.splitlines()
    assert line.startswith("error: ") and "Traceback" not in result.stderr
    return line


@pytest.fixture(scope="module")
def vllm_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("vllm") / "double-free.safetensors"
    assert run("synth", "vllm-double-free", "--out", path).exit_code == 0
    return path


# -- synth: scenario names and their options


def test_a_misspelt_scenario_gets_the_closest_names() -> None:
    line = refused("synth", "clean-deocde", "--out", "x.safetensors")
    assert "unknown scenario 'clean-deocde'" in line and "did you mean clean-decode?" in line
    line = refused("synth", "vllm-clen", "--out", "x.safetensors")  # vLLM's names too
    assert "did you mean vllm-clean" in line
    line = refused("synth", "use-after-fre", "--steps", 3, "--out", "d")
    assert line.count("use-after-free") == 2  # the sequence and the canary scenario, once each
    assert "did you mean" not in refused("synth", "zzz", "--out", "x.safetensors")


def test_a_sequence_without_steps_and_a_scenario_with_them_say_so(tmp_path: Path) -> None:
    line = refused("synth", "prefix-rewritten", "--out", tmp_path / "x.safetensors")
    assert line.endswith("prefix-rewritten is a sequence (add --steps K and --out a folder)")
    line = refused("synth", "clean-decode", "--steps", 3, "--out", tmp_path / "d")
    assert line.endswith("clean-decode is a one-dump scenario (drop --steps)")
    assert not list(tmp_path.iterdir())
    # the twins: each name where it belongs is written
    assert run("synth", "clean-decode", "--out", tmp_path / "x.safetensors").exit_code == 0
    done = run("synth", "prefix-rewritten", "--steps", 3, "--out", tmp_path / "d")
    assert done.exit_code == 0, done.stderr


def test_a_sequence_of_one_step_apart_says_every_step(tmp_path: Path) -> None:
    every = run("synth", "clean", "--steps", 2, "--out", tmp_path / "a").stdout
    assert "one every step)" in every and "1 step" not in every
    assert (
        "one every 2 steps)"
        in run("synth", "clean", "--steps", 2, "--every", 2, "--out", tmp_path / "b").stdout
    )


def test_a_vllm_scenario_names_the_sglang_flags_to_drop(tmp_path: Path) -> None:
    line = refused("synth", "vllm-clean", "--steps", 3, "--page-size", 4, "--out", tmp_path)
    assert line.startswith("error: --page-size/--steps: vllm-clean is a vLLM scenario")
    assert line.endswith("(drop --page-size, --steps)") and "[" not in line  # no Python list
    assert refused("synth", "vllm-clean") == "error: --out: give the dump's file (--out DUMP)"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["synth", "clean-decode", "--size", "huge", "--out", "x"], "tiny, small, medium, large"),
        (["synth", "vllm-clean", "--size", "huge", "--out", "x"], "tiny, small, medium, large"),
        (["synth", "clean", "--steps", 3, "--size", "huge", "--out", "x"], "tiny, small, medium"),
        (["selftest", "--size", "huge"], "tiny, small"),
        (["soak", "--layout", "huge"], "swa, unified, mamba, mamba-extra"),
        (["soak", "--engine", "huge"], "sglang, vllm"),
    ],
)
def test_every_choice_is_refused_in_the_same_words(args: list[object], says: str) -> None:
    """As click refuses `--format jsn`: `'jsn' is not one of table, json, markdown`."""
    line = refused(*args)
    assert line.endswith(f"'huge' is not one of {says}"), line


# -- SGLang's options on a vLLM dump


def test_check_refuses_sglang_scalars_and_groups_on_a_vllm_dump(vllm_dump: Path) -> None:
    line = refused("check", vllm_dump, "--set", "page_size=4")
    assert line == "error: --set: a block-pool (vLLM) dump has no SGLang scalars to set"
    line = refused("check", vllm_dump, "--group", "swa")
    assert line.startswith("error: --group: a block-pool (vLLM) dump is checked whole")
    # the twin: the default group and no --set check it
    assert run("check", vllm_dump, "--group", "all").exit_code == 1


def test_provenance_block_refuses_the_slot_options(vllm_dump: Path) -> None:
    line = refused("provenance", vllm_dump, "--block", 3, "--space", "swa", "--positions", "1:3")
    assert line == (
        "error: --space/--positions: go with --slot or --row (an SGLang dump), not with --block"
    )
    assert refused("provenance", vllm_dump, "--block", 3, "-g", "full").startswith(
        "error: --group: goes with"
    )
    assert refused("provenance", vllm_dump, "--block", 3, "--set", "page_size=4").startswith(
        "error: --set: a block-pool (vLLM) dump"
    )
    assert run("provenance", vllm_dump, "--block", 3).exit_code == 0


@pytest.mark.parametrize("flag", ["--slot", "--row"])
def test_provenance_of_a_slot_on_a_vllm_dump_points_to_block(vllm_dump: Path, flag: str) -> None:
    line = refused("provenance", vllm_dump, flag, 3)
    assert line == (
        f"error: {flag}: {vllm_dump} is a vLLM dump: it holds blocks, not slots or pool rows "
        "(trace a block with --block N)"
    )
    many = refused("provenance", SGLANG_DUMP, vllm_dump, "--slot", 3)  # over several dumps too
    assert f"{vllm_dump} is a vLLM dump" in many
    assert "--block N" in refused("provenance", SGLANG_DUMP)  # neither option: all three named


@pytest.mark.parametrize("command", [["provenance", "--slot", "3"], ["check"], ["plan"]])
def test_a_dump_of_an_engine_kvcanary_does_not_read_is_never_called_vllm(
    tmp_path: Path, command: list[str]
) -> None:
    """Only a block-pool engine's dump is pointed to `--block` or the commands that read it;
    an unknown engine's is said to be unknown, in every command."""
    import numpy as np
    from safetensors.numpy import save_file

    path = tmp_path / "other.safetensors"
    save_file({"x": np.zeros(3, dtype=np.int64)}, str(path), {"kvcanary.engine": "other"})
    result = run(command[0], path, *command[1:])
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    line = result.stderr.splitlines()[-1]
    assert "engine 'other' is not one kvcanary reads" in line, line
    assert "vLLM" not in line and "--block" not in line


def test_an_sglang_only_command_names_the_engine_as_people_write_it(vllm_dump: Path) -> None:
    line = refused("plan", vllm_dump)
    assert "a vLLM dump: this command reads SGLang dumps only" in line
    assert line.endswith("`timeline`, `diff` and `shrink` read vLLM dumps)")


# -- files: missing, a folder, the same words everywhere


@pytest.mark.parametrize(
    "args",
    [
        ["check", "{missing}"],
        ["violations", "{missing}"],
        ["leak", "--sglang-log", "{missing}"],
        ["soak", "--replay", "{missing}"],
    ],
)
def test_a_missing_input_is_no_such_file_in_every_command(tmp_path: Path, args: list[str]) -> None:
    missing = tmp_path / "missing.log"
    line = refused(*(a.format(missing=missing) for a in args))
    assert line.startswith(f"error: {missing}: no such file"), line


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["check", "{dir}"], "a dump"),
        (["violations", "{dir}"], "a dump or a server log"),
        (["leak", "--sglang-log", "{dir}"], "a server log"),
        (["soak", "--replay", "{dir}"], "a soak reproducer"),
    ],
)
def test_a_folder_given_as_input_says_what_was_wanted(
    tmp_path: Path, args: list[str], what: str
) -> None:
    line = refused(*(a.format(dir=tmp_path) for a in args))
    assert line.startswith(f"error: {tmp_path}: is a directory, not {what}"), line


@pytest.mark.parametrize(
    "args",
    [
        ["check", str(SGLANG_DUMP), "-o", "{dir}"],
        ["synth", "clean-decode", "--out", "{dir}"],
        ["plan", str(SGLANG_DUMP), "--out", "{dir}"],
    ],
)
def test_a_folder_given_as_output_asks_for_a_file_in_it(tmp_path: Path, args: list[str]) -> None:
    line = refused(*(a.format(dir=tmp_path) for a in args))
    assert line == (
        f"error: {tmp_path}: is a directory; refusing to replace it "
        f"(name a file in it: {tmp_path / 'NAME'})"
    )


def test_ranks_of_one_dump_names_the_argument() -> None:
    line = refused("ranks", SGLANG_DUMP)
    assert line == "error: DUMP: give two dumps or more, of one step (one per rank)"


# -- --quiet and JSON


def test_quiet_json_is_refused_and_json_alone_has_the_verdict() -> None:
    line = refused("check", SGLANG_DUMP, "-q", "-f", "json")
    assert line.startswith("error: --quiet/--format: --quiet prints verdict lines, not JSON")
    record = json.loads(run("check", SGLANG_DUMP, "-k", "none", "-f", "json").stdout)
    assert record["verdict"] == "clean"
    quiet = run("check", SGLANG_DUMP, "-k", "none", "-q")
    assert quiet.exit_code == 0 and quiet.stdout.startswith("CLEAN: ")


# -- one command, one name for a thing in every format


def test_violation_reasons_read_the_same_in_the_table_and_markdown(tmp_path: Path) -> None:
    dump, log = tmp_path / "c.safetensors", tmp_path / "c.log"
    assert run("synth", "canary-aliasing", "--out", dump, "--log", log).exit_code == 0
    for fmt in ("table", "markdown"):
        args = ["violations", str(log), "-f", fmt, "--max-rows", "1"]
        shown = CliRunner().invoke(app, args, env={"COLUMNS": "300"}).stdout  # no wrapping
        assert "chain_hash, position, token" in shown, fmt
        assert "verify_chain_hash" not in shown, fmt


def test_ranks_without_a_recorded_step_says_so_in_plain_words(tmp_path: Path) -> None:
    copy = tmp_path / "rank1.safetensors"
    copy.write_bytes(SGLANG_DUMP.read_bytes())
    first = run("ranks", SGLANG_DUMP, copy).stdout.splitlines()[0]
    assert first.startswith("2 dumps (no step recorded, model "), first
    assert "of no step" not in first
