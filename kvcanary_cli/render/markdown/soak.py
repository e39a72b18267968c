"""The Markdown view of a `kvcanary.soak/1` record: the one to paste into an SGLang issue or
pull request."""

from __future__ import annotations

from kvcanary_cli.render.markdown.blocks import code, table, text
from kvcanary_cli.render.phrases.soak import ran_line, sglang_verdict, shrunk_line, soak_verdict
from kvcanary_cli.render.records.soak import SoakRecord
from kvcanary_cli.safe_text import printable_record

__all__ = ["soak_markdown"]


def soak_markdown(record: SoakRecord) -> str:
    """Facts, the verdict, the failure as a table, SGLang's checks, and the files."""
    record = printable_record(record)
    failure = record["failure"]
    title = "clean" if failure is None else f"found {failure['top_cause'] or 'a finding'}"
    facts = [
        f"kvcanary {text(record['kvcanary_version'])} · `{record['schema']}`",
        f"SGLang {code(record['sglang_version'], cell=False)} from "
        f"{code(record['sglang_root'], cell=False)}",
        text(ran_line(record)),
    ]
    parts = [f"## kvcanary soak: {text(title)}", "\n".join(f"- {fact}" for fact in facts)]
    parts.append(text(soak_verdict(failure)))
    if failure is None:
        return "\n\n".join(parts) + "\n"
    parts.append(
        table(
            ["seed", "page size", "core", "step", "when", "codes", "cause", "fault"],
            [
                [
                    text(failure["seed"]),
                    text(failure["page_size"]),
                    code(failure["core"]),
                    text(failure["step"]),
                    code(failure["when"]),
                    ", ".join(code(c) for c in failure["codes"]),
                    code(failure["top_cause"] or "-"),
                    code(failure["fault"]) if failure["fault"] else "-",
                ]
            ],
            right={0, 1, 3},
        )
    )
    parts.append(text(sglang_verdict(record)))
    shrunk = shrunk_line(record)
    if shrunk is not None:
        parts.append(text(shrunk))
    if record["files"]:
        parts.append("### Files")
        parts.append(
            "\n".join(
                f"- {text(name)}: {code(path, cell=False)}"
                for name, path in record["files"].items()
            )
        )
    return "\n\n".join(parts) + "\n"
