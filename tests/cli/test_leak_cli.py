"""`kvcanary leak` from the command line: the arithmetic of each of SGLang's memory-check
messages (0.5.13 - 0.5.23), a garbled or unknown one refused in one line (exit 2), a server log
read, and with a dump the verdict: a real leak, a double free, SGLang's own miscount (every
page owned) or nothing, each on its own twin. The messages here are worded as SGLang's
`invariant_checker.py` words them; tests/integration/test_sglang_leak_trigger.py has SGLang
0.5.23's own checker print them over its real tree, test_sglang_leak_releases.py each
release's checker over stand-in pools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from kvcanary_cli.catalog import CauseCode
from kvcanary_cli.cli import app
from kvcanary_cli.dump.writer import save_dump
from tests.render.record_schema import RECORDS, validate

#: A full pool of 16 slots (page size 1; slot 0 is the reserved page).
TOTAL = 16


def run(*args: object) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def record(result: Result) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(result.stdout)
    assert validate(found, RECORDS["kvcanary.leak/1"]) == []
    return found


def counts(pool: str, total: int, available: int, evictable: int, uncached: int = 0) -> str:
    return (
        f"[{pool}] total={total}, available={available}, evictable={evictable}, protected=0, "
        f"session_held=0, uncached={uncached}"
    )


IDLE = f"pool memory leak detected! {counts('full', 256, 244, 16)}\n{counts('swa', 128, 116, 16)}"


# --- the line alone: its arithmetic --------------------------------------------------------


def test_the_idle_message_sums_each_pool_and_says_what_the_difference_can_be() -> None:
    result = run("leak", IDLE, "-f", "json")
    assert result.exit_code == 1 and result.stderr == ""
    found = record(result)
    assert found["verdict"] == "undecided" and found["cause"] is None
    [message] = found["messages"]
    assert message["kind"] == "idle-pools" and message["faulty"]
    full, swa = message["pools"]
    assert (full["accounted"], full["difference"], full["reading"]) == (260, -4, "over")
    assert (swa["accounted"], swa["difference"], swa["reading"]) == (132, -4, "over")
    said = " ".join(message["arithmetic"])
    assert "= 260; total 256: 4 slots over" in said and "double free" in said
    assert "miscount" in said
    table = run("leak", IDLE)
    assert "what each count is:" in table.stdout and "undecided" in table.stdout


@pytest.mark.parametrize(
    ("line", "verdict", "cause", "code"),
    [
        (f"AssertionError: SWA Pool Mem Leak Detected! {counts('swa', 128, 100, 20, 4)}",
         "undecided", None, 1),
        (f"[2026-12-05 10:00:00] [Mem Check (BUSY)] {counts('full', 64, 60, 0, 4)}",
         "balanced", None, 0),
        ("KV double free: sub-pool 1 has 7 duplicate pages.", "freed-twice",
         CauseCode.DOUBLE_FREE, 1),
        ("ValueError: KV page use-after-free: 12 owner page refs are in the free pool, sample "
         "pages=[3, 4, 9].", "freed-while-used", CauseCode.USE_AFTER_FREE, 1),
        ("req_to_token_pool memory leak detected!available_size=6, session_held=0, "
         "total_size=8", "undecided", None, 1),
        ("[swa] unified ring (leak-check skipped): available=1, evictable=2, total=3",
         "balanced", None, 0),
        ("AssertionError: double free: duplicate pages in class 3", "freed-twice",
         CauseCode.DOUBLE_FREE, 1),
        ("AssertionError: double free? mamba_index is None", "freed-twice",
         CauseCode.DOUBLE_FREE, 1),
    ],
    ids=["busy-assert", "busy-log", "kv-double-free", "kv-use-after-free", "req-pool", "ring",
         "class-double-free", "mamba-double-free"],
)  # fmt: skip
def test_each_message_is_read(line: str, verdict: str, cause: str | None, code: int) -> None:
    result = run("leak", line, "-f", "json")
    assert result.exit_code == code, result.stderr
    found = record(result)
    assert (found["verdict"], found["cause"]) == (verdict, cause)
    [message] = found["messages"]
    assert message["arithmetic"] and message["text"][0] in line


def test_the_numbers_of_each_message_are_its_own() -> None:
    busy = record(run("leak", f"SWA Pool Mem Leak Detected! {counts('swa', 128, 100, 20, 4)}",
                      "-f", "json"))["messages"][0]  # fmt: skip
    assert busy["pools"][0]["difference"] == 4 and busy["pools"][0]["reading"] == "short"
    double = record(run("leak", "KV double free: sub-pool 1 has 7 duplicate pages.", "-f", "json"))
    assert (double["messages"][0]["sub_pool"], double["messages"][0]["count"]) == (1, 7)
    uaf = record(run("leak", "KV page use-after-free: 12 owner page refs are in the free pool, "
                     "sample pages=[3, 4, 9].", "-f", "json"))["messages"][0]  # fmt: skip
    assert (uaf["count"], uaf["sample_pages"]) == (12, [3, 4, 9])
    rows = record(run("leak", "req_to_token_pool memory leak detected!available_size=6, "
                      "session_held=1, total_size=8", "-f", "json"))["messages"][0]  # fmt: skip
    assert (rows["rows_available"], rows["rows_session_held"], rows["rows_total"]) == (6, 1, 8)
    assert "= 7, total_size 8: 1 rows neither free" in rows["arithmetic"][0]


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("the scheduler stopped",
         "expected one of SGLang's memory-check messages (0.5.13 - 0.5.23)"),
        ("pool memory leak detected! [full] total=12, available=x",
         "expected 'pool memory leak detected! [full] total=N, available=N"),
        ("KV double free: sub-pool one has some duplicate pages.",
         "expected 'KV double free: sub-pool N has N duplicate pages.'"),
        ("pool-bytes memory leak detected! class 0: 12 bytes",
         "no token counts: nothing to add up"),
        ("AssertionError: page of another owner leaked into class 1",
         "a misfiled page; it prints no counts: nothing to add up"),
    ],
    ids=["unknown", "garbled-counts", "garbled-double-free", "byte-report", "misfiled-page"],
)  # fmt: skip
def test_a_garbled_or_unknown_line_is_one_error_line(line: str, named: str) -> None:
    result = run("leak", line)
    assert result.exit_code == 2 and result.stdout == ""
    [said] = result.stderr.splitlines()
    assert said.startswith("error: LINE: ") and named in said


def test_neither_a_line_nor_a_log_is_a_usage_error() -> None:
    result = run("leak")
    assert result.exit_code == 2 and result.stdout == ""
    [said] = result.stderr.splitlines()
    assert "LINE/--sglang-log" in said
    from kvcanary_cli import api
    from kvcanary_cli.errors import OptionError

    with pytest.raises(OptionError) as caught:  # below the edge: the API's keywords
        api.leak()
    assert caught.value.option == "line/log"


# --- a server log -----------------------------------------------------------------------------


def _log(path: Path) -> Path:
    busy = counts("full", TOTAL, 12, 4)
    lines = [
        "[2026-12-05 10:00:00 TP0] Prefill batch. #new-seq: 1",
        *[f"[2026-12-05 10:00:01 TP0] [Mem Check (BUSY)] {busy}"] * 3,
        "[2026-12-05 10:00:02 TP0] KV double free: sub-pool 0 has x duplicate pages.",
        f"[2026-12-05 10:00:03 TP0] pool memory leak detected! {counts('full', TOTAL, 12, 6)}",
        counts("swa", 8, 8, 0),
        "[2026-12-05 10:00:04 TP0] Decode batch.",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_log_is_read_line_by_line_with_its_line_numbers(tmp_path: Path) -> None:
    log = _log(tmp_path / "server.log")
    found = record(run("leak", "--sglang-log", log, "-f", "json"))
    assert found["source"] == str(log)
    [message] = found["messages"]  # the balanced busy lines are counted, not listed
    assert message["line"] == 6 and [p["pool"] for p in message["pools"]] == ["full", "swa"]
    assert found["balanced_busy_lines"] == 3
    assert (found["unread"], found["unread_lines"]) == (1, [5])  # the garbled double free
    assert any("do not parse" in note for note in found["notes"])


def test_a_log_without_a_message_or_missing_is_one_error_line(tmp_path: Path) -> None:
    empty = tmp_path / "quiet.log"
    empty.write_text("[2026-12-05] Decode batch.\n")
    for path, named in ((empty, "holds no SGLang memory-check message"),
                        (tmp_path / "missing.log", "no such file")):  # fmt: skip
        result = run("leak", "--sglang-log", path)
        assert result.exit_code == 2 and result.stdout == ""
        [said] = result.stderr.splitlines()
        assert said.startswith(f"error: {path}: ") and named in said


def test_a_line_too_long_is_skipped_and_counted(tmp_path: Path) -> None:
    """A 1 MB line (no newline for a megabyte) before the message: skipped a piece at a time,
    never held whole, and said in a note with the bound."""
    log = tmp_path / "server.log"
    with open(log, "w") as handle:
        handle.write("x" * (1 << 20) + "\n")
        handle.write(_log(tmp_path / "plain.log").read_text())
    found = record(run("leak", "--sglang-log", log, "-f", "json"))
    assert [m["line"] for m in found["messages"]] == [7]
    assert "1 lines longer than 65536 bytes skipped" in found["notes"]


@pytest.mark.slow  # a process of its own
def test_an_endless_device_is_one_error_line_not_a_memory_blow_up() -> None:
    """`/dev/zero` has no newline: read line by line whole, it filled memory (exit 3,
    MemoryError). Its NUL bytes say it is no text log."""
    import resource
    import subprocess
    import sys

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    done = subprocess.run(
        [sys.executable, "-m", "kvcanary_cli", "leak", "--sglang-log", "/dev/zero"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=capped,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == "error: /dev/zero: is not a text log (binary data)\n"


# --- with a dump: the pages decide ----------------------------------------------------------


def _dump(path: Path, *, free: list[int], tree: list[int]) -> Path:
    """An idle dump of a 16-slot full pool (page size 1) recording what SGLang's memory-check
    capture records: the free list, the tree's values (node by node) and the running rows."""
    save_dump(
        path,
        metadata={"num_full_slots": TOTAL + 1, "page_size": 1, "forward_mode": "idle"},
        req_to_token=np.zeros((2, 8), dtype=np.int32),
        req_pool_indices=np.zeros(0, dtype=np.int64),
        prefix_lens=np.zeros(0, dtype=np.int64),
        extend_seq_lens=np.zeros(0, dtype=np.int64),
        free_full_slots=np.array(free, dtype=np.int64),
        tree_full_slots=np.sort(np.array(tree, dtype=np.int64)),
        req_pool_allocated_lens=np.zeros(2, dtype=np.int64),
    )
    return path


