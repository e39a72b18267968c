"""Results of `kvcanary leak`: SGLang's memory-check messages read and their arithmetic done,
and, with a dump of the same moment, the verdict: a real leak (pages owned by nobody), a double
free, or SGLang's own count wrong with every page owned; for the request pool's message, the
same of its rows. `LeakReport` is the `kvcanary.leak/1` record (standard library only).

SGLang's scheduler checks (`SchedulerInvariantChecker`, 0.5.13 - 0.5.23) print counts, never
pages: a pool's sum `available + evictable + protected + session_held + uncached == total`, the
number of duplicate pages on a free list, the number of page references into the free pool.
The counts' meanings (`COUNT_MEANINGS`) are declared once here, for every view and the docs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import kvcanary_cli
from kvcanary_cli.catalog import CauseCode
from kvcanary_cli.results.record import recorded

__all__ = [
    "COUNT_MEANINGS",
    "LeakReport",
    "LeakVerdict",
    "MessageKind",
    "PoolAccount",
    "PoolSum",
    "PoolVerdict",
    "LeakMessage",
    "RowAccount",
    "SumReading",
]

#: Which of SGLang's messages: the idle pool check (`pool memory leak detected!`), the busy
#: check's assert (`Full Pool Mem Leak Detected!`, `SWA Pool Mem Leak Detected!`) or its log
#: line (`[Mem Check (BUSY)]`), the page checks (`KV double free: ...`: kv-double-free; `KV
#: page use-after-free: ...`: kv-use-after-free), the request-pool check
#: (`req_to_token_pool memory leak detected!`), the pools' own asserts: the page-interleave
#: allocator's census (`double free: duplicate pages in class N`, from 0.5.20:
#: class-double-free) and the hybrid request pool's (`double free? mamba_index is None`:
#: mamba-double-free).
MessageKind = Literal[
    "idle-pools",
    "busy-assert",
    "busy-log",
    "kv-double-free",
    "kv-use-after-free",
    "req-pool",
    "class-double-free",
    "mamba-double-free",
]
#: A sum read alone: it holds (balanced); it counts fewer slots than the pool has (short:
#: leaked, or a count too low); more (over: a page freed twice, or counted twice); or SGLang
#: skipped the check (skipped: the SWA ring).
SumReading = Literal["balanced", "short", "over", "skipped"]
#: One pool of the dump: pages owned by nobody (leak); a page on its free list twice
#: (freed-twice); every page owned and listed once, and SGLang's sum off anyway, or a page two
#: tree nodes hold (miscount); nothing off (balanced); the dump cannot count it (unknown).
PoolVerdict = Literal["leak", "freed-twice", "miscount", "balanced", "unknown"]
#: The report's answer, worst first: leak; freed-twice (a double free); freed-while-used (a
#: use after free: SGLang saw pages in use on the free list); miscount (SGLang's count is
#: wrong, nothing leaked); undecided (a sum is off, and no dump tells a leak from a
#: miscount); balanced (nothing is off).
LeakVerdict = Literal[
    "leak", "freed-twice", "freed-while-used", "miscount", "undecided", "balanced"
]

#: What each count of a pool sum is, as SGLang 0.5.23 computes it (`pool_stats_observer.py`,
#: `invariant_checker.py`): the views' legend and docs/commands.md's.
COUNT_MEANINGS: dict[str, str] = {
    "total": "the pool's slots (its pages times the page size; the reserved page 0 is not counted)",
    "available": "slots on the allocator's free lists (free and release pages); entries "
    "are counted, so a page freed twice counts twice",
    "evictable": "slots of the radix tree's unlocked nodes (SWA: the nodes whose SWA is "
    "resident), summed node by node, so a page two nodes hold counts twice",
    "protected": "slots of the tree's locked nodes (a running request matched them), summed "
    "node by node like evictable",
    "session_held": "slots streaming sessions keep between their requests",
    "uncached": "slots running requests hold outside the tree: each allocated length rounded "
    "up to whole pages, less its cached prefix (SWA: less what left the window; plus the "
    "tree's transient SWA)",
}


@dataclass(frozen=True, kw_only=True)
class PoolSum:
    """One pool's counts as SGLang printed them, and their sum."""

    #: the pool SGLang named: full, swa, mamba, mamba-active, mamba-int8
    pool: str
    total: int
    available: int
    evictable: int
    #: null where SGLang printed none (the SWA ring's skipped check)
    protected: int | None
    session_held: int | None
    uncached: int | None
    #: available + evictable + protected + session_held + uncached
    accounted: int
    #: total - accounted: above 0, slots no count holds (short); below 0, slots counted
    #: twice (over)
    difference: int
    reading: SumReading
    #: what SGLang printed after the counts (class_free_pages, leaked_full_pages, ...), as it is
    rest: str
    #: the free pages of each owner class, as SGLang printed them (`class_free_pages`:
    #: page-interleave sharding, from 0.5.21; available is their slots); [] where none
    class_free_pages: tuple[int, ...]
    #: the counts SGLang found not whole pages under page-interleave sharding
    #: (`unaligned_sharded_counts`, from 0.5.21): SGLang reports the pool even where the sum
    #: holds; [] where none
    unaligned: tuple[str, ...]
    #: SGLang let this sum's difference pass (`dcp_physical_page_slack_allowed=True`, from
    #: 0.5.15: with decode-context parallelism its counters and its pages are in two units)
    tolerated: bool


