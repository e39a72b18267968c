"""`kvcanary soak`'s outputs without SGLang: a stand-in for the stack (every history finds, or
none does; SGLang's checks complain in each, or stay silent) drives the real command, so `--out`,
the files written on a finding, the `kvcanary.soak/2` record, its views and `--steps` are
checked in a second each. The real stack's runs are
in tests/integration/test_sglang_stack.py."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from kvcanary_cli.cli import app
from kvcanary_cli.soak import run as soak_run
from kvcanary_cli.soak import stack as soak_stack
from kvcanary_cli.soak.audit import Audit, Said
from kvcanary_cli.soak.workload import Workload

OUTPUTS = (
    "soak-dump.safetensors",
    "soak-shrunk-dump.safetensors",
    "soak-workload.json",
    "soak-reproducer.json",
)


@dataclass
class FakeSGLang:
    """What the stand-in did, and how it behaves."""

    finds: bool = True
    loads: int = 0
    #: step counts the histories ran
    histories: list[int] = field(default_factory=list)
    #: raise KeyboardInterrupt in the history that records the shrunk workload's dump
    interrupt_shrunk_dump: bool = False
    dumps_recorded: int = 0
    #: printed while loading, as SGLang prints (its radix tree on out-of-memory)
    chatter: bool = False
    #: what SGLang's `_check_req_pool` says at each history's last step (every history)
    said: list[str] = field(default_factory=list)
    #: times a planted fault acts in each history
    acts: int = 0
    #: find only in histories capping a path's Mamba states
    finds_capped: bool = False
    #: whether the release's server args take the per-path Mamba state cap
    path_cap: bool = True
    #: the workloads the histories ran, and their page sizes
    workloads: list[Workload] = field(default_factory=list)
    page_sizes: list[int] = field(default_factory=list)
    #: histories run until SGLang's check complained (to keep a complaint's files)
    heard_runs: int = 0


def _state(path: Path) -> Path:
    """A stand-in state SGLang's row check complained of: a dump with a leaked request row."""
    from kvcanary_cli import api

    api.synth("req-row-leaked", path, force=True)
    return path


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSGLang]:
    state = FakeSGLang()

    def server_args(*, model_path: str = "", mamba_max_states_per_path: int = -1) -> object:
        return model_path  # a release's ServerArgs that has the per-path Mamba state cap

    def server_args_before(*, model_path: str = "") -> object:
        return model_path  # one from before it

    modules = SimpleNamespace(
        cores=("python",),
        notes=(),
        tree=SimpleNamespace(version="0.0.fake", root=Path("/fake/sglang")),
    )

    def load_sglang(source: object = None) -> object:
        state.loads += 1
        chosen = server_args if state.path_cap else server_args_before
        modules.server_args = SimpleNamespace(ServerArgs=chosen)
        if state.chatter:
            print("RadixCache tree (printed by SGLang)")
            os.write(1, b"fd-level chatter from SGLang\n")
        return modules

    def run_history(
        modules: object,
        spec: Any,
        workload: Workload,
        *,
        fault: str | None = None,
        folder: Path | None = None,
        max_steps: int | None = None,
        until_heard: str | None = None,
        **_: object,
    ) -> soak_run.HistoryResult:
        steps = workload.steps if max_steps is None else min(workload.steps, max_steps)
        state.histories.append(steps)
        state.workloads.append(workload)
        state.page_sizes.append(spec.page_size)
        said = [Said("_check_req_pool", text) for text in state.said]
        result = soak_run.HistoryResult(
            steps=steps,
            audited=steps,
            counters=None,  # type: ignore[arg-type]
            fault_acted=0 if fault is None else state.acts,
        )
        result.heard(steps - 1, "idle", said)
        if until_heard is not None and said and workload.arrivals:
            state.heard_runs += 1
            result.heard_state = Audit(step=steps - 1, mode="idle", sglang=said)
            if folder is not None:
                result.heard_state.dump = _state(folder / "state.safetensors")
        capped = workload.mamba_max_states_per_path is not None
        if state.finds and workload.arrivals and (capped or not state.finds_capped):
            failure = Audit(step=steps, mode="plan", codes=["free-list-duplicate"])
            failure.top_cause = "double-free"
            failure.sglang = said
            if folder is not None:
                state.dumps_recorded += 1
                if state.interrupt_shrunk_dump and state.dumps_recorded == 2:
                    raise KeyboardInterrupt
                failure.dump = folder / "state.safetensors"
                failure.dump.write_bytes(b"dump of %d arrivals" % len(workload.arrivals))
            result.failure = failure
        return result

    monkeypatch.setattr(soak_stack, "load_sglang", load_sglang)
    monkeypatch.setattr(soak_run, "run_history", run_history)
    yield state


