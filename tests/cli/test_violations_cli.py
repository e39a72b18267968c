"""`kvcanary violations` and `synth --log` through the CLI: rings, logs, stdin, replay,
filters, the JSON schema, and one-line errors on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvcanary_cli.canary.logs import format_violation
from kvcanary_cli.cli import app
from kvcanary_cli.results.violations import ViolationsReport
from kvcanary_cli.synth.scenarios import make_scenario
from tests.render.record_schema import validate

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("violations")
    out: dict[str, Path] = {}
    for name in ("canary-aliasing", "canary-stale-row", "canary-kv-overwritten"):
        dump, log = folder / f"{name}.safetensors", folder / f"{name}.log"
        code, _, err = run("synth", name, "--out", str(dump), "--log", str(log), "--seed", "2")
        assert code == 0, err
        out[name], out[f"{name}.log"] = dump, log
    out["clean-canary"] = make_scenario("clean-canary", seed=1).save(folder / "clean.safetensors")
    out["clean-swa"] = make_scenario("clean-swa", seed=1).save(folder / "clean-swa.safetensors")
    return out


def json_of(*args: str, stdin: str | None = None) -> tuple[int, dict[str, Any]]:
    code, out, err = run(*args, "--format", "json", stdin=stdin)
    assert code in (0, 1), err
    record = json.loads(out)
    assert validate(record, ViolationsReport) == []
    return code, record


@pytest.mark.parametrize("name", ["canary-aliasing", "canary-stale-row", "canary-kv-overwritten"])
def test_ring_log_and_replay_agree(name: str, made: dict[str, Path]) -> None:
    expected = json.loads(
        json.loads(run("inspect", str(made[name]), "--format", "json")[1])["other_metadata"][
            "kvcanary.expected_violations"
        ]
    )
    fields = [
        "kernel_kind",
        "slot_idx",
        "position",
        "stored_token",
        "expected_token",
        "stored_chain_hash",
        "expected_aux",
        "fail_reason_bits",
    ]
    code, ring = json_of("violations", str(made[name]))
    assert code == 1 and [[r[f] for f in fields] for r in ring["rows"]] == expected
    code, logged = json_of(
        "violations", str(made[f"{name}.log"]), "--dump", str(made[name]), "--replay"
    )
    rows = logged["rows"]
    assert isinstance(rows, list)
    assert [[r[f] for f in fields] for r in rows if r["origin"] == "log"] == expected
    assert logged["comparison"] == {
        "matched": len(expected),
        "observed_only": 0,
        "replayed_only": 0,
    }
    assert all(r["diagnosis"] and r["explanation"] for r in rows)
    assert {r["pump"]["step_when_pumped"] for r in rows if r["origin"] == "log"} == {1235}


def test_log_alone_has_no_diagnosis(made: dict[str, Path]) -> None:
    code, record = json_of("violations", str(made["canary-aliasing.log"]))
    assert code == 1 and record["dump"] is None
    assert all(r["diagnosis"] is None for r in record["rows"])
    assert record["slots"] == []


def test_stdin_is_a_log(made: dict[str, Path]) -> None:
    text = made["canary-aliasing.log"].read_text()
    code, record = json_of("violations", "-", "--dump", str(made["canary-aliasing"]), stdin=text)
    assert code == 1 and record["sources"][0]["path"] == "-"


def test_filters(made: dict[str, Path]) -> None:
    _, record = json_of("violations", str(made["canary-kv-overwritten"]), "--buffer", "head.k")
    assert record["rows_total"] == 0
    _, record = json_of("violations", str(made["canary-kv-overwritten"]), "--buffer", "tail.k")
    assert record["rows_total"] == 1
    _, record = json_of("violations", str(made["canary-kv-overwritten"]), "--group", "swa")
    assert record["rows_total"] == 0 and record["filters"] == {"group": "swa", "buffer": None}


def test_clean_dump_exits_0(made: dict[str, Path]) -> None:
    code, out, err = run("violations", str(made["clean-canary"]), "--replay")
    assert code == 0, err
    assert "CLEAN" in out and "no violation_ring" in out
    code, record = json_of("violations", str(made["clean-canary"]), "--replay")
    assert code == 0 and len(record["replay"]) == 8


def test_replay_without_buffers_notes_it(made: dict[str, Path]) -> None:
    code, record = json_of("violations", str(made["clean-swa"]), "--replay")
    assert code == 0 and any("no canary buffers" in n for n in record["notes"])


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_human_views(fmt: str, made: dict[str, Path]) -> None:
    code, out, _ = run(
        "violations",
        str(made["canary-aliasing.log"]),
        "--dump",
        str(made["canary-aliasing"]),
        "--replay",
        "--format",
        fmt,
        "--max-rows",
        "3",
    )
    assert code == 1 and "aliasing" in out and "5 more" in out


def test_bad_inputs_are_one_line_exit_2(made: dict[str, Path], tmp_path: Path) -> None:
    binary = tmp_path / "core"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    cases = [
        ("violations", str(binary)),
        ("violations", str(tmp_path / "missing.log")),
        ("violations", str(tmp_path)),
        ("violations", str(made["canary-aliasing.log"]), "--replay"),
        ("violations", str(made["canary-aliasing"]), "--dump", str(made["canary-stale-row"])),
        (
            "synth",
            "use-after-free",
            "--out",
            str(tmp_path / "x.safetensors"),
            "--log",
            str(tmp_path / "x.log"),
        ),
    ]
    for args in cases:
        code, out, err = run(*args)
        assert code == 2, (args, out, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "neither a dump" in run("violations", str(binary))[2]


def test_a_broken_dump_source_is_a_dump_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    code, _, err = run("violations", str(broken))
    assert code == 2 and "broken.safetensors" in err


def test_hostile_log_prints_no_control_characters(tmp_path: Path) -> None:
    row = [2, 17, 5, 1234, -1, -5, 6, 3]
    message = format_violation(row, total_violations=1, ring_overflow=False, step_when_pumped=1)
    log = tmp_path / "evil\x1b[2J.log"
    log.write_text(
        "\x1b]0;pwned\x07 kv_canary violation: launch_tag=\x1b[31m\n"
        + "x" * 200_000
        + "\n"
        + message
        + "\n"
    )
    for fmt in ("table", "markdown", "json"):
        code, out, _ = run("violations", str(log), "--format", fmt)
        assert code == 1 and "\x1b" not in out and "\x07" not in out
    _, record = json_of("violations", str(log))
    source = record["sources"][0]
    assert source["log"]["unparsed"] == 1 and source["log"]["overlong"] == 1
    assert source["path"] == str(log)  # JSON is exact; the views escape it


@pytest.mark.slow
def test_the_installed_command_reads_stdin(made: dict[str, Path]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvcanary_cli", "violations", "-", "--format", "json"],
        input=made["canary-stale-row.log"].read_text(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["rows_total"] == 2


def test_outputs_follow_the_output_rules(made: dict[str, Path], tmp_path: Path) -> None:
    dump, log = made["canary-aliasing"], made["canary-aliasing.log"]
    report = tmp_path / "rows.json"
    code, _, err = run(
        "violations", str(log), "--dump", str(dump), "-o", str(report), "--format", "json"
    )
    assert code == 1, err
    assert json.loads(report.read_text())["rows_total"] == 4
    # never over an input, never over an existing file without --force
    before = log.read_bytes()
    code, _, err = run("violations", str(log), "--dump", str(dump), "-o", str(log))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert log.read_bytes() == before
    code, _, err = run(
        "synth", "canary-aliasing", "--out", str(tmp_path / "d.safetensors"), "--log", str(report)
    )
    assert code == 2 and "--force" in err, err
    code, _, err = run(
        "synth",
        "canary-aliasing",
        "--out",
        str(tmp_path / "e.safetensors"),
        "--log",
        str(tmp_path / "e.safetensors"),
    )
    assert code == 2 and "--log" in err, err


@pytest.mark.slow
def test_standard_inputs_file_is_never_replaced(made: dict[str, Path], tmp_path: Path) -> None:
    """`violations - -o LOG --force < LOG` is `violations LOG -o LOG`: refused, LOG intact."""
    log = tmp_path / "server.log"
    log.write_bytes(made["canary-aliasing.log"].read_bytes())
    with log.open("rb") as stdin:
        done = subprocess.run(
            [sys.executable, "-m", "kvcanary_cli", "violations", "-", "-o", str(log), "--force"],
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"error: {log}: is an input of this command; refusing to overwrite it "
        "(write to another path)"
    ]
    assert log.read_bytes() == made["canary-aliasing.log"].read_bytes()


@pytest.mark.parametrize("spelling", ["absolute", "dot-slash", "through-a-link"])
def test_synth_never_writes_its_log_over_its_dump(
    spelling: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--log` naming the dump's own file, however spelled, is refused before anything is
    written (with --force too)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to(tmp_path)
    log = {
        "absolute": str(tmp_path / "syn.st"),
        "dot-slash": "./syn.st",
        "through-a-link": str(tmp_path / "link" / "syn.st"),
    }[spelling]
    code, _, err = run("synth", "canary-aliasing", "--out", "syn.st", "--log", log, "--force")
    assert code == 2 and err.startswith("error: --log: names the dump's own file"), err
    assert not (tmp_path / "syn.st").exists()
    (tmp_path / "syn.st").write_bytes(b"an earlier dump")
    code, _, err = run("synth", "canary-aliasing", "--out", "syn.st", "--log", log, "--force")
    assert code == 2 and (tmp_path / "syn.st").read_bytes() == b"an earlier dump"


def test_a_file_named_twice_is_read_once(made: dict[str, Path], tmp_path: Path) -> None:
    # `violations D D` counted the same ring twice (and a log named twice, its rows twice).
    dump, log = made["canary-aliasing"], made["canary-aliasing.log"]
    link = tmp_path / "link.safetensors"
    link.symlink_to(dump)
    _, once = json_of("violations", str(dump))
    for again in (str(dump), str(link), f"{dump.parent}/./{dump.name}"):
        _, twice = json_of("violations", str(dump), again)
        assert twice["rows"] == once["rows"]
        assert [s["rows"] for s in twice["sources"]] == [len(once["rows"]), 0]
        assert "the same file as SOURCE 1" in twice["sources"][1]["notes"][0]
    _, logged = json_of("violations", str(log), "--dump", str(dump))
    _, logged_twice = json_of("violations", str(log), str(log), "--dump", str(dump))
    assert len(logged_twice["rows"]) == len(logged["rows"]) > 0


def test_a_violation_slot_beyond_the_pool_is_not_in_use(tmp_path: Path) -> None:
    """The explanation's allocator state says what provenance says: a slot the allocator never
    hands out is beyond the pool, not in use."""

    state = make_scenario("canary-aliasing", seed=0)
    pool = int(state.metadata["num_full_slots"])
    state.tensors["violation_ring"][0, 1] = pool + 5  # the first row names a slot past the pool
    path = state.save(tmp_path / "beyond.safetensors")
    result = CliRunner().invoke(app, ["violations", str(path), "--format", "json"])
    rows = json.loads(result.stdout)["rows"]
    states = {row["slot_idx"]: row["explanation"]["allocator"] for row in rows}
    assert states[pool + 5] == "beyond the pool"
    assert set(states.values()) - {"beyond the pool"} <= {"free", "in use"}


def test_a_violation_slot_below_the_pool_is_not_beyond_it(tmp_path: Path) -> None:
    state = make_scenario("canary-aliasing", seed=0)
    state.tensors["violation_ring"][0, 1] = -4  # the first row names a negative slot
    path = state.save(tmp_path / "below.safetensors")
    result = CliRunner().invoke(app, ["violations", str(path), "--format", "json"])
    rows = json.loads(result.stdout)["rows"]
    states = {row["slot_idx"]: row["explanation"]["allocator"] for row in rows}
    assert states[-4] == "below the pool (negative)"
    assert set(states.values()) - {"below the pool (negative)"} <= {"free", "in use"}


# --- violation lines cut short (issue 36, class 11) -----------------------------------------


def _cut_log(tmp_path: Path, lines: list[str]) -> Path:
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")
    return log


_STRUCTURED_LINE = (
    "[2025-06-01 12:00:00 TP0] kv_canary violation: launch_tag=TAIL_K_FULL "
    "fail_reason=verify_position slot_idx=5 position=3 stored_token=7 expected_token=7 "
    "stored_chain_hash=0x000000000000000b expected_aux=0x000000000000000c"
)


@pytest.mark.parametrize("keep", [len("[2025-06-01 12:00:00 TP0] kv_canary v"), 120, -1])
def test_a_violation_line_cut_short_is_never_clean(tmp_path: Path, keep: int) -> None:
    """A log collector cut the line at its limit: no row is readable, but a violation was
    logged; the verdict says so and exits 1, in every format."""
    log = _cut_log(tmp_path, ["Decode batch. #running-req: 4", _STRUCTURED_LINE[:keep]])
    code, out, _ = run("violations", str(log))
    assert code == 1, out
    assert "CLEAN" not in out and "UNREADABLE: 1 violation logged" in out
    record = json.loads(run("violations", str(log), "--format", "json")[1])
    assert record["verdict"] == "unreadable" and record["unread_violations"] == 1
    assert record["sources"][0]["log"]["unread_violations"] == 1
    code, out, _ = run("violations", str(log), "--format", "markdown")
    assert code == 1 and "violations: unreadable" in out


def test_a_complete_or_recovered_violation_is_not_unread(tmp_path: Path) -> None:
    """Clean twins: the whole line is a row; a cut structured line followed by its whole
    message is read from the message (one row, nothing unread); ordinary canary lines and a
    log without violations stay clean."""
    whole = json.loads(
        run("violations", str(_cut_log(tmp_path, [_STRUCTURED_LINE])), "-f", "json")[1]
    )
    assert whole["verdict"] == "violations" and whole["unread_violations"] == 0
    message = [
        "KV cache canary violation detected (kernel_kind=TAIL_K_FULL, slot_idx=5, position=3)",
        "canary_kind:       per_forward_tail_k_full",
        "  fail_reasons: verify_position",
        "  stored:   token_id=7   position=3 prev_hash=0x000000000000000b",
        "  expected: prev_hash=0x000000000000000c",
        "  total_violations=1 ring_overflow=False step_when_pumped=9",
    ]
    code, out, _ = run(
        "violations", str(_cut_log(tmp_path, [_STRUCTURED_LINE[:90], *message])), "-f", "json"
    )
    record = json.loads(out)
    assert code == 1 and record["rows_total"] == 1
    assert record["unread_violations"] == 0 and record["verdict"] == "violations"
    quiet = _cut_log(
        tmp_path,
        [
            "[canary] step=9 protected_tokens=4096 sweep_passes=0 violations=0",
            "kv_canary enabled: 12 launch tags",
            "Decode batch. #running-req: 4",
        ],
    )
    code, out, _ = run("violations", str(quiet))
    assert code == 0 and "CLEAN: no violation rows" in out
