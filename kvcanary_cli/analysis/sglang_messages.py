"""SGLang's memory-check messages (0.5.13 - 0.5.23), read, and their arithmetic done
(`kvcanary leak`).

The messages, as `srt/managers/scheduler_components/invariant_checker.py`,
`srt/managers/scheduler.py` and the pools word them (read from each release wheel;
docs/releases.md has which release prints what):

- at idle, `_report_leak("pool", ...)`: `pool memory leak detected! ` and one line per pool,
  `[full] total=N, available=N, evictable=N, protected=N, session_held=N, uncached=N` (then
  `[swa] ...`, `[mamba] ...` or `[mamba-active] ...` and `[mamba-int8] ...`; an SWA ring pool
  prints `[swa] unified ring (leak-check skipped): available=N, evictable=N, total=N`), raised
  as a `ValueError` in strict mode. After a sum may come `class_free_pages=[...]`,
  `unaligned_sharded_counts={...}, page_size=N` (page-interleave sharding: counts not whole
  pages are a finding though the sum holds), `dcp_physical_page_slack_allowed=True` (a
  difference SGLang lets pass), `leaked_full_pages=..., leaked_mamba_pages=...` (the Mamba
  line's census). A pool without a size prints `total=None` (0.5.13, 0.5.14) or nothing
  (0.5.15 on): nothing to add up;
- while busy, an assert: `Full Pool Mem Leak Detected! [full] ...`, `SWA Pool Mem Leak
  Detected! [swa] ...`, and the log lines `[Mem Check (BUSY)] [full] ...`;
- the page checks (0.5.15 on): `KV double free: sub-pool I has N duplicate pages.` and `KV page
  use-after-free: N owner page refs are in the free pool, sample pages=[...].`;
- the request pool: `req_to_token_pool memory leak detected!available_size=N,
  session_held=N, total_size=N` (no space after the `!`);
- the pools' own asserts: `double free: duplicate pages in class N` (the page-interleave
  allocator, 0.5.20 on) and `double free? mamba_index is None` (a Mamba slot freed twice).
  Two messages hold no counts and are said in one line: the byte report (`pool-bytes memory
  leak detected!`) and the census's `page of another owner leaked into class N`.

A message is found wherever it starts on a line (a logging prefix or `ValueError: ` before it
is fine); the idle message's pool lines follow it on lines of their own. A log is read line by
line, never whole, with a bound on line length. A line given on the command line that is none
of these, or one that starts like one and does not parse, is an `OptionError` (one line,
exit 2) naming the form expected; in a log such lines are counted, not fatal.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import BinaryIO

from kvcanary_cli.canary.logs import bounded_lines
from kvcanary_cli.dump.streams import STANDARD_INPUT_NAME
from kvcanary_cli.errors import OptionError, PathError, os_refusal
from kvcanary_cli.results.leak import LeakMessage, MessageKind, PoolSum, SumReading

__all__ = ["EXPECTED", "MessageScan", "read_line", "read_log", "scan_messages"]

#: Messages kept from one log (the rest are counted in a note).
MAX_MESSAGES = 10_000
#: Line numbers kept of the lines that did not parse.
_KEPT_LINES = 5
#: Characters of a message kept as its text.
_TEXT = 400

_N = r"(-?\d{1,18})"
_POOL = re.compile(
    r"\[(full|swa|mamba|mamba-active|mamba-int8)\] total=" + _N + r", available=" + _N
    + r", evictable=" + _N + r", protected=" + _N + r", session_held=" + _N
    + r", uncached=" + _N
)  # fmt: skip
_RING = re.compile(
    r"\[swa\] unified ring \(leak-check skipped\): available=" + _N + r", evictable=" + _N
    + r", total=" + _N
)  # fmt: skip
#: A pool line without a size (`total=None`: SGLang 0.5.13 and 0.5.14, a hybrid-SWA model
#: without full-attention layers).
_UNSIZED = re.compile(
    r"\[(full|swa|mamba|mamba-active|mamba-int8)\] total=None, available=" + _N
    + r", evictable=" + _N + r", protected=" + _N + r", session_held=" + _N + r", uncached="
    + _N
)  # fmt: skip
#: Where a pool line starts, to cut what SGLang printed after the counts (`rest`).
_NEXT_POOL = re.compile(r"\[(?:full|swa|mamba|mamba-active|mamba-int8)\] ")
#: What a pool line may print after its counts, read (from 0.5.21, page-interleave sharding).
_CLASSES = re.compile(r"class_free_pages=\[([\d, ]{0,2000})\]")
_UNALIGNED = re.compile(r"unaligned_sharded_counts=\{([^}]{0,400})\}(?:, page_size=(\d{1,9}))?")
_SLACK = "dcp_physical_page_slack_allowed=True"
_DOUBLE = re.compile(r"KV double free: sub-pool (\d{1,9}) has (\d{1,18}) duplicate pages\.")
_CLASS_DOUBLE = re.compile(r"double free: duplicate pages in class (\d{1,9})")
_UAF = re.compile(
    r"KV page use-after-free: (\d{1,18}) owner page refs are in the free pool, "
    r"sample pages=\[([-\d, ]{0,400})\]"
)
_REQ = re.compile(
    r"req_to_token_pool memory leak detected!\s*available_size=" + _N + r", session_held="
    + _N + r", total_size=" + _N
)  # fmt: skip

#: Each message's first words (found anywhere on a line), in the order tried: the request
#: pool's before the idle check's, whose words it contains.
_HEADS: tuple[tuple[MessageKind | None, re.Pattern[str]], ...] = (
    ("req-pool", re.compile(r"req_to_token_pool memory leak detected!")),
    (None, re.compile(r"pool-bytes memory leak detected!")),
    ("idle-pools", re.compile(r"(?<![\w-])pool memory leak detected!")),
    ("busy-assert", re.compile(r"(?:Full|SWA) Pool Mem Leak Detected!")),
    ("busy-log", re.compile(r"\[Mem Check \(BUSY\)\]")),
    ("kv-double-free", re.compile(r"KV double free:")),
    ("kv-use-after-free", re.compile(r"KV page use-after-free:")),
    ("class-double-free", re.compile(r"(?<!KV )double free: duplicate pages in class")),
    ("mamba-double-free", re.compile(r"double free\? mamba_index is None")),
    (None, re.compile(r"page of another owner leaked into class")),
)
#: What the messages without counts are (kind None above), by their first words.
_NO_COUNTS = {
    "pool-bytes": "is SGLang's byte-accounting report (a unified memory pool, from 0.5.19): it "
    "prints bytes, no token counts: nothing to add up (expected a pool, double-free, "
    "use-after-free or request-pool message)",
    "page of another owner": "is the page-interleave allocator's census (from 0.5.20, its "
    "debug mode): a page of another owner class sits on this class's free list, a misfiled "
    "page; it prints no counts: nothing to add up (`kvcanary check DUMP` checks the free "
    "lists)",
}
#: Bytes one of the heads holds, to skip most log lines without a search.
_HINTS = (
    b"leak detected!",
    b"Leak Detected!",
    b"[Mem Check",
    b"double free",
    b"KV page",
    b"leaked into class",
)

_COUNTS = "total=N, available=N, evictable=N, protected=N, session_held=N, uncached=N"
#: The form each message takes, for the error line of one that does not parse.
EXPECTED: dict[MessageKind, str] = {
    "idle-pools": f"pool memory leak detected! [full] {_COUNTS}",
    "busy-assert": f"Full Pool Mem Leak Detected! [full] {_COUNTS}",
    "busy-log": f"[Mem Check (BUSY)] [full] {_COUNTS}",
    "kv-double-free": "KV double free: sub-pool N has N duplicate pages.",
    "kv-use-after-free": (
        "KV page use-after-free: N owner page refs are in the free pool, sample pages=[N, ...]."
    ),
    "req-pool": "req_to_token_pool memory leak detected!available_size=N, session_held=N, "
    "total_size=N",
    "class-double-free": "double free: duplicate pages in class N",
    "mamba-double-free": "double free? mamba_index is None",
}
_ANY = (
    "expected one of SGLang's memory-check messages (0.5.13 - 0.5.23): 'pool memory leak "
    "detected! [full] total=N, ...', 'Full Pool Mem Leak Detected! ...', 'SWA Pool Mem Leak "
    "Detected! ...', '[Mem Check (BUSY)] ...', 'KV double free: sub-pool N has N duplicate "
    "pages.', 'KV page use-after-free: N owner page refs ...', 'req_to_token_pool memory leak "
    "detected!available_size=N, ...', 'double free: duplicate pages in class N' or 'double "
    "free? mamba_index is None'"
)


@dataclass
class MessageScan:
    """What a line or a log held: its messages, and what did not parse."""

    messages: list[LeakMessage] = field(default_factory=list)
    unread: int = 0
    unread_lines: list[int] = field(default_factory=list)
    #: the first line that did not parse, and why (the command line's LINE: the error)
    first_unread: str | None = None
    balanced_busy_lines: int = 0
    dropped: int = 0
    overlong: int = 0


def read_line(text: str) -> MessageScan:
    """The messages of a LINE given on the command line (it may hold the idle message's pool
    lines too); an `OptionError` when it holds none, or one that does not parse."""
    scan = scan_messages(((None, line) for line in text.splitlines()), line_mode=True)
    if scan.first_unread is not None:
        raise OptionError(scan.first_unread, option="line")
    if not scan.messages:
        raise OptionError(f"not an SGLang memory-check message ({_ANY})", option="line")
    return scan


def read_log(path: str) -> MessageScan:
    """The messages of a server log (`-`: stdin), read line by line; a `PathError` when it
    cannot be read or holds none."""
    if path == "-":
        scan = scan_messages(_numbered(sys.stdin.buffer, STANDARD_INPUT_NAME))
    else:
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed below, errors named first
        except OSError as exc:
            raise PathError(os_refusal(exc, "a server log"), path=path) from None
        with handle:
            try:
                scan = scan_messages(_numbered(handle, path))
            except OSError as exc:  # a directory, a device that fails mid-read
                raise PathError(os_refusal(exc, "a server log"), path=path) from None
    if not scan.messages and not scan.balanced_busy_lines:
        why = f"; {scan.unread} lines did not parse" if scan.unread else ""
        raise PathError(f"holds no SGLang memory-check message{why} ({_ANY})", path=path)
    return scan


def _numbered(handle: BinaryIO, name: str) -> Iterator[tuple[int | None, str]]:
    """(line number, text) of the lines that may matter: those holding a message's first
    words, and the line after each (the idle message's pool lines). Over-long lines (a
    message is a few hundred bytes) are yielded as `_OVERLONG`, never held whole."""
    follow = False
    for number, raw in bounded_lines(handle, name):
        if raw is None:
            follow = False
            yield number, _OVERLONG
            continue
        hit = any(hint in raw for hint in _HINTS)
        if hit or (follow and raw.lstrip().startswith(b"[")):
            follow = True
            yield number, raw.decode("utf-8", errors="replace")
        else:
            follow = False


#: Stands for a line too long to read.
_OVERLONG = "\0overlong"


def scan_messages(
    lines: Iterable[tuple[int | None, str]], *, line_mode: bool = False
) -> MessageScan:
    """Every message in `lines` ((line number or None, text)). A log's busy lines whose sum
    holds are counted, not kept (SGLang's verbose mode logs one per step); `line_mode` (the
    command line's LINE) keeps them, and reads a pool line alone (`[swa] total=...`, copied
    without the idle message's first words) as that message."""
    scan = MessageScan()
    idle: _Idle | None = None
    for number, line in lines:
        if line == _OVERLONG:
            scan.overlong += 1
            _close(scan, idle)
            idle = None
            continue
        stripped = line.strip()
        if idle is not None and stripped.startswith("[") and not _head(line):
            if idle.add(stripped):
                continue
        _close(scan, idle)
        idle = None
        found = _head(line)
        if found is None and line_mode and (_POOL.match(stripped) or _RING.match(stripped)):
            found = ("idle-pools", line.index(stripped))
        if found is None:
            continue
        kind, start = found
        text = line[start:]
        if kind is None:
            _unread(scan, number, next(w for h, w in _NO_COUNTS.items() if text.startswith(h)))
            continue
        if kind == "idle-pools":
            idle = _Idle(number)
            idle.add(text)
            continue
        message = _single(kind, number, text)
        if message is None:
            _unread(scan, number, _garbled(kind))
        elif kind == "busy-log" and not line_mode and not message.faulty:
            scan.balanced_busy_lines += 1
        else:
            _keep(scan, message)
    _close(scan, idle)
    return scan


def _head(line: str) -> tuple[MessageKind | None, int] | None:
    """The message kind a line starts (None: SGLang's byte report) and where; None when it
    starts none."""
    for kind, pattern in _HEADS:
        match = pattern.search(line)
        if match is not None:
            return kind, match.start()
    return None


def _garbled(kind: MessageKind) -> str:
    return f"reads as SGLang's {kind} message but does not parse (expected '{EXPECTED[kind]}')"


def _unread(scan: MessageScan, number: int | None, why: str) -> None:
    scan.unread += 1
    if number is not None and len(scan.unread_lines) < _KEPT_LINES:
        scan.unread_lines.append(number)
    if scan.first_unread is None:
        scan.first_unread = why


def _keep(scan: MessageScan, message: LeakMessage) -> None:
    if len(scan.messages) < MAX_MESSAGES:
        scan.messages.append(message)
    else:
        scan.dropped += 1


class _Idle:
    """The idle message being read: its first line, then a pool line each."""

    def __init__(self, number: int | None) -> None:
        self.number = number
        self.lines: list[str] = []
        self.pools: list[PoolSum] = []
        self.words: list[str] = []

    def add(self, text: str) -> bool:
        """Read a line's pool counts; False when it holds none."""
        pools, words = _pools(text), _unsized(text)
        if not pools and not words:
            return False
        self.lines.append(text)
        self.pools.extend(pools)
        self.words.extend(words)
        return True


def _close(scan: MessageScan, idle: _Idle | None) -> None:
    """Keep the idle message being read (one without a pool line does not parse)."""
    if idle is None:
        return
    if not idle.pools and not idle.words:
        _unread(scan, idle.number, _garbled("idle-pools"))
        return
    message = _pool_message("idle-pools", idle.number, idle.lines, idle.pools, idle.words)
    _keep(scan, message)


def _unsized(text: str) -> list[str]:
    """What each pool line without a size says (nothing to add up)."""
    return [
        f"[{match[1]}] total=None: SGLang has no size for this pool (a hybrid-SWA model "
        "without full-attention layers), checks it anyway and reports it at every check "
        "(0.5.13 and 0.5.14; 0.5.15 on skip it): nothing to add up, and no leak"
        for match in _UNSIZED.finditer(text)
    ]


#: What SGLang 0.5.15 on print for the same pool: nothing after the busy check's words.
_EMPTY_BUSY = (
    "SGLang's busy check printed no counts: a hybrid-SWA model without full-attention layers "
    "has no full pool, whose line SGLang 0.5.15 on leave empty: nothing to add up"
)


def _pools(text: str) -> list[PoolSum]:
    """Each pool's counts on one line, in order."""
    found: list[tuple[int, int, PoolSum]] = []
    for match in _POOL.finditer(text):
        total, available, evictable, protected, session, uncached = map(int, match.groups()[1:])
        pool = _pool_sum(match[1], total, available, evictable, protected, session, uncached)
        found.append((match.start(), match.end(), pool))
    for match in _RING.finditer(text):
        available, evictable, total = map(int, match.groups())
        ring = _pool_sum("swa", total, available, evictable, None, None, None)
        found.append((match.start(), match.end(), ring))
    found.sort(key=lambda item: item[0])
    pools = []
    for index, (_, end, pool) in enumerate(found):
        stop = found[index + 1][0] if index + 1 < len(found) else len(text)
        tail = text[end:stop]
        cut = _NEXT_POOL.search(tail)
        rest = (tail[: cut.start()] if cut else tail).strip().lstrip(",").strip()
        pools.append(_with_rest(pool, rest))
    return pools


def _with_rest(pool: PoolSum, rest: str) -> PoolSum:
    """The pool with what SGLang printed after its counts, and what of that is read."""
    if not rest:
        return pool
    classes = _CLASSES.search(rest)
    unaligned = _UNALIGNED.search(rest)
    return replace(
        pool,
        rest=rest[:200],
        class_free_pages=tuple(int(n) for n in re.findall(r"\d+", classes[1])) if classes else (),
        unaligned=tuple(re.findall(r"'(\w+)': -?\d+", unaligned[1])) if unaligned else (),
        tolerated=_SLACK in rest,
    )


def _pool_sum(
    pool: str,
    total: int,
    available: int,
    evictable: int,
    protected: int | None,
    session: int | None,
    uncached: int | None,
) -> PoolSum:
    """A pool's counts and their sum; `protected`, `session` and `uncached` None where SGLang
    printed none (the SWA ring: its check is skipped, whatever the sum)."""
    accounted = available + evictable + sum(n or 0 for n in (protected, session, uncached))
    difference = total - accounted
    reading: SumReading = "balanced" if difference == 0 else "short" if difference > 0 else "over"
    if protected is None:
        reading = "skipped"
    return PoolSum(
        pool=pool,
        total=total,
        available=available,
        evictable=evictable,
        protected=protected,
        session_held=session,
        uncached=uncached,
        accounted=accounted,
        difference=difference,
        reading=reading,
        rest="",
        class_free_pages=(),
        unaligned=(),
        tolerated=False,
    )


def _single(kind: MessageKind, number: int | None, text: str) -> LeakMessage | None:
    """A one-line message, read; None when it does not parse."""
    if kind in ("busy-assert", "busy-log"):
        pools = _pools(text)
        words = _unsized(text)
        if kind == "busy-log" and not text.removeprefix("[Mem Check (BUSY)]").strip():
            words = [_EMPTY_BUSY]
        return _pool_message(kind, number, [text], pools, words) if pools or words else None
    if kind == "kv-double-free":
        match = _DOUBLE.search(text)
        if match is None:
            return None
        sub, count = int(match[1]), int(match[2])
        return _message(kind, number, text, sub_pool=sub, count=count, faulty=count > 0)
    if kind == "class-double-free":
        match = _CLASS_DOUBLE.search(text)
        if match is None:
            return None
        return _message(kind, number, text, page_class=int(match[1]), faulty=True)
    if kind == "mamba-double-free":
        return _message(kind, number, text, faulty=True)
    if kind == "kv-use-after-free":
        match = _UAF.search(text)
        if match is None:
            return None
        pages = [p for p in (s.strip() for s in match[2].split(",")) if p]
        if not all(re.fullmatch(r"-?\d{1,18}", p) for p in pages):
            return None
        count = int(match[1])
        sample = tuple(int(p) for p in pages[:8])
        return _message(kind, number, text, count=count, sample_pages=sample, faulty=count > 0)
    match = _REQ.search(text)
    if match is None:
        return None
    available, session, total = int(match[1]), int(match[2]), int(match[3])
    return _message(
        kind,
        number,
        text,
        rows=(available, session, total),
        faulty=True,  # SGLang prints it only when its rows do not add up
    )


def _message(
    kind: MessageKind,
    number: int | None,
    text: str | list[str],
    *,
    pools: tuple[PoolSum, ...] = (),
    sub_pool: int | None = None,
    page_class: int | None = None,
    count: int | None = None,
    sample_pages: tuple[int, ...] = (),
    rows: tuple[int, int, int] | None = None,
    faulty: bool,
    words: list[str] | None = None,
) -> LeakMessage:
    available, session, total = rows if rows is not None else (None, None, None)
    message = LeakMessage(
        kind=kind,
        line=number,
        text=tuple(line[:_TEXT] for line in ([text] if isinstance(text, str) else text)),
        pools=pools,
        sub_pool=sub_pool,
        page_class=page_class,
        count=count,
        sample_pages=sample_pages,
        rows_available=available,
        rows_session_held=session,
        rows_total=total,
        faulty=faulty,
        arithmetic=(),
    )
    return replace(message, arithmetic=(*arithmetic(message), *(words or [])))


def _off(pool: PoolSum) -> bool:
    """The pool's sum is off and SGLang does not let it pass."""
    return pool.reading in ("short", "over") and not pool.tolerated


def _pool_message(
    kind: MessageKind,
    number: int | None,
    text: list[str],
    pools: list[PoolSum],
    words: list[str] | None = None,
) -> LeakMessage:
    """A pool-sum message; `words`: what its lines without counts say."""
    faulty = any(_off(p) or p.unaligned for p in pools)
    return _message(kind, number, text, pools=tuple(pools), faulty=faulty, words=words or [])


# --- the arithmetic in words ----------------------------------------------------------------

_WHO = {
    "idle-pools": "SGLang's idle check",
    "busy-assert": "SGLang's busy check (an assert)",
    "busy-log": "SGLang's busy check",
}


def arithmetic(message: LeakMessage) -> list[str]:
    """What the message's numbers say: each sum, by how much it is off, what that can mean."""
    if message.pools or message.kind in _WHO:
        return [line for pool in message.pools for line in _pool_words(message.kind, pool)]
    if message.kind == "kv-double-free":
        which = {0: "sub-pool 0 (the full pool)", 1: "sub-pool 1 (the SWA pool)"}.get(
            message.sub_pool or 0, f"sub-pool {message.sub_pool}"
        )
        return [
            f"{which} lists {message.count} pages more than once: each was freed twice (or "
            "more) and will be handed to two requests; the pool's sum comes out that many "
            "pages over (available counts free-list entries)"
        ]
    if message.kind == "class-double-free":
        return [
            f"the page-interleave allocator's census (its debug mode) found a page twice on "
            f"owner class {message.page_class}'s free lists: a double free, the page will be "
            "handed to two requests; SGLang prints no count or page: nothing to add up (a "
            "dump of the same moment names the pages: `kvcanary leak LINE DUMP`)"
        ]
    if message.kind == "mamba-double-free":
        return [
            "the hybrid request pool freed a request's Mamba slot a second time (the first "
            "free left its index empty): a double free of a Mamba state; SGLang prints no "
            "count or slot: nothing to add up (`kvcanary check DUMP` checks the Mamba slots)"
        ]
    if message.kind == "kv-use-after-free":
        sample = ", ".join(map(str, message.sample_pages)) or "none printed"
        return [
            f"{message.count} page references of running requests (one per allocated token: "
            "a page counts up to its page size) point into the full pool's free list "
            f"(pages {sample}): pages freed while a request still uses them; the next "
            "allocation hands them to another request"
        ]
    available, session, total = (
        message.rows_available or 0,
        message.rows_session_held or 0,
        message.rows_total or 0,
    )
    off = total - available - session
    head = (
        f"request pool: available_size {available} + session_held {session} = "
        f"{available + session}, total_size {total}"
    )
    if off > 0:
        tail = (
            f"{off} rows neither free nor kept by a session: the running requests' rows, "
            "and any beyond them leaked (SGLang checks at idle, when no request runs: then "
            f"all {off} are leaked, unless the pool pre-allocates rows, which SGLang adds "
            "to total_size and does not print)"
        )
    elif off < 0:
        tail = f"{-off} rows more than the pool holds: a row freed twice"
    else:
        tail = (
            "the printed counts add up: the difference is the pool's pre-allocated rows "
            "(a decode pool's pre_alloc_size), which SGLang adds and does not print"
        )
    return [f"{head}: {tail}"]


def _pool_words(kind: MessageKind, pool: PoolSum) -> list[str]:
    who = _WHO.get(kind, "SGLang")
    if pool.reading == "skipped":
        return [
            f"[{pool.pool}] per-request SWA ring: {who} skips this pool (available "
            f"{pool.available}, evictable {pool.evictable}, total {pool.total}); the ring's "
            "slots are checked through req_to_token instead"
        ]
    terms = [
        ("available", pool.available),
        ("evictable", pool.evictable),
        ("protected", pool.protected),
        ("session_held", pool.session_held),
        ("uncached", pool.uncached),
    ]
    summed = " + ".join(f"{name} {value}" for name, value in terms)
    head = f"[{pool.pool}] {who}: {summed} = {pool.accounted}; total {pool.total}"
    d = pool.difference
    if pool.reading == "balanced":
        words = [f"{head}: the sum holds"]
    elif pool.reading == "short":
        words = [
            f"{head}: {d} slots short, held by no count: leaked (owned by nobody), or a "
            "count too low; a dump of this moment tells which (`kvcanary leak LINE DUMP`)"
        ]
    else:
        words = [
            f"{head}: {-d} slots over, counted twice: a page freed twice (available counts "
            "free-list entries) is a double free; a page two tree nodes hold (evictable and "
            "protected count node by node) is SGLang's miscount with nothing leaked; a dump of "
            "this moment tells which (`kvcanary leak LINE DUMP`)"
        ]
    if pool.tolerated and pool.reading != "balanced":
        words.append(
            f"[{pool.pool}] SGLang lets this difference pass "
            "(dcp_physical_page_slack_allowed=True): with decode-context parallelism its "
            "allocator's pages are wider than the per-rank units its counters use, so the "
            "sum is off by design here: not a finding"
        )
    return words + _sharded_words(pool) + _census_words(pool)


#: The Mamba line's census of what is neither free nor the tree's (`None`: nothing).
_CENSUS = re.compile(r"leaked_(full|mamba)_pages=(None|\{[\d, ]{0,400}\}?)")


def _census_words(pool: PoolSum) -> list[str]:
    """What SGLang's own census on the Mamba line names (pages and slots, not counts)."""
    words = []
    for match in _CENSUS.finditer(pool.rest):
        found = sorted(int(n) for n in re.findall(r"\d+", match[2]))
        what = (
            "Mamba slots neither free nor the tree's (leaked_mamba_pages)"
            if match[1] == "mamba"
            else "full pages neither free nor the tree's (leaked_full_pages; a running "
            "request's or a session's pages would be among them)"
        )
        shown = ", ".join(map(str, found[:8])) + (", ..." if len(found) > 8 else "")
        cut = match[2].startswith("{") and not match[2].endswith("}")  # past what is kept
        named = f"{'at least ' if cut else ''}{len(found)} ({shown})" if found else "none"
        words.append(f"[{pool.pool}] SGLang's own census of the {what}: {named}")
    return words


def _sharded_words(pool: PoolSum) -> list[str]:
    """What a page-interleaved pool's line adds: its free pages by owner class, and the
    counts SGLang found not whole pages."""
    words = []
    if pool.class_free_pages:
        pages = sum(pool.class_free_pages)
        each = (
            f" ({pages} x {pool.available // pages} slots)"
            if pages and pool.available % pages == 0
            else ""
        )
        words.append(
            f"[{pool.pool}] free pages by owner class (page-interleave sharding): "
            f"{' + '.join(map(str, pool.class_free_pages))} = {pages} free pages, the slots "
            f"available counts{each}"
        )
    if pool.unaligned:
        size = re.search(r"page_size=(\d{1,9})", pool.rest)
        values = {
            "total": pool.total,
            "available": pool.available,
            "evictable": pool.evictable,
            "protected": pool.protected,
            "session_held": pool.session_held,
            "uncached": pool.uncached,
        }
        named = ", ".join(f"{name} {values.get(name, '?')}" for name in pool.unaligned)
        words.append(
            f"[{pool.pool}] {named}: not whole pages of page size "
            f"{size[1] if size else '(not printed)'}; under page-interleave sharding every "
            "count is whole pages, so SGLang reports the pool even where the sum holds: a "
            "count off by part of a page (a miscount) or pages lost; a dump of this moment "
            "tells which (`kvcanary leak LINE DUMP`)"
        )
    return words