def soak(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["soak", *args])
    return result.exit_code, result.stdout, result.stderr


def _one_line(err: str) -> None:
    assert err.count("\n") == 1, err


# --out is checked before anything runs


def test_a_file_as_out_is_refused_before_soaking(fake: FakeSGLang, tmp_path: Path) -> None:
    """Not after the soak, its finding lost in an exit 3."""
    named = tmp_path / "results"
    named.write_text("mine\n")
    code, out, err = soak("--out", str(named))
    assert code == 2, err
    _one_line(err)
    assert str(named) in err and "not a directory" in err
    assert fake.loads == 0 and fake.histories == []
    assert named.read_text() == "mine\n"


def test_the_mamba_layout_at_a_larger_page_is_refused_before_soaking(
    fake: FakeSGLang, tmp_path: Path
) -> None:
    """SGLang's Mamba tree component runs at page size 1 only: one error line, nothing run."""
    code, _, err = soak("--layout", "mamba", "--page-size", "4", "--out", str(tmp_path / "o"))
    assert code == 2, err
    _one_line(err)
    assert "page size 1 only" in err and "page-size" in err
    assert fake.loads == 0 and fake.histories == []


def test_mamba_histories_cap_a_paths_states_where_the_release_has_it_and_the_files_keep_it(
    fake: FakeSGLang, tmp_path: Path
) -> None:
    """On a release whose server args take `mamba_max_states_per_path`, every other Mamba
    history runs capped, the first among them; a capped history's reproducer records the cap
    and `--replay` runs it capped again (a file from before the cap: uncapped). A release
    without the option runs every history uncapped, as does another layout."""
    from kvcanary_cli.soak.command import MAMBA_PATH_CAP

    def caps() -> list[int | None]:
        drawn = [w.mamba_max_states_per_path for w in fake.workloads]
        fake.workloads.clear()
        return drawn

    fake.finds = False
    code, _, err = soak("--layout", "mamba", "--steps", "400", "--out", str(tmp_path / "o"))
    assert code == 0, err
    assert caps()[:4] == [MAMBA_PATH_CAP, None, MAMBA_PATH_CAP, None]
    code, _, err = soak("--steps", "400", "--out", str(tmp_path / "o"))
    assert code == 0 and set(caps()) == {None}, err
    fake.path_cap = False
    code, _, err = soak("--layout", "mamba", "--steps", "400", "--out", str(tmp_path / "o"))
    assert code == 0 and set(caps()) == {None}, err
    fake.path_cap = fake.finds = fake.finds_capped = True
    out = tmp_path / "capped"
    code, _, err = soak("--layout", "mamba", "--steps", "400", "--out", str(out))
    assert code == 1, err
    for name in ("soak-workload.json", "soak-reproducer.json"):
        recorded = json.loads((out / name).read_text())["workload"]
        assert recorded["mamba_max_states_per_path"] == MAMBA_PATH_CAP, name
    caps()
    replayed = CliRunner().invoke(app, ["soak", "--replay", str(out / "soak-reproducer.json")])
    assert replayed.exit_code == 1, replayed.stderr
    assert caps() == [MAMBA_PATH_CAP]
    before = json.loads((out / "soak-reproducer.json").read_text())
    del before["workload"]["mamba_max_states_per_path"]
    (tmp_path / "before.json").write_text(json.dumps(before))
    replayed = CliRunner().invoke(app, ["soak", "--replay", str(tmp_path / "before.json")])
    assert replayed.exit_code == 0, replayed.stderr  # uncapped, the fake finds nothing
    assert caps() == [None]


