"""The command line's own surface: `--version`, `kvcanary` alone, choice options, and the
one-line error for every kind of usage error (exit 2, never click's usage block)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcanary_cli import __version__
from kvcanary_cli.cli import app
from kvcanary_cli.planners import BACKENDS, KERNELS, PlannerChoice

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clean-swa.safetensors"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_version_prints_the_version_and_exits_0() -> None:
    code, out, err = run("--version")
    assert (code, out, err) == (0, f"kvcanary {__version__}\n", "")


def test_version_from_the_installed_entry_point() -> None:
    """`python -m kvcanary_cli --version`: the process a user runs, not the test runner."""
    done = subprocess.run(
        [sys.executable, "-m", "kvcanary_cli", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"kvcanary {__version__}\n", "")


def test_version_wins_over_a_command() -> None:
    """Eager: answered before the command's own arguments are looked at."""
    code, out, _ = run("--version", "check")
    assert (code, out) == (0, f"kvcanary {__version__}\n")


def test_kvcanary_alone_shows_the_help_on_stderr_and_exits_2() -> None:
    code, out, err = run()
    assert code == 2 and out == ""
    assert err.startswith("Usage: kvcanary") and "Commands" in err and "--version" in err


def test_help_exits_0() -> None:
    code, out, _ = run("--help")
    assert code == 0 and out.startswith("Usage: kvcanary")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["nosuch"], "No such command 'nosuch'"),
        (["check", "--nosuch", str(EXAMPLE)], "No such option: --nosuch"),
        (["check"], "Missing argument 'DUMP'"),
        (["check", "--max-rows", "0", str(EXAMPLE)], "'--max-rows'"),
        (["provenance", str(EXAMPLE), "--slot", "x"], "'--slot'"),
        (["check", "--format", "yaml", str(EXAMPLE)], "'yaml' is not one of table, json, markdown"),
        (["check", "--fail-on", "fatal", str(EXAMPLE)], "'fatal' is not one of error, warning"),
        # -o is a report's file; a command with none names the flag it writes with
        (["synth", "clean-decode", "-o", "x"], "No such option: -o; this command writes its file"),
        (["shrink", str(EXAMPLE), "-o", "x"], "-o; this command writes its file with --out"),
        (["inspect", str(EXAMPLE), "-x"], "No such option: -x ("),  # no hint beside another
    ],
)
def test_a_usage_error_is_one_line_naming_the_help(args: list[str], says: str) -> None:
    code, out, err = run(*args)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith("error: ") and says in lines[0], lines[0]
    assert lines[0].endswith("--help')") and "Traceback" not in err


def test_one_planner_choice_two_options() -> None:
    """`--kernel` and `--backend` take subsets of one enum: each refuses the other's extra."""
    assert set(BACKENDS) | set(KERNELS) == set(PlannerChoice)
    code, _, err = run("check", "--kernel", "reference", str(EXAMPLE))
    assert code == 2 and "'reference' is not one of triton, vectorized, sglang, none" in err
    code, _, err = run("plan", str(EXAMPLE), "--backend", "none")
    assert code == 2 and "'none' is not one of reference, vectorized, triton, sglang" in err


@pytest.mark.parametrize(
    "kernel", [k for k in KERNELS if k is not PlannerChoice.SGLANG]
)  # sglang: tests/planners/test_sglang_planner.py, with a stand-in SGLang
def test_every_kernel_choice_is_accepted(kernel: PlannerChoice) -> None:
    code, _, err = run("check", "--kernel", kernel.value, "-q", str(EXAMPLE))
    assert code == 0, err


def test_buffer_takes_every_canary_buffer() -> None:
    """`--buffer`'s choices (`option_values.BUFFER_CHOICES`, in the order help lists them) are
    the canary's buffers, all of them."""
    from kvcanary_cli.canary.constants import BUFFERS
    from kvcanary_cli.option_values import BUFFER_CHOICES

    assert sorted(BUFFER_CHOICES) == sorted(BUFFERS)
    code, _, err = run("violations", str(EXAMPLE), "--buffer", "x")
    assert code == 2 and f"'x' is not one of {', '.join(BUFFER_CHOICES)}" in err


