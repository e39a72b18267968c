"""`kvcanary leak`: SGLang's memory-check messages (`analysis.sglang_messages`) set against a
dump of the same moment, and the verdict.

SGLang's pool check sums counts: `available + evictable + protected + session_held + uncached
== total`. Two kinds of fault put it off, and only the pages tell them apart:

- a real leak: pages owned by nobody (not free, not the tree's, not a running request's); the
  sum comes out short by them (`bookkeeping.full_leaks`, `bookkeeping.leaked_swa_pages`);
- a count that is wrong while every page is owned: a page on a free list twice (a double free:
  `available` counts entries), or a page two tree nodes hold (`evictable` and `protected` sum
  node by node, so the page counts twice: nothing leaked, and SGLang's strict idle check still
  raises and stops the scheduler). The dump's tree lists (`tree_full_slots`,
  `tree_swa_resident_slots`: every node's values, concatenated) name such pages twice.

So the difference SGLang's sum should show on a state is its leaked slots less the slots listed
twice; each pool's account says which pages make it up, and whether SGLang's printed difference
is that. The work is a few sorts over the free lists and the tree's lists.

The request pool's check (`req_to_token_pool memory leak detected!`) sums rows at idle: rows
free plus rows streaming sessions keep. Its dump's rows (`analysis.req_rows`) tell the same
three apart: rows neither free nor held (leaked), a row listed or held twice (freed twice), or
every row owned once and SGLang's counts not the dump's (its count wrong).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from kvcanary_cli.analysis.bookkeeping import full_leaks, leaked_swa_pages, pages_text
from kvcanary_cli.analysis.cells import distinct
from kvcanary_cli.analysis.req_rows import pool_rows, row_census
from kvcanary_cli.analysis.sglang_messages import MessageScan, read_line, read_log
from kvcanary_cli.canary.logs import MAX_LINE_BYTES
from kvcanary_cli.catalog import CauseCode
from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.dump.tensor import union
from kvcanary_cli.errors import OptionError
from kvcanary_cli.results.leak import (
    LeakMessage,
    LeakReport,
    LeakVerdict,
    PoolAccount,
    PoolVerdict,
    RowAccount,
)

__all__ = ["leak_report"]

#: The verdicts, worst first.
_ORDER: tuple[LeakVerdict, ...] = (
    "leak",
    "freed-twice",
    "freed-while-used",
    "miscount",
    "undecided",
    "balanced",
)


def leak_report(
    line: str | None,
    *,
    log: str | os.PathLike[str] | None = None,
    dump: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, int | str | None] | None = None,
) -> LeakReport:
    """Read `line` (or the log `log`), do its arithmetic, and with `dump` say whether what
    SGLang reported is a real leak, a double free or SGLang's miscount, with the pages."""
    if (line is None) == (log is None):
        raise OptionError(
            "give one of SGLang's memory-check messages, or a log of them: one of the two",
            option="line/log",
        )
    scan = read_line(line) if line is not None else read_log(os.fspath(log or ""))
    source = "LINE" if line is not None else os.fspath(log or "")
    notes = _scan_notes(scan)
    messages = tuple(scan.messages)
    if dump is None:
        verdict = _alone(messages)
        return _report(source, None, scan, messages, None, (), verdict, notes)
    loaded = load_dump(dump, overrides=overrides)
    judged = _judged(messages)
    message = messages[judged] if judged is not None else None
    pools: tuple[PoolAccount, ...] = (_full_account(loaded, message),)
    if loaded.full_to_swa_index_mapping is not None or _printed(message, "swa") is not None:
        pools += (_swa_account(loaded, message),)  # a dump without SWA: no SWA pool
    said = [m for m in messages if m.kind == "req-pool"]
    rows = _row_account(loaded, said[-1]) if said else None
    if said and len(said) == len(messages):  # rows alone: a pool the dump cannot count is noise
        pools = tuple(pool for pool in pools if pool.verdict != "unknown")
    verdict = _with_dump(messages, pools, rows)
    notes += _dump_notes(pools, rows)
    return _report(source, os.fspath(dump), scan, messages, judged, pools, verdict, notes, rows)


