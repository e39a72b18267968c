"""Table and Markdown views of the `kvcanary.inspect/2` record (what a dump holds).

Almost everything here comes from the dump itself (tensor names, metadata keys and values,
notes): the record is made printable first, and every table cell is a `Text`, so a name like
`[/x]` or `[link=...]` is shown as it is, never read as rich markup.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvcanary_cli.render.markdown import code, table, text
from kvcanary_cli.safe_text import printable_record

__all__ = ["inspect_markdown", "inspect_table"]

_BATCH_KEYS = (
    "bs",
    "active_rows",
    "padding_rows",
    "total_prefix_tokens",
    "total_extend_tokens",
    "max_reqs",
    "max_seq_len",
    "lut_len",
)


def _fmt_bytes(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return str(count)


def _role(t: dict[str, Any]) -> str:
    """A tensor's role; for a sparse one (a shrunk dump), how much of it is kept."""
    role = t["role"] or "(ignored)"
    if t.get("kept") is None:
        return role
    total = 1
    for dim in t["shape"]:
        total *= dim
    return f"{role} (sparse: {t['kept']:,} of {total:,} kept)"


def _cut_rows(shrink: dict[str, Any]) -> list[list[str]]:
    """Per tensor the shrink cut: original shape, kept, dropped, bytes dropped, rows kept."""
    return [
        [
            t["name"],
            "x".join(map(str, t["shape"])) or "[]",
            f"{t['kept']:,}",
            f"{t['dropped']:,}",
            _fmt_bytes(t["dropped_bytes"]),
            "-" if t["rows"] is None else f"{t['kept_rows']:,} of {t['rows']:,}",
        ]
        for t in shrink["tensors"]
    ]


_CUT_COLUMNS = ["tensor", "original shape", "kept", "dropped", "dropped bytes", "rows kept"]


def _shrink_facts(shrink: dict[str, Any]) -> list[str]:
    source = shrink["source"]
    return [
        f"shrunk from {shrink['source_file']}: {source['bytes']:,} bytes, "
        f"sha256 {source['sha256']}",
        f"{_fmt_bytes(shrink['dropped_bytes'])} of tensor data dropped; reports on this dump "
        "cover the kept cells only",
        f"made with: {shrink['command']}",
    ]


def _identity(record: dict[str, Any]) -> dict[str, str]:
    """Identity keys, the SGLang installed here (when it is), then other metadata."""
    installed = record["sglang_installed"]
    here = {"sglang installed here": installed} if installed else {}
    return {**record["identity"], **here, **record["other_metadata"]}


def _cells(*values: object) -> list[Text]:
    return [Text("-" if value is None else str(value)) for value in values]


def inspect_table(record: dict[str, Any]) -> RenderableType:
    """Tensors, scalars, groups, batch summary, provenance and notes, one block each."""
    record = printable_record(record)
    parts: list[RenderableType] = [
        Text(
            f"{record['path']}  ({_fmt_bytes(record['file_bytes'])}, "
            f"format {record['format'] or 'hand-made'})",
            style="bold",
        )
    ]
    tensors = Table(title="tensors", title_justify="left")
    for col in ("name", "dtype", "shape", "bytes", "role"):
        tensors.add_column(col, justify="right" if col == "bytes" else "left")
    for t in record["tensors"]:
        tensors.add_row(
            *_cells(
                t["name"],
                t["dtype"],
                "x".join(map(str, t["shape"])) or "[]",
                _fmt_bytes(t["bytes"]),
                _role(t),
            )
        )
    parts.append(tensors)
    shrink = record.get("shrink")
    if shrink is not None:
        parts.append(Text("shrunk", style="bold"))
        parts.extend(Text(f"  {fact}", style="yellow") for fact in _shrink_facts(shrink))
        cut = Table(title="dropped", title_justify="left")
        for col in _CUT_COLUMNS:
            cut.add_column(col, justify="left" if col in ("tensor", "original shape") else "right")
        for row in _cut_rows(shrink):
            cut.add_row(*_cells(*row))
        parts.append(cut)
    scalars = Table(title="scalars", title_justify="left")
    for col in ("name", "value", "origin", "source", "option"):
        scalars.add_column(col)
    for s in record["scalars"]:
        scalars.add_row(*_cells(s["name"], s["value"], s["origin"], s["source"], s["option"]))
    parts.append(scalars)
    batch = record["batch"]
    groups = ", ".join(f"{g['name']} (window {g['window']})" for g in record["groups"])
    summary = Table(title="batch", title_justify="left", show_header=False)
    summary.add_column("key")
    summary.add_column("value")
    summary.add_row(*_cells("groups", groups))
    for key in _BATCH_KEYS:
        summary.add_row(*_cells(key.replace("_", " "), batch[key]))
    parts.append(summary)
    identity = _identity(record)
    if identity:
        meta = Table(title="identity", title_justify="left", show_header=False)
        meta.add_column("key")
        meta.add_column("value")
        for key, value in identity.items():
            meta.add_row(*_cells(key, value))
        parts.append(meta)
    if record["notes"]:
        parts.append(Text("notes:", style="bold"))
        parts.extend(Text(f"  - {note}") for note in record["notes"])
    return Group(*parts)


def inspect_markdown(record: dict[str, Any]) -> str:
    """The same blocks as the table view, as GitHub Markdown."""
    record = printable_record(record)
    parts = [
        f"## kvcanary inspect: {code(record['path'], cell=False)}",
        f"{_fmt_bytes(record['file_bytes'])}, format {text(record['format'] or 'hand-made')}",
        table(
            ["tensor", "dtype", "shape", "bytes", "role"],
            [
                [
                    code(t["name"]),
                    text(t["dtype"]),
                    "x".join(map(str, t["shape"])) or "[]",
                    str(t["bytes"]),
                    text(_role(t)),
                ]
                for t in record["tensors"]
            ],
            right={3},
        ),
        table(
            ["scalar", "value", "source", "option"],
            [
                [code(s["name"]), text(s["value"]), text(s["source"]), code(s["option"])]
                for s in record["scalars"]
            ],
        ),
        table(
            ["batch", "value"],
            [
                [
                    "groups",
                    text(
                        ", ".join(f"{g['name']} (window {g['window']})" for g in record["groups"])
                    ),
                ]
            ]
            + [[key.replace("_", " "), text(record["batch"][key])] for key in _BATCH_KEYS],
        ),
    ]
    shrink = record.get("shrink")
    if shrink is not None:
        parts.append("\n".join(f"- {text(fact)}" for fact in _shrink_facts(shrink)))
        parts.append(
            table(
                _CUT_COLUMNS,
                [[code(row[0]), *(text(cell) for cell in row[1:])] for row in _cut_rows(shrink)],
                right={2, 3, 4},
            )
        )
    identity = _identity(record)
    if identity:
        parts.append(
            table(["identity", "value"], [[code(k), text(v)] for k, v in identity.items()])
        )
    if record["notes"]:
        parts.append("\n".join(f"- {text(note)}" for note in record["notes"]))
    return "\n\n".join(parts) + "\n"
