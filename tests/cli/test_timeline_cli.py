"""`kvcanary timeline`, `diff`, `provenance --slot` over several dumps and `synth --steps` from
the command line: exit codes, every format, one error line for what is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from kvcanary_cli.cli import app
from kvcanary_cli.dump.loader import load_dump
from kvcanary_cli.dump.writer import dump_contents, write_dump
from kvcanary_cli.synth.sequence import PLANTED_KEY, write_sequence
from tests.render.md_tables import tables
from tests.render.record_schema import RECORDS, validate


def run(*args: object) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def uaf(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_sequence("use-after-free", tmp_path_factory.mktemp("uaf"), steps=5, seed=1)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_sequence("clean-swa", tmp_path_factory.mktemp("clean"), steps=4, seed=1)


def _record(result: Result) -> dict[str, object]:
    record: dict[str, object] = json.loads(result.stdout)
    assert validate(record, RECORDS["kvcanary.timeline/1"]) == []
    return record


def test_an_event_exits_1_in_every_format(uaf: list[Path]) -> None:
    truth = json.loads(load_dump(uaf[-1]).metadata[PLANTED_KEY])
    table = run("timeline", *reversed(uaf))  # any order: read by step
    assert table.exit_code == 1, table.stderr
    assert f"use-after-free in steps ({truth['after_step']}, {truth['at_step']}]" in table.stdout
    assert str(truth["slots"][0]) in table.stdout
    record = _record(run("timeline", *uaf, "-f", "json"))
    assert record["verdict"] == "events"
    markdown = run("timeline", *uaf, "--format", "markdown")
    assert markdown.exit_code == 1 and "## kvcanary timeline" in markdown.stdout
    event_table = next(t for t in tables(markdown.stdout) if t[1][0] == "slot")
    assert event_table[2][0][0] == str(truth["slots"][0])


def test_a_clean_sequence_exits_0(clean: list[Path]) -> None:
    result = run("timeline", *clean)
    assert result.exit_code == 0 and "no event, no error finding" in result.stdout
    record = _record(run("timeline", *clean, "-f", "json"))
    assert record["verdict"] == "clean" and record["events"] == []


def test_diff_lists_owner_changes_and_writes_a_file(clean: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "diff.md"
    result = run("diff", clean[0], clean[-1], "-f", "markdown", "-o", out)
    assert result.exit_code == 0 and out.read_text().startswith("## kvcanary timeline")
    again = run("diff", clean[0], clean[-1], "-f", "markdown", "-o", out)
    assert again.exit_code == 2 and "--force" in again.stderr
    assert run("diff", clean[0], clean[-1], "-o", out, "--force").exit_code == 0
    record = _record(run("diff", clean[0], clean[-1], "-f", "json", "--max-rows", "1"))
    assert len(record["intervals"]) == 1  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["timeline", "{0}"], "give two dumps or more"),
        (["diff", "{1}", "{0}"], "give the older dump first"),
        (["timeline", "{0}", "{0}"], "two dumps of one step"),
        (["provenance", "--row", "3", "{0}", "{1}"], "over several dumps, give --slot N"),
        (["timeline", "{0}", "missing.safetensors"], "missing.safetensors"),
    ],
)
def test_refusals_are_one_line_exit_2(uaf: list[Path], args: list[str], message: str) -> None:
    result = run(*(a.format(*uaf) for a in args))
    assert result.exit_code == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


def test_a_mix_of_ranks_is_one_line(uaf: list[Path], tmp_path: Path) -> None:
    other = tmp_path / "rank1.safetensors"
    dump = load_dump(uaf[1])
    tensors = {
        "req_to_token": dump.req_to_token.array(),
        "req_pool_indices": dump.req_pool_indices,
        "prefix_lens": dump.prefix_lens,
    }
    write_dump(other, dump_contents({**dump.metadata, "rank": "1", "step": "9"}, tensors))
    del dump
    result = run("timeline", *uaf, other)
    assert result.exit_code == 2 and "a timeline reads one rank's dumps" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_provenance_over_several_dumps(uaf: list[Path]) -> None:
    truth = json.loads(load_dump(uaf[-1]).metadata[PLANTED_KEY])
    slot = truth["slots"][0]
    result = run("provenance", "--slot", slot, *uaf, "-f", "json")
    assert result.exit_code == 0, result.stderr
    record = _record(result)
    moments = record["slot"]["moments"]  # type: ignore[index]
    states = [m["state"] for m in moments]
    assert states[truth["dump"]] == "held and free" and states[0] == "held"
    assert [e["kind"] for e in record["events"]] == ["use-after-free"]  # type: ignore[attr-defined]
    table = run("provenance", "--slot", slot, *uaf)
    assert f"full slot {slot} over the dumps" in table.stdout
    one = run("provenance", "--slot", slot, uaf[0], "-f", "json")  # one dump: as before
    assert json.loads(one.stdout)["schema"] == "kvcanary.provenance/2"


def test_synth_steps_writes_the_sequence(tmp_path: Path) -> None:
    folder = tmp_path / "seq"
    result = run("synth", "swa-leak", "--steps", 4, "--at", 3, "--every", 2, "--out", folder)
    assert result.exit_code == 0, result.stderr
    names = sorted(p.name for p in folder.iterdir())
    assert names == [f"kvcanary-rank0-step{s:06d}.safetensors" for s in (2, 4, 6, 8)]
    assert "wrote 4 dumps" in result.stdout
    again = run("synth", "swa-leak", "--steps", 4, "--out", folder)
    assert again.exit_code == 2 and "--force" in again.stderr
    assert run("synth", "swa-leak", "--steps", 4, "--out", folder, "--force").exit_code == 0
    listed = run("synth", "--list").stdout
    assert "sequences (--steps K --out DIR):" in listed and "lut-rewritten" in listed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["synth", "clean", "--at", "3", "--out", "x.safetensors"],
            "--at and --every go with --steps",
        ),
        (
            ["synth", "clean", "--steps", "3", "--at", "9", "--out", "{dir}"],
            "at or before the last",
        ),
        (["synth", "clean", "--steps", "1", "--out", "{dir}"], "1 is below 2"),
        (["synth", "clean", "--steps", "3", "--out", "{file}"], "is not a folder"),
        (["synth", "clean", "--steps", "3"], "give a SEQUENCE and --out FOLDER"),
        (["synth", "truncated-lut", "--steps", "3", "--out", "{dir}"], "one-dump scenario"),
        (["synth", "use-after-fre", "--steps", "3", "--out", "{dir}"], "unknown sequence"),
    ],
)
def test_synth_steps_refusals(tmp_path: Path, args: list[str], message: str) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    result = run(*(a.format(dir=tmp_path / "d", file=file) for a in args))
    assert result.exit_code == 2 and message in result.stderr, result.stderr


def test_the_example_sequence() -> None:
    """examples/timeline-use-after-free: what examples/README.md says it shows."""
    folder = Path(__file__).resolve().parents[2] / "examples" / "timeline-use-after-free"
    record = _record(run("timeline", *sorted(folder.glob("*.safetensors")), "-f", "json"))
    events = record["events"]
    assert isinstance(events, list) and len(events) == 1
    event = events[0]
    assert (event["kind"], event["after_step"], event["at_step"]) == ("use-after-free", 2, 3)
    cells = event["cells"]
    assert (cells["slot"], cells["pool_row"], cells["position"]) == ([282], [8], [1])


def test_the_api_checks_what_the_command_line_checks(uaf: list[Path], tmp_path: Path) -> None:
    from kvcanary_cli import api
    from kvcanary_cli.errors import OptionError

    with pytest.raises(OptionError, match="^slot: "):
        api.provenance(uaf, slot=2**70)
    with pytest.raises(OptionError, match="^space: "):
        api.provenance(uaf, slot=1, space="both")
    with pytest.raises(OptionError, match="^steps: "):
        api.synth("clean", tmp_path / "seq", steps=True)
    with pytest.raises(OptionError, match="^every: "):
        api.synth("clean", tmp_path / "seq", steps=3, every=0)
    with pytest.raises(OptionError, match="DUMP"):
        api.timeline(uaf[0])  # one path: one dump, not one per character


@pytest.mark.parametrize("how", ["replaced", "rewritten in place"])
def test_a_dump_changed_after_ordering_is_refused(
    clean: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The sequence is ordered by its headers, then loaded one dump at a time: a dump another
    file took the place of in between (the capture hook writing on) is not read under the
    step its old header gave (issue 36, class 10). Unchanged, the same run goes through."""
    import shutil

    from kvcanary_cli.analysis import timeline as timeline_module

    copies = [Path(shutil.copy(p, tmp_path / p.name)) for p in clean]
    assert run("timeline", *copies).exit_code == 0  # the clean twin: nothing changed
    victim, newer = copies[1], tmp_path / "newer.safetensors"
    shutil.copy(clean[-1], newer)
    real_load = timeline_module.load_dump  # type: ignore[attr-defined]
    swapped = False

    def load_after_a_swap(path: Path, **kwargs: object) -> object:
        nonlocal swapped
        if not swapped:  # the first load: every header was read already
            swapped = True
            if how == "replaced":
                newer.replace(victim)
            else:
                victim.write_bytes(newer.read_bytes())
        return real_load(path, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(timeline_module, "load_dump", load_after_a_swap)
    result = run("timeline", *copies)
    assert result.exit_code == 2, result.stdout
    assert victim.name in result.stderr and "changed while the timeline read" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


@pytest.mark.parametrize(
    "argv",
    [["timeline"], ["diff"], ["provenance", "--slot", "3"]],
    ids=["timeline", "diff", "provenance-slot"],
)
def test_each_dump_header_is_read_once(
    uaf: list[Path], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    """A run over N dumps parses each dump's header once: the engine, the step order and the
    load all use that one read (before, three: the engine, the order, the load)."""
    from collections import Counter

    from kvcanary_cli.dump import header, loader

    dumps = uaf[:2] if argv == ["diff"] else list(reversed(uaf))  # timeline: any order
    reads: Counter[Path] = Counter()
    real = header.read_header

    def counted(path: str | Path) -> header.SafetensorsHeader:
        reads[Path(path)] += 1
        return real(path)

    monkeypatch.setattr(header, "read_header", counted)
    monkeypatch.setattr(loader, "read_header", counted)
    result = run(*argv, *dumps)
    assert result.exit_code in (0, 1), result.stderr
    assert dict(reads) == dict.fromkeys(dumps, 1)


def test_a_rewritten_prefix_exits_1_and_its_twin_0(tmp_path: Path) -> None:
    """Issue 35, part 5: every dump of the sequence is clean on its own; the timeline (and
    diff of the two dumps around it) names the rewrite, and its twin stays at exit 0."""
    paths = write_sequence("prefix-rewritten", tmp_path / "rw", steps=5, seed=2, page_size=4)
    result = run("timeline", *paths, "--format", "json")
    assert result.exit_code == 1, result.stderr
    events: Any = _record(result)["events"]
    [event] = events
    assert event["kind"] == "prefix-rewritten" and event["cause"] == "radix-prefix-broken"
    assert set(event["cells"]["extra"]["old_slot_fate"]) == {0}  # orphaned
    truth = json.loads(load_dump(paths[-1]).metadata[PLANTED_KEY])
    assert event["cells"]["extra"]["old_slot"] == truth["old_slots"]
    shown = truth["dump"]
    assert run("diff", paths[shown - 1], paths[shown]).exit_code == 1
    assert all(run("check", p, "-k", "none").exit_code == 0 for p in paths)
    twin = write_sequence("clean", tmp_path / "twin", steps=5, seed=2, page_size=4)
    assert run("timeline", *twin).exit_code == 0