def _report(
    source: str,
    dump: str | None,
    scan: MessageScan,
    messages: tuple[LeakMessage, ...],
    judged: int | None,
    pools: tuple[PoolAccount, ...],
    verdict: LeakVerdict,
    notes: list[str],
    rows: RowAccount | None = None,
) -> LeakReport:
    return LeakReport(
        source=source,
        dump=dump,
        messages=messages,
        unread=scan.unread,
        unread_lines=tuple(scan.unread_lines),
        balanced_busy_lines=scan.balanced_busy_lines,
        judged=judged,
        pools=pools,
        rows=rows,
        verdict=verdict,
        cause=_cause(verdict, pools, rows),
        summary=_summary(verdict, messages, pools, rows, dump is not None),
        notes=tuple(notes),
    )


def _scan_notes(scan: MessageScan) -> list[str]:
    notes = []
    if scan.unread:
        shown = ", ".join(map(str, scan.unread_lines))
        notes.append(
            f"{scan.unread} lines start one of SGLang's messages but do not parse "
            f"(lines {shown}{', ...' if scan.unread > len(scan.unread_lines) else ''}): "
            f"{scan.first_unread}"
        )
    if scan.dropped:
        notes.append(f"{scan.dropped} more messages not kept (the first ones are)")
    if scan.overlong:
        notes.append(f"{scan.overlong} lines longer than {MAX_LINE_BYTES} bytes skipped")
    if scan.balanced_busy_lines:
        notes.append(
            f"{scan.balanced_busy_lines} busy-check lines ([Mem Check (BUSY)]) that are no "
            "finding (their sums hold, or SGLang lets them pass, or they hold no counts) are "
            "not listed"
        )
    return notes


def _judged(messages: tuple[LeakMessage, ...]) -> int | None:
    """The message set against the dump: the last with pool sums, else the last."""
    with_sums = [i for i, m in enumerate(messages) if m.pools]
    if with_sums:
        return with_sums[-1]
    return len(messages) - 1 if messages else None


def _alone(messages: tuple[LeakMessage, ...]) -> LeakVerdict:
    """The verdict of the messages alone: what SGLang saw itself, else undecided when a
    sum is off."""
    kinds = {m.kind for m in messages if m.faulty}
    if kinds & {"kv-double-free", "class-double-free", "mamba-double-free"}:
        return "freed-twice"
    if "kv-use-after-free" in kinds:
        return "freed-while-used"
    return "undecided" if kinds else "balanced"


def _with_dump(
    messages: tuple[LeakMessage, ...],
    pools: tuple[PoolAccount, ...],
    rows: RowAccount | None,
) -> LeakVerdict:
    found: set[LeakVerdict] = set()
    counted: list[PoolAccount | RowAccount] = [*pools, *([] if rows is None else [rows])]
    for account in counted:
        if account.verdict in ("leak", "freed-twice", "miscount"):
            found.add(account.verdict)
    alone = _alone(messages)
    if alone in ("freed-twice", "freed-while-used"):
        found.add(alone)
    if not found and any(a.verdict == "unknown" for a in counted) and alone != "balanced":
        found.add("undecided")
    return next((v for v in _ORDER if v in found), "balanced")


def _cause(
    verdict: LeakVerdict, pools: tuple[PoolAccount, ...], rows: RowAccount | None
) -> CauseCode | None:
    pages = {p.verdict for p in pools}
    if verdict == "leak":
        if "leak" not in pages:  # the request pool's rows alone
            return CauseCode.REQ_ROW_LEAK
        full = any(p.pool == "full" and p.verdict == "leak" for p in pools)
        return CauseCode.FULL_LEAK if full else CauseCode.SWA_LEAK
    if verdict == "freed-twice" and rows is not None and rows.twice and "freed-twice" not in pages:
        return CauseCode.REQ_ROW_DOUBLE_FREE
    return {
        "freed-twice": CauseCode.DOUBLE_FREE,
        "freed-while-used": CauseCode.USE_AFTER_FREE,
        "miscount": CauseCode.SGLANG_MISCOUNT,
    }.get(verdict)


