"""What the views of a block-pool check and a block's provenance say (vLLM's dumps): plain
lines, which the table view styles and the Markdown view lists."""

from __future__ import annotations

from kvcanary_cli.render.console import plural
from kvcanary_cli.results.pool import (
    BlockOwner,
    PoolCheckReport,
    PoolDumpReport,
    PoolFinding,
    PoolProvenance,
)

__all__ = ["dump_header", "finding_lines", "owner_text", "provenance_lines", "verdict_line"]


def owner_text(o: BlockOwner) -> str:
    """One holder in words."""
    if o.holds == "deferred":
        return f"deferred free of request {o.request!r}" if o.request else "deferred free"
    return f"request {o.request!r}, group {o.group}, index {o.index}"


def verdict_line(d: PoolDumpReport) -> str:
    """A dump's verdict in one line."""
    if d.error is not None:
        return f"{d.path}: bad input: {d.error}"
    if not d.findings:
        return f"{d.path}: clean ({d.engine} block pool of {d.num_blocks} blocks)"
    causes = ", ".join(str(c.cause) for c in d.diagnosis)
    return f"{d.path}: {plural(len(d.findings), 'finding')} ({causes})"


def dump_header(d: PoolDumpReport) -> list[str]:
    """The pool's shape: blocks, queue, references, requests, groups, and the coverage."""
    version = f" {d.engine_version}" if d.engine_version else ""
    groups = "; ".join(
        f"group {g.group}: {g.kind}, block size {g.block_size}"
        + (f", window {g.window}" if g.window is not None else "")
        + f", {g.entries} {'entry' if g.entries == 1 else 'entries'}"
        for g in d.groups
    )
    return [
        f"{d.engine}{version} block pool: {d.num_blocks} blocks (null block {d.null_block}), "
        f"{d.queue_length} queued (num_free_blocks {d.num_free_blocks}), {d.referenced} "
        f"referenced; {d.live_requests} live requests, {d.requests_with_blocks} with blocks",
        groups,
        *(f"coverage: {c}" for c in d.coverage),
    ]


def finding_lines(f: PoolFinding, max_rows: int) -> list[str]:
    """A finding: its code and message, its blocks, the example's holders."""
    blocks = ", ".join(str(b) for b in f.blocks[:max_rows])
    more = f" … ({len(f.blocks) - max_rows} more)" if len(f.blocks) > max_rows else ""
    lines = [f"{f.code} [{f.cause}]: {f.message}"]
    if len(f.blocks) > 1:
        lines.append(f"blocks: {blocks}{more}")
    lines += [f"holder: {owner_text(o)}" for o in f.owners[:max_rows]]
    return lines


def check_lines(report: PoolCheckReport) -> list[str]:
    """The verdict lines of every dump."""
    return [verdict_line(d) for d in report.dumps]


def provenance_lines(p: PoolProvenance, max_rows: int) -> list[str]:
    """A block's story: what it is, its queue places, holders, hash, keys and findings."""
    queue = (
        f"queued at place {p.queue_position} of {p.queue_length}"
        if p.queue_position is not None
        else f"not in the free queue ({p.queue_length} queued)"
    )
    if len(p.queue_positions) > 1:
        queue += f" — and at {', '.join(str(i) for i in p.queue_positions[1:])}"
    what = "the null block" if p.is_null else f"ref_cnt {p.ref_cnt}"
    lines = [f"{p.path}: {p.engine} block {p.block} of {p.num_blocks}: {what}; {queue}"]
    if p.released:
        lines.append("released until reuse: queued and counted free, still read by its table")
    lines.append(f"{plural(len(p.owners), 'holder')}:")
    lines += [f"  {owner_text(o)}" for o in p.owners[:max_rows]]
    if len(p.owners) > max_rows:
        lines.append(f"  … {len(p.owners) - max_rows} more")
    lines.append(f"hash: group {p.hash.group}, digest {p.hash.digest}" if p.hash else "hash: none")
    lines += [f"map key: group {k.group}, digest {k.digest}" for k in p.map_keys[:max_rows]]
    lines += [f"finding {f.code} [{f.cause}]: {f.message}" for f in p.findings]
    if not p.findings:
        lines.append("no finding names this block")
    return lines
