"""The terminal view of a `kvcanary.soak/1` record: a few lines, the files last."""

from __future__ import annotations

from kvcanary_cli.render.phrases.soak import ran_line, sglang_verdict, shrunk_line, soak_verdict
from kvcanary_cli.render.records.soak import SoakRecord
from kvcanary_cli.safe_text import printable_record

__all__ = ["soak_table"]


def soak_table(record: SoakRecord) -> str:
    """What ran, the verdict, what SGLang said, the shrink and the files written."""
    record = printable_record(record)
    lines = [
        f"kvcanary soak: SGLang {record['sglang_version']} ({record['sglang_root']}), "
        + ran_line(record),
        soak_verdict(record["failure"]),
    ]
    if record["failure"] is not None:
        lines.append(sglang_verdict(record))
        shrunk = shrunk_line(record)
        if shrunk is not None:
            lines.append(shrunk)
        lines += [f"  {name}: {path}" for name, path in record["files"].items()]
    return "".join(line + "\n" for line in lines)