def _summary(
    verdict: LeakVerdict,
    messages: tuple[LeakMessage, ...],
    pools: tuple[PoolAccount, ...],
    rows: RowAccount | None,
    with_dump: bool,
) -> str:
    by_rows = _rows_summary(verdict, rows, pools)
    if by_rows is not None:
        return by_rows
    if verdict == "leak":
        parts = [
            f"{p.pool} {pages_text(p.leaked_pages, p.page_size)}"
            for p in pools
            if p.verdict == "leak"
        ]
        return f"a real leak: pages owned by nobody ({'; '.join(parts)})"
    if verdict == "freed-twice":
        parts = [
            f"{p.pool} {pages_text(p.double_freed_pages, p.page_size)}"
            for p in pools
            if p.double_freed_pages
        ]
        listed = f" ({'; '.join(parts)})" if parts else ""
        if not parts and all(m.kind == "mamba-double-free" for m in messages if m.faulty):
            return "a double free: a request's Mamba slot freed a second time (SGLang's assert)"
        return f"a double free: pages on a free list twice{listed}"
    if verdict == "freed-while-used":
        return "a use after free: pages running requests still use are on the free list"
    if verdict == "miscount":
        shared = [
            f"{p.pool} {pages_text(p.shared_pages, p.page_size)}" for p in pools if p.shared_pages
        ]
        why = (
            f"; its evictable/protected count pages two tree nodes hold twice ({'; '.join(shared)})"
            if shared
            else "; its counters disagree with its own lists"
        )
        return (
            "SGLang's count is wrong and nothing leaked: every page is free, the tree's or a "
            f"running request's, and no free list holds one twice{why}"
        )
    if verdict == "undecided" and not with_dump and _unaligned_only(messages):
        return (
            "SGLang's counts are not whole pages (page-interleave sharding), which it reports "
            "as a leak though the sum holds; a count off by part of a page and lost pages "
            "read the same in numbers alone: give a dump of the same moment (`kvcanary leak "
            "LINE DUMP`)"
        )
    if verdict == "undecided":
        return (
            "SGLang's numbers do not add up; a leak and a wrong count read the same in numbers "
            "alone: give a dump of the same moment (`kvcanary leak LINE DUMP`)"
            if not with_dump
            else "SGLang's numbers do not add up, and the dump cannot count the pools or rows "
            "they name (see the notes)"
        )
    if messages and not any(m.pools or m.kind not in _POOL_KINDS for m in messages):
        return (
            "nothing to add up: SGLang printed no counts for a pool here (the arithmetic says "
            "why)" + ("; the dump's pools balance" if with_dump else "")
        )
    return "nothing is off: SGLang's sums hold" + (" and the dump agrees" if with_dump else "")


#: The messages that print pool sums.
_POOL_KINDS = ("idle-pools", "busy-assert", "busy-log")


def _rows_summary(
    verdict: LeakVerdict, rows: RowAccount | None, pools: tuple[PoolAccount, ...]
) -> str | None:
    """The verdict in the request pool's words, where its rows decide it (no pool's pages
    do); None where they do not."""
    if rows is None or rows.verdict != verdict or any(p.verdict == verdict for p in pools):
        return None
    if verdict == "leak":
        return (
            "a real leak: request-pool rows neither free nor held by a running request or "
            f"session ({_rows_text(rows.leaked_rows, rows.leaked)})"
        )
    if verdict == "freed-twice":
        return (
            "a double free: request-pool rows listed free twice, held twice, or free and held "
            f"({_rows_text(rows.twice_rows, rows.twice)})"
        )
    if verdict == "miscount":
        return (
            "SGLang's count is wrong and nothing leaked: every request-pool row is free or "
            f"held, each once; {rows.explanation[-1].removeprefix('[rows] ')}"
        )
    return None


def _rows_text(rows: tuple[int, ...], count: int) -> str:
    """`rows 3, 7` or `rows 3, 7, 9, ... (20 in all)`."""
    more = f", ... ({count} in all)" if count > len(rows) else ""
    return f"row{'s' if count > 1 else ''} {', '.join(map(str, rows))}{more}"


def _unaligned_only(messages: tuple[LeakMessage, ...]) -> bool:
    """SGLang flagged counts that are not whole pages, and no sum it printed is off."""
    pools = [p for m in messages if m.faulty for p in m.pools]
    return any(p.unaligned for p in pools) and not any(
        p.reading in ("short", "over") and not p.tolerated for p in pools
    )


# --- the dump's request-pool rows, counted ---------------------------------------------------

#: Rows an account names (the counts are whole).
_ROWS_NAMED = 16