def test_extra_buffer_histories_alternate_their_track_slots_and_the_files_keep_them(
    fake: FakeSGLang, tmp_path: Path
) -> None:
    """`--layout mamba-extra` runs each page size 1, 4 and 16 (where `mamba` runs page size 1
    only), its first round's histories with two ping-pong track slots per request (SGLang's
    overlapped sizing), the next round's with one; a reproducer records the count and
    `--replay` runs it again (a file from before: none, no extra buffer). Other layouts draw
    none."""
    fake.finds = False
    code, _, err = soak("--layout", "mamba-extra", "--steps", "2000", "--out", str(tmp_path / "o"))
    assert code == 0, err
    assert fake.page_sizes[:3] == [1, 4, 16], fake.page_sizes  # one core here: a round of 3
    slots = [w.mamba_track_slots for w in fake.workloads]
    assert slots[:3] == [2] * 3 and slots[3:6] == [1] * 3, slots
    fake.workloads.clear()
    code, _, err = soak("--layout", "mamba", "--steps", "400", "--out", str(tmp_path / "o"))
    assert code == 0 and {w.mamba_track_slots for w in fake.workloads} == {None}, err
    fake.finds = True
    out = tmp_path / "found"
    code, _, err = soak("--layout", "mamba-extra", "--steps", "400", "--out", str(out))
    assert code == 1, err
    recorded = json.loads((out / "soak-reproducer.json").read_text())
    assert recorded["workload"]["mamba_track_slots"] == 2
    fake.workloads.clear()
    replayed = CliRunner().invoke(app, ["soak", "--replay", str(out / "soak-reproducer.json")])
    assert replayed.exit_code == 1, replayed.stderr
    assert [w.mamba_track_slots for w in fake.workloads] == [2]
    del recorded["workload"]["mamba_track_slots"]
    (tmp_path / "before.json").write_text(json.dumps(recorded))
    fake.workloads.clear()
    CliRunner().invoke(app, ["soak", "--replay", str(tmp_path / "before.json")])
    assert [w.mamba_track_slots for w in fake.workloads] == [None]