def _line(free: list[int], tree: list[int]) -> str:
    """SGLang's idle message on that state: available counts free-list entries, evictable
    each node's values."""
    return f"pool memory leak detected! {counts('full', TOTAL, len(free), len(tree))}"


FREE = list(range(1, 13))
#: state -> (free list, tree values, verdict, cause, the pages named, where)
TWINS = {
    "two-nodes-share": (FREE, [13, 14, 15, 16, 13, 14], "miscount", CauseCode.SGLANG_MISCOUNT,
                        [13, 14], "shared_pages"),
    "leak": (FREE, [13, 14], "leak", CauseCode.FULL_LEAK, [15, 16], "leaked_pages"),
    "double-free": ([*FREE, 3], [13, 14, 15, 16], "freed-twice", CauseCode.DOUBLE_FREE, [3],
                    "double_freed_pages"),
    "clean": (FREE, [13, 14, 15, 16], "balanced", None, [], "leaked_pages"),
}  # fmt: skip


@pytest.mark.parametrize("state", sorted(TWINS))
def test_the_dump_tells_a_leak_from_a_miscount(state: str, tmp_path: Path) -> None:
    free, tree, verdict, cause, pages, where = TWINS[state]
    dump = _dump(tmp_path / f"{state}.safetensors", free=free, tree=tree)
    result = run("leak", _line(free, tree), dump, "-f", "json")
    assert result.exit_code == (0 if verdict == "balanced" else 1), result.stderr
    found = record(result)
    assert (found["verdict"], found["cause"], found["judged"]) == (verdict, cause, 0)
    [full] = found["pools"]  # no LUT: no SWA pool
    assert full[where] == pages
    assert full["printed_difference"] == full["expected_difference"]
    others = {"leaked_pages", "double_freed_pages", "shared_pages"} - {where}
    assert all(full[key] == [] for key in others)


