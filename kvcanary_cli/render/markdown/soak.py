"""The Markdown view of a soak (the `kvcanary.soak/2` record): the one to paste into an SGLang
issue or pull request. The verdict and who saw it first in words, kvcanary's failure and
SGLang's complaints as tables."""

from __future__ import annotations

from kvcanary_cli.render.markdown.blocks import code, table, text
from kvcanary_cli.render.table.soak import (
    SILENT,
    coverage_lines,
    fault_line,
    ran_line,
    reading_line,
    replay_line,
    seen_line,
    shrunk_line,
    soak_verdict,
)
from kvcanary_cli.results.soak import SoakReport
from kvcanary_cli.safe_text import printable_record

__all__ = ["soak_markdown"]


def soak_markdown(report: SoakReport) -> str:
    """Facts, the verdict, the failure as a table, who saw it first, SGLang's checks, and the
    files."""
    report = printable_record(report)
    failure = report.failure
    if failure is None:
        title = "SGLang's checks complained; kvcanary: nothing" if report.found else "clean"
    elif failure.crash is not None:
        title = f"SGLang crashed ({failure.crash.exception})"
    elif failure.divergence is not None:
        title = f"rank {failure.rank} parted from rank 0 ({failure.divergence.kind})"
    else:
        title = f"found {failure.top_cause or 'a finding'}"
    facts = [
        f"kvcanary {text(report.kvcanary_version)} · `{report.SCHEMA}`",
        f"SGLang {code(report.sglang_version, cell=False)} from "
        f"{code(report.sglang_root, cell=False)}",
        text(ran_line(report)),
    ]
    parts = [f"## kvcanary soak: {text(title)}", "\n".join(f"- {fact}" for fact in facts)]
    replayed = replay_line(report)
    if replayed is not None:
        parts.append(text(replayed))
    parts.append(text(soak_verdict(report)))
    planted = fault_line(report)
    if planted is not None:
        parts.append(text(planted))
    covered = coverage_lines(report)
    if covered:
        parts.append("### Coverage")
        parts.append(text(covered[0]))
        parts.append("\n".join(f"- {text(line.strip())}" for line in covered[1:]))
    if not report.found:
        return "\n\n".join(parts) + "\n"
    if failure is not None:
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
                        ", ".join(code(c) for c in failure.codes) or "-",
                        code(failure.top_cause or "-"),
                        code(failure.fault) if failure.fault else "-",
                    ]
                ],
                right={0, 1, 3},
            )
        )
    seen = seen_line(report)
    if seen is not None:
        parts.append(text(seen))
    parts.append("### SGLang's own checks")
    if not report.sglang_checks:
        parts.append(text(SILENT))
    else:
        parts.append(
            table(
                ["check", "audited steps", "histories", "said at", "what it said"],
                [
                    [
                        code(check.check),
                        text(check.steps),
                        text(check.histories),
                        text(f"step {said.step} ({said.when}), seed {said.seed}, page size ")
                        + text(f"{said.page_size}, {said.core} core"),
                        text(said.message),
                    ]
                    for check in report.sglang_checks
                    for said in check.first
                ],
                right={1, 2},
            )
        )
    reading = reading_line(report)
    if reading is not None:
        parts.append(text(reading))
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