def test_out_under_a_file_is_refused_before_soaking(fake: FakeSGLang, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    code, _, err = soak("--out", str(tmp_path / "file" / "sub"))
    assert code == 2, err
    _one_line(err)
    assert fake.loads == 0


def test_an_unwritable_out_is_refused_before_soaking(
    fake: FakeSGLang, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Permissions are faked: root may write anywhere.) Its folder, or the one it would be
    created in."""
    real = os.access

    def access(path: str, mode: int) -> bool:
        return real(path, mode) and not (mode & os.W_OK and Path(path) == tmp_path)

    monkeypatch.setattr(os, "access", access)
    for out in (tmp_path, tmp_path / "new" / "folder"):
        code, _, err = soak("--out", str(out))
        assert code == 2, err
        _one_line(err)
        assert "permission denied" in err
    assert fake.loads == 0


def test_a_new_out_folder_is_made_on_a_finding_only(fake: FakeSGLang, tmp_path: Path) -> None:
    """The clean twin: a missing --out is fine, and a clean soak creates nothing."""
    fake.finds = False
    code, _, err = soak("--out", str(tmp_path / "a" / "b"), "--steps", "100")
    assert code == 0, err
    assert not (tmp_path / "a").exists()
    fake.finds = True
    code, _, err = soak("--out", str(tmp_path / "a" / "b"), "--steps", "100")
    assert code == 1, err
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == sorted(OUTPUTS)


# the files: the rules of every other output


def test_a_link_among_the_outputs_is_never_written_through(
    fake: FakeSGLang, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.json"
    victim.write_text("outside --out\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "soak-workload.json").symlink_to(victim)
    for force in ([], ["--force"]):
        code, _, err = soak("--out", str(out), *force)
        assert code == 2, err
        _one_line(err)
        assert "symbolic link" in err
        assert fake.histories == []  # refused before soaking
    assert victim.read_text() == "outside --out\n"
    assert [p.name for p in out.iterdir()] == ["soak-workload.json"]


def test_existing_outputs_are_replaced_with_force_only(fake: FakeSGLang, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "soak-dump.safetensors").write_bytes(b"an earlier finding")
    code, _, err = soak("--out", str(out))
    assert code == 2, err
    _one_line(err)
    assert "exists" in err and "--force" in err
    assert fake.histories == []
    assert [p.name for p in out.iterdir()] == ["soak-dump.safetensors"]
    code, _, err = soak("--out", str(out), "--force")
    assert code == 1, err
    assert (out / "soak-dump.safetensors").read_bytes().startswith(b"dump of ")
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)


def test_an_interrupted_soak_leaves_no_file(fake: FakeSGLang, tmp_path: Path) -> None:
    """Ctrl-C while the shrunk workload's dump is recorded: neither the first dump alone nor a
    hidden scratch folder stays in --out."""
    fake.interrupt_shrunk_dump = True
    out = tmp_path / "out"
    code, _, err = soak("--out", str(out))
    assert code == 130, err
    assert not out.exists() or list(out.iterdir()) == []
    assert fake.dumps_recorded == 2  # it was interrupted where it was meant to be


def test_an_interrupted_write_leaves_no_file(
    fake: FakeSGLang, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the files are written: none of them, no staged file, no hidden folder."""
    out = tmp_path / "out"
    out.mkdir()
    calls = []
    real = Workload.to_json

    def to_json(self: Workload) -> str:
        calls.append(1)
        if len(calls) == 2:  # the reproducer's, after the workload's
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(Workload, "to_json", to_json)
    code, _, err = soak("--out", str(out))
    assert code == 130, err
    assert list(out.iterdir()) == []


# the record


def _report(*args: str) -> tuple[int, str, str]:
    return soak(*args, "--format", "json")


def test_json_is_a_versioned_documented_deterministic_record(
    fake: FakeSGLang, tmp_path: Path
) -> None:
    from kvcanary_cli import __version__
    from kvcanary_cli.results.soak import SoakReport
    from tests.render.record_schema import validate

    code, first, err = _report("--out", str(tmp_path / "a"), "--seed", "3")
    assert code == 1, err
    record = json.loads(first)
    assert validate(record, SoakReport) == []
    assert record["schema"] == "kvcanary.soak/2"
    assert record["kvcanary_version"] == __version__
    assert record["seconds"] is None  # wall-clock time is opt-in
    assert record["failure"]["top_cause"] == "double-free"
    assert first.startswith('{\n  "')  # indented like every other record
    code, second, err = _report("--out", str(tmp_path / "a"), "--seed", "3", "--force")
    assert code == 1, err
    assert second == first
    code, timed, err = _report("--out", str(tmp_path / "b"), "--seed", "3", "--timings")
    assert code == 1, err
    assert isinstance(json.loads(timed)["seconds"], float)


def test_a_clean_record_matches_its_declaration(fake: FakeSGLang, tmp_path: Path) -> None:
    from kvcanary_cli.results.soak import SoakReport
    from tests.render.record_schema import validate

    fake.finds = False
    code, text, err = _report("--out", str(tmp_path / "o"), "--steps", "200")
    assert code == 0, err
    record = json.loads(text)
    assert validate(record, SoakReport) == []
    assert record["found"] is False and record["failure"] is None and record["files"] == {}
    assert record["sglang_checks"] == [] and record["seen"] is None


def test_sglang_complaining_alone_is_a_finding_said_beside_kvcanarys_nothing(
    fake: FakeSGLang, tmp_path: Path
) -> None:
    """Every history: kvcanary finds nothing, SGLang's row check complains. Exit 1, every
    complaint counted, the first 3 kept, and each view says what SGLang said and "kvcanary:
    nothing". The first history's complaint is kept as a finding is: the state it was said
    of, and the workload shrunk while the check still complains, which `--replay` runs."""
    from kvcanary_cli.results.soak import SoakReport
    from tests.render.md_tables import tables
    from tests.render.record_schema import validate

    fake.finds = False
    fake.said = [
        "ValueError: req_to_token_pool memory leak detected!available_size=6, session_held=0, "
        "total_size=11"
    ]
    code, text, err = _report("--out", str(tmp_path / "o"), "--steps", "400")
    assert code == 1, err
    record = json.loads(text)
    assert validate(record, SoakReport) == []
    assert sorted(Path(p).name for p in record["files"].values()) == sorted(OUTPUTS)
    reading = record["reading"]  # `kvcanary leak` on the complaint and the state kept
    assert (reading["check"], reading["verdict"], reading["cause"]) == (
        "_check_req_pool",
        "leak",
        "req-row-leak",
    )
    assert record["failure"] is None and record["shrunk_arrivals"][1] == 1
    assert fake.heard_runs > 2  # the shrink ran histories until the check complained
    kept = json.loads((tmp_path / "o" / "soak-reproducer.json").read_text())
    assert (kept["sglang_check"], kept["sglang_message"]) == ("_check_req_pool", fake.said[0])
    assert (kept["codes"], kept["top_cause"], kept["when"]) == ([], None, "idle")
    assert len(kept["workload"]["arrivals"]) == 1
    first = json.loads((tmp_path / "o" / "soak-workload.json").read_text())
    assert first["seed"] == record["sglang_checks"][0]["first"][0]["seed"]
    dump = (tmp_path / "o" / "soak-shrunk-dump.safetensors").read_bytes()
    assert b'"step":"' in dump  # the state it was said of, at the step it was said at
    code, replayed, err = _report("--replay", str(tmp_path / "o" / "soak-reproducer.json"))
    assert code == 1, err
    again = json.loads(replayed)["replay"]
    assert (again["recorded"], again["reproduced"]) == ("sglang _check_req_pool", True)
    assert record["found"] and record["sglang_found"] and not record["kvcanary_found"]
    [check] = record["sglang_checks"]
    assert (check["check"], check["steps"], check["histories"]) == ("_check_req_pool", 5, 5)
    assert [said["seed"] for said in check["first"]] == [0, 1, 2]  # bounded: the first 3
    assert check["first"][0]["message"] == fake.said[0]
    assert record["seen"]["first"] == "sglang" and record["seen"]["lead"] is None
    code, table, err = soak("--out", str(tmp_path / "t"), "--steps", "400")
    assert code == 1, err
    assert "kvcanary: nothing" in table and "silent" not in table
    assert "shrunk the workload from" in table and "soak-reproducer.json" in table
    assert "kvcanary leak on _check_req_pool's complaint and the dump of step" in table
    assert "_check_req_pool: 5 audited steps in 5 histories" in table
    assert table.count("req_to_token_pool memory leak detected!") == 3
    code, markdown, err = soak("--out", str(tmp_path / "m"), "--format", "markdown")
    assert code == 1, err
    assert markdown.startswith("## kvcanary soak: SGLang's checks complained; kvcanary: nothing")
    [(_, header, rows)] = tables(markdown)
    assert header == ["check", "audited steps", "histories", "said at", "what it said"]
    assert [row[0] for row in rows] == ["_check_req_pool"] * 3


def test_sglang_printing_to_stdout_stays_off_the_record(
    fake: FakeSGLang, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    fake.chatter = True
    code, text, err = _report("--out", str(tmp_path / "o"))
    assert code == 1, err
    json.loads(text)  # nothing before the `{`
    assert "RadixCache tree" in err
    captured = capfd.readouterr()  # the descriptor itself, under the runner's streams
    assert "fd-level chatter" not in captured.out
    assert "fd-level chatter" in captured.err


def test_markdown_is_markdown(fake: FakeSGLang, tmp_path: Path) -> None:
    """A heading, the facts as a list, the failure as a table of one row, who saw it first,
    SGLang's complaints as a table (a `|` it said stays in its cell), the files as a list;
    clean: the heading and the verdict."""
    from tests.render.md_tables import tables

    fake.said = ["assert a | b"]
    code, text, err = soak("--out", str(tmp_path / "o"), "--format", "markdown")
    assert code == 1, err
    blocks = text.split("\n\n")
    assert blocks[0] == "## kvcanary soak: found double-free"
    assert all(line.startswith("- ") for line in blocks[1].splitlines())
    [(before, header, rows), (_, said_header, said_rows)] = tables(text)
    assert before.startswith("FOUND at step ")
    assert header == ["seed", "page size", "core", "step", "when", "codes", "cause", "fault"]
    assert rows == [["0", "1", "python", "80", "plan", "free-list-duplicate", "double-free", "-"]]
    # the stand-in's SGLang complains at idle one step before kvcanary's plan-time finding
    assert (
        "SGLang saw it first, at step 79 (idle) of seed 0, page size 1, python core; "
        "kvcanary at step 80 (plan), 1 steps later"
    ) in blocks
    assert said_header[0] == "check" and said_rows[0][-1] == "assert a | b"
    files = blocks[blocks.index("### Files") + 1].splitlines()
    assert [line.split(":")[0] for line in files] == [
        "- dump",
        "- shrunk_dump",
        "- workload",
        "- reproducer",
    ]
    fake.finds, fake.said = False, []
    code, text, err = soak("--out", str(tmp_path / "p"), "--format", "markdown")
    assert code == 0, err
    assert text.startswith("## kvcanary soak: clean\n\n")
    assert "SGLang's own checks silent on every audited step" in text
    assert tables(text) == []


# the budget


@pytest.mark.parametrize("budget", [1, 79, 81, 200])
def test_steps_is_the_number_of_steps_run(fake: FakeSGLang, tmp_path: Path, budget: int) -> None:
    fake.finds = False
    code, text, err = _report("--out", str(tmp_path / "o"), "--steps", str(budget))
    assert code == 0, err
    assert sum(fake.histories) == budget
    assert json.loads(text)["steps"] == budget


def test_one_history_and_one_step_are_said_in_the_singular(
    fake: FakeSGLang, tmp_path: Path
) -> None:
    fake.finds = False
    fake.said = ["ValueError: req_to_token_pool memory leak detected!"]
    code, table, err = soak("--out", str(tmp_path / "o"), "--steps", "1")
    assert code == 1, err
    assert "seed 0, 1 history, 1 of 1 steps" in table
    assert "_check_req_pool: 1 audited step in 1 history" in table
    assert "historys" not in table and "1 histories" not in table


@pytest.mark.parametrize(
    ("finds", "acts", "said"),
    [
        (False, 0, "the planted fault lock-leak never acted: the workload never ran the code"),
        (False, 3, "the planted fault lock-leak acted {n} times; kvcanary found nothing"),
        (True, 1, "the planted fault lock-leak acted {n} time\n"),
    ],
    ids=["never-acted", "acted-unseen", "acted-found"],
)
def test_a_planted_fault_says_whether_it_acted(
    fake: FakeSGLang, tmp_path: Path, finds: bool, acts: int, said: str
) -> None:
    """A clean soak whose fault never ran proves nothing, and one whose fault ran unseen is a
    miss: each view says which, never a bare "clean"; the record keeps the fault and its count
    (over the soak's histories, not the shrinking's reruns)."""
    fake.finds, fake.acts = finds, acts
    args = ("--fault", "lock-leak", "--steps", "160", "--out", str(tmp_path / "o"), "--force")
    _, out, _ = soak(*args, "--format", "json")
    record = json.loads(out)
    assert record["histories"] == (1 if finds else 2)
    assert (record["fault"], record["fault_acted"]) == ("lock-leak", acts * record["histories"])
    said = said.format(n=record["fault_acted"])
    code, table, err = soak(*args)
    assert code == (1 if finds else 0), err
    assert said in table
    _, markdown, _ = soak(*args, "--format", "markdown")
    assert said.strip() in markdown


def test_without_a_fault_nothing_is_said_of_one(fake: FakeSGLang, tmp_path: Path) -> None:
    fake.finds = False
    code, table, _ = soak("--steps", "160", "--out", str(tmp_path / "o"))
    assert code == 0 and "planted fault" not in table
    _, out, _ = soak("--steps", "160", "--out", str(tmp_path / "o"), "--format", "json")
    assert (json.loads(out)["fault"], json.loads(out)["fault_acted"]) == (None, None)


def test_a_capped_workload_on_a_release_without_the_cap_is_refused_in_one_line() -> None:
    """A reproducer recorded with the per-path Mamba state cap, replayed on a release whose
    server args lack it, would not replay its history: refused, naming the option and the
    release, before anything is built."""
    from kvcanary_cli.soak.stack import SGLangUnavailableError, StackSpec, build_stack

    def server_args(*, model_path: str = "") -> object:
        raise AssertionError("built")

    modules = SimpleNamespace(
        reinstate=lambda: None,
        cores=("python",),
        tree=SimpleNamespace(release="SGLang 0.5.16", label="/fake/sglang"),
        server_args=SimpleNamespace(ServerArgs=server_args),
    )
    spec = StackSpec.pressured(1, "python", "mamba")
    with pytest.raises(SGLangUnavailableError) as refused:
        build_stack(modules, spec, mamba_max_states_per_path=2)  # type: ignore[arg-type]
    assert "SGLang 0.5.16" in str(refused.value) and "--mamba-max-states-per-path" in str(
        refused.value
    )
    assert "\n" not in str(refused.value)
    with pytest.raises(SGLangUnavailableError, match="ServerArgs does not fit"):
        build_stack(modules, spec)  # type: ignore[arg-type]  # uncapped: it builds (here: fails)