def test_a_miscount_says_nothing_leaked_in_every_view(tmp_path: Path) -> None:
    free, tree, *_ = TWINS["two-nodes-share"]
    dump = _dump(tmp_path / "share.safetensors", free=free, tree=tree)
    for fmt in ("table", "markdown"):
        said = " ".join(run("leak", _line(free, tree), dump, "-f", fmt, "--max-rows", "5")
                        .stdout.split())  # fmt: skip
        assert "miscount" in said and "nothing leaked" in said
        assert "held by two tree nodes" in said and "slots 13, 14" in said


def test_a_sum_the_dump_does_not_explain_is_still_a_miscount(tmp_path: Path) -> None:
    """Every slot owned and listed once, and SGLang printed 3 short: its counters drifted."""
    dump = _dump(tmp_path / "drift.safetensors", free=FREE, tree=[13, 14, 15, 16])
    line = f"pool memory leak detected! {counts('full', TOTAL, 12, 1)}"
    found = record(run("leak", line, dump, "-f", "json"))
    assert found["verdict"] == "miscount"
    [full] = found["pools"]
    assert (full["printed_difference"], full["expected_difference"]) == (3, 0)
    assert any("do not explain 3 short" in line for line in full["explanation"])


# --- with a dump: the request pool's rows decide ---------------------------------------------