def _row_account(dump: KvDump, message: LeakMessage) -> RowAccount:
    """The dump's rows as SGLang's idle check counts them, against what `message` printed."""
    table = int(dump.req_to_token.shape[0])
    census = row_census(dump)
    if census is None or census.leaked is None:  # it needs both lists
        reason = (
            "the dump does not record free_req_rows and running_req_rows (a capture at "
            "SGLang's memory check does)"
        )
        return RowAccount(
            verdict="unknown", rows=max(table - 1, 0), free=0, free_listed_twice=0, held=0,
            busy=False, leaked=0, leaked_rows=(), twice=0, twice_rows=(), reason=reason,
            explanation=(f"[rows] not counted: {reason}",),
        )  # fmt: skip
    listed, held, leaked = census.listed, census.held, census.leaked
    free = distinct(listed)
    twice = union(census.twice, census.free_and_held)
    busy = pool_rows(dump.req_pool_indices, table).size > 0
    size = max(table - 1, 0)
    other = message.rows_total is not None and message.rows_total != size
    counts = [] if busy or other else _printed_rows(message, free.size, held.size)
    verdict: PoolVerdict
    if leaked.size:
        verdict = "leak"
    elif twice.size:
        verdict = "freed-twice"
    elif busy or other:  # SGLang counts this pool at idle: another moment's, or pool's
        verdict = "unknown"
    elif counts:
        verdict = "miscount"
    else:
        verdict = "balanced"
    head = (
        f"[rows] the dump: {free.size} of the pool's {size} rows free"
        + (f" ({listed.size} free-list entries)" if listed.size != free.size else "")
        + f", {held.size} held by running requests and streaming sessions"
        + (
            " (a batch runs: not the idle moment SGLang counts, so its counts are not compared)"
            if busy
            else ""
        )
    )
    lines = [head]
    if leaked.size:
        lines.append(
            f"[rows] leaked, neither free nor held: {_rows_text(_named(leaked), leaked.size)} "
            f"(its cells: `kvcanary provenance DUMP --row {int(leaked[0])}`)"
        )
    if twice.size:
        lines.append(
            "[rows] freed twice (listed free twice, held twice, or free and held): "
            + _rows_text(_named(twice), twice.size)
        )
    if verdict in ("miscount", "balanced"):
        lines.append("[rows] every row is free or held, each once: nothing leaked")
        lines.append(
            "[rows] " + "; ".join(counts)
            if counts
            else "[rows] SGLang's counts are the dump's: the rest of its sum is the pool's "
            "pre-allocated rows, which it adds to total_size and does not print"
        )
    why: str | None = None
    if verdict == "unknown":
        why = (
            f"the dump's request pool has {size} rows, SGLang's message {message.rows_total}: "
            "not the pool it counted (give a dump of that pool)"
            if other
            else "a batch runs in the dump: SGLang counts rows at idle (give a dump of that moment)"
        )
    return RowAccount(
        verdict=verdict, rows=size, free=int(free.size),
        free_listed_twice=int(listed.size - free.size), held=int(held.size), busy=busy,
        leaked=int(leaked.size), leaked_rows=_named(leaked), twice=int(twice.size),
        twice_rows=_named(twice), reason=why,
        explanation=tuple(lines),
    )  # fmt: skip


def _printed_rows(message: LeakMessage, free: int, held: int) -> list[str]:
    """Where SGLang's printed row counts are not an idle dump's (every held row a session's)."""
    off = []
    if message.rows_available is not None and message.rows_available != free:
        off.append(f"SGLang printed available_size {message.rows_available}, the dump has {free}")
    session = message.rows_session_held
    if session is not None and session != held:
        off.append(f"SGLang printed session_held {session}, the dump's sessions hold {held} rows")
    return off


def _named(rows: np.ndarray) -> tuple[int, ...]:
    return tuple(int(r) for r in rows[:_ROWS_NAMED])


# --- the dump's pools, counted ---------------------------------------------------------------


def _page(dump: KvDump) -> int:
    value = dump.scalars["page_size"].value
    return max(1, int(value)) if isinstance(value, int) else 1


def _twice(values: np.ndarray) -> tuple[int, np.ndarray]:
    """(entries beyond each value's first, the values listed more than once)."""
    flat = np.asarray(values, dtype=np.int64).reshape(-1)
    if flat.size == 0:
        return 0, flat
    ordered = np.sort(flat)
    again = ordered[1:][ordered[1:] == ordered[:-1]]
    return int(again.size), distinct(again)


def _printed(message: LeakMessage | None, pool: str) -> int | None:
    if message is None:
        return None
    sums = [p for p in message.pools if p.pool == pool and p.reading != "skipped"]
    return sums[0].difference if sums else None


def _marks(message: LeakMessage | None, pool: str) -> tuple[bool, bool]:
    """(SGLang flagged the pool's counts as not whole pages, though its sum may hold; it let
    the pool's difference pass: DCP's slack)."""
    sums = [p for p in message.pools if p.pool == pool] if message is not None else []
    return any(p.unaligned for p in sums), any(p.tolerated for p in sums)


