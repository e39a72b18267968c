"""Markdown pieces the check and provenance views share: identity, a slot's provenance, and
how a shrunk dump was made."""

from __future__ import annotations

from kvcanary_cli.render.markdown.blocks import clipped, code, table, text
from kvcanary_cli.render.phrases.provenance import CELL_COLUMNS
from kvcanary_cli.results.cells import Cell, SlotProvenance
from kvcanary_cli.results.shrink import Shrunk

__all__ = ["identity_table", "provenance_body", "reproduce"]


def identity_table(identity: dict[str, str], *, limit: int | None = None) -> str:
    """The identity keys as a table, or a line saying there are none; each value cut to
    `limit` characters (`blocks.clipped`)."""
    if not identity:
        return "No identity metadata recorded (sglang.version, model, rank, step, ...)."
    rows = [[text(k), text(clipped(v, limit))] for k, v in identity.items()]
    return table(["identity", "value"], rows)


def _cells_table(cells: tuple[Cell, ...], *, swa: bool) -> str:
    rows = [
        [
            str(c.pool_row),
            str(c.position),
            *([text(c.full_slot)] if swa else []),
            ", ".join(map(str, c.batch_rows)) or "-",
            text(c.role),
            "yes" if c.seed else "",
            "yes" if c.shared else "",
        ]
        for c in cells
    ]
    return table(list(CELL_COLUMNS[swa]), rows, right={0, 1, 2} if swa else {0, 1})


def _translation(prov: SlotProvenance) -> str:
    if prov.swa_slot is not None:
        return f"SWA translation: `LUT[{prov.slot}] = {prov.swa_slot}`"
    if prov.translation_note:
        return f"SWA translation: none ({text(prov.translation_note)})"
    return "SWA translation: -"


def provenance_body(prov: SlotProvenance) -> list[str]:
    """The slot's cells, translation, allocator, canary and violation rows as Markdown blocks."""
    shown, total = len(prov.cells), prov.cells_total
    more = f" (first {shown} of {total})" if total > shown else ""
    parts = (
        [
            f"Cells of {prov.space} slot {prov.slot}{more}:",
            _cells_table(prov.cells, swa=prov.space == "swa"),
        ]
        if total
        else [f"No req_to_token cell holds {prov.space} slot {prov.slot}."]
    )
    facts = [_translation(prov)]
    if prov.mapped_from:
        facts.append("mapped from full slots: " + ", ".join(map(str, prov.mapped_from)))
    if prov.clamped_from:
        facts.append(
            "redirected here by the GPU clamp (live full slots >= lut_len): "
            + ", ".join(map(str, prov.clamped_from))
        )
    facts.append(f"allocator: {text(prov.allocator)}")
    parts.append("\n".join(f"- {fact}" for fact in facts))
    if prov.canary:
        parts.append(
            table(
                ["canary buffer", "token", "position", "prev hash", "real kv hash"],
                [
                    [
                        code(r.buffer),
                        str(r.token),
                        str(r.position),
                        str(r.prev_hash),
                        str(r.real_kv_hash),
                    ]
                    for r in prov.canary
                ],
                right={1, 2, 3, 4},
            )
        )
    if prov.violations:
        parts.append(
            table(
                ["violation row", "fields"],
                [[str(v.index), ", ".join(map(str, v.fields))] for v in prov.violations],
                right={0},
            )
        )
        shown, total = len(prov.violations), prov.violations_total
        if total > shown:
            parts.append(f"First {shown} of {total} ring rows of this slot.")
    return parts


def reproduce(shrunk: Shrunk) -> str:
    """How the attached small dump was made (file names are shell-safe in the command)."""
    return (
        "Made from the original dump (same findings and diagnosis) with:\n\n"
        f"```bash\n{shrunk.command}\n```"
    )