#: A request pool of 11 rows (the table's 12 less its padding row 0).
ROWS = 11


def _rows_dump(
    path: Path, *, free: list[int], held: list[int], batch: tuple[int, ...] = ()
) -> Path:
    """A dump of a request pool recording its free list and the rows running requests and
    sessions hold (idle unless a `batch` runs)."""
    save_dump(
        path,
        metadata={"page_size": 1, "forward_mode": "idle" if not batch else "extend"},
        req_to_token=np.zeros((ROWS + 1, 8), dtype=np.int32),
        req_pool_indices=np.array(batch, dtype=np.int64),
        prefix_lens=np.zeros(len(batch), dtype=np.int64),
        extend_seq_lens=np.zeros(len(batch), dtype=np.int64),
        free_req_rows=np.array(free, dtype=np.int64),
        running_req_rows=np.array(held, dtype=np.int64),
    )
    return path


def _rows_line(available: int, session_held: int) -> str:
    return (
        f"req_to_token_pool memory leak detected!available_size={available}, "
        f"session_held={session_held}, total_size={ROWS}"
    )


ROW_FREE = list(range(1, 10))
#: state -> (free list, rows held, SGLang's available and session_held, verdict, cause, rows
#: named, where)
ROW_TWINS = {
    "clean": (ROW_FREE, [10, 11], (9, 2), "balanced", None, [], "leaked_rows"),
    "leak": (ROW_FREE, [10], (9, 1), "leak", CauseCode.REQ_ROW_LEAK, [11], "leaked_rows"),
    "double-free": ([*ROW_FREE, 3], [10, 11], (10, 2), "freed-twice",
                    CauseCode.REQ_ROW_DOUBLE_FREE, [3], "twice_rows"),
    "free-and-held": ([*ROW_FREE, 10], [10, 11], (10, 2), "freed-twice",
                      CauseCode.REQ_ROW_DOUBLE_FREE, [10], "twice_rows"),
    "miscount": (ROW_FREE, [10, 11], (9, 1), "miscount", CauseCode.SGLANG_MISCOUNT, [],
                 "leaked_rows"),
}  # fmt: skip