def _unknown(pool: str, page: int, printed: int | None, reason: str) -> PoolAccount:
    empty: tuple[int, ...] = ()
    return PoolAccount(
        pool="full" if pool == "full" else "swa",
        page_size=page,
        verdict="unknown",
        leaked_pages=empty,
        double_freed_pages=empty,
        shared_pages=empty,
        free=0,
        free_listed_twice=0,
        tree=0,
        tree_listed_twice=0,
        expected_difference=0,
        printed_difference=printed,
        reason=reason,
        explanation=(f"[{pool}] not counted: {reason}",),
    )


def _full_account(dump: KvDump, message: LeakMessage | None) -> PoolAccount:
    page = _page(dump)
    printed = _printed(message, "full")
    found = full_leaks(dump)
    if found is None:
        return _unknown(
            "full",
            page,
            printed,
            "the dump does not record tree_full_slots, req_pool_allocated_lens, "
            "free_full_slots and num_full_slots (a capture at SGLang's memory check does)",
        )
    leaked, counts = found
    size = int(counts["total"]) + page
    tree = np.asarray(dump.tree_full_slots, dtype=np.int64).reshape(-1)
    tree = tree[(tree >= page) & (tree < size)]
    tree_twice, shared = _twice(tree)
    free = np.asarray(dump.free_full_slots, dtype=np.int64).reshape(-1)
    free = free[(free >= page) & (free < size)]
    free_twice, repeated = _twice(free)
    return _account(
        "full",
        page,
        leaked_slots=leaked,
        repeated=repeated,
        shared=shared,
        free=int(counts["available"]),
        free_twice=free_twice,
        tree=int(counts["tree"]),
        tree_twice=tree_twice,
        running=int(counts["uncached"]),
        printed=printed,
        marks=_marks(message, "full"),
    )


def _swa_account(dump: KvDump, message: LeakMessage | None) -> PoolAccount:
    page = _page(dump)
    printed = _printed(message, "swa")
    leaked_pages, reason = leaked_swa_pages(dump)
    if leaked_pages is None:
        return _unknown("swa", page, printed, reason or "not a hybrid-SWA dump (no LUT)")
    free = np.asarray(
        dump.free_swa_slots if dump.free_swa_slots is not None else [], dtype=np.int64
    ).reshape(-1)
    free = free[free >= page]
    free_twice, repeated = _twice(free)
    resident = dump.tree_swa_resident_slots
    tree_twice, shared, tree_count = 0, np.zeros(0, dtype=np.int64), 0
    if resident is not None:
        held = np.asarray(resident, dtype=np.int64).reshape(-1)
        held = held[held >= page]
        tree_count = int(distinct(held).size)
        tree_twice, twice_full = _twice(held)
        shared = _swa_of(dump, twice_full)
    leaked_slots = (leaked_pages[:, None] * page + np.arange(page)[None, :]).reshape(-1)
    return _account(
        "swa",
        page,
        leaked_slots=leaked_slots,
        repeated=repeated,
        shared=shared,
        free=int(distinct(free).size),
        free_twice=free_twice,
        tree=tree_count,
        tree_twice=tree_twice,
        running=None,
        printed=printed,
        marks=_marks(message, "swa"),
    )


def _swa_of(dump: KvDump, full_slots: np.ndarray) -> np.ndarray:
    """The SWA slots the LUT maps `full_slots` to (0 where unmapped or unknown)."""
    lut = dump.full_to_swa_index_mapping
    if lut is None or full_slots.size == 0:
        return np.zeros(0, dtype=np.int64)
    inside = full_slots[(full_slots >= 0) & (full_slots < int(lut.shape[0]))]
    values, known = lut.take_known(inside)
    swa = np.asarray(values, dtype=np.int64)[np.asarray(known, dtype=bool)]
    mapped: np.ndarray = swa[swa > 0]
    return mapped


