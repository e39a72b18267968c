"""`kvcanary check` and `provenance` through the CLI: exit codes, parsed JSON, several dumps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcanary_cli.cli import app
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.results.provenance import ProvenanceReport
from kvcanary_cli.synth.scenarios import SCENARIOS, make_scenario
from tests.lanes import deep_repeats
from tests.render.record_schema import validate

runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("dumps")
    out = {}
    for name in ("clean-swa", "truncated-lut", "capacity-overflow", "cross-request-aliasing"):
        out[name] = make_scenario(name, seed=2).save(folder / f"{name}.safetensors")
    return out


def test_clean_dump_exits_0(dumps: dict[str, Path]) -> None:
    code, out, err = run("check", str(dumps["clean-swa"]), "--kernel", "vectorized")
    assert code == 0, err
    assert "CLEAN" in out.upper()


def test_findings_exit_1_and_json_validates(dumps: dict[str, Path]) -> None:
    code, out, _ = run(
        "check", str(dumps["truncated-lut"]), "--kernel", "vectorized", "--format", "json"
    )
    assert code == 1
    record = json.loads(out)
    assert validate(record, CheckReport) == []
    assert record["verdict"] == "findings"
    findings = record["dumps"][0]["findings"]
    cells = [f for f in findings if f["code"] == "lut-out-of-range"]
    assert cells and {f["code"] for f in findings} == {
        "lut-out-of-range",
        "lut-shorter-than-pool",
        "lut-sentinel-missing",
    }
    for finding in cells:
        assert finding["space"] == "full" and finding["group"] == "swa"
        assert finding["provenance"] and finding["provenance"][0]["cells"], finding
    assert sum(f["first_raise"] for f in findings) == 1
    assert {f["cause"] for f in findings} == {"lut-too-short"}


def test_warnings_exit_0_unless_fail_on_warning(dumps: dict[str, Path]) -> None:
    assert run("check", str(dumps["capacity-overflow"]), "--kernel", "vectorized")[0] == 0
    code, _, _ = run(
        "check", str(dumps["capacity-overflow"]), "--kernel", "vectorized", "--fail-on", "warning"
    )
    assert code == 1


@pytest.mark.parametrize(
    "args",
    [
        ("check", "missing.safetensors"),
        ("check", "{clean}", "--kernel", "cuda"),
        ("check", "{clean}", "--format", "xml"),
        ("check", "{clean}", "--fail-on", "fatal"),
        ("check", "{clean}", "--group", "nope"),
        ("provenance", "{clean}"),
        ("provenance", "{clean}", "--slot", "3", "--row", "2"),
        ("provenance", "{clean}", "--row", "99999"),
    ],
)
def test_bad_input_and_usage_exit_2_with_one_line(
    dumps: dict[str, Path], args: tuple[str, ...]
) -> None:
    argv = [a.format(clean=dumps["clean-swa"]) for a in args]
    code, out, err = run(*argv)
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err


def test_unknown_option_is_a_usage_error(dumps: dict[str, Path]) -> None:
    code, _, err = run("check", str(dumps["clean-swa"]), "--frobnicate")
    assert code == 2 and "No such option" in err


def test_internal_error_exits_3_with_a_bug_report_line(
    dumps: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvcanary_cli.analysis.check as check

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(check, "run_check", boom)
    monkeypatch.delenv("KVCANARY_DEBUG", raising=False)
    code, out, err = run("check", str(dumps["clean-swa"]))
    assert code == 3
    assert "Traceback" not in out + err
    assert "internal error" in err and "kaboom" in err and "inspect" in err


def test_ctrl_c_is_one_line_and_exit_130(
    dumps: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """typer turns a KeyboardInterrupt into a silent exit code 130: kvcanary says so."""
    import kvcanary_cli.analysis.check as check

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(check, "run_check", interrupted)
    code, out, err = run("check", str(dumps["clean-swa"]))
    assert code == 130
    assert err.strip().splitlines() == ["interrupted"] and "Traceback" not in out


def test_several_dumps_one_report_each(dumps: dict[str, Path]) -> None:
    code, out, _ = run(
        "check",
        str(dumps["clean-swa"]),
        str(dumps["truncated-lut"]),
        "--kernel",
        "vectorized",
        "--format",
        "json",
        "--jobs",
        "1",
    )
    assert code == 1
    record = json.loads(out)
    assert validate(record, CheckReport) == []
    assert [Path(d["path"]).name for d in record["dumps"]] == [
        "clean-swa.safetensors",
        "truncated-lut.safetensors",
    ]
    assert [d["verdict"] for d in record["dumps"]] == ["clean", "errors"]


@pytest.mark.slow
def test_several_dumps_with_a_bad_one_exit_2_after_reporting(
    dumps: dict[str, Path], tmp_path: Path
) -> None:
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"not a dump at all")
    code, out, err = run(
        "check",
        str(dumps["truncated-lut"]),
        str(broken),
        "--kernel",
        "vectorized",
        "--format",
        "json",
        "--jobs",
        "2",
    )
    assert code == 2
    record = json.loads(out)
    assert record["dumps"][1]["error"] and record["dumps"][0]["findings"]
    assert err.count("error: ") == 1


def test_markdown_has_summary_and_details(dumps: dict[str, Path]) -> None:
    code, out, _ = run(
        "check",
        str(dumps["cross-request-aliasing"]),
        "--kernel",
        "vectorized",
        "--format",
        "markdown",
    )
    assert code == 1
    assert "slot-shared-across-positions" in out and "<details>" in out


def test_provenance_json_validates(dumps: dict[str, Path]) -> None:
    code, out, err = run(
        "check", str(dumps["cross-request-aliasing"]), "--kernel", "vectorized", "--format", "json"
    )
    finding = json.loads(out)["dumps"][0]["findings"][0]
    code, out, err = run(
        "provenance",
        str(dumps["cross-request-aliasing"]),
        "--slot",
        str(finding["slot"]),
        "--format",
        "json",
    )
    assert code == 0, err
    record = json.loads(out)
    assert validate(record, ProvenanceReport) == []
    cells = {(c["pool_row"], c["position"]) for c in record["slot"]["cells"]}
    assert (finding["pool_row"], finding["position"]) in cells and len(cells) >= 2
    assert record["findings"][0]["code"] == "slot-shared-across-positions"


def test_provenance_row_map(dumps: dict[str, Path]) -> None:
    code, out, err = run(
        "provenance", str(dumps["clean-swa"]), "--row", "5", "--group", "swa", "--format", "json"
    )
    assert code == 0, err
    row = json.loads(out)["row"]
    assert row["pool_row"] == 5 and row["group"] == "swa"


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("seed", deep_repeats([0, 1, 2]))
def test_every_scenario_and_seed_reports_its_codes(name: str, seed: int, tmp_path: Path) -> None:
    path = make_scenario(name, seed=seed).save(tmp_path / f"{name}.safetensors")
    code, out, err = run("check", str(path), "--kernel", "vectorized", "--format", "json")
    record = json.loads(out)
    scenario = SCENARIOS[name]
    codes = {f["code"] for f in record["dumps"][0]["findings"]}
    assert set(scenario.expected) <= codes <= set(scenario.expected) | set(scenario.allowed)
    severities = {f["severity"] for f in record["dumps"][0]["findings"]}
    assert code == (1 if "error" in severities else 0), err
    causes = [c["cause"] for c in record["dumps"][0]["diagnosis"]]
    if not scenario.expected:
        assert code == 0 and codes == set() and causes == []
    else:  # the cause the scenario planted comes first; the dump records it too
        assert causes[0] == scenario.cause, record["dumps"][0]["diagnosis"]
        meta = load_dump(path).metadata
        assert meta["kvcanary.expected_diagnosis"] == scenario.cause
        # every finding is grouped under a cause the diagnosis lists
        assert {f["cause"] for f in record["dumps"][0]["findings"]} <= set(causes)
    assert validate(record, CheckReport) == []


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_slot_beyond_the_pool_is_never_blamed_on_the_lut(seed: int, tmp_path: Path) -> None:
    path = make_scenario("slot-beyond-pool-swa", seed=seed).save(tmp_path / "d.safetensors")
    _, out, _ = run("check", str(path), "--kernel", "vectorized", "--format", "json")
    [dump] = json.loads(out)["dumps"]
    assert dump["diagnosis"][0]["cause"] == "slot-index-corrupt"
    assert dump["diagnosis"][0]["confidence"] == "certain"
    assert "lut-too-short" not in {c["cause"] for c in dump["diagnosis"]}


def test_findings_that_rest_on_a_derived_pool_size_are_info(tmp_path: Path) -> None:
    path = make_scenario("truncated-lut-unrecorded").save(tmp_path / "d.safetensors")
    code, out, _ = run("check", str(path), "--kernel", "vectorized", "--format", "json")
    [dump] = json.loads(out)["dumps"]
    beyond = [f for f in dump["findings"] if f["code"] == "slot-beyond-pool"]
    assert beyond and {f["severity"] for f in beyond} == {"info"}
    assert {tuple(f["assumes"]) for f in beyond} == {("num_full_slots",)}
    scalars = {s["name"]: s for s in dump["scalars"]}
    assert scalars["num_full_slots"]["origin"] == "derived"
    assert scalars["swa_window_size"]["origin"] == "recorded"
    [assumption] = dump["assumptions"]
    assert assumption["decides"] == {"slot-beyond-pool": sum(f["count"] for f in beyond)}
    # The same dump with the pool size given on the command line: facts, errors again.
    code, out, _ = run(
        "check", str(path), "-k", "vectorized", "-f", "json", "--set", "num_full_slots=9"
    )
    [dump] = json.loads(out)["dumps"]
    assert {f["severity"] for f in dump["findings"] if f["code"] == "slot-beyond-pool"} == {"error"}
    assert {s["name"]: s["origin"] for s in dump["scalars"]}["num_full_slots"] == "overridden"


def test_synth_list_and_write(tmp_path: Path) -> None:
    code, out, _ = run("synth", "--list")
    assert code == 0 and all(name in out for name in SCENARIOS)
    # both engines' clean scenarios are listed in the same words
    for clean in ("clean-decode", "vllm-clean"):
        (line,) = [line for line in out.splitlines() if line.startswith(clean + " ")]
        assert line.endswith("  [none (clean)]"), line
    target = tmp_path / "x.safetensors"
    code, out, _ = run("synth", "use-after-free", "--out", str(target), "--seed", "4")
    assert code == 0 and target.exists()
    code, out, _ = run("inspect", str(target), "--format", "json")
    meta = json.loads(out)["other_metadata"]
    assert meta["kvcanary.expected_findings"] == "freed-slot-in-live-range"


def test_synth_page_size_sets_both_pools_and_refuses_pages_a_fault_cannot_have(
    tmp_path: Path,
) -> None:
    target = tmp_path / "paged.safetensors"
    code, out, _ = run("synth", "partial-page-free", "--out", str(target), "--page-size", "4")
    assert code == 0 and "page size 4" in out
    assert load_dump(target).scalars["page_size"].value == 4
    code, out, err = run(
        "synth", "partial-page-free", "--out", str(tmp_path / "one.st"), "--page-size", "1"
    )
    assert code == 2 and "needs pages of 2 slots or more" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "one.st").exists()
    code, _, _ = run("check", str(target), "-k", "none", "-f", "json")
    assert code == 1