@pytest.mark.parametrize("state", sorted(ROW_TWINS))
def test_the_dump_tells_a_leaked_row_from_a_miscount(state: str, tmp_path: Path) -> None:
    """The request pool's message at idle: rows neither free nor held are leaked, a row
    listed twice is freed twice, and every row owned once with SGLang's counts not the dump's
    is its count wrong; the clean twin balances."""
    free, held, (available, sessions), verdict, cause, rows, where = ROW_TWINS[state]
    dump = _rows_dump(tmp_path / f"{state}.safetensors", free=free, held=held)
    result = run("leak", _rows_line(available, sessions), dump, "-f", "json")
    assert result.exit_code == (0 if verdict == "balanced" else 1), result.stderr
    found = record(result)
    assert (found["verdict"], found["cause"]) == (verdict, cause), found["summary"]
    account = found["rows"]
    assert (account["verdict"], account[where], account["rows"]) == (verdict, rows, ROWS)
    assert found["pools"] == [] and found["notes"] == []  # no pool here to count
    if state == "miscount":
        assert "session_held 1, the dump's sessions hold 2 rows" in found["summary"]
    table = " ".join(run("leak", _rows_line(available, sessions), dump).stdout.split())
    assert f"{verdict}" in table and "[rows] the dump: " in table


def test_a_busy_dump_decides_no_count_of_the_idle_check(tmp_path: Path) -> None:
    """SGLang counts rows at idle: against a dump where a batch runs its counts are not
    compared (undecided), but a leaked row is leaked at any moment."""
    dump = _rows_dump(tmp_path / "busy.safetensors", free=ROW_FREE, held=[10, 11], batch=(10,))
    found = record(run("leak", _rows_line(9, 0), dump, "-f", "json"))
    assert (found["verdict"], found["rows"]["verdict"], found["rows"]["busy"]) == (
        "undecided",
        "unknown",
        True,
    )
    assert "SGLang counts rows at idle" in " ".join(found["notes"])
    dump = _rows_dump(tmp_path / "leak.safetensors", free=ROW_FREE, held=[10], batch=(10,))
    found = record(run("leak", _rows_line(9, 0), dump, "-f", "json"))
    assert (found["verdict"], found["rows"]["leaked_rows"]) == ("leak", [11])


@pytest.mark.parametrize("table_rows", [0, 1, ROWS])
def test_a_dump_of_another_pool_decides_no_count(table_rows: int, tmp_path: Path) -> None:
    """SGLang's message names a pool of 11 rows; a dump whose table has another number of
    rows (none at all, only its padding row, or 10) is not that pool: its counts are not
    compared (undecided, a note saying both sizes), never an internal error; `check`, which
    counts the same rows, reads it too."""
    path = tmp_path / "other.safetensors"
    save_dump(
        path,
        metadata={"page_size": 1, "forward_mode": "idle"},
        req_to_token=np.zeros((table_rows, 8), dtype=np.int32),
        req_pool_indices=np.zeros(0, dtype=np.int64),
        prefix_lens=np.zeros(0, dtype=np.int64),
        extend_seq_lens=np.zeros(0, dtype=np.int64),
        free_req_rows=np.arange(1, max(table_rows, 1), dtype=np.int64),  # every row free
        running_req_rows=np.array([-1], dtype=np.int64),
    )
    result = run("leak", _rows_line(6, 0).replace(f"total_size={ROWS}", "total_size=12"), path,
                 "-f", "json")  # fmt: skip
    assert result.exit_code == 1, result.stderr
    found = record(result)
    assert (found["verdict"], found["rows"]["verdict"]) == ("undecided", "unknown")
    assert f"has {max(table_rows - 1, 0)} rows, SGLang's message 12" in found["notes"][0]
    checked = run("check", path, "-k", "none", "-f", "json")  # the same census, in `check`
    assert checked.exit_code == 0, checked.stderr  # every row free: no finding, no crash