def test_the_api_refuses_a_planner_outside_its_subset() -> None:
    from kvcanary_cli.errors import OptionError
    from kvcanary_cli.planners import make_kernel, make_planner

    with pytest.raises(OptionError, match="^kernel: "):
        make_kernel(PlannerChoice.REFERENCE)
    with pytest.raises(OptionError, match="^backend: "):
        make_planner("none")


def test_a_command_line_typer_cannot_build_is_an_internal_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A declaration typer refuses (a bug, maybe a newer typer) is one line and exit 3, not a
    traceback that exits 1 and reads as "findings"."""
    import typer.main

    from kvcanary_cli.cli import main

    def refuse(app: object) -> None:
        raise TypeError("parser= is not supported here")

    monkeypatch.setattr(typer.main, "get_command", refuse)
    monkeypatch.delenv("KVCANARY_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    err = capsys.readouterr().err
    assert exited.value.code == 3 and "Traceback" not in err
    assert err.startswith("internal error: TypeError: parser= is not supported here")


@pytest.mark.parametrize(
    ("words", "offered"),
    [
        ("kvcanary check --format ", ["table", "json", "markdown"]),
        ("kvcanary check --kernel v", ["vectorized"]),
        ("kvcanary plan --backend ", ["reference", "vectorized", "triton", "sglang"]),
    ],
)
def test_a_shell_completes_a_choice_option(words: str, offered: list[str]) -> None:
    env = {
        "_KVCANARY_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split(" ")) - 1),
    }
    result = CliRunner().invoke(app, [], env=env, prog_name="kvcanary")
    assert result.stdout.split() == offered


@pytest.mark.parametrize(
    ("args", "call", "option"),
    [
        (["synth", "clean-swa", "--out", "x.safetensors", "--seed", "-1"], {"seed": -1}, "seed"),
        (["synth", "clean", "--steps", "65", "--out", "d"], {"steps": 65}, "steps"),
        (["synth", "clean-swa", "--out", "x", "--page-size", "0"], {"page_size": 0}, "page_size"),
    ],
)
def test_the_command_line_and_the_api_refuse_a_value_in_the_same_words(
    args: list[str], call: dict[str, int], option: str, tmp_path: Path
) -> None:
    """One declaration of each bound (`option_values.Bounds`): the option parser and the API
    refuse the same values, in the same words (the API naming its keyword)."""
    from kvcanary_cli import api
    from kvcanary_cli.errors import OptionError

    code, _, err = run(*args)
    with pytest.raises(OptionError) as caught:
        api.synth("clean-swa", tmp_path / "x.safetensors", **call)  # type: ignore[arg-type]
    assert code == 2 and f": {caught.value.message} (see 'kvcanary synth --help')" in err, err
    assert caught.value.option == option


def test_the_exit_code_is_computed_without_printing(capsys: pytest.CaptureFixture[str]) -> None:
    """`exit_code` only computes: `check` itself prints each unreadable dump's error line.
    The two dumps are checked in this process (`-j 1`): the workers' path of an unreadable
    dump among others is tests/cli/test_readability.py's."""
    from kvcanary_cli import api
    from kvcanary_cli.cli_app import ExitCode, exit_code

    report = api.check([EXAMPLE, EXAMPLE.with_name("no-such.safetensors")], kernel="none", jobs=1)
    capsys.readouterr()
    assert exit_code(report) is ExitCode.BAD_INPUT
    assert capsys.readouterr() == ("", "")
    code, _, err = run("check", "-k", "none", "-j", "1", "-q", str(EXAMPLE), "no-such.safetensors")
    assert code == 2 and err.splitlines() == ["error: no-such.safetensors: no such file"]
