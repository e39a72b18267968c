"""What a block-pool dump holds in words (`kvcanary.pool-inspect/1`), as `inspect`'s table and
Markdown views say it: the pool's lines, and the rows of its groups, requests and tensors."""

from __future__ import annotations

from kvcanary_cli.render.console import plural
from kvcanary_cli.render.phrases.inspect import shown_tensors
from kvcanary_cli.results.pool_inspect import PoolDumpDescription

__all__ = [
    "TENSOR_COLUMNS",
    "group_columns",
    "group_rows",
    "more_requests",
    "pool_lines",
    "request_columns",
    "request_rows",
    "tensor_rows",
]

_GROUP_COLUMNS = ["group", "kind", "block size", "window", "tables", "entries", "null entries"]
#: A Mamba state group's kind, as the dump records it (its manager's name in snake case).
_MAMBA = "mamba"
TENSOR_COLUMNS = ["tensor", "dtype", "shape", "bytes"]


def pool_lines(d: PoolDumpDescription) -> list[str]:
    """The pool: blocks, free queue, references and hashes, map, requests."""
    version = f" {d.engine_version}" if d.engine_version else ""
    kept = (
        ""
        if d.kept_blocks is None
        else f"; shrunk: the state of {plural(d.kept_blocks, 'block')} kept"
    )
    back = "not recorded" if d.reverse_queue_length is None else str(d.reverse_queue_length)
    cut = "" if d.queue_complete else " (the walk was cut: a cycle)"
    of_kept = "" if d.kept_blocks is None else " (of those kept)"
    return [
        f"{d.engine}{version} block pool: {d.num_blocks} blocks (null block {d.null_block}){kept}",
        f"free queue: {d.queue_length} walked head → tail{cut}, {back} walked back; "
        f"num_free_blocks {d.num_free_blocks}",
        f"{d.referenced} referenced, {d.hashed_blocks} hashed{of_kept}; prefix-cache map: "
        f"{plural(d.map_entries, 'entry', 'entries')}, {plural(d.extra_keys, 'extra key')}; "
        f"{plural(d.deferred_frees, 'deferred free')}, {d.released_blocks} released until reuse",
        f"{plural(len(d.requests), 'request')}: {d.live_requests} live, "
        f"{d.requests_with_blocks} with blocks",
    ]


def _states(d: PoolDumpDescription) -> bool:
    """The dump has a Mamba group: its state bound and scratch blocks get columns."""
    return any(g.kind == _MAMBA for g in d.groups)


def group_columns(d: PoolDumpDescription) -> list[str]:
    """The groups' columns: kind, sizes, table counts, and with a Mamba group its bound on a
    table's state blocks and its scratch blocks (a speculative decoder's)."""
    return [*_GROUP_COLUMNS, *(["state bound", "scratch"] if _states(d) else [])]


def group_rows(d: PoolDumpDescription) -> list[list[str]]:
    """One row per group, in `group_columns`' order (a bound not recorded: "?")."""
    states = _states(d)
    return [
        [
            str(g.group),
            g.kind,
            str(g.block_size),
            "-" if g.window is None else str(g.window),
            str(g.tables),
            str(g.entries),
            str(g.null_entries),
            *(
                (
                    [str(g.max_states or "?"), str(g.speculative_blocks)]
                    if g.kind == _MAMBA
                    else ["-", "-"]
                )
                if states
                else []
            ),
        ]
        for g in d.groups
    ]


def _in_flight(d: PoolDumpDescription) -> bool:
    """The dump records the requests' tokens in flight (a column only then)."""
    return any(r.num_in_flight is not None for r in d.requests)


def _prompts(d: PoolDumpDescription) -> bool:
    """The dump records the requests' prompt lengths (a column only then)."""
    return any(r.num_prompt is not None for r in d.requests)


def request_columns(d: PoolDumpDescription) -> list[str]:
    """The requests' columns: id, live, token counts (the prompt's and those in flight where
    recorded), then its blocks in each group."""
    counts = [
        *(["prompt"] if _prompts(d) else []),
        *("tokens", "computed"),
        *(["in flight"] if _in_flight(d) else []),
    ]
    return ["request", "live", *counts, *(f"blocks g{g.group}" for g in d.groups)]


def request_rows(d: PoolDumpDescription, max_rows: int) -> list[list[str]]:
    """The first `max_rows` requests, in `request_columns`' order (`-`: not recorded)."""
    flying, prompts = _in_flight(d), _prompts(d)
    return [
        [
            r.request,
            "yes" if r.live else "no",
            *(["-" if r.num_prompt is None else str(r.num_prompt)] if prompts else []),
            "-" if r.num_tokens is None else str(r.num_tokens),
            "-" if r.num_computed is None else str(r.num_computed),
            *(["-" if r.num_in_flight is None else str(r.num_in_flight)] if flying else []),
            *(str(n) for n in r.table_lengths),
        ]
        for r in d.requests[:max_rows]
    ]


def more_requests(d: PoolDumpDescription, max_rows: int) -> str | None:
    """What the requests' table leaves out (None: nothing)."""
    more = len(d.requests) - max_rows
    return f"… {plural(more, 'more request')} (JSON has all)" if more > 0 else None


def tensor_rows(d: PoolDumpDescription, max_rows: int) -> tuple[list[list[str]], str | None]:
    """Every tensor of the layout and the first `max_rows` others, in `TENSOR_COLUMNS`' order;
    the line counting the rest (None: none left out)."""
    shown, more = shown_tensors(d.tensors, lambda t: t.ignored, max_rows)
    rows = [[t.name, t.dtype, "x".join(map(str, t.shape)) or "[]", str(t.bytes)] for t in shown]
    return rows, more