@pytest.mark.parametrize(
    "scenario", ["req-row-leaked", "req-row-freed-twice", "req-row-freed-while-running"]
)
def test_leak_names_the_rows_and_cause_check_names(scenario: str, tmp_path: Path) -> None:
    """Differential: on each synthesized row fault, `leak` points to the cause `check` ranks
    first and names the rows its finding names."""
    dump = tmp_path / f"{scenario}.safetensors"
    assert run("synth", scenario, "--out", dump).exit_code == 0
    checked = json.loads(run("check", dump, "-k", "none", "-f", "json").stdout)["dumps"][0]
    [finding] = checked["findings"]
    found = record(run("leak", _rows_line(6, 0), dump, "-f", "json"))
    assert found["cause"] == checked["diagnosis"][0]["cause"] == finding["cause"]
    named = found["rows"]["leaked_rows"] + found["rows"]["twice_rows"]
    assert named == finding["details"]["rows"], (named, finding)


def test_a_log_and_its_dump(tmp_path: Path) -> None:
    """`--sglang-log FILE DUMP`: the one argument is the dump; the log's last pool message is
    the one judged."""
    log = _log(tmp_path / "server.log")
    dump = _dump(tmp_path / "share.safetensors", free=FREE, tree=[13, 14, 15, 16, 13, 14])
    found = record(run("leak", "--sglang-log", log, dump, "-f", "json"))
    assert found["dump"] == str(dump) and found["verdict"] == "miscount"
    out = tmp_path / "report.json"
    assert run("leak", "--sglang-log", log, dump, "-f", "json", "-o", out).exit_code == 1
    assert json.loads(out.read_text()) == found


def test_text_from_the_line_reaches_no_view_raw() -> None:
    line = (
        "\x1b[31m pool memory leak detected! [full] total=16, available=12, evictable=4, "
        "protected=0, session_held=0, uncached=0, class_free_pages=\x1b]8;;x\x07@octocat"
    )
    for fmt in ("table", "markdown", "json"):
        result = run("leak", line, "-f", fmt)
        assert result.exit_code == 0, result.stderr
        assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    rest = record(run("leak", line, "-f", "json"))["messages"][0]["pools"][0]["rest"]
    assert rest == "class_free_pages=\x1b]8;;x\x07@octocat"  # exact in JSON


# --- what a release prints after the counts ------------------------------------------------

#: 0.5.21 on, page-interleave sharding: the class watermark, and counts that are not whole
#: pages, which SGLang reports though the sum holds (its wording, as
#: tests/integration/test_sglang_leak_releases.py has the release's own checker print it).
UNALIGNED = (
    f"Full Pool Mem Leak Detected! {counts('full', TOTAL, 12, 3, 1)}, class_free_pages=[3, 3], "
    "unaligned_sharded_counts={'evictable': 3, 'uncached': 1}, page_size=2"
)


def test_counts_that_are_not_whole_pages_are_a_finding_though_the_sum_holds() -> None:
    result = run("leak", UNALIGNED, "-f", "json")
    assert result.exit_code == 1, result.stderr
    found = record(result)
    assert found["verdict"] == "undecided" and "not whole pages" in found["summary"]
    [full] = found["messages"][0]["pools"]
    assert (full["difference"], full["reading"]) == (0, "balanced")
    assert (full["class_free_pages"], full["unaligned"]) == ([3, 3], ["evictable", "uncached"])
    said = " ".join(found["messages"][0]["arithmetic"])
    assert "evictable 3, uncached 1: not whole pages of page size 2" in said
    assert "3 + 3 = 6 free pages, the slots available counts (6 x 2 slots)" in said


def test_unaligned_counts_over_a_clean_dump_are_sglangs_miscount(tmp_path: Path) -> None:
    dump = _dump(tmp_path / "clean.safetensors", free=FREE, tree=[13, 14, 15, 16])
    found = record(run("leak", UNALIGNED, dump, "-f", "json"))
    assert (found["verdict"], found["cause"]) == ("miscount", CauseCode.SGLANG_MISCOUNT)


#: 0.5.15 on, with decode-context parallelism: a difference SGLang lets pass.
SLACK = f"[Mem Check (BUSY)] {counts('full', 64, 40, 20)}, dcp_physical_page_slack_allowed=True"


