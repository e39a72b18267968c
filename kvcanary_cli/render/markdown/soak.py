"""The Markdown view of a soak (the `kvcanary.soak/1` record): the one to paste into an SGLang
issue or pull request."""

from __future__ import annotations

from kvcanary_cli.render.markdown.blocks import code, table, text
from kvcanary_cli.render.table.soak import ran_line, sglang_verdict, shrunk_line, soak_verdict
from kvcanary_cli.results.soak import SoakReport
from kvcanary_cli.safe_text import printable_record

__all__ = ["soak_markdown"]


def soak_markdown(report: SoakReport) -> str:
    """Facts, the verdict, the failure as a table, SGLang's checks, and the files."""
    report = printable_record(report)
    failure = report.failure
    title = "clean" if failure is None else f"found {failure.top_cause or 'a finding'}"
    facts = [
        f"kvcanary {text(report.kvcanary_version)} · `{report.SCHEMA}`",
        f"SGLang {code(report.sglang_version, cell=False)} from "
        f"{code(report.sglang_root, cell=False)}",
        text(ran_line(report)),
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
                    text(failure.seed),
                    text(failure.page_size),
                    code(failure.core),
                    text(failure.step),
                    code(failure.when),
                    ", ".join(code(c) for c in failure.codes),
                    code(failure.top_cause or "-"),
                    code(failure.fault) if failure.fault else "-",
                ]
            ],
            right={0, 1, 3},
        )
    )
    parts.append(text(sglang_verdict(report)))
    shrunk = shrunk_line(report)
    if shrunk is not None:
        parts.append(text(shrunk))
    if report.files:
        parts.append("### Files")
        parts.append(
            "\n".join(
                f"- {text(name)}: {code(path, cell=False)}" for name, path in report.files.items()
            )
        )
    return "\n\n".join(parts) + "\n"