def _account(
    pool: str,
    page: int,
    *,
    leaked_slots: np.ndarray,
    repeated: np.ndarray,
    shared: np.ndarray,
    free: int,
    free_twice: int,
    tree: int,
    tree_twice: int,
    running: int | None,
    printed: int | None,
    marks: tuple[bool, bool],
) -> PoolAccount:
    unaligned, tolerated = marks
    leaked_pages = distinct(np.asarray(leaked_slots, dtype=np.int64) // page)
    double_freed = distinct(repeated // page)
    shared_pages = distinct(np.asarray(shared, dtype=np.int64) // page)
    expected = int(np.asarray(leaked_slots).size) - free_twice - tree_twice
    verdict: PoolVerdict
    if leaked_pages.size:
        verdict = "leak"
    elif double_freed.size:
        verdict = "freed-twice"
    elif tree_twice or unaligned or (printed not in (None, 0) and not tolerated):
        verdict = "miscount"
    else:
        verdict = "balanced"
    lines = [
        _counts_line(pool, free, free_twice, tree, tree_twice, running),
        *_verdict_lines(pool, page, verdict, leaked_pages, double_freed, shared_pages),
        _difference_line(pool, expected, printed, tolerated=tolerated),
    ]
    return PoolAccount(
        pool="full" if pool == "full" else "swa",
        page_size=page,
        verdict=verdict,
        leaked_pages=tuple(leaked_pages.tolist()),
        double_freed_pages=tuple(double_freed.tolist()),
        shared_pages=tuple(shared_pages.tolist()),
        free=free,
        free_listed_twice=free_twice,
        tree=tree,
        tree_listed_twice=tree_twice,
        expected_difference=expected,
        printed_difference=printed,
        reason=None,
        explanation=tuple(lines),
    )


def _counts_line(
    pool: str, free: int, free_twice: int, tree: int, tree_twice: int, running: int | None
) -> str:
    free_text = f"{free} slots free" + (
        f" ({free + free_twice} free-list entries: {free_twice} listed more than once)"
        if free_twice
        else ""
    )
    tree_text = (
        f"{tree} held by the tree" if pool == "full" else f"{tree} SWA-resident in the tree"
    ) + (
        f" ({tree + tree_twice} in its nodes' values: {tree_twice} in two nodes)"
        if tree_twice
        else ""
    )
    running_text = "" if running is None else f", {running} held by running requests only"
    return f"[{pool}] the dump: {free_text}, {tree_text}{running_text}"


def _verdict_lines(
    pool: str,
    page: int,
    verdict: PoolVerdict,
    leaked: np.ndarray,
    double_freed: np.ndarray,
    shared: np.ndarray,
) -> list[str]:
    lines = []
    if leaked.size:
        space = "" if pool == "full" else " --space swa"
        lines.append(
            f"[{pool}] leaked, owned by nobody (not free, not the tree's, not a running "
            f"request's): {pages_text(leaked, page)} (who held them last: `kvcanary "
            f"provenance DUMP --slot {int(leaked[0]) * page}{space}`)"
        )
    if double_freed.size:
        lines.append(
            f"[{pool}] freed twice, on the free list twice: {pages_text(double_freed, page)}"
        )
    if shared.size:
        lines.append(
            f"[{pool}] held by two tree nodes, counted once per node by SGLang's "
            f"evictable/protected: {pages_text(shared, page)}"
        )
    if verdict in ("miscount", "balanced"):
        lines.append(
            f"[{pool}] every page is owned (free, the tree's or a running request's) and on "
            "the free list at most once: nothing leaked"
        )
    if verdict == "miscount" and not shared.size:
        lines.append(f"[{pool}] SGLang's counters disagree with its own lists")
    return lines


def _difference_line(pool: str, expected: int, printed: int | None, *, tolerated: bool) -> str:
    head = (
        f"[{pool}] so SGLang's sum should come out {_signed(expected)} (leaked slots less the "
        "slots listed twice)"
    )
    if printed is None:
        return f"{head}; the message judged prints no sum for this pool"
    if printed == expected:
        return f"{head}: it printed {_signed(printed)}, exactly that"
    if tolerated:
        return (
            f"{head}; it printed {_signed(printed)}, which SGLang lets pass under "
            "decode-context parallelism (its counters and its pages are in two units)"
        )
    return (
        f"{head}; it printed {_signed(printed)}: the dump's lists do not explain "
        f"{_signed(printed - expected)} of it (a counter drifted, or the dump is of "
        "another moment than the message)"
    )


def _signed(difference: int) -> str:
    if difference == 0:
        return "even"
    return f"{difference} short" if difference > 0 else f"{-difference} over"


def _dump_notes(pools: tuple[PoolAccount, ...], rows: RowAccount | None) -> list[str]:
    notes = [
        f"{pool.pool}: not counted ({pool.reason})"
        for pool in pools
        if pool.verdict == "unknown" and pool.reason is not None
    ]
    if rows is not None and rows.reason is not None:
        notes.append(f"request-pool rows: not counted ({rows.reason})")
    return notes
