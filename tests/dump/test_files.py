"""The one writer of every file kvcanary makes (`dump.files.write_atomically`)."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import BinaryIO

import pytest

from kvcanary_cli.dump.files import write_atomically
from kvcanary_cli.errors import PathError, PathExistsError


def test_a_target_another_run_created_meanwhile_is_not_replaced(tmp_path: Path) -> None:
    """Two runs writing one target without --force: the second to finish is told, and the
    first one's file stays."""
    target = tmp_path / "report.json"

    def write_while_the_other_run_finishes(handle: BinaryIO) -> None:
        handle.write(b"mine")
        target.write_bytes(b"the other run's report")

    with pytest.raises(PathExistsError, match="exists"):
        write_atomically(target, write_while_the_other_run_finishes, overwrite=False)
    assert target.read_bytes() == b"the other run's report"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary file left


def test_a_new_file_is_complete_and_alone(tmp_path: Path) -> None:
    target = tmp_path / "new.bin"
    write_atomically(target, lambda handle: handle.write(b"all of it"), overwrite=False)
    assert target.read_bytes() == b"all of it"
    assert target.stat().st_nlink == 1 and os.listdir(tmp_path) == ["new.bin"]


def test_without_hard_links_a_new_file_is_still_created_exclusively(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    target = tmp_path / "new.bin"
    write_atomically(target, lambda handle: handle.write(b"data"), overwrite=False)
    assert target.read_bytes() == b"data" and os.listdir(tmp_path) == ["new.bin"]

    def write_while_the_other_run_finishes(handle: BinaryIO) -> None:
        handle.write(b"mine")
        (tmp_path / "other.bin").write_bytes(b"theirs")

    with pytest.raises(PathError, match="exists"):
        write_atomically(
            tmp_path / "other.bin", write_while_the_other_run_finishes, overwrite=False
        )
    assert (tmp_path / "other.bin").read_bytes() == b"theirs"
    assert sorted(os.listdir(tmp_path)) == ["new.bin", "other.bin"]


def test_standard_inputs_file_is_an_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`-` among the inputs is standard input: its file is never replaced, a pipe is no file."""
    log = tmp_path / "server.log"
    log.write_bytes(b"the evidence")
    with log.open() as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        with pytest.raises(PathError, match="is an input"):
            write_atomically(log, lambda handle: handle.write(b"report"), inputs=["-"])
    assert log.read_bytes() == b"the evidence"
    read, write = os.pipe()
    with os.fdopen(read) as stdin, os.fdopen(write):
        monkeypatch.setattr(sys, "stdin", stdin)
        write_atomically(tmp_path / "r.txt", lambda handle: handle.write(b"ok"), inputs=["-"])
    assert (tmp_path / "r.txt").read_bytes() == b"ok"


# --- several files together (issue 36, class 8) ---------------------------------------------


def test_files_written_together_are_taken_back_when_a_later_one_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second target's name is taken between the checks and its publishing: the first,
    already published, is taken back (a replaced file gets its old bytes again)."""
    from kvcanary_cli.dump import files

    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_bytes(b"old first")

    def write_second(handle: BinaryIO) -> None:
        handle.write(b"new second")

    real_replace = os.replace

    def replace_failing_on_second(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if Path(dst) == second:
            raise OSError(errno.EIO, "I/O error")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_failing_on_second)
    with pytest.raises(PathError, match="cannot be written"):
        files.write_all_atomically(
            [(first, lambda handle: handle.write(b"new first")), (second, write_second)]
        )
    monkeypatch.undo()
    assert first.read_bytes() == b"old first" and not second.exists()
    assert sorted(os.listdir(tmp_path)) == ["first.txt"]  # no staged or kept-aside file left

    new_only = tmp_path / "new.txt"
    second.write_bytes(b"taken")
    with pytest.raises(PathExistsError):
        files.write_all_atomically(
            [(new_only, lambda handle: handle.write(b"x")), (second, write_second)],
            overwrite=False,
        )
    assert not new_only.exists() and second.read_bytes() == b"taken"


def test_one_file_named_twice_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    from kvcanary_cli.dump.files import write_all_atomically

    target = tmp_path / "out.txt"
    with pytest.raises(PathError, match="same file given twice"):
        write_all_atomically(
            [
                (target, lambda h: h.write(b"a")),
                (tmp_path / "." / "out.txt", lambda h: h.write(b"b")),
            ]
        )
    assert os.listdir(tmp_path) == []
