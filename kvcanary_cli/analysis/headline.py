"""A cause's headline: one bug-report sentence from the dump's own facts, its slots, who holds
or last held them and the step that went wrong (`catalog.CauseEntry.step`), e.g. "full slots
137..152 (last owner: pool row 5, finished) were freed without clearing their LUT entries".

Built from the findings a cause explains: their spans (bounds and counts, never every cell)
and the owners the check attached (a few slots each), so it costs nothing per cell.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kvcanary_cli.catalog import CAUSES, CauseCode
from kvcanary_cli.results.cells import FindingOwner, Space
from kvcanary_cli.results.check import Cause, Finding

__all__ = ["with_headlines"]

#: Owners a headline names before it counts the rest.
_OWNERS_NAMED = 2


def with_headlines(findings: Sequence[Finding], causes: Sequence[Cause]) -> tuple[Cause, ...]:
    """Each cause with its headline where its catalog entry says the step and it explains
    slots; the others as they are (their summary heads them)."""
    members: dict[CauseCode, list[Finding]] = {}
    for f in sorted(findings, key=Finding.order_key):
        if f.cause is not None and f.slot is not None:
            members.setdefault(f.cause, []).append(f)
    out = []
    for c in causes:
        step = CAUSES[c.code].step
        found = members.get(c.code)
        out.append(c if step is None or not found else replace(c, headline=_sentence(found, step)))
    return tuple(out)


def _sentence(found: list[Finding], step: tuple[str, str]) -> str:
    space = found[0].space
    same = [f for f in found if f.space == space]
    spans = [s for f in same if (s := f.span) is not None and s.slots is not None]
    name = "SWA" if space is Space.SWA else "full"
    if spans:
        lo = min(s.slots[0] for s in spans if s.slots)
        hi = max(s.slots[1] for s in spans if s.slots)
        count = spans[0].distinct_slots if len(spans) == 1 else hi - lo + 1
    else:
        lo = hi = int(same[0].slot or 0)
        count = 1
    if count == 1 and lo == hi:
        slots = f"{name} slot {lo}"
    elif hi - lo + 1 == count or len(spans) > 1:
        slots = f"{name} slots {lo}..{hi}"
    else:
        slots = f"{name} slots {lo}..{hi} ({count} of them)"
    verb = step[0] if count == 1 and lo == hi else step[1]
    owners = [o for f in same for o in f.owners if o.pool_row is not None]
    if not owners:
        held = "it" if count == 1 and lo == hi else "them"
        return f"{slots} {verb}; no pool row holds {held}"
    return f"{slots}, {_owners_clause(owners, one_slot=count == 1 and lo == hi)}, {verb}"


def _owners_clause(owners: list[FindingOwner], *, one_slot: bool) -> str:
    """`last held by idle pool row 5 (position 68)`, `held by batch row 3 (pool row 9,
    running) and pool row 5 (finished)`: each pool row once, the first few named."""
    by_row: dict[tuple[int | None, str | None], FindingOwner] = {}
    for o in owners:
        by_row.setdefault((o.pool_row, o.state), o)
    where = _where if len(by_row) == 1 else _nowhere
    named = [_owner(o, where(o, one_slot)) for o in list(by_row.values())[:_OWNERS_NAMED]]
    more = len(by_row) - len(named)
    if more > 0:
        named.append(f"{more} more pool row{'s' if more > 1 else ''}")
    current = all(o.state in ("running", "held") for o in by_row.values())
    last = all(o.state not in ("running", "held") for o in by_row.values())
    label = "held by" if current else "last held by" if last else "held or last held by"
    return f"{label} {' and '.join(named)}"


def _where(o: FindingOwner, one_slot: bool) -> str:
    return f"position {o.position}" if one_slot else f"slot {o.slot} at position {o.position}"


def _nowhere(o: FindingOwner, one_slot: bool) -> str:
    return ""


def _owner(o: FindingOwner, at: str) -> str:
    """`batch row 3 (pool row 9, position 12, running)`, `idle pool row 5 (position 68)`."""
    at = f"{at}, " if at else ""
    match o.state:
        case "running":
            return f"batch row {o.batch_row} (pool row {o.pool_row}, {at}running)"
        case "held":
            return f"pool row {o.pool_row} ({at}running, not in this batch)"
        case "finished":
            return f"pool row {o.pool_row} ({at}finished)"
        case "stale-tail":
            return f"pool row {o.pool_row} ({at}a finished request's stale tail)"
    return f"idle pool row {o.pool_row}" + (f" ({at[:-2]})" if at else "")