def test_the_slack_sglang_allows_under_dcp_is_no_finding(tmp_path: Path) -> None:
    result = run("leak", SLACK, "-f", "json")
    assert result.exit_code == 0, result.stderr
    found = record(result)
    [full] = found["messages"][0]["pools"]
    assert (full["difference"], full["reading"], full["tolerated"]) == (4, "short", True)
    assert found["verdict"] == "balanced" and not found["messages"][0]["faulty"]
    log = tmp_path / "dcp.log"
    log.write_text(f"[2026-12-05 10:00:01 TP0] {SLACK}\n" * 3)
    found = record(run("leak", "--sglang-log", log, "-f", "json"))
    assert (found["balanced_busy_lines"], found["messages"]) == (3, [])


def test_the_dcp_slack_over_a_clean_dump_is_no_miscount(tmp_path: Path) -> None:
    dump = _dump(tmp_path / "clean.safetensors", free=FREE, tree=[13, 14, 15, 16])
    line = (
        f"[Mem Check (BUSY)] {counts('full', TOTAL, 12, 2)}, dcp_physical_page_slack_allowed=True"
    )
    found = record(run("leak", line, dump, "-f", "json"))
    assert found["verdict"] == "balanced"
    [full] = found["pools"]
    assert (full["verdict"], full["printed_difference"]) == ("balanced", 2)
    assert "lets pass under decode-context parallelism" in full["explanation"][-1]


#: A hybrid-SWA model without full-attention layers: SGLang 0.5.13 and 0.5.14 print its full
#: pool with `total=None` (and flag it at every check), 0.5.15 on an empty line.
UNSIZED = "[full] total=None, available=0, evictable=0, protected=0, session_held=0, uncached=0"


@pytest.mark.parametrize(
    "line",
    [f"Full Pool Mem Leak Detected! {UNSIZED}", f"[Mem Check (BUSY)] {UNSIZED}",
     "[Mem Check (BUSY)] "],
    ids=["assert-none", "busy-none", "busy-empty"],
)  # fmt: skip
def test_a_pool_without_a_size_is_read_with_nothing_to_add_up(line: str) -> None:
    result = run("leak", line, "-f", "json")
    assert result.exit_code == 0, result.stderr
    found = record(result)
    [message] = found["messages"]
    assert message["pools"] == [] and not message["faulty"]
    assert "nothing to add up" in " ".join(message["arithmetic"])
    assert "nothing to add up" in found["summary"]


def test_the_idle_report_with_a_pool_without_a_size_reads_the_other_pools(tmp_path: Path) -> None:
    line = f"pool memory leak detected! {UNSIZED}\n{counts('swa', 32, 20, 0)}"
    found = record(run("leak", line, "-f", "json"))
    [message] = found["messages"]
    assert [(p["pool"], p["difference"]) for p in message["pools"]] == [("swa", 12)]
    assert any("total=None" in w for w in message["arithmetic"])
    log = tmp_path / "swa-only.log"
    log.write_text("[2026-12-05 10:00:01 TP0] [Mem Check (BUSY)] \n" * 2 + f"x {line}\n")
    found = record(run("leak", "--sglang-log", log, "-f", "json"))
    assert found["unread"] == 0 and [m["line"] for m in found["messages"]] == [3]


def test_the_mamba_lines_census_is_counted_and_a_cut_one_says_so() -> None:
    slots = ", ".join(map(str, range(6, 301)))
    line = f"{counts('mamba', 300, 5, 0)}, leaked_full_pages=None, leaked_mamba_pages={{{slots}}}"
    said = record(run("leak", line, "-f", "json"))["messages"][0]["arithmetic"]
    assert any("(leaked_mamba_pages): at least " in w and "(6, 7, 8, 9" in w for w in said)
    assert any("among them): none" in w for w in said)
    short = f"{counts('mamba', 8, 5, 0)}, leaked_full_pages={{3}}, leaked_mamba_pages={{8, 6, 7}}"
    said = record(run("leak", short, "-f", "json"))["messages"][0]["arithmetic"]
    assert any("(leaked_mamba_pages): 3 (6, 7, 8)" in w for w in said)
    assert any("among them): 1 (3)" in w for w in said)
