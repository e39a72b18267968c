"""The command line as a new user meets it (issue 44): whole summaries in `kvcanary --help`,
one meaning per flag (`-o` the report, one `--max-rows` default), metavars rather than Python
types, the scalar overrides as one `--set NAME=VALUE` option, and flag names only at the edge
(an error from below names what was wrong; the command line says which flag)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from kvcanary_cli.cli import app
from kvcanary_cli.dump.schema import SCALARS

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clean-swa.safetensors"
TRUNCATED = EXAMPLE.with_name("truncated-lut.safetensors")
COMMANDS: dict[str, Any] = typer.main.get_command(app).commands  # type: ignore[attr-defined]


def run(*args: str, columns: int = 80) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})
    return result.exit_code, result.stdout, result.stderr


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_the_top_level_help_gives_each_summary_whole(columns: int) -> None:
    """click cuts a summary longer than the column with "...": each command's first
    paragraph is shown whole, wrapped, at any width."""
    code, out, _ = run("--help", columns=columns)
    commands = out.partition("\nCommands:\n")[2]
    assert code == 0 and commands and "..." not in commands, out
    for command in COMMANDS.values():
        first = _words((command.help or "").split("\n\n")[0])
        assert first and first in _words(out), (command.name, first)


def test_every_short_o_is_the_report_file() -> None:
    """`-o` is `--output FILE`, the report, in every command that has one; and every command
    that renders a report (`--format`) has it. Dumps and folders a command writes: `--out`."""
    for name, command in COMMANDS.items():
        options = {o: p for p in command.params for o in p.opts}
        if "-o" in options:
            assert options["-o"].opts == ["--output", "-o"], name
        if "--format" in options:
            assert "-o" in options, name
        if "--out" in options:
            assert options["--out"].opts == ["--out"], name


def test_one_max_rows_default() -> None:
    defaults = {
        name: p.default
        for name, command in COMMANDS.items()
        for p in command.params
        if "--max-rows" in p.opts
    }
    assert len(defaults) >= 5 and len(set(defaults.values())) == 1, defaults


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_shows_metavars_not_python_types(name: str) -> None:
    code, out, _ = run(name, "--help", columns=200)
    assert code == 0
    types = re.findall(r"<[A-Za-z_]+(?:\[[^\]]*\])?>", out)
    assert not types, (name, types)


# --- the scalar overrides: one option, `--set NAME=VALUE` --------------------------------------


@pytest.mark.parametrize("name", ["check", "provenance", "violations", "plan", "shrink"])
def test_a_command_that_reads_a_dump_takes_set_and_no_option_per_scalar(name: str) -> None:
    options = [o for p in COMMANDS[name].params for o in p.opts]
    assert "--set" in options
    assert (
        not {o for o in options if o.lstrip("-").replace("-", "_") in SCALARS} - {"--page-size"}
        and "--page-size" not in options
    ), options
    _, out, _ = run(name, "--help", columns=100)
    assert all(scalar in out for scalar in SCALARS), out


def test_set_overrides_a_scalar() -> None:
    """The same override `--num-full-slots 9` gave: the pool size is a fact, not derived."""
    code, out, err = run(
        "check", str(TRUNCATED), "-k", "vectorized", "-f", "json", "--set", "num_full_slots=9"
    )
    assert code == 1, err
    [dump] = json.loads(out)["dumps"]
    assert {s["name"]: s["origin"] for s in dump["scalars"]}["num_full_slots"] == "overridden"
    code, out, _ = run(
        "check", str(TRUNCATED), "-k", "none", "-f", "json",
        "--set", "page_size=1", "--set", "verify_capacity=64",
    )  # fmt: skip
    [dump] = json.loads(out)["dumps"]
    origins = {s["name"]: s["origin"] for s in dump["scalars"]}
    assert origins["page_size"] == origins["verify_capacity"] == "overridden"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("page_size=0", "page_size: 0 is below 1 (1 to 2^31-1)"),
        ("swa_window_size=" + str(1 << 41), f"swa_window_size: {1 << 41} is above 2^40"),
        ("nosuch=1", "'nosuch' is not one of " + ", ".join(SCALARS)),
        ("page_size", "'page_size' is not NAME=VALUE"),
        ("page_size=x", "page_size: 'x' is not an integer"),
    ],
)
def test_a_bad_set_is_one_line_exit_2(value: str, says: str) -> None:
    code, out, err = run("check", "-k", "none", str(EXAMPLE), "--set", value)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith("error: Invalid value for '--set'") and says in lines[0], lines[0]


def test_a_scalar_given_twice_is_refused() -> None:
    code, _, err = run("check", str(EXAMPLE), "--set", "page_size=1", "--set", "page_size=2")
    assert code == 2 and "error: --set: page_size is given twice" in err, err


def test_a_scalar_set_on_a_vllm_dump_names_the_flag(tmp_path: Path) -> None:
    from kvcanary_cli import api

    api.synth("vllm-clean", tmp_path / "v.safetensors")
    small = tmp_path / "small.safetensors"
    code, _, err = run(
        "shrink", str(tmp_path / "v.safetensors"), "--out", str(small), "--set", "page_size=4"
    )
    assert code == 2 and err.startswith("error: --set: a block-pool (vLLM) dump has no"), err


# --- flag names at the edge --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "call", "keyword", "flag"),
    [
        (["synth", "clean-decode", "--log", "{tmp}/x.log", "--out", "{tmp}/x.st"],
         {"log": "x.log"}, "log", "--log"),
        (["synth", "truncated-lut", "--steps", "3", "--out", "{tmp}/d"], {"steps": 3},
         "scenario", "SCENARIO"),
        (["synth", "clean", "--steps", "3", "--every", "2", "--at", "9", "--out", "{tmp}/d"],
         {"steps": 3, "every": 2, "at": 9}, "at", "--at"),
    ],
)  # fmt: skip
def test_an_error_from_below_names_the_keyword_and_the_edge_the_flag(
    args: list[str], call: dict[str, object], keyword: str, flag: str, tmp_path: Path
) -> None:
    from kvcanary_cli import api
    from kvcanary_cli.errors import OptionError

    code, _, err = run(*(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    with pytest.raises(OptionError) as caught:
        api.synth(args[1], tmp_path / "y", **call)  # type: ignore[arg-type]
    assert caught.value.option == keyword and f"error: {flag}: {caught.value.message}" in err


def test_a_scalar_out_of_range_in_the_api_names_the_scalar() -> None:
    from kvcanary_cli import api
    from kvcanary_cli.errors import OptionError

    with pytest.raises(OptionError) as caught:
        api.provenance(EXAMPLE, slot=1, overrides={"verify_capacity": 1 << 31})
    assert caught.value.option == "verify_capacity"
    assert str(caught.value).startswith("verify_capacity: ")


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--hicache-storage"], "--hicache-storage"),
        (["--layout", "mamba", "--page-size", "4"], "--page-size"),
    ],
)
def test_a_soak_refusal_names_the_flag_as_the_command_line_spells_it(
    args: list[str], flag: str
) -> None:
    """soak's refusals before it loads SGLang name their option by its API keyword, which
    the edge turns into the flag (a keyword spelled with dashes passed through as it was:
    `page-size: ...` rather than `--page-size: ...`)."""
    code, _, err = run("soak", *args, "--steps", "5")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {flag}: "), err


def test_soaks_help_lists_its_options_under_headings_the_rest_last() -> None:
    """soak's twenty options under what they choose (the engine and its memory, the server's
    options, the workload), each once, the report's options last; every other command keeps
    one "Options" list."""
    code, out, _ = run("soak", "--help", columns=100)
    headings = re.findall(r"^(\w[\w ]*):$", out, re.M)
    assert code == 0 and headings == [
        "Engine and memory layout",
        "Server options",
        "Workload",
        "Options",
    ], headings
    sections = dict(zip(headings, re.split(r"^\w[\w ]*:$", out, flags=re.M)[1:], strict=True))
    for heading, flags in (
        ("Engine and memory layout", ["--engine", "--sglang-tree", "--vllm-tree", "--layout"]),
        ("Server options", ["--overlap", "--tp", "--hicache", "--session-radix-cache"]),
        ("Workload", ["--steps", "--seed", "--fault", "--replay"]),
        ("Options", ["--out", "--format", "--output", "--help"]),
    ):
        assert all(re.search(rf"^\s+(-\w, )?{flag}\b", sections[heading], re.M) for flag in flags)
    listed = re.findall(r"^\s+(?:-\w, )?(--[\w-]+)", "".join(sections.values()), re.M)
    assert len(listed) == len(set(listed)) == len(COMMANDS["soak"].params) + 1, listed  # --help
    for name in sorted(set(COMMANDS) - {"soak"}):
        _, other, _ = run(name, "--help", columns=100)
        assert re.findall(r"^(\w[\w ]*):$", other, re.M) in (["Options"], ["Arguments", "Options"])


#: Text a user may give any parameter: the values typer and kvcanary's coercion must make alike.
_GIVEN = ["examples/x.safetensors", "-", "", "7", "0", "true", "no", "vectorized", "page_size=16"]


def _made(coercion: Any, value: Any, param: Any, ctx: Any) -> tuple[str, Any]:
    try:
        return "value", coercion.coerce(value, param=param, ctx=ctx)
    except typer.BadParameter as exc:
        return "refused", exc.format_message()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_parameter_is_made_as_typers_own_adapter_makes_it(name: str, tmp_path: Path) -> None:
    """kvcanary makes its parameters' values without pydantic (cli_app._Coercion); for every
    parameter it does, on every text `_GIVEN` (alone, and as a list where it takes several),
    the value or refusal is typer's own (its pydantic adapter, built here)."""
    coercion = pytest.importorskip("typer._coercion")
    command = COMMANDS[name]
    ctx = command.make_context(name, ["--help"], resilient_parsing=True)
    unreadable = tmp_path / "unreadable"
    unreadable.write_text("")
    unreadable.chmod(0)
    given = [*_GIVEN, str(unreadable)]
    compared = 0
    for param in command.get_params(ctx):
        ours = getattr(param, "_runtime_param", None)
        if ours is None or not hasattr(param, "type_descriptor"):
            continue
        typers = coercion.build_runtime_param(param.type_descriptor)
        many = param.multiple or param.nargs == -1
        for text in given:
            value = [text, text] if many else text
            assert _made(ours, value, param, ctx) == _made(typers, value, param, ctx), (
                param.name,
                text,
            )
            compared += 1
        assert _made(ours, None, param, ctx) == _made(typers, None, param, ctx), param.name
    assert compared >= len(given)