@dataclass(frozen=True, kw_only=True)
class LeakMessage:
    """One of SGLang's memory-check messages, read, with its arithmetic in words."""

    kind: MessageKind
    #: the log line it starts on (1 = the first); null for a LINE given on the command line
    line: int | None
    #: the message as read, a string per line (from its first words; 400 characters each
    #: at most)
    text: tuple[str, ...]
    #: idle-pools, busy-assert, busy-log: each pool's counts, in SGLang's order
    pools: tuple[PoolSum, ...]
    #: kv-double-free: the allocator's sub-pool (0 the full pool; 1 the SWA pool of a hybrid-SWA
    #: allocator); else null
    sub_pool: int | None
    #: class-double-free: the owner class whose free lists hold a page twice; else null
    page_class: int | None
    #: kv-double-free: free-list entries beyond each page's first; kv-use-after-free: references of
    #: running requests into the full free pool (one per allocated token, not per page)
    count: int | None
    #: kv-use-after-free: the pages SGLang printed (8 at most)
    sample_pages: tuple[int, ...]
    #: req-pool: rows free, rows streaming sessions keep, and the pool's rows as printed
    #: (SGLang compares the first two with the rows plus its pre-allocated ones, which it does
    #: not print)
    rows_available: int | None
    rows_session_held: int | None
    rows_total: int | None
    #: SGLang found something here: a sum off, duplicate pages, references into the free pool
    faulty: bool
    #: the arithmetic in words: the sum, by how much it is off, what that can mean
    arithmetic: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class PoolAccount:
    """One pool of the dump, counted the way SGLang's check sums it, with its pages."""

    pool: Literal["full", "swa"]
    page_size: int
    verdict: PoolVerdict
    #: pages owned by nobody: not free, not the tree's, not a running request's
    leaked_pages: tuple[int, ...]
    #: pages on the free list more than once
    double_freed_pages: tuple[int, ...]
    #: pages two tree nodes hold (the tree lists their slots twice): counted twice by
    #: evictable or protected
    shared_pages: tuple[int, ...]
    #: slots free (each once), and free-list entries beyond a slot's first
    free: int
    free_listed_twice: int
    #: slots the tree holds (each once; SWA: those with their SWA resident), and tree
    #: entries beyond a slot's first
    tree: int
    tree_listed_twice: int
    #: the difference SGLang's sum shows on this state: leaked slots less the slots listed
    #: twice (free list and tree)
    expected_difference: int
    #: the difference SGLang printed for this pool in the message judged; null when it
    #: printed none
    printed_difference: int | None
    #: why the dump cannot count this pool (verdict unknown); else null
    reason: str | None
    #: the pool's story in words
    explanation: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class RowAccount:
    """The request pool's rows in the dump, counted as SGLang's `_check_req_pool` counts them
    at idle: rows free plus rows streaming sessions keep make the pool."""

    verdict: PoolVerdict
    #: the pool's rows: the table's, less its padding row 0
    rows: int
    #: rows on the free list (each once), and entries beyond a row's first
    free: int
    free_listed_twice: int
    #: rows running requests and streaming sessions hold (each once): at idle, where SGLang
    #: checks, the sessions' alone
    held: int
    #: the dump has a batch: running requests hold rows, and SGLang, which counts at idle,
    #: counted another moment (its counts are not compared: unknown, unless rows are off)
    busy: bool
    #: rows neither free nor held: how many, and the first few
    leaked: int
    leaked_rows: tuple[int, ...]
    #: rows listed free twice, held twice, or both free and held: how many, and the first few
    twice: int
    twice_rows: tuple[int, ...]
    #: why the dump cannot count the rows (verdict unknown); else null
    reason: str | None
    #: the rows' story in words
    explanation: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class LeakReport:
    """`kvcanary leak --format json`."""

    SCHEMA: ClassVar[str] = "kvcanary.leak/1"

    #: "LINE" (the command line's) or the log's path (--sglang-log; "-": stdin)
    source: str
    #: the dump the messages are set against; null without one
    dump: str | None
    #: the messages read, in order (a log's busy lines whose sum holds are left out)
    messages: tuple[LeakMessage, ...]
    #: a log's lines that start one of SGLang's messages but do not parse, and the first few
    unread: int
    unread_lines: tuple[int, ...]
    #: a log's `[Mem Check (BUSY)]` lines that are no finding (not listed): their sums hold,
    #: or SGLang lets them pass (DCP's slack), or they hold no counts (a pool without a size)
    balanced_busy_lines: int
    #: the message (index in messages) set against the dump: the last with pool sums, else
    #: the last; null without a dump
    judged: int | None
    #: the dump's pools, counted (full, then SWA); [] without a dump
    pools: tuple[PoolAccount, ...]
    #: the dump's request-pool rows, counted, where a request-pool message was read; null
    #: otherwise
    rows: RowAccount | None = None
    verdict: LeakVerdict
    #: the cause the verdict points to; null for undecided and balanced
    cause: CauseCode | None
    #: the verdict in one sentence
    summary: str
    #: what could not be read or decided, and why
    notes: tuple[str, ...]

    @recorded
    def kvcanary_version(self) -> str:
        """The kvcanary that read the messages."""
        return kvcanary_cli.__version__

    @property
    def found(self) -> bool:
        """Something is off (exit 1): any verdict but balanced."""
        return self.verdict != "balanced"
