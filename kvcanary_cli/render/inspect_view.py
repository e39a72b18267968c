"""Table view of the `kvcanary.inspect/1` record."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

__all__ = ["inspect_table"]


def _fmt_bytes(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return str(count)


def inspect_table(record: dict[str, Any]) -> RenderableType:
    """Tensors, scalars, groups, batch summary, provenance and notes, one block each."""
    parts: list[RenderableType] = [
        Text(f"{record['path']}  ({_fmt_bytes(record['file_bytes'])}, "
             f"format {record['format'] or 'hand-made'})", style="bold")
    ]
    tensors = Table(title="tensors", title_justify="left")
    for col in ("name", "dtype", "shape", "bytes", "role"):
        tensors.add_column(col, justify="right" if col == "bytes" else "left")
    for t in record["tensors"]:
        tensors.add_row(t["name"], t["dtype"], "x".join(map(str, t["shape"])) or "[]",
                        _fmt_bytes(t["bytes"]), t["role"] or "(ignored)")
    parts.append(tensors)
    scalars = Table(title="scalars", title_justify="left")
    for col in ("name", "value", "source"):
        scalars.add_column(col)
    for s in record["scalars"]:
        scalars.add_row(s["name"], "-" if s["value"] is None else str(s["value"]), s["source"])
    parts.append(scalars)
    batch = record["batch"]
    groups = ", ".join(f"{g['name']} (window {g['window']})" for g in record["groups"])
    summary = Table(title="batch", title_justify="left", show_header=False)
    summary.add_column("key")
    summary.add_column("value")
    summary.add_row("groups", groups)
    for key in ("bs", "active_rows", "padding_rows", "total_prefix_tokens",
                "total_extend_tokens", "max_reqs", "max_seq_len", "lut_len"):
        summary.add_row(key.replace("_", " "), "-" if batch[key] is None else str(batch[key]))
    parts.append(summary)
    identity = {**record["provenance"], **record["other_metadata"]}
    if identity:
        meta = Table(title="provenance", title_justify="left", show_header=False)
        meta.add_column("key")
        meta.add_column("value")
        for key, value in identity.items():
            meta.add_row(key, value)
        parts.append(meta)
    if record["notes"]:
        parts.append(Text("notes:", style="bold"))
        parts.extend(Text(f"  - {note}") for note in record["notes"])
    return Group(*parts)
